#!/usr/bin/env bash
# The command line: init writes a config that run accepts, the embedded default works, nbd
# create/list/resize/delete round trip, status is JSON and names the bucket's cipher,
# change-password rewraps the key.
set -euo pipefail
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"

requires qemu-io nbdinfo diodls nfs-ls

OLD_PASSWORD="old-password-$$"
NEW_PASSWORD="new password with spaces $$"

# Point a config written by `bucketfs init` at this case's bucket, cache and ports; the
# password comes from BUCKETFS_PASSWORD.
adapt_init_config() {
    local cfg="$1"
    NBD_PORT="$(pick_unused_port)"
    NINEP_PORT="$(pick_unused_port)"
    NFS_PORT="$(pick_unused_port)"
    export NBD_PORT NINEP_PORT NFS_PORT
    CONFIG="$cfg"
    CONFIG_DIR="$(dirname "$cfg")"
    CACHE_DIR="$CONFIG_DIR/cache"
    if [[ "$BACKEND" == s3 ]]; then
        S3_PREFIX="$(basename "$TEST_DIR")/cli-init"
        BUCKET_URL="s3://$S3_BUCKET/$S3_PREFIX"
        BUCKET_DIR=""
        config_set "$cfg" aws access_key_id '"testing"'
        config_set "$cfg" aws secret_access_key '"testing"'
        config_set "$cfg" aws region '"us-east-1"'
        config_set "$cfg" aws endpoint "\"$S3_ENDPOINT\""
        [[ "$S3_ENDPOINT" == https:* ]] || config_set "$cfg" aws allow_http true
    else
        BUCKET_DIR="$CONFIG_DIR/bucket"
        BUCKET_URL="file://$BUCKET_DIR"
        S3_PREFIX=""
        mkdir -p "$BUCKET_DIR"
    fi
    config_set "$cfg" storage url "\"$BUCKET_URL\""
    config_set "$cfg" cache dir "\"$CACHE_DIR\""
    config_set "$cfg" servers.nbd listen "[\"127.0.0.1:$NBD_PORT\"]"
    config_set "$cfg" servers.ninep listen "[\"127.0.0.1:$NINEP_PORT\"]"
    config_set "$cfg" servers.nfs listen "[\"127.0.0.1:$NFS_PORT\"]"
    # A literal password in the generated file would win over the environment; a reference
    # to ${BUCKETFS_PASSWORD} is what we want.
    # shellcheck disable=SC2016 # a literal ${...}, not an expansion
    if grep -E '^[[:space:]]*encryption_password[[:space:]]*=' "$cfg" | grep -vqF '${BUCKETFS_PASSWORD}'; then
        sed -i -E '/^[[:space:]]*encryption_password[[:space:]]*=/d' "$cfg"
    fi
}

check_init() {
    local dir="$CASE_DIR/init" out
    mkdir -p "$dir"
    log "bucketfs init"
    (cd "$dir" && timeout 30 "$BUCKETFS" init) || die "bucketfs init (default path) failed"
    [[ -s "$dir/bucketfs.toml" ]] || die "bucketfs init did not write ./bucketfs.toml"
    timeout 30 "$BUCKETFS" init -o "$dir/explicit.toml" || die "bucketfs init -o PATH failed"
    [[ -s "$dir/explicit.toml" ]] || die "bucketfs init -o did not write $dir/explicit.toml"
    out="$(cd "$dir" && timeout 30 "$BUCKETFS" init -o -)" || die "bucketfs init -o - failed"
    grep -q '^\[storage\]' <<<"$out" || die "bucketfs init - printed no [storage] section: $out"
    grep -q '^#' <<<"$out" || die "bucketfs init - wrote no comments"
    [[ "$(find "$dir" -maxdepth 1 -type f | wc -l)" == 2 ]] ||
        die "bucketfs init - wrote a file besides printing: $(ls "$dir")"
    for f in "$dir/bucketfs.toml" "$dir/explicit.toml"; do
        "$BUCKETFS_TEST_PYTHON" -c 'import sys, tomllib; tomllib.load(open(sys.argv[1], "rb"))' "$f" ||
            die "bucketfs init wrote invalid TOML: $f"
    done
    "$BUCKETFS_TEST_PYTHON" -c 'import sys, tomllib; tomllib.loads(sys.stdin.read())' <<<"$out" ||
        die "bucketfs init - printed invalid TOML"
    cp "$dir/explicit.toml" "$CASE_DIR/bucketfs.toml"
    adapt_init_config "$CASE_DIR/bucketfs.toml"
}

