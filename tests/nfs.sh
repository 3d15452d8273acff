#!/usr/bin/env bash
# NFSv3 (docs/0007) from `bucketfs run` with `[servers.nfs]`, through libnfs (its tools, and
# tests/libnfs.py for what they lack), beside the same filesystem over 9P (`bucketfs mount`):
# - a file copied in over NFS is read byte for byte through the mount, one written through the
#   mount is read over NFS, a rename through the mount is seen over NFS, a directory listed
#   over NFS holds what the mount made;
# - a rename, mkdir and unlink over NFS are seen through the mount within its attribute
#   timeout (1 s), with no stale name left;
# - exports: root of a client not on loopback (this machine's own non-loopback address) makes
#   files as nobody, root on loopback as root; a read-only export refuses writes; a directory
#   outside every export cannot be mounted;
# - bad paths get clear errors.
set -euo pipefail
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=tests/fusemount.sh
source "$(dirname "$0")/fusemount.sh"

requires nfs-ls nfs-cat nfs-cp mountpoint cmp
[[ -c /dev/fuse ]] || skip "no /dev/fuse"

run_case() {
    local m="$CASE_DIR/mnt" q out
    make_config "$CASE_DIR" "$BACKEND"
    start_bucketfs "$CONFIG"
    start_mount "127.0.0.1:$NINEP_PORT" "$m"
    q="?version=3&nfsport=$NFS_PORT&mountport=$NFS_PORT"
    mkdir "$m/shared"

    # NFS in, 9P out.
    timeout 60 nfs-cp /etc/services "nfs://127.0.0.1/shared/services$q" || die "nfs-cp into the export"
    cmp /etc/services "$m/shared/services" || die "a file copied in over NFS reads otherwise through 9P"

    # 9P in, NFS out; a rename through 9P is seen over NFS.
    seq 1 20000 >"$CASE_DIR/numbers"
    cp "$CASE_DIR/numbers" "$m/shared/numbers"
    timeout 60 nfs-cat "nfs://127.0.0.1/shared/numbers$q" >"$CASE_DIR/numbers.nfs" || die "nfs-cat"
    cmp "$CASE_DIR/numbers" "$CASE_DIR/numbers.nfs" || die "a file written through 9P reads otherwise over NFS"
    mv "$m/shared/numbers" "$m/shared/renamed"
    if timeout 60 nfs-cat "nfs://127.0.0.1/shared/numbers$q" >/dev/null 2>&1; then
        die "over NFS, the old name of a file renamed through 9P still reads"
    fi
    timeout 60 nfs-cat "nfs://127.0.0.1/shared/renamed$q" | cmp - "$CASE_DIR/numbers" ||
        die "over NFS, the new name of a renamed file"

    # A listing over NFS holds what the mount made, with sizes.
    mkdir "$m/shared/sub"
    out=$(timeout 60 nfs-ls "nfs://127.0.0.1/shared$q") || die "nfs-ls: $out"
    for name in services renamed sub; do
        grep -q " $name\$" <<<"$out" || die "nfs-ls does not list $name: $out"
    done
    grep -q "$(stat -c %s /etc/services) services\$" <<<"$out" || die "nfs-ls's size of services: $out"

    # Changes over NFS, seen through the mount within its attribute timeout.
    nfsop() { /usr/bin/python3 "$REPO_ROOT/tests/libnfs.py" "nfs://127.0.0.1/$q" "$@"; }
    nfsop rename /shared/renamed /shared/moved || die "rename over NFS"
    nfsop mkdir /shared/made || die "mkdir over NFS"
    nfsop unlink /shared/services || die "unlink over NFS"
    wait_for 3 test -d "$m/shared/made" || die "a directory made over NFS is not seen through 9P"
    wait_for 3 test -e "$m/shared/moved" || die "a file renamed over NFS is not seen through 9P"
    wait_for 3 test ! -e "$m/shared/renamed" || die "through 9P, the old name of a file renamed over NFS stays"
    wait_for 3 test ! -e "$m/shared/services" || die "through 9P, a file removed over NFS stays"
    cmp "$m/shared/moved" "$CASE_DIR/numbers" || die "through 9P, a file renamed over NFS reads otherwise"

    # Errors: a missing file, a path that is not a directory.
    out=$(timeout 60 nfs-cat "nfs://127.0.0.1/shared/missing$q" 2>&1) && die "nfs-cat of a missing file succeeded"
    log "a missing file over NFS: $(head -1 <<<"$out")"
    out=$(timeout 60 nfs-ls "nfs://127.0.0.1/shared/services/x$q" 2>&1) && die "nfs-ls below a file succeeded"
    log "below a file over NFS: $(head -1 <<<"$out")"

    stop_mount "$m"
    stop_bucketfs
    check_exports
}

# Exports, with NFS also on this machine's first non-loopback address so that a client there is
# "not on loopback" for real.
check_exports() {
    local far m="$CASE_DIR/mnt" out
    far=$(hostname -I 2>/dev/null | tr ' ' '\n' | grep -E '^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$' | grep -v '^127\.' | head -1 || true)
    [[ -n "$far" ]] || { log "no non-loopback IPv4 address here: exports checked from loopback only"; far=127.0.0.1; }
    config_set "$CONFIG" servers.nfs listen "[\"127.0.0.1:$NFS_PORT\", \"$far:$NFS_PORT\"]"
    cat >>"$CONFIG" <<EOF2

[[servers.nfs.exports]]
path = "/shared"

[[servers.nfs.exports]]
path = "/ro"
read_only = true
EOF2
    start_bucketfs "$CONFIG"
    start_mount "127.0.0.1:$NINEP_PORT" "$m"
    mkdir -p "$m/ro" "$m/private"
    chmod 777 "$m/shared"
    local near_q="?version=3&nfsport=$NFS_PORT&mountport=$NFS_PORT"
    /usr/bin/python3 "$REPO_ROOT/tests/libnfs.py" "nfs://127.0.0.1/shared$near_q" creat /by-near-root ||
        die "creat over NFS from loopback"
    /usr/bin/python3 "$REPO_ROOT/tests/libnfs.py" "nfs://$far/shared$near_q" creat /by-far-root ||
        die "creat over NFS from $far"
    wait_for 3 test -e "$m/shared/by-far-root" || die "a file made over NFS from $far is not seen through 9P"
    [[ "$(stat -c %u "$m/shared/by-near-root")" == 0 ]] ||
        die "root on loopback made a file owned by $(stat -c %u "$m/shared/by-near-root"), not root"
    if [[ "$far" != 127.0.0.1 ]]; then
        [[ "$(stat -c %u:%g "$m/shared/by-far-root")" == 65534:65534 ]] ||
            die "root from $far was not squashed: the file is owned by $(stat -c %u:%g "$m/shared/by-far-root")"
    fi
    # A read-only export refuses a write; outside every export, MNT refuses.
    out=$(timeout 60 nfs-cp /etc/hostname "nfs://127.0.0.1/ro/x$near_q" 2>&1) &&
        die "nfs-cp into a read-only export succeeded"
    log "a write to a read-only export: $(head -1 <<<"$out")"
    [[ ! -e "$m/ro/x" ]] || die "a write refused by a read-only export left a file"
    out=$(timeout 60 nfs-ls "nfs://127.0.0.1/private$near_q" 2>&1) && die "nfs-ls outside every export succeeded: $out"
    log "a mount outside every export: $(head -1 <<<"$out")"
    stop_mount "$m"
    stop_bucketfs
}

for_each_backend run_case
