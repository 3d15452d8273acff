# shellcheck shell=bash
# tests/blockstack.sh — the block stack under PostgreSQL, for tests and benchmarks.
#
#   NBD export --nbdfuse--> DIR/fuse/nbd --losetup--> /dev/loopN --mkfs.ext4/mount--> DIR/mnt
#   (or, for a local baseline, a plain file --losetup--> /dev/loopN --> ...)
#
# Sourced (after tests/lib.sh where that exists). Safe under set -euo pipefail. Needs bash, root, nbdfuse, losetup, mkfs.ext4,
# e2fsck, fusermount3, fuser and PostgreSQL 15 from Debian. One stack and one PostgreSQL at a time
# per shell: the state lives in the STACK_* and PG_* variables below (stack_save and stack_use
# switch between several).
#
# Block stack
#   stack_attach_nbd URI DIR     nbdfuse DIR/fuse URI (in the background), then losetup the file
#                                DIR/fuse/nbd. Sets STACK_FUSE_DIR, STACK_FUSE_PID, STACK_LOOP.
#   stack_attach_file FILE       losetup a plain file (the local-disk baseline). Sets STACK_LOOP.
#   stack_mkfs                   mkfs.ext4 $STACK_MKFS_OPTS on STACK_LOOP.
#   stack_mount DIR              mount STACK_LOOP on DIR with $STACK_MOUNT_OPTS. Sets STACK_MNT.
#   stack_fsck_check             e2fsck -f -n on the (unmounted) loop device; prints its output,
#                                returns its exit status (0 = clean).
#   stack_umount                 umount STACK_MNT, lazily if a plain umount keeps failing.
#   stack_detach                 losetup -d (with retries), fusermount3 -u (-z if the server is
#                                dead), wait for nbdfuse to exit (SIGTERM/SIGKILL it by PID if not).
#   stack_teardown               stop PostgreSQL (immediate), umount, detach: every step that is
#                                still needed and tolerant of a dead NBD server. Idempotent; call
#                                it from an EXIT trap.
#   stack_kill9_nbdfuse          SIGKILL nbdfuse (the crash test). The FUSE connection aborts, so
#                                I/O on the loop device fails from then on instead of hanging.
#   stack_save NAME, stack_use NAME   keep the STACK_* and PG_* variables under NAME, and make
#                                the stack and cluster kept under NAME the current ones: several
#                                stacks at once in one shell (bench/versus), one current at a time.
#
# PostgreSQL (runs as the postgres user; binaries from PG_BIN)
#   pg_init DATADIR SOCKDIR PORT [CONF_LINE...]  initdb (with data checksums) and append settings
#                                to postgresql.conf. Sets PG_DATA, PG_SOCK, PG_PORT, PG_LOG.
#   pg_use DATADIR SOCKDIR PORT  point the PG_* variables at an existing cluster.
#   pg_start                     pg_ctl start -w; sets PG_POSTMASTER_PID.
#   pg_stop [fast|immediate]     pg_ctl stop -w (fast by default).
#   pg_kill9                     SIGKILL the postmaster and its children by PID, wait for them.
#   pg_wait_gone SECONDS         wait for every process of this cluster to exit; 1 on timeout.
#   pg_psql [PSQL_ARG...]        psql -XAtq -v ON_ERROR_STOP=1 on database postgres (role postgres).
#   pg_sql SQL                   one statement; prints the tuples unaligned, '|'-separated.
#   pg_as CMD [ARG...]           run a command as the postgres user with PG_BIN on PATH.
#   pg_log_tail [N]              the last N lines of the server log (for failure reports).

PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
# Identical for every target so that benchmark figures compare the devices, not the settings.
STACK_MKFS_OPTS=${STACK_MKFS_OPTS:--q -F -E lazy_itable_init=0,lazy_journal_init=0}
STACK_MOUNT_OPTS=${STACK_MOUNT_OPTS:-noatime}
# Direct I/O on the loop device keeps one page cache (ext4's) instead of two, like a real disk.
STACK_LOOP_DIO=${STACK_LOOP_DIO:-on}

STACK_FUSE_DIR=
STACK_FUSE_PID=
STACK_LOOP=
STACK_MNT=
PG_DATA=
PG_SOCK=
PG_PORT=
PG_LOG=
PG_POSTMASTER_PID=

stack_log() { echo "[blockstack] $*" >&2; }

STACK_STATE_VARS=(STACK_FUSE_DIR STACK_FUSE_PID STACK_LOOP STACK_MNT PG_DATA PG_SOCK PG_PORT PG_LOG PG_POSTMASTER_PID)

stack_save() {
    local v
    for v in "${STACK_STATE_VARS[@]}"; do printf -v "STACK_SAVED_${1}_$v" '%s' "${!v}"; done
}

stack_use() {
    local v saved
    for v in "${STACK_STATE_VARS[@]}"; do
        saved=STACK_SAVED_${1}_$v
        printf -v "$v" '%s' "${!saved-}"
    done
}

