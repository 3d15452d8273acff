#!/usr/bin/env python3
"""PostgreSQL's counters around pgbench slices (bench/versus), from bench/common.sh's pg_counters.

    bench/pgcounters.py header                        the TSV's header: slice, side, COLUMNS
    bench/pgcounters.py row BEFORE_JSON AFTER_JSON    a row's COLUMNS: what the slice did
    bench/pgcounters.py summary PG_TSV WORKLOAD       per side, the median of every column

The row's columns (COLUMNS below): WAL megabytes, full-page images and WAL syncs (fsyncs of the
WAL, each one FLUSH to the NBD server), writes forced by full WAL buffers, blocks read from the
kernel and buffers written by backends themselves during the slice; pgbench_accounts' dead
tuples and size (heap and indexes, MB) when the slice began.
"""
import csv
import json
import statistics
import sys

COLUMNS = ("wal_mb", "wal_fpi", "wal_sync", "wal_buffers_full", "blks_read", "buffers_backend",
           "dead_tuples_at_start", "accounts_mb_at_start")


def row(before, after):
    b, a = json.loads(before), json.loads(after)
    delta = lambda k: a[k] - b[k]
    values = (delta("wal_bytes") / 1e6, delta("wal_fpi"), delta("wal_sync"),
              delta("wal_buffers_full"), delta("blks_read"), delta("buffers_backend"),
              b["dead_tuples"], b["accounts_bytes"] / 1e6)
    print("\t".join("%.1f" % v if isinstance(v, float) else str(v) for v in values))


def summary(path, workload):
    rows = list(csv.DictReader(open(path), delimiter="\t"))
    print("%s: PostgreSQL per slice, medians (%s)" % (workload, path.rsplit("/", 1)[-1]))
    for side in ("A", "B"):
        mine = [r for r in rows if r["side"] == side]
        if mine:
            print("  %s %s" % (side, ", ".join(
                "%s %g" % (c, statistics.median(float(r[c]) for r in mine)) for c in COLUMNS)))


if __name__ == "__main__":
    if sys.argv[1:] == ["header"]:
        print("\t".join(("slice", "side") + COLUMNS))
    elif len(sys.argv) == 4 and sys.argv[1] == "row":
        row(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "summary":
        summary(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
