#!/usr/bin/env bash
# A named checkpoint of a PostgreSQL 15 volume under load, once per backend (tests/lib.sh), on
# the block stack of tests/blockstack.sh:
#
#   1. initdb on ext4 on a bucketfs export (synchronous_commit = on), pgbench -i -s 5, and a
#      16 MiB file of random data beside the cluster (the ballast).
#   2. pgbench -T 20 -c 4; a few seconds in, `bucketfs checkpoint create pgsnap`, then the ballast
#      is overwritten in place. pgbench goes on and finishes without error.
#   3. With the live stack still up, `bucketfs run --checkpoint pgsnap` on other ports serves the
#      export read-only; nbdcopy copies it to a local image; the checkpoint server stops cleanly.
#   4. The image is crash consistent: ext4 replays its journal at mount, e2fsck -f -n then finds
#      it clean, a second PostgreSQL recovers on it, pg_amcheck --heapallindexed finds no
#      corruption, the pgbench balances agree (every transaction wholly in or out),
#      pgbench_history holds fewer rows than the live one (the image is of the moment before)
#      and the ballast is the one written before the checkpoint.
#   5. After the live PostgreSQL stopped, `bucketfs checkpoint delete pgsnap` reclaims the log
#      objects only the checkpoint kept (the old ballast at least): log_bytes_stored drops by
#      most of 16 MiB, the list is empty and the checkpoint can no longer be served.
set -euo pipefail
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=tests/blockstack.sh
source "$(dirname "$0")/blockstack.sh"

requires nbdfuse fusermount3 losetup mkfs.ext4 e2fsck fuser pgrep timeout nbdcopy nbdinfo
requires "$PG_BIN/postgres" "$PG_BIN/pgbench" "$PG_BIN/pg_amcheck" "$PG_BIN/psql"

EXPORT_NAME=pgvol
VOLUME_SIZE=2G
PGBENCH_SCALE=5
RUN_SECONDS=20
CHECKPOINT_AFTER_SECONDS=5
CHECKPOINT_NAME=pgsnap
# Incompressible data written before the checkpoint and overwritten in place after it: what only
# the checkpoint holds, whatever PostgreSQL happened to rewrite.
BALLAST_MIB=16
# Bound on any one client step, so that a hung server fails the test instead of blocking CI.
STEP_TIMEOUT_SECONDS=180

# Two stacks in one shell: the live one on bucketfs and the local image of the checkpoint.
CURRENT_STACK=live
switch_stack() {
    stack_save "$CURRENT_STACK"
    stack_use "$1"
    CURRENT_STACK=$1
}

teardown_case() {
    switch_stack image
    stack_teardown
    switch_stack live
    stack_teardown
}

pgbench_on() { # pgbench_on LOG ARG...: on the current cluster, output to LOG
    local log=$1
    shift
    timeout "$STEP_TIMEOUT_SECONDS" "$PG_BIN/pgbench" -h "$PG_SOCK" -p "$PG_PORT" -U postgres \
        "$@" postgres >"$log" 2>&1 || {
        tail -n 5 "$log" >&2
        return 1
    }
}

# sum(abalance), sum(bbalance), sum(tbalance), sum(delta) and the rows of pgbench_history,
# '|'-separated. Each tpcb-like transaction adds one delta to all four sums (pgbench runs with
# -n, so history is never truncated): they agree exactly when every transaction is wholly
# present or wholly absent.
pgbench_sums() {
    pg_sql "SELECT (SELECT sum(abalance) FROM pgbench_accounts), (SELECT sum(bbalance) FROM pgbench_branches),
                   (SELECT sum(tbalance) FROM pgbench_tellers), (SELECT sum(delta) FROM pgbench_history),
                   (SELECT count(*) FROM pgbench_history)"
}

log_bytes_stored() {
    status_json | "$BUCKETFS_TEST_PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["engine"]["log_bytes_stored"])'
}

