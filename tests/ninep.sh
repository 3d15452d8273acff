#!/usr/bin/env bash
# The 9P2000.L server against diod's clients (diodls, diodcat): the filesystem's tree as they
# list it, a block device written over NBD read back over 9P byte for byte, errors for missing
# paths, and the same after a kill -9 and a restart.
set -euo pipefail
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"

requires diodls diodcat nbdcopy

ninep() { echo "127.0.0.1:$NINEP_PORT"; }

run_case() {
    local out want got
    make_config "$CASE_DIR" "$BACKEND"
    start_bucketfs "$CONFIG"
    create_export disk 8M
    head -c 8388608 /dev/urandom >"$CASE_DIR/disk.img"
    timeout 60 nbdcopy --flush "$CASE_DIR/disk.img" "$(nbd_uri disk)" || die "nbdcopy to the export failed"
    want="$(md5sum <"$CASE_DIR/disk.img")"

    out="$(timeout 30 diodls -s "$(ninep)" -a / -l . 2>&1)" || die "diodls / failed: $out"
    grep -qE '^d.* \.nbd$' <<<"$out" || die "diodls / does not list .nbd as a directory: $out"
    out="$(timeout 30 diodls -s "$(ninep)" -a /.nbd -l . 2>&1)" || die "diodls /.nbd failed: $out"
    grep -qE '^-rw-------.* 8388608 .* disk$' <<<"$out" || die "diodls does not show disk as an 8 MiB file: $out"
    got="$(timeout 60 diodcat -s "$(ninep)" -a / .nbd/disk | md5sum)"
    [[ "$got" == "$want" ]] || die "diodcat read back other bytes than nbdcopy wrote"
    if out="$(timeout 30 diodcat -s "$(ninep)" -a / .nbd/missing 2>&1)"; then
        die "diodcat of a missing file succeeded: $out"
    fi
    grep -q "No such file or directory" <<<"$out" || die "unexpected error for a missing file: $out"
    if out="$(timeout 30 diodls -s "$(ninep)" -a /no/such/dir . 2>&1)"; then
        die "attach to a missing aname succeeded: $out"
    fi

    # kill -9: what NBD flushed is still there, and 9P serves it after the restart.
    kill9_bucketfs
    start_bucketfs "$CONFIG"
    got="$(timeout 60 diodcat -s "$(ninep)" -a /.nbd disk | md5sum)"
    [[ "$got" == "$want" ]] || die "after kill -9 and a restart, 9P read other bytes"
    stop_bucketfs
}

for_each_backend run_case
