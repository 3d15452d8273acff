# shellcheck shell=bash
# tests/lib.sh — helpers for bucketfs's end-to-end shell tests.
#
# Source it from a test script:
#
#     #!/usr/bin/env bash
#     set -euo pipefail
#     source "$(dirname "$0")/lib.sh"
#     run_case() { make_config "$CASE_DIR" "$BACKEND"; start_bucketfs "$CONFIG"; ...; }
#     for_each_backend run_case
#
# The test then runs once per backend named in BUCKETFS_TEST_BACKENDS (default "file s3"), each
# in a subshell with its own directory, bucket, ports and server. It exits 0 when every backend
# passed, 77 when every backend was skipped, 1 otherwise. Everything it started is stopped on exit.
#
# This interface is stable (other test scripts, e.g. tests/postgres.sh, build on it).
#
# Environment read by the library
#   BUCKETFS                   path of the binary (default $CARGO_TARGET_DIR or target/ +
#                              /release/bucketfs)
#   BUCKETFS_TEST_BACKENDS     which bucket kinds to run over: "file", "s3" or both (default "file s3")
#   CI                         when set, a missing tool fails the test instead of skipping it
#   BUCKETFS_TEST_KEEP=1       keep the test directory after the run (its path is printed)
#   BUCKETFS_TEST_TMPDIR       where test directories are created (default /tmp)
#   BUCKETFS_START_TIMEOUT     seconds start_bucketfs waits for the server (default 60)
#   BUCKETFS_STOP_TIMEOUT      seconds stop_bucketfs waits after SIGTERM (default 60)
#   BUCKETFS_CLIENT_TIMEOUT    seconds any one client command may take (default 600)
#   BUCKETFS_DATA_PREFIXES     bucket prefixes that hold file-data objects (default "segments/ log/")
#   BUCKETFS_TEST_PYTHON       python with boto3/moto (default python3)
#   BUCKETFS_TEST_S3_TLS=1     serve moto over HTTPS with a throwaway CA (default: plain HTTP
#                              with aws.allow_http = true)
#   BUCKETFS_TEST_S3_SERVER    the S3 server start_moto runs: "moto" (default) or the path of an
#                              s3s-fs binary (bench/setup builds one), an S3 server in
#                              Rust over a directory, fast enough that the benchmarks' emulated
#                              link, not the emulator, sets the pace of many small requests
#
# Variables set for the test
#   REPO_ROOT, TESTS_DIR       the repository and its tests/ folder
#   TEST_NAME                  basename of the test script without .sh
#   TEST_DIR                   fresh temporary directory of this test run (removed on exit)
#   BACKEND, CASE_DIR          inside for_each_backend: the backend ("file"|"s3") and its own dir
#   CONFIG, CONFIG_DIR         set by make_config: the config file and the directory holding it
#   NBD_PORT                   set (and exported) by make_config: the NBD port in that config
#   ADMIN_SOCKET               set by make_config: the admin endpoint's unix socket (the
#                              default, admin.sock in cache.dir; a second server given a copy of
#                              the config needs an admin.socket of its own)
#   BUCKET_URL                 set by make_config: storage.url
#   BUCKET_DIR                 set by make_config for the file backend: the bucket directory
#   S3_BUCKET, S3_PREFIX       set by make_config for s3: the bucket and the key prefix
#   CACHE_DIR                  set by make_config: cache.dir
#   BUCKETFS_PID, BUCKETFS_LOG set by start_bucketfs
#   MOTO_PORT, S3_ENDPOINT     set (and exported) by start_moto
#
# Functions
#   log MSG...                 print a progress line to stderr
#   die MSG...                 print "FAIL: MSG" (with the bucketfs log tail) and exit 1
#   skip MSG...                print "SKIP: MSG" and exit 77
#   requires TOOL...           each TOOL must be on PATH: else skip (fail when $CI is set)
#   requires_python_module M   the python of BUCKETFS_TEST_PYTHON must import M (same rule)
#   requires_nbdsh             nbdsh must work (uses Debian's /usr/bin/python3 with libnbd)
#   pick_unused_port           print a free TCP port on 127.0.0.1
#   make_config DIR [file|s3]  write DIR/bucketfs.toml with fresh ports; sets the variables above.
#                              Knobs (env, read when called): TEST_PASSWORD, FLUSH_INTERVAL_MS,
#                              COMPRESSION, CACHE_DISK_BYTES_MAX, CACHE_MEMORY_BYTES_MAX,
#                              BUCKET_URL_OVERRIDE (reuse an existing bucket/prefix)
#   config_set FILE SECTION KEY VALUE
#                              set KEY = VALUE (VALUE is raw TOML, quote strings yourself) in
#                              [SECTION] of FILE, adding the key or the section when missing
#   start_bucketfs CONFIG [ARGS...]
#                              run "bucketfs run -c CONFIG ARGS" in the background, logging to
#                              $(dirname CONFIG)/bucketfs.log; waits until `bucketfs status`
#                              answers and the NBD port accepts; dies with the log on failure
#   stop_bucketfs              SIGTERM, wait, require exit status 0
#   kill9_bucketfs             SIGKILL and reap
#   bucketfs_alive             true while the server started by start_bucketfs runs
#   bucketfs_log_current       print the part of $BUCKETFS_LOG written by the latest start
#   bfs ARGS...                run "$BUCKETFS ARGS -c $CONFIG" (admin commands: nbd ..., status)
#   create_export NAME SIZE    bucketfs nbd create NAME --size SIZE
#   nbd_uri NAME               print nbd://127.0.0.1:$NBD_PORT/NAME
#   export_size NAME           print the export's size in bytes (via nbdinfo --size)
#   qio NAME CMD...            qemu-io -f raw on the export, one -c per CMD; fails (printing the
#                              output) when qemu-io fails or reports a verification failure.
#                              QIO_OPTS (env, word-split) adds options, e.g. QIO_OPTS="-t writeback"
#   qio_output NAME CMD...     the same, but never fails: prints qemu-io's output and its status
#                              on the last line as "qemu-io-exit=N"
#   run_nbdsh ARGS...          nbdsh (libnbd's python shell) with Debian's python
#   status_json                print `bucketfs status` output
#   object_store_counters      print the status object_store counters as one line
#   start_moto                 start moto_server on a free port, create bucket $S3_BUCKET
#   bucket_tool CMD [ARGS]     inspect the bucket of the current config, on either backend:
#                                ls                   "SIZE KEY" lines, sorted by key
#                                fingerprint          one hash over every key, size and content
#                                fetch OUTDIR         copy every object to OUTDIR/KEY
#                                largest PREFIX...    key of the largest object under the prefixes
#                                corrupt KEY          flip 64 bytes in the middle of KEY
#   attach_nbdfuse NAME DIR    expose the export as the file DIR/nbd (nbdfuse); sets NBDFUSE_FILE
#   attach_loop FILE           losetup FILE; sets LOOP_DEV
#   register_pid PID / register_mount DIR / register_loop DEV
#                              have the exit trap stop / unmount / detach it
#   for_each_backend FUNC      run FUNC once per backend (see above) and exit with the verdict
#   pid_alive PID              true if PID is running (not a zombie)
#   wait_for SECONDS CMD...    retry CMD every 0.2 s until it succeeds or SECONDS pass