run_case() {
    local started=$SECONDS t0 out pgbench_pid reader_config reader_nbd reader_pid image sums
    local a b t d history_image history_live before after
    trap teardown_case EXIT
    # The postgres user must reach the mount points and the socket directories below these.
    chmod 755 "$TEST_DIR" "$CASE_DIR"

    # --- 1. PostgreSQL on the export --------------------------------------------------------
    make_config "$CASE_DIR/server" "$BACKEND"
    start_bucketfs "$CONFIG"
    create_export "$EXPORT_NAME" "$VOLUME_SIZE"
    stack_attach_nbd "$(nbd_uri "$EXPORT_NAME")" "$CASE_DIR/live" || die "nbdfuse + losetup failed"
    stack_mkfs || die "mkfs.ext4 on the export failed"
    stack_mount "$CASE_DIR/live/mnt" || die "mount of the export failed"
    pg_init "$CASE_DIR/live/mnt/pgdata" "$CASE_DIR/live/sock" "$(pick_unused_port)" \
        "synchronous_commit = on" "fsync = on" "full_page_writes = on" \
        "restart_after_crash = off" "shared_buffers = 64MB" "max_wal_size = 256MB"
    # pg_init appends those settings after initdb synced the cluster, and nothing syncs them
    # since: a crash-consistent image of the next 30 s (the kernel's writeback delay) would hold
    # zeros where they belong, and PostgreSQL would refuse its configuration file.
    sync "$PG_DATA/postgresql.conf"
    pg_start || die "PostgreSQL did not start on the export"
    t0=$SECONDS
    pgbench_on "$CASE_DIR/pgbench-init.log" -i -q -s "$PGBENCH_SCALE" || die "pgbench -i failed"
    log "pgbench -i -s $PGBENCH_SCALE took $((SECONDS - t0)) s"
    head -c "${BALLAST_MIB}M" /dev/urandom >"$CASE_DIR/ballast"
    # A log object is reclaimed only when nothing in it is live any more. Written once to
    # allocate it, then again in place with a flush after each MiB, the ballast sits in objects
    # of its own, apart from the ext4 journal and PostgreSQL's writes, which stay live.
    dd if="$CASE_DIR/ballast" of="$STACK_MNT/ballast" bs=1M oflag=direct conv=fsync status=none
    dd if="$CASE_DIR/ballast" of="$STACK_MNT/ballast" bs=1M oflag=direct,dsync conv=notrunc status=none

    # --- 2. the checkpoint under load -------------------------------------------------------
    pgbench_on "$CASE_DIR/pgbench-run.log" -n -T "$RUN_SECONDS" -c 4 -j 2 -P 5 &
    pgbench_pid=$!
    sleep "$CHECKPOINT_AFTER_SECONDS"
    t0=$SECONDS
    out=$(bfs checkpoint create "$CHECKPOINT_NAME" 2>&1) || die "checkpoint create failed: $out"
    log "$out ($((SECONDS - t0)) s, ${CHECKPOINT_AFTER_SECONDS} s into pgbench)"
    grep -q "^checkpoint $CHECKPOINT_NAME created as of log object [0-9]" <<<"$out" ||
        die "unexpected output of checkpoint create: $out"
    pid_alive "$pgbench_pid" || die "pgbench was not running any more after the checkpoint"
    head -c "${BALLAST_MIB}M" /dev/urandom |
        dd of="$STACK_MNT/ballast" bs=1M iflag=fullblock oflag=direct conv=notrunc,fsync status=none
    wait "$pgbench_pid" || die "pgbench failed beside the checkpoint"
    log "pgbench -T $RUN_SECONDS -c 4: $(grep -E '^(number of (transactions actually processed|failed transactions)|tps)' \
        "$CASE_DIR/pgbench-run.log" | tr '\n' ' ')"
    out=$(bfs checkpoint list) || die "checkpoint list failed"
    log "checkpoint list: $out"
    grep -q "^$CHECKPOINT_NAME	" <<<"$out" || die "checkpoint list does not show $CHECKPOINT_NAME: $out"

    # --- 3. serve the checkpoint beside the live server and copy it -------------------------
    reader_config="$CASE_DIR/reader/bucketfs.toml"
    mkdir -p "$CASE_DIR/reader"
    config_on_new_ports "$CONFIG" "$reader_config"
    reader_nbd=$READER_NBD_PORT
    # Its own cache directory: a server empties its cache directory when it starts (and keeps
    # its admin socket there).
    config_set "$reader_config" cache dir "\"$CASE_DIR/reader/cache\""
    "$BUCKETFS" run -c "$reader_config" --checkpoint "$CHECKPOINT_NAME" >"$CASE_DIR/reader/bucketfs.log" 2>&1 &
    reader_pid=$!
    register_pid "$reader_pid"
    wait_for 60 "$BUCKETFS" status -c "$reader_config" ||
        die "the checkpoint server did not start: $(cat "$CASE_DIR/reader/bucketfs.log")"
    out=$(timeout 60 nbdinfo "nbd://127.0.0.1:$reader_nbd/$EXPORT_NAME") || die "nbdinfo on the checkpoint server failed"
    grep -qE '^[[:space:]]*is_read_only: true' <<<"$out" || die "the checkpoint's export is not advertised read-only: $out"
    image="$CASE_DIR/image/disk.img"
    mkdir -p "$CASE_DIR/image"
    t0=$SECONDS
    timeout "$STEP_TIMEOUT_SECONDS" nbdcopy "nbd://127.0.0.1:$reader_nbd/$EXPORT_NAME" "$image" ||
        die "nbdcopy from the checkpoint server failed"
    log "nbdcopy of the checkpoint: $VOLUME_SIZE in $((SECONDS - t0)) s, $(du -h "$image" | cut -f1) allocated"
    kill -TERM "$reader_pid"
    wait "$reader_pid" || die "the checkpoint server did not stop cleanly: $(tail -n 20 "$CASE_DIR/reader/bucketfs.log")"
    log "the checkpoint server stopped cleanly (SIGTERM, exit 0)"

    # --- 4. PostgreSQL recovers on the image ------------------------------------------------
    switch_stack image
    stack_attach_file "$image" || die "losetup of the image failed"
    # The kernel replays the ext4 journal at mount; the result must then be consistent.
    stack_mount "$CASE_DIR/image/mnt" || die "mount of the image (journal replay) failed"
    stack_umount
    out=$(stack_fsck_check) || die "e2fsck -f -n on the image after the journal replay: $out"
    log "e2fsck -f -n after the journal replay: $(tail -n 1 <<<"$out")"
    stack_mount "$CASE_DIR/image/mnt" || die "mount of the image failed"
    pg_use "$CASE_DIR/image/mnt/pgdata" "$CASE_DIR/image/sock" "$(pick_unused_port)"
    # Later lines win: the live cluster's port and socket directory are taken.
    printf '%s\n' "port = $PG_PORT" "unix_socket_directories = '$PG_SOCK'" >>"$PG_DATA/postgresql.conf"
    rm -f "$PG_DATA/postmaster.pid" # the live postmaster's
    t0=$SECONDS
    pg_start || die "PostgreSQL did not recover on the image"
    log "crash recovery on the image took $((SECONDS - t0)) s: $(grep -E 'redo (starts|done)' "$PG_LOG" |
        sed 's/.*LOG: *//' | tr '\n' ' ' || true)"
    out=$(timeout "$STEP_TIMEOUT_SECONDS" "$PG_BIN/pg_amcheck" -h "$PG_SOCK" -p "$PG_PORT" -U postgres \
        --all --install-missing --heapallindexed 2>&1) || die "pg_amcheck found corruption on the image: $(head -n 40 <<<"$out")"
    log "pg_amcheck --all --heapallindexed on the image: no corruption"
    sums=$(pgbench_sums) || die "the pgbench tables of the image cannot be read"
    IFS='|' read -r a b t d history_image <<<"$sums"
    log "image: sum(abalance)|sum(bbalance)|sum(tbalance)|sum(delta)|history rows = $sums"
    [[ -n $a && $a == "$b" && $b == "$t" && $t == "$d" ]] || die "the pgbench balances of the image disagree: $sums"
    ((history_image > 0)) || die "pgbench_history of the image is empty"
    cmp -s "$STACK_MNT/ballast" "$CASE_DIR/ballast" || die "the ballast file of the image differs from what was written"
    log "the ballast on the image is the one overwritten after the checkpoint"
    pg_stop fast || die "PostgreSQL on the image did not stop"
    stack_umount
    stack_detach

    # --- 5. delete the checkpoint -----------------------------------------------------------
    switch_stack live
    sums=$(pgbench_sums) || die "the live pgbench tables cannot be read"
    history_live=${sums##*|}
    log "live: sum(abalance)|sum(bbalance)|sum(tbalance)|sum(delta)|history rows = $sums"
    ((history_image < history_live)) ||
        die "the image holds $history_image history rows, the live database $history_live: not an earlier state"
    pg_stop fast || die "the live PostgreSQL did not stop"
    stack_umount
    stack_detach
    before=$(log_bytes_stored)
    bfs checkpoint delete "$CHECKPOINT_NAME" || die "checkpoint delete failed"
    after=$(log_bytes_stored)
    log "log bytes stored: $before before the delete, $after after ($((before - after)) reclaimed)"
    ((before - after > BALLAST_MIB * 1024 * 1024 * 3 / 4)) ||
        die "deleting the checkpoint reclaimed only $((before - after)) bytes (the ballast alone is $BALLAST_MIB MiB)"
    out=$(bfs checkpoint list) || die "checkpoint list failed"
    [[ -z $out ]] || die "checkpoint list after the delete: $out"
    if out=$(timeout 60 "$BUCKETFS" run -c "$reader_config" --checkpoint "$CHECKPOINT_NAME" 2>&1); then
        die "serving a deleted checkpoint succeeded"
    fi
    grep -q "no checkpoint named \"$CHECKPOINT_NAME\"" <<<"$out" || die "unclear error for a deleted checkpoint: $out"
    log "serving the deleted checkpoint fails: $(grep -o "no checkpoint named.*" <<<"$out" | head -n 1)"
    stop_bucketfs
    log "case done in $((SECONDS - started)) s"
}

for_each_backend run_case
