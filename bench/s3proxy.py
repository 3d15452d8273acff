#!/usr/bin/env python3
"""An emulated object-store link: an HTTP/1.1 proxy that adds latency and a bandwidth limit.

    bucketfs --HTTP--> s3proxy (127.0.0.1:PORT) --HTTP--> S3 server (moto_server)

Every request waits LATENCY before it is forwarded (the round trip to a distant object store);
bytes then flow through a link of BANDWIDTH in each direction, shared by every connection, like
one network interface. The delay is charged per HTTP request, not per TCP connection, so
keep-alive connections are parsed at request boundaries: the request head, then a body framed
by Content-Length or chunked transfer coding; the response head, then a body framed the same
way (none for HEAD, 1xx, 204 and 304; until close when neither is given). Bytes are forwarded
unchanged, so request signatures stay valid. `Expect: 100-continue` is answered by the proxy
itself (the delay then applies once, to the whole request).

Counts per method, bytes each way and the delay added are written as JSON to --stats on SIGTERM
or SIGINT (and every few seconds), so a benchmark can check that the requests went through it.

Faults (tests/outage.sh, tests/pg_outage.sh): with --fault-while FILE, every request whose head
arrives while FILE exists meets the fault that FILE names (its first word; an empty file is
`refuse`). A test switches modes by replacing the file (write a new one, rename it over) and ends
the fault by deleting it. Requests already forwarded when a fault starts are answered normally.

    refuse   the connection is closed at once, without an answer: an unreachable store.
    503      the body is read, then `503 Slow Down` with S3's XML error body (code SlowDown) and
             Connection: close: a store that throttles.
    reset    the connection is reset (RST, SO_LINGER 0) before any answer: a broken network path.
    hang     the request head is read and never answered for as long as FILE says `hang`; then
             the connection is closed without an answer: a store that stops responding. The
             client's own request timeout is what ends the wait while the hang lasts.

An unknown mode is reported on stderr and treated as `refuse`. --refuse-while FILE is the old
name of --fault-while FILE (an empty file refuses, as it always did). Stats count each fault
under "faults" by mode ("refused" stays the count of refused requests).

Usage: s3proxy.py --listen 127.0.0.1:PORT --upstream 127.0.0.1:PORT [--latency 20ms]
                  [--bandwidth 100MB/s] [--stats FILE] [--fault-while FILE]
                  [--request-log FILE]
       s3proxy.py --check-args [--latency L] [--bandwidth B]     (validate, as bench/run does)
Latency: 20ms, 500us, 0.02s (a bare number is ms). Bandwidth: 100MB/s (decimal), 80MiB/s,
1Gbit/s, or 0 / unlimited.
"""
import argparse
import asyncio
import json
import os
import re
import signal
import socket
import struct
import sys
import time

# Limits, each with its reason.
HEAD_BYTES_MAX = 64 * 1024  # a request or response head larger than this is malformed
CHUNK_BYTES = 64 * 1024  # unit of forwarding and of bandwidth accounting
STATS_INTERVAL_S = 5.0  # how often the stats file is rewritten while running
FAULT_POLL_S = 0.1  # how often a hung request looks whether its hang is over
LINK_SLACK_S = 0.002  # how far the link may run ahead of its rate before it sleeps

FAULT_MODES = ("refuse", "503", "reset", "hang")
# What S3 answers when it throttles (the body clients log, e.g. object_store's error message).
SLOW_DOWN_BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n'
                  b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>"
                  b"<RequestId>s3proxy-fault</RequestId><HostId>s3proxy</HostId></Error>")
SLOW_DOWN_RESPONSE = (b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                      b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(SLOW_DOWN_BODY)
                      + SLOW_DOWN_BODY)


class ProtocolError(Exception):
    pass


def parse_latency_s(text):
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(us|µs|ms|s)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError("latency '%s': expected e.g. 20ms, 500us, 0.02s" % text)
    value, unit = float(m.group(1)), m.group(2) or "ms"
    return value * {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}[unit]


def parse_bandwidth_bytes_per_s(text):
    """Bytes per second; 0 means unlimited."""
    if text.strip().lower() in ("0", "unlimited", "none", ""):
        return 0.0
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(i?)(B|bit|b)?(/s|ps)?\s*", text, re.I)
    if not m:
        raise argparse.ArgumentTypeError(
            "bandwidth '%s': expected e.g. 100MB/s, 80MiB/s, 1Gbit/s or 0" % text)
    value, prefix, binary, unit = float(m.group(1)), m.group(2).upper(), m.group(3), m.group(4) or "B"
    power = " KMGT".index(prefix) if prefix else 0
    value *= (1024 if binary else 1000) ** power
    if unit.lower() in ("bit", "b") and unit != "B":
        value /= 8
    return value


