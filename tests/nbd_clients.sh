#!/usr/bin/env bash
# Real NBD clients against bucketfs: nbdinfo, qemu-io, nbdcopy, fio's nbd engine, many
# connections at once. Every byte written is read back and compared.
set -euo pipefail
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"

requires nbdinfo nbdcopy qemu-io fio sha256sum

COPY_MIB="${BUCKETFS_COPY_MIB:-300}"

check_nbdinfo() {
    local out line
    out="$(timeout 60 nbdinfo --list "nbd://127.0.0.1:$NBD_PORT")" || die "nbdinfo --list failed"
    grep -q 'export="disk"' <<<"$out" || die "nbdinfo --list does not show export 'disk': $out"

    out="$(timeout 60 nbdinfo "$(nbd_uri disk)")" || die "nbdinfo $(nbd_uri disk) failed"
    for line in can_flush can_fua can_trim can_zero can_cache can_multi_conn; do
        grep -qE "^[[:space:]]*$line: true" <<<"$out" ||
            die "nbdinfo does not report '$line: true' for the export:"$'\n'"$out"
    done
    grep -qE '^[[:space:]]*is_read_only: false' <<<"$out" ||
        die "export is not writable according to nbdinfo:"$'\n'"$out"
    for line in block_size_minimum block_size_preferred block_size_maximum; do
        grep -qE "^[[:space:]]*$line: [0-9]+" <<<"$out" ||
            die "nbdinfo shows no '$line' (server should send NBD_INFO_BLOCK_SIZE):"$'\n'"$out"
    done
}

check_qemu_io() {
    local size last
    size="$(export_size disk)"
    last=$((size - 1))
    # Odd offsets and lengths, overlapping writes, then read everything back.
    qio disk \
        'write -P 0x5a 12345 77777' \
        'write -P 0x3c 1000001 4097' \
        'write -P 0x11 65535 3' \
        'write -P 0x77 5000000 1048577' \
        'flush' ||
        die "qemu-io writes at odd offsets failed"
    qio disk \
        'read -P 0x5a 12345 53190' \
        'read -P 0x11 65535 3' \
        'read -P 0x5a 65538 24584' \
        'read -P 0 0 12345' \
        'read -P 0 90122 909879' \
        'read -P 0x3c 1000001 4097' \
        'read -P 0x77 5000000 1048577' \
        'read -P 0 6048577 1000' ||
        die "qemu-io read-back of the odd-offset writes does not match"
    # Discard and write-zeroes. Bytes next to a discarded or zeroed range are untouched; a
    # zeroed range reads zero; a discarded range that covers whole extents reads zero (bucketfs
    # drops the extent pointers: punch-hole semantics, stricter than NBD requires).
    qio disk \
        'write -P 0x99 8388608 1048576' \
        'discard 8392704 65536' \
        'discard 8650752 131072' \
        'write -z 8912996 12288' \
        'flush' || die "qemu-io discard / write -z failed"
    qio disk \
        'read -P 0x99 8388608 4096' \
        'read -P 0x99 8458240 192512' \
        'read -P 0x99 8781824 131172' \
        'read -P 0 8912996 12288' \
        'read -P 0x99 8925284 511900' ||
        die "bytes next to discarded / zeroed ranges changed, or write -z did not zero"
    qio disk 'read -P 0 8650752 131072' ||
        die "an aligned 128 KiB discard does not read back as zeroes"
    # The very end of the export, and an empty read.
    qio disk \
        "write -P 0xee $last 1" \
        "read -P 0xee $last 1" \
        "read -P 0 $((last - 4095)) 4095" \
        'read 0 0' \
        'flush' || die "qemu-io at the last byte of the export ($last) failed"
    # FUA writes (qemu-io's default cache mode is writethrough: every write carries FUA).
    qio disk 'write -P 0x42 20000000 300000' 'read -P 0x42 20000000 300000' ||
        die "FUA write read-back failed"
}

check_map() {
    local out
    create_export fresh 256M
    out="$(timeout 60 nbdinfo --map "$(nbd_uri fresh)")" || die "nbdinfo --map failed"
    grep -q hole <<<"$out" || die "nbdinfo --map shows no hole on a fresh export:"$'\n'"$out"
    if grep -q data <<<"$out"; then
        die "nbdinfo --map shows data on a fresh, never-written export:"$'\n'"$out"
    fi
    qio fresh 'write -P 0x01 0 1M' 'write -P 0x02 100M 64k' 'flush' || die "write for --map failed"
    out="$(timeout 60 nbdinfo --map "$(nbd_uri fresh)")" || die "nbdinfo --map failed"
    grep -qE '^[[:space:]]*0[[:space:]]+[0-9]+[[:space:]]+[0-9]+[[:space:]]+data' <<<"$out" ||
        die "nbdinfo --map does not show data at offset 0 after writing 1M there:"$'\n'"$out"
    grep -q hole <<<"$out" || die "nbdinfo --map shows no hole after writing 2 small ranges:"$'\n'"$out"
}

