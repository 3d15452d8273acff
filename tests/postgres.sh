#!/usr/bin/env bash
# PostgreSQL 15 end to end on a bucketfs block device, once per backend (tests/lib.sh):
#
#   PostgreSQL -> ext4 -> /dev/loopN -> nbdfuse file -> NBD -> bucketfs -> file:// | s3:// (moto)
#
#   1. Clean restart: initdb, pgbench -i -s 5, pgbench -T 20 -c 4, then stop everything cleanly
#      (bucketfs by SIGTERM) and start it all again: e2fsck -f -n finds the file system clean and
#      the pgbench tables hold exactly what they held before (row counts and balance sums).
#   2. Crash: synchronous_commit = on, pgbench in the background plus a client that records each
#      INSERT only after its COMMIT returned; ~10 s in, SIGKILL bucketfs and nbdfuse. Tear the dead
#      stack down, delete the cache directory (acknowledged commits must be in the bucket), restart
#      bucketfs, let ext4 replay its journal (then e2fsck -f -n must find nothing), start
#      PostgreSQL (crash recovery) and check: every acknowledged insert is present and the table is
#      a prefix of the insert order; the pgbench balances agree across the four tables (every
#      transaction wholly present or absent); pg_amcheck finds no corruption; the database takes
#      writes again.
#
# BUCKETFS_PG_SERVER=nbdkit runs the very same steps against nbdkit's file plugin in place of
# bucketfs: a check of this harness (nbdfuse, loop, ext4, PostgreSQL, teardown) on a server known
# to be correct. The bucketfs cache step is then skipped.
set -euo pipefail
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=tests/blockstack.sh
source "$(dirname "$0")/blockstack.sh"

requires nbdfuse fusermount3 losetup mkfs.ext4 e2fsck fuser pgrep timeout comm
requires "$PG_BIN/postgres" "$PG_BIN/pgbench" "$PG_BIN/pg_amcheck" "$PG_BIN/psql"

SERVER=${BUCKETFS_PG_SERVER:-bucketfs}
EXPORT_NAME=pgvol
VOLUME_SIZE=4G
PGBENCH_SCALE=5
RUN_SECONDS=20
CRASH_AFTER_SECONDS=10
# Bound on any one client step, so that a hung server fails the test instead of blocking CI.
STEP_TIMEOUT_SECONDS=180

# --- the NBD server under test ----------------------------------------------------------------

NBD_URL=
NBDKIT_PID=
NBDKIT_PORT=

server_begin() {
    if [[ $SERVER == nbdkit ]]; then
        requires nbdkit nbdinfo
        truncate -s "$VOLUME_SIZE" "$CASE_DIR/nbdkit-disk.img"
        NBDKIT_PORT=$(pick_unused_port)
        NBD_URL="nbd://127.0.0.1:$NBDKIT_PORT"
        server_start
        return
    fi
    make_config "$CASE_DIR/server" "$BACKEND"
    start_bucketfs "$CONFIG"
    create_export "$EXPORT_NAME" "$VOLUME_SIZE"
    NBD_URL=$(nbd_uri "$EXPORT_NAME")
}

server_start() {
    if [[ $SERVER == nbdkit ]]; then
        nbdkit --foreground -p "$NBDKIT_PORT" -i 127.0.0.1 file "$CASE_DIR/nbdkit-disk.img" \
            >>"$CASE_DIR/nbdkit.log" 2>&1 &
        NBDKIT_PID=$!
        register_pid "$NBDKIT_PID"
        wait_for 10 nbdinfo --size "$NBD_URL" || die "nbdkit did not start"
        return
    fi
    start_bucketfs "$CONFIG"
}

server_stop() { # SIGTERM; must exit 0
    if [[ $SERVER == nbdkit ]]; then
        kill "$NBDKIT_PID"
        wait "$NBDKIT_PID" || return 1
        NBDKIT_PID=
        return
    fi
    stop_bucketfs
}

server_kill9() {
    if [[ $SERVER == nbdkit ]]; then
        kill -9 "$NBDKIT_PID"
        wait "$NBDKIT_PID" 2>/dev/null || true
        NBDKIT_PID=
        return
    fi
    kill9_bucketfs
}

server_log_tail() {
    if [[ $SERVER == nbdkit ]]; then
        tail -n 20 "$CASE_DIR/nbdkit.log" 2>/dev/null || true
    else
        tail -n 40 "$BUCKETFS_LOG" 2>/dev/null || true
    fi
}

