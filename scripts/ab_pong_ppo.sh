#!/usr/bin/env bash
# Interleaved A/B of two drill binaries on `configs/pong_ppo.toml`: each round trains ITERS
# iterations with A and with B (no evaluation inside the window), A first in odd rounds and B
# first in even ones: on a 2-core box whichever runs second in a round runs 1.6-2.0 % slower,
# so the order alternates. Each run's figure is
# the median env steps/s over its iterations after the first (scripts/pong_ppo_rate.sh, as
# bench_pong_ppo_vs_torch.sh). Prints every round, the medians and B/A.
#
#   scripts/ab_pong_ppo.sh OLD_BINARY NEW_BINARY [ROUNDS] [ITERS] [DRILL_ARGS...]
#   e.g. ALE_ROM_DIR=$PWD/roms scripts/ab_pong_ppo.sh /tmp/drill-old target/release/drill 3 8
set -euo pipefail
cd "$(dirname "$0")/.."
A=$1 B=$2
ROUNDS=${3:-3}
ITERS=${4:-8}
shift $(($# < 4 ? $# : 4))
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for ((r = 1; r <= ROUNDS; r++)); do
  if ((r % 2)); then
    a=$(scripts/pong_ppo_rate.sh "$A" "$ITERS" "$@")
    b=$(scripts/pong_ppo_rate.sh "$B" "$ITERS" "$@")
  else
    b=$(scripts/pong_ppo_rate.sh "$B" "$ITERS" "$@")
    a=$(scripts/pong_ppo_rate.sh "$A" "$ITERS" "$@")
  fi
  printf 'round %s: A %s env steps/s, B %s env steps/s\n' "$r" "$a" "$b" | tee -a "$tmp/rows"
done
awk '{ a[n + 0] = $4; b[n + 0] = $8; n++ }
  function med(v, n,   i, j, x) { for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (v[j] < v[i]) { x = v[i]; v[i] = v[j]; v[j] = x }
    return n % 2 ? v[int(n / 2)] : (v[n / 2 - 1] + v[n / 2]) / 2 }
  END { ma = med(a, n); mb = med(b, n); printf "median: A %.1f, B %.1f env steps/s: B/A %.3fx (%d rounds)\n", ma, mb, mb / ma, n }' "$tmp/rows"
