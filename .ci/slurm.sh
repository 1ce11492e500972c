#!/usr/bin/env bash
# A real single-node Slurm on this machine, for the Slurm tier of the tests (CI and developers); root, no systemd.
#
#   .ci/slurm.sh install   apt-get the Debian packages (slurmctld slurmd slurm-client munge slurmdbd mariadb-server)
#   .ci/slurm.sh start     write its configuration, start munged, MariaDB, slurmdbd, slurmctld and slurmd, and wait
#                          until the node is idle and accounting answers (a no-op when it already is)
#   .ci/slurm.sh stop      stop the daemons it started, by their own pid files
#   .ci/slurm.sh status    say which daemons run; exit 0 when Slurm takes jobs
#
# State, logs and pid files live in $MXVAL_SLURM_DIR (default /var/lib/mxval-slurm); the configuration is written to
# /etc/slurm (where every Slurm command looks for it), and refused there when a slurm.conf not written by this script
# exists. Accounting (slurmdbd with MariaDB) is not optional: submitit and the Slurm executor read job states from
# sacct, and without accounting a cancelled job's state is never known.
set -euo pipefail

DIR=${MXVAL_SLURM_DIR:-/var/lib/mxval-slurm}
TIMEOUT=${MXVAL_SLURM_TIMEOUT:-60}  # seconds for each daemon to answer; measured: the whole cold start takes 3-10 s
DB_PORT=${MXVAL_SLURM_DB_PORT:-3307}  # a private MariaDB on its own port and data folder: 3306 may be a user's own
CONF=/etc/slurm
MARK="# written by mxval .ci/slurm.sh"
PACKAGES=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server)
RUN=$DIR/run
LOG=$DIR/log
HOST=$(hostname -s)

die() { echo "slurm.sh: $*" >&2; exit 1; }

alive() {  # alive NAME: the process in $RUN/NAME.pid runs
    local pid
    pid=$(cat "$RUN/$1.pid" 2>/dev/null) || return 1
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}

last_line() { tail -n 1 "$1" 2>/dev/null || echo "(no log)"; }

wait_for() {  # wait_for WHAT LOGFILE COMMAND...: run COMMAND until it succeeds, or fail after $TIMEOUT s
    local what=$1 log=$2 t0=$SECONDS
    shift 2
    until "$@" >/dev/null 2>&1; do
        [ $((SECONDS - t0)) -lt "$TIMEOUT" ] || die "$what did not answer within $TIMEOUT s; its log $log ends: $(last_line "$log")"
        sleep 0.2
    done
}

ours() {  # ours FILE: absent, or written by this script
    [ ! -e "$1" ] || head -n 1 "$1" | grep -qxF "$MARK"
}

install_packages() {
    [ "$(id -u)" = 0 ] || die "install needs root (apt-get)"
    command -v apt-get >/dev/null || die "install needs apt-get (Debian or Ubuntu); install ${PACKAGES[*]} yourself"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
}

write_config() {
    local topology real mem pass
    for f in slurm.conf slurmdbd.conf gres.conf; do
        ours "$CONF/$f" || die "$CONF/$f exists and was not written by this script: this machine has its own Slurm; use it"
    done
    mkdir -p "$CONF" "$RUN" "$LOG" "$DIR/ctld" "$DIR/spool" "$DIR/gpu"
    # the node as slurmd sees it; RealMemory 90 % of what it detects: a node whose detected memory falls below its
    # RealMemory is drained, and a container's detected memory moves by a few MB between starts
    topology=$(slurmd -C | head -n 1) || die "slurmd -C failed: is slurmd installed? (.ci/slurm.sh install)"
    real=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$topology")
    mem=$((real * 9 / 10))
    topology=$(sed -e "s/RealMemory=[0-9]*/RealMemory=$mem/" -e "s/NodeName=[^ ]*/NodeName=$HOST/" <<<"$topology")
    # two fake GPUs: gres needs a device file per GPU (without File= the node is invalid); jobs asking --gpus get
    # CUDA_VISIBLE_DEVICES set as on a GPU node, and nothing opens the files
    ln -sfn /dev/null "$DIR/gpu/0"
    ln -sfn /dev/null "$DIR/gpu/1"
    cat >"$CONF/slurm.conf" <<EOF
$MARK
# a single-node Slurm for the tests; .ci/slurm.sh stop stops it
ClusterName=mxval
SlurmctldHost=$HOST
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
# no cgroups (a container without systemd has none to delegate): processes tracked by their parent ids, tasks unbound
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
# cores are the consumable resource, memory is not: jobs share the node as long as cores are free
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# start a batch job as soon as it is submitted, not on the scheduler's next tick (3 s)
SchedulerParameters=batch_sched_delay=0
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
# an account or QOS accounting does not hold is refused at submission, as on a cluster
AccountingStorageEnforce=associations,qos
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
GresTypes=gpu
$topology Gres=gpu:2 State=UNKNOWN
# each core taken by up to 4 jobs at once: tests hold jobs running on purpose while two pytest workers share the
# node, and on 2 cores a held job and a queued 2-CPU job would leave every later job waiting behind the backfill
# reservation (its time limit ends after the held job's)
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
    cat >"$CONF/gres.conf" <<EOF
$MARK
NodeName=$HOST Name=gpu File=$DIR/gpu/[0-1]
EOF
    [ -s "$DIR/dbpass" ] || (umask 077 && head -c 18 /dev/urandom | base64 >"$DIR/dbpass")
    pass=$(cat "$DIR/dbpass")
    # slurmdbd refuses a configuration others can read (it holds the database password); 127.0.0.1, not localhost:
    # the MariaDB client takes localhost for its default socket, not this server's port
    (umask 077 && cat >"$CONF/slurmdbd.conf" <<EOF
$MARK
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
LogFile=$LOG/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$pass
StorageLoc=slurm_acct_db
EOF
    )
    chmod 600 "$CONF/slurmdbd.conf"
}