check_exports() {
    local out size_a
    log "nbd create / list / resize / delete"
    bfs nbd create alpha --size 1G >/dev/null || die "nbd create alpha --size 1G failed"
    bfs nbd create beta --size 512M >/dev/null || die "nbd create beta --size 512M failed"
    bfs nbd create gamma --size 20GiB >/dev/null || die "nbd create gamma --size 20GiB failed"
    out="$(bfs nbd list)" || die "nbd list failed"
    for n in alpha beta gamma; do
        grep -qw "$n" <<<"$out" || die "nbd list does not show $n: $out"
    done
    size_a="$(export_size alpha)"
    [[ "$size_a" == 1073741824 || "$size_a" == 1000000000 ]] || die "alpha (1G) has size $size_a"
    [[ "$(export_size gamma)" == 21474836480 ]] || die "gamma (20GiB) has size $(export_size gamma)"
    [[ "$(export_size beta)" == $((size_a / 2)) ]] || die "beta (512M) has size $(export_size beta)"
    timeout 30 nbdinfo --list "nbd://127.0.0.1:$NBD_PORT" | grep 'export="gamma"' >/dev/null ||
        die "nbdinfo --list does not show gamma"

    qio alpha 'write -P 0x41 0 1M' "write -P 0x42 $((size_a - 4096)) 4096" 'flush' ||
        die "write to alpha failed"
    bfs nbd resize alpha --size 2G >/dev/null || die "nbd resize alpha --size 2G failed"
    [[ "$(export_size alpha)" == $((size_a * 2)) ]] ||
        die "alpha is $(export_size alpha) bytes after resize to 2G (was $size_a)"
    qio alpha 'read -P 0x41 0 1M' "read -P 0x42 $((size_a - 4096)) 4096" \
        "read -P 0 $size_a 1M" "write -P 0x43 $((size_a * 2 - 1)) 1" "read -P 0x43 $((size_a * 2 - 1)) 1" ||
        die "alpha's data or new space is wrong after resize"

    bfs nbd delete beta >/dev/null || die "nbd delete beta failed"
    out="$(bfs nbd list)" || die "nbd list failed"
    ! grep -qw beta <<<"$out" || die "nbd list still shows beta after delete: $out"
    grep -qw alpha <<<"$out" || die "nbd list lost alpha after deleting beta: $out"
    ! timeout 30 nbdinfo "$(nbd_uri beta)" >/dev/null 2>&1 || die "deleted export beta still opens"

    ! bfs nbd create bad --size banana >/dev/null 2>&1 || die "nbd create --size banana succeeded"
    ! bfs nbd delete no-such-export >/dev/null 2>&1 || die "deleting a missing export succeeded"

    out="$(bfs status)" || die "bucketfs status failed"
    "$BUCKETFS_TEST_PYTHON" -c 'import json, sys; d = json.loads(sys.stdin.read()); assert isinstance(d, dict) and "object_store" in d' <<<"$out" ||
        die "bucketfs status did not print one JSON object with object_store: $out"
    # The cipher a new bucket seals with: AES-256-GCM where the CPU has AES and carry-less
    # multiply instructions, else XChaCha20-Poly1305; status names it, as the superblock does.
    local cipher=xchacha20-poly1305
    if grep -qw aes /proc/cpuinfo && grep -qw -E 'pclmulqdq|pmull' /proc/cpuinfo; then
        cipher=aes-256-gcm-blake3
    fi
    "$BUCKETFS_TEST_PYTHON" -c 'import json, sys; d = json.loads(sys.stdin.read()); assert d["engine"]["cipher"] == sys.argv[1], d["engine"]' "$cipher" <<<"$out" ||
        die "bucketfs status does not name the cipher $cipher: $out"
    if [[ -n $BUCKET_DIR ]]; then
        grep -q "\"cipher\": \"$cipher\"" "$BUCKET_DIR/superblock.json" ||
            die "the superblock does not name the cipher $cipher: $(cat "$BUCKET_DIR/superblock.json")"
    fi
}

