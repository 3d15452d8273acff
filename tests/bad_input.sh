#!/usr/bin/env bash
# Bad input everywhere: wrong password, a second writer, a malformed config, malformed NBD
# handshakes and requests, edge-case requests, and a corrupted data object. Each must give a
# clear error, never a crash, never wrong bytes, and nothing written where nothing should be.
set -euo pipefail
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"

requires qemu-io nbdinfo nbdcopy timeout
requires_nbdsh

# A raw NBD client (stdlib only) that speaks the protocol wrongly on purpose.
write_nbdraw() {
    cat >"$TEST_DIR/nbdraw.py" <<'PY'
import os
import socket
import struct
import sys
import time

HOST, PORT = "127.0.0.1", int(os.environ["NBD_PORT"])
EXPORT = os.environ.get("EXPORT", "raw").encode()
OPT_MAGIC = b"IHAVEOPT"
REP_MAGIC = 0x3E889045565A9
REQ_MAGIC = 0x25609513
SIMPLE_MAGIC = 0x67446698
CHUNK_MAGIC = 0x668E33EF
OPT_EXPORT_NAME, OPT_ABORT, OPT_GO, OPT_STRUCTURED = 1, 2, 7, 8
CMD_READ, CMD_WRITE, CMD_DISC, CMD_FLUSH, CMD_TRIM, CMD_ZERO = 0, 1, 2, 3, 4, 6


class Closed(Exception):
    pass


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise Closed("server closed the connection after %d of %d bytes" % (len(buf), n))
        buf += chunk
    return buf


def connect(timeout=20):
    s = socket.create_connection((HOST, PORT), timeout=timeout)
    return s


def greet(s, client_flags=3):
    hello = recv_exact(s, 18)
    if hello[:16] != b"NBDMAGICIHAVEOPT":
        fail("bad greeting %r" % hello)
    s.sendall(struct.pack(">I", client_flags))
    return struct.unpack(">H", hello[16:])[0]


def send_opt(s, opt, data=b""):
    s.sendall(OPT_MAGIC + struct.pack(">II", opt, len(data)) + data)


def read_rep(s):
    magic, opt, typ, length = struct.unpack(">QIII", recv_exact(s, 20))
    if magic != REP_MAGIC:
        fail("bad option reply magic %x" % magic)
    return opt, typ, recv_exact(s, length)


def go(s, name=EXPORT, structured=False):
    """Handshake to transmission; returns (size, flags)."""
    greet(s)
    if structured:
        send_opt(s, OPT_STRUCTURED)
        _, typ, _ = read_rep(s)
        if typ != 1:
            fail("server refused structured replies (reply type %x)" % typ)
    send_opt(s, OPT_GO, struct.pack(">I", len(name)) + name + struct.pack(">H", 0))
    size = flags = None
    while True:
        _, typ, data = read_rep(s)
        if typ == 1:
            break
        if typ & 0x80000000:
            return None, typ
        if typ == 3 and struct.unpack(">H", data[:2])[0] == 0:
            size, flags = struct.unpack(">QH", data[2:12])
    if size is None:
        fail("NBD_OPT_GO ended without NBD_INFO_EXPORT")
    return size, flags


HANDLE = [100]


def request(s, cmd, offset, length, payload=b"", flags=0, structured=False):
    """Send one request; return (error, data). error 0 = success."""
    HANDLE[0] += 1
    h = HANDLE[0]
    s.sendall(struct.pack(">IHHQQI", REQ_MAGIC, flags, cmd, h, offset, length) + payload)
    if not structured:
        magic, error, handle = struct.unpack(">IIQ", recv_exact(s, 16))
        if magic != SIMPLE_MAGIC or handle != h:
            fail("bad simple reply magic=%x handle=%d (sent %d)" % (magic, handle, h))
        data = b""
        if cmd == CMD_READ and error == 0:
            data = recv_exact(s, length)
        return error, data
    error, data = 0, bytearray()
    while True:
        first = recv_exact(s, 4)
        magic = struct.unpack(">I", first)[0]
        if magic == SIMPLE_MAGIC:
            error, handle = struct.unpack(">IQ", recv_exact(s, 12))
            return error, bytes(data)
        if magic != CHUNK_MAGIC:
            fail("bad reply magic %x" % magic)
        cflags, ctype, handle, clen = struct.unpack(">HHQI", recv_exact(s, 16))
        body = recv_exact(s, clen)
        if handle != h:
            fail("reply for handle %d, expected %d" % (handle, h))
        if ctype & 0x8000:
            error = struct.unpack(">I", body[:4])[0] or 5
        elif ctype == 1:  # OFFSET_DATA
            data += body[8:]
        elif ctype == 2:  # OFFSET_HOLE
            data += bytes(struct.unpack(">QI", body)[1])
        if cflags & 1:
            return error, bytes(data)


def expect_closed_or_quiet(s, seconds=5):
    s.settimeout(seconds)
    try:
        while s.recv(65536):
            pass
    except (socket.timeout, ConnectionResetError):
        pass


def case_garbage():
    s = connect()
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256)) * 16)
    expect_closed_or_quiet(s)


