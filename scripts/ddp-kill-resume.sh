#!/usr/bin/env bash
# Kill -9 one rank of a 2-rank `drill train` mid-run and report what happens.
#   scripts/ddp-kill-resume.sh CONFIG [RESTARTS] [DELAY_S]
# With RESTARTS >= 1 the job must resume from its newest checkpoint and finish; with 0 it
# must exit non-zero naming the killed rank. Prints the exit code, the seconds from the kill
# to the launcher's exit, and result.json.
set -euo pipefail
config=$1; restarts=${2:-1}; delay=${3:-0.3}
drill=${DRILL:-$(dirname "$0")/../target/release/drill}
work=$(mktemp -d); exp=$work/run
"$drill" train "$config" --nproc-per-node 2 --max-restarts "$restarts" --quiet --exp-dir "$exp" \
  >"$work/out" 2>&1 &
launcher=$!
until [ -f "$exp/ckpt/best.safetensors" ]; do sleep 0.01; done
sleep "$delay"
victim=
for pid in $(cat /proc/$launcher/task/$launcher/children); do
  if tr '\0' '\n' <"/proc/$pid/environ" | grep -qx RANK=1; then victim=$pid; fi
done
t0=$(date +%s.%N)
kill -9 "$victim"
set +e; wait "$launcher"; code=$?; set -e
t1=$(date +%s.%N)
echo "killed rank 1 (pid $victim) ${delay}s after the first checkpoint"
echo "launcher exit code: $code, $(echo "$t1 - $t0" | bc) s after the kill"
grep -E "resuming from|drill launch:|stop value|stopped at" "$work/out" | sed 's/^.*INFO //' || true
[ -f "$exp/result.json" ] && cat "$exp/result.json"
rm -rf "$work"
