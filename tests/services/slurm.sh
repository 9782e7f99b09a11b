#!/usr/bin/env bash
# Start a one-node Slurm (munge, slurmctld, slurmd) on localhost for the cluster tests.
#
#   eval "$(tests/services/slurm.sh)"     # prints `export SLURM_CONF=...`; idempotent
#   tests/services/slurm.sh stop
#
# Needs root. Installs Debian's slurm-wlm and munge when missing. Everything else lives in
# $AUTOTUNE_SLURM_DIR (default /tmp/autotune-slurm): slurm.conf, state, spool, logs, pid files.
# The node has the machine's CPUs (at most $AUTOTUNE_SLURM_CPUS, default 2) and no GPUs; there
# is no slurmdbd, so `sacct` answers nothing: follow jobs with squeue and `scontrol show job`.
# The partition lets up to 4 jobs share a CPU (OverSubscribe=FORCE:4) so that the tests' trials
# can overlap on 2 cores. Exit codes: 3 not root (packages missing), 4 apt-get failed.
set -euo pipefail

DIR="${AUTOTUNE_SLURM_DIR:-/tmp/autotune-slurm}"
CONF="$DIR/slurm.conf"
CPUS="${AUTOTUNE_SLURM_CPUS:-2}"
NODE="$(hostname -s)"
PARTITION=debug

log() { echo "slurm.sh: $*" >&2; }

alive() {  # alive PIDFILE: the process named in PIDFILE runs
  [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

stop() {
  for daemon in slurmd slurmctld; do
    if alive "$DIR/$daemon.pid"; then
      kill "$(cat "$DIR/$daemon.pid")" || true
    fi
  done
  for daemon in slurmd slurmctld; do
    for _ in $(seq 50); do alive "$DIR/$daemon.pid" || break; sleep 0.1; done
    rm -f "$DIR/$daemon.pid"
  done
}

install() {
  command -v slurmctld >/dev/null && command -v munged >/dev/null && return
  if [ "$(id -u)" != 0 ]; then
    log "slurm-wlm and munge are missing and installing them needs root"; exit 3
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends slurm-wlm munge >&2 \
    || { apt-get update -q >&2 && apt-get install -y -q --no-install-recommends slurm-wlm munge >&2; } \
    || { log "apt-get could not install slurm-wlm munge"; exit 4; }
}

start_munge() {
  if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown munge:munge /run/munge /var/lib/munge /var/log/munge
  chmod 0755 /run/munge
  if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
  fi
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 50); do
    munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && return
    sleep 0.1
  done
  log "munged did not start"; exit 1
}

write_conf() {
  local cpus memory_mb
  cpus=$(nproc); [ "$cpus" -gt "$CPUS" ] && cpus=$CPUS
  memory_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
  mkdir -p "$DIR/state" "$DIR/spool"
  cat >"$CONF.new" <<CONF
# One-node Slurm for autotune's cluster tests (tests/services/slurm.sh).
ClusterName=autotune
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
MinJobAge=600
KillWait=2
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory_mb State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
  mv "$CONF.new" "$CONF"
}

ready() {  # the node takes jobs
  local state
  state=$(SLURM_CONF="$CONF" sinfo -h -n "$NODE" -o %T 2>/dev/null || true)
  case "$state" in idle*|mixed*|allocated*|completing*) return 0 ;; *) return 1 ;; esac
}

start() {
  install
  start_munge
  if alive "$DIR/slurmctld.pid" && alive "$DIR/slurmd.pid" && ready; then
    echo "export SLURM_CONF=$CONF"; return
  fi
  stop
  write_conf
  export SLURM_CONF="$CONF"
  # -c: a clean start (no saved jobs from an earlier run of the tests)
  slurmctld -c -f "$CONF"
  slurmd -f "$CONF"
  for _ in $(seq 200); do
    if ready; then echo "export SLURM_CONF=$CONF"; return; fi
    sleep 0.1
  done
  scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true
  for _ in $(seq 50); do
    if ready; then echo "export SLURM_CONF=$CONF"; return; fi
    sleep 0.1
  done
  log "the node did not come up; logs: $DIR/slurmctld.log $DIR/slurmd.log"
  tail -n 20 "$DIR/slurmctld.log" "$DIR/slurmd.log" >&2 || true
  exit 1
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  *) log "usage: $0 [start|stop]"; exit 2 ;;
esac
