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
# shellcheck source=tests/pgcheck.sh
source "$(dirname "$0")/pgcheck.sh"

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
    crash_load_start "$CASE_DIR" 60
    sleep "$CRASH_AFTER_SECONDS"
    server_kill9
    stack_kill9_nbdfuse
    log "SIGKILLed $SERVER and nbdfuse $CRASH_AFTER_SECONDS s into the load"
    # PostgreSQL PANICs on the I/O errors and the clients fail.
    crash_load_reap

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

    check_recovered "$after"

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
