#!/usr/bin/env bash
# drill's Gymnasium bridge against Gymnasium's own vector env stepped from Python, side by
# side, interleaved (ROUNDS times), for 1 and 8 copies. Needs a build with `--features
# python` and VIRTUAL_ENV set to a virtualenv with gymnasium.
#   VIRTUAL_ENV=/path/venv scripts/bench_gym_bridge.sh [ENV_ID] [STEPS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
id=${1:-CartPole-v1}
steps=${2:-50000}
rounds=${3:-3}
: "${VIRTUAL_ENV:?set VIRTUAL_ENV to a virtualenv with gymnasium}"
drill=${DRILL:-target/release/drill}
for r in $(seq "$rounds"); do
  for n in 1 8; do
    "$drill" bench env --env "gymnasium:$id" --num-envs "$n" --env-threads 1 --iters "$steps" | tail -1
    "$VIRTUAL_ENV/bin/python" scripts/bench_gym_vector.py "$id" "$n" "$steps"
  done
done
