#!/usr/bin/env bash
# Hosts made of Linux namespaces on one machine, for multi-node tests (needs root, iproute2,
# util-linux). Each host is a network namespace with its own mount and UTS namespaces (its
# own /dev/shm and hostname), joined to the others through a bridge that lives in a namespace
# of its own, so nothing is added to the machine's own network: host K is 10.77.0.(K+1)/24,
# named SET-hK, and every host resolves every host's name (its own /etc/hosts).
#
#   netns_hosts.sh up N          make hosts 0..N-1 (fails if the set exists)
#   netns_hosts.sh exec K CMD…   run CMD on host K (its network, /dev/shm and hostname)
#   netns_hosts.sh cut K         take host K's link down (a pulled cable)
#   netns_hosts.sh restore K     bring it back up
#   netns_hosts.sh netem K ARGS  shape host K's outgoing traffic (`tc netem` ARGS, e.g.
#                                "delay 5ms loss 1%"); `netem K off` removes it
#   netns_hosts.sh loss K PCT    drop PCT % of host K's outgoing packets at random (nftables,
#                                for kernels without netem); `loss K off` removes it
#   netns_hosts.sh freeze K      stop every process on host K (SIGSTOP: a frozen machine)
#   netns_hosts.sh thaw K        continue them
#   netns_hosts.sh down          remove everything `up` made (also after a failed test)
#
# DRILL_NETNS_SET (default "drillh") names the set, so tests can run side by side; its state
# (the pids holding each host's namespaces) is kept in /run/drill-netns/SET.
set -euo pipefail

set_name=${DRILL_NETNS_SET:-drillh}
state=/run/drill-netns/$set_name
sw=$set_name-sw

die() {
  echo "netns_hosts.sh: $*" >&2
  exit 1
}

host_ns() { echo "$set_name-h$1"; }

holder_pid() {
  [[ -f $state/h$1.pid ]] || die "host $1 of set $set_name does not exist (run: netns_hosts.sh up N)"
  cat "$state/h$1.pid"
}

up() {
  local n=$1
  [[ $n =~ ^[0-9]+$ && $n -ge 1 && $n -le 200 ]] || die "up N: N must be 1..200, got '$n'"
  [[ ! -e $state ]] || die "set $set_name exists already ($state); run: netns_hosts.sh down"
  mkdir -p "$state"
  # Whatever fails from here on (an error or `die`), leave nothing behind.
  trap 'down >/dev/null 2>&1 || true' EXIT
  # Every host resolves every host's name (its own /etc/hosts, bind-mounted in its mount
  # namespace), as machines of a cluster do.
  {
    echo "127.0.0.1 localhost"
    for ((k = 0; k < n; k++)); do echo "10.77.0.$((k + 1)) $set_name-h$k"; done
  } >"$state/hosts"
  ip netns add "$sw"
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  ip -n "$sw" link set lo up
  for ((k = 0; k < n; k++)); do
    local ns
    ns=$(host_ns "$k")
    ip netns add "$ns"
    ip link add "p$k" netns "$sw" type veth peer name eth0 netns "$ns"
    ip -n "$sw" link set "p$k" master br0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "10.77.0.$((k + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    # A process holding a private mount namespace (own /dev/shm and /etc/hosts) and UTS
    # namespace (own hostname) inside the host's network namespace; `exec` enters all three
    # through it. nsenter, not `ip netns exec`: that one mounts a fresh /sys, without the
    # machine's cgroup hierarchy that daemons such as slurmd need.
    nsenter --net="/run/netns/$ns" unshare --mount --uts --propagation private \
      sh -c "mount -t tmpfs -o size=512m tmpfs /dev/shm && mount --bind $state/hosts /etc/hosts && hostname $set_name-h$k && exec sleep infinity" \
      </dev/null >/dev/null 2>&1 &
    echo $! >"$state/h$k.pid"
  done
  echo "$n" >"$state/n"
  # Wait until every holder has its namespaces set up.
  for ((k = 0; k < n; k++)); do
    local pid
    pid=$(cat "$state/h$k.pid")
    for _ in $(seq 100); do
      [[ $(nsenter -t "$pid" -u hostname 2>/dev/null) == "$set_name-h$k" ]] && break
      sleep 0.05
    done
    [[ $(nsenter -t "$pid" -u hostname 2>/dev/null) == "$set_name-h$k" ]] ||
      die "host $k did not come up"
  done
  trap - EXIT
}