def case_half_greeting():
    s = connect()
    s.recv(5)
    s.close()


def case_silent_close():
    connect().close()


def case_bad_client_flags():
    s = connect()
    greet(s, client_flags=0xFFFFFFFC)
    s.settimeout(10)
    try:
        data = s.recv(100)
    except ConnectionResetError:
        data = b""
    if data:
        fail("server kept talking after unknown client flags: %r" % data[:40])


def case_truncated_option():
    s = connect()
    greet(s)
    s.sendall(OPT_MAGIC + b"\x00\x00\x00")
    s.close()


def case_bad_option_magic():
    s = connect()
    greet(s)
    s.sendall(b"NOTAMAGC" + struct.pack(">II", OPT_GO, 0))
    expect_closed_or_quiet(s)


def case_huge_option_length():
    s = connect()
    greet(s)
    s.sendall(OPT_MAGIC + struct.pack(">II", OPT_GO, 0xFFFFFFF0) + b"\x00" * 100)
    expect_closed_or_quiet(s, 10)


def case_huge_name_length():
    s = connect()
    greet(s)
    send_opt(s, OPT_GO, struct.pack(">I", 0xFFFFFFFF) + b"raw" + struct.pack(">H", 0))
    s.settimeout(10)
    try:
        _, typ, _ = read_rep(s)
    except (Closed, ConnectionResetError, socket.timeout):
        return
    if not typ & 0x80000000:
        fail("GO with name length 0xffffffff in a 9-byte option was accepted (reply %x)" % typ)


def case_unknown_option():
    s = connect()
    greet(s)
    send_opt(s, 0x7777, b"hello")
    _, typ, _ = read_rep(s)
    if typ != 0x80000001:
        fail("unknown option answered with %x, expected NBD_REP_ERR_UNSUP" % typ)
    send_opt(s, OPT_ABORT)
    try:
        read_rep(s)
    except (Closed, ConnectionResetError):
        pass


def case_unknown_export():
    s = connect()
    size, typ = go(s, name=b"no-such-export-\xff")
    if size is not None:
        fail("NBD_OPT_GO to a missing export succeeded")
    send_opt(s, OPT_ABORT)


def case_export_name_missing():
    s = connect()
    greet(s)
    send_opt(s, OPT_EXPORT_NAME, b"no-such-export")
    expect_closed_or_quiet(s)


def case_many_connections():
    socks = [connect() for _ in range(64)]
    for s in socks:
        recv_exact(s, 18)
    for s in socks:
        s.close()


def first_reply_is_error(s, h):
    """Read the reply to request h only as far as needed: True for an error, False as soon as
    the server starts to answer with data (we never read gigabytes of it)."""
    error = None
    while True:
        magic = struct.unpack(">I", recv_exact(s, 4))[0]
        if magic == SIMPLE_MAGIC:
            err, handle = struct.unpack(">IQ", recv_exact(s, 12))
            return err != 0, err
        if magic != CHUNK_MAGIC:
            fail("bad reply magic %x" % magic)
        cflags, ctype, handle, clen = struct.unpack(">HHQI", recv_exact(s, 16))
        if handle != h:
            fail("reply for handle %d, expected %d" % (handle, h))
        if not ctype & 0x8000 and ctype != 0:
            return False, 0
        body = recv_exact(s, clen)
        if ctype & 0x8000:
            error = struct.unpack(">I", body[:4])[0]
        if cflags & 1:
            return error is not None, error or 0