class Link:
    """One direction of the emulated link: a FIFO of transmissions at a fixed rate."""

    def __init__(self, bytes_per_s):
        self.bytes_per_s = bytes_per_s
        self.busy_until = 0.0

    async def transmit(self, n):
        if self.bytes_per_s <= 0 or n <= 0:
            return
        now = time.monotonic()
        self.busy_until = max(now, self.busy_until) + n / self.bytes_per_s
        delay = self.busy_until - now
        # A sleep per 64 KiB chunk would cost more than the chunk's own time at 100 MB/s (the
        # event loop's overhead), capping one stream near half the rate: the link runs ahead of
        # its schedule by up to LINK_SLACK_S and then sleeps the whole debt, so the mean rate
        # stays exact.
        if delay > LINK_SLACK_S:
            await asyncio.sleep(delay)


class Stats:
    def __init__(self, args):
        self.started = time.time()
        self.config = {"latency_s": args.latency, "bandwidth_bytes_per_s": args.bandwidth,
                       "upstream": args.upstream, "listen": args.listen}
        self.requests = 0
        self.by_method = {}
        self.responses_by_status = {}
        self.bytes_up = 0
        self.bytes_down = 0
        self.connections = 0
        self.errors = 0
        self.refused = 0
        self.faults = {}
        self.delay_added_s = 0.0

    def as_dict(self):
        return {
            "config": self.config, "uptime_s": round(time.time() - self.started, 3),
            "requests": self.requests, "by_method": self.by_method,
            "responses_by_status": self.responses_by_status,
            "bytes_up": self.bytes_up, "bytes_down": self.bytes_down,
            "connections": self.connections, "errors": self.errors, "refused": self.refused,
            "faults": self.faults,
            "delay_added_s": round(self.delay_added_s, 3),
        }


