#!/usr/bin/env bash
# Object-store outages, on S3 (moto) behind bench/s3proxy.py, which refuses every request (an
# unreachable store) or holds every request unanswered (a hanging one) while a file exists:
#   1. an outage shorter than storage.outage_timeout_s: a client's flush waits it out and then
#      succeeds; `bucketfs status` reports the outage meanwhile; after kill -9 and a restart with
#      the cache deleted, a cold read during a second outage waits for the store and then reads
#      the flushed data back from the bucket;
#   2. past the timeout, with the store hanging, the flush answers an error (EIO to the client)
#      instead of hanging, `bucketfs status` says that the store does not answer, and once the
#      store is back the same client's next write and flush succeed.
# A local-directory bucket has no network to cut: the file backend only says so.
set -euo pipefail
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"

requires qemu-io

outage_json() {
    status_json | "$BUCKETFS_TEST_PYTHON" -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["store_outage"]))'
}

# wait_out_outage NAME WHAT STATUS_PATTERN QEMU_IO_COMMAND...: starts the qemu-io commands on
# export d during a 10 s outage (refused connections); they must still be waiting 6 s in, while
# `bucketfs status` reports an outage matching STATUS_PATTERN, and succeed once the store is back.
wait_out_outage() {
    local name="$1" what="$2" pattern="$3" pid out
    shift 3
    touch "$refuse"
    qio d "$@" >"$CASE_DIR/$name.log" 2>&1 &
    pid=$!
    sleep 6
    pid_alive "$pid" || die "$what returned during the outage: $(cat "$CASE_DIR/$name.log")"
    out="$(outage_json)"
    log "status during the outage of $what: $out"
    grep -q "$pattern" <<<"$out" || die "bucketfs status does not report the outage ($pattern): $out"
    sleep 4
    rm -f "$refuse"
    wait "$pid" || die "$what failed although the outage ended within the timeout: $(cat "$CASE_DIR/$name.log")"
}

run_case() {
    if [[ "$BACKEND" != s3 ]]; then
        log "outages are injected on the S3 path only; nothing to cut for a local directory"
        return 0
    fi
    local proxy_port started waited out
    make_config "$CASE_DIR" s3
    proxy_port="$(pick_unused_port)"
    refuse="$CASE_DIR/refuse" # global: wait_out_outage uses it
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
    started=$SECONDS
    wait_out_outage flush 'the flush' '"requests": "uploads"' 'write -P 0x6b 0 1M' 'flush'
    waited=$((SECONDS - started))
    log "the flush returned after ${waited} s (outage: 10 s)"
    ((waited >= 10)) || die "the flush returned after ${waited} s, before the outage ended"
    out="$(outage_json)"
    [[ "$out" == null ]] || die "bucketfs status still reports an outage: $out"
    kill9_bucketfs
    rm -rf "$CACHE_DIR"
    start_bucketfs "$CONFIG"
    # A cold read during an outage waits for the store too, then reads what was flushed.
    wait_out_outage read 'the cold read' '"requests": "reads"' 'read -P 0x6b 0 1M'

    # 2. Past the timeout, with a store that hangs (accepts requests and never answers): the
    #    flush fails instead of hanging, and `bucketfs status` says why; then the store is back.
    stop_bucketfs
    config_set "$CONFIG" storage outage_timeout_s 5
    start_bucketfs "$CONFIG"
    echo hang >"$refuse"
    started=$SECONDS
    if qio d 'write -P 0x7c 0 1M' 'flush' >"$CASE_DIR/flush2.log" 2>&1; then
        die "the flush succeeded while the store was hanging"
    fi
    waited=$((SECONDS - started))
    log "the flush failed after ${waited} s (outage timeout: 5 s, store hanging)"
    # A hung attempt is abandoned after 10 s and a request gives up after its 20 s budget
    # (docs/0004), after which the barrier is past the outage timeout; qemu-io's FUA write and
    # flushes make two or three such barriers: 20-60 s here. Before attempts were bounded, each
    # barrier waited five 30-second timeouts before its outage clock even started.
    ((waited >= 5 && waited < 100)) || die "the flush failed after ${waited} s; expected within 100 s"
    out="$(outage_json)"
    log "status after the failed flush: $out"
    grep -q 'no answer' <<<"$out" || die "bucketfs status does not say that the store does not answer: $out"
    rm -f "$refuse"
    qio d 'write -P 0x7d 0 1M' 'flush' || die "write + flush after the store came back failed"
    kill9_bucketfs
    start_bucketfs "$CONFIG"
    qio d 'read -P 0x7d 0 1M' || die "data flushed after the outage is not in the bucket"
    stop_bucketfs
}

for_each_backend run_case