check_nbdcopy() {
    local src="$CASE_DIR/random.img" dst="$CASE_DIR/out.img" a b
    log "nbdcopy ${COPY_MIB} MiB in and out (4 connections)"
    head -c "$((COPY_MIB * 1024 * 1024))" /dev/urandom >"$src"
    create_export copy "$((COPY_MIB + 64))M"
    timeout "$BUCKETFS_CLIENT_TIMEOUT" nbdcopy --connections=4 --flush "$src" "$(nbd_uri copy)" ||
        die "nbdcopy $src -> $(nbd_uri copy) failed"
    log "nbdcopy out (4 connections)"
    timeout "$BUCKETFS_CLIENT_TIMEOUT" nbdcopy --connections=4 "$(nbd_uri copy)" "$dst" ||
        die "nbdcopy $(nbd_uri copy) -> $dst failed"
    truncate -s "$(stat -c %s "$src")" "$dst"
    a="$(sha256sum <"$src")"
    b="$(sha256sum <"$dst")"
    [[ "$a" == "$b" ]] || die "nbdcopy round trip of ${COPY_MIB} MiB differs: $a vs $b"
    # The same again through one connection (no multi-conn) reading what four wrote.
    log "nbdcopy out (1 connection, 64 requests)"
    timeout "$BUCKETFS_CLIENT_TIMEOUT" nbdcopy --connections=1 --requests=64 "$(nbd_uri copy)" "$dst" ||
        die "single-connection nbdcopy out failed"
    truncate -s "$(stat -c %s "$src")" "$dst"
    b="$(sha256sum <"$dst")"
    [[ "$a" == "$b" ]] || die "single-connection read-back of ${COPY_MIB} MiB differs"
    rm -f "$src" "$dst"
}

fio_job() {
    # 4 jobs on disjoint ranges, mixed block sizes, checksummed blocks; no verify state file (fio
    # would leave one per job in the working directory). Over S3 the ranges are 12 MiB, not 48:
    # moto answers a range GET by copying the whole object, so the cold read-back after the
    # restart costs minutes of the test machine per 48 MiB and checks nothing more.
    local mib=48
    [[ "$BACKEND" == s3 ]] && mib=12
    timeout "$BUCKETFS_CLIENT_TIMEOUT" fio --name=bucketfs --ioengine=nbd --uri="$(nbd_uri fio)" \
        --rw=randwrite --bssplit=4k/40:8k/30:64k/20:1m/10 --size=${mib}m --offset_increment=${mib}m \
        --numjobs=4 --iodepth=8 --verify=crc32c --verify_fatal=1 --group_reporting "$@" \
        --verify_state_save=0 \
        >>"$CASE_DIR/fio.log" 2>&1
}

check_fio() {
    log "fio randwrite + verify, 4 jobs, bssplit 4k/8k/64k/1m"
    create_export fio 256M
    fio_job --do_verify=1 || {
        tail -n 40 "$CASE_DIR/fio.log" >&2
        die "fio randwrite with verify=crc32c failed (log above)"
    }
    if grep -qE 'verify: bad|err= *[1-9]' "$CASE_DIR/fio.log"; then
        die "fio reported verify errors: $(grep -E 'verify: bad|err=' "$CASE_DIR/fio.log" | head -5)"
    fi
    # The same blocks again after a clean restart: everything fio wrote must have been kept.
    stop_bucketfs
    start_bucketfs "$CONFIG"
    fio_job --verify_only=1 || {
        tail -n 40 "$CASE_DIR/fio.log" >&2
        die "fio verify_only after restart failed (log above)"
    }
}

check_many_connections() {
    local i pids=() pid failed=0
    log "8 concurrent qemu-io clients on one export"
    create_export multi 256M
    for i in 1 2 3 4 5 6 7 8; do
        qio multi "write -P $((0x10 + i)) $((i * 16))M 8M" "read -P $((0x10 + i)) $((i * 16))M 8M" &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do
        wait "$pid" || failed=$((failed + 1))
    done
    ((failed == 0)) || die "$failed of 8 concurrent qemu-io clients failed"
    qio multi 'flush' || die "flush after concurrent writes failed"
    for i in 1 2 3 4 5 6 7 8; do
        qio multi "read -P $((0x10 + i)) $((i * 16))M 8M" ||
            die "concurrent client $i's data is not there when read from a new connection"
    done
    # Multi-conn: writes over 4 connections, a flush on one covers all (can_multi_conn).
    head -c 64M /dev/urandom >"$CASE_DIR/mc.img"
    timeout "$BUCKETFS_CLIENT_TIMEOUT" nbdcopy --connections=4 --requests=32 --flush \
        "$CASE_DIR/mc.img" "$(nbd_uri multi)" || die "nbdcopy --connections=4 failed"
    timeout "$BUCKETFS_CLIENT_TIMEOUT" nbdcopy --connections=4 "$(nbd_uri multi)" "$CASE_DIR/mc.out" ||
        die "nbdcopy --connections=4 read failed"
    truncate -s 64M "$CASE_DIR/mc.out"
    cmp -s "$CASE_DIR/mc.img" "$CASE_DIR/mc.out" || die "multi-conn copy differs"
    rm -f "$CASE_DIR/mc.img" "$CASE_DIR/mc.out"
}

run_case() {
    make_config "$CASE_DIR" "$BACKEND"
    start_bucketfs "$CONFIG"
    create_export disk 1G
    log "nbdinfo"
    check_nbdinfo
    log "qemu-io patterns at odd offsets, discard, write -z, last byte"
    check_qemu_io
    log "nbdinfo --map"
    check_map
    check_nbdcopy
    check_fio
    check_many_connections
    # All of it must still be there after a clean restart.
    stop_bucketfs
    start_bucketfs "$CONFIG"
    qio disk 'read -P 0x5a 12345 53190' "read -P 0x77 5000000 1048577" ||
        die "data written before the restart is gone"
    stop_bucketfs
}

for_each_backend run_case