# --- assertions: report each, fail the backend at the end ---------------------------------------

FAILED=()
ok() { echo "ok - postgres [$BACKEND] $*"; }
not_ok() {
    echo "not ok - postgres [$BACKEND] $*"
    FAILED+=("$*")
}
check() { # check DESCRIPTION CMD...
    local what=$1
    shift
    if "$@"; then ok "$what"; else not_ok "$what"; fi
}
# A step the rest depends on: on failure, report with the logs and stop this backend.
must() {
    local what=$1
    shift
    "$@" && return 0
    not_ok "$what"
    echo "----- PostgreSQL log tail -----" >&2
    pg_log_tail 30 >&2
    die "$what (failed checks: ${#FAILED[@]})"
}

# --- helpers over the database ----------------------------------------------------------------

pgbench_run() { # pgbench_run LOG ARG...
    local log=$1
    shift
    timeout "$STEP_TIMEOUT_SECONDS" "$PG_BIN/pgbench" -h "$PG_SOCK" -p "$PG_PORT" -U postgres \
        "$@" postgres >"$log" 2>&1 || {
        tail -n 5 "$log" >&2
        return 1
    }
}

sql() { timeout "$STEP_TIMEOUT_SECONDS" "$PG_BIN/psql" -h "$PG_SOCK" -p "$PG_PORT" -U postgres \
    -d postgres -XAtq -v ON_ERROR_STOP=1 -c "$1"; }

# Row counts of the four pgbench tables and the sums of their balances, '|'-separated.
fingerprint() {
    sql "SELECT (SELECT count(*) FROM pgbench_accounts), (SELECT count(*) FROM pgbench_branches),
                (SELECT count(*) FROM pgbench_tellers), (SELECT count(*) FROM pgbench_history),
                (SELECT sum(abalance) FROM pgbench_accounts), (SELECT sum(bbalance) FROM pgbench_branches),
                (SELECT sum(tbalance) FROM pgbench_tellers), (SELECT coalesce(sum(delta), 0) FROM pgbench_history)"
}
FINGERPRINT_FIELDS="accounts|branches|tellers|history|sum(abalance)|sum(bbalance)|sum(tbalance)|sum(delta)"

# Each tpcb-like transaction adds one delta to an account, a teller and a branch and logs it in
# history (pgbench runs with -n so history is never truncated): the four sums agree exactly when
# every transaction is wholly present or wholly absent.
balances_agree() {
    local a b t h
    IFS='|' read -r _ _ _ _ a b t h <<<"$1"
    [[ -n $a && $a == "$b" && $b == "$t" && $t == "$h" ]]
}

fsck_clean() { # e2fsck -f -n on the attached, unmounted device finds nothing to fix
    local out rc=0
    out=$(stack_fsck_check) || rc=$?
    if ((rc == 0)); then
        echo "    e2fsck: $(tail -n 1 <<<"$out")" >&2
    else
        echo "    e2fsck -f -n exited $rc:" >&2
        sed 's/^/    e2fsck: /' <<<"$out" >&2
    fi
    return "$rc"
}

# Insert 1, 2, 3, ... one autocommit statement per psql; append n to ACKED only after psql
# reported success, i.e. after COMMIT returned. Stops at the first failure.
acks_client() {
    local acked=$1 n=0
    trap - ERR
    while :; do
        n=$((n + 1))
        if timeout 30 "$PG_BIN/psql" -h "$PG_SOCK" -p "$PG_PORT" -U postgres -d postgres -XAtq \
            -v ON_ERROR_STOP=1 -c "INSERT INTO acks VALUES ($n)" >/dev/null 2>&1; then
            echo "$n" >>"$acked"
        else
            echo "$n" >"$acked.failed"
            return 0
        fi
    done
}

# --- the case ---------------------------------------------------------------------------------

teardown_case() {
    stack_teardown
    if [[ $SERVER == nbdkit && -n $NBDKIT_PID ]]; then kill "$NBDKIT_PID" 2>/dev/null || true; fi
}