# ---------------------------------------------------------------------------------------------
# Basics

TESTS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$TESTS_DIR/.." && pwd)"
TEST_NAME="$(basename "$0" .sh)"
BUCKETFS="${BUCKETFS:-${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release/bucketfs}"
BUCKETFS_TEST_BACKENDS="${BUCKETFS_TEST_BACKENDS:-file s3}"
BUCKETFS_START_TIMEOUT="${BUCKETFS_START_TIMEOUT:-60}"
BUCKETFS_STOP_TIMEOUT="${BUCKETFS_STOP_TIMEOUT:-60}"
BUCKETFS_CLIENT_TIMEOUT="${BUCKETFS_CLIENT_TIMEOUT:-600}"
BUCKETFS_DATA_PREFIXES="${BUCKETFS_DATA_PREFIXES:-segments/ log/}"
BUCKETFS_TEST_PYTHON="${BUCKETFS_TEST_PYTHON:-python3}"
# Debian's libnbd python bindings live in the system python, whatever python3 is first on PATH.
NBD_PYTHON="${NBD_PYTHON:-/usr/bin/python3}"
S3_BUCKET="${S3_BUCKET:-bucketfs-test}"
export BUCKETFS

BACKEND="${BACKEND:-}"
CASE_DIR="${CASE_DIR:-}"
CONFIG=""
CONFIG_DIR=""
BUCKET_URL=""
BUCKET_DIR=""
S3_PREFIX=""
CACHE_DIR=""
ADMIN_SOCKET=""
BUCKETFS_PID=""
BUCKETFS_LOG=""
MOTO_PID=""
NBDFUSE_FILE=""
LOOP_DEV=""

