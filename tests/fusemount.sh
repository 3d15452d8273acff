# shellcheck shell=bash
# tests/fusemount.sh — `bucketfs mount` for tests: sourced after tests/lib.sh.
#
#   start_mount ADDR DIR [ARG...]   bucketfs mount ADDR DIR --allow-other ARG... in the background
#                                   (log: $CASE_DIR/mount.log); waits until DIR is a mount point.
#                                   Sets MOUNT_PID; the PID and the mount are cleaned up at exit.
#   stop_mount DIR                  SIGTERM; the mount must exit 0 and DIR be unmounted.

MOUNT_PID=""

start_mount() { # ADDR DIR [ARGS...]
    local addr="$1" dir="$2"
    shift 2
    mkdir -p "$dir"
    "$BUCKETFS" mount "$addr" "$dir" --allow-other "$@" >>"$CASE_DIR/mount.log" 2>&1 &
    MOUNT_PID=$!
    register_pid "$MOUNT_PID"
    register_mount "$dir"
    wait_for 30 mountpoint -q "$dir" || die "bucketfs mount $addr $dir did not mount: $(cat "$CASE_DIR/mount.log")"
}

stop_mount() { # DIR
    kill -TERM "$MOUNT_PID"
    wait "$MOUNT_PID" || die "bucketfs mount did not exit 0 on SIGTERM: $(tail -5 "$CASE_DIR/mount.log")"
    MOUNT_PID=""
    if mountpoint -q "$1"; then die "$1 is still mounted after SIGTERM"; fi
}
