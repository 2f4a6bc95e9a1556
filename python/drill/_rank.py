"""One rank of ``drill.train(..., nproc_per_node=N)``: ``python -m drill._rank ARGS_JSON``,
started by drill's launcher (which sets RANK, WORLD_SIZE and the rendezvous). Rank 0 writes
the result where the parent reads it."""

import json
import os
import sys

from . import _drill


def main() -> int:
    args = json.loads(sys.argv[1])
    report = args.pop("report")
    config = args.pop("config")
    overrides = args.pop("overrides")
    try:
        out = _drill.train(config, overrides, **args)
    except KeyboardInterrupt:
        return 130
    except _drill.Error as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if os.environ.get("RANK", "0") == "0":
        with open(report, "w") as f:
            f.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
