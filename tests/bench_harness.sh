#!/usr/bin/env bash
# The benchmark harness end to end, in its tiny mode: every output exists and parses. Figures are
# not judged (a benchmark never fails on speed); what is checked is that the harness measured
# what it says it measured.
#
#   1. bench/s3proxy.py on its own, against a keep-alive HTTP/1.1 server: several requests on one
#      connection (Content-Length and chunked bodies both ways, HEAD, Expect: 100-continue) arrive
#      intact, each delayed by the latency, and the bandwidth limit holds.
#   2. bench/run --tiny with the targets of this backend (tests/run runs the test once per
#      backend; together they cover every kind of target):
#        file: local, bucketfs-file, bucketfs-s3-lat (moto behind the latency proxy)
#        s3:   local, bucketfs-s3, and a peer NBD server given as a command (nbdkit memory)
#      then: results.json has every pgbench run and fio job with its figures (TPS, latency
#      percentiles, per-second series, ratio to local, CPU per transaction, object-store cost for
#      bucketfs targets, and the flush barriers per part from `bucketfs metrics`),
#      the CSVs have rows, charts/*.png are PNGs, report.html embeds every chart (base64), the
#      terminal table names every target, the proxy saw the S3 traffic, and bench/compare runs.
#   3. (file backend) bench/rounds 2 --tiny --no-fio over local and bucketfs-file: the second
#      round ran the targets in the reverse order, and every pgbench figure has a value and a
#      ratio per round (the reference's ratios all 1) and their medians.
#   4. (file backend) bench/ab with one binary as both A and B, 4 slices of 3 s: the slices ran
#      in A B B A order, each has its TPS and the server's CPU, and the summary its ratios.
#   5. (file backend) bench/versus, nbdkit against bucketfs, rw-sync and ro in 4 slices of 3 s
#      each: the same checks per workload. Then against the durable reference
#      (--reference nbdkit-file), rw-sync in 2 slices, on a zram device of its own (--zram).
#      Then two bucketfs builds side by side (--reference bucketfs:BINARY, here the same one),
#      rw-async in 2 slices: both servers measured, both stopped.
#   6. (file backend) bench/storage, rw-async in 2 slices of 3 s: a row per slice whose stored,
#      live and stored / live agree, and the database's size on ext4.
set -euo pipefail
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"

requires python3 timeout
# Bounds: the tiny run takes ~2 min; a hung step must fail the test well within tests/run's limit.
BENCH_TIMEOUT_S=330

proxy_selftest() {
    log "s3proxy: keep-alive request framing, latency and bandwidth"
    python3 - "$REPO_ROOT/bench/s3proxy.py" "$(pick_unused_port)" "$(pick_unused_port)" "$TEST_DIR/proxy-selftest.json" <<'PY'
import http.client, http.server, json, os, socket, subprocess, sys, threading, time

proxy_py, up_port, px_port, stats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
store = {}

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, unlike moto

    def log_message(self, *a):
        pass

    def body(self):
        if "chunked" in (self.headers.get("Transfer-Encoding") or ""):
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b""):
                        pass
                    return data
                data += self.rfile.read(size)
                self.rfile.read(2)
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))

    def do_PUT(self):
        store[self.path] = self.body()
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        data = store.get(self.path, b"")
        self.send_response(200)
        if self.path.endswith("chunked"):
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(data), 1000):
                piece = data[i:i + 1000]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(store.get(self.path, b""))))
        self.end_headers()