def case_huge_read(structured):
    huge = os.environ.get("HUGE_EXPORT", "huge").encode()
    s = connect()
    size, flags = go(s, name=huge, structured=structured)
    if size is None:
        fail("cannot open export %r" % huge)
    cases = ((0, 0xFFFFFFFF), (4096, 0x80000000), (size - 1, 0xFFFFFFFF), (size, 1))
    for off, length in cases:
        HANDLE[0] += 1
        s.sendall(struct.pack(">IHHQQI", REQ_MAGIC, 0, CMD_READ, HANDLE[0], off, length))
        try:
            is_error, error = first_reply_is_error(s, HANDLE[0])
        except Closed as e:
            fail("read of %#x bytes at %d: %s (expected an error reply)" % (length, off, e))
        if not is_error:
            fail("read of %#x bytes at offset %d of a %d-byte export was answered with data; "
                 "expected EINVAL/EOVERFLOW (beyond the advertised maximum block size)"
                 % (length, off, size))
        print("read of %#x bytes at %d -> error %d" % (length, off, error))
    error, data = request(s, CMD_READ, 0, 4096, structured=structured)
    if error or len(data) != 4096:
        fail("a normal read after the huge ones failed (error %d)" % error)
    request_disc(s)


def request_disc(s):
    s.sendall(struct.pack(">IHHQQI", REQ_MAGIC, 0, CMD_DISC, 1, 0, 0))
    s.close()


def case_beyond_end():
    s = connect()
    size, _ = go(s)
    error, _ = request(s, CMD_READ, size - 1, 2)
    if error == 0:
        fail("read across the end of the export succeeded")
    error, _ = request(s, CMD_READ, 1 << 62, 512)
    if error == 0:
        fail("read at offset 2^62 succeeded")
    error, _ = request(s, CMD_WRITE, size, 4096, payload=b"\x01" * 4096)
    if error == 0:
        fail("write past the end of the export succeeded")
    error, _ = request(s, CMD_TRIM, size - 4096, 8192)
    if error == 0:
        fail("trim across the end of the export succeeded")
    error, _ = request(s, 0x55, 0, 512)
    if error == 0:
        fail("unknown command 0x55 succeeded")
    # Still in step after all of those (the write payload was consumed).
    error, data = request(s, CMD_READ, 0, 4096)
    if error or data != bytes(4096):
        fail("normal read after the bad requests failed or returned non-zero bytes")
    request_disc(s)


def case_bad_request_magic():
    s = connect()
    go(s)
    s.sendall(struct.pack(">IHHQQI", 0xDEADBEEF, 0, CMD_READ, 1, 0, 512))
    expect_closed_or_quiet(s)


def case_truncated_write():
    s = connect()
    go(s)
    s.sendall(struct.pack(">IHHQQI", REQ_MAGIC, 0, CMD_WRITE, 7, 1 << 20, 65536) + b"\x02" * 1000)
    s.close()


