#!/usr/bin/env python3
"""Summarise a bench/pgbench-compare results directory: results.json and a table on stdout.

Reads, for each TARGET.WORKLOAD pair, the pgbench log (TARGET.WORKLOAD.log, with -P 1 progress
lines) and TARGET.WORKLOAD.meta.json (elapsed time, object-store counters before and after).

Figures per run:
  tps               pgbench's own overall figure ("tps = ... (without initial connection time)")
  median_tps        median of the per-second progress samples
  min_10s_tps       the lowest average over any 10 consecutive progress samples
  flatness          min_10s_tps / median_tps (1.0 = perfectly steady)
  ratio_to_local    tps / tps of the local target for the same workload (for init: local time /
  ratio_to_nbdkit   time), so below 1 always means slower than the reference
  puts_per_1k_tx    object-store PUTs (GETs) during the run per 1,000 transactions (bucketfs only)
"""
import json
import os
import re
import statistics
import sys

WORKLOADS = ["init", "rw-sync", "rw-async", "ro"]
TARGETS = ["local", "nbdkit", "bucketfs"]
WINDOW_S = 10

PROGRESS = re.compile(r"^progress: ([0-9.]+) s, ([0-9.]+) tps")
TPS = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)")
TXN = re.compile(r"^number of transactions actually processed: (\d+)")


def parse_run(results_dir, target, workload):
    base = os.path.join(results_dir, "%s.%s" % (target, workload))
    if not os.path.exists(base + ".meta.json"):
        return None
    with open(base + ".meta.json") as f:
        meta = json.load(f)
    samples, tps, txn = [], None, None
    with open(base + ".log", errors="replace") as f:
        for line in f:
            m = PROGRESS.match(line)
            if m:
                samples.append(float(m.group(2)))
                continue
            m = TPS.match(line)
            if m:
                tps = float(m.group(1))
                continue
            m = TXN.match(line)
            if m:
                txn = int(m.group(1))
    run = {
        "target": target,
        "workload": workload,
        "synchronous_commit": meta.get("synchronous_commit"),
        "pgbench_args": meta.get("pgbench_args"),
        "elapsed_s": round(meta["elapsed_s"], 2),
        "tps": tps,
        "transactions": txn,
        "progress_tps": samples,
    }
    if samples:
        run["median_tps"] = round(statistics.median(samples), 1)
        width = min(WINDOW_S, len(samples))
        windows = [sum(samples[i:i + width]) / width for i in range(len(samples) - width + 1)]
        run["min_10s_tps"] = round(min(windows), 1)
        run["flatness"] = round(run["min_10s_tps"] / run["median_tps"], 3) if run["median_tps"] else None
    before, after = meta.get("object_store_before"), meta.get("object_store_after")
    if before and after:
        delta = {k: after[k] - before[k] for k in after if k in before}
        run["object_store_delta"] = delta
        if txn:
            run["puts_per_1k_tx"] = round(delta.get("put", 0) * 1000 / txn, 2)
            run["gets_per_1k_tx"] = round(delta.get("get", 0) * 1000 / txn, 2)
    return run


def ratio(run, ref):
    if not ref or run is ref:
        return None if not ref else 1.0
    if run["workload"] == "init":
        return round(ref["elapsed_s"] / run["elapsed_s"], 3) if run["elapsed_s"] else None
    if run.get("tps") and ref.get("tps"):
        return round(run["tps"] / ref["tps"], 3)
    return None


def fmt(value, spec="{:.2f}"):
    return "-" if value is None else spec.format(value)


def main():
    results_dir = sys.argv[1]
    runs = {}
    for target in TARGETS:
        for workload in WORKLOADS:
            run = parse_run(results_dir, target, workload)
            if run:
                runs[(target, workload)] = run
    for (target, workload), run in runs.items():
        run["ratio_to_local"] = ratio(run, runs.get(("local", workload)))
        run["ratio_to_nbdkit"] = ratio(run, runs.get(("nbdkit", workload)))

    settings = {}
    settings_path = os.path.join(results_dir, "settings.json")
    if os.path.exists(settings_path):
        with open(settings_path) as f:
            settings = json.load(f)
    with open(os.path.join(results_dir, "results.json"), "w") as f:
        json.dump({"settings": settings, "runs": list(runs.values())}, f, indent=1)

    header = ["target", "workload", "TPS", "median", "min10s", "min10s/med",
              "vs local", "vs nbdkit", "PUT/1k tx", "GET/1k tx"]
    rows = []
    for (target, workload), run in runs.items():
        if workload == "init":
            tps = "%.1f s" % run["elapsed_s"]
            puts = fmt(run.get("object_store_delta", {}).get("put"), "{} PUTs")
            gets = fmt(run.get("object_store_delta", {}).get("get"), "{} GETs")
        else:
            tps = fmt(run.get("tps"), "{:.0f}")
            puts = fmt(run.get("puts_per_1k_tx"))
            gets = fmt(run.get("gets_per_1k_tx"))
        rows.append([target, workload, tps, fmt(run.get("median_tps"), "{:.0f}"),
                     fmt(run.get("min_10s_tps"), "{:.0f}"), fmt(run.get("flatness")),
                     fmt(run["ratio_to_local"]), fmt(run["ratio_to_nbdkit"]), puts, gets])
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    if settings:
        print("pgbench-compare: scale %s, %s s per run, %s clients; %s; ext4 (%s), mount -o %s" % (
            settings.get("scale"), settings.get("duration_s"), settings.get("clients"),
            settings.get("postgres_version"), settings.get("mkfs_opts"), settings.get("mount_opts")))
    print("TPS: pgbench's overall figure (init: seconds); ratios: TPS / reference TPS "
          "(init: reference time / time), below 1 = slower")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    print("raw results: %s" % os.path.join(results_dir, "results.json"))


if __name__ == "__main__":
    main()
