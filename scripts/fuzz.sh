#!/usr/bin/env bash
# Fuzz every decoder of outside bytes (crates/drill-fuzz; the targets sit next to their
# decoders as tests named `fuzz*`) with N inputs each (default 700000) from seed S (default 0),
# and print each target's count, failures, slowest input and largest allocation, then the total.
# CI runs the default 20000 each inside `cargo test`. Usage: scripts/fuzz.sh [N] [S]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-700000}
seed=${2:-0}
log=$(mktemp)
trap 'rm -f "$log" "$log.lines"' EXIT
start=$SECONDS
# The Redis transport's frames need drill-task's `redis` feature: built alone, it leaves the
# workspace's burn as it is.
for args in "--workspace --lib --bins" "-p drill-task --features redis --lib"; do
  # shellcheck disable=SC2086
  DRILL_FUZZ_ITERS=$n DRILL_FUZZ_SEED=$seed cargo test --release $args -- fuzz --nocapture --test-threads 1 >>"$log" 2>&1 || {
    grep -E "^fuzz|panicked|failed" "$log" >&2
    exit 1
  }
done
# With --nocapture a target's line may follow the harness's "test NAME ... " on the same line.
grep -oE "fuzz [a-z ]+: [0-9]+ inputs.*bytes" "$log" | sort >"$log.lines"
cat "$log.lines"
awk -v s=$((SECONDS - start)) '
  { split($0, a, ": "); split(a[2], b, " "); total += b[1]; bad += $0 ~ / 0 failing/ ? 0 : 1; t++ }
  END { printf "fuzz total: %d targets, %d inputs, %d targets with failures, %d s\n", t, total, bad, s }' "$log.lines"