# Trace failing commands: with errexit a bare failure would otherwise exit silently.
set -E
trap '_lib_on_err $? "$LINENO" "$BASH_COMMAND"' ERR
_lib_on_err() {
    echo "FAIL: ${TEST_NAME}${BACKEND:+ [$BACKEND]}: command exited $1 at line $2: $3" >&2
}

log() { echo "[$(date +%H:%M:%S)] ${TEST_NAME}${BACKEND:+ [$BACKEND]}: $*" >&2; }

_print_server_logs() {
    local f
    local root="${CASE_DIR:-${TEST_DIR:-}}"
    [[ -n "$root" && -d "$root" ]] || return 0
    while IFS= read -r f; do
        echo "----- last 60 lines of $f -----" >&2
        tail -n 60 "$f" >&2 || true
    done < <(find "$root" -name bucketfs.log 2>/dev/null | sort)
}

die() {
    trap - ERR
    echo "FAIL: ${TEST_NAME}${BACKEND:+ [$BACKEND]}: $*" >&2
    _print_server_logs
    exit 1
}

skip() {
    echo "SKIP: ${TEST_NAME}${BACKEND:+ [$BACKEND]}: $*" >&2
    exit 77
}

_missing() {
    if [[ -n "${CI:-}" ]]; then
        die "$* (CI is set, so this is a failure: scripts/setup installs it)"
    fi
    skip "$* (run scripts/setup to install it)"
}

requires() {
    local tool
    for tool in "$@"; do
        command -v "$tool" >/dev/null 2>&1 || _missing "required tool '$tool' is not installed"
    done
}

requires_python_module() {
    local module
    for module in "$@"; do
        "$BUCKETFS_TEST_PYTHON" -c "import $module" >/dev/null 2>&1 ||
            _missing "python module '$module' is missing for $BUCKETFS_TEST_PYTHON"
    done
}

requires_nbdsh() {
    "$NBD_PYTHON" -c 'import nbd' >/dev/null 2>&1 ||
        _missing "python3-libnbd (module nbd for $NBD_PYTHON) is not installed"
}

run_nbdsh() { timeout "$BUCKETFS_CLIENT_TIMEOUT" "$NBD_PYTHON" -m nbd "$@"; }

pid_alive() {
    local state
    [[ -r "/proc/$1/stat" ]] || return 1
    # Field 3 of /proc/PID/stat is the state; a zombie has exited already.
    state="$(sed -E 's/^.*\) ([A-Za-z]).*$/\1/' "/proc/$1/stat" 2>/dev/null)" || return 1
    [[ "$state" != "Z" && "$state" != "X" ]]
}

wait_for() {
    local seconds="$1" deadline
    shift
    deadline=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || return 1
        sleep 0.2
    done
}

pick_unused_port() {
    # Bind port 0 and let the kernel choose; remember what we handed out so two calls in one
    # test never return the same port even before the first one is bound.
    local port
    while :; do
        port="$(/usr/bin/python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')"
        if [[ -z "${TEST_DIR:-}" ]] || ! grep -qx "$port" "$TEST_DIR/.ports" 2>/dev/null; then
            break
        fi
    done
    [[ -n "${TEST_DIR:-}" ]] && echo "$port" >>"$TEST_DIR/.ports"
    echo "$port"
}

# ---------------------------------------------------------------------------------------------
# Test directory and cleanup. Registries are files so that subshells (one per backend) can add
# to them and the exit trap of the main shell still sees everything.

TEST_DIR="$(mktemp -d "${BUCKETFS_TEST_TMPDIR:-/tmp}/bucketfs-${TEST_NAME}.XXXXXX")"
touch "$TEST_DIR/.start" "$TEST_DIR/.pids" "$TEST_DIR/.mounts" "$TEST_DIR/.loops" "$TEST_DIR/.ports"
_LIB_MAIN_PID=$BASHPID

register_pid() { echo "$1" >>"$TEST_DIR/.pids"; }
register_mount() { echo "$1" >>"$TEST_DIR/.mounts"; }
register_loop() { echo "$1" >>"$TEST_DIR/.loops"; }

_stop_pid() {
    local pid="$1" i
    pid_alive "$pid" || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < 100; i++)); do
        pid_alive "$pid" || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
}