check_change_password() {
    local rc=0 out mode=online
    log "change-password"
    out="$(echo "$NEW_PASSWORD" | BUCKETFS_PASSWORD="$OLD_PASSWORD" timeout 120 \
        "$BUCKETFS" change-password -c "$CONFIG" 2>&1)" || rc=$?
    if ((rc != 0)); then
        # Maybe it works on the bucket directly and needs the server stopped.
        log "change-password with the server running failed ($rc: $(tail -n 1 <<<"$out")); retrying stopped"
        mode=offline
        stop_bucketfs
        rc=0
        out="$(echo "$NEW_PASSWORD" | BUCKETFS_PASSWORD="$OLD_PASSWORD" timeout 120 \
            "$BUCKETFS" change-password -c "$CONFIG" 2>&1)" || rc=$?
        ((rc == 0)) || die "bucketfs change-password failed (exit $rc), running or not: $out"
    fi
    log "change-password worked ($mode)"
    bucketfs_alive && stop_bucketfs

    rc=0
    out="$(BUCKETFS_PASSWORD="$OLD_PASSWORD" timeout 60 "$BUCKETFS" run -c "$CONFIG" 2>&1)" || rc=$?
    ((rc != 0 && rc != 124)) || die "the old password still opens the bucket (exit $rc)"
    grep -qi password <<<"$out" || die "old-password error does not mention 'password': $out"

    BUCKETFS_PASSWORD="$NEW_PASSWORD" start_bucketfs "$CONFIG"
    qio alpha 'read -P 0x41 0 1M' "read -P 0x42 $((size_a - 4096)) 4096" ||
        die "data is not intact after change-password"
    stop_bucketfs
}

check_embedded_default() {
    local dir="$CASE_DIR/default" pid i ok=0 out
    if _port_open 10809 || _port_open 5564 || _port_open 2049; then
        log "note: port 10809, 5564 or 2049 is in use here; embedded-default check skipped"
        return 0
    fi
    log "bucketfs run without a config (embedded default)"
    mkdir -p "$dir"
    (cd "$dir" && exec env BUCKETFS_PASSWORD="$OLD_PASSWORD" "$BUCKETFS" run >>"$dir/bucketfs.log" 2>&1) &
    pid=$!
    register_pid "$pid"
    for ((i = 0; i < 150; i++)); do
        pid_alive "$pid" || break
        if (cd "$dir" && timeout 10 "$BUCKETFS" status >/dev/null 2>&1) && _port_open 10809; then
            ok=1
            break
        fi
        sleep 0.2
    done
    ((ok)) || { cat "$dir/bucketfs.log" >&2; die "bucketfs run with no config did not come up on 10809 and ./bucketfs-cache/admin.sock"; }
    [[ "$(stat -c %a "$dir/bucketfs-cache/admin.sock")" == 600 ]] ||
        die "the embedded default's admin socket is not mode 0600: $(stat -c %a "$dir/bucketfs-cache/admin.sock")"
    (cd "$dir" && timeout 30 "$BUCKETFS" nbd create dflt --size 64M >/dev/null) ||
        die "nbd create against the embedded default failed"
    timeout 30 nbdinfo nbd://127.0.0.1:10809/dflt >/dev/null || die "nbdinfo on the default port failed"
    # The same filesystem over 9P on its default port: the device is a file of /.nbd.
    out="$(timeout 30 diodls -s 127.0.0.1:5564 -a /.nbd -l . 2>&1)" ||
        die "diodls on the embedded default's 9P port failed: $out"
    grep -qE ' 67108864 .* dflt$' <<<"$out" || die "diodls does not show dflt as a 64 MiB file: $out"
    # And over NFS on its default port.
    out="$(timeout 30 nfs-ls "nfs://127.0.0.1/.nbd?version=3&nfsport=2049&mountport=2049" 2>&1)" ||
        die "nfs-ls on the embedded default's NFS port failed: $out"
    grep -qE ' 67108864 dflt$' <<<"$out" || die "nfs-ls does not show dflt as a 64 MiB file: $out"
    kill -TERM "$pid"
    wait "$pid" || die "bucketfs run (embedded default) did not exit 0 on SIGTERM"
    [[ -d "$dir/bucketfs-data" ]] || die "embedded default did not keep its bucket in ./bucketfs-data"
}

run_case() {
    local size_a
    export BUCKETFS_PASSWORD="$OLD_PASSWORD"
    check_init
    start_bucketfs "$CONFIG"
    check_exports
    size_a="$(export_size alpha)"
    size_a=$((size_a / 2))
    check_change_password
    if [[ "$BACKEND" == file ]]; then
        check_embedded_default
    fi
}

for_each_backend run_case