server = http.server.ThreadingHTTPServer(("127.0.0.1", up_port), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
latency_s, bandwidth = 0.05, 10e6
proxy = subprocess.Popen([sys.executable, proxy_py, "--listen", "127.0.0.1:%d" % px_port,
                          "--upstream", "127.0.0.1:%d" % up_port, "--latency", "50ms",
                          "--bandwidth", "10MB/s", "--stats", stats,
                          "--request-log", stats + ".requests"])
try:
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", px_port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    c = http.client.HTTPConnection("127.0.0.1", px_port, timeout=30)
    blob = os.urandom(1_000_000)
    small = os.urandom(5000)
    t0 = time.monotonic()
    c.request("PUT", "/a", body=blob)  # Content-Length body
    r = c.getresponse(); r.read(); assert r.status == 200, r.status
    t_put = time.monotonic() - t0
    c.request("PUT", "/b-chunked", body=iter([small[:3000], small[3000:]]),
              encode_chunked=True, headers={"Transfer-Encoding": "chunked"})
    r = c.getresponse(); r.read(); assert r.status == 200
    c.request("PUT", "/c", body=small, headers={"Expect": "100-continue"})
    r = c.getresponse(); r.read(); assert r.status == 200
    c.request("HEAD", "/a")
    r = c.getresponse(); r.read(); assert r.getheader("Content-Length") == str(len(blob))
    c.request("GET", "/a")
    r = c.getresponse(); assert r.read() == blob
    c.request("GET", "/b-chunked")
    r = c.getresponse(); assert r.read() == small
    c.request("GET", "/c")
    r = c.getresponse(); assert r.read() == small
    elapsed = time.monotonic() - t0
    c.close()
    # 1 MB at 10 MB/s is at least 0.1 s, plus the latency.
    assert t_put >= latency_s + 0.09, "PUT of 1 MB took %.3f s: bandwidth limit not applied" % t_put
    assert elapsed >= 7 * latency_s, "7 requests took %.3f s: latency not applied per request" % elapsed
finally:
    proxy.terminate()
    proxy.wait(10)
    server.shutdown()
s = json.load(open(stats))
assert s["requests"] == 7, s
# Two connections: the readiness probe, then the client's one keep-alive connection.
assert s["connections"] == 2, "keep-alive connection was not kept: %s" % s
assert s["by_method"] == {"PUT": 3, "HEAD": 1, "GET": 3}, s
assert s["errors"] == 0, s
assert s["bytes_up"] > 1_000_000 and s["bytes_down"] > 1_000_000, s
# --request-log: a line per request, in order, whose parts add up to its whole time.
lines = [l.split() for l in open(stats + ".requests")]
assert [(l[1], l[2]) for l in lines] == [("PUT", "200")] * 3 + [("HEAD", "200")] + [("GET", "200")] * 3, lines
for l in lines:
    whole, latency, up, server, down = map(float, l[3:8])
    assert abs(latency - 50) < 0.01 and min(up, server, down) >= 0, l
    assert abs(whole - (latency + up + server + down)) < 1, l
put_a = lines[0]
assert float(put_a[5]) >= 90 and int(put_a[8]) > 1_000_000, "the 1 MB PUT's up-link time: %s" % put_a
print("s3proxy self-test: 7 requests on 1 connection, %.2f s of delay added, PUT 1 MB in %.3f s" % (
    s["delay_added_s"], t_put))
PY
}