async def read_head(reader):
    """The head (start line + headers, with the blank line) or None at a clean EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if not e.partial:
            return None
        raise ProtocolError("connection closed inside a message head")
    except asyncio.LimitOverrunError:
        raise ProtocolError("message head larger than %d bytes" % HEAD_BYTES_MAX)
    return head


def parse_head(head):
    lines = head[:-4].split(b"\r\n")
    start = lines[0].decode("latin-1")
    headers = []
    for line in lines[1:]:
        if b":" not in line:
            raise ProtocolError("malformed header line %r" % line[:80])
        name, value = line.split(b":", 1)
        headers.append((name.decode("latin-1").strip(), value.decode("latin-1").strip()))
    return start, headers


def header(headers, name):
    name = name.lower()
    for k, v in headers:
        if k.lower() == name:
            return v
    return None


def build_head(start, headers):
    out = start + "\r\n" + "".join("%s: %s\r\n" % (k, v) for k, v in headers) + "\r\n"
    return out.encode("latin-1")


def body_framing(headers):
    """('chunked', None), ('length', N) or (None, None) when the message says neither."""
    te = header(headers, "transfer-encoding")
    if te and "chunked" in te.lower():
        return "chunked", None
    cl = header(headers, "content-length")
    if cl is not None:
        if not cl.isdigit():
            raise ProtocolError("bad Content-Length %r" % cl)
        return "length", int(cl)
    return None, None


def quickack(writer):
    """Acknowledge what arrives from now on at once, not after Linux's delayed-ACK timer.

    A server that writes a response's head and body in two writes without TCP_NODELAY (hyper's
    default, so s3s-fs; werkzeug, so moto) holds the body until the head is acknowledged, and a
    keep-alive connection's receiver delays that ACK by up to 40 ms: every GET would pay it,
    which no real store's link does. Linux resets the flag on its own, so it is set per read.
    """
    sock = writer.get_extra_info("socket")
    if sock is not None and hasattr(socket, "TCP_QUICKACK"):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        except OSError:
            pass


async def send(writer, link, data):
    await link.transmit(len(data))
    writer.write(data)
    await writer.drain()


async def relay_length(reader, writer, link, n, ack=None):
    sent = 0
    while sent < n:
        if ack is not None:
            quickack(ack)
        data = await reader.read(min(CHUNK_BYTES, n - sent))
        if not data:
            raise ProtocolError("connection closed %d bytes into a %d-byte body" % (sent, n))
        await send(writer, link, data)
        sent += len(data)
    return sent


async def relay_chunked(reader, writer, link, ack=None):
    total = 0
    while True:
        if ack is not None:
            quickack(ack)
        line = await reader.readuntil(b"\r\n")
        size_text = line.split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise ProtocolError("bad chunk size line %r" % line[:80])
        await send(writer, link, line)
        total += len(line)
        if size == 0:
            # Trailers, up to and including the empty line.
            while True:
                trailer = await reader.readuntil(b"\r\n")
                await send(writer, link, trailer)
                total += len(trailer)
                if trailer == b"\r\n":
                    return total
        total += await relay_length(reader, writer, link, size + 2, ack)  # data + CRLF


async def relay_until_close(reader, writer, link, ack=None):
    total = 0
    while True:
        if ack is not None:
            quickack(ack)
        data = await reader.read(CHUNK_BYTES)
        if not data:
            return total
        await send(writer, link, data)
        total += len(data)


class Sink:
    """A writer that drops what it is given: the body of a request that a fault answers."""

    def write(self, data):
        pass

    async def drain(self):
        pass


async def discard_body(reader, headers):
    framing, length = body_framing(headers)
    if framing == "chunked":
        await relay_chunked(reader, Sink(), Link(0))
    elif framing == "length":
        await relay_length(reader, Sink(), Link(0), length)


def wants_close(version, headers):
    conn = (header(headers, "connection") or "").lower()
    if "close" in conn:
        return True
    return version == "HTTP/1.0" and "keep-alive" not in conn


class Proxy:
    def __init__(self, args):
        self.args = args
        self.request_log = open(args.request_log, "a", buffering=1) if args.request_log else None
        self.up = Link(args.bandwidth)
        self.down = Link(args.bandwidth)
        self.stats = Stats(args)
        host, port = args.upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.unknown_modes_reported = set()

    def fault_mode(self):
        """The fault that --fault-while names now, or None while its file does not exist."""
        if not self.args.fault_while:
            return None
        try:
            with open(self.args.fault_while) as f:
                words = f.read().split()
        except FileNotFoundError:
            return None
        mode = words[0].lower() if words else "refuse"
        if mode not in FAULT_MODES:
            if mode not in self.unknown_modes_reported:
                self.unknown_modes_reported.add(mode)
                print("s3proxy: unknown fault mode %r in %s; refusing instead (modes: %s)" % (
                    mode, self.args.fault_while, " ".join(FAULT_MODES)), file=sys.stderr, flush=True)
            mode = "refuse"
        return mode

    async def fault(self, mode, reader, writer, headers):
        """Answer a request as fault `mode` does; the caller then closes the connection."""
        self.stats.faults[mode] = self.stats.faults.get(mode, 0) + 1
        if mode == "refuse":
            self.stats.refused += 1
        elif mode == "reset":
            # SO_LINGER with a zero timeout makes the close send RST instead of FIN.
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        elif mode == "hang":
            while self.fault_mode() == "hang":
                await asyncio.sleep(FAULT_POLL_S)
        elif mode == "503":
            # A client that waits for 100 Continue is answered at once, as S3 does; any other
            # sends its body first, which is read so that the client sees the answer, not a reset.
            if (header(headers, "expect") or "").lower() != "100-continue":
                await discard_body(reader, headers)
            writer.write(SLOW_DOWN_RESPONSE)
            await writer.drain()

    async def handle(self, client_reader, client_writer):
        self.stats.connections += 1
        upstream_writer = None
        try:
            upstream_reader, upstream_writer = None, None
            while True:
                head = await read_head(client_reader)
                if head is None:
                    return
                start, headers = parse_head(head)
                parts = start.split(" ")
                if len(parts) != 3:
                    raise ProtocolError("bad request line %r" % start[:80])
                method, _, version = parts
                mode = self.fault_mode()
                if mode is not None:
                    await self.fault(mode, client_reader, client_writer, headers)
                    return
                if (header(headers, "expect") or "").lower() == "100-continue":
                    client_writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    await client_writer.drain()
                    headers = [(k, v) for k, v in headers if k.lower() != "expect"]
                    head = build_head(start, headers)
                framing, length = body_framing(headers)
                t_head = time.monotonic()
                # The round trip to a distant object store, once per request.
                if self.args.latency > 0:
                    await asyncio.sleep(self.args.latency)
                    self.stats.delay_added_s += self.args.latency
                if upstream_writer is None:
                    upstream_reader, upstream_writer = await asyncio.open_connection(
                        *self.upstream, limit=HEAD_BYTES_MAX)
                await send(upstream_writer, self.up, head)
                sent = len(head)
                if framing == "chunked":
                    sent += await relay_chunked(client_reader, upstream_writer, self.up)
                elif framing == "length":
                    sent += await relay_length(client_reader, upstream_writer, self.up, length)
                t_sent = time.monotonic()
                self.stats.requests += 1
                self.stats.by_method[method] = self.stats.by_method.get(method, 0) + 1
                self.stats.bytes_up += sent
                close = wants_close(version, headers)
                # The response, after any interim 1xx responses.
                while True:
                    quickack(upstream_writer)
                    rhead = await read_head(upstream_reader)
                    if rhead is None:
                        raise ProtocolError("upstream closed before answering %s" % method)
                    t_answered = time.monotonic()
                    rstart, rheaders = parse_head(rhead)
                    rparts = rstart.split(" ", 2)
                    status = int(rparts[1]) if len(rparts) > 1 and rparts[1].isdigit() else 0
                    await send(client_writer, self.down, rhead)
                    received = len(rhead)
                    if not (100 <= status < 200):
                        break
                    self.stats.bytes_down += received
                key = str(status)
                self.stats.responses_by_status[key] = self.stats.responses_by_status.get(key, 0) + 1
                rframing, rlength = body_framing(rheaders)
                quickack(upstream_writer)
                if method == "HEAD" or status in (204, 304):
                    pass
                elif rframing == "chunked":
                    received += await relay_chunked(upstream_reader, client_writer, self.down,
                                                    upstream_writer)
                elif rframing == "length":
                    received += await relay_length(upstream_reader, client_writer, self.down, rlength,
                                                   upstream_writer)
                else:
                    received += await relay_until_close(upstream_reader, client_writer, self.down,
                                                        upstream_writer)
                    close = True
                self.stats.bytes_down += received
                self.log_request(method, status, t_head, t_sent, t_answered, sent, received)
                if close or wants_close(rparts[0], rheaders):
                    return
        except (ProtocolError, ConnectionError, asyncio.IncompleteReadError,
                asyncio.LimitOverrunError, OSError) as e:
            self.stats.errors += 1
            print("s3proxy: connection dropped: %s" % e, file=sys.stderr, flush=True)
        finally:
            for w in (client_writer, upstream_writer):
                if w is not None:
                    w.close()

    def log_request(self, method, status, t_head, t_sent, t_answered, sent, received):
        """One line per request in --request-log: when it ended (Unix time), and where its time
        went in ms: the added latency, sending the request up the link (for a GET, its head's
        wait behind uploads queued on that direction), the server's answer, and the response
        down the link."""
        if self.request_log is None:
            return
        done = time.monotonic()
        latency = self.args.latency * 1e3
        up = (t_sent - t_head) * 1e3 - latency
        self.request_log.write("%.6f %s %d %.3f %.3f %.3f %.3f %.3f %d %d\n" % (
            time.time(), method, status, (done - t_head) * 1e3, latency, up,
            (t_answered - t_sent) * 1e3, (done - t_answered) * 1e3, sent, received))

    def write_stats(self):
        if not self.args.stats:
            return
        tmp = self.args.stats + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.stats.as_dict(), f, indent=1)
        os.replace(tmp, self.args.stats)


async def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--listen", help="HOST:PORT to accept connections on")
    ap.add_argument("--upstream", help="HOST:PORT of the S3 server")
    ap.add_argument("--latency", type=parse_latency_s, default=parse_latency_s("20ms"))
    ap.add_argument("--bandwidth", type=parse_bandwidth_bytes_per_s, default=0.0)
    ap.add_argument("--stats", help="write counters as JSON here")
    ap.add_argument("--request-log", metavar="FILE",
                    help="append a line per request: end time, method, status, total ms, "
                         "latency ms, up-link ms, server ms, down-link ms, bytes up, bytes down")
    ap.add_argument("--fault-while", "--refuse-while", dest="fault_while", metavar="FILE",
                    help="while FILE exists, answer every request with the fault it names: "
                         "refuse (also an empty file), 503, reset or hang")
    ap.add_argument("--check-args", action="store_true",
                    help="only check --latency and --bandwidth, then exit")
    args = ap.parse_args()
    if args.check_args:
        return
    if not args.listen or not args.upstream:
        ap.error("--listen and --upstream are required")
    proxy = Proxy(args)
    host, port = args.listen.rsplit(":", 1)
    server = await asyncio.start_server(proxy.handle, host, int(port), limit=HEAD_BYTES_MAX)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("s3proxy: listening on %s -> %s, latency %.1f ms, bandwidth %s" % (
        args.listen, args.upstream, args.latency * 1e3,
        "unlimited" if not args.bandwidth else "%.1f MB/s" % (args.bandwidth / 1e6)), flush=True)
    async with server:
        while not stop.is_set():
            proxy.write_stats()
            try:
                await asyncio.wait_for(stop.wait(), STATS_INTERVAL_S)
            except asyncio.TimeoutError:
                pass
    proxy.write_stats()


if __name__ == "__main__":
    asyncio.run(main())