def case_edges():
    """Whole-export TRIM and WRITE_ZEROES on a never-written export, zero-length requests and
    last-byte requests all succeed."""
    s = connect()
    size, flags = go(s)
    if size > 0xFFFFFFFF:
        fail("edges export too large for one request: %d" % size)
    for name, cmd in (("TRIM", CMD_TRIM), ("WRITE_ZEROES", CMD_ZERO)):
        error, _ = request(s, cmd, 0, size)
        if error:
            fail("%s of the whole %d-byte never-written export: error %d" % (name, size, error))
    zero_len = set()
    for off in (0, size - 1, size):
        for name, cmd, payload in (("READ", CMD_READ, b""), ("WRITE", CMD_WRITE, b""),
                                   ("TRIM", CMD_TRIM, b""), ("WRITE_ZEROES", CMD_ZERO, b"")):
            # The NBD spec leaves zero-length requests unspecified (nbdkit answers EINVAL, or
            # ENOSPC for writes; libnbd refuses to send them by default): success or one of
            # those errors, and the connection must stay in step.
            error, data = request(s, cmd, off, 0, payload)
            if error not in (0, 22, 28) or data:
                fail("zero-length %s at offset %d: error %d, %d bytes" % (name, off, error, len(data)))
            zero_len.add("%s=%s" % (name, {0: "ok", 22: "EINVAL", 28: "ENOSPC"}[error]))
    print("zero-length requests: " + " ".join(sorted(zero_len)))
    error, _ = request(s, CMD_FLUSH, 0, 0)
    if error:
        fail("FLUSH: error %d" % error)
    error, data = request(s, CMD_READ, size - 1, 1)
    if error or data != b"\x00":
        fail("read of the last byte of a never-written export: error %d data %r" % (error, data))
    error, _ = request(s, CMD_WRITE, size - 1, 1, b"\x7e", flags=1)  # FUA
    if error:
        fail("FUA write of the last byte: error %d" % error)
    error, data = request(s, CMD_READ, size - 1, 1)
    if error or data != b"\x7e":
        fail("last byte reads back %r (error %d), expected 0x7e" % (data, error))
    error, data = request(s, CMD_READ, size - 4096, 4096)
    if error or data != bytes(4095) + b"\x7e":
        fail("the last 4 KiB do not read back as zeroes + 0x7e")
    request_disc(s)


cases = {
    "garbage": case_garbage,
    "half_greeting": case_half_greeting,
    "silent_close": case_silent_close,
    "bad_client_flags": case_bad_client_flags,
    "truncated_option": case_truncated_option,
    "bad_option_magic": case_bad_option_magic,
    "huge_option_length": case_huge_option_length,
    "huge_name_length": case_huge_name_length,
    "unknown_option": case_unknown_option,
    "unknown_export": case_unknown_export,
    "export_name_missing": case_export_name_missing,
    "many_connections": case_many_connections,
    "huge_read_simple": lambda: case_huge_read(False),
    "huge_read_structured": lambda: case_huge_read(True),
    "beyond_end": case_beyond_end,
    "bad_request_magic": case_bad_request_magic,
    "truncated_write": case_truncated_write,
    "edges": case_edges,
}
if sys.argv[1] == "list":
    print(" ".join(cases))
    sys.exit(0)
try:
    cases[sys.argv[1]]()
except Closed as e:
    fail(str(e))
except socket.timeout:
    fail("timed out waiting for the server")
PY
}

nbdraw() { EXPORT="${EXPORT:-raw}" timeout 120 "$BUCKETFS_TEST_PYTHON" "$TEST_DIR/nbdraw.py" "$@"; }

# The server must still be up and serving a fresh client correctly.
assert_serving() {
    local why="$1"
    bucketfs_alive || die "bucketfs died after: $why"
    timeout 30 nbdinfo "$(nbd_uri raw)" >/dev/null 2>&1 || die "nbdinfo fails after: $why"
    qio raw 'read -P 0x61 1048576 65536' || die "data of export raw is wrong after: $why"
    qio raw 'write -P 0x63 2097152 4096' 'flush' 'read -P 0x63 2097152 4096' ||
        die "export raw does not take a write + flush after: $why"
}

check_wrong_password() {
    local before after rc=0 out cfg="$CASE_DIR/wrongpw.toml"
    log "wrong password"
    before="$(bucket_tool fingerprint)"
    sed 's/^encryption_password = .*/encryption_password = "not-the-password"/' "$CONFIG" >"$cfg"
    out="$(timeout 60 "$BUCKETFS" run -c "$cfg" 2>&1)" || rc=$?
    ((rc != 124)) || die "bucketfs run with a wrong password did not exit within 60 s"
    ((rc != 0)) || die "bucketfs run with a wrong password exited 0: $out"
    grep -qi password <<<"$out" || die "wrong-password error does not mention 'password': $out"
    after="$(bucket_tool fingerprint)"
    [[ "$before" == "$after" ]] || die "bucketfs run with a wrong password changed the bucket"
    log "wrong password refused (exit $rc): $(tail -n 1 <<<"$out")"
}

