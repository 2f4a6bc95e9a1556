#!/usr/bin/env bash
# `drill train configs/pong_ppo.toml` side by side with CleanRL's ppo_atari in PyTorch
# (examples/python/ppo_atari.py --envs ale-py: ale-py's AtariVectorEnv, the same hyper-parameters),
# interleaved round by round so both see the same machine load (drill first in odd rounds,
# PyTorch first in even ones: on a 2-core box the second run of a round was measured 1.5-2 %
# slower, see scripts/ab_pong_ppo.sh). Each side's figure is the
# median env steps/s over its iterations after the first (drill's from scripts/pong_ppo_rate.sh:
# metrics.jsonl's env steps and wall time of each iteration; no evaluation inside the window).
#
#   scripts/bench_pong_ppo_vs_torch.sh [PYTHON] [ROUNDS] [ITERATIONS] [TORCH_THREADS] [DRILL_ARGS...]
#   e.g. ALE_ROM_DIR=$PWD/roms scripts/bench_pong_ppo_vs_torch.sh /tmp/v/bin/python 3 12 2
# DRILL_ARGS go to `drill train` (e.g. `--threads 1`, `--set 'policy.precision="bf16"'`).
set -euo pipefail
PY=${1:-python3}
ROUNDS=${2:-3}
ITERS=${3:-12}
TT=${4:-2}
shift $(($# < 4 ? $# : 4))
DRILL=${DRILL:-target/release/drill}
[ -x "$DRILL" ] || { echo "build drill first: cargo build --release --features atari (or set DRILL)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
drill() { PY=$PY scripts/pong_ppo_rate.sh "$DRILL" "$ITERS" "$@"; }
torch() {
  "$PY" examples/python/ppo_atari.py --envs ale-py --threads "$TT" --iterations "$ITERS" | tail -1 |
    sed -n 's/.*median \([0-9.]*\) env.*/\1/p'
}
for ((r = 1; r <= ROUNDS; r++)); do
  if ((r % 2)); then
    d=$(drill "$@")
    t=$(torch)
  else
    t=$(torch)
    d=$(drill "$@")
  fi
  printf 'round %s: drill %s env steps/s, torch %s env steps/s\n' "$r" "$d" "$t" | tee -a "$tmp/rows"
done
awk '{ d[n + 0] = $4; t[n + 0] = $8; n++ }
  function med(a, n,   i, j, x) { for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (a[j] < a[i]) { x = a[i]; a[i] = a[j]; a[j] = x }
    return n % 2 ? a[int(n / 2)] : (a[n / 2 - 1] + a[n / 2]) / 2 }
  END { md = med(d, n); mt = med(t, n); printf "median: drill %.1f, torch %.1f env steps/s: drill/torch %.2fx (%d rounds)\n", md, mt, md / mt, n }' "$tmp/rows"
