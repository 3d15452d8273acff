#!/usr/bin/env bash
# Named checkpoints: `bucketfs checkpoint create` under write load keeps the state of that moment
# while writes go on; `bucketfs run --checkpoint` serves it read-only beside the live server
# (nbdcopy reads it back byte for byte); it survives a restart; `bucketfs checkpoint delete`
# lets the collector reclaim the log objects only it kept; bad names and unknown checkpoints
# get clear errors.
set -euo pipefail
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"

requires qemu-io nbdcopy

# engine.log_bytes_stored of the running server.
stored_bytes() {
    status_json | "$BUCKETFS_TEST_PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["engine"]["log_bytes_stored"])'
}

run_case() {
    local out reader_config reader_pid busy_pid before after
    make_config "$CASE_DIR" "$BACKEND"
    start_bucketfs "$CONFIG"
    create_export db 16M
    create_export busy 16M
    head -c 16M /dev/urandom >"$CASE_DIR/a.img"
    head -c 16M /dev/urandom >"$CASE_DIR/b.img"
    nbdcopy "$CASE_DIR/a.img" "$(nbd_uri db)" || die "nbdcopy a.img -> db failed"

    # Load on another export while the checkpoint is taken: writes with a flush after each.
    (
        for i in $(seq 0 200); do
            qio busy "write -P $((i % 250 + 1)) $(((i % 64) * 65536)) 65536" flush >/dev/null 2>&1 || exit 1
        done
    ) &
    busy_pid=$!
    out="$(bfs checkpoint create before-b 2>&1)" || die "checkpoint create failed: $out"
    grep -q "checkpoint before-b created" <<<"$out" || die "unexpected output of checkpoint create: $out"
    wait "$busy_pid" || die "the writes beside the checkpoint failed"

    # Writes go on: the live device changes completely.
    nbdcopy "$CASE_DIR/b.img" "$(nbd_uri db)" || die "nbdcopy b.img -> db failed"
    out="$(bfs checkpoint list)" || die "checkpoint list failed"
    grep -q "^before-b	" <<<"$out" || die "checkpoint list does not show before-b: $out"

    # Errors a user can make.
    if out="$(bfs checkpoint create before-b 2>&1)"; then die "a second checkpoint of the same name was accepted"; fi
    grep -q 'exists already' <<<"$out" || die "unclear error for a duplicate name: $out"
    if out="$(bfs checkpoint create 'a/b' 2>&1)"; then die "a checkpoint name with / was accepted"; fi
    grep -q 'invalid checkpoint name' <<<"$out" || die "unclear error for a bad name: $out"

    # A restart keeps it.
    stop_bucketfs
    start_bucketfs "$CONFIG"
    out="$(bfs checkpoint list)" || die "checkpoint list failed after a restart"
    grep -q "^before-b	" <<<"$out" || die "before-b is gone after a restart: $out"

    # Served read-only beside the writer, on its own ports.
    reader_config="$CASE_DIR/reader.toml"
    local reader_nbd
    config_on_new_ports "$CONFIG" "$reader_config"
    reader_nbd="$READER_NBD_PORT"
    # Its own admin socket: the default one is in the cache directory it shares with the writer.
    config_set "$reader_config" admin socket "\"$CASE_DIR/reader-admin.sock\""
    "$BUCKETFS" run -c "$reader_config" --checkpoint before-b >"$CASE_DIR/reader.log" 2>&1 &
    reader_pid=$!
    register_pid "$reader_pid"
    wait_for 30 "$BUCKETFS" status -c "$reader_config" >/dev/null ||
        die "the checkpoint server did not start: $(cat "$CASE_DIR/reader.log")"
    nbdcopy "nbd://127.0.0.1:$reader_nbd/db" "$CASE_DIR/snap.img" || die "nbdcopy from the checkpoint failed"
    cmp -s "$CASE_DIR/snap.img" "$CASE_DIR/a.img" || die "the checkpoint does not hold the device as it was"
    nbdcopy "$(nbd_uri db)" "$CASE_DIR/live.img" || die "nbdcopy from the live server failed"
    cmp -s "$CASE_DIR/live.img" "$CASE_DIR/b.img" || die "the live device is not what was written last"
    if out="$("$BUCKETFS" checkpoint create other -c "$reader_config" 2>&1)"; then
        die "the checkpoint server accepted checkpoint create"
    fi
    grep -q 'read-only' <<<"$out" || die "unclear refusal on the checkpoint server: $out"
    kill -TERM "$reader_pid"
    wait "$reader_pid" || die "the checkpoint server did not stop cleanly: $(cat "$CASE_DIR/reader.log")"

    # Deleted: the 16 MiB of random data only it kept are reclaimed.
    before="$(stored_bytes)"
    bfs checkpoint delete before-b || die "checkpoint delete failed"
    after="$(stored_bytes)"
    log "log bytes stored: $before before the delete, $after after"
    ((before - after > 12 * 1024 * 1024)) || die "deleting the checkpoint reclaimed only $((before - after)) bytes"
    out="$(bfs checkpoint list)" || die "checkpoint list failed"
    [[ -z "$out" ]] || die "checkpoint list after delete: $out"
    if out="$("$BUCKETFS" run -c "$reader_config" --checkpoint before-b 2>&1)"; then
        die "serving a deleted checkpoint succeeded"
    fi
    grep -q 'no checkpoint named "before-b"' <<<"$out" || die "unclear error for a deleted checkpoint: $out"
    nbdcopy "$(nbd_uri db)" "$CASE_DIR/live.img" || die "nbdcopy from the live server failed"
    cmp -s "$CASE_DIR/live.img" "$CASE_DIR/b.img" || die "the live device changed when the checkpoint was deleted"

    # fsck: clean with a named checkpoint; a damaged metadata run is named (exit 1).
    bfs checkpoint create for-fsck >/dev/null || die "checkpoint create failed"
    stop_bucketfs
    out="$(bfs fsck)" || die "fsck of a healthy bucket with a named checkpoint failed: $out"
    grep -q '^clean: .* 1 named checkpoints' <<<"$out" || die "fsck: $out"
    local run rc=0
    run="$(bucket_tool largest run/)" || die "no run object in the bucket"
    bucket_tool corrupt "$run" >&2
    out="$(bfs fsck 2>&1)" || rc=$?
    log "fsck after damaging $run (exit $rc): $out"
    [[ "$rc" == 1 ]] || die "fsck of a damaged run: exit $rc, expected 1: $out"
    grep -q "^DAMAGED run/${run##*/}" <<<"$out" || die "fsck does not name the damaged run $run: $out"
}

for_each_backend run_case
