#!/usr/bin/env bash
# Start a one-node Slurm with accounting (munge, MariaDB, slurmdbd, slurmctld, slurmd) on
# localhost for the cluster tests.
#
#   eval "$(tests/services/slurm.sh)"     # prints `export SLURM_CONF=...`; idempotent
#   tests/services/slurm.sh stop
#
# Needs root. Installs Debian's slurm-wlm, slurmdbd, mariadb-server and munge when missing.
# Everything else lives in $AUTOTUNE_SLURM_DIR (default /tmp/autotune-slurm): slurm.conf,
# slurmdbd.conf, the MariaDB data, state, spool, logs, pid files. The daemons listen on
# 127.0.0.1 only, on $AUTOTUNE_SLURM_PORT (default 6817: slurmctld) and the next three ports
# (slurmd, slurmdbd, MariaDB), so that a second cluster with another folder and port can run on
# the same machine. The node has the machine's CPUs (at most $AUTOTUNE_SLURM_CPUS, default 2)
# and no GPUs. The partition lets up to 4 jobs share a CPU (OverSubscribe=FORCE:4) so that the
# tests' trials can overlap on 2 cores.
#
# Accounting: slurmdbd on a private MariaDB, as on a production cluster, so that `sacct` answers
# for a job after slurmctld forgot it. The lighter path, JobCompType=jobcomp/filetxt without
# slurmdbd, does not serve: with AccountingStorageType=accounting_storage/none, Slurm 22.05's
# `sacct -j ID` refuses to run ("Slurm accounting storage is disabled"); only `sacct -c` reads
# the job-completion file, which is not what a user's cluster or autotune's runner uses.
# MariaDB starts in well under a second and slurmdbd creates its tables in about two, so a fresh
# start takes a few seconds (the first one also initializes the data folder: ~4 s).
# MinJobAge=2 (the smallest value slurm.conf(5) recommends): slurmctld forgets a finished job
# within about a minute (its purge runs periodically), after which only `sacct` knows it; the
# tests check the end of their jobs in `sacct`, and one test checks the runner's fallback to it.
# A fresh start (`slurmctld -c`: no saved jobs) also empties the accounting database, since job
# ids restart at 1.
# AuthInfo=cred_expire=10: Slurm holds a requeued job back for cred_expire + 1 s (default 120);
# the tests requeue a job and wait for its second run. EnforcePartLimits=ALL: sbatch refuses a
# job that the partition can never run (more CPUs than the node has), as on many production
# clusters; with Slurm's default (NO) it would wait in the queue for ever (PartitionConfig).
#
# Idempotent: running daemons with an unchanged configuration are reused; a changed one (e.g.
# an older version of this script) is restarted; concurrent starts wait for each other. Exit codes: 3 not root (packages missing),
# 4 apt-get failed.
set -euo pipefail

DIR="${AUTOTUNE_SLURM_DIR:-/tmp/autotune-slurm}"
CONF="$DIR/slurm.conf"
DBD_CONF="$DIR/slurmdbd.conf"
CPUS="${AUTOTUNE_SLURM_CPUS:-2}"
PORT="${AUTOTUNE_SLURM_PORT:-6817}"
SLURMD_PORT=$((PORT + 1)) DBD_PORT=$((PORT + 2)) DB_PORT=$((PORT + 3))
DB_DIR="$DIR/mariadb"
DB_SOCKET="$DB_DIR/mariadb.sock"
NODE="$(hostname -s)"
CLUSTER=autotune
PARTITION=debug
PACKAGES=(slurm-wlm slurmdbd mariadb-server munge)

log() { echo "slurm.sh: $*" >&2; }

