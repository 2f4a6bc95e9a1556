#!/usr/bin/env bash
# drill's learner benchmark side by side with PyTorch's (scripts/bench_torch_learner.py), same
# nets and steps, interleaved round by round so both see the same machine load; prints each
# round and the medians with their ratio (torch / drill: above 1 means drill is faster).
#
#   scripts/bench_learner_vs_torch.sh [PYTHON] [ROUNDS] [THREADS] [CASES]
#   e.g. scripts/bench_learner_vs_torch.sh /tmp/tv/bin/python 5 1 nature-cnn-update,pong-dqn-update
set -euo pipefail
PY=${1:-python3}
ROUNDS=${2:-5}
THREADS=${3:-1}
CASES=${4:-dqn-update,nature-cnn-update,pong-dqn-update}
DRILL=${DRILL:-target/release/drill}
[ -x "$DRILL" ] || { echo "build drill first: cargo build --release (or set DRILL)" >&2; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((r = 1; r <= ROUNDS; r++)); do
  for case in ${CASES//,/ }; do
    # The case's own line: `nature-cnn-update` also prints the peak, its rate and bf16's.
    d=$("$DRILL" --threads "$THREADS" bench learner --case "$case" --json | grep "\"case\":\"$case\"," | sed -n 's/.*"median_us":\([0-9.]*\).*/\1/p')
    t=$(OMP_NUM_THREADS=$THREADS "$PY" scripts/bench_torch_learner.py --threads "$THREADS" --case "$case" | awk '{print $2}')
    printf '%s %s %s\n' "$case" "$d" "$t" | tee -a "$out"
  done
done
echo "case: median drill us, median torch us, torch/drill ($ROUNDS rounds, $THREADS thread(s))"
for case in ${CASES//,/ }; do
  awk -v c="$case" '$1 == c { d[n + 0] = $2; t[n + 0] = $3; n++ }
    function med(a, n,   i, j, x) { for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (a[j] < a[i]) { x = a[i]; a[i] = a[j]; a[j] = x }
      return n % 2 ? a[int(n / 2)] : (a[n / 2 - 1] + a[n / 2]) / 2 }
    END { md = med(d, n); mt = med(t, n); printf "%s: %.0f us, %.0f us, %.2fx\n", c, md, mt, mt / md }' "$out"
done