check_second_writer() {
    local cfg="$CASE_DIR/second/bucketfs.toml" rc=0 out start
    log "second bucketfs run on the same bucket"
    mkdir -p "$CASE_DIR/second"
    cp "$CONFIG" "$cfg"
    config_set "$cfg" cache dir "\"$CASE_DIR/second/cache\""
    config_set "$cfg" servers.nbd listen "[\"127.0.0.1:$(pick_unused_port)\"]"
    start=$SECONDS
    out="$(timeout 60 "$BUCKETFS" run -c "$cfg" 2>&1)" || rc=$?
    ((rc != 124)) || die "a second bucketfs run on a bucket in use did not exit within 60 s"
    ((rc != 0)) || die "a second bucketfs run on a bucket in use exited 0"
    grep -qi 'in use' <<<"$out" || die "second writer's error does not say 'in use': $out"
    ((SECONDS - start <= 30)) || die "second writer took $((SECONDS - start)) s to fail (not fast)"
    log "second writer refused in $((SECONDS - start)) s: $(tail -n 1 <<<"$out")"
    assert_serving "a second writer was refused"
}

check_bad_config() {
    local cfg="$CASE_DIR/badkey.toml" rc=0 out
    log "malformed config"
    cp "$CONFIG" "$cfg"
    config_set "$cfg" storage flush_intervall_ms 100
    out="$(timeout 30 "$BUCKETFS" run -c "$cfg" 2>&1)" || rc=$?
    ((rc != 0 && rc != 124)) || die "bucketfs run -c with an unknown key did not fail (exit $rc)"
    grep -q flush_intervall_ms <<<"$out" || die "config error does not name the key: $out"
    grep -qF "$cfg" <<<"$out" || grep -qF badkey.toml <<<"$out" ||
        die "config error does not name the file: $out"
    # A value of the wrong type.
    cp "$CONFIG" "$cfg"
    config_set "$cfg" storage flush_interval_ms '"soon"'
    rc=0
    out="$(timeout 30 "$BUCKETFS" run -c "$cfg" 2>&1)" || rc=$?
    ((rc != 0 && rc != 124)) || die "bucketfs run -c with flush_interval_ms = \"soon\" did not fail"
    grep -q flush_interval_ms <<<"$out" || die "type error does not name the key: $out"
    # Not TOML at all.
    printf '[storage\nurl = \n' >"$cfg"
    rc=0
    out="$(timeout 30 "$BUCKETFS" run -c "$cfg" 2>&1)" || rc=$?
    ((rc != 0 && rc != 124)) || die "bucketfs run -c with a broken TOML file did not fail"
    grep -qF badkey.toml <<<"$out" || die "TOML syntax error does not name the file: $out"
}

check_protocol_abuse() {
    local c
    for c in $(nbdraw list); do
        [[ "$c" == edges ]] && continue
        log "raw NBD: $c"
        nbdraw "$c" || die "raw NBD case '$c' failed"
        assert_serving "raw NBD case '$c'"
    done
}

check_edges() {
    local size
    log "whole-export TRIM / WRITE_ZEROES, zero-length and last-byte requests"
    create_export edges 1G
    EXPORT=edges nbdraw edges || die "edge-case requests failed"
    assert_serving "edge-case requests"
    # The same through qemu-io on another never-written export.
    create_export edges2 1G
    size="$(export_size edges2)"
    qio edges2 "discard 0 $size" "write -z 0 $size" 'flush' \
        "read -P 0 $((size - 1)) 1" "read -P 0 0 65536" 'read 0 0' ||
        die "qemu-io whole-export discard / write -z failed"
}

