#!/usr/bin/env bash
# A throwaway Slurm cluster, for tests and for trying drill under srun/sbatch (needs root and
# Debian's slurm-wlm + munge: `apt-get install slurm-wlm munge`). Everything lives in DIR:
# munge key and socket, slurm.conf, state, spool and logs; nothing is written to /etc.
#
#   slurm_cluster.sh up DIR [CPUS]     one node named as this machine, CPUS CPUs (default 2),
#                                      daemons on free ports of 127.0.0.1
#   slurm_cluster.sh up-hosts DIR [CPUS]
#                                      one node per host of the namespace host set
#                                      $DRILL_NETNS_SET (scripts/netns_hosts.sh, already up):
#                                      node SET-hK on host K, slurmctld on host 0; run client
#                                      commands on a host: netns_hosts.sh exec 0 srun ...
#   slurm_cluster.sh env DIR           print the export line the client commands need
#                                      (eval "$(slurm_cluster.sh env DIR)"; srun -n2 ...)
#   slurm_cluster.sh down DIR          stop the daemons and jobs, remove DIR (also after a
#                                      failure)
#
# `up` returns once every node is idle; partition "debug" holds them all.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)

die() {
  echo "slurm_cluster.sh: $*" >&2
  exit 1
}

need() {
  command -v "$1" >/dev/null || die "$1 not found: install Debian's slurm-wlm and munge (apt-get install slurm-wlm munge)"
}

# A TCP port nobody listens on here (checked, not reserved: the daemons bind it right after).
free_port() {
  local p
  for _ in $(seq 200); do
    p=$((20000 + RANDOM % 20000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"
      return
    fi
  done
  die "no free port found"
}

# Run a command on node K: this machine, or namespace host K.
on() {
  local k=$1
  shift
  if [[ -f $dir/netns_set ]]; then
    DRILL_NETNS_SET=$(cat "$dir/netns_set") "$here/netns_hosts.sh" exec "$k" "$@"
  else
    "$@"
  fi
}

# up DIR CPUS MODE: MODE "local" (one node, this machine) or "hosts" (namespace hosts).
up() {
  dir=$1
  local cpus=$2 mode=$3
  [[ $cpus =~ ^[0-9]+$ && $cpus -ge 1 ]] || die "CPUS must be a positive integer, got '$cpus'"
  [[ $(id -u) -eq 0 ]] || die "needs root (slurmd starts job steps as their user)"
  need munged
  need slurmctld
  need slurmd
  need sinfo
  [[ ! -e $dir/slurm.conf ]] || die "$dir holds a cluster already; run: slurm_cluster.sh down $dir"
  # Nodes are named as their hosts, as on a real cluster: the node list then holds names
  # that resolve, and drill takes its store's host from it.
  local names=() addrs=() ctld
  if [[ $mode == hosts ]]; then
    local set=${DRILL_NETNS_SET:-drillh} n
    [[ -f /run/drill-netns/$set/n ]] || die "namespace host set $set is not up (scripts/netns_hosts.sh up N)"
    n=$(cat "/run/drill-netns/$set/n")
    for ((k = 0; k < n; k++)); do
      names+=("$set-h$k")
      addrs+=("10.77.0.$((k + 1))")
    done
    ctld="$set-h0(10.77.0.1)"
  else
    names=("$(hostname -s)")
    addrs=(127.0.0.1)
    ctld="$(hostname -s)(127.0.0.1)"
  fi
  mkdir -p "$dir"/{munge,state,spool,log}
  dir=$(cd "$dir" && pwd)
  # Whatever fails from here on (an error or `die`), leave nothing running.
  trap 'down "$dir" >/dev/null 2>&1 || true' EXIT
  [[ $mode == hosts ]] && echo "$set" >"$dir/netns_set"
  for name in "${names[@]}"; do mkdir -p "$dir/spool/$name"; done
  # One munged serves every node: its socket is a file, reachable from every namespace host.
  chmod 700 "$dir/munge"
  dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chmod 600 "$dir/munge/munge.key"
  munged --force --socket="$dir/munge/munge.sock" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/munge/munged.seed" 2>>"$dir/log/munged.log"
  local ctld_port node_port
  ctld_port=$(free_port)
  node_port=$(free_port)
  cat >"$dir/slurm.conf" <<EOF
ClusterName=drill
SlurmctldHost=$ctld
SlurmctldPort=$ctld_port
SlurmdPort=$node_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.sock
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  for k in "${!names[@]}"; do
    echo "NodeName=${names[$k]} NodeAddr=${addrs[$k]} CPUs=$cpus State=UNKNOWN" >>"$dir/slurm.conf"
  done
  on 0 slurmctld -f "$dir/slurm.conf"
  for k in "${!names[@]}"; do
    on "$k" slurmd -f "$dir/slurm.conf" -N "${names[$k]}"
  done
  local idle
  for _ in $(seq 60); do
    # sinfo retries for minutes while the controller is unreachable: bound each try.
    idle=$(on 0 env SLURM_CONF="$dir/slurm.conf" timeout 2 sinfo -h -t idle -o %D 2>/dev/null || true)
    if [[ $idle == "${#names[@]}" ]]; then
      echo "slurm_cluster.sh: ${#names[@]} node(s) idle (${names[*]}, $cpus CPUs each); SLURM_CONF=$dir/slurm.conf"
      trap - EXIT
      return
    fi
    sleep 0.5
  done
  tail -n 20 "$dir"/log/*.log >&2 || true
  die "the nodes did not become idle within 30 s (logs above, in $dir/log)"
}

stop_pid_file() {
  local f=$1 pid
  [[ -f $f ]] || return 0
  pid=$(cat "$f")
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
}

down() {
  dir=$1
  [[ -d $dir ]] || return 0
  dir=$(cd "$dir" && pwd)
  if [[ -f $dir/slurm.conf ]]; then
    on 0 env SLURM_CONF="$dir/slurm.conf" timeout 5 scancel --full --quiet --user=root 2>/dev/null || true
    local f
    for f in "$dir"/slurmd-*.pid; do stop_pid_file "$f"; done
    # Job steps outlive a stopped slurmd: end any slurmstepd started from this cluster.
    pkill -9 -f "slurmstepd.*$dir" 2>/dev/null || true
    stop_pid_file "$dir/slurmctld.pid"
  fi
  stop_pid_file "$dir/munge/munged.pid"
  rm -rf "$dir"
}

case ${1:-} in
  up) [[ $# -ge 2 ]] || die "usage: slurm_cluster.sh up DIR [CPUS]"; up "$2" "${3:-2}" local ;;
  up-hosts) [[ $# -ge 2 ]] || die "usage: slurm_cluster.sh up-hosts DIR [CPUS]"; up "$2" "${3:-2}" hosts ;;
  env) [[ $# -eq 2 ]] || die "usage: slurm_cluster.sh env DIR"; echo "export SLURM_CONF=$(cd "$2" && pwd)/slurm.conf" ;;
  down) [[ $# -eq 2 ]] || die "usage: slurm_cluster.sh down DIR"; down "$2" ;;
  *) die "usage: slurm_cluster.sh up DIR [CPUS] | up-hosts DIR [CPUS] | env DIR | down DIR" ;;
esac
