#!/usr/bin/env python3
"""bench/report.py — turn a bench/run results directory into figures, tables, charts and HTML.

    report.py build DIR              results.json, pgbench.csv, fio.csv, cost.csv, timeseries.csv,
                                     charts/*.png, report.html; the tables on stdout
    report.py markdown DIR           the same tables as Markdown (for docs/benchmarks.md)
    report.py txlog OUT.json FILE... summarise the pgbench --log files of one run (bench/run calls
                                     this after every run, then deletes the large raw files)

Figures per pgbench run (DIR/pgbench/TARGET.SCALE.WORKLOAD.{log,meta.json,tx.json}):
  tps              pgbench's overall figure; for init the column holds the load time in seconds
  vs local         tps / the local target's tps for the same scale and workload (init: local
                   time / time), so below 1 always means slower than the local disk
  p50/p95/p99      per-transaction latency percentiles from pgbench --log, in ms
  steady           the slowest 10-second window's average / the median second (1 = flat)
  cost             object-store requests and bytes (from `bucketfs status` before and after)
                   per 1,000 transactions and per GiB written to the block device (the loop
                   device's own write counter)
  barriers         bucketfs targets: the client flush barriers of the run, whole and per part,
                   count, mean, p50, p99 (from `bucketfs metrics` before and after; the
                   quantiles interpolated within histogram buckets, as PromQL does)
Figures per fio job (DIR/fio/TARGET.JOB.{json,meta.json}): IOPS, MiB/s, completion-latency
percentiles, vs local (IOPS / local IOPS), object-store requests per GiB the job moved.
Charts need matplotlib; without it the report has tables only (and says so).
"""
import base64
import csv
import glob
import html
import json
import os
import statistics
import sys
import re

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import prom_text  # noqa: E402  (tests/prom_text.py: the exposition format, the breakdown)

WORKLOADS = ["init", "rw-sync", "rw-async", "ro"]
WORKLOAD_TITLES = {
    "init": "bulk load (pgbench -i)",
    "rw-sync": "read-write, synchronous_commit = on",
    "rw-async": "read-write, synchronous_commit = off",
    "ro": "read-only (-S)",
}
WINDOW_S = 10  # the steadiness window
REQUESTS = ["put", "get", "list", "delete"]
GIB = 2**30
MIB = 2**20

PROGRESS = re.compile(r"^progress: ([0-9.]+) s, ([0-9.]+) tps")
TPS = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)")
TXN = re.compile(r"^number of transactions actually processed: (\d+)")
FAILED = re.compile(r"^number of failed transactions: (\d+)")


# --- pgbench --log files -------------------------------------------------------------------------

def percentile(sorted_values, p):
    """Nearest-rank percentile of an ascending list (None when empty)."""
    if not sorted_values:
        return None
    k = max(0, min(len(sorted_values) - 1, int(round(p / 100.0 * len(sorted_values) + 0.5)) - 1))
    return sorted_values[k]


