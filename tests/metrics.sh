#!/usr/bin/env bash
# /metrics of a running server (docs/0008-metrics.md): with admin.metrics_listen set, GET
# /metrics answers in Prometheus' text format (tests/prom_text.py parses it strictly); writes and
# flushes through NBD (qemu-io) move the object-store PUT count and the count of client barriers
# and of each of their parts; `bucketfs metrics` prints the same families through the admin
# socket; other paths and methods are refused; the per-barrier breakdown that bench/run prints
# comes out of two scrapes. A scrape altered by hand must fail the parser.
set -euo pipefail
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"

requires qemu-io

PROM="$TESTS_DIR/prom_text.py"

# scrape PORT PATH [METHOD [status]]: print "STATUS CONTENT-TYPE" and then the body (not with
# "status").
scrape() {
    /usr/bin/python3 - "$@" <<'PY'
import http.client, sys
port, path = int(sys.argv[1]), sys.argv[2]
method = sys.argv[3] if len(sys.argv) > 3 else "GET"
c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
c.request(method, path)
r = c.getresponse()
print(r.status, r.getheader("Content-Type"))
body = r.read().decode()
if sys.argv[4:] != ["status"]:
    sys.stdout.write(body)
PY
}

# value FILE NAME [LABEL=VALUE...]
value() { /usr/bin/python3 "$PROM" value "$@"; }

run_case() {
    local port out before after head
    make_config "$CASE_DIR" "$BACKEND"
    port="$(pick_unused_port)"
    config_set "$CONFIG" admin metrics_listen "\"127.0.0.1:$port\""
    start_bucketfs "$CONFIG"
    bucketfs_log_current | grep -q "serving GET /metrics" || die "the log does not say /metrics is served"
    create_export m 64M
    out="$CASE_DIR/before.txt"
    scrape "$port" /metrics >"$out"
    head="$(head -n 1 "$out")"
    [[ "$head" == "200 text/plain; version=0.0.4; charset=utf-8" ]] || die "GET /metrics answered: $head"
    before="$CASE_DIR/before.prom"
    tail -n +2 "$out" >"$before"
    /usr/bin/python3 "$PROM" check "$before" || die "the first scrape is not valid exposition text"

    qio m 'write -P 0x5a 0 1M' 'flush' 'write -P 0x5b 2M 64k' 'flush' || die "qemu-io write + flush failed"

    scrape "$port" /metrics >"$out"
    after="$CASE_DIR/after.prom"
    tail -n +2 "$out" >"$after"
    /usr/bin/python3 "$PROM" check "$after" || die "the second scrape is not valid exposition text"
    local puts0 puts1 barriers0 barriers1 part count
    puts0="$(value "$before" bucketfs_object_store_requests_total op=put)"
    puts1="$(value "$after" bucketfs_object_store_requests_total op=put)"
    barriers0="$(value "$before" bucketfs_barrier_duration_seconds_count)"
    barriers1="$(value "$after" bucketfs_barrier_duration_seconds_count)"
    log "PUT requests $puts0 -> $puts1, client barriers $barriers0 -> $barriers1"
    ((puts1 >= puts0 + 2)) || die "two flushed writes made fewer than two PUTs: $puts0 -> $puts1"
    ((barriers1 >= barriers0 + 2)) || die "two NBD FLUSHes made fewer than two barriers: $barriers0 -> $barriers1"
    for part in checkpoint_hold seal_wait seal upload_wait put commit outage_wait; do
        count="$(value "$after" bucketfs_barrier_part_duration_seconds_count part="$part")"
        [[ "$count" == "$barriers1" ]] || die "part $part has $count observations for $barriers1 barriers"
    done
    [[ "$(value "$after" bucketfs_object_store_bytes_total op=put)" != 0 ]] || die "no bytes PUT"

    # The breakdown bench/run prints: every part, with the barriers between the two scrapes.
    /usr/bin/python3 "$PROM" breakdown "$before" "$after" >"$CASE_DIR/breakdown.txt" ||
        die "no breakdown from two scrapes"
    cat "$CASE_DIR/breakdown.txt" >&2
    for part in barrier checkpoint_hold seal_wait seal upload_wait put commit outage_wait; do
        awk -v part="$part" -v n="$((barriers1 - barriers0))" '$1 == part && $2 == n { found = 1 } END { exit !found }' \
            "$CASE_DIR/breakdown.txt" || die "the breakdown lacks $part with $((barriers1 - barriers0)) barriers"
    done

    # The same families through the admin socket.
    bfs metrics >"$CASE_DIR/cli.prom" || die "bucketfs metrics failed"
    /usr/bin/python3 "$PROM" check "$CASE_DIR/cli.prom" || die "bucketfs metrics is not valid exposition text"
    diff <(grep '^# TYPE' "$after") <(grep '^# TYPE' "$CASE_DIR/cli.prom") ||
        die "bucketfs metrics and GET /metrics show different families"

    # Only GET and HEAD of /metrics.
    head="$(scrape "$port" / GET status)"
    [[ "$head" == 404* ]] || die "GET / answered $head, not 404"
    head="$(scrape "$port" /metrics POST status)"
    [[ "$head" == 405* ]] || die "POST /metrics answered $head, not 405"
    head="$(scrape "$port" /metrics HEAD status)"
    [[ "$head" == 200* ]] || die "HEAD /metrics answered $head, not 200"

    # The parser can fail: a histogram whose +Inf bucket disagrees with its count.
    sed -E 's/^(bucketfs_barrier_duration_seconds_bucket\{le="\+Inf"\}) .*/\1 0/' "$after" >"$CASE_DIR/bad.prom"
    if /usr/bin/python3 "$PROM" check "$CASE_DIR/bad.prom" 2>/dev/null; then
        die "the parser accepted a histogram whose +Inf bucket is not its count"
    fi
    stop_bucketfs
}

for_each_backend run_case