check_outputs() { # check_outputs RESULTS_DIR TARGET... : every output exists and parses
    python3 - "$@" <<'PY'
import base64, csv, json, os, re, sys

d, targets = sys.argv[1], sys.argv[2:]
fail = []
def check(cond, what):
    if not cond:
        fail.append(what)

res = json.load(open(os.path.join(d, "results.json")))
s = res["settings"]
check(s["suite"] == "tiny" and s["targets"] == targets, "settings.json: suite/targets %s %s" % (s["suite"], s["targets"]))
check(res["conditions"].get("loadavg_1m"), "conditions: no load samples")
pg = {(r["target"], r["workload"]): r for r in res["pgbench"]}
jobs = [j.split()[0] for j in s["fio_jobs"]]
for t in targets:
    bucketfs = t.startswith("bucketfs-")
    for w in ("init", "rw-sync", "rw-async", "ro"):
        r = pg.get((t, w))
        check(r is not None, "pgbench %s %s missing" % (t, w))
        if r is None:
            continue
        check(r["elapsed_s"] > 0, "%s %s: elapsed" % (t, w))
        if w == "init":
            check(r["device"]["write_bytes"] > 0, "%s init: no device writes counted" % t)
        else:
            check(r["tps"] and r["tps"] > 0 and r["transactions"] > 0, "%s %s: tps" % (t, w))
            lat = r.get("latency_ms") or {}
            check(all(isinstance(lat.get(p), (int, float)) for p in ("p50", "p95", "p99")),
                  "%s %s: latency percentiles %s" % (t, w, lat))
            check(lat.get("p50", 0) <= lat.get("p95", 0) <= lat.get("p99", 0), "%s %s: percentiles out of order" % (t, w))
            ps = r.get("per_second") or {}
            check(len(ps.get("tps", [])) >= 3 and sum(ps["tps"]) > 0, "%s %s: per-second series" % (t, w))
            check(r.get("steady") is not None, "%s %s: steadiness" % (t, w))
            cpu = r.get("cpu") or {}
            check(0 < (cpu.get("machine_busy") or 0) <= 1 and (cpu.get("machine_us_per_tx") or 0) > 0,
                  "%s %s: machine CPU %s" % (t, w, cpu))
            # Every target but local is an NBD server behind nbdfuse. Read-only may not reach
            # the server at all (the tiny scale fits shared_buffers): no CPU tick is then right.
            served = t != "local"
            for name in ("server", "nbdfuse"):
                v = cpu.get(name + "_us_per_tx")
                ok = v is None if not served else v is not None and (v > 0 or w == "ro")
                check(ok, "%s %s: %s CPU %s" % (t, w, name, v))
        if "local" in targets:
            check(r["ratio_to_local"] is not None, "%s %s: no ratio to local" % (t, w))
            if t == "local":
                check(r["ratio_to_local"] == 1.0, "local %s: ratio %s" % (w, r["ratio_to_local"]))
        if bucketfs:
            c = r.get("cost") or {}
            check(set(c.get("requests", {})) == {"put", "get", "list", "delete"}, "%s %s: cost requests" % (t, w))
            check(c.get("per_gib") is not None, "%s %s: cost per GiB written" % (t, w))
            if w != "init":
                check(c.get("per_1k_tx") is not None, "%s %s: cost per 1k tx" % (t, w))
            if w in ("init", "rw-sync"):
                check(c["requests"]["put"] > 0, "%s %s: no PUT counted" % (t, w))
            b = {p["part"]: p for p in r.get("barriers") or []}
            check(set(b) == {"barrier", "checkpoint_hold", "seal_wait", "seal", "upload_wait", "put",
                             "commit", "outage_wait", "(PUT requests)"}, "%s %s: barrier parts %s" % (t, w, sorted(b)))
            if w == "rw-sync" and b:
                n = b["barrier"]["count"]
                check(n > 0 and b["barrier"]["p99_ms"] is not None, "%s rw-sync: no barriers %s" % (t, b["barrier"]))
                check(all(b[p]["count"] == n for p in b if p != "(PUT requests)"),
                      "%s rw-sync: a part without one observation per barrier: %s" % (t, b))
        else:
            check(r.get("cost") is None, "%s %s: cost on a target without counters" % (t, w))
            check(r.get("barriers") is None, "%s %s: barriers on a target without metrics" % (t, w))
    fio = {r["job"]: r for r in res["fio"] if r["target"] == t}
    for j in jobs:
        r = fio.get(j)
        check(r is not None and r["iops"] > 0 and r["bw_mib_s"] > 0, "fio %s %s: IOPS" % (t, j))
        if r is not None:
            check(r["latency_ms"]["p99"] is not None, "fio %s %s: p99" % (t, j))
            if bucketfs and "write" in r["rw"]:
                check(r["cost"]["requests"]["put"] > 0, "fio %s %s: no PUT counted" % (t, j))

def csv_rows(name):
    with open(os.path.join(d, name), newline="") as f:
        return list(csv.DictReader(f))
check(len(csv_rows("pgbench.csv")) == 4 * len(targets), "pgbench.csv rows")
check(len(csv_rows("fio.csv")) == len(jobs) * len(targets), "fio.csv rows")
check(len(csv_rows("timeseries.csv")) >= 9 * len(targets), "timeseries.csv rows")
nb = sum(1 for t in targets if t.startswith("bucketfs-"))
check(len(csv_rows("cost.csv")) >= 4 * nb, "cost.csv rows")

charts = res["charts"]
for name in ("charts/throughput-small.png", "charts/latency-small.png", "charts/init.png", "charts/fio.png"):
    check(name in charts, "chart %s missing" % name)
if nb:
    check("charts/cost.png" in charts, "chart charts/cost.png missing")
for name in charts:
    with open(os.path.join(d, name), "rb") as f:
        head = f.read(8)
    check(head == b"\x89PNG\r\n\x1a\n", "%s is not a PNG" % name)
    check(os.path.getsize(os.path.join(d, name)) > 5000, "%s is suspiciously small" % name)

html = open(os.path.join(d, "report.html")).read()
images = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", html)
check(len(images) == len(charts), "report.html embeds %d images, %d charts" % (len(images), len(charts)))
check(all(base64.b64decode(i)[:8] == b"\x89PNG\r\n\x1a\n" for i in images), "report.html: an embedded image is not a PNG")
check("src=\"http" not in html and "src='http" not in html, "report.html is not self-contained")
table = open(os.path.join(d, "table.txt")).read()
for t in targets:
    label = res["labels"][t]
    check(label in html and label in table, "target %s missing from the table or report" % label)
check("vs local" in table and "p99 ms" in table, "table.txt lacks the ratio or latency columns")
if nb:
    check("flush barriers per part" in table and "upload_wait" in table, "table.txt lacks the barrier table")

if "bucketfs-s3-lat" in targets:
    proxies = [p["stats"] for p in res["s3proxy"]]
    check(len(proxies) == 2, "expected a proxy stats file per bucketfs-s3-lat phase, got %d" % len(proxies))
    for p in proxies:
        check(p["requests"] > 0 and p["by_method"].get("PUT", 0) > 0, "proxy saw no PUT: %s" % p)
        lat = p["config"]["latency_s"]
        check(lat > 0 and p["delay_added_s"] >= 0.99 * lat * p["requests"], "proxy delay not per request: %s" % p)

if fail:
    print("\n".join("not ok - " + f for f in fail))
    sys.exit(1)
print("ok - %d pgbench runs, %d fio jobs, %d charts, report.html, CSVs, table for %s" % (
    len(res["pgbench"]), len(res["fio"]), len(charts), ", ".join(targets)))
PY
}

