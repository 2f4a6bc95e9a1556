"""``drill.train``: a whole ``drill train`` run from Python (see :func:`train`)."""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping, Union

from . import _drill

Overrides = Union[Mapping[str, Any], Iterable[str], None]


def _toml_value(key: str, v: Any) -> str:
    """A Python value as the TOML literal ``--set`` takes."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"overrides[{key!r}] = {v}: TOML has no such number drill accepts")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(key, x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{k} = {_toml_value(key, x)}" for k, x in v.items()) + "}"
    raise TypeError(f"overrides[{key!r}]: a {type(v).__name__} has no TOML form")


def _override_list(overrides: Overrides, seed: int | None) -> list[str]:
    if overrides is None:
        out = []
    elif isinstance(overrides, Mapping):
        out = [f"{k}={_toml_value(k, v)}" for k, v in overrides.items()]
    else:
        out = [str(o) for o in overrides]
    if seed is not None:
        out.append(f"seed={int(seed)}")
    return out


def train(
    config: str | os.PathLike[str] | None = None,
    *,
    seed: int | None = None,
    overrides: Overrides = None,
    exp_dir: str | os.PathLike[str] | None = None,
    resume: str | os.PathLike[str] | None = None,
    threads: int | None = None,
    quiet: bool = False,
    save_replay: bool = False,
    nproc_per_node: int | None = None,
    max_restarts: int = 0,
) -> dict[str, Any]:
    """Train as ``drill train CONFIG`` does, in this process; returns ``result.json`` as a dict.

    The GIL is released while it runs; drill's log lines and progress bar go to stderr
    (``DRILL_LOG`` filters them). Ctrl-C stops the run after its current step, writes the
    ``final`` checkpoint and ``result.json``, then raises ``KeyboardInterrupt``; continue with
    ``train(resume=EXP_DIR)``.

    Args:
        config: a TOML config (DI-engine's tree; ``configs/`` has the project's), or ``None``
            with ``resume`` naming an experiment folder (its ``config.toml``).
        seed: overrides the config's seed.
        overrides: config keys to change, ``{"policy.learn.batch_size": 128}`` or
            ``["policy.learn.batch_size=128"]`` (values as TOML).
        exp_dir: the experiment folder (default: the config's ``exp_name``; an existing one
            is never overwritten, a suffixed sibling is used).
        resume: an experiment folder to continue in, or a checkpoint file to start from.
        threads: tensor threads (default: chosen from the environment). The pool is sized
            once per process: a later call keeps the first size.
        quiet: no progress bar.
        save_replay: keep DQN's and SAC's replay buffer with the final checkpoint.
        nproc_per_node: train data-parallel on this many processes of this machine (the
            config needs ``policy.multi_gpu = true``), each a Python interpreter running this.
        max_restarts: with ``nproc_per_node``, restart the group this many times after a
            rank fails (it resumes from the newest checkpoint).

    Returns:
        ``result.json``'s fields (``env_steps``, ``wall_seconds``, ``total_wall_seconds``,
        ``eval_reward_mean``, ``stop_reached``, ...) plus ``exp_dir`` and ``result_file``.

    Raises:
        ConfigError: a bad key or value (the message names its key path and the file).
        EnvError: the environment cannot be built.
        Error: the run failed (its ``result.json`` says why too).
        KeyboardInterrupt: Ctrl-C, after the final checkpoint was written.
    """
    if config is None:
        if resume is None or not Path(resume).is_dir():
            raise TypeError("train() needs a config, or resume= an experiment folder")
        config = Path(resume) / "config.toml"
    sets = _override_list(overrides, seed)
    if nproc_per_node is None:
        out = _drill.train(
            os.fspath(config),
            sets,
            exp_dir=None if exp_dir is None else os.fspath(exp_dir),
            resume=None if resume is None else os.fspath(resume),
            threads=threads,
            quiet=quiet,
            save_replay=save_replay,
        )
        return json.loads(out)
    with tempfile.TemporaryDirectory(prefix="drill-train-") as tmp:
        report = Path(tmp) / "result.json"
        rank_args = {
            "config": os.fspath(config),
            "overrides": sets,
            "exp_dir": None if exp_dir is None else os.fspath(exp_dir),
            "resume": None if resume is None else os.fspath(resume),
            "threads": threads,
            "quiet": quiet,
            "save_replay": save_replay,
            "report": str(report),
        }
        code = _drill.launch(
            os.fspath(config),
            sets,
            nproc_per_node,
            sys.executable,
            ["-m", "drill._rank", json.dumps(rank_args)],
            max_restarts=max_restarts,
        )
        if code == 130:
            raise KeyboardInterrupt("data-parallel training interrupted; the final checkpoint was written")
        if code != 0 or not report.is_file():
            raise _drill.Error(
                f"data-parallel training on {nproc_per_node} processes failed (exit code {code}); "
                "the failing rank's error is above"
            )
        return json.loads(report.read_text())