_lib_cleanup() {
    local rc=$? m dev pid
    trap - ERR
    # Only the main shell cleans up; a backend subshell exiting must not tear down the others.
    [[ "$BASHPID" == "$_LIB_MAIN_PID" ]] || return 0
    set +e
    # Filesystems first (deepest path first), then loop devices, then FUSE mounts and processes.
    while IFS= read -r m; do
        [[ -n "$m" ]] || continue
        umount "$m" 2>/dev/null || fusermount3 -u "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
    done < <(awk -v d="$TEST_DIR" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r)
    while IFS= read -r dev; do
        [[ -n "$dev" ]] && losetup -d "$dev" 2>/dev/null
    done < <(tac "$TEST_DIR/.loops"; losetup -n -O NAME,BACK-FILE 2>/dev/null |
        awk -v d="$TEST_DIR" 'index($2, d) == 1 { print $1 }')
    while IFS= read -r m; do
        [[ -n "$m" ]] || continue
        fusermount3 -u "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
    done < <(awk -v d="$TEST_DIR" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r)
    while IFS= read -r pid; do
        [[ -n "$pid" ]] && _stop_pid "$pid"
    done < <(tac "$TEST_DIR/.pids")
    if [[ "${BUCKETFS_TEST_KEEP:-}" == 1 ]]; then
        echo "kept test directory $TEST_DIR" >&2
    else
        rm -rf "$TEST_DIR"
    fi
    exit "$rc"
}
trap _lib_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------------------------------------
# Configuration

# Portable TOML editing for the simple "key = value" files we write (and bucketfs init writes).
config_set() {
    local file="$1" section="$2" key="$3" value="$4" tmp
    tmp="$(mktemp "$file.XXXXXX")"
    awk -v sec="[$section]" -v key="$key" -v val="$value" '
        function emit() { print key " = " val; done = 1 }
        {
            line = $0
            trimmed = line; sub(/^[ \t]+/, "", trimmed); sub(/[ \t]+$/, "", trimmed)
            if (trimmed ~ /^\[/) {
                if (insec && !done) emit()
                insec = (trimmed == sec)
                if (insec) seen = 1
                print line
                next
            }
            if (insec && !done) {
                k = trimmed; sub(/[ \t]*=.*/, "", k)
                if (k == key && trimmed ~ /=/) { emit(); next }
            }
            print line
        }
        END {
            if (insec && !done) emit()
            else if (!seen) { print ""; print sec; emit() }
        }' "$file" >"$tmp"
    mv "$tmp" "$file"
}

make_config() {
    local dir="$1" kind="${2:-${BACKEND:-file}}" rel
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    CONFIG_DIR="$dir"
    CONFIG="$dir/bucketfs.toml"
    CACHE_DIR="$dir/cache"
    NBD_PORT="$(pick_unused_port)"
    NINEP_PORT="$(pick_unused_port)"
    NFS_PORT="$(pick_unused_port)"
    ADMIN_SOCKET="$CACHE_DIR/admin.sock"
    export NBD_PORT NINEP_PORT NFS_PORT
    BUCKET_DIR=""
    S3_PREFIX=""
    case "$kind" in
    file)
        if [[ -n "${BUCKET_URL_OVERRIDE:-}" ]]; then
            BUCKET_URL="$BUCKET_URL_OVERRIDE"
        else
            BUCKET_URL="file://$dir/bucket"
        fi
        BUCKET_DIR="${BUCKET_URL#file://}"
        mkdir -p "$BUCKET_DIR"
        ;;
    s3)
        [[ -n "${S3_ENDPOINT:-}" ]] || die "make_config s3: start_moto has not run"
        if [[ -n "${BUCKET_URL_OVERRIDE:-}" ]]; then
            BUCKET_URL="$BUCKET_URL_OVERRIDE"
        else
            rel="${dir#"$TEST_DIR"/}"
            BUCKET_URL="s3://$S3_BUCKET/$(basename "$TEST_DIR")/${rel//\//-}"
        fi
        S3_PREFIX="${BUCKET_URL#s3://"$S3_BUCKET"/}"
        ;;
    *) die "make_config: unknown backend '$kind'" ;;
    esac
    {
        echo "# written by tests/lib.sh make_config for ${TEST_NAME} (${kind})"
        echo "[storage]"
        echo "url = \"$BUCKET_URL\""
        echo "encryption_password = \"${TEST_PASSWORD:-test-password-0123}\""
        echo "compression = \"${COMPRESSION:-zstd}\""
        echo "flush_interval_ms = ${FLUSH_INTERVAL_MS:-2000}"
        echo
        echo "[cache]"
        echo "dir = \"$CACHE_DIR\""
        echo "disk_bytes_max = \"${CACHE_DISK_BYTES_MAX:-2GiB}\""
        echo "memory_bytes_max = \"${CACHE_MEMORY_BYTES_MAX:-256MiB}\""
        if [[ "$kind" == s3 ]]; then
            echo
            echo "[aws]"
            echo "access_key_id = \"testing\""
            echo "secret_access_key = \"testing\""
            echo "region = \"us-east-1\""
            echo "endpoint = \"$S3_ENDPOINT\""
            [[ "$S3_ENDPOINT" == https:* ]] || echo "allow_http = true"
        fi
        echo
        echo "[servers.nbd]"
        echo "listen = [\"127.0.0.1:$NBD_PORT\"]"
        echo
        echo "[servers.ninep]"
        echo "listen = [\"127.0.0.1:$NINEP_PORT\"]"
        echo
        echo "[servers.nfs]"
        echo "listen = [\"127.0.0.1:$NFS_PORT\"]"
    } >"$CONFIG"
}

