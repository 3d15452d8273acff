#!/usr/bin/env bash
# `bucketfs mount` (FUSE speaking 9P2000.L) on bucketfs's own 9P server, through the kernel:
# POSIX operations with coreutils and Python, other users acting as themselves (sticky and
# private directories), POSIX ACLs, a file unlinked while open, fsync durable across kill -9 of
# the server (a tree's data and its inherited ACLs) with the mount reconnecting and an open file
# going on, and SIGTERM unmounting. The same
# operations on diod's export (a third-party 9P2000.L server) once, on the file backend.
set -euo pipefail
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=tests/fusemount.sh
source "$(dirname "$0")/fusemount.sh"

requires diod setpriv mountpoint nbdinfo setfacl getfacl
[[ -c /dev/fuse ]] || skip "no /dev/fuse"
PY=/usr/bin/python3

# POSIX operations any 9P2000.L server must get right; with "full", also user xattrs and a file
# unlinked while open (diod, which serves paths, answers ENOENT to a read of such a file).
posix_checks() { # DIR [full]
    local m="$1" out
    mkdir -p "$m/a/b"
    echo hello >"$m/a/b/f"
    [[ "$(cat "$m/a/b/f")" == hello ]] || die "read back of a new file"
    cp /etc/services "$m/a/s"
    cmp -s /etc/services "$m/a/s" || die "cp of /etc/services read back other bytes"
    ln "$m/a/s" "$m/a/h"
    [[ "$(stat -c %h "$m/a/s")" == 2 ]] || die "link count after ln: $(stat -c %h "$m/a/s")"
    ln -s s "$m/a/l"
    [[ "$(readlink "$m/a/l")" == s ]] || die "readlink"
    cmp -s /etc/services "$m/a/l" || die "read through a symlink"
    mv "$m/a/b" "$m/a/c"
    [[ -f "$m/a/c/f" && ! -e "$m/a/b" ]] || die "rename of a directory"
    [[ "$(cat "$m/a/c/f")" == hello ]] || die "a file under a renamed directory"
    mv "$m/a/c/f" "$m/a/g"
    [[ "$(cat "$m/a/g")" == hello ]] || die "rename of a file across directories"
    chmod 640 "$m/a/s"
    [[ "$(stat -c %a "$m/a/s")" == 640 ]] || die "chmod: $(stat -c %a "$m/a/s")"
    truncate -s 5 "$m/a/s"
    [[ "$(stat -c %s "$m/a/s")" == 5 ]] || die "truncate down"
    echo -n xy >>"$m/a/s"
    [[ "$(stat -c %s "$m/a/s")" == 7 ]] || die "append: size $(stat -c %s "$m/a/s")"
    # Sparse, beyond 4 GiB.
    truncate -s 5G "$m/a/sparse"
    printf 'far' | dd of="$m/a/sparse" bs=1 seek=$((4608 * 1024 * 1024)) conv=notrunc status=none
    [[ "$(dd if="$m/a/sparse" bs=1 skip=$((4608 * 1024 * 1024)) count=3 status=none)" == far ]] ||
        die "a write beyond 4 GiB did not read back"
    [[ "$(dd if="$m/a/sparse" bs=4096 skip=1000 count=1 status=none | tr -d '\0' | wc -c)" == 0 ]] ||
        die "a hole did not read as zeroes"
    mkfifo "$m/a/p"
    [[ -p "$m/a/p" ]] || die "mkfifo"
    if out="$(rmdir "$m/a" 2>&1)"; then die "rmdir of a non-empty directory succeeded"; fi
    grep -q "not empty" <<<"$out" || die "rmdir of a non-empty directory: $out"
    if [[ "${2:-}" == full ]]; then
        # A file unlinked while open keeps its data for the open descriptor.
        "$PY" - "$m/a/open" <<'EOF' || die "unlink while open"
import os, sys
p = sys.argv[1]
fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
os.write(fd, b"still here")
os.unlink(p)
assert not os.path.exists(p)
os.lseek(fd, 0, 0)
assert os.read(fd, 100) == b"still here"
os.close(fd)
EOF
        "$PY" - "$m/a/s" <<'EOF' || die "user xattrs"
import os, sys
p = sys.argv[1]
os.setxattr(p, "user.k", b"value")
assert os.getxattr(p, "user.k") == b"value"
assert "user.k" in os.listxattr(p)
os.removexattr(p, "user.k")
try:
    os.getxattr(p, "user.k")
    raise SystemExit("removed xattr still there")
except OSError as e:
    assert e.errno == 61, e  # ENODATA
EOF
    fi
    rm "$m/a/h" "$m/a/l" "$m/a/p" "$m/a/sparse"
    rm -r "$m/a"
    [[ ! -e "$m/a" ]] || die "rm -r left the tree"
}

