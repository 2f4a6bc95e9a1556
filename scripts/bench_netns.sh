#!/usr/bin/env bash
# Multi-node cost on hosts made of namespaces (scripts/netns_hosts.sh; needs root): seconds to
# the stop value of configs/cartpole_dqn_ddp.toml with 2 ranks on one host, 1 rank on each of
# 2 hosts, and the same 2 hosts dropping LOSS % of their packets each way (nftables: this
# kernel has no netem for delay). Runs interleaved; medians and ratios printed.
#   ROUNDS=5 LOSS=1 scripts/bench_netns.sh
# Uses target/release/drill (build it first: cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
drill=$PWD/target/release/drill
rounds=${ROUNDS:-5}
loss=${LOSS:-1}
export DRILL_NETNS_SET=bnet$$
tmp=$(mktemp -d)
trap 'scripts/netns_hosts.sh down >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
scripts/netns_hosts.sh up 2
secs() { python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["stop_reached"], r; print(round(r["wall_seconds"],3))' "$1/result.json"; }
# Both hosts' launchers, node K on host K, the store on host 0.
two_hosts() {
  local exp=$1 port=$2 pids=()
  for k in 0 1; do
    DRILL_JOB_TOKEN=bench scripts/netns_hosts.sh exec "$k" "$drill" launch --nnodes 2 \
      --node-rank "$k" --master-addr 10.77.0.1 --master-port "$port" --nproc-per-node 1 -- \
      "$drill" train configs/cartpole_dqn_ddp.toml --quiet --exp-dir "$exp" >"$exp.h$k.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}" || { cat "$exp".h*.log >&2; exit 1; }
}
one=(); two=(); lossy=()
for r in $(seq "$rounds"); do
  scripts/netns_hosts.sh exec 0 "$drill" train configs/cartpole_dqn_ddp.toml --quiet \
    --nproc-per-node 2 --exp-dir "$tmp/one$r" >/dev/null 2>&1
  two_hosts "$tmp/two$r" $((29600 + 2 * r))
  scripts/netns_hosts.sh loss 0 "$loss"
  scripts/netns_hosts.sh loss 1 "$loss"
  two_hosts "$tmp/loss$r" $((29601 + 2 * r))
  scripts/netns_hosts.sh loss 0 off
  scripts/netns_hosts.sh loss 1 off
  one+=("$(secs "$tmp/one$r")"); two+=("$(secs "$tmp/two$r")"); lossy+=("$(secs "$tmp/loss$r")")
  printf 'round %s: 1 host x 2 ranks %6s s   2 hosts x 1 rank %6s s   2 hosts, %s %% loss %6s s\n' \
    "$r" "${one[-1]}" "${two[-1]}" "$loss" "${lossy[-1]}"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
python3 -c "import sys; o,t,l=map(float,sys.argv[1:4]); print(f'median s to the stop value: 1 host x 2 ranks {o}, 2 hosts x 1 rank {t} ({t/o:.2f}x), 2 hosts with {sys.argv[4]} % loss {l} ({l/t:.2f}x of no loss)')" \
  "$(median "${one[@]}")" "$(median "${two[@]}")" "$(median "${lossy[@]}")" "$loss"
