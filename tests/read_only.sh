#!/usr/bin/env bash
# `bucketfs run --read-only` serves what the bucket holds without writing to it: exports are
# advertised read-only, reads return the data a writer flushed, writes are refused with EPERM,
# the bucket is byte-for-byte unchanged afterwards, and a writer may run at the same time.
set -euo pipefail
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"

requires qemu-io nbdinfo

run_case() {
    local before after out reader_config
    make_config "$CASE_DIR" "$BACKEND"
    start_bucketfs "$CONFIG"
    create_export ro 64M
    qio ro 'write -P 0x3c 12345 100000' 'flush' || die "write + flush failed"
    stop_bucketfs
    before="$(bucket_tool fingerprint)"

    start_bucketfs "$CONFIG" --read-only
    out="$(nbdinfo "$(nbd_uri ro)")" || die "nbdinfo on the read-only server failed"
    grep -qE '^[[:space:]]*is_read_only: true' <<<"$out" || die "export not advertised read-only: $out"
    QIO_OPTS="-r" qio ro 'read -P 0x3c 12345 100000' 'read -P 0 0 12345' || die "read-only server returned wrong data"
    # qemu-io refuses to open a read-only export for writing (NBD_FLAG_READ_ONLY -> EPERM).
    out="$(qio_output ro 'write -P 0x11 0 4096')"
    grep -q "qemu-io-exit=0" <<<"$out" && die "a write to the read-only server did not fail: $out"
    grep -q "Permission denied\|Operation not permitted" <<<"$out" || die "unexpected refusal of a write: $out"
    if bfs nbd create other --size 1M 2>/dev/null; then die "nbd create succeeded on a read-only server"; fi
    stop_bucketfs
    after="$(bucket_tool fingerprint)"
    [[ "$before" == "$after" ]] || die "the read-only server changed the bucket"

    # A writer and a read-only server on the same bucket at once (a replica of the state at its
    # start): the writer is not refused, since read-only opens take no writer lock.
    start_bucketfs "$CONFIG"
    reader_config="$CASE_DIR/reader.toml"
    config_on_new_ports "$CONFIG" "$reader_config"
    # Its own admin socket: the default one is in the cache directory it shares with the writer.
    config_set "$reader_config" admin socket "\"$CASE_DIR/reader-admin.sock\""
    "$BUCKETFS" run -c "$reader_config" --read-only >"$CASE_DIR/reader.log" 2>&1 &
    local reader_pid=$!
    register_pid "$reader_pid"
    wait_for 30 "$BUCKETFS" status -c "$reader_config" >/dev/null || die "read-only server beside a writer did not start: $(cat "$CASE_DIR/reader.log")"
    kill -TERM "$reader_pid"
    wait "$reader_pid" || die "read-only server did not stop cleanly: $(cat "$CASE_DIR/reader.log")"
    stop_bucketfs
}

for_each_backend run_case