# When tests/lib.sh is loaded, also hand what we start to its exit trap: a safety net in case a
# script dies before its own teardown ran.
stack_register() { # stack_register pid|mount VALUE
    if declare -F "register_$1" >/dev/null; then "register_$1" "$2"; fi
    return 0
}

# True while PID runs; a zombie (exited, not yet reaped by us) does not count.
stack_pid_alive() {
    local state
    state=$(sed -E 's/^.*\) ([A-Za-z]).*$/\1/' "/proc/$1/stat" 2>/dev/null) || return 1
    [[ -n $state && $state != Z && $state != X ]]
}

# Retry "$@" up to N times, 0.5 s apart; the status of the last try.
stack_retry() {
    local tries=$1 i
    shift
    for ((i = 1; i <= tries; i++)); do
        "$@" 2>/dev/null && return 0
        sleep 0.5
    done
    "$@"
}

stack_losetup() {
    local file=$1 dev
    if ! dev=$(losetup --direct-io="$STACK_LOOP_DIO" -f --show "$file"); then
        stack_log "losetup --direct-io=$STACK_LOOP_DIO failed on $file; retrying with buffered I/O"
        dev=$(losetup -f --show "$file") || return 1
    fi
    # Not registered with lib.sh: its exit trap finds loop devices by backing file, which is
    # safer than by a device name that another process may have been given in the meantime.
    STACK_LOOP=$dev
    stack_log "attached $file as $STACK_LOOP"
}

stack_attach_nbd() {
    local uri=$1 dir=$2 i
    STACK_FUSE_DIR=$dir/fuse
    mkdir -p "$STACK_FUSE_DIR"
    nbdfuse "$STACK_FUSE_DIR" "$uri" >>"$dir/nbdfuse.log" 2>&1 &
    STACK_FUSE_PID=$!
    # Out of the job table: bash still reaps it, but prints no "Killed" line when the crash test
    # SIGKILLs it.
    disown "$STACK_FUSE_PID"
    stack_register pid "$STACK_FUSE_PID"
    stack_register mount "$STACK_FUSE_DIR"
    for ((i = 0; i < 100; i++)); do
        if mountpoint -q "$STACK_FUSE_DIR" && [[ -s $STACK_FUSE_DIR/nbd ]]; then
            stack_losetup "$STACK_FUSE_DIR/nbd"
            return
        fi
        if ! stack_pid_alive "$STACK_FUSE_PID"; then
            stack_log "nbdfuse $uri exited early:"
            cat "$dir/nbdfuse.log" >&2
            STACK_FUSE_PID=
            return 1
        fi
        sleep 0.1
    done
    stack_log "nbdfuse $uri did not expose $STACK_FUSE_DIR/nbd within 10 s"
    return 1
}

stack_attach_file() {
    stack_losetup "$1"
}

stack_mkfs() {
    # shellcheck disable=SC2086 # the options are a word list on purpose
    mkfs.ext4 $STACK_MKFS_OPTS "$STACK_LOOP"
}

stack_mount() {
    STACK_MNT=$1
    mkdir -p "$STACK_MNT"
    mount -o "$STACK_MOUNT_OPTS" "$STACK_LOOP" "$STACK_MNT" || return 1
    stack_register mount "$STACK_MNT"
}

stack_fsck_check() {
    e2fsck -f -n "$STACK_LOOP" 2>&1
}

stack_umount() {
    [[ -n $STACK_MNT ]] || return 0
    if mountpoint -q "$STACK_MNT"; then
        if ! stack_retry 10 umount "$STACK_MNT"; then
            stack_log "umount $STACK_MNT failed; users: $(fuser -m "$STACK_MNT" 2>&1 | tr -s ' ')"
            stack_log "lazy umount of $STACK_MNT"
            umount -l "$STACK_MNT" || true
        fi
    fi
    STACK_MNT=
}

stack_kill9_nbdfuse() {
    if [[ -n $STACK_FUSE_PID ]]; then kill -9 "$STACK_FUSE_PID" 2>/dev/null || true; fi
}

stack_detach() {
    local i
    if [[ -n $STACK_LOOP ]]; then
        # The loop device stays busy while a lazily unmounted ext4 still holds it; its release
        # can take a moment after the last user of the file system is gone.
        if stack_retry 40 losetup -d "$STACK_LOOP"; then
            STACK_LOOP=
        else
            stack_log "could not detach $STACK_LOOP (still busy); it will be released on autoclear"
            losetup -c "$STACK_LOOP" 2>/dev/null || true
        fi
    fi
    if [[ -n $STACK_FUSE_DIR ]]; then
        if mountpoint -q "$STACK_FUSE_DIR" 2>/dev/null ||
            grep -qs " $STACK_FUSE_DIR fuse" /proc/mounts; then
            fusermount3 -u "$STACK_FUSE_DIR" 2>/dev/null || fusermount3 -u -z "$STACK_FUSE_DIR" ||
                umount -l "$STACK_FUSE_DIR" || true
        fi
        STACK_FUSE_DIR=
    fi
    if [[ -n $STACK_FUSE_PID ]]; then
        for ((i = 0; i < 50; i++)); do
            stack_pid_alive "$STACK_FUSE_PID" || break
            sleep 0.1
        done
        if stack_pid_alive "$STACK_FUSE_PID"; then
            stack_log "nbdfuse $STACK_FUSE_PID still running after unmount; SIGTERM"
            kill "$STACK_FUSE_PID" 2>/dev/null || true
            sleep 1
            kill -9 "$STACK_FUSE_PID" 2>/dev/null || true
        fi
        STACK_FUSE_PID=
    fi
    return 0
}

