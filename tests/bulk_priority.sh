#!/usr/bin/env bash
# Bulk work at idle CPU priority (docs/0010-bulk-cpu-priority.md), on each backend:
# - as root, `bucketfs status` shows bulk_priority "idle";
# - beside three CPU-bound processes of normal priority (more than the cores of the 2-core test
#   VM), 256 MiB (64 on S3) written through `bucketfs mount` with dd conv=fsync completes within
#   120 s and reads back equal: the watchdog raised the starved bulk threads (bulk_boosts > 0).
#   Without it the sealing threads get almost no CPU and the same write takes many minutes;
# - `[tuning] bulk_idle_priority = 0` keeps bulk work at normal priority;
# - without CAP_SYS_NICE (setpriv drops it from the bounding set) the server cannot raise a
#   thread back from SCHED_IDLE, so it never lowers one: "normal_not_permitted".
set -euo pipefail
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"

requires mountpoint setpriv cmp

cleanup() {
    local rc=$? m
    set +e
    trap - ERR
    for m in "$TEST_DIR"/*/mnt; do mountpoint -q "$m" && umount "$m"; done
    bucketfs_alive && stop_bucketfs >/dev/null 2>&1
    (exit $rc)
    _lib_cleanup
}
trap cleanup EXIT

# field NAME: the engine's status field NAME.
field() {
    status_json | /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["engine"][sys.argv[1]])' "$1"
}

run_case() {
    local MNT="$CASE_DIR/mnt" hogs start took boosts mib REAL_BUCKETFS
    # Default tuning, as root: idle priority, and the watchdog keeps bulk work from starving.
    make_config "$CASE_DIR/idle" "$BACKEND"
    start_bucketfs "$CONFIG"
    [[ "$(field bulk_priority)" == idle ]] || die "bulk_priority is $(field bulk_priority), not idle, as root"
    mkdir -p "$MNT"
    "$BUCKETFS" mount "127.0.0.1:$NINEP_PORT" "$MNT" >"$CASE_DIR/mount.log" 2>&1 &
    register_pid $!
    wait_for 30 mountpoint -q "$MNT" || die "bucketfs mount did not mount"
    # moto takes its uploads on the same two cores as the hogs: less data there.
    mib=256
    [[ "$BACKEND" == s3 ]] && mib=64
    head -c $((mib << 20)) /dev/urandom >"$CASE_DIR/src"
    hogs=()
    for _ in 1 2 3; do
        /usr/bin/python3 -c 'while True: pass' &
        hogs+=($!)
        register_pid $!
    done
    start=$SECONDS
    timeout 120 dd if="$CASE_DIR/src" of="$MNT/big" bs=1M conv=fsync status=none ||
        die "$mib MiB + fsync beside three CPU hogs did not complete within 120 s (bulk work starved?)"
    took=$((SECONDS - start))
    kill "${hogs[@]}"
    wait "${hogs[@]}" 2>/dev/null || true
    boosts="$(field bulk_boosts)"
    log "$mib MiB + fsync beside three CPU hogs: ${took} s, bulk_boosts $boosts"
    ((boosts > 0)) || die "bulk work was never raised beside three CPU hogs"
    echo 3 >/proc/sys/vm/drop_caches
    cmp "$CASE_DIR/src" "$MNT/big" || die "the file written beside the hogs reads back different"
    umount "$MNT"
    stop_bucketfs

    # Turned off in the config.
    make_config "$CASE_DIR/off" "$BACKEND"
    printf '[tuning]\nbulk_idle_priority = 0\n' >>"$CONFIG"
    start_bucketfs "$CONFIG"
    [[ "$(field bulk_priority)" == normal ]] || die "bulk_priority is $(field bulk_priority) with bulk_idle_priority = 0"
    stop_bucketfs

    # Without CAP_SYS_NICE.
    printf '#!/bin/sh\nexec setpriv --bounding-set -sys_nice "%s" "$@"\n' "$BUCKETFS" >"$CASE_DIR/no-sys-nice"
    chmod +x "$CASE_DIR/no-sys-nice"
    REAL_BUCKETFS="$BUCKETFS"
    BUCKETFS="$CASE_DIR/no-sys-nice"
    make_config "$CASE_DIR/unpermitted" "$BACKEND"
    start_bucketfs "$CONFIG"
    [[ "$(field bulk_priority)" == normal_not_permitted ]] ||
        die "bulk_priority is $(field bulk_priority) without CAP_SYS_NICE, not normal_not_permitted"
    grep -q "bulk work runs at normal CPU priority" "$BUCKETFS_LOG" || die "the log does not say why bulk work runs at normal priority"
    stop_bucketfs
    BUCKETFS="$REAL_BUCKETFS"
}

for_each_backend run_case
