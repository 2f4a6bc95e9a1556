#!/usr/bin/env bash
# Seed 001's figure: learner train iterations/s with the evaluator in another process
# (configs/cartpole_dqn_dist.toml, 2 workers) against the same learner with no evaluation at
# all (configs/cartpole_dqn.toml with eval_freq beyond the run). Both collect and train
# ITERS iterations (stop value out of reach); runs are interleaved, medians and their ratio
# printed.   ROUNDS=5 ITERS=3000 scripts/bench_split.sh
# Uses target/release/drill (build it first: cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
drill=target/release/drill
rounds=${ROUNDS:-5}
iters=${ITERS:-3000}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rate() { python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(round(r["train_iters"]/r["wall_seconds"],1))' "$1/result.json"; }
split=(); alone=()
for k in $(seq "$rounds"); do
  "$drill" train configs/cartpole_dqn.toml --quiet --exp-dir "$tmp/a$k" \
    --set env.stop_value=1e9 --set max_train_iter="$iters" \
    --set policy.eval.evaluator.eval_freq=100000000 >/dev/null 2>&1
  "$drill" train configs/cartpole_dqn_dist.toml --quiet --exp-dir "$tmp/s$k" \
    --set env.stop_value=1e9 --set max_train_iter="$iters" >/dev/null 2>&1
  a=$(rate "$tmp/a$k"); s=$(rate "$tmp/s$k")
  alone+=("$a"); split+=("$s")
  printf 'round %s: no evaluation %8s it/s   evaluator in another process %8s it/s\n' "$k" "$a" "$s"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
ma=$(median "${alone[@]}"); ms=$(median "${split[@]}")
python3 -c "import sys; a,s=float(sys.argv[1]),float(sys.argv[2]); print(f'median: no evaluation {a} it/s, evaluator in another process {s} it/s: {100*s/a:.1f} %')" "$ma" "$ms"
