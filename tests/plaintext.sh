#!/usr/bin/env bash
# Nothing written through NBD appears in the bucket as plaintext: every object is sealed.
# A known ASCII canary fills 8 MiB of an export; afterwards no object of the bucket contains
# the canary, nor its first 16 bytes. Checked with compression off (the canary would otherwise
# be stored only as a few compressed bytes) and with zstd.
set -euo pipefail
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"

requires nbdcopy qemu-io grep

CANARY="BUCKETFS-PLAINTEXT-CANARY-"

make_canary_file() {
    local file="$1" mib="$2"
    "$BUCKETFS_TEST_PYTHON" -c '
import sys
canary, path, size = sys.argv[1].encode(), sys.argv[2], int(sys.argv[3]) << 20
data = (canary * (size // len(canary) + 1))[:size]
open(path, "wb").write(data)' "$CANARY" "$file" "$mib"
}

check_no_plaintext() {
    local what="$1" dir="$2" needle hits
    for needle in "$CANARY" "${CANARY:0:16}"; do
        hits="$(grep -r -a -c -F -- "$needle" "$dir" | awk -F: '$NF > 0' || true)"
        if [[ -n "$hits" ]]; then
            die "$what: plaintext '$needle' found in the bucket:"$'\n'"$hits"
        fi
    done
}

one_round() {
    local compression="$1" name="canary-$1" stored="$CASE_DIR/stored-$1" objects
    log "compression=$compression"
    create_export "$name" 64M
    make_canary_file "$CASE_DIR/canary.img" 8
    timeout "$BUCKETFS_CLIENT_TIMEOUT" nbdcopy --flush "$CASE_DIR/canary.img" "$(nbd_uri "$name")" ||
        die "nbdcopy canary -> $name failed"
    # Also through qemu-io: one unaligned write holding the canary (written as a pattern file).
    qio "$name" "write -s $CASE_DIR/canary.img 12345678 65537" 'flush' ||
        die "qemu-io write -s of the canary failed"
    qio "$name" "read -P 0 9000000 4096" || die "export $name has data where none was written"
    stop_bucketfs
    # Sanity: the canary really went in (read back after restart).
    start_bucketfs "$CONFIG"
    timeout 120 nbdcopy "$(nbd_uri "$name")" "$CASE_DIR/readback.img" || die "read-back failed"
    cmp -s -n 8388608 "$CASE_DIR/canary.img" "$CASE_DIR/readback.img" ||
        die "export $name does not hold the canary written into it"
    stop_bucketfs

    rm -rf "$stored"
    mkdir -p "$stored"
    bucket_tool fetch "$stored"
    objects="$(find "$stored" -type f | wc -l)"
    ((objects > 0)) || die "the bucket is empty after writing 8 MiB and stopping"
    log "scanning $objects objects ($(du -sh "$stored" | cut -f1))"
    check_no_plaintext "compression=$compression" "$stored"
    # The cache holds objects as fetched (still sealed): it must not hold plaintext either.
    if [[ -d "$CACHE_DIR" ]]; then
        check_no_plaintext "compression=$compression, cache dir" "$CACHE_DIR"
    fi
    rm -rf "$stored" "$CASE_DIR/canary.img" "$CASE_DIR/readback.img"
}

run_case() {
    COMPRESSION=none make_config "$CASE_DIR" "$BACKEND"
    start_bucketfs "$CONFIG"
    one_round none
    config_set "$CONFIG" storage compression '"zstd"'
    start_bucketfs "$CONFIG"
    one_round zstd
}

for_each_backend run_case