run_bench() { # run_bench NAME TARGETS [BENCH_RUN_ARG...]
    local name=$1 targets=$2 rc=0
    shift 2
    local results=$TEST_DIR/$name
    log "bench/run --tiny --targets $targets $*"
    timeout --kill-after=20 "$BENCH_TIMEOUT_S" "$REPO_ROOT/bench/run" --tiny --targets "$targets" \
        --results "$results" "$@" >"$TEST_DIR/$name.out" 2>&1 || rc=$?
    if ((rc == 77)); then
        tail -n 5 "$TEST_DIR/$name.out" >&2
        skip "bench/run skipped (a tool is missing)"
    fi
    if ((rc != 0)); then
        tail -n 60 "$TEST_DIR/$name.out" >&2
        die "bench/run --tiny ($targets) exited $rc"
    fi
    grep -q '^\[ *[0-9]*/[0-9]* [0-9:]* elapsed, ~[0-9:]* left\]' "$TEST_DIR/$name.out" ||
        die "bench/run printed no progress lines"
    # awk reads to the end, so no SIGPIPE fails the pipeline however long the tables grow.
    awk '/^== pgbench/ { on = 1 } on && shown++ < 40' "$TEST_DIR/$name.out" >&2
    # shellcheck disable=SC2086 # one argument per target
    check_outputs "$results" ${targets//,/ } || die "bench/run --tiny ($targets): outputs incomplete"
    "$REPO_ROOT/bench/compare" "$results" "$results" >"$TEST_DIR/$name.compare" ||
        die "bench/compare failed"
    grep -q 'new/old' "$TEST_DIR/$name.compare" || die "bench/compare printed no comparison"
    for t in ${targets//,/ }; do
        grep -q -- "$t" "$TEST_DIR/$name.compare" || die "bench/compare lacks target $t"
    done
    log "ok - $name: outputs complete, bench/compare works"
}

run_rounds() {
    local results=$TEST_DIR/rounds rc=0
    # A PostgreSQL setting of --pg-setting: every round's server must start with it, and record it.
    log "bench/rounds 2 --tiny --no-fio --targets local,bucketfs-file --pg-setting commit_delay=10"
    timeout --kill-after=20 "$BENCH_TIMEOUT_S" "$REPO_ROOT/bench/rounds" 2 --tiny --no-fio \
        --targets local,bucketfs-file --pg-setting commit_delay=10 --results "$results" \
        >"$TEST_DIR/rounds.out" 2>&1 || rc=$?
    if ((rc != 0)); then
        tail -n 60 "$TEST_DIR/rounds.out" >&2
        die "bench/rounds exited $rc"
    fi
    python3 - "$results" <<'PY' || die "bench/rounds: summary incomplete"
import json, os, sys
d = sys.argv[1]
s = json.load(open(os.path.join(d, "summary.json")))
assert s["orders"] == [["local", "bucketfs-file"], ["bucketfs-file", "local"]], s["orders"]
for k in (1, 2):
    r = json.load(open(os.path.join(d, "round-%d" % k, "results.json")))
    assert r["settings"]["targets"] == s["orders"][k - 1], r["settings"]["targets"]
    assert r["settings"]["postgresql_extra"] == ["commit_delay = 10"], r["settings"]["postgresql_extra"]
    assert "commit_delay = 10" in r["settings"]["postgresql_conf"], r["settings"]["postgresql_conf"]
figs = {f["figure"]: f for f in s["figures"] if f["kind"] == "pgbench"}
assert set(figs) == {"init small", "rw-sync small", "rw-async small", "ro small"}, set(figs)
for name, f in figs.items():
    ref, t = f["targets"]["local"], f["targets"]["bucketfs-file"]
    assert len(ref["values"]) == 2 and ref["ratios"] == [1.0, 1.0], (name, ref)
    assert len(t["values"]) == 2 and len(t["ratios"]) == 2 and all(x > 0 for x in t["ratios"]), (name, t)
    assert t["median_ratio"] is not None and t["median"] > 0, (name, t)
cpu = {f["figure"]: f for f in s["figures"] if f["kind"] == "cpu"}
for w in ("rw-sync", "rw-async"):
    f = cpu["server µs/tx %s small" % w]["targets"]["bucketfs-file"]
    assert len(f["values"]) == 2 and f["median"] > 0, (w, f)
text = open(os.path.join(d, "summary.txt")).read()
assert "ratio median" in text and "steady" in text, text
print("ok - bench/rounds: 2 rounds in both orders, medians and per-round ratios")
PY
    log "ok - bench/rounds: summary complete"
}

# bench/ab with the same binary as A and B, 4 short slices: A B B A, every slice a TPS and the
# server's CPU, the summary's two ratios.
run_ab() {
    local results=$TEST_DIR/ab rc=0
    log "bench/ab --slices 4 --duration 3 --scale 1, the same binary twice"
    timeout --kill-after=20 "$BENCH_TIMEOUT_S" "$REPO_ROOT/bench/ab" --slices 4 --duration 3 --scale 1 \
        --clients 4 --results "$results" "$BUCKETFS" "$BUCKETFS" >"$TEST_DIR/ab.out" 2>&1 || rc=$?
    if ((rc != 0)); then
        tail -n 40 "$TEST_DIR/ab.out" >&2
        die "bench/ab exited $rc"
    fi
    python3 - "$results" <<'PY' || die "bench/ab: results incomplete"
import csv, os, sys
d = sys.argv[1]
rows = list(csv.DictReader(open(os.path.join(d, "slices.tsv")), delimiter="\t"))
assert [r["side"] for r in rows] == ["A", "B", "B", "A"], rows
for r in rows:
    assert float(r["tps"]) > 0 and float(r["server_cpu_us_per_tx"]) > 0 and 0 < float(r["machine_busy"]) <= 1, r
    assert float(r["postgres_cpu_us_per_tx"]) > 0 and 0 <= float(r["steal"]) < 1, r
text = open(os.path.join(d, "summary.txt")).read()
assert "B/A TPS over 2 neighbouring pairs: mean" in text and "B/A server CPU per transaction over 2" in text, text
print("ok - bench/ab: 4 slices in A B B A order, TPS, CPU and the pair ratios")
PY
    log "ok - bench/ab: summary complete"
}

# bench/versus, nbdkit against bucketfs, two workloads of 4 short slices: both stacks were up at
# once (the slices alternate without a restart), every slice has a TPS, the server's CPU and
# PostgreSQL's counters, and the summary has both workloads with their ratios.
# With perf (scripts/setup installs it where the distribution has it) the run also traces the
# block layer (--block-trace), and rw-sync's summary must show WRITEs and FLUSHes on both sides,
# and samples every CPU (--profile): each slice's profile must hold its server's samples.
run_versus() {
    local results=$TEST_DIR/versus trace=()
    if command -v perf >/dev/null; then
        trace=(--block-trace --profile)
    else
        log "no perf: bench/versus without --block-trace and --profile"
    fi
    versus_run versus --workloads rw-sync,ro --slices 4 --duration 3 --scale 1 --clients 4 "${trace[@]}"
    python3 - "$results" "${trace[*]}" <<'PY' || die "bench/versus: results incomplete"
import csv, os, re, subprocess, sys
d, traced = sys.argv[1], sys.argv[2] != ""
for workload in ("rw-sync", "ro"):
    rows = list(csv.DictReader(open(os.path.join(d, "slices-%s.tsv" % workload)), delimiter="\t"))
    assert [r["side"] for r in rows] == ["A", "B", "B", "A"], rows
    for r in rows:
        assert float(r["tps"]) > 0 and 0 < float(r["machine_busy"]) <= 1, r
        assert float(r["postgres_cpu_us_per_tx"]) > 0 and 0 <= float(r["steal"]) < 1, r
        # rw-sync reaches both servers; read-only may be served from PostgreSQL's buffers alone.
        assert r["server_cpu_us_per_tx"] != "" and (workload == "ro" or float(r["server_cpu_us_per_tx"]) > 0), r
    # PostgreSQL's own counters per slice: rw-sync writes WAL and syncs it on every commit.
    pg = list(csv.DictReader(open(os.path.join(d, "postgres-%s.tsv" % workload)), delimiter="\t"))
    assert [(r["slice"], r["side"]) for r in pg] == [(r["slice"], r["side"]) for r in rows], pg
    for r in pg:
        assert float(r["accounts_mb_at_start"]) > 0 and int(r["dead_tuples_at_start"]) >= 0, r
        assert workload == "ro" or (float(r["wal_mb"]) > 0 and int(r["wal_sync"]) > 0), r
text = open(os.path.join(d, "summary.txt")).read()
assert re.match(r"scratch: \S+ on /dev/\S+, write cache: (write back|write through)\n", text), text
assert text.count("B/A TPS over 2 neighbouring pairs: mean") == 2, text
assert "A nbdkit" in text and "B bucketfs" in text and text.index("rw-sync:") < text.index("ro:"), text
# The bucket's bytes for the bucketfs side only, after each workload.
assert "rw-sync: storage B: log written " in text and "ro: storage B: " in text, text
assert "storage A:" not in text, text
assert text.count(": PostgreSQL per slice, medians") == 2 and "  B wal_mb " in text, text
if traced:
    table = text[text.index("rw-sync: block requests"):]
    for row in ("WRITE round trip", "FLUSH round trip"):
        line = next(l for l in table.splitlines() if l.startswith(row))
        assert len(re.findall(r"\d+ / \d+", line)) == 2, line  # mean / median, both sides
    rate = next(l for l in table.splitlines() if l.startswith("FLUSHes per second")).split()[-2:]
    assert all(float(x) > 0 for x in rate), rate
    print("ok - bench/versus --block-trace: WRITE and FLUSH round trips on both sides")
    # rw-sync's slices: the side's server (nbdkit's threads, bucketfs's) took samples.
    for r in list(csv.DictReader(open(os.path.join(d, "slices-rw-sync.tsv")), delimiter="\t")):
        data = os.path.join(d, "profile-rw-sync-%s-%s.data" % (r["slice"], r["side"]))
        comms = subprocess.run(["perf", "script", "-i", data, "-F", "comm"], capture_output=True,
                               text=True, check=True).stdout.split()
        server = ("nbdkit",) if r["side"] == "A" else ("bucketfs", "tokio-rt-worker", "bucketfs-journa")
        assert any(c in server for c in comms), (data, len(comms))
    print("ok - bench/versus --profile: every rw-sync slice's profile holds its server's samples")
print("ok - bench/versus: two workloads of 4 slices in A B B A order, TPS, CPU and the pair ratios")
PY
    log "ok - bench/versus: summary complete"
}

# versus_run NAME ARGS...: bench/versus ARGS --results $TEST_DIR/NAME, its output in
# $TEST_DIR/NAME.out (the tail printed if it fails). The storage lines are read after 5 s
# instead of 45: bench/versus then looks again every 5 s until the files and `bucketfs status`
# agree, which is what the checks below need, and 40 s of sleep per workload is saved.
versus_run() {
    local name=$1 rc=0
    shift
    log "bench/versus $*"
    STORAGE_SETTLE_S=5 timeout --kill-after=20 "$BENCH_TIMEOUT_S" "$REPO_ROOT/bench/versus" "$@" --results "$TEST_DIR/$name" \
        >"$TEST_DIR/$name.out" 2>&1 || rc=$?
    if ((rc != 0)); then
        tail -n 40 "$TEST_DIR/$name.out" >&2
        die "bench/versus exited $rc"
    fi
}

# bench/versus against the durable reference, nbdkit's file plugin, on a zram device (--zram):
# its stack came up beside bucketfs's, both sides have a TPS and their server's CPU in rw-sync,
# the summary names the reference and the scratch device (write-through), and the zram device
# and its mount are gone afterwards.
run_versus_durable() {
    local zram_before
    zram_before=$(zram_devices)
    versus_run versus-file --zram --reference nbdkit-file --workloads rw-sync --slices 2 --duration 3 --scale 1 --clients 4
    [[ $(zram_devices) == "$zram_before" ]] || die "bench/versus --zram left a zram device: $(zram_devices)"
    ! grep -q bucketfs-versus-zram /proc/mounts || die "bench/versus --zram left its mount"
    python3 - "$TEST_DIR/versus-file" <<'PY' || die "bench/versus --zram --reference nbdkit-file: results incomplete"
import csv, os, sys
d = sys.argv[1]
rows = list(csv.DictReader(open(os.path.join(d, "slices-rw-sync.tsv")), delimiter="\t"))
assert [r["side"] for r in rows] == ["A", "B"], rows
assert all(float(r["tps"]) > 0 and float(r["server_cpu_us_per_tx"]) > 0 for r in rows), rows
text = open(os.path.join(d, "summary.txt")).read()
assert text.startswith("scratch: ext4 on /dev/zram") and ", write cache: write through\n" in text, text
assert "A nbdkit-file" in text and "B bucketfs" in text, text
assert "B/A TPS over 1 neighbouring pairs: mean" in text, text
print("ok - bench/versus --zram --reference nbdkit-file: both sides measured on zram, the summary names both")
PY
}
# bench/versus between two bucketfs builds (here the same binary twice): each side had its own
# server, with a TPS and that server's CPU, the summary names the reference's binary and the bytes
# each one's log wrote and stores, and both servers are gone afterwards.
run_versus_builds() {
    versus_run versus-builds --reference "bucketfs:$BUCKETFS" --workloads rw-async --slices 2 --duration 3 --scale 1 --clients 4
    python3 - "$TEST_DIR/versus-builds" "$BUCKETFS" <<'PY' || die "bench/versus --reference bucketfs:BINARY: results incomplete"
import csv, os, re, sys
d, binary = sys.argv[1], os.path.realpath(sys.argv[2])
rows = list(csv.DictReader(open(os.path.join(d, "slices-rw-async.tsv")), delimiter="\t"))
assert [r["side"] for r in rows] == ["A", "B"], rows
assert all(float(r["tps"]) > 0 and float(r["server_cpu_us_per_tx"]) > 0 for r in rows), rows
text = open(os.path.join(d, "summary.txt")).read()
assert f"A bucketfs:{binary}" in text and "B bucketfs" in text, text
assert "B/A TPS over 1 neighbouring pairs: mean" in text, text
for side in "AB":
    m = re.search(r"^rw-async: storage %s: log written ([\d.]+) MB, stored ([\d.]+) MB \(status: ([\d.]+) MB\), "
                  r"([\d.]+) MB live \(stored / live ([\d.]+)\); flushes \d+ \(lz4 \d+\); "
                  r"extents repacked \d+, defragmented \d+, re-sealed \d+, [\d.]+ MB live in lz4 objects$" % side, text, re.M)
    # The files of log/, once the journal has stored them, are what the engine counts (within
    # 2 %: an object the collector wrote late in the settling time may still be in the journal).
    assert m and float(m.group(1)) > 0 and float(m.group(2)) > 0, text
    assert abs(float(m.group(2)) - float(m.group(3))) <= 0.02 * float(m.group(3)), text
    # Live bytes are some of those stored, and the ratio is theirs.
    stored, live, ratio = float(m.group(3)), float(m.group(4)), float(m.group(5))
    assert 0 < live <= stored and abs(ratio - stored / live) <= 0.02 * ratio + 0.01, text
print("ok - bench/versus --reference bucketfs:BINARY: two servers side by side, both measured, their buckets' bytes")
PY
    ! pgrep -f "run -c .*/bucketfs-versus\.[^/]*/[AB]/bucket/bucketfs\.toml" >/dev/null ||
        die "a bucketfs server outlived bench/versus: $(pgrep -af 'bucketfs-versus\.')"
}
# bench/storage, two short slices: a row per slice, every column a number, live bytes some of
# those stored and the ratio theirs, and its server gone afterwards.
run_storage() {
    local results=$TEST_DIR/storage rc=0
    log "bench/storage --slices 2 --slice-seconds 3 --scale 1 --clients 4"
    timeout --kill-after=20 "$BENCH_TIMEOUT_S" "$REPO_ROOT/bench/storage" --slices 2 --slice-seconds 3 \
        --scale 1 --clients 4 --results "$results" >"$TEST_DIR/storage.out" 2>&1 || rc=$?
    if ((rc != 0)); then
        tail -n 40 "$TEST_DIR/storage.out" >&2
        die "bench/storage exited $rc"
    fi
    python3 - "$results/storage.tsv" <<'PY' || die "bench/storage: rows incomplete"
import csv, sys
lines = [l for l in open(sys.argv[1]) if not l.startswith("#")]
rows = list(csv.DictReader(lines, delimiter="\t"))
assert len(rows) == 2, rows
for r in rows:
    assert all(float(v) >= 0 for v in r.values()), r
    stored, live = float(r["stored_MB"]), float(r["live_MB"])
    assert float(r["tps"]) > 0 and float(r["written_MB"]) >= stored >= live > 0, r
    assert abs(float(r["stored/live"]) - stored / live) <= 0.05, r
    assert float(r["database_MB"]) > 0 and float(r["ext4_used_MB"]) > float(r["database_MB"]), r
assert float(rows[0]["s"]) < float(rows[1]["s"]), rows
print("ok - bench/storage: a row per slice, stored, live and their ratio consistent")
PY
    ! pgrep -f "run -c .*/bucketfs-storage\.[^/]*/B/bucket/bucketfs\.toml" >/dev/null ||
        die "a bucketfs server outlived bench/storage: $(pgrep -af 'bucketfs-storage\.')"
    log "ok - bench/storage"
}
zram_devices() { find /sys/block -maxdepth 1 -name 'zram*' -printf '%f ' | tr ' ' '\n' | sort | tr '\n' ' '; }

for backend in $BUCKETFS_TEST_BACKENDS; do
    case $backend in
    file)
        proxy_selftest
        run_bench tiny-file local,bucketfs-file,bucketfs-s3-lat --latency 10ms --bandwidth 50MB/s
        run_rounds
        run_ab
        run_versus
        run_versus_durable
        run_versus_builds
        run_storage
        ;;
    s3)
        run_bench tiny-s3 local,bucketfs-s3,peer \
            --peer-nbd 'nbdkit --foreground -p {port} -i 127.0.0.1 memory {size}' --peer-name nbdkit-peer
        ;;
    *) die "unknown backend '$backend'" ;;
    esac
done
log "PASS"
