#!/usr/bin/env python3
"""Prometheus' text exposition format (version 0.0.4), read strictly, for tests/metrics.sh and
bench/run's per-barrier breakdown (bench/report.py imports it).

    prom_text.py check FILE...               parse each; exit 1 naming the first line at fault
    prom_text.py value FILE NAME [L=V ...]   print the value of one sample
    prom_text.py breakdown BEFORE AFTER      the barriers between two scrapes: count, mean,
                                             p50 and p99 of the whole and of each part, as a table

What `check` holds a scrape to: every line is a HELP or TYPE comment, another comment, blank, or
a sample `name{label="value",...} value`; names and label names are valid; label values escape
only \\\\, \\" and \\n; a family's TYPE comes once, before its samples; a series appears once; a
histogram's buckets have an `le` label, ascending bounds and non-decreasing counts, end with
`+Inf`, and that bucket equals its `_count`, beside which there is a `_sum`.
"""
import math
import re
import sys

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL_NAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
LABEL_VALUE = r'"(?:[^"\\\n]|\\[\\"n])*"'
SAMPLE = re.compile(r"^(%s)(?:\{((?:%s=%s)(?:,%s=%s)*)?,?\})? (\S+)(?: (-?\d+))?$"
                    % (NAME, LABEL_NAME, LABEL_VALUE, LABEL_NAME, LABEL_VALUE))
LABEL = re.compile(r"(%s)=(%s)" % (LABEL_NAME, LABEL_VALUE))
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


class FormatError(Exception):
    pass


def parse_value(text):
    if text in ("+Inf", "Inf"):
        return math.inf
    if text == "-Inf":
        return -math.inf
    if text == "NaN":
        return math.nan
    return float(text)


def unescape(quoted):
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), quoted[1:-1])


def parse(text):
    """{family: {"type": str, "help": str, "samples": [(name, {label: value}, float)]}}"""
    families = {}
    seen = set()
    for number, line in enumerate(text.split("\n"), 1):
        def fail(why):
            raise FormatError("line %d: %s: %r" % (number, why, line))

        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                if not re.fullmatch(NAME, name):
                    fail("invalid metric name")
                family = families.setdefault(name, {"type": None, "help": None, "samples": []})
                if parts[1] == "TYPE":
                    kind = parts[3] if len(parts) > 3 else ""
                    if kind not in TYPES:
                        fail("unknown type")
                    if family["type"] is not None:
                        fail("a second TYPE for %s" % name)
                    if family["samples"]:
                        fail("TYPE after the samples of %s" % name)
                    family["type"] = kind
                else:
                    if family["help"] is not None:
                        fail("a second HELP for %s" % name)
                    family["help"] = parts[3] if len(parts) > 3 else ""
            continue
        m = SAMPLE.match(line)
        if not m:
            fail("not a sample")
        name, labels_text, value_text = m.group(1), m.group(2), m.group(3)
        labels = {}
        for lm in LABEL.finditer(labels_text or ""):
            if lm.group(1) in labels:
                fail("label %s twice" % lm.group(1))
            labels[lm.group(1)] = unescape(lm.group(2))
        try:
            value = parse_value(value_text)
        except ValueError:
            fail("not a number")
        family_name = name
        if name not in families or families[name]["type"] is None:
            for suffix in HISTOGRAM_SUFFIXES:
                base = name[: -len(suffix)] if name.endswith(suffix) else None
                if base and families.get(base, {}).get("type") in ("histogram", "summary"):
                    family_name = base
                    break
        family = families.setdefault(family_name, {"type": None, "help": None, "samples": []})
        series = (name, tuple(sorted(labels.items())))
        if series in seen:
            fail("the series appears twice")
        seen.add(series)
        family["samples"].append((name, labels, value))
    for name, family in families.items():
        if family["type"] == "histogram":
            check_histogram(name, family["samples"])
    return families


def check_histogram(name, samples):
    groups = {}
    for sample_name, labels, value in samples:
        rest = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
        group = groups.setdefault(rest, {"buckets": [], "sum": None, "count": None})
        if sample_name == name + "_bucket":
            if "le" not in labels:
                raise FormatError("%s_bucket%s without le" % (name, dict(rest)))
            group["buckets"].append((parse_value(labels["le"]), value))
        elif sample_name == name + "_sum":
            group["sum"] = value
        elif sample_name == name + "_count":
            group["count"] = value
        else:
            raise FormatError("%s in histogram %s" % (sample_name, name))
    for rest, g in groups.items():
        where = "%s%s" % (name, dict(rest))
        bounds = [b for b, _ in g["buckets"]]
        counts = [c for _, c in g["buckets"]]
        if not bounds or bounds[-1] != math.inf:
            raise FormatError("%s: the last bucket is not +Inf" % where)
        if bounds != sorted(bounds) or len(set(bounds)) != len(bounds):
            raise FormatError("%s: bucket bounds are not ascending" % where)
        if any(b < a for a, b in zip(counts, counts[1:])):
            raise FormatError("%s: bucket counts decrease" % where)
        if g["count"] is None or g["sum"] is None:
            raise FormatError("%s: no _count or no _sum" % where)
        if counts[-1] != g["count"]:
            raise FormatError("%s: +Inf bucket %s != _count %s" % (where, counts[-1], g["count"]))