# ---------------------------------------------------------------------------------------------
# The server

_require_binary() {
    [[ -x "$BUCKETFS" ]] ||
        die "bucketfs binary not found at $BUCKETFS (run: cargo build --release, or scripts/setup)"
}

bfs() {
    _require_binary
    timeout "$BUCKETFS_CLIENT_TIMEOUT" "$BUCKETFS" "$@" -c "$CONFIG"
}

# Writes to DST a copy of the config SRC (from make_config) whose NBD, 9P and NFS listeners
# are on free ports of their own, for a second server beside the first; the NBD port is
# READER_NBD_PORT.
config_on_new_ports() {
    local src="$1" dst="$2"
    READER_NBD_PORT="$(pick_unused_port)"
    sed -e "s/127.0.0.1:$NBD_PORT\b/127.0.0.1:$READER_NBD_PORT/" \
        -e "s/127.0.0.1:$NINEP_PORT\b/127.0.0.1:$(pick_unused_port)/" \
        -e "s/127.0.0.1:$NFS_PORT\b/127.0.0.1:$(pick_unused_port)/" "$src" >"$dst"
}

_port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start_bucketfs() {
    local config="$1" deadline port
    shift
    _require_binary
    [[ -f "$config" ]] || die "start_bucketfs: no config $config"
    if [[ -n "$BUCKETFS_PID" ]] && pid_alive "$BUCKETFS_PID"; then
        die "start_bucketfs: a server (pid $BUCKETFS_PID) is already running; stop it first"
    fi
    BUCKETFS_LOG="$(dirname "$config")/bucketfs.log"
    echo "===== $(date '+%F %T') bucketfs run -c $config $* =====" >>"$BUCKETFS_LOG"
    "$BUCKETFS" run -c "$config" "$@" >>"$BUCKETFS_LOG" 2>&1 &
    BUCKETFS_PID=$!
    register_pid "$BUCKETFS_PID"
    deadline=$((SECONDS + BUCKETFS_START_TIMEOUT))
    while :; do
        if ! pid_alive "$BUCKETFS_PID"; then
            local rc=0
            wait "$BUCKETFS_PID" || rc=$?
            BUCKETFS_PID=""
            die "bucketfs run -c $config exited with status $rc during startup (log: $BUCKETFS_LOG)"
        fi
        port="$(_config_nbd_port "$config")"
        if timeout 10 "$BUCKETFS" status -c "$config" >/dev/null 2>&1 &&
            { [[ -z "$port" ]] || _port_open "$port"; }; then
            break
        fi
        ((SECONDS < deadline)) ||
            die "bucketfs did not answer 'status' within ${BUCKETFS_START_TIMEOUT}s (log: $BUCKETFS_LOG)"
        sleep 0.2
    done
    log "bucketfs running (pid $BUCKETFS_PID, nbd port $(_config_nbd_port "$config"))"
}