def summarise_txlog(paths):
    """Per-transaction log lines: client_id tx_no latency_us script_no epoch_s epoch_us [...]."""
    ends, lats, failed = [], [], 0
    for path in paths:
        if not os.path.exists(path):
            continue
        with open(path, errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 6:
                    continue
                if not parts[2].isdigit():
                    failed += 1  # "failed" or "skipped" instead of a latency
                    continue
                lat_us = int(parts[2])
                lats.append(lat_us)
                ends.append(int(parts[4]) + int(parts[5]) / 1e6)
    out = {"transactions": len(lats), "failed": failed}
    if not lats:
        return out
    start = min(e - l / 1e6 for e, l in zip(ends, lats))
    per_second = {}
    for e, l in zip(ends, lats):
        per_second.setdefault(int(e - start), []).append(l)
    seconds = sorted(per_second)
    series = {"second": [], "tps": [], "p50_ms": [], "p99_ms": []}
    for s in range(seconds[0], seconds[-1] + 1):
        v = sorted(per_second.get(s, []))
        series["second"].append(s + 1)
        series["tps"].append(len(v))
        series["p50_ms"].append(round(percentile(v, 50) / 1e3, 3) if v else None)
        series["p99_ms"].append(round(percentile(v, 99) / 1e3, 3) if v else None)
    lats.sort()
    out["latency_ms"] = {
        "mean": round(sum(lats) / len(lats) / 1e3, 3),
        "p50": round(percentile(lats, 50) / 1e3, 3),
        "p95": round(percentile(lats, 95) / 1e3, 3),
        "p99": round(percentile(lats, 99) / 1e3, 3),
        "p99.9": round(percentile(lats, 99.9) / 1e3, 3),
        "max": round(lats[-1] / 1e3, 3),
    }
    out["per_second"] = series
    return out


# --- loading a results directory -----------------------------------------------------------------

def read_json(path, default=None):
    if not os.path.exists(path):
        return default
    with open(path) as f:
        return json.load(f)


def counter_delta(before, after):
    if not before or not after or not before.get("object_store") or not after.get("object_store"):
        return None
    b, a = before["object_store"], after["object_store"]
    return {k: a[k] - b[k] for k in a if isinstance(a.get(k), int) and isinstance(b.get(k), int)}


def cost(delta, transactions, bytes_basis):
    """Requests and bytes per 1,000 transactions and per GiB of BYTES_BASIS."""
    if delta is None:
        return None
    out = {"requests": {k: delta.get(k, 0) for k in REQUESTS},
           "bytes_up": delta.get("bytes_written", 0), "bytes_down": delta.get("bytes_read", 0),
           "errors": delta.get("errors", 0)}
    if transactions:
        per = 1000.0 / transactions
        out["per_1k_tx"] = {k: round(delta.get(k, 0) * per, 2) for k in REQUESTS}
        out["per_1k_tx"]["mib_up"] = round(delta.get("bytes_written", 0) * per / MIB, 3)
        out["per_1k_tx"]["mib_down"] = round(delta.get("bytes_read", 0) * per / MIB, 3)
    if bytes_basis:
        per = GIB / bytes_basis
        out["per_gib"] = {k: round(delta.get(k, 0) * per, 1) for k in REQUESTS}
        out["per_gib"]["gib_up"] = round(delta.get("bytes_written", 0) / bytes_basis, 3)
        out["per_gib"]["gib_down"] = round(delta.get("bytes_read", 0) / bytes_basis, 3)
    return out


def cpu_cost(before, after, transactions):
    """CPU microseconds per transaction of the server, nbdfuse and the whole machine (busy), and
    the share of the machine that was busy; None without counters (results of older runs)."""
    if not before or not after:
        return None
    out = {"machine_busy": round((after["machine_busy_s"] - before["machine_busy_s"]) /
                                 max(after["machine_s"] - before["machine_s"], 1e-9), 3)}
    for name, key in (("server", "server_s"), ("nbdfuse", "nbdfuse_s"), ("machine", "machine_busy_s")):
        b, a = before.get(key), after.get(key)
        out[name + "_us_per_tx"] = round((a - b) * 1e6 / transactions, 1) \
            if transactions and a is not None and b is not None else None
    return out


def load_pgbench_run(meta_path):
    meta = read_json(meta_path)
    base = meta_path[: -len(".meta.json")]
    samples, tps, txn, failed = [], None, None, None
    if os.path.exists(base + ".log"):
        with open(base + ".log", errors="replace") as f:
            for line in f:
                m = PROGRESS.match(line)
                if m:
                    samples.append(float(m.group(2)))
                elif TPS.match(line):
                    tps = float(TPS.match(line).group(1))
                elif TXN.match(line):
                    txn = int(TXN.match(line).group(1))
                elif FAILED.match(line):
                    failed = int(FAILED.match(line).group(1))
    run = {k: meta.get(k) for k in ("target", "scale_name", "scale", "workload", "synchronous_commit",
                                    "clients", "duration_s", "pgbench_args", "loadavg_1m")}
    run["elapsed_s"] = round(meta["elapsed_s"], 2)
    if run["workload"] != "init":
        run["tps"] = tps
        run["transactions"] = txn
        run["failed"] = failed
        run["progress_tps"] = samples
        if samples:
            run["median_tps"] = round(statistics.median(samples), 1)
            width = min(WINDOW_S, len(samples))
            windows = [sum(samples[i:i + width]) / width for i in range(len(samples) - width + 1)]
            run["min_10s_tps"] = round(min(windows), 1)
            run["steady"] = round(run["min_10s_tps"] / run["median_tps"], 3) if run["median_tps"] else None
        tx = read_json(base + ".tx.json", {})
        run["latency_ms"] = tx.get("latency_ms")
        ps = tx.get("per_second")
        if ps and run.get("duration_s"):
            # The last, partial second (clients finishing their transaction) is not a sample.
            keep = [i for i, sec in enumerate(ps["second"]) if sec <= run["duration_s"]]
            ps = {k: [v[i] for i in keep] for k, v in ps.items()}
        run["per_second"] = ps
    db, da = meta.get("device_before"), meta.get("device_after")
    if db and da:
        run["device"] = {"read_bytes": da["read_bytes"] - db["read_bytes"],
                         "write_bytes": da["write_bytes"] - db["write_bytes"]}
    run["cpu"] = cpu_cost(meta.get("cpu_before"), meta.get("cpu_after"), run.get("transactions"))
    delta = counter_delta(meta.get("store_before"), meta.get("store_after"))
    if delta is not None:
        run["object_store"] = delta
        run["cost"] = cost(delta, run.get("transactions"), (run.get("device") or {}).get("write_bytes"))
    if os.path.exists(base + ".metrics-after.prom"):
        with open(base + ".metrics-before.prom") as b, open(base + ".metrics-after.prom") as a:
            run["barriers"] = prom_text.breakdown(b.read(), a.read())
    return run


def load_fio_job(meta_path):
    meta = read_json(meta_path)
    out = read_json(meta_path[: -len(".meta.json")] + ".json")
    job = out["jobs"][0]
    side = job["write" if "write" in meta["rw"] else "read"]
    pct = side.get("clat_ns", {}).get("percentile", {})

    def p(name):
        v = pct.get(name)
        return round(v / 1e6, 3) if v is not None else None

    run = {k: meta.get(k) for k in ("target", "job", "rw", "bs", "iodepth", "runtime_s", "size",
                                    "engine", "loadavg_1m")}
    run.update({
        "iops": round(side["iops"], 1), "bw_mib_s": round(side["bw_bytes"] / MIB, 2),
        "io_bytes": side["io_bytes"],
        "latency_ms": {"mean": round(side["clat_ns"]["mean"] / 1e6, 3), "p50": p("50.000000"),
                       "p95": p("95.000000"), "p99": p("99.000000")},
    })
    delta = counter_delta(meta.get("store_before"), meta.get("store_after"))
    if delta is not None:
        run["object_store"] = delta
        run["cost"] = cost(delta, None, side["io_bytes"])
        run["cost"]["basis"] = "written" if "write" in meta["rw"] else "read"
    return run


def target_order(settings, runs):
    order = list(settings.get("targets") or [])
    for r in runs:
        if r["target"] not in order:
            order.append(r["target"])
    return order


def label_of(settings, target):
    peer = settings.get("peer") or {}
    if target == "peer" and peer.get("name"):
        return peer["name"]
    return target


def load(results_dir):
    settings = read_json(os.path.join(results_dir, "settings.json"), {})
    pg = [load_pgbench_run(p) for p in sorted(glob.glob(os.path.join(results_dir, "pgbench", "*.meta.json")))]
    fio = [load_fio_job(p) for p in sorted(glob.glob(os.path.join(results_dir, "fio", "*.meta.json")))]
    order = target_order(settings, pg + fio)
    scale_order = list((settings.get("scales") or {}).keys())
    job_order = [j.split()[0] for j in settings.get("fio_jobs", [])]

    def pg_key(r):
        s = scale_order.index(r["scale_name"]) if r["scale_name"] in scale_order else 99
        return (s, WORKLOADS.index(r["workload"]) if r["workload"] in WORKLOADS else 9,
                order.index(r["target"]))

    def fio_key(r):
        j = job_order.index(r["job"]) if r["job"] in job_order else 99
        return (j, order.index(r["target"]))

    pg.sort(key=pg_key)
    fio.sort(key=fio_key)
    # Ratios to the local-disk baseline.
    local_pg = {(r["scale_name"], r["workload"]): r for r in pg if r["target"] == "local"}
    for r in pg:
        ref = local_pg.get((r["scale_name"], r["workload"]))
        r["ratio_to_local"] = None
        if ref and r["workload"] == "init" and r["elapsed_s"]:
            r["ratio_to_local"] = round(ref["elapsed_s"] / r["elapsed_s"], 3)
        elif ref and r.get("tps") and ref.get("tps"):
            r["ratio_to_local"] = round(r["tps"] / ref["tps"], 3)
    local_fio = {r["job"]: r for r in fio if r["target"] == "local"}
    for r in fio:
        ref = local_fio.get(r["job"])
        r["ratio_to_local"] = round(r["iops"] / ref["iops"], 3) if ref and ref["iops"] else None
    proxy = []
    for p in sorted(glob.glob(os.path.join(results_dir, "servers", "*.proxy.json"))):
        name = os.path.basename(p)[: -len(".proxy.json")]
        proxy.append({"phase": name, "stats": read_json(p)})
    load_samples = []
    lp = os.path.join(results_dir, "load.log")
    if os.path.exists(lp):
        with open(lp) as f:
            load_samples = [float(l.split()[1]) for l in f if len(l.split()) == 2]
    conditions = {}
    if load_samples:
        conditions["loadavg_1m"] = {"min": min(load_samples), "mean": round(statistics.mean(load_samples), 2),
                                    "max": max(load_samples), "samples": len(load_samples)}
    return {"settings": settings, "conditions": conditions, "targets": order,
            "labels": {t: label_of(settings, t) for t in order},
            "pgbench": pg, "fio": fio, "s3proxy": proxy}


# --- formatting ---------------------------------------------------------------------------------

def fmt(v, spec="{:.2f}"):
    return "-" if v is None else spec.format(v)


def fmt_ms(v):
    if v is None:
        return "-"
    if v < 1:
        return "%.3f" % v
    if v < 10:
        return "%.2f" % v
    if v < 100:
        return "%.1f" % v
    return "%.0f" % v


def fmt_num(v):
    if v is None:
        return "-"
    if v >= 100:
        return "%.0f" % v
    if v >= 10:
        return "%.1f" % v
    return "%.2f" % v


def fmt_bytes(n):
    if n is None:
        return "-"
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if n >= size:
            return "%.1f %s" % (n / size, unit)
    return "%d B" % n


def tables(res):
    """[(title, header, rows, notes)] for the terminal and the HTML report."""
    s, labels, out = res["settings"], res["labels"], []
    scales = s.get("scales") or {}
    for scale_name in scales or sorted({r["scale_name"] for r in res["pgbench"]}):
        runs = [r for r in res["pgbench"] if r["scale_name"] == scale_name]
        if not runs:
            continue
        scale = runs[0]["scale"]
        header = ["workload", "target", "TPS", "vs local", "p50 ms", "p95 ms", "p99 ms", "steady",
                  "server CPU µs/tx", "busy CPU µs/tx", "PUT/1k tx", "GET/1k tx", "MiB up/1k tx"]
        rows = []
        for r in runs:
            c = r.get("cost") or {}
            k = c.get("per_1k_tx") or {}
            if r["workload"] == "init":
                lat = {}
                tps = "%.1f s" % r["elapsed_s"]
                puts = fmt((c.get("requests") or {}).get("put"), "{} PUTs")
                gets = fmt((c.get("requests") or {}).get("get"), "{} GETs")
                up = fmt_bytes(c.get("bytes_up")) if c else "-"
            else:
                lat = r.get("latency_ms") or {}
                tps = fmt(r.get("tps"), "{:.0f}")
                puts, gets, up = fmt_num(k.get("put")), fmt_num(k.get("get")), fmt_num(k.get("mib_up"))
            cpu = r.get("cpu") or {}
            rows.append([r["workload"], labels.get(r["target"], r["target"]), tps, fmt(r["ratio_to_local"]),
                         fmt_ms(lat.get("p50")), fmt_ms(lat.get("p95")), fmt_ms(lat.get("p99")),
                         fmt(r.get("steady")), fmt(cpu.get("server_us_per_tx"), "{:.1f}"),
                         fmt(cpu.get("machine_us_per_tx"), "{:.0f}"), puts, gets, up])
        title = "pgbench, scale %s = %s (~%d MiB), %s clients, %s s per run" % (
            scale_name, scale, scale * 15, s.get("clients", "?"), s.get("duration_s", "?"))
        notes = ["TPS: pgbench's overall figure (init: seconds for pgbench -i plus a CHECKPOINT); "
                 "vs local: TPS / local TPS (init: local time / time), below 1 = slower; "
                 "steady: slowest 10 s window / median second; CPU µs/tx: CPU time of the NBD "
                 "server process (all threads) and of the whole machine's busy time, per "
                 "transaction; per 1k tx: bucketfs object-store requests from `bucketfs status`"]
        out.append((title, header, rows, notes))
    if res["fio"]:
        header = ["job", "target", "IOPS", "MiB/s", "vs local", "p50 ms", "p99 ms", "PUT/GiB", "GET/GiB"]
        rows = []
        for r in res["fio"]:
            c = (r.get("cost") or {}).get("per_gib") or {}
            rows.append(["%s %s QD%s" % (r["rw"], r["bs"], r["iodepth"]), labels.get(r["target"], r["target"]),
                         fmt(r["iops"], "{:.0f}"), fmt(r["bw_mib_s"], "{:.1f}"), fmt(r["ratio_to_local"]),
                         fmt_ms(r["latency_ms"]["p50"]), fmt_ms(r["latency_ms"]["p99"]),
                         fmt_num(c.get("put")), fmt_num(c.get("get"))])
        title = "fio, %s s per job over %s (ioengine=nbd; local: libaio, O_DIRECT on a file)" % (
            s.get("fio_runtime_s", "?"), s.get("fio_size", "?"))
        notes = ["write jobs end with a flush (end_fsync=1); latency = completion latency; "
                 "vs local: IOPS / local IOPS; per GiB: object-store requests per GiB the job wrote "
                 "(write jobs) or read (read jobs)"]
        out.append((title, header, rows, notes))
    barrier_rows = []
    for r in res["pgbench"]:
        parts = {p["part"]: p for p in r.get("barriers") or []}
        if not parts.get("barrier", {}).get("count"):
            continue
        cell = lambda p: "%s/%s" % (fmt_ms(parts[p]["p50_ms"]), fmt_ms(parts[p]["p99_ms"]))
        barrier_rows.append([labels.get(r["target"], r["target"]), "%s %s" % (r["scale_name"], r["workload"]),
                             str(parts["barrier"]["count"]), fmt_ms(parts["barrier"]["mean_ms"])]
                            + [cell(p) for p in ["barrier"] + prom_text.PARTS + ["(PUT requests)"]])
    if barrier_rows:
        header = ["target", "run", "barriers", "mean ms", "whole"] + prom_text.PARTS + ["PUT req"]
        title = "flush barriers per part, ms p50/p99 (bucketfs targets; `bucketfs metrics` before and after each run)"
        notes = ["client barriers only (NBD FLUSH and FUA); each part has one observation per barrier, "
                 "zero where the barrier did not go through it; quantiles interpolated within the "
                 "histogram's buckets (1, 1.5, 2, 3, 5, 7 per decade); PUT req: every PUT request of "
                 "the run, barrier or not; docs/0008-metrics.md says where each part begins and ends"]
        out.append((title, header, barrier_rows, notes))
    cost_rows = cost_table_rows(res)
    if cost_rows:
        header = ["target", "run", "device written", "PUT/1k tx", "GET/1k tx", "LIST/1k tx",
                  "DEL/1k tx", "MiB up/1k tx", "MiB down/1k tx", "PUT/GiB", "GET/GiB", "LIST/GiB",
                  "DEL/GiB", "up/written"]
        rows = [[r[c] for c in COST_COLUMNS] for r in cost_rows]
        title = "object-store cost (bucketfs targets; `bucketfs status` before and after each run)"
        notes = ["per GiB: per GiB written to the block device by ext4 + PostgreSQL (pgbench) or by "
                 "fio; up/written: bytes uploaded / bytes written (after compression, with "
                 "metadata and rewrites)"]
        out.append((title, header, [[fmt_cell(v) for v in row] for row in rows], notes))
    return out


COST_COLUMNS = ["target", "run", "device_written", "put_1k", "get_1k", "list_1k", "delete_1k", "mib_up_1k",
                "mib_down_1k", "put_gib", "get_gib", "list_gib", "delete_gib", "up_per_written"]


def fmt_cell(v):
    if isinstance(v, float):
        return fmt_num(v)
    return "-" if v is None else str(v)


def cost_table_rows(res):
    rows = []
    for r in res["pgbench"]:
        c = r.get("cost")
        if not c:
            continue
        k, g = c.get("per_1k_tx") or {}, c.get("per_gib") or {}
        written = (r.get("device") or {}).get("write_bytes")
        rows.append({"target": res["labels"].get(r["target"], r["target"]),
                     "run": "pgbench %s %s" % (r["scale_name"], r["workload"]),
                     "device_written": fmt_bytes(written), "device_written_bytes": written,
                     "transactions": r.get("transactions"),
                     **{"%s_1k" % q: k.get(q) for q in REQUESTS},
                     "mib_up_1k": k.get("mib_up"), "mib_down_1k": k.get("mib_down"),
                     **{"%s_gib" % q: g.get(q) for q in REQUESTS},
                     "up_per_written": g.get("gib_up"), "bytes_up": c["bytes_up"], "bytes_down": c["bytes_down"],
                     **{q: c["requests"][q] for q in REQUESTS}})
    for r in res["fio"]:
        c = r.get("cost")
        if not c or c.get("basis") != "written":
            continue
        g = c.get("per_gib") or {}
        rows.append({"target": res["labels"].get(r["target"], r["target"]),
                     "run": "fio %s" % r["job"], "device_written": fmt_bytes(r["io_bytes"]),
                     "device_written_bytes": r["io_bytes"], "transactions": None,
                     **{"%s_1k" % q: None for q in REQUESTS}, "mib_up_1k": None, "mib_down_1k": None,
                     **{"%s_gib" % q: g.get(q) for q in REQUESTS},
                     "up_per_written": g.get("gib_up"), "bytes_up": c["bytes_up"], "bytes_down": c["bytes_down"],
                     **{q: c["requests"][q] for q in REQUESTS}})
    return rows


def render_text(title, header, rows, notes):
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    lines = ["== %s ==" % title, "  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    prev = None
    for r in rows:
        first = r[0] if r[0] != prev else ""
        prev = r[0]
        lines.append("  ".join(str(c).ljust(w) for c, w in zip([first] + r[1:], widths)).rstrip())
    lines += ["  " + n for n in notes]
    return "\n".join(lines)


def conditions_text(res):
    s, c = res["settings"], res["conditions"]
    m = s.get("machine") or {}
    la = c.get("loadavg_1m") or {}
    parts = ["%s, suite %s" % (s.get("date_utc", "?"), s.get("suite", "?")),
             "%s cores, %s GiB, %s, kernel %s" % (m.get("cpus"), m.get("memory_gib"), m.get("os"), m.get("kernel")),
             "load average (1 min): %s at the start; during the run (its own processes included) "
             "min %s, mean %s, max %s" % ((m.get("loadavg_at_start") or ["?"])[0], la.get("min"), la.get("mean"),
                                          la.get("max"))]
    link = s.get("s3_link") or {}
    targets = res["targets"]
    if any(t.startswith("bucketfs-s3") for t in targets):
        parts.append("S3 server: %s" % s.get("s3_server", "moto"))
    if any(t.startswith("bucketfs-s3-lat") for t in targets):
        parts.append("bucketfs-s3-lat*: %s per request, %s each way (bench/s3proxy.py)" % (
            link.get("latency"), link.get("bandwidth")))
    peer = s.get("peer")
    if peer:
        parts.append("%s: %s" % (peer.get("name"), peer.get("command")))
    parts.append("%s; shared_buffers etc.: %s" % (s.get("postgres_version", "?"), ", ".join(
        x for x in s.get("postgresql_conf", []) if x.startswith(("shared_buffers", "max_wal_size")))))
    if s.get("postgresql_extra"):
        parts.append("added with --pg-setting: %s" % ", ".join(s["postgresql_extra"]))
    return parts


# --- charts -------------------------------------------------------------------------------------

def colors(targets):
    palette = ["#4c4c4c", "#8c8c8c", "#1f77b4", "#2ca02c", "#d62728", "#9467bd", "#ff7f0e", "#17becf"]
    return {t: palette[i % len(palette)] for i, t in enumerate(targets)}


def make_charts(res, outdir):
    """Write the PNG charts; returns [(file, caption)]. Empty when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report: matplotlib is not installed: no charts (scripts/setup installs it)", file=sys.stderr)
        return []
    os.makedirs(outdir, exist_ok=True)
    col, labels, charts = colors(res["targets"]), res["labels"], []
    scales = list((res["settings"].get("scales") or {}).keys()) or sorted({r["scale_name"] for r in res["pgbench"]})
    timed = [w for w in WORKLOADS if w != "init"]
    for scale in scales:
        runs = [r for r in res["pgbench"] if r["scale_name"] == scale and r["workload"] != "init"]
        if not runs:
            continue
        # Throughput over time.
        fig, axes = plt.subplots(len(timed), 1, figsize=(9, 3.0 * len(timed)), squeeze=False)
        for ax, w in zip(axes[:, 0], timed):
            for r in (x for x in runs if x["workload"] == w):
                ps = r.get("per_second") or {}
                xs, ys = ps.get("second"), ps.get("tps")
                if not xs:
                    ys = r.get("progress_tps") or []
                    xs = list(range(1, len(ys) + 1))
                ax.plot(xs, ys, label=labels[r["target"]], color=col[r["target"]], linewidth=1.4)
            ax.set_title("%s — scale %s" % (WORKLOAD_TITLES[w], scale), fontsize=10)
            ax.set_ylabel("transactions/s")
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
        axes[-1, 0].set_xlabel("seconds into the run")
        handles, names = axes[0, 0].get_legend_handles_labels()
        fig.legend(handles, names, fontsize=8, ncol=min(6, len(names) or 1), loc="lower center")
        fig.tight_layout(rect=(0, 0.04, 1, 1))
        name = "throughput-%s.png" % scale
        fig.savefig(os.path.join(outdir, name), dpi=90)
        plt.close(fig)
        charts.append((name, "pgbench throughput per second, scale %s" % scale))
        # Latency percentiles.
        fig, axes = plt.subplots(1, len(timed), figsize=(4.2 * len(timed), 3.6), squeeze=False)
        for ax, w in zip(axes[0], timed):
            wr = [r for r in runs if r["workload"] == w and r.get("latency_ms")]
            pcts = ["p50", "p95", "p99"]
            width = 0.8 / max(1, len(wr))
            for i, r in enumerate(wr):
                xs = [j + i * width for j in range(len(pcts))]
                ax.bar(xs, [r["latency_ms"][p] for p in pcts], width, label=labels[r["target"]],
                       color=col[r["target"]])
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(pcts))])
            ax.set_xticklabels(pcts)
            ax.set_yscale("log")
            ax.set_title(WORKLOAD_TITLES[w], fontsize=9)
            ax.set_ylabel("latency, ms (log)")
            ax.grid(alpha=0.3, axis="y")
        handles, names = axes[0, 0].get_legend_handles_labels()
        fig.legend(handles, names, fontsize=8, ncol=min(6, len(names) or 1), loc="lower center")
        fig.suptitle("pgbench transaction latency, scale %s" % scale, fontsize=10)
        fig.tight_layout(rect=(0, 0.08, 1, 1))
        name = "latency-%s.png" % scale
        fig.savefig(os.path.join(outdir, name), dpi=90)
        plt.close(fig)
        charts.append((name, "pgbench latency percentiles, scale %s" % scale))
    inits = [r for r in res["pgbench"] if r["workload"] == "init"]
    if inits:
        fig, ax = plt.subplots(figsize=(8, 0.45 * len(inits) + 1.2))
        ys = list(range(len(inits)))
        ax.barh(ys, [r["elapsed_s"] for r in inits], color=[col[r["target"]] for r in inits])
        ax.set_yticks(ys)
        ax.set_yticklabels(["%s, %s (%s)" % (labels[r["target"]], r["scale_name"], r["scale"]) for r in inits],
                           fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("seconds (pgbench -i + CHECKPOINT)")
        ax.set_title("bulk load time", fontsize=10)
        ax.grid(alpha=0.3, axis="x")
        fig.tight_layout()
        fig.savefig(os.path.join(outdir, "init.png"), dpi=90)
        plt.close(fig)
        charts.append(("init.png", "bulk load time per target"))
    if res["fio"]:
        jobs = []
        for r in res["fio"]:
            if r["job"] not in jobs:
                jobs.append(r["job"])
        targets = [t for t in res["targets"] if any(r["target"] == t for r in res["fio"])]
        by = {(r["job"], r["target"]): r for r in res["fio"]}
        rand = [j for j in jobs if not j.startswith("seq-")]
        seq = [j for j in jobs if j.startswith("seq-")]
        fig, axes = plt.subplots(3, 1, figsize=(max(8, 0.9 * len(jobs) + 3), 11))
        width = 0.8 / max(1, len(targets))
        for ax, (sel, metric, ylabel, log) in zip(axes, [
                (rand, lambda r: r["iops"], "IOPS (log)", True),
                (seq, lambda r: r["bw_mib_s"], "MiB/s", False),
                (jobs, lambda r: r["latency_ms"]["p99"], "p99 latency, ms (log)", True)]):
            for i, t in enumerate(targets):
                xs = [j + i * width for j in range(len(sel))]
                vals = [metric(by[(job, t)]) if (job, t) in by and metric(by[(job, t)]) is not None else 0
                        for job in sel]
                ax.bar(xs, vals, width, label=labels[t], color=col[t])
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(sel))])
            ax.set_xticklabels(sel, fontsize=8, rotation=20)
            ax.set_ylabel(ylabel)
            if log:
                ax.set_yscale("log")
            ax.grid(alpha=0.3, axis="y")
        axes[0].set_title("fio random I/O", fontsize=10)
        axes[1].set_title("fio sequential 1 MiB", fontsize=10)
        axes[2].set_title("fio completion latency p99", fontsize=10)
        handles, names = axes[0].get_legend_handles_labels()
        fig.legend(handles, names, fontsize=8, ncol=min(6, len(names) or 1), loc="lower center")
        fig.tight_layout(rect=(0, 0.04, 1, 1))
        fig.savefig(os.path.join(outdir, "fio.png"), dpi=90)
        plt.close(fig)
        charts.append(("fio.png", "fio IOPS, bandwidth and p99 latency"))
    costed = [r for r in res["pgbench"] if r.get("cost") and r["workload"] != "init"
              and (r["cost"].get("per_1k_tx") or {})]
    if costed:
        fig, ax = plt.subplots(figsize=(9, 0.45 * len(costed) + 1.5))
        ys = list(range(len(costed)))
        left = [0.0] * len(costed)
        for q, c in zip(REQUESTS, ["#1f77b4", "#2ca02c", "#9467bd", "#d62728"]):
            vals = [r["cost"]["per_1k_tx"][q] for r in costed]
            ax.barh(ys, vals, left=left, color=c, label=q.upper())
            left = [a + b for a, b in zip(left, vals)]
        ax.set_yticks(ys)
        ax.set_yticklabels(["%s, %s %s" % (labels[r["target"]], r["scale_name"], r["workload"]) for r in costed],
                           fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("object-store requests per 1,000 transactions")
        ax.set_title("object-store cost of pgbench", fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, axis="x")
        fig.tight_layout()
        fig.savefig(os.path.join(outdir, "cost.png"), dpi=90)
        plt.close(fig)
        charts.append(("cost.png", "object-store requests per 1,000 pgbench transactions"))
    return charts


# --- outputs ------------------------------------------------------------------------------------

CPU_COLUMNS = ["server_us_per_tx", "nbdfuse_us_per_tx", "machine_us_per_tx", "machine_busy"]


def write_csvs(res, results_dir):
    with open(os.path.join(results_dir, "pgbench.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["target", "scale_name", "scale", "workload", "synchronous_commit", "clients", "duration_s",
                    "elapsed_s", "tps", "ratio_to_local", "median_tps", "min_10s_tps", "steady", "transactions",
                    "failed", "lat_mean_ms", "lat_p50_ms", "lat_p95_ms", "lat_p99_ms", "lat_p999_ms",
                    "device_read_bytes", "device_write_bytes"] + CPU_COLUMNS + REQUESTS + ["bytes_up", "bytes_down"]
                   + ["%s_per_1k_tx" % q for q in REQUESTS] + ["%s_per_gib_written" % q for q in REQUESTS])
        for r in res["pgbench"]:
            lat, dev, c = r.get("latency_ms") or {}, r.get("device") or {}, r.get("cost") or {}
            req, k, g = c.get("requests") or {}, c.get("per_1k_tx") or {}, c.get("per_gib") or {}
            w.writerow([r["target"], r["scale_name"], r["scale"], r["workload"], r["synchronous_commit"],
                        r["clients"], r["duration_s"], r["elapsed_s"], r.get("tps"), r["ratio_to_local"],
                        r.get("median_tps"), r.get("min_10s_tps"), r.get("steady"), r.get("transactions"),
                        r.get("failed"), lat.get("mean"), lat.get("p50"), lat.get("p95"), lat.get("p99"),
                        lat.get("p99.9"), dev.get("read_bytes"), dev.get("write_bytes")]
                       + [(r.get("cpu") or {}).get(q) for q in CPU_COLUMNS] + [req.get(q) for q in REQUESTS] + [c.get("bytes_up"), c.get("bytes_down")]
                       + [k.get(q) for q in REQUESTS] + [g.get(q) for q in REQUESTS])
    with open(os.path.join(results_dir, "fio.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["target", "job", "rw", "bs", "iodepth", "engine", "runtime_s", "iops", "bw_mib_s",
                    "ratio_to_local", "lat_mean_ms", "lat_p50_ms", "lat_p95_ms", "lat_p99_ms", "io_bytes"]
                   + REQUESTS + ["bytes_up", "bytes_down"] + ["%s_per_gib" % q for q in REQUESTS])
        for r in res["fio"]:
            c = r.get("cost") or {}
            req, g = c.get("requests") or {}, c.get("per_gib") or {}
            w.writerow([r["target"], r["job"], r["rw"], r["bs"], r["iodepth"], r["engine"], r["runtime_s"],
                        r["iops"], r["bw_mib_s"], r["ratio_to_local"], r["latency_ms"]["mean"],
                        r["latency_ms"]["p50"], r["latency_ms"]["p95"], r["latency_ms"]["p99"], r["io_bytes"]]
                       + [req.get(q) for q in REQUESTS] + [c.get("bytes_up"), c.get("bytes_down")]
                       + [g.get(q) for q in REQUESTS])
    with open(os.path.join(results_dir, "cost.csv"), "w", newline="") as f:
        cols = ["target", "run", "transactions", "device_written_bytes"] + REQUESTS + ["bytes_up", "bytes_down"] \
            + [c for c in COST_COLUMNS if c not in ("target", "run", "device_written")]
        w = csv.writer(f)
        w.writerow(cols)
        for r in cost_table_rows(res):
            w.writerow([r.get(c) for c in cols])
    with open(os.path.join(results_dir, "timeseries.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["target", "scale_name", "workload", "second", "tps", "lat_p50_ms", "lat_p99_ms"])
        for r in res["pgbench"]:
            ps = r.get("per_second")
            if not ps:
                continue
            for i, sec in enumerate(ps["second"]):
                w.writerow([r["target"], r["scale_name"], r["workload"], sec, ps["tps"][i], ps["p50_ms"][i],
                            ps["p99_ms"][i]])


def write_html(res, results_dir, tabs, charts, chart_dir):
    e = html.escape
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>bucketfs benchmark %s</title>"
             % e(res["settings"].get("date_utc", "")),
             "<style>body{font-family:sans-serif;max-width:1200px;margin:1em auto;color:#222}"
             "table{border-collapse:collapse;font-size:13px;margin:0.5em 0}"
             "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
             "td:first-child,td:nth-child(2),th{text-align:left}"
             "img{max-width:100%;border:1px solid #eee;margin:0.5em 0}.note{color:#555;font-size:12px}</style>"
             "</head><body><h1>bucketfs benchmark</h1><ul>"]
    parts += ["<li>%s</li>" % e(c) for c in conditions_text(res)]
    parts.append("</ul>")
    for title, header, rows, notes in tabs:
        parts.append("<h2>%s</h2><table><tr>%s</tr>" % (e(title), "".join("<th>%s</th>" % e(h) for h in header)))
        for r in rows:
            parts.append("<tr>%s</tr>" % "".join("<td>%s</td>" % e(str(c)) for c in r))
        parts.append("</table>")
        parts += ["<p class='note'>%s</p>" % e(n) for n in notes]
    if charts:
        parts.append("<h2>Charts</h2>")
    for name, caption in charts:
        with open(os.path.join(chart_dir, name), "rb") as f:
            data = base64.b64encode(f.read()).decode("ascii")
        parts.append("<figure><img alt='%s' src='data:image/png;base64,%s'><figcaption>%s</figcaption></figure>"
                     % (e(caption), data, e(caption)))
    if not charts:
        parts.append("<p>No charts: matplotlib was not installed when this report was made.</p>")
    parts.append("<p class='note'>Raw figures: results.json, pgbench.csv, fio.csv, cost.csv, timeseries.csv "
                 "beside this file.</p></body></html>")
    with open(os.path.join(results_dir, "report.html"), "w") as f:
        f.write("\n".join(parts))


def build(results_dir):
    res = load(results_dir)
    tabs = tables(res)
    chart_dir = os.path.join(results_dir, "charts")
    charts = make_charts(res, chart_dir)
    res["charts"] = [os.path.join("charts", name) for name, _ in charts]
    with open(os.path.join(results_dir, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    write_csvs(res, results_dir)
    write_html(res, results_dir, tabs, charts, chart_dir)
    print("bucketfs benchmark: " + "; ".join(conditions_text(res)))
    for t in tabs:
        print()
        print(render_text(*t))
    print()
    print("report: %s" % os.path.join(results_dir, "report.html"))
    print("raw: results.json, pgbench.csv, fio.csv, cost.csv, timeseries.csv, charts/ in %s" % results_dir)


def render_markdown(title, header, rows, notes):
    lines = ["**%s**" % title, "", "| " + " | ".join(header) + " |",
             "|" + "|".join(" --- " if i < 2 else " ---: " for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    lines += [""] + ["_%s_" % n for n in notes]
    return "\n".join(lines)


def markdown(results_dir):
    """The conditions and tables as Markdown, for docs/benchmarks.md."""
    res = load(results_dir)
    print("\n".join("- %s" % c for c in conditions_text(res)))
    for t in tables(res):
        print()
        print(render_markdown(*t))


def main(argv):
    if len(argv) >= 2 and argv[0] == "build":
        build(argv[1])
    elif len(argv) >= 2 and argv[0] == "markdown":
        markdown(argv[1])
    elif len(argv) >= 2 and argv[0] == "txlog":
        summary = summarise_txlog(argv[2:])
        with open(argv[1], "w") as f:
            json.dump(summary, f)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
