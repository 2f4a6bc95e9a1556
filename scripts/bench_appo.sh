#!/usr/bin/env bash
# APPO over hosts made of namespaces (scripts/netns_hosts.sh; needs root), each host one worker
# of configs/pong_appo.toml: the learner (with the evaluator, one game) on host 0, K collectors
# on hosts 1..K. Needs a drill built with `--features atari` and ALE_ROM_DIR.
#
#   ROUNDS=3 STEPS=40960 scripts/bench_appo.sh scaling
#       K = 1, 2, 3 collectors, interleaved ROUNDS times, STEPS env steps each: the median env
#       steps/s the learner received (metrics.jsonl, from its 4th logged step on: no start-up)
#       per K and its ratio to one collector.
#   scripts/bench_appo.sh curve OUT [SEED]
#       pong_appo to its stop value (+18) with one collector host (K = 1), bf16; the run's
#       folder is OUT (plot it beside pong_ppo's with `drill plot`).
#   scripts/bench_appo.sh churn OUT KILL_AT JOIN_AT
#       the same with two collector hosts, bf16: host 2's runner killed (kill -9) KILL_AT
#       seconds in, a collector joining from host 3 (`--join`) JOIN_AT seconds in; the run
#       must go on to +18 (OUT as above; the hosts' logs beside it).
set -euo pipefail
cd "$(dirname "$0")/.."
drill=${DRILL:-target/release/drill}
mode=${1:?usage: bench_appo.sh scaling | curve OUT [SEED]}
export DRILL_NETNS_SET=appo$$ DRILL_JOB_TOKEN=bench-appo-$$
tmp=$(mktemp -d)
trap 'pkill -KILL -f "bench-appo-mark-$$" || true; scripts/netns_hosts.sh down >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
scripts/netns_hosts.sh up 4 >/dev/null

# start K EXP [ARGS...]: one pong_appo run with K collector hosts, the learner's folder EXP,
# in the background; its runners' pids in `pids` (host order).
start() {
  local k=$1 exp=$2
  shift 2
  local n=$((k + 1))
  port=$((29700 + RANDOM % 200)) pids=()
  for ((h = 0; h <= k; h++)); do
    scripts/netns_hosts.sh exec "$h" "$drill" train configs/pong_appo.toml --quiet \
      --parallel-workers "$n" --node-ids "$h" --master-addr 10.77.0.1 --master-port "$port" \
      --exp-dir "$exp" --labels "bench-appo-mark-$$" \
      --set 'task.roles={"node.0"=["learner","evaluator"],"node.[1-9]"=["collector"]}' \
      --set task.topology='"mesh"' "$@" >"$exp.host$h.log" 2>&1 &
    pids+=($!)
  done
}

# run K EXP [ARGS...]: `start`, then wait for every runner.
run() {
  start "$@"
  for p in "${pids[@]}"; do wait "$p"; done
}

case $mode in
scaling)
  rounds=${ROUNDS:-3}
  steps=${STEPS:-40960}
  rate() {
    python3 - "$1/metrics.jsonl" <<'EOF'
import json, sys
pts = [json.loads(l) for l in open(sys.argv[1])]
pts = [(p["step"], p["wall_time"]) for p in pts if p["tag"] == "charts/SPS"]
(s0, t0), (s1, t1) = pts[3], pts[-1]
print(round((s1 - s0) / (t1 - t0), 1))
EOF
  }
  declare -A all
  for r in $(seq "$rounds"); do
    for k in 1 2 3; do
      run "$k" "$tmp/k$k-r$r" --set max_env_step="$steps" --set env.evaluator_env_num=1 \
        --set env.n_evaluator_episode=1 --set policy.eval.evaluator.eval_freq=100000000
      v=$(rate "$tmp/k$k-r$r")
      all[$k]="${all[$k]:-} $v"
      printf 'round %s: %s collector(s) %8s env steps/s\n' "$r" "$k" "$v"
    done
  done
  median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
  one=$(median ${all[1]})
  for k in 1 2 3; do
    m=$(median ${all[$k]})
    python3 -c "import sys; print(f'median: {sys.argv[1]} collector(s) {float(sys.argv[2]):.1f} env steps/s ({float(sys.argv[2])/float(sys.argv[3]):.2f}x one)')" "$k" "$m" "$one"
  done
  ;;
curve)
  out=${2:?curve OUT [SEED]}
  seed=${3:-0}
  run 1 "$out" --seed "$seed" --set policy.precision='"bf16"'
  cat "$out/result.json"
  ;;
churn)
  out=${2:?churn OUT KILL_AT JOIN_AT}
  kill_at=${3:?churn OUT KILL_AT JOIN_AT}
  join_at=${4:?churn OUT KILL_AT JOIN_AT}
  start 2 "$out" --set policy.precision='"bf16"'
  sleep "$kill_at"
  kill -KILL "${pids[2]}"
  echo "killed host 2's runner at ${kill_at} s"
  sleep "$((join_at - kill_at))"
  scripts/netns_hosts.sh exec 3 "$drill" train configs/pong_appo.toml --quiet \
    --parallel-workers 3 --join --master-addr 10.77.0.1 --master-port "$port" \
    --labels "bench-appo-mark-$$" \
    --set 'task.roles={"node.0"=["learner","evaluator"],"node.[1-9]"=["collector"]}' \
    --set task.topology='"mesh"' --set policy.precision='"bf16"' >"$out.host3.log" 2>&1 &
  joiner=$!
  echo "a collector joins from host 3 at ${join_at} s"
  wait "${pids[0]}"
  wait "$joiner" || echo "the joined collector ended with $?"
  grep -h "left\|joined\|sends its data" "$out.host0.log" || true
  cat "$out/result.json"
  ;;
*)
  echo "bench_appo.sh: unknown mode $mode (scaling | curve OUT [SEED] | churn OUT KILL_AT JOIN_AT)" >&2
  exit 2
  ;;
esac
