#!/usr/bin/env bash
# One `drill train configs/pong_ppo.toml` run of ITERS iterations (no evaluation inside the
# window) with BINARY; prints its median env steps/s over the iterations after the first (env
# steps and wall time of each iteration's charts/SPS line in metrics.jsonl). What
# bench_pong_ppo_vs_torch.sh and ab_pong_ppo.sh measure drill with.
#
#   scripts/pong_ppo_rate.sh BINARY ITERS [DRILL_ARGS...]   (PY: the Python that reads the metrics)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$1 iters=$2
shift 2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin" train "$root/configs/pong_ppo.toml" --quiet --exp-dir "$tmp/run" \
  --set max_env_step=$((iters * 1024)) --set policy.eval.evaluator.eval_freq=100000000 "$@" \
  >"$tmp/log" 2>&1 || { cat "$tmp/log" >&2; exit 1; }
"${PY:-python3}" - "$tmp/run/metrics.jsonl" <<'PY'
import json, statistics, sys
pts = [(r["step"], r["wall_time"]) for r in map(json.loads, open(sys.argv[1])) if r["tag"] == "charts/SPS"]
print(f"{statistics.median((s1 - s0) / (w1 - w0) for (s0, w0), (s1, w1) in zip(pts, pts[1:])):.1f}")
PY
