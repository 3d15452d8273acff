#!/usr/bin/env bash
# PostgreSQL 15 with its data directory on a `bucketfs mount` (FUSE -> 9P2000.L -> bucketfs's
# filesystem), no block device in between:
#
#   1. initdb, pgbench -i, pgbench -c 4 with synchronous_commit = on; stop PostgreSQL, restart
#      bucketfs (SIGTERM) and the mount: the tables hold what they held.
#   2. Crash: pgbench plus a client that records each INSERT only after its COMMIT returned;
#      mid-run, kill -9 the bucketfs server. PostgreSQL's next write or fsync fails (the mount
#      reports writes the server may have lost as EIO at fsync) and it panics; whatever of it
#      still runs is killed too, as a host crash would. The cache directory is deleted
#      (acknowledged commits must come from the bucket), bucketfs restarts, the mount
#      reconnects, PostgreSQL recovers: every acknowledged insert is there, acks is a prefix of
#      the insert order, the pgbench balances agree, pg_amcheck is clean, the database writes.
#
# The case runs over the file backend only: the filesystem, the 9P server and the mount are the
# same over every backend, and PostgreSQL crashed over S3 (moto) is postgres.sh's and
# pg_ledger.sh's; over moto this case alone takes three minutes of CI.
set -euo pipefail
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=tests/blockstack.sh
source "$(dirname "$0")/blockstack.sh"
# shellcheck source=tests/pgcheck.sh
source "$(dirname "$0")/pgcheck.sh"
# shellcheck source=tests/fusemount.sh
source "$(dirname "$0")/fusemount.sh"

requires mountpoint pgrep timeout comm runuser
requires "$PG_BIN/postgres" "$PG_BIN/pgbench" "$PG_BIN/pg_amcheck" "$PG_BIN/psql"
[[ -c /dev/fuse ]] || skip "no /dev/fuse"

PGBENCH_SCALE=5
RUN_SECONDS=15
CRASH_AFTER_SECONDS=10
STEP_TIMEOUT_SECONDS=300

run_case() {
    local started=$SECONDS t0 before after m="$CASE_DIR/mnt"
    if [[ $BACKEND != file ]]; then
        log "runs over the file backend only (see the head of this file)"
        return 0
    fi
    trap 'pg_stop immediate || pg_kill9' EXIT
    # The postgres user must reach the mount and the socket directory below these.
    chmod 755 "$TEST_DIR" "$CASE_DIR"
    make_config "$CASE_DIR" "$BACKEND"
    start_bucketfs "$CONFIG"
    start_mount "127.0.0.1:$NINEP_PORT" "$m"

    # --- 1. a clean stop and restart of everything -----------------------------------------
    t0=$SECONDS
    must "initdb on the mount" pg_init "$m/pgdata" "$CASE_DIR/sock" "$(pick_unused_port)" \
        "synchronous_commit = on" "fsync = on" "full_page_writes = on" \
        "restart_after_crash = off" "shared_buffers = 64MB" "max_wal_size = 256MB"
    log "initdb took $((SECONDS - t0)) s"
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
    stop_mount "$m"
    stop_bucketfs
    start_bucketfs "$CONFIG"
    start_mount "127.0.0.1:$NINEP_PORT" "$m"
    must "start PostgreSQL after the restart" pg_start
    after=$(fingerprint || true)
    check "pgbench tables identical after a clean restart" test "$before" == "$after"

    # --- 2. kill -9 of the server under load -----------------------------------------------
    must "create table acks" sql "CREATE TABLE acks (n int PRIMARY KEY)"
    check "synchronous_commit is on" test "$(sql "SHOW synchronous_commit")" == on
    crash_load_start "$CASE_DIR" 60
    sleep "$CRASH_AFTER_SECONDS"
    kill9_bucketfs
    crash_load_reap
    if pg_wait_gone 20; then
        log "PostgreSQL stopped by itself: $(grep -E 'PANIC' "$PG_LOG" | tail -n 1 || true)"
    else
        log "PostgreSQL still running 20 s after the server's kill; killing it as a host crash would"
        pg_kill9
    fi
    rm -rf "$CACHE_DIR"
    log "deleted the cache directory $CACHE_DIR: acknowledged data must come from the bucket"
    start_bucketfs "$CONFIG"
    mountpoint -q "$m" || die "the mount did not survive the server's crash"
    rm -f "$PG_DATA/postmaster.pid" # the killed postmaster's; its PID may be in use by now
    t0=$SECONDS
    must "PostgreSQL crash recovery through the reconnected mount" pg_start
    log "crash recovery took $((SECONDS - t0)) s: $(grep -E 'redo (starts|done)' "$PG_LOG" |
        tail -n 2 | sed 's/.*LOG: *//' | tr '\n' ' ' || true)"
    check_recovered "$after"

    must "stop PostgreSQL cleanly after recovery" pg_stop fast
    stop_mount "$m"
    stop_bucketfs
    log "case done in $((SECONDS - started)) s"
    report_failures
}

for_each_backend run_case
