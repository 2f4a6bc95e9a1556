#!/usr/bin/env bash
# A throwaway one-node Slurm cluster on this machine, for tests and for trying drill under
# srun/sbatch (needs root and Debian's slurm-wlm + munge: `apt-get install slurm-wlm munge`).
# Everything lives in DIR: munge key and socket, slurm.conf, state, spool and logs; nothing is
# written to /etc, and the daemons listen on free ports on 127.0.0.1 only.
#
#   slurm_cluster.sh up DIR [CPUS]   start munged, slurmctld and slurmd (one node named
#                                    as this host, CPUS CPUs, default 2, partition "debug")
#                                    and wait until it is idle
#   slurm_cluster.sh env DIR         print the export line the client commands need
#                                    (eval "$(slurm_cluster.sh env DIR)"; srun -n2 ...)
#   slurm_cluster.sh down DIR        stop the daemons and jobs, remove DIR (also after a failure)
set -euo pipefail

die() {
  echo "slurm_cluster.sh: $*" >&2
  exit 1
}

need() {
  command -v "$1" >/dev/null || die "$1 not found: install Debian's slurm-wlm and munge (apt-get install slurm-wlm munge)"
}

# A TCP port nobody listens on (checked, not reserved: the daemons bind it right after).
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

up() {
  local dir=$1 cpus=${2:-2}
  [[ $cpus =~ ^[0-9]+$ && $cpus -ge 1 ]] || die "up DIR CPUS: CPUS must be a positive integer, got '$cpus'"
  [[ $(id -u) -eq 0 ]] || die "needs root (slurmd starts job steps as their user)"
  need munged
  need slurmctld
  need slurmd
  need sinfo
  [[ ! -e $dir/slurm.conf ]] || die "$dir holds a cluster already; run: slurm_cluster.sh down $dir"
  # The node is named as this host, as on a real cluster: the node list then holds names
  # that resolve, and drill takes its store's host from it.
  local node
  node=$(hostname -s)
  mkdir -p "$dir"/{munge,state,spool/$node,log}
  dir=$(cd "$dir" && pwd)
  # Whatever fails from here on (an error or `die`), leave nothing running.
  trap 'down "$dir" >/dev/null 2>&1 || true' EXIT
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
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$node_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.sock
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
MailProg=/bin/true
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
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
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  slurmctld -f "$dir/slurm.conf"
  slurmd -f "$dir/slurm.conf" -N "$node"
  export SLURM_CONF=$dir/slurm.conf
  for _ in $(seq 60); do
    # sinfo retries for minutes while the controller is unreachable: bound each try.
    if [[ $(timeout 2 sinfo -h -n "$node" -o %t 2>/dev/null) == idle ]]; then
      echo "slurm_cluster.sh: node $node ($cpus CPUs) idle; SLURM_CONF=$dir/slurm.conf"
      trap - EXIT
      return
    fi
    sleep 0.5
  done
  tail -n 20 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 || true
  die "node $node did not become idle within 30 s (logs above, in $dir/log)"
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
  local dir=$1
  [[ -d $dir ]] || return 0
  dir=$(cd "$dir" && pwd)
  if [[ -f $dir/slurm.conf ]]; then
    SLURM_CONF=$dir/slurm.conf timeout 5 scancel --full --quiet --user=root 2>/dev/null || true
    stop_pid_file "$dir/slurmd.pid"
    # Job steps outlive a stopped slurmd: end any slurmstepd started from this cluster.
    pkill -9 -f "slurmstepd.*$dir" 2>/dev/null || true
    stop_pid_file "$dir/slurmctld.pid"
  fi
  stop_pid_file "$dir/munge/munged.pid"
  rm -rf "$dir"
}

case ${1:-} in
  up) [[ $# -ge 2 ]] || die "usage: slurm_cluster.sh up DIR [CPUS]"; up "$2" "${3:-2}" ;;
  env) [[ $# -eq 2 ]] || die "usage: slurm_cluster.sh env DIR"; echo "export SLURM_CONF=$(cd "$2" && pwd)/slurm.conf" ;;
  down) [[ $# -eq 2 ]] || die "usage: slurm_cluster.sh down DIR"; down "$2" ;;
  *) die "usage: slurm_cluster.sh up DIR [CPUS] | env DIR | down DIR" ;;
esac