def value(families, name, **labels):
    for family in families.values():
        for sample_name, sample_labels, v in family["samples"]:
            if sample_name == name and sample_labels == labels:
                return v
    raise KeyError("no sample %s%s" % (name, labels))


def histograms(families, name, label=None):
    """{label value (or None): (sum, count, [(bound, cumulative count)])} of one histogram."""
    out = {}
    for sample_name, labels, v in families.get(name, {}).get("samples", []):
        key = labels.get(label) if label else None
        h = out.setdefault(key, {"sum": 0.0, "count": 0.0, "buckets": []})
        if sample_name == name + "_bucket":
            h["buckets"].append((parse_value(labels["le"]), v))
        elif sample_name == name + "_sum":
            h["sum"] = v
        elif sample_name == name + "_count":
            h["count"] = v
    return out


def difference(after, before):
    """The observations between two snapshots of one histogram."""
    if before is None:
        return after
    old = dict(before["buckets"])
    return {"sum": after["sum"] - before["sum"], "count": after["count"] - before["count"],
            "buckets": [(b, c - old.get(b, 0)) for b, c in after["buckets"]]}


def quantile(h, q):
    """As PromQL's histogram_quantile: linear within the bucket that holds the rank; the
    highest finite bound if that is the +Inf bucket. None without observations."""
    if not h or h["count"] <= 0:
        return None
    rank = q * h["count"]
    lower, below = 0.0, 0.0
    for bound, cumulative in h["buckets"]:
        if cumulative >= rank:
            if math.isinf(bound):
                return lower
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 0)
        lower, below = bound, cumulative
    return lower


PARTS = ["checkpoint_hold", "seal_wait", "seal", "upload_wait", "put", "commit", "outage_wait"]


def breakdown(before_text, after_text):
    """The barriers between two scrapes, whole and per part: a list of rows
    {"part", "count", "mean_ms", "p50_ms", "p99_ms"}, the whole first; PUT requests too."""
    before, after = parse(before_text) if before_text else {}, parse(after_text)

    def row(part, h):
        ms = lambda s: None if s is None else round(s * 1000, 3)
        return {"part": part, "count": int(h["count"]) if h else 0,
                "mean_ms": ms(h["sum"] / h["count"]) if h and h["count"] > 0 else None,
                "p50_ms": ms(quantile(h, 0.5)), "p99_ms": ms(quantile(h, 0.99))}

    whole_name = "bucketfs_barrier_duration_seconds"
    whole = difference(histograms(after, whole_name).get(None),
                       histograms(before, whole_name).get(None))
    rows = [row("barrier", whole)]
    part_name = "bucketfs_barrier_part_duration_seconds"
    parts_after, parts_before = histograms(after, part_name, "part"), histograms(before, part_name, "part")
    for part in PARTS:
        rows.append(row(part, difference(parts_after.get(part), parts_before.get(part))))
    put_name = "bucketfs_object_store_request_duration_seconds"
    put = difference(histograms(after, put_name, "op").get("put"),
                     histograms(before, put_name, "op").get("put"))
    rows.append(row("(PUT requests)", put))
    return rows


def render_breakdown(rows):
    fmt = lambda v: "-" if v is None else ("%.3f" % v)
    lines = ["%-16s %8s %10s %10s %10s" % ("part", "count", "mean ms", "p50 ms", "p99 ms")]
    for r in rows:
        lines.append("%-16s %8d %10s %10s %10s" % (r["part"], r["count"], fmt(r["mean_ms"]),
                                                    fmt(r["p50_ms"]), fmt(r["p99_ms"])))
    return "\n".join(lines)


def main(argv):
    if len(argv) >= 2 and argv[0] == "check":
        for path in argv[1:]:
            try:
                families = parse(open(path).read())
            except FormatError as e:
                sys.exit("%s: %s" % (path, e))
            if not families:
                sys.exit("%s: no metrics" % path)
            untyped = [n for n, f in families.items() if f["type"] is None]
            if untyped:
                sys.exit("%s: samples without a TYPE: %s" % (path, " ".join(untyped)))
        return
    if len(argv) >= 3 and argv[0] == "value":
        labels = dict(a.split("=", 1) for a in argv[3:])
        v = value(parse(open(argv[1]).read()), argv[2], **labels)
        print(int(v) if math.isfinite(v) and v == int(v) else repr(v))
        return
    if len(argv) == 3 and argv[0] == "breakdown":
        print(render_breakdown(breakdown(open(argv[1]).read(), open(argv[2]).read())))
        return
    sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
