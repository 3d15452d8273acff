#!/usr/bin/env python3
"""bench/blocktrace.py RESULTS_DIR WORKLOAD [NAME_A NAME_B]: the block requests of each traced slice
(`bench/versus --block-trace`), as the client's block stack saw them.

Reads RESULTS_DIR/blocktrace-WORKLOAD-SLICE-SIDE.txt (`perf script` of block_rq_issue and
block_rq_complete, the whole machine) and RESULTS_DIR/blocktrace-WORKLOAD-SLICE-SIDE.dev (the
slice's loop device as MAJOR,MINOR). Keeps that device's events, in order, and measures per
side the time between consecutive events (a WRITE's issue to its completion, that to the next
FLUSH's issue, ...) and the cycle (FLUSH completion to the next). Under pgbench rw-sync every
commit group is one WRITE of the WAL followed by one FLUSH, and requests never overlap
(docs/benchmarks/2026-11-24-rw-sync-gap.md), so these are the round trips and the cycle is one group commit. Where
requests overlap (other workloads), a span is counted only when nothing happened in between."""
import collections
import glob
import os
import re
import statistics
import sys

EVENT = re.compile(
    r"\s(\d+\.\d+):\s+block:block_rq_(issue|complete):\s+(\d+,\d+)\s+(\S+)\s.*?\(\S*\)\s+(\d+)\s+\+\s+(\d+)"
)


def requests(path, dev):
    """(time, 'issue'|'complete', 'W'|'R'|'F') of DEV's requests, in order."""
    out = []
    for line in open(path, errors="replace"):
        m = EVENT.search(line)
        if not m or m[3] != dev:
            continue
        rwbs, sectors = m[4], int(m[6])
        if rwbs.startswith("F"):
            kind = "F"
        elif "W" in rwbs:
            if m[2] == "complete" and sectors == 0:
                continue  # the flush machinery's completion of a write's pre-flush
            kind = "W"
        elif "R" in rwbs:
            kind = "R"
        else:
            continue
        out.append((float(m[1]), m[2], kind))
    return out


def summarise(events):
    spans = collections.defaultdict(list)
    for (t0, ev0, k0), (t1, ev1, k1) in zip(events, events[1:]):
        spans[(ev0[0] + k0, ev1[0] + k1)].append((t1 - t0) * 1e6)
    flush_done = [t for t, ev, k in events if ev == "complete" and k == "F"]
    cycles = [(b - a) * 1e6 for a, b in zip(flush_done, flush_done[1:])]
    seconds = (events[-1][0] - events[0][0]) if len(events) > 1 else 0
    return spans, cycles, seconds


def fmt(values):
    if not values:
        return "-"
    values = sorted(values)
    return "%.0f / %.0f" % (statistics.mean(values), values[len(values) // 2])


def main():
    results, workload = sys.argv[1], sys.argv[2]
    names = dict(zip("AB", sys.argv[3:5]))
    per_side = collections.defaultdict(lambda: (collections.defaultdict(list), [], 0.0, 0))
    for txt in sorted(glob.glob(os.path.join(results, f"blocktrace-{workload}-*.txt"))):
        side = txt.rsplit("-", 1)[1][:-4]
        dev = open(txt[:-4] + ".dev").read().strip()
        spans, cycles, seconds = summarise(requests(txt, dev))
        acc_spans, acc_cycles, acc_s, n = per_side[side]
        for k, v in spans.items():
            acc_spans[k].extend(v)
        acc_cycles.extend(cycles)
        per_side[side] = (acc_spans, acc_cycles, acc_s + seconds, n + 1)
    if not per_side:
        sys.exit(f"blocktrace.py: no traced slices of {workload} in {results}")
    rows = [
        ("WRITE round trip", ("iW", "cW")),
        ("WRITE done -> FLUSH sent", ("cW", "iF")),
        ("FLUSH round trip", ("iF", "cF")),
        ("FLUSH done -> next WRITE", ("cF", "iW")),
    ]
    print(f"{workload}: block requests on each side's loop device, µs mean / median")
    print("%-28s" % "" + "".join("%20s" % names.get(s, s) for s in sorted(per_side)))
    for label, key in rows:
        print("%-28s" % label + "".join("%20s" % fmt(per_side[s][0].get(key, [])) for s in sorted(per_side)))
    print("%-28s" % "cycle (FLUSH to FLUSH)" + "".join("%20s" % fmt(per_side[s][1]) for s in sorted(per_side)))
    print(
        "%-28s" % "FLUSHes per second"
        + "".join(
            "%20.0f" % (len(per_side[s][1]) / per_side[s][2] if per_side[s][2] else 0)
            for s in sorted(per_side)
        )
    )
    print("%-28s" % "traced slices" + "".join("%20d" % per_side[s][3] for s in sorted(per_side)))


main()