# The processes started on the host whose holder is $1 (same mount namespace), holder excluded.
on_host() {
  local holder=$1 mnt p
  mnt=$(readlink "/proc/$holder/ns/mnt" 2>/dev/null) || return 0
  for p in $(ps -e -o pid=); do
    [[ $p != "$holder" && $(readlink "/proc/$p/ns/mnt" 2>/dev/null) == "$mnt" ]] && echo "$p"
  done
  return 0
}

# Stop (or continue) every process on host K: a frozen machine, as far as its peers can tell.
freeze() {
  local pid now before=""
  pid=$(holder_pid "$1")
  # Pass after pass until one finds no process the last missed: a rank the launcher was
  # starting while it was being stopped would otherwise run on (at most a few passes).
  for _ in 1 2 3 4 5 6; do
    now=$(on_host "$pid" | sort)
    # A process that exited since it was listed needs no signal: kill still signals the others.
    [[ -z $now ]] || echo "$now" | xargs -r kill "-$2" 2>/dev/null || true
    [[ $now == "$before" ]] && break
    before=$now
    sleep 0.05
  done
  return 0
}

down() {
  if [[ -d $state ]]; then
    for f in "$state"/h*.pid; do
      [[ -f $f ]] || continue
      local pid
      pid=$(cat "$f")
      # Everything started on the host, then the holder itself.
      on_host "$pid" | xargs -r kill -9 2>/dev/null || true
      kill -9 "$pid" 2>/dev/null || true
    done
  fi
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$set_name-(h[0-9]+|sw)$" || true); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns delete "$ns"
  done
  rm -rf "$state"
}

run_on() {
  local k=$1
  shift
  local pid
  pid=$(holder_pid "$k")
  # In the same working directory (entering a mount namespace would start at its root).
  exec nsenter -t "$pid" -n -m -u --wd="$PWD" -- "$@"
}

link() {
  holder_pid "$1" >/dev/null
  ip -n "$sw" link set "p$1" "$2"
}

netem() {
  local k=$1
  shift
  local ns
  holder_pid "$k" >/dev/null
  ns=$(host_ns "$k")
  if [[ ${1:-} == off ]]; then
    ip netns exec "$ns" tc qdisc del dev eth0 root 2>/dev/null || true
  else
    ip netns exec "$ns" tc qdisc replace dev eth0 root netem "$@" ||
      die "tc netem failed: this kernel may lack netem (CONFIG_NET_SCH_NETEM; $(uname -r))"
  fi
}

loss() {
  local k=$1 pct=$2 ns per10k
  holder_pid "$k" >/dev/null
  ns=$(host_ns "$k")
  command -v nft >/dev/null || die "loss needs nftables (apt-get install nftables)"
  # The table lives in the host's network namespace and goes with it.
  ip netns exec "$ns" nft delete table inet drill_loss 2>/dev/null || true
  [[ $pct == off ]] && return
  per10k=$(awk -v p="$pct" 'BEGIN { if (p !~ /^[0-9]+(\.[0-9]+)?$/ || p > 100) exit 1; printf "%d", p * 100 + 0.5 }') ||
    die "loss K PCT: PCT must be a percentage 0..100, got '$pct'"
  ip netns exec "$ns" nft -f - <<EOF_NFT
table inet drill_loss {
  chain out {
    type filter hook output priority 0; policy accept;
    numgen random mod 10000 < $per10k counter drop
  }
}
EOF_NFT
}

cmd=${1:-}
shift || true
case $cmd in
up) up "${1:?up N}" ;;
down) down ;;
exec) run_on "${1:?exec K CMD...}" "${@:2}" ;;
cut) link "${1:?cut K}" down ;;
restore) link "${1:?restore K}" up ;;
netem) netem "${1:?netem K ARGS}" "${@:2}" ;;
loss) loss "${1:?loss K PCT}" "${2:?loss K PCT|off}" ;;
freeze) freeze "${1:?freeze K}" STOP ;;
thaw) freeze "${1:?thaw K}" CONT ;;
*) die "usage: netns_hosts.sh up N | exec K CMD... | cut K | restore K | netem K ARGS|off | loss K PCT|off | freeze K | thaw K | down" ;;
esac
