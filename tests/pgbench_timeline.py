"""TPS per second around an object-store outage, for tests/pg_outage.sh.

    pgbench_timeline.py PROGRESS_LOG PHASES RECOVER_WITHIN_S

PROGRESS_LOG is pgbench's output with `-P 1 --progress-timestamp` (a line "progress: EPOCH s,
TPS tps, ..." per second, each counting the transactions of the second that ends at EPOCH).
PHASES has a line "EPOCH EVENT" per event: `start` (pgbench started), a fault mode each time
one begins (the first one starts the outage), `end` (the store answers again).

Prints the timeline, one line per second relative to the start of the outage, then checks:
  - before: the median of the seconds from WARMUP_S after the start to the outage is above 0;
  - during: once GRACE_S have passed (barriers whose upload was already on its way may still
    finish), no second reaches OUTAGE_FRACTION_MAX of that median, since with
    synchronous_commit = on no commit can be acknowledged while no upload can be stored;
  - after: within RECOVER_WITHIN_S of the end, a second reaches RECOVERED_FRACTION of it.
Exit status 0 when all hold, 1 when one does not, 2 on unusable input.
"""
import re
import statistics
import sys

WARMUP_S = 5.0  # pgbench's first seconds: connections, cold caches
GRACE_S = 2.0
OUTAGE_FRACTION_MAX = 0.05
RECOVERED_FRACTION = 0.5
BAR_WIDTH_MAX = 40

PROGRESS = re.compile(r"^progress: ([0-9]+(?:\.[0-9]+)?) s, ([0-9]+(?:\.[0-9]+)?) tps")


def main(argv):
    if len(argv) != 4:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    recover_within_s = float(argv[3])
    points = []
    with open(argv[1]) as f:
        for line in f:
            m = PROGRESS.match(line)
            if m:
                points.append((float(m.group(1)), float(m.group(2))))
    phases = []
    with open(argv[2]) as f:
        for line in f:
            if line.strip():
                t, event = line.split()
                phases.append((float(t), event))
    events = [e for _, e in phases]
    if len(phases) < 3 or events[0] != "start" or events[-1] != "end" or not points:
        print("pgbench_timeline: need progress lines and phases start, MODE..., end; got %d "
              "progress lines and phases %s" % (len(points), events), file=sys.stderr)
        return 2
    started, outage_start, outage_end = phases[0][0], phases[1][0], phases[-1][0]

    def phase_at(t):
        """The event in force in the middle of the second that ends at t."""
        label = ""
        for pt, event in phases[1:]:
            if pt <= t - 0.5:
                label = "" if event == "end" else event
        return label

    before = [tps for t, tps in points if started + WARMUP_S <= t - 1 and t <= outage_start]
    if len(before) < 3:
        print("pgbench_timeline: only %d seconds before the outage" % len(before), file=sys.stderr)
        return 2
    median = statistics.median(before)
    top = max(tps for _, tps in points) or 1.0
    print("timeline (seconds from the start of the outage; the fault in force; tps):")
    for t, tps in points:
        bar = "#" * round(BAR_WIDTH_MAX * tps / top)
        print("  %+5d s %-7s %7.1f %s" % (round(t - outage_start), phase_at(t), tps, bar))

    ok = True
    during = [(t, tps) for t, tps in points if t - 1 >= outage_start + GRACE_S and t <= outage_end]
    limit = OUTAGE_FRACTION_MAX * median
    worst = max(during, key=lambda p: p[1]) if during else None
    if not during:
        print("FAIL: no second of the outage past the grace of %.0f s" % GRACE_S)
        ok = False
    elif worst[1] > limit:
        print("FAIL: %.1f tps at %+.0f s, during the outage (more than %.0f%% of %.1f)" % (
            worst[1], worst[0] - outage_start, OUTAGE_FRACTION_MAX * 100, median))
        ok = False
    target = RECOVERED_FRACTION * median
    recovered = next(((t, tps) for t, tps in points if t > outage_end and tps >= target), None)
    after = [tps for t, tps in points if t > outage_end]
    if recovered is None:
        print("FAIL: TPS never came back to %.1f (%.0f%% of %.1f) after the outage; %d seconds "
              "after it" % (target, RECOVERED_FRACTION * 100, median, len(after)))
        ok = False
    elif recovered[0] - outage_end > recover_within_s:
        print("FAIL: TPS came back to %.1f only %.1f s after the store did (limit %.0f s)" % (
            target, recovered[0] - outage_end, recover_within_s))
        ok = False
    print("summary: before the outage median %.1f tps; during it (past %.0f s) at most %.1f tps; "
          "back to >= %.1f tps %s after the store; median after it %.1f tps" % (
              median, GRACE_S, worst[1] if worst else float("nan"), target,
              "%.1f s" % (recovered[0] - outage_end) if recovered else "never",
              statistics.median(after) if after else float("nan")))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