# The first NBD port of a config: the servers.nbd listen line.
_config_nbd_port() {
    awk '/^\[/ { insec = ($0 ~ /^\[servers\.nbd\]/) }
         insec && /^[ \t]*listen[ \t]*=/ { if (match($0, /:[0-9]+"/)) { print substr($0, RSTART + 1, RLENGTH - 2); exit } }' "$1"
}

# The log of the latest start_bucketfs (the log file keeps every run, each after a ===== line).
bucketfs_log_current() {
    awk '/^===== / { buf = "" } { buf = buf $0 "\n" } END { printf "%s", buf }' "$BUCKETFS_LOG"
}

bucketfs_alive() { [[ -n "$BUCKETFS_PID" ]] && pid_alive "$BUCKETFS_PID"; }

stop_bucketfs() {
    local pid="$BUCKETFS_PID" rc=0 deadline
    [[ -n "$pid" ]] || die "stop_bucketfs: no server was started"
    pid_alive "$pid" || {
        wait "$pid" 2>/dev/null || rc=$?
        BUCKETFS_PID=""
        die "stop_bucketfs: bucketfs (pid $pid) had already exited (status $rc)"
    }
    kill -TERM "$pid"
    deadline=$((SECONDS + BUCKETFS_STOP_TIMEOUT))
    while pid_alive "$pid"; do
        if ((SECONDS >= deadline)); then
            kill -KILL "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
            BUCKETFS_PID=""
            die "bucketfs did not exit within ${BUCKETFS_STOP_TIMEOUT}s of SIGTERM"
        fi
        sleep 0.1
    done
    wait "$pid" || rc=$?
    BUCKETFS_PID=""
    [[ "$rc" == 0 ]] || die "bucketfs exited with status $rc after SIGTERM (expected 0)"
    log "bucketfs stopped cleanly"
}

kill9_bucketfs() {
    local pid="$BUCKETFS_PID"
    [[ -n "$pid" ]] || die "kill9_bucketfs: no server was started"
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    BUCKETFS_PID=""
    log "bucketfs killed with SIGKILL"
}

create_export() {
    bfs nbd create "$1" --size "$2" >/dev/null || die "bucketfs nbd create $1 --size $2 failed"
}

nbd_uri() { echo "nbd://127.0.0.1:$NBD_PORT/$1"; }

export_size() {
    local size
    size="$(timeout 60 nbdinfo --size "$(nbd_uri "$1")")" || die "nbdinfo --size $(nbd_uri "$1") failed"
    echo "$size"
}

status_json() { bfs status; }

object_store_counters() {
    status_json | "$BUCKETFS_TEST_PYTHON" -c '
import json, sys
s = json.load(sys.stdin)["object_store"]
want = ["get", "put", "list", "delete", "bytes_read", "bytes_written"]
missing = [k for k in want if not isinstance(s.get(k), int)]
if missing:
    sys.exit("status object_store lacks integer counters: %s (got %s)" % (missing, s))
print(" ".join("%s=%s" % (k, s[k]) for k in sorted(s)))'
}

# ---------------------------------------------------------------------------------------------
# qemu-io

qio_output() {
    local name="$1" rc=0 out
    shift
    local args=() c
    for c in "$@"; do args+=(-c "$c"); done
    # shellcheck disable=SC2086 # QIO_OPTS is a list of options on purpose
    out="$(timeout "$BUCKETFS_CLIENT_TIMEOUT" qemu-io -f raw ${QIO_OPTS:-} "${args[@]}" "$(nbd_uri "$name")" 2>&1)" || rc=$?
    printf '%s\nqemu-io-exit=%s\n' "$out" "$rc"
}

qio() {
    local out
    out="$(qio_output "$@")"
    if [[ "${out##*qemu-io-exit=}" != 0 ]] ||
        grep -qE 'Pattern verification failed|failed:|[Ee]rror' <<<"$out"; then
        echo "qemu-io on $(nbd_uri "$1") failed; commands: ${*:2}" >&2
        echo "$out" >&2
        return 1
    fi
}

# ---------------------------------------------------------------------------------------------
# FUSE and loop devices (for tests that put a filesystem on an export)

attach_nbdfuse() {
    local name="$1" dir="$2" pid
    requires nbdfuse fusermount3
    mkdir -p "$dir"
    nbdfuse "$dir" "$(nbd_uri "$name")" >>"$dir.nbdfuse.log" 2>&1 &
    pid=$!
    register_pid "$pid"
    register_mount "$dir"
    wait_for 30 test -e "$dir/nbd" || die "nbdfuse did not expose $dir/nbd (see $dir.nbdfuse.log)"
    NBDFUSE_FILE="$dir/nbd"
}

attach_loop() {
    requires losetup
    LOOP_DEV="$(losetup --find --show "$1")" || die "losetup $1 failed"
    register_loop "$LOOP_DEV"
}

# ---------------------------------------------------------------------------------------------
# S3 (moto) and the bucket as stored

_write_bucket_tool() {
    cat >"$TEST_DIR/bucket_tool.py" <<'PY'
"""Inspect a bucketfs bucket, local directory or S3, the same way for both."""
import hashlib
import os
import sys

backend = os.environ["BUCKET_BACKEND"]
if backend == "s3":
    import boto3
    from botocore.config import Config

    s3 = boto3.client(
        "s3",
        endpoint_url=os.environ["S3_ENDPOINT"],
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 5}),
        verify=os.environ.get("S3_CA_BUNDLE") or None,
    )
    bucket = os.environ["S3_BUCKET"]
    prefix = os.environ.get("S3_PREFIX", "").strip("/")
    prefix = prefix + "/" if prefix else ""
else:
    root = os.environ["BUCKET_DIR"]


def objects():
    """(key, size) for every object, sorted by key."""
    out = []
    if backend == "s3":
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for o in page.get("Contents", []):
                out.append((o["Key"][len(prefix):], o["Size"]))
    else:
        for d, _, files in os.walk(root):
            for f in files:
                p = os.path.join(d, f)
                out.append((os.path.relpath(p, root), os.path.getsize(p)))
    return sorted(out)


def get(key):
    if backend == "s3":
        return s3.get_object(Bucket=bucket, Key=prefix + key)["Body"].read()
    with open(os.path.join(root, key), "rb") as f:
        return f.read()


def put(key, data):
    if backend == "s3":
        s3.put_object(Bucket=bucket, Key=prefix + key, Body=data)
    else:
        with open(os.path.join(root, key), "r+b") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


cmd, args = sys.argv[1], sys.argv[2:]
if cmd == "mkbucket":
    s3.create_bucket(Bucket=bucket)
elif cmd == "ls":
    for k, n in objects():
        print(n, k)
elif cmd == "fingerprint":
    h = hashlib.sha256()
    for k, n in objects():
        h.update(("%s %d %s\n" % (k, n, hashlib.sha256(get(k)).hexdigest())).encode())
    print(h.hexdigest())
elif cmd == "fetch":
    for k, _ in objects():
        dst = os.path.join(args[0], k)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "wb") as f:
            f.write(get(k))
elif cmd == "largest":
    best = None
    for k, n in objects():
        if any(k.startswith(p) or ("/" + p) in k for p in args) and (best is None or n > best[1]):
            best = (k, n)
    if best is None:
        sys.exit("no object under any of: %s" % " ".join(args))
    print(best[0])
elif cmd == "corrupt":
    key = args[0]
    data = bytearray(get(key))
    if len(data) < 128:
        sys.exit("object %s is too small to corrupt (%d bytes)" % (key, len(data)))
    mid = len(data) // 2
    for i in range(mid, mid + 64):
        data[i] ^= 0xFF
    put(key, bytes(data))
    print("flipped 64 bytes at offset %d of %s (%d bytes)" % (mid, key, len(data)))
else:
    sys.exit("bucket_tool: unknown command " + cmd)
PY
}
_write_bucket_tool

