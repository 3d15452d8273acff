#!/usr/bin/env bash
# An idle server does not talk to the object store: after a write and a flush have settled,
# the object_store counters of `bucketfs status` stay the same for a minute (requests cost
# money on S3; an idle volume must cost nothing).
set -euo pipefail
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"

requires qemu-io

IDLE_SECONDS="${BUCKETFS_IDLE_SECONDS:-60}"

run_case() {
    local c0 c1 c2
    make_config "$CASE_DIR" "$BACKEND"
    start_bucketfs "$CONFIG"
    create_export idle 256M
    qio idle 'write -P 0x17 0 1M' 'write -P 0x18 5M 300k' 'flush' || die "write + flush failed"
    # Let the periodic flush (flush_interval_ms = ${FLUSH_INTERVAL_MS:-2000}) and any follow-up
    # work settle: the counters still for 5 s. tests/run runs this test beside others, so the
    # machine may be busy and settling slow; a minute is far more than it needs.
    c0="$(object_store_counters)" || die "bucketfs status failed or has no object_store counters"
    local settled=0 tries=0
    while ((settled < 5)); do
        ((tries++ < 60)) || die "the object_store counters did not settle within a minute after a write + flush (or 'bucketfs status' itself touches the store): $c0"
        sleep 1
        c1="$(object_store_counters)"
        if [[ "$c1" == "$c0" ]]; then settled=$((settled + 1)); else settled=0 c0="$c1"; fi
    done
    c1="$(object_store_counters)"
    [[ "$c0" == "$c1" ]] ||
        die "two back-to-back 'bucketfs status' calls see different counters (status itself touches the store?): $c0 -> $c1"
    log "counters: $c1; idling ${IDLE_SECONDS} s"
    sleep "$IDLE_SECONDS"
    c2="$(object_store_counters)"
    [[ "$c1" == "$c2" ]] ||
        die "idle server used the object store within ${IDLE_SECONDS} s: before: $c1 / after: $c2"
    # The counters do move when there is work (so the comparison above means something).
    qio idle 'write -P 0x19 9M 64k' 'flush' || die "write + flush failed"
    c2="$(object_store_counters)"
    [[ "$c1" != "$c2" ]] || die "object_store counters did not change after a write + flush: $c2"
    stop_bucketfs
}

for_each_backend run_case