alive() {  # alive PIDFILE: the process named in PIDFILE runs
  [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

wait_for() {  # wait_for TENTHS COMMAND...: until COMMAND succeeds, at most TENTHS/10 s
  local tenths=$1; shift
  for _ in $(seq "$tenths"); do "$@" && return 0; sleep 0.1; done
  return 1
}

stop_daemons() {  # stop_daemons NAME...: each $DIR/NAME.pid, and wait for it to end
  for daemon in "$@"; do
    if alive "$DIR/$daemon.pid"; then kill "$(cat "$DIR/$daemon.pid")" || true; fi
  done
  for daemon in "$@"; do
    wait_for 100 eval "! alive '$DIR/$daemon.pid'" || true
    rm -f "$DIR/$daemon.pid"
  done
}

stop() {
  stop_daemons slurmd slurmctld slurmdbd
  if db_alive; then
    mariadb-admin --no-defaults --socket="$DB_SOCKET" -u root shutdown || true
  fi
}

install() {
  command -v slurmctld >/dev/null && command -v slurmdbd >/dev/null \
    && command -v mariadbd >/dev/null && command -v munged >/dev/null && return
  if [ "$(id -u)" != 0 ]; then
    log "${PACKAGES[*]} are missing and installing them needs root"; exit 3
  fi
  export DEBIAN_FRONTEND=noninteractive
  local get=(apt-get install -y -q --no-install-recommends "${PACKAGES[@]}")
  "${get[@]}" >&2 || { apt-get update -q >&2 && "${get[@]}" >&2; } \
    || { log "apt-get could not install ${PACKAGES[*]}"; exit 4; }
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
  runuser -u munge -- /usr/sbin/munged 9>&-
  munge_works() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }
  wait_for 50 munge_works || { log "munged did not start"; exit 1; }
}

db_alive() { mariadb-admin --no-defaults --socket="$DB_SOCKET" -u root ping >/dev/null 2>&1; }

db() { mariadb --no-defaults --socket="$DB_SOCKET" -u root -e "$1"; }

start_mariadb() {  # a private server: its own folder, socket and port (root logs in by socket)
  db_alive && return
  mkdir -p "$DB_DIR"
  chown mysql:mysql "$DB_DIR"
  if [ ! -d "$DB_DIR/data/mysql" ]; then
    mariadb-install-db --no-defaults --user=mysql --datadir="$DB_DIR/data" \
      --auth-root-authentication-method=socket --skip-test-db >"$DB_DIR/install.log" 2>&1 \
      || { log "mariadb-install-db failed; see $DB_DIR/install.log"; exit 1; }
  fi
  # slurmdbd asks for innodb_lock_wait_timeout >= 900; the rest trades durability for speed
  setsid runuser -u mysql -- mariadbd --no-defaults --datadir="$DB_DIR/data" \
    --socket="$DB_SOCKET" --port="$DB_PORT" --bind-address=127.0.0.1 \
    --pid-file="$DB_DIR/mariadb.pid" --log-error="$DB_DIR/mariadb.log" --skip-log-bin \
    --innodb-buffer-pool-size=64M --innodb-lock-wait-timeout=900 \
    --innodb-flush-log-at-trx-commit=0 </dev/null >/dev/null 2>&1 9>&- &
  wait_for 300 db_alive || { log "MariaDB did not start; see $DB_DIR/mariadb.log"; exit 1; }
}

write_conf() {  # into $CONF.new and $DBD_CONF.new
  local cpus memory_mb
  cpus=$(nproc); [ "$cpus" -gt "$CPUS" ] && cpus=$CPUS
  memory_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
  mkdir -p "$DIR/state" "$DIR/spool"
  cat >"$CONF.new" <<CONF
# One-node Slurm for autotune's cluster tests (tests/services/slurm.sh).
ClusterName=$CLUSTER
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
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
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
MinJobAge=2
EnforcePartLimits=ALL
KillWait=2
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory_mb State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
  cat >"$DBD_CONF.new" <<CONF
# slurmdbd of autotune's test cluster (tests/services/slurm.sh); MariaDB in $DB_DIR.
AuthType=auth/munge
DbdHost=$NODE
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StorageLoc=slurm_acct_db
PidFile=$DIR/slurmdbd.pid
LogFile=$DIR/slurmdbd.log
CONF
  chmod 600 "$DBD_CONF.new"
}

unchanged() { cmp -s "$CONF.new" "$CONF" && cmp -s "$DBD_CONF.new" "$DBD_CONF"; }

ready() {  # the node takes jobs and slurmdbd answers
  local state
  state=$(sinfo -h -n "$NODE" -o %T 2>/dev/null || true)
  case "$state" in idle*|mixed*|allocated*|completing*) ;; *) return 1 ;; esac
  sacctmgr -n list cluster "$CLUSTER" 2>/dev/null | grep -q "$CLUSTER"
}

fail() {
  log "$1; logs: $DIR/slurmdbd.log $DIR/slurmctld.log $DIR/slurmd.log"
  tail -n 20 "$DIR/slurmdbd.log" "$DIR/slurmctld.log" "$DIR/slurmd.log" >&2 2>/dev/null || true
  exit 1
}

start() {
  mkdir -p "$DIR"
  exec 9>"$DIR/lock"  # one start at a time (test sessions may start together); daemons: 9>&-
  flock -w 300 9 || { log "another start holds $DIR/lock"; exit 1; }
  install
  start_munge
  write_conf
  export SLURM_CONF="$CONF"
  if unchanged && alive "$DIR/slurmdbd.pid" && alive "$DIR/slurmctld.pid" \
      && alive "$DIR/slurmd.pid" && ready; then
    rm -f "$CONF.new" "$DBD_CONF.new"
    echo "export SLURM_CONF=$CONF"; return
  fi
  stop_daemons slurmd slurmctld slurmdbd
  mv "$CONF.new" "$CONF"
  mv "$DBD_CONF.new" "$DBD_CONF"
  start_mariadb
  # a clean start: job ids restart at 1, so the accounting of earlier runs goes too
  db "DROP DATABASE IF EXISTS slurm_acct_db; CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1';
      GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
  slurmdbd 9>&-
  dbd_answers() { sacctmgr -n list cluster >/dev/null 2>&1; }
  wait_for 300 dbd_answers || fail "slurmdbd did not answer"
  sacctmgr -i add cluster "$CLUSTER" >/dev/null
  slurmctld -c -f "$CONF" 9>&-
  slurmd -f "$CONF" 9>&-
  if wait_for 200 ready; then echo "export SLURM_CONF=$CONF"; return; fi
  scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true
  if wait_for 50 ready; then echo "export SLURM_CONF=$CONF"; return; fi
  fail "the node did not come up"
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  *) log "usage: $0 [start|stop]"; exit 2 ;;
esac