run_case() {
    local started=$SECONDS t0 before after
    trap teardown_case EXIT
    # The postgres user must reach the mount point and the socket directory below these.
    chmod 755 "$TEST_DIR" "$CASE_DIR"

    log "server: $SERVER; export $VOLUME_SIZE; work directory $CASE_DIR"
    server_begin
    must "nbdfuse + losetup on $NBD_URL" stack_attach_nbd "$NBD_URL" "$CASE_DIR"
    must "mkfs.ext4 on the export" stack_mkfs
    must "mount ext4" stack_mount "$CASE_DIR/mnt"

    # --- 1. clean stop and restart -------------------------------------------------------------
    must "initdb" pg_init "$CASE_DIR/mnt/pgdata" "$CASE_DIR/sock" "$(pick_unused_port)" \
        "synchronous_commit = on" "fsync = on" "full_page_writes = on" \
        "restart_after_crash = off" "shared_buffers = 64MB" "max_wal_size = 256MB"
    must "start PostgreSQL" pg_start
    t0=$SECONDS
    must "pgbench -i -s $PGBENCH_SCALE" pgbench_run "$CASE_DIR/pgbench-init.log" -i -q -s "$PGBENCH_SCALE"
    log "pgbench -i -s $PGBENCH_SCALE took $((SECONDS - t0)) s"
    must "pgbench -T $RUN_SECONDS -c 4" \
        pgbench_run "$CASE_DIR/pgbench-run.log" -n -T "$RUN_SECONDS" -c 4 -j 2
    log "pgbench -T $RUN_SECONDS -c 4: $(grep -E '^(number of transactions actually processed|tps)' \
        "$CASE_DIR/pgbench-run.log" | tr '\n' ' ')"
    before=$(fingerprint)
    log "before the stop: $FINGERPRINT_FIELDS = $before"
    check "balances agree before the stop" balances_agree "$before"

    must "stop PostgreSQL cleanly" pg_stop fast
    must "umount ext4" stack_umount
    stack_detach
    server_stop
    ok "$SERVER stopped cleanly (SIGTERM, exit 0) under an idle export"
    server_start
    must "nbdfuse + losetup after the restart" stack_attach_nbd "$NBD_URL" "$CASE_DIR"
    check "e2fsck -f -n finds the file system clean after a clean restart" fsck_clean
    must "mount ext4 after the restart" stack_mount "$CASE_DIR/mnt"
    must "start PostgreSQL after the restart" pg_start
    after=$(fingerprint || true)
    log "after the restart: $after"
    check "pgbench tables identical after a clean restart" test "$before" == "$after"

    # --- 2. crash: SIGKILL the NBD server and nbdfuse under load -------------------------------
    must "create table acks" sql "CREATE TABLE acks (n int PRIMARY KEY)"
    check "synchronous_commit is on" test "$(sql "SHOW synchronous_commit")" == on
    local acked=$CASE_DIR/acked pgbench_pid acks_pid i
    : >"$acked"
    # Expected to fail when the device dies: run outside errexit and the ERR trap.
    (
        trap - ERR
        set +e
        timeout $((CRASH_AFTER_SECONDS + 120)) "$PG_BIN/pgbench" -h "$PG_SOCK" -p "$PG_PORT" \
            -U postgres -n -T 60 -c 4 -j 2 -P 1 postgres >"$CASE_DIR/pgbench-crash.log" 2>&1
    ) &
    pgbench_pid=$!
    acks_client "$acked" &
    acks_pid=$!
    sleep "$CRASH_AFTER_SECONDS"
    server_kill9
    stack_kill9_nbdfuse
    log "SIGKILLed $SERVER and nbdfuse $CRASH_AFTER_SECONDS s into the load"

    # PostgreSQL PANICs on the I/O errors and the clients fail; stop whatever lingers.
    for ((i = 0; i < 300; i++)); do
        pid_alive "$acks_pid" || pid_alive "$pgbench_pid" || break
        sleep 0.1
    done
    kill "$acks_pid" "$pgbench_pid" 2>/dev/null || true
    wait "$acks_pid" 2>/dev/null || true
    wait "$pgbench_pid" 2>/dev/null || true
    local acked_count last_acked history_before
    history_before=$(cut -d'|' -f4 <<<"$after")
    acked_count=$(wc -l <"$acked")
    last_acked=$(tail -n 1 "$acked")
    last_acked=${last_acked:-0}
    log "acknowledged inserts before the kill: $acked_count (last $last_acked); pgbench's last" \
        "progress: $(grep '^progress' "$CASE_DIR/pgbench-crash.log" | tail -n 1 || true)"
    check "the acks client had commits acknowledged before the kill" test "$acked_count" -gt 0

    if ! pg_wait_gone 20; then
        log "PostgreSQL still running 20 s after the kill; pg_ctl stop -m immediate"
        pg_stop immediate || pg_kill9
    fi
    log "PostgreSQL at the crash: $(grep -E 'PANIC|FATAL' "$PG_LOG" | tail -n 2 | tr '\n' ' ' || true)"
    stack_umount
    stack_detach
    check "the dead stack came down (no loop device, no FUSE mount left)" \
        test -z "$(losetup -j "$CASE_DIR/fuse/nbd" 2>/dev/null)$(grep " $CASE_DIR/fuse " /proc/mounts || true)"

    if [[ $SERVER == bucketfs ]]; then
        rm -rf "$CACHE_DIR"
        log "deleted the cache directory $CACHE_DIR: acknowledged data must come from the bucket"
    fi
    server_start
    must "nbdfuse + losetup after the crash" stack_attach_nbd "$NBD_URL" "$CASE_DIR"
    # The kernel replays the ext4 journal at mount; the result must then be consistent.
    must "mount ext4 after the crash (journal replay)" stack_mount "$CASE_DIR/mnt"
    must "umount ext4 after journal replay" stack_umount
    if ! check "e2fsck -f -n finds nothing after the journal replay" fsck_clean; then
        log "e2fsck -f -y:"
        e2fsck -f -y "$STACK_LOOP" 2>&1 | sed 's/^/    /' >&2 || true
    fi
    must "mount ext4 for recovery" stack_mount "$CASE_DIR/mnt"
    rm -f "$PG_DATA/postmaster.pid" # the killed postmaster's; its PID may be in use by now
    t0=$SECONDS
    must "PostgreSQL crash recovery" pg_start
    log "crash recovery took $((SECONDS - t0)) s: $(grep -E 'redo (starts|done)' "$PG_LOG" |
        tail -n 2 | sed 's/.*LOG: *//' | tr '\n' ' ' || true)"

    local missing count_present max_present
    sql "SELECT n FROM acks ORDER BY n" >"$CASE_DIR/acks-present"
    missing=$(comm -23 <(sort "$acked") <(sort "$CASE_DIR/acks-present") | wc -l)
    IFS='|' read -r count_present max_present <<<"$(sql "SELECT count(*), coalesce(max(n), 0) FROM acks")"
    log "acks after recovery: $count_present rows (max $max_present); acknowledged $acked_count; missing $missing"
    check "every acknowledged commit survived the crash ($acked_count acknowledged, $missing missing)" \
        test "$missing" -eq 0
    check "acks is a prefix of the insert order (no holes)" test "$count_present" -eq "$max_present"
    check "at most the one in-flight insert committed past the last acknowledged one" \
        test "$max_present" -le $((last_acked + 1))

    after=$(fingerprint || true)
    log "after crash recovery: $FINGERPRINT_FIELDS = $after"
    # Not asserted: pgbench's own count of what committed before the kill is not exact.
    log "pgbench_history grew by $(($(cut -d'|' -f4 <<<"$after") - history_before)) rows in the" \
        "crash run; pgbench's per-second progress adds up to about $(awk '/^progress/ { n += $4 }
        END { printf "%d", n }' "$CASE_DIR/pgbench-crash.log") transactions"
    check "pgbench balances agree after crash recovery (transactions atomic)" balances_agree "$after"
    local amcheck_out
    if amcheck_out=$(timeout "$STEP_TIMEOUT_SECONDS" "$PG_BIN/pg_amcheck" -h "$PG_SOCK" \
        -p "$PG_PORT" -U postgres --all --install-missing --heapallindexed 2>&1); then
        ok "pg_amcheck --all --heapallindexed finds no corruption"
    else
        not_ok "pg_amcheck --all --heapallindexed finds no corruption"
        head -n 40 <<<"$amcheck_out" >&2
    fi
    check "the recovered database takes writes (pgbench -T 5)" \
        pgbench_run "$CASE_DIR/pgbench-after.log" -n -T 5 -c 2

    must "stop PostgreSQL cleanly after recovery" pg_stop fast
    must "umount ext4 after recovery" stack_umount
    stack_detach
    server_stop
    ok "$SERVER stopped cleanly (SIGTERM, exit 0) after the crash run"
    log "case done in $((SECONDS - started)) s"

    if ((${#FAILED[@]} > 0)); then
        echo "----- $SERVER log tail -----" >&2
        server_log_tail >&2
        die "${#FAILED[@]} check(s) failed: $(printf '%s; ' "${FAILED[@]}")"
    fi
}

for_each_backend run_case