check_corruption() {
    local src="$CASE_DIR/corrupt.img" key out
    log "corrupted data object"
    create_export victim 64M
    head -c 8M /dev/urandom >"$src"
    timeout "$BUCKETFS_CLIENT_TIMEOUT" nbdcopy --flush "$src" "$(nbd_uri victim)" ||
        die "nbdcopy into victim failed"
    # fsck --repair needs the writer lock: refused while the server runs (exit status 2).
    local rc=0
    out="$(bfs fsck --repair 2>&1)" || rc=$?
    [[ "$rc" == 2 ]] || die "fsck --repair beside a running server: exit $rc, expected 2: $out"
    grep -qi 'writer' <<<"$out" || die "fsck --repair beside a running server: unclear refusal: $out"
    stop_bucketfs
    out="$(bfs fsck)" || die "fsck of an undamaged bucket failed: $out"
    grep -q '^clean: ' <<<"$out" || die "fsck of an undamaged bucket: $out"
    log "fsck before the damage: $out"
    # shellcheck disable=SC2086 # the prefixes are a list
    key="$(bucket_tool largest $BUCKETFS_DATA_PREFIXES)" || {
        bucket_tool ls >&2
        die "no data object under '$BUCKETFS_DATA_PREFIXES' in the bucket (listing above)"
    }
    bucket_tool corrupt "$key" >&2
    rc=0
    out="$(bfs fsck)" || rc=$?
    log "fsck after the damage (exit $rc): $(tail -n 1 <<<"$out")"
    [[ "$rc" == 1 ]] || die "fsck of a corrupted bucket: exit $rc, expected 1: $out"
    grep -q "^DAMAGED log/${key##*/}: " <<<"$out" || die "fsck does not name the corrupted object $key: $out"
    rc=0
    out="$(bfs fsck --json)" || rc=$?
    "$BUCKETFS_TEST_PYTHON" -c 'import json, sys; r = json.load(sys.stdin); sys.exit(0 if r["problems"] and r["extents_damaged"] > 0 else 1)' <<<"$out" ||
        die "fsck --json of a corrupted bucket does not report the damage: $out"
    rm -rf "$CACHE_DIR"
    start_bucketfs "$CONFIG"
    # Read every 4 KiB block: each must be either exactly what was written or an error.
    cat >"$CASE_DIR/scan.py" <<'PY'
import sys
import nbd

h = nbd.NBD()
h.set_strict_mode(0)
h.connect_uri(sys.argv[1])
want = open(sys.argv[2], "rb").read()
bad = errors = 0
for off in range(0, len(want), 4096):
    try:
        got = h.pread(4096, off)
    except nbd.Error:
        errors += 1
        continue
    if got != want[off:off + 4096]:
        bad += 1
        print("WRONG BYTES at offset %d" % off)
print("blocks=%d errors=%d wrong=%d" % (len(want) // 4096, errors, bad))
sys.exit(2 if bad else (0 if errors else 3))
PY
    rc=0
    out="$(timeout 300 "$NBD_PYTHON" "$CASE_DIR/scan.py" "$(nbd_uri victim)" "$src" 2>&1)" || rc=$?
    log "scan after corrupting $key: $(tail -n 1 <<<"$out")"
    case "$rc" in
    0) ;;
    2) die "reads of a corrupted object returned WRONG BYTES: $out" ;;
    3) die "no read failed after corrupting $key (the corruption went unnoticed): $out" ;;
    *) die "scan of the corrupted export failed: $out" ;;
    esac
    out="$(qio_output victim 'read 0 8M')"
    grep -q 'Input/output error' <<<"$out" ||
        die "qemu-io read of the corrupted range did not report an I/O error: $out"
    bucketfs_log_current | grep -iE 'corrupt|authenticat|integrity|checksum|decrypt|tamper' >/dev/null ||
        die "the server log does not mention the corruption of $key"
    bucketfs_alive || die "bucketfs died reading a corrupted object"
    qio raw 'read -P 0x61 1048576 65536' 'write -P 0x62 4194304 4096' 'read -P 0x62 4194304 4096' ||
        die "server does not keep serving other exports after meeting a corrupted object"
    rm -f "$src"
}

run_case() {
    write_nbdraw
    make_config "$CASE_DIR" "$BACKEND"
    start_bucketfs "$CONFIG"
    create_export raw 256M
    qio raw 'write -P 0x61 1048576 65536' 'flush' || die "initial write failed"
    stop_bucketfs

    check_wrong_password
    check_bad_config

    start_bucketfs "$CONFIG"
    create_export huge 8G
    check_second_writer
    check_protocol_abuse
    check_edges
    check_corruption
    stop_bucketfs
}

for_each_backend run_case
