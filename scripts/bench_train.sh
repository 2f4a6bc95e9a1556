#!/usr/bin/env bash
# Prints the training figures: for each config and seed, whether the stop value was reached,
# env steps, wall seconds and the final evaluation, then the median and max wall time.
#   scripts/bench_train.sh [CONFIG...]   (default: the four shipped single-process configs)
#   NPROC=2 scripts/bench_train.sh configs/cartpole_dqn_ddp.toml   (data-parallel on 2 ranks)
# Uses target/release/drill (build it first: cargo build --release), or DRILL=path (A/B runs).
set -euo pipefail
cd "$(dirname "$0")/.."
drill=${DRILL:-target/release/drill}
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(configs/cartpole_dqn.toml configs/cartpole_v1_dqn.toml configs/cartpole_v1_ppo.toml configs/pendulum_ppo.toml)
seeds=${SEEDS:-"0 1 2"}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for cfg in "${configs[@]}"; do
  walls=()
  for s in $seeds; do
    "$drill" train "$cfg" --seed "$s" --exp-dir "$tmp/run" --quiet ${NPROC:+--nproc-per-node "$NPROC"} 2>/dev/null >/dev/null
    r="$tmp/run/result.json"
    read -r stop steps wall eval <<<"$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["stop_reached"], r["env_steps"], round(r["wall_seconds"],3), round(r["eval_reward_mean"],1))' "$r" 2>/dev/null ||
      sed -E 's/[ ,]//g' "$r" | awk -F: '/stop_reached/{a=$2}/"env_steps"/{b=$2}/wall_seconds/{c=$2}/eval_reward_mean/{d=$2} END{print a, b, c, d}')"
    printf '%-32s seed %s  stop_reached %-5s  env_steps %7s  wall %7ss  eval %s\n' "$cfg" "$s" "$stop" "$steps" "$wall" "$eval"
    walls+=("$wall")
    rm -rf "$tmp/run"
  done
  printf '%-32s median wall %ss, max %ss\n' "$cfg" \
    "$(printf '%s\n' "${walls[@]}" | sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}')" \
    "$(printf '%s\n' "${walls[@]}" | sort -g | tail -1)"
done