# Whether the counter in FILE (written by a test's loop) has reached N.
fsyncs_at_least() { # FILE N
    local n
    n="$(cat "$1" 2>/dev/null)" || return 1
    [[ -n $n ]] && ((n >= $2))
}

run_case() {
    local m="$CASE_DIR/mnt" out
    make_config "$CASE_DIR" "$BACKEND"
    start_bucketfs "$CONFIG"
    start_mount "127.0.0.1:$NINEP_PORT" "$m"
    posix_checks "$m" full

    # Record locks go through the server: a second process is refused a conflicting lock,
    # F_GETLK names the holder, and a blocking request is granted when the holder closes.
    "$PY" - "$m/locked" <<'EOF' || die "record locks through the mount"
import errno, fcntl, os, struct, sys, time
p = sys.argv[1]
fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
fcntl.lockf(fd, fcntl.LOCK_EX)
pid = os.fork()
if pid == 0:
    fd2 = os.open(p, os.O_RDWR)
    try:
        fcntl.lockf(fd2, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os._exit(1)
    except OSError as e:
        if e.errno not in (errno.EAGAIN, errno.EACCES):
            os._exit(2)
    got = fcntl.fcntl(fd2, fcntl.F_GETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0))
    kind, _, _, _, holder = struct.unpack("hhqqi4x", got)
    if kind != fcntl.F_WRLCK or holder != os.getppid():
        os._exit(3)
    t = time.time()
    fcntl.lockf(fd2, fcntl.LOCK_EX)
    os._exit(0 if time.time() - t > 0.3 else 4)
time.sleep(0.8)
os.close(fd)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, f"the other process: step {os.waitstatus_to_exitcode(status)}"
os.unlink(p)
EOF

    # A block device made through the mount is an NBD export.
    truncate -s 8M "$m/.nbd/viamount"
    out="$(timeout 30 nbdinfo "$(nbd_uri viamount)" 2>&1)" || die "nbdinfo of a device made through the mount: $out"
    grep -q "export-size: 8388608" <<<"$out" || die "the device made through the mount: $out"

    # Other users act as themselves: no write to root's 0755 directory, a sticky shared one.
    # (The test's directories are made 0700; other users must be able to reach the mount.)
    chmod o+x "$TEST_DIR" "$CASE_DIR"
    # The POSIX cases with their expected errnos, as root and as other users.
    mkdir "$m/cases"
    out="$("$PY" "$(dirname "$0")/posix_cases.py" "$m/cases" --skip-tag 9p,fuse 2>&1)" || die "$out"
    log "$(tail -1 <<<"$out")"
    rm -r "$m/cases"
    if out="$(setpriv --reuid=1000 --regid=1000 --clear-groups touch "$m/nope" 2>&1)"; then
        die "uid 1000 created a file in root's 0755 directory"
    fi
    grep -q "Permission denied" <<<"$out" || die "unexpected refusal: $out"
    mkdir "$m/tmp"
    chmod 1777 "$m/tmp"
    setpriv --reuid=1000 --regid=1000 --clear-groups touch "$m/tmp/mine" || die "uid 1000 could not create in a 1777 directory"
    [[ "$(stat -c '%u %g' "$m/tmp/mine")" == "1000 1000" ]] || die "owner of a file uid 1000 made: $(stat -c '%u %g' "$m/tmp/mine")"
    if setpriv --reuid=1001 --regid=1001 --clear-groups rm -f "$m/tmp/mine" 2>/dev/null; then
        die "uid 1001 removed uid 1000's file from a sticky directory"
    fi

    # A source tree untarred through the mount, then one fsync of its top directory (`sync
    # DIR`: on bucketfs a directory's fsync covers everything written before it, in any file),
    # is there byte for byte after kill -9 of the server and a restart. (`sync -f`, syncfs, does
    # not reach a FUSE server built on fuser, which does not implement FUSE_SYNCFS.)
    if [[ -d /usr/include/linux ]]; then
        tar -C /usr/include -cf "$CASE_DIR/tree.tar" linux
        (cd /usr/include && find linux -type f -print0 | sort -z | xargs -0 md5sum) >"$CASE_DIR/tree.md5"
        mkdir "$m/src"
        # With a default ACL on the top directory: every file and directory of the tree
        # inherits it, and the ACLs are as durable as the rest.
        setfacl -m u:1001:rwx -d -m u:1001:rwx "$m/src" || die "setfacl through the mount"
        tar -C "$m/src" -xf "$CASE_DIR/tree.tar" || die "untar through the mount failed"
        sync "$m/src"
        (cd "$m/src" && md5sum --quiet -c "$CASE_DIR/tree.md5") || die "the untarred tree differs"
        local acls
        acls="$(getfacl -p "$m/src/linux/acct.h"; getfacl -p -d "$m/src/linux")"
        grep -q "^user:1001:rwx" <<<"$acls" || die "the tree did not inherit the default ACL: $acls"
        kill9_bucketfs
        start_bucketfs "$CONFIG"
        (cd "$m/src" && md5sum --quiet -c "$CASE_DIR/tree.md5") ||
            die "after kill -9 and a restart, the synced tree differs"
        [[ "$(getfacl -p "$m/src/linux/acct.h"; getfacl -p -d "$m/src/linux")" == "$acls" ]] ||
            die "after kill -9 and a restart, the tree's ACLs differ"
        log "$(wc -l <"$CASE_DIR/tree.md5") files untarred with inherited ACLs, synced and checked across kill -9"
        rm -r "$m/src"
    fi

    # The data-integrity exerciser: random writes, truncates, reads and mmap reads checked
    # against a model, with kill -9 of the server and a restart halfway (BUCKETFS_FSX_SECONDS).
    "$PY" "$(dirname "$0")/fsx.py" "$m" "${BUCKETFS_FSX_SECONDS:-16}" "$CASE_DIR/fsx-step" \
        >"$CASE_DIR/fsx.log" 2>&1 &
    local fsx=$!
    wait_for 60 grep -q synced "$CASE_DIR/fsx-step" || die "fsx did not reach its restart: $(cat "$CASE_DIR/fsx.log")"
    kill9_bucketfs
    start_bucketfs "$CONFIG"
    echo restarted >"$CASE_DIR/fsx-step"
    wait "$fsx" || die "fsx: $(tail -25 "$CASE_DIR/fsx.log")"
    log "$(tail -1 "$CASE_DIR/fsx.log")"
    rm -f "$m"/fsx*

    # fsync is durable across kill -9; the mount reconnects and an open file goes on; a write
    # no fsync covered before the kill fails the next fsync (EIO, once).
    "$PY" - "$m" "$CASE_DIR/step" <<'EOF' &
import os, sys, time
m, step = sys.argv[1], sys.argv[2]
with open(m + "/durable", "wb") as f:
    f.write(b"fsynced")
    f.flush()
    os.fsync(f.fileno())
held = open(m + "/held", "wb")
held.write(b"before")
held.flush()
os.fsync(held.fileno())
# Written, never fsynced: the server's crash may lose it, and fsync must then say so.
unsynced = os.open(m + "/unsynced", os.O_WRONLY | os.O_CREAT, 0o644)
os.fsync(unsynced)
os.write(unsynced, b"maybe lost")
open(step, "w").write("synced")
while open(step).read().strip() != "restarted":
    time.sleep(0.1)
assert open(m + "/durable", "rb").read() == b"fsynced", "fsynced data lost"
held.write(b" and after")
held.flush()
os.fsync(held.fileno())
held.close()
assert open(m + "/held", "rb").read() == b"before and after", open(m + "/held", "rb").read()
try:
    os.fsync(unsynced)
    raise SystemExit("fsync succeeded after the server lost a write it never made durable")
except OSError as e:
    assert e.errno == 5, e  # EIO, once
os.fsync(unsynced)
os.close(unsynced)
EOF
    local py=$!
    wait_for 30 grep -q synced "$CASE_DIR/step" || die "the fsync step did not run"
    kill9_bucketfs
    start_bucketfs "$CONFIG"
    echo restarted >"$CASE_DIR/step"
    wait "$py" || die "after kill -9 and a restart: data lost, or the mount did not reconnect"
    # A small file's fsync does not wait for another writer's stream (a side record, docs/0006
    # "Durability"), and what it acknowledged survives kill -9 in the middle of the stream.
    "$PY" - "$m" "$CASE_DIR/acked" 2>"$CASE_DIR/streamer.log" <<'EOF' &
import os, sys, threading
m, acked = sys.argv[1], sys.argv[2]
small = os.open(m + "/small", os.O_RDWR | os.O_CREAT, 0o644)
os.fsync(small)
def stream():
    fd = os.open(m + "/stream", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    chunk = os.urandom(1 << 20)
    for _ in range(4096):
        os.write(fd, chunk)
threading.Thread(target=stream, daemon=True).start()
i = 0
while True:
    i += 1
    os.pwrite(small, f"{i:012d}".encode() * 341, 0)
    os.fsync(small)
    with open(acked + ".new", "w") as f:
        f.write(str(i))
    os.rename(acked + ".new", acked)
EOF
    local streamer=$! acked side seen
    wait_for 60 fsyncs_at_least "$CASE_DIR/acked" 200 || die "fewer than 200 small-file fsyncs in 60 s"
    # The kill lands in the middle of the stream, its log objects on their way to the bucket.
    wait_for 60 bash -c "(( \$(stat -c %s '$m/stream' 2>/dev/null || echo 0) >= 256 << 20 ))" ||
        die "the stream beside the fsyncs did not reach 256 MiB in 60 s"
    side="$("$BUCKETFS" status -c "$CONFIG" | "$PY" -c 'import json, sys
def find(d):
    if isinstance(d, dict):
        for k, v in d.items():
            found = v if k == "scoped_barriers_side" else find(v)
            if found is not None:
                return found
print(find(json.load(sys.stdin)))')"
    kill9_bucketfs
    acked="$(cat "$CASE_DIR/acked")"
    # Its next request fails (EIO) with the server gone, if it has not already.
    kill -9 "$streamer" 2>/dev/null || true
    wait "$streamer" 2>/dev/null || true
    start_bucketfs "$CONFIG"
    seen="$(head -c 12 "$m/small")" || die "the small file is unreadable after kill -9 and a restart"
    ((10#$seen >= acked)) || die "after kill -9, the small file holds fsync $seen, but fsync $acked was acknowledged"
    ((side > 0)) || die "no fsync beside the stream took a side record (bucketfs status: scoped_barriers_side=$side)"
    log "small-file fsyncs beside a stream: $acked acknowledged ($side by side records), fsync $seen found after kill -9"
    rm -f "$m/small" "$m/stream"

    # cache=none beside the default mount of the same server: a change made through one is
    # seen through the other at once, and reads and writes bypass the page cache.
    local mnone="$CASE_DIR/mnt-none" mount_default=$MOUNT_PID
    start_mount "127.0.0.1:$NINEP_PORT" "$mnone" -o cache=none
    echo first >"$m/shared"
    [[ "$(cat "$mnone/shared")" == first ]] || die "cache=none: a new file read through the other mount"
    echo second >"$mnone/shared"
    [[ "$(cat "$m/shared")" == second ]] || die "a write through the cache=none mount, read through the default one"
    echo third >"$m/shared"
    [[ "$(stat -c %s "$mnone/shared")" == 6 && "$(cat "$mnone/shared")" == third ]] ||
        die "cache=none served a stale size or stale bytes"
    rm "$mnone/shared"
    stop_mount "$mnone"
    if out="$("$BUCKETFS" mount "127.0.0.1:$NINEP_PORT" "$mnone" -o cache=fscache 2>&1)"; then
        die "an unknown cache mode was accepted"
    fi
    grep -q "cache=fscache" <<<"$out" || die "an unknown cache mode: $out"
    MOUNT_PID=$mount_default
    stop_mount "$m"
    stop_bucketfs

    # The same server on a unix socket, with a quota of 1 MiB: a bigger file is refused with
    # ENOSPC, df shows the quota, and deleting makes room.
    config_set "$CONFIG" servers.ninep unix_socket "\"$CASE_DIR/9p.sock\""
    config_set "$CONFIG" filesystem quota_bytes '"1MiB"'
    start_bucketfs "$CONFIG"
    start_mount "$CASE_DIR/9p.sock" "$m"
    [[ "$(cat "$m/durable")" == fsynced ]] || die "reading through the unix socket"
    if out="$(dd if=/dev/zero of="$m/big" bs=64k count=32 conv=fsync 2>&1)"; then
        die "a 2 MiB file fit in a 1 MiB quota"
    fi
    grep -q "No space left on device" <<<"$out" || die "over the quota: $out"
    [[ "$(df -B1 --output=size "$m" | tail -1 | tr -d ' ')" == 1048576 ]] || die "df does not show the quota: $(df -B1 "$m")"
    rm "$m/big"
    dd if=/dev/zero of="$m/small" bs=64k count=4 conv=fsync status=none || die "no room after a delete"
    stop_mount "$m"
    stop_bucketfs

    # diod's export through the same client, once.
    if [[ "$BACKEND" == file ]]; then
        local export="$CASE_DIR/diod-export" port
        port="$(pick_unused_port)"
        mkdir -p "$export"
        diod -f -n -e "$export" -l "127.0.0.1:$port" -L stderr >"$CASE_DIR/diod.log" 2>&1 &
        register_pid $!
        wait_for 20 _port_open "$port" || die "diod did not start: $(cat "$CASE_DIR/diod.log")"
        start_mount "127.0.0.1:$port" "$CASE_DIR/diod-mnt" --aname "$export"
        posix_checks "$CASE_DIR/diod-mnt"
        mkdir "$CASE_DIR/diod-mnt/cases"
        out="$("$PY" "$(dirname "$0")/posix_cases.py" "$CASE_DIR/diod-mnt/cases" --skip-tag 9p,fuse,diod 2>&1)" ||
            die "on diod: $out"
        log "diod: $(tail -1 <<<"$out")"
        stop_mount "$CASE_DIR/diod-mnt"
    fi
}

for_each_backend run_case
