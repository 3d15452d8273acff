#!/usr/bin/env bash
# NFSv3 (docs/0007) from `bucketfs run` with `[servers.nfs] listen`, through
# libnfs's own tools, beside the same filesystem over 9P (`bucketfs mount`): a file copied in
# over NFS is read byte for byte through the mount, one written through the mount is read
# over NFS, a rename through the mount is seen over NFS, and a directory listed over NFS holds
# what the mount made. Bad paths get clear errors from both.
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

    # Errors: a missing file, a path that is not a directory.
    out=$(timeout 60 nfs-cat "nfs://127.0.0.1/shared/missing$q" 2>&1) && die "nfs-cat of a missing file succeeded"
    log "a missing file over NFS: $(head -1 <<<"$out")"
    out=$(timeout 60 nfs-ls "nfs://127.0.0.1/shared/services/x$q" 2>&1) && die "nfs-ls below a file succeeded"
    log "below a file over NFS: $(head -1 <<<"$out")"

    stop_mount "$m"
    stop_bucketfs
}

for_each_backend run_case