start_munge() {
    # munged on its default socket: slurmdbd's connections ignore a private one. A munged already running (this
    # machine's own) is used as it is, and left running by stop.
    if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
        return
    fi
    [ -s /etc/munge/munge.key ] || die "no /etc/munge/munge.key: reinstall munge (.ci/slurm.sh install)"
    install -d -o munge -g munge -m 0755 /run/munge
    runuser -u munge -- /usr/sbin/munged --force
    wait_for munged /var/log/munge/munged.log sh -c 'munge -n </dev/null | unmunge'
    cp /run/munge/munged.pid "$RUN/munged.pid"
}

sql() { mariadb --no-defaults -S "$RUN/mariadb.sock" -u root "$@"; }

start_mariadb() {
    if ! alive mariadb; then
        if [ ! -d "$DIR/mysql/mysql" ]; then
            mariadb-install-db --no-defaults --datadir="$DIR/mysql" --user=root --auth-root-authentication-method=socket \
                --skip-test-db >"$LOG/mariadb-install.log" 2>&1 ||
                die "mariadb-install-db failed; its log $LOG/mariadb-install.log ends: $(last_line "$LOG/mariadb-install.log")"
        fi
        setsid mariadbd --no-defaults --user=root --datadir="$DIR/mysql" --socket="$RUN/mariadb.sock" \
            --port="$DB_PORT" --bind-address=127.0.0.1 --skip-name-resolve --pid-file="$RUN/mariadb.pid" \
            --log-error="$LOG/mariadb.log" </dev/null >/dev/null 2>&1 &
        wait_for MariaDB "$LOG/mariadb.log" mariadb-admin --no-defaults -S "$RUN/mariadb.sock" -u root ping
    fi
    local pass
    pass=$(cat "$DIR/dbpass")
    sql -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
            ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
            GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" ||
        die "could not create MariaDB's slurm user; its log $LOG/mariadb.log ends: $(last_line "$LOG/mariadb.log")"
}

ready() {  # the node takes jobs, and accounting knows the cluster
    sinfo -h -n "$HOST" -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated|completing)$' &&
        sacctmgr -n -P show cluster format=cluster 2>/dev/null | grep -qx mxval
}

start() {
    [ "$(id -u)" = 0 ] || die "start needs root (the daemons run as root here)"
    for cmd in slurmctld slurmd slurmdbd sinfo sacctmgr munged mariadbd; do
        command -v "$cmd" >/dev/null || die "$cmd is not installed: .ci/slurm.sh install (as root, Debian/Ubuntu)"
    done
    if alive slurmctld && alive slurmd && alive slurmdbd && ready; then
        echo "slurm.sh: already running (partition debug on $HOST)"
        return
    fi
    write_config
    start_munge
    start_mariadb
    alive slurmdbd || slurmdbd
    wait_for slurmdbd "$LOG/slurmdbd.log" sacctmgr -n show cluster
    alive slurmctld || slurmctld
    wait_for slurmctld "$LOG/slurmctld.log" scontrol ping
    alive slurmd || slurmd
    local t0=$SECONDS state
    until ready; do
        state=$(sinfo -h -n "$HOST" -o '%T %E' 2>/dev/null || true)
        case $state in
            drain* | down* | inval* | fail*)
                [ $((SECONDS - t0)) -lt 10 ] || die "node $HOST is $state; slurmd's log $LOG/slurmd.log ends: $(last_line "$LOG/slurmd.log")" ;;
        esac
        [ $((SECONDS - t0)) -lt "$TIMEOUT" ] ||
            die "node $HOST is not idle within $TIMEOUT s (sinfo: ${state:-no answer}); logs in $LOG"
        sleep 0.2
    done
    echo "slurm.sh: running (partition debug on $HOST, 2 fake GPUs; logs in $LOG)"
}

stop_all() {  # stop_all NAME...: TERM the processes in $RUN/NAME.pid together, wait for them, KILL after 20 s
    local pids=() name
    for name in "$@"; do
        alive "$name" && pids+=("$(cat "$RUN/$name.pid")")
        rm -f "$RUN/$name.pid"
    done
    [ ${#pids[@]} -gt 0 ] || return 0
    kill "${pids[@]}" 2>/dev/null || true
    for _ in $(seq 100); do
        local left=()
        for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && left+=("$pid"); done
        [ ${#left[@]} -gt 0 ] || return 0
        pids=("${left[@]}")
        sleep 0.2
    done
    kill -9 "${pids[@]}" 2>/dev/null || true
}

stop() {
    # the Slurm daemons first (slurmdbd writes its last records to MariaDB as it exits), then what they used
    stop_all slurmd slurmctld slurmdbd
    stop_all mariadb munged
    echo "slurm.sh: stopped"
}

status() {
    for d in munged mariadb slurmdbd slurmctld slurmd; do
        if alive "$d"; then echo "$d: running (pid $(cat "$RUN/$d.pid"))"; else echo "$d: not running"; fi
    done
    if ready; then
        sinfo -h -o "partition %P: node %n %T, %c CPUs, %G"
        return 0
    fi
    echo "Slurm takes no jobs here: .ci/slurm.sh start"
    return 3
}

case ${1:-} in
    install) install_packages ;;
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) die "usage: .ci/slurm.sh install|start|stop|status" ;;
esac