bucket_tool() {
    local kind=file
    [[ -n "$S3_PREFIX" || "$BUCKET_URL" == s3://* ]] && kind=s3
    BUCKET_BACKEND="$kind" BUCKET_DIR="$BUCKET_DIR" S3_BUCKET="$S3_BUCKET" S3_PREFIX="$S3_PREFIX" \
        S3_ENDPOINT="${S3_ENDPOINT:-}" timeout "$BUCKETFS_CLIENT_TIMEOUT" \
        "$BUCKETFS_TEST_PYTHON" "$TEST_DIR/bucket_tool.py" "$@"
}

# A CA and a server certificate for 127.0.0.1, in DIR/{ca.pem,server.pem,server.key}.
_make_test_ca() {
    local dir="$1"
    mkdir -p "$dir"
    {
        openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=bucketfs-test-ca \
            -keyout "$dir/ca.key" -out "$dir/ca.pem" &&
            openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 \
                -keyout "$dir/server.key" -out "$dir/server.csr" &&
            printf '%s\n' 'subjectAltName=IP:127.0.0.1' 'basicConstraints=CA:FALSE' \
                'extendedKeyUsage=serverAuth' 'keyUsage=digitalSignature,keyEncipherment' >"$dir/ext.cnf" &&
            openssl x509 -req -days 2 -in "$dir/server.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
                -CAcreateserial -extfile "$dir/ext.cnf" -out "$dir/server.pem"
    } >"$dir/openssl.log" 2>&1 || { cat "$dir/openssl.log" >&2; die "could not make a test CA"; }
}

start_moto() {
    local log="$TEST_DIR/moto.log"
    if [[ -n "$MOTO_PID" ]] && pid_alive "$MOTO_PID"; then
        return 0
    fi
    requires_python_module moto boto3 flask flask_cors
    MOTO_PORT="$(pick_unused_port)"
    local tls_args=()
    if [[ "${BUCKETFS_TEST_S3_TLS:-}" == 1 ]]; then
        # HTTPS with a throwaway CA: SSL_CERT_FILE makes bucketfs (rustls with the platform
        # verifier) trust it, S3_CA_BUNDLE does the same for bucket_tool's boto3.
        requires openssl
        _make_test_ca "$TEST_DIR/tls"
        tls_args=(-s -c "$TEST_DIR/tls/server.pem" -k "$TEST_DIR/tls/server.key")
        S3_ENDPOINT="https://127.0.0.1:$MOTO_PORT"
        SSL_CERT_FILE="$TEST_DIR/tls/ca.pem"
        S3_CA_BUNDLE="$TEST_DIR/tls/ca.pem"
        export SSL_CERT_FILE S3_CA_BUNDLE
    else
        S3_ENDPOINT="http://127.0.0.1:$MOTO_PORT"
    fi
    export MOTO_PORT S3_ENDPOINT
    local server=${BUCKETFS_TEST_S3_SERVER:-moto}
    if [[ $server == moto ]]; then
        "$BUCKETFS_TEST_PYTHON" -m moto.server -H 127.0.0.1 -p "$MOTO_PORT" "${tls_args[@]}" >>"$log" 2>&1 &
    else
        [[ -x $server && ${#tls_args[@]} -eq 0 ]] ||
            die "BUCKETFS_TEST_S3_SERVER=$server: not an executable s3s-fs (or asked with TLS, which it does not serve)"
        # Empty at every start, as moto is (it keeps its objects in memory).
        local root
        root=$(mktemp -d "$TEST_DIR/s3-root.XXXXXX")
        "$server" --host 127.0.0.1 --port "$MOTO_PORT" --access-key testing --secret-key testing \
            "$root" >>"$log" 2>&1 &
    fi
    MOTO_PID=$!
    register_pid "$MOTO_PID"
    wait_for 60 _port_open "$MOTO_PORT" || {
        cat "$log" >&2
        die "$server did not start on port $MOTO_PORT"
    }
    BUCKET_BACKEND=s3 S3_BUCKET="$S3_BUCKET" S3_ENDPOINT="$S3_ENDPOINT" \
        "$BUCKETFS_TEST_PYTHON" "$TEST_DIR/bucket_tool.py" mkbucket ||
        die "could not create bucket $S3_BUCKET on moto at $S3_ENDPOINT"
    log "$server on $S3_ENDPOINT (pid $MOTO_PID), bucket $S3_BUCKET"
}

# ---------------------------------------------------------------------------------------------
# Running a test over every backend

for_each_backend() {
    local fn="$1" backend rc start result passed=0 failed=0 skipped=0 summary=""
    for backend in $BUCKETFS_TEST_BACKENDS; do
        case "$backend" in file | s3) ;; *) die "unknown backend '$backend' in BUCKETFS_TEST_BACKENDS" ;; esac
    done
    # moto is shared by every s3 case of this test; each case gets its own key prefix. When its
    # python modules are missing, the s3 case itself calls start_moto to skip (or fail in CI).
    if [[ " $BUCKETFS_TEST_BACKENDS " == *" s3 "* ]] &&
        "$BUCKETFS_TEST_PYTHON" -c 'import moto, boto3, flask, flask_cors' >/dev/null 2>&1; then
        start_moto
    fi
    for backend in $BUCKETFS_TEST_BACKENDS; do
        start=$SECONDS
        echo "=== ${TEST_NAME} [$backend]" >&2
        # The case runs in a subshell with errexit on; it must not be part of a && / || list,
        # where bash would silently turn errexit off inside it.
        trap - ERR
        set +e
        (
            set -e
            trap '_lib_on_err $? "$LINENO" "$BASH_COMMAND"' ERR
            BACKEND="$backend"
            CASE_DIR="$TEST_DIR/$backend"
            mkdir -p "$CASE_DIR"
            if [[ "$backend" == s3 ]]; then
                [[ -n "$MOTO_PID" ]] || start_moto # reports the skip or failure for this backend
            fi
            "$fn"
        )
        rc=$?
        set -e
        trap '_lib_on_err $? "$LINENO" "$BASH_COMMAND"' ERR
        case "$rc" in
        0) passed=$((passed + 1)) result=PASS ;;
        77) skipped=$((skipped + 1)) result=SKIP ;;
        *) failed=$((failed + 1)) result=FAIL ;;
        esac
        echo "=== ${TEST_NAME} [$backend]: $result ($((SECONDS - start)) s)" >&2
        summary+="${TEST_NAME} ${backend} ${result}"$'\n'
    done
    printf '%s' "$summary" >&2
    if ((failed > 0)); then exit 1; fi
    if ((passed == 0 && skipped > 0)); then exit 77; fi
    exit 0
}
