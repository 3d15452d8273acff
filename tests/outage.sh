#!/usr/bin/env bash
# Object-store outages, on S3 (moto) behind bench/s3proxy.py, which refuses every request while
# a file exists (an unreachable store):
#   1. an outage shorter than storage.outage_timeout_s: a client's flush waits it out and then
#      succeeds; `bucketfs status` reports the outage meanwhile; after kill -9 and a restart with
#      the cache deleted, the flushed data is read back from the bucket;
#   2. past the timeout, the flush answers an error (EIO to the client) instead of hanging, and
#      once the store is back the same client's next write and flush succeed.
# A local-directory bucket has no network to cut: the file backend only says so.
set -euo pipefail
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"

requires qemu-io

outage_json() {
    status_json | "$BUCKETFS_TEST_PYTHON" -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["store_outage"]))'
}

run_case() {
    if [[ "$BACKEND" != s3 ]]; then
        log "outages are injected on the S3 path only; nothing to cut for a local directory"
        return 0
    fi
    local proxy_port refuse flush_pid started waited out
    make_config "$CASE_DIR" s3
    proxy_port="$(pick_unused_port)"
    refuse="$CASE_DIR/refuse"
    "$BUCKETFS_TEST_PYTHON" "$REPO_ROOT/bench/s3proxy.py" --listen "127.0.0.1:$proxy_port" \
        --upstream "${S3_ENDPOINT#http://}" --latency 0 --fault-while "$refuse" \
        >>"$CASE_DIR/s3proxy.log" 2>&1 &
    register_pid $!
    wait_for 30 _port_open "$proxy_port" || die "s3proxy did not start: $(cat "$CASE_DIR/s3proxy.log")"
    config_set "$CONFIG" aws endpoint "\"http://127.0.0.1:$proxy_port\""
    config_set "$CONFIG" storage outage_timeout_s 120
    start_bucketfs "$CONFIG"
    create_export d 64M
    qio d 'write -P 0x5a 0 1M' 'flush' || die "write + flush before the outage failed"

    # 1. A 10-second outage: the flush waits, then succeeds.
    touch "$refuse"
    started=$SECONDS
    qio d 'write -P 0x6b 0 1M' 'flush' >"$CASE_DIR/flush1.log" 2>&1 &
    flush_pid=$!
    sleep 6
    pid_alive "$flush_pid" || die "the flush returned during the outage: $(cat "$CASE_DIR/flush1.log")"
    out="$(outage_json)"
    log "status during the outage: $out"
    grep -q '"since_unix_s"' <<<"$out" || die "bucketfs status does not report the outage: $out"
    sleep 4
    rm -f "$refuse"
    wait "$flush_pid" || die "the flush failed although the outage ended within the timeout: $(cat "$CASE_DIR/flush1.log")"
    waited=$((SECONDS - started))
    log "the flush returned after ${waited} s (outage: 10 s)"
    ((waited >= 10)) || die "the flush returned after ${waited} s, before the outage ended"
    out="$(outage_json)"
    [[ "$out" == null ]] || die "bucketfs status still reports an outage: $out"
    kill9_bucketfs
    rm -rf "$CACHE_DIR"
    start_bucketfs "$CONFIG"
    qio d 'read -P 0x6b 0 1M' || die "data flushed through the outage is not in the bucket"

    # 2. Past the timeout: the flush fails instead of hanging; then the store is back.
    stop_bucketfs
    config_set "$CONFIG" storage outage_timeout_s 5
    start_bucketfs "$CONFIG"
    touch "$refuse"
    started=$SECONDS
    if qio d 'write -P 0x7c 0 1M' 'flush' >"$CASE_DIR/flush2.log" 2>&1; then
        die "the flush succeeded while the store was unreachable"
    fi
    waited=$((SECONDS - started))
    log "the flush failed after ${waited} s (outage timeout: 5 s)"
    # Past the timeout each request still makes one round of attempts (the bucket's own retries,
    # about 2 s, after any upload already in flight), and qemu-io sends a FUA write and two
    # flushes: 30-60 s here.
    ((waited >= 5 && waited < 150)) || die "the flush failed after ${waited} s; expected within 150 s"
    rm -f "$refuse"
    qio d 'write -P 0x7d 0 1M' 'flush' || die "write + flush after the store came back failed"
    kill9_bucketfs
    start_bucketfs "$CONFIG"
    qio d 'read -P 0x7d 0 1M' || die "data flushed after the outage is not in the bucket"
    stop_bucketfs
}

for_each_backend run_case
