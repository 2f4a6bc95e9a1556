#!/usr/bin/env bash
# The gradient all-reduce during the backward pass against after it, between 2 hosts made of
# namespaces (scripts/netns_hosts.sh; needs root), 1 rank each, TCP between them: `drill bench
# ddp` times an update (DQN or PPO) alone, with DDP starting each bucket during backward (the default),
# and with DDP starting them after backward, interleaved; rank 0 prints the medians and the
# share of DDP's cost the overlap hides.
#   CASE=pong ITERS=20 scripts/bench_ddp_overlap.sh     (CASE: pong (DI-engine's Pong DQN net),
#                                                      pong-ppo (pong_ppo's minibatch update) or cartpole)
# Uses target/release/drill (build it first: cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
drill=$PWD/target/release/drill
export DRILL_NETNS_SET=bddp$$
tmp=$(mktemp -d)
trap 'scripts/netns_hosts.sh down >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
scripts/netns_hosts.sh up 2 >/dev/null
pids=()
for k in 0 1; do
  DRILL_JOB_TOKEN=bench scripts/netns_hosts.sh exec "$k" "$drill" launch --nnodes 2 \
    --node-rank "$k" --master-addr 10.77.0.1 --master-port 29650 --nproc-per-node 1 -- \
    "$drill" bench ddp --case "${CASE:-pong}" ${ITERS:+--iters "$ITERS"} >"$tmp/h$k.log" 2>&1 &
  pids+=($!)
done
wait "${pids[@]}" || { cat "$tmp"/h*.log >&2; exit 1; }
grep -E '(dqn|ppo)-update|overlap-hidden|grad-all_reduce|ddp-overhead' "$tmp/h0.log" | sed 's/^\[rank 0\] //'
