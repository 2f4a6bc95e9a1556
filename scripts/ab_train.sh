#!/usr/bin/env bash
# Interleaved A/B of two drill binaries: for each round, config and seed, A then B train the
# same run; prints env steps, train iterations, the last evaluation and wall seconds per run,
# then per config the median wall times and B/A. The same figures per seed = the same
# learning; interleaving gives both the same load.
#   scripts/ab_train.sh OLD_BINARY NEW_BINARY [CONFIG...]   (ROUNDS=2, SEEDS="0 1 2")
set -euo pipefail
cd "$(dirname "$0")/.."
a=$1 b=$2
shift 2
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(configs/cartpole_dqn.toml configs/cartpole_v1_ppo.toml configs/pendulum_ppo.toml)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for round in $(seq "${ROUNDS:-2}"); do
  for cfg in "${configs[@]}"; do
    for s in ${SEEDS:-0 1 2}; do
      for which in A B; do
        bin=$a; [ $which = B ] && bin=$b
        "$bin" train "$cfg" --seed "$s" --exp-dir "$tmp/run" --quiet >/dev/null 2>&1
        read -r steps iters eval wall <<<"$(sed -E 's/[ ,]//g' "$tmp/run/result.json" | awk -F: '/"env_steps"/{a=$2}/"train_iters"/{i=$2}/"eval_reward_mean"/{e=$2}/"wall_seconds"/{b=$2} END{print a, i, e, b}')"
        printf '%-34s round %s seed %s %s env_steps %7s iters %6s eval %s wall %ss\n' "$cfg" "$round" "$s" "$which" "$steps" "$iters" "$eval" "$wall"
        echo "$cfg $which $wall" >>"$tmp/walls"
        rm -rf "$tmp/run"
      done
    done
  done
done
median() { sort -g | awk '{v[NR]=$1} END{print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
for cfg in "${configs[@]}"; do
  ma=$(awk -v c="$cfg" '$1==c && $2=="A"{print $3}' "$tmp/walls" | median)
  mb=$(awk -v c="$cfg" '$1==c && $2=="B"{print $3}' "$tmp/walls" | median)
  printf '%-34s median wall A %ss  B %ss  B/A %s\n' "$cfg" "$ma" "$mb" "$(awk -v a="$ma" -v b="$mb" 'BEGIN{printf "%.3f", b/a}')"
done
