#!/usr/bin/env bash
# How fast an elastic job (`drill train --nnodes MIN:MAX`) recovers, on hosts made of
# namespaces (scripts/netns_hosts.sh; needs root), 1 rank each, CartPole DQN DDP with a wide
# net and a stop value it never reaches:
#   loss: N hosts train, the launcher of the last one is killed (its rank dies with it); the
#         time from the kill to the survivors' rank 0 training again ("training dqn on ...
#         (rank 0 of N-1");
#   late: N-1 hosts train, the last one's launcher starts; the time from its start to its
#         rank training ("training dqn on ... (rank N-1 of N").
# TRIES (default 5) tries of each, for N = 2 and 3; prints each try and the medians. The
# heartbeat settings are the defaults (1 s, 5 misses) unless RDZV_CONF adds to them.
#   TRIES=5 scripts/bench_elastic.sh
# Uses target/release/drill (build it first: cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
drill=$PWD/target/release/drill
cfg=$PWD/configs/cartpole_dqn_ddp.toml
tries=${TRIES:-5}
export DRILL_NETNS_SET=bel$$ DRILL_JOB_TOKEN=bench
tmp=$(mktemp -d)
trap 'pkill -KILL -f "rdzv-id bench-el-$$" || true; scripts/netns_hosts.sh down >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
scripts/netns_hosts.sh up 3 >/dev/null

now() { date +%s.%N; }

# start K TRY: start the launcher of host K (1 rank), output to $tmp/TRY/hK.log; its pid in
# pids[K].
start() {
  scripts/netns_hosts.sh exec "$1" "$drill" train "$cfg" --quiet --exp-dir "$tmp/$2/run" \
    --nnodes "1:3" --rdzv-endpoint 10.77.0.1:$((29700 + $2 % 200)) --rdzv-id "bench-el-$$" \
    --rdzv-conf "last_call_timeout=1${RDZV_CONF:+,$RDZV_CONF}" \
    --set 'policy.model.encoder_hidden_size_list=[1024,1024,512]' \
    --set env.stop_value=1000000 >"$tmp/$2/h$1.log" 2>&1 &
  pids[$1]=$!
}

# when FILE PATTERN: the epoch seconds of the first log line matching PATTERN (the ranks'
# lines carry their UTC time), waiting up to 60 s for it.
when() {
  local line
  for _ in $(seq 600); do
    line=$(grep -m1 -E "$2" "$1" 2>/dev/null || true)
    if [[ -n $line ]]; then
      date -d "$(sed -E 's/^\[rank [0-9]+\] ([0-9T:.-]+)Z.*/\1/' <<<"$line" | tr T ' ')Z" +%s.%N
      return
    fi
    sleep 0.1
  done
  echo "no line matching '$2' in $1:" >&2
  tail -5 "$1" >&2
  exit 1
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

try=0
for n in 2 3; do
  last=$((n - 1))
  for kind in loss late; do
    : >"$tmp/$kind$n"
    for _ in $(seq "$tries"); do
      try=$((try + 1))
      mkdir -p "$tmp/$try"
      pids=()
      hosts=$n
      [[ $kind == late ]] && hosts=$last
      start 0 "$try"
      sleep 0.3
      for ((k = 1; k < hosts; k++)); do start "$k" "$try"; done
      when "$tmp/$try/h0.log" "training dqn on .*rank 0 of $hosts" >/dev/null
      sleep 2
      if [[ $kind == loss ]]; then
        t0=$(now)
        kill -KILL "${pids[$last]}"
        t1=$(when "$tmp/$try/h0.log" "training dqn on .*rank 0 of $last")
      else
        t0=$(now)
        start "$last" "$try"
        t1=$(when "$tmp/$try/h$last.log" "training dqn on .*rank $last of $n")
      fi
      dt=$(echo "$t1 - $t0" | bc -l)
      printf '%s %d hosts, try %d: %.2f s\n' "$kind" "$n" "$try" "$dt"
      echo "$dt" >>"$tmp/$kind$n"
      kill -INT "${pids[@]}" 2>/dev/null || true
      wait "${pids[@]}" 2>/dev/null || true
      pids=()
    done
  done
done
echo
echo "| event | hosts | median of $tries (s) |"
echo "|---|---|---|"
for n in 2 3; do
  printf '| host lost: kill -> training on the %d left | %d -> %d | %.2f |\n' $((n - 1)) "$n" $((n - 1)) "$(median <"$tmp/loss$n")"
  printf '| late host: start -> training with it | %d -> %d | %.2f |\n' $((n - 1)) "$n" "$(median <"$tmp/late$n")"
done
