#!/usr/bin/env bash
# Data-parallel scaling: env steps/s of CONFIG on 2 ranks (--nproc-per-node 2) against 1 rank,
# the same fixed number of env steps (stop value out of reach), runs interleaved in pairs;
# prints each pair and the median of the per-pair ratios.
#   ROUNDS=8 STEPS=131072 scripts/bench_ddp_scaling.sh [CONFIG]   (default cartpole_ppo_ddp)
# Uses target/release/drill (build it first: cargo build --release), or DRILL=path.
set -euo pipefail
cd "$(dirname "$0")/.."
drill=${DRILL:-target/release/drill}
cfg=${1:-configs/cartpole_ppo_ddp.toml}
rounds=${ROUNDS:-8}
steps=${STEPS:-131072}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rate() { python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["env_steps_per_sec"]))' "$1/result.json"; }
ratios=()
for r in $(seq "$rounds"); do
  for n in 1 2; do
    "$drill" train "$cfg" --quiet --nproc-per-node "$n" --exp-dir "$tmp/n$n-$r" \
      --set max_env_step="$steps" --set env.stop_value=1e9 >/dev/null 2>&1
  done
  one=$(rate "$tmp/n1-$r"); two=$(rate "$tmp/n2-$r")
  ratios+=("$(python3 -c "print(round($two/$one, 3))")")
  printf 'pair %s: 1 rank %8s env steps/s   2 ranks %8s env steps/s   %sx\n' "$r" "$one" "$two" "${ratios[-1]}"
done
printf '%s\n' "${ratios[@]}" | sort -g | awk '{a[NR]=$1} END{printf "median scaling, 2 ranks vs 1: %.2fx\n", a[int((NR+1)/2)]}'
