#!/usr/bin/env python3
"""The summary of alternating pgbench slices (bench/ab, bench/versus).

    bench/slices.py SLICES_TSV WORKLOAD DURATION_S LABEL_A LABEL_B

SLICES_TSV has the columns slice, side (A or B), tps, server_cpu_us_per_tx (empty where there is
no server process, e.g. a local disk), machine_busy, postgres_cpu_us_per_tx (PostgreSQL's
backends) and steal (the share of the machine the hypervisor took), one row per slice in the
order they ran (A B B A ...). Printed per side: TPS median and mean, server and PostgreSQL CPU
per transaction, the mean steal, every slice's TPS; then the ratios B/A of neighbouring slices
(1-2, 3-4, ...): their mean, median and range.
"""
import csv
import statistics
import sys


def number(text):
    return float(text) if text not in ("", None) else None


def main():
    path, workload, duration, label_a, label_b = sys.argv[1:6]
    rows = list(csv.DictReader(open(path), delimiter="\t"))
    print("%s: %d slices of %s s, A B B A ... order" % (workload, len(rows), duration))
    for side, label in (("A", label_a), ("B", label_b)):
        mine = [r for r in rows if r["side"] == side]
        tps = [float(r["tps"]) for r in mine]
        cpu = [c for c in (number(r["server_cpu_us_per_tx"]) for r in mine) if c is not None]
        line = "  TPS median %.0f, mean %.0f" % (statistics.median(tps), statistics.mean(tps))
        if cpu:
            line += "; server CPU per transaction median %.1f us, mean %.1f us" % (
                statistics.median(cpu), statistics.mean(cpu))
        line += "\n  PostgreSQL CPU per transaction median %.1f us; hypervisor steal mean %.1f %%" % (
            statistics.median(float(r["postgres_cpu_us_per_tx"]) for r in mine),
            100 * statistics.mean(float(r["steal"]) for r in mine))
        print("%s %s\n%s" % (side, label, line))
        print("  TPS per slice: %s" % " ".join("%.0f" % t for t in tps))
    # Slices 1-2, 3-4, ... are neighbours in time, one of each side.
    pairs = [{r["side"]: r for r in rows[k:k + 2]} for k in range(0, len(rows) - 1, 2)]
    for field, what in (("tps", "TPS"), ("server_cpu_us_per_tx", "server CPU per transaction"),
                        ("postgres_cpu_us_per_tx", "PostgreSQL CPU per transaction")):
        ratios = []
        for p in pairs:
            a, b = number(p["A"][field]), number(p["B"][field])
            if a and b is not None:
                ratios.append(b / a)
        if ratios:
            print("B/A %s over %d neighbouring pairs: mean %.3f, median %.3f (from %.2f to %.2f)" % (
                what, len(ratios), statistics.mean(ratios), statistics.median(ratios),
                min(ratios), max(ratios)))


if __name__ == "__main__":
    main()