stack_teardown() {
    if [[ -n $PG_POSTMASTER_PID ]]; then
        if ! pg_stop immediate >/dev/null 2>&1 || ! pg_wait_gone 10; then
            # A server stuck in I/O on a hung NBD export: abort the FUSE connection so that
            # its I/O fails, then kill what is left.
            stack_kill9_nbdfuse
            pg_kill9
        fi
    fi
    stack_umount
    stack_detach
}

# --- PostgreSQL -------------------------------------------------------------------------------

pg_as() {
    runuser -u postgres -- env PATH="$PG_BIN:$PATH" "$@"
}

pg_use() {
    PG_DATA=$1 PG_SOCK=$2 PG_PORT=$3
    # The log lives beside the socket directory, off the device under test, so that it can be
    # read after that device died.
    PG_LOG=$(dirname "$PG_SOCK")/postgres.log
    mkdir -p "$PG_SOCK"
    chown postgres: "$PG_SOCK"
    touch "$PG_LOG"
    chown postgres: "$PG_LOG"
}

pg_init() {
    local line
    pg_use "$1" "$2" "$3"
    shift 3
    mkdir -p "$PG_DATA"
    chown postgres: "$PG_DATA"
    chmod 700 "$PG_DATA"
    pg_as initdb -D "$PG_DATA" --data-checksums --auth=trust -U postgres >/dev/null
    {
        echo "# written by tests/blockstack.sh"
        echo "listen_addresses = ''"
        echo "unix_socket_directories = '$PG_SOCK'"
        echo "port = $PG_PORT"
        for line in "$@"; do echo "$line"; done
    } >>"$PG_DATA/postgresql.conf"
}

pg_start() {
    if ! pg_as pg_ctl -D "$PG_DATA" -l "$PG_LOG" -w -t 300 start >/dev/null; then
        stack_log "PostgreSQL did not start; log tail:"
        pg_log_tail 30 >&2
        return 1
    fi
    PG_POSTMASTER_PID=$(head -1 "$PG_DATA/postmaster.pid")
    stack_register pid "$PG_POSTMASTER_PID"
}

pg_stop() {
    local mode=${1:-fast}
    [[ -n $PG_POSTMASTER_PID ]] || return 0
    # A fast stop writes a shutdown checkpoint, which may take a while on a slow device; an
    # immediate one that does not finish soon is stuck in I/O and needs pg_kill9 instead.
    local timeout_s=120
    [[ $mode == immediate ]] && timeout_s=20
    if pg_as pg_ctl -D "$PG_DATA" -m "$mode" -w -t "$timeout_s" stop >/dev/null && pg_wait_gone 10; then
        PG_POSTMASTER_PID=
        return 0
    fi
    return 1
}

# Children of the postmaster, by parent PID (never by name: other clusters may run here).
pg_children() {
    if [[ -n $PG_POSTMASTER_PID ]]; then pgrep -P "$PG_POSTMASTER_PID" || true; fi
}

pg_wait_gone() {
    local seconds=$1 i pid
    [[ -n $PG_POSTMASTER_PID ]] || return 0
    local pids
    pids="$PG_POSTMASTER_PID $(pg_children)"
    for ((i = 0; i < seconds * 10; i++)); do
        local alive=
        for pid in $pids; do stack_pid_alive "$pid" && alive=1; done
        if [[ -z $alive ]]; then
            PG_POSTMASTER_PID=
            return 0
        fi
        sleep 0.1
    done
    return 1
}

pg_kill9() {
    local pid pids
    [[ -n $PG_POSTMASTER_PID ]] || return 0
    pids="$PG_POSTMASTER_PID $(pg_children)"
    for pid in $pids; do kill -9 "$pid" 2>/dev/null || true; done
    pg_wait_gone 20 || stack_log "PostgreSQL processes survived SIGKILL: $pids"
    PG_POSTMASTER_PID=
}

# Clients run as root and connect as the postgres role (trust over the socket): no runuser per
# call, which keeps a loop of one-statement psql calls fast.
pg_psql() {
    "$PG_BIN/psql" -h "$PG_SOCK" -p "$PG_PORT" -U postgres -d postgres -XAtq -v ON_ERROR_STOP=1 "$@"
}

pg_sql() {
    pg_psql -c "$1"
}

pg_log_tail() {
    tail -n "${1:-20}" "$PG_LOG" 2>/dev/null
}
