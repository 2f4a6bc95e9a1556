#!/usr/bin/env bash
# An elastic DDP run that loses a host and takes one back, beside an undisturbed run of the
# same config, on three hosts made of namespaces (scripts/netns_hosts.sh; needs root), 1 rank
# each: CartPole DQN DDP with a wide net (about 20 s to the stop value), `--nnodes 2:3`.
# The disturbed run: host 2's launcher is killed DOWN_S seconds into training (default 4),
# and started again UP_S seconds after the survivors train again (default 4).
#   scripts/elastic_curve.sh OUT_DIR    -> OUT_DIR/{undisturbed,elastic}/, OUT_DIR/curve.png
# Prints each run's result.json figures and the membership lines. Uses target/release/drill.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:?usage: elastic_curve.sh OUT_DIR}")
mkdir -p "$out"
drill=$PWD/target/release/drill
cfg=$PWD/configs/cartpole_dqn_ddp.toml
export DRILL_NETNS_SET=ecv$$ DRILL_JOB_TOKEN=curve
trap 'pkill -KILL -f "rdzv-id curve-$$" || true; scripts/netns_hosts.sh down >/dev/null 2>&1 || true' EXIT
scripts/netns_hosts.sh up 3 >/dev/null

# node RUN K PORT: start host K's launcher of run RUN (output to OUT/RUN.hK.log); its pid
# in pids[K].
node() {
  scripts/netns_hosts.sh exec "$2" "$drill" train "$cfg" --quiet --exp-dir "$out/$1" \
    --nnodes 2:3 --rdzv-endpoint "10.77.0.1:$3" --rdzv-id "curve-$$" \
    --rdzv-conf last_call_timeout=2 \
    --set 'policy.model.encoder_hidden_size_list=[1024,1024,512]' >>"$out/$1.h$2.log" 2>&1 &
  pids[$2]=$!
}

# await FILE PATTERN: until a line of FILE matches PATTERN (up to 120 s).
await() {
  for _ in $(seq 1200); do
    grep -qE "$2" "$1" 2>/dev/null && return
    sleep 0.1
  done
  echo "no '$2' in $1" >&2
  exit 1
}

rm -rf "$out/undisturbed" "$out/elastic" "$out"/*.log
pids=()
node undisturbed 0 29801
sleep 0.3
node undisturbed 1 29801
node undisturbed 2 29801
wait "${pids[@]}"

node elastic 0 29802
sleep 0.3
node elastic 1 29802
node elastic 2 29802
await "$out/elastic.h0.log" "round 0: 3 node"
sleep "${DOWN_S:-4}"
kill -KILL "${pids[2]}"
await "$out/elastic.h0.log" "round 1: 2 node"
sleep "${UP_S:-4}"
wait "${pids[2]}" || true
node elastic 2 29802
wait "${pids[@]}" || true

for run in undisturbed elastic; do
  echo "== $run"
  grep -hE "round [0-9]+:|left \(" "$out/$run.h0.log" | sed 's/^/  /' || true
  grep -oE '"(stop_reached|env_steps|train_iters|wall_seconds|eval_reward_mean|world_size|restarts)": [^,]*' \
    "$out/$run/result.json" | sed 's/^/  /'
done
"$drill" plot "$out/undisturbed" "$out/elastic" --each -o "$out/curve.png"
echo "curve: $out/curve.png"
