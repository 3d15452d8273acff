"""A ledger of flushed NBD writes, for tests/ledger.sh.

    ledger.py write URI LEDGER START     write records START, START+1, ... one flush barrier each,
                                         until the connection dies or the export is full
    ledger.py check URI LEDGER [FIRST]   check the export against the ledger (from record FIRST
                                         on; default 0, every record)
    ledger.py noise URI                  random 64 KiB - 1 MiB writes with occasional flushes
                                         until the connection dies

Record i is the 4096-byte block at offset i * 4096: a header (magic, i, the writer run's nonce),
filler derived from (i, nonce), and the SHA-256 of everything before it. A record is appended to
the ledger ("i nonce", fsynced) only after its barrier (NBD FLUSH, or the write itself with FUA)
returned, so the ledger never claims a record the server did not acknowledge as durable. Each
run first records "run NONCE START", so that check can tell an unacknowledged record of a known
run from garbage.

The writer issues one request at a time: a write, its barrier, then the ledger line. So after a
crash the export must hold every record of the ledger, and beyond the highest one at most the
next slot may hold a record (the write in flight when the server died, or one whose barrier
completed without its answer reaching us). Everything else is zeros. A block that is neither
zeros nor an intact record is a torn write.

Exit status: 0 when the run ended as expected (for write and noise: the connection died or the
export is full; for check: no violation), 1 on a violation or a server error on a live
connection, 2 on a usage or setup error. Needs libnbd's python binding (Debian's /usr/bin/python3).
"""
import collections
import hashlib
import os
import random
import struct
import sys
import time

import nbd

BLOCK_SIZE = 4096
MAGIC = b"BFSLEDG1"
NONCE_SIZE = 8
# magic, index (u64 LE), nonce
HEADER = struct.Struct("<8sQ8s")
CHECKSUM_SIZE = 32
FILLER_SIZE = BLOCK_SIZE - HEADER.size - CHECKSUM_SIZE
# Slots past the highest acknowledged record that check reads too: only the next one may hold a
# record, the others must be zeros, and reading a few more shows writes that should not exist.
CHECK_MARGIN_RECORDS = 64
# Blocks per read in check, and reads in flight: a check of tens of thousands of records, each
# maybe in an object of its own, must not take seconds of round trips.
CHECK_READ_BLOCKS = 256
CHECK_READS_IN_FLIGHT = 4
# One write in FUA_ONE_IN uses FUA as its barrier instead of a separate FLUSH.
FUA_ONE_IN = 4
VIOLATIONS_SHOWN_MAX = 10

NOISE_WRITE_BYTES_MIN = 64 * 1024
NOISE_WRITE_BYTES_MAX = 1024 * 1024
# One noise write in NOISE_FLUSH_ONE_IN is followed by a FLUSH, so the noise also has barriers
# of its own that race the ledger's.
NOISE_FLUSH_ONE_IN = 8
# Noise rate limit: enough to keep an upload in flight at most kills, low enough to leave the
# 2-core test VM's CPU to the server and to moto (one Python process, the slowest part of a
# round over S3: at 16 MiB/s restarts and checks took half as long again).
NOISE_BYTES_PER_S_MAX = 4 * 1024 * 1024


def record(index, nonce):
    header = HEADER.pack(MAGIC, index, nonce)
    filler = hashlib.shake_256(header).digest(FILLER_SIZE)
    body = header + filler
    block = body + hashlib.sha256(body).digest()
    assert len(block) == BLOCK_SIZE
    return block


def parse(block, slot):
    """The nonce of the intact record of slot in block, or None with why it is not one."""
    assert len(block) == BLOCK_SIZE
    magic, index, nonce = HEADER.unpack_from(block)
    if magic != MAGIC:
        return None, "no magic (first bytes %s)" % block[:24].hex()
    body = block[:-CHECKSUM_SIZE]
    if hashlib.sha256(body).digest() != block[-CHECKSUM_SIZE:]:
        return None, "checksum mismatch (header index %d nonce %s; %s)" % (
            index, nonce.hex(), describe_sectors(block, index, nonce))
    if index != slot:
        return None, "intact record of index %d nonce %s in the wrong slot" % (index, nonce.hex())
    if block != record(index, nonce):
        return None, "checksum ok but filler differs from record(%d, %s)" % (index, nonce.hex())
    return nonce, None


def describe_sectors(block, index, nonce):
    """Which 512-byte sectors of a damaged block are zeros or match record(index, nonce)."""
    want = record(index, nonce)
    marks = []
    for off in range(0, BLOCK_SIZE, 512):
        got = block[off:off + 512]
        if got == want[off:off + 512]:
            marks.append("R")
        elif got.count(0) == len(got):
            marks.append("0")
        else:
            marks.append("?")
    return "sectors R=record 0=zeros ?=other: " + "".join(marks)


def connect(uri):
    h = nbd.NBD()
    h.connect_uri(uri)
    return h


def connection_died(h):
    return h.aio_is_dead() or h.aio_is_closed()


def append_line(f, line):
    f.write(line + "\n")
    f.flush()
    os.fsync(f.fileno())


def cmd_write(uri, ledger_path, start):
    nonce = os.urandom(NONCE_SIZE)
    choose = random.Random(nonce)
    try:
        h = connect(uri)
    except nbd.Error as e:
        print("ledger write: cannot connect to %s: %s" % (uri, e), file=sys.stderr)
        return 2
    if not h.can_flush():
        print("ledger write: %s does not advertise FLUSH" % uri, file=sys.stderr)
        return 2
    use_fua = h.can_fua()
    slots = h.get_size() // BLOCK_SIZE
    acked = fua = 0
    index = start
    with open(ledger_path, "a") as ledger:
        append_line(ledger, "run %s %d" % (nonce.hex(), start))
        while True:
            if index >= slots:
                print("ledger write: run %s: export full at record %d (%d acknowledged from %d, %d with FUA)"
                      % (nonce.hex(), index, acked, start, fua), file=sys.stderr)
                return 0
            with_fua = use_fua and choose.randrange(FUA_ONE_IN) == 0
            try:
                if with_fua:
                    h.pwrite(record(index, nonce), index * BLOCK_SIZE, nbd.CMD_FLAG_FUA)
                else:
                    h.pwrite(record(index, nonce), index * BLOCK_SIZE)
                    h.flush()
            except nbd.Error as e:
                if connection_died(h):
                    print("ledger write: run %s: connection died at record %d (%s); %d acknowledged from %d, %d with FUA"
                          % (nonce.hex(), index, e, acked, start, fua), file=sys.stderr)
                    return 0
                print("ledger write: run %s: server error on a live connection at record %d: %s"
                      % (nonce.hex(), index, e), file=sys.stderr)
                return 1
            append_line(ledger, "%d %s" % (index, nonce.hex()))
            acked += 1
            fua += with_fua
            index += 1


def read_ledger(path):
    """(acknowledged {index: nonce}, run starts {nonce: start}) from the ledger file."""
    acked = {}
    runs = {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            words = line.split()
            if len(words) == 3 and words[0] == "run":
                runs[bytes.fromhex(words[1])] = int(words[2])
            elif len(words) == 2:
                nonce = bytes.fromhex(words[1])
                if nonce not in runs:
                    raise ValueError("%s:%d: record of an unknown run: %r" % (path, number, line))
                acked[int(words[0])] = nonce
            else:
                raise ValueError("%s:%d: malformed line %r" % (path, number, line))
    return acked, runs


def read_chunks(h, first_slot, end_slot):
    """(first slot, bytes) of slots first_slot..end_slot-1 in order, CHECK_READ_BLOCKS at a time."""
    pending = collections.deque()
    next_first = first_slot
    while pending or next_first < end_slot:
        while next_first < end_slot and len(pending) < CHECK_READS_IN_FLIGHT:
            count = min(CHECK_READ_BLOCKS, end_slot - next_first)
            buf = nbd.Buffer(count * BLOCK_SIZE)
            pending.append((next_first, buf, h.aio_pread(buf, next_first * BLOCK_SIZE)))
            next_first += count
        first, buf, cookie = pending.popleft()
        while not h.aio_command_completed(cookie):
            h.poll(-1)
        yield first, bytes(buf.to_bytearray())


def judge(slot, block, acked, runs, highest):
    """What slot holds: ("present" | "zeros" | "unacknowledged" | "torn" | "wrong", why)."""
    want = acked.get(slot)
    if want is not None and block == record(slot, want):
        return "present", None
    if block.count(0) == BLOCK_SIZE:
        if want is not None:
            return "wrong", "record %d (nonce %s) was acknowledged but the slot is zeros" % (slot, want.hex())
        return "zeros", None
    nonce, why = parse(block, slot)
    if nonce is None:
        acked_note = "" if want is None else " (acknowledged: nonce %s)" % want.hex()
        return "torn", "record %d: torn or foreign block: %s%s" % (slot, why, acked_note)
    if want is not None:
        return "wrong", "record %d: acknowledged nonce %s, found an intact record of nonce %s" % (
            slot, want.hex(), nonce.hex())
    if nonce not in runs or runs[nonce] > slot:
        return "wrong", "record %d: intact record of nonce %s, which no run wrote there" % (slot, nonce.hex())
    if slot != highest + 1:
        return "wrong", ("record %d: intact unacknowledged record of nonce %s beyond the one slot after "
                         "the highest acknowledged record (%d)" % (slot, nonce.hex(), highest))
    return "unacknowledged", None


def cmd_check(uri, ledger_path, first_slot):
    try:
        acked, runs = read_ledger(ledger_path)
    except (OSError, ValueError) as e:
        print("ledger check: %s" % e, file=sys.stderr)
        return 2
    try:
        h = connect(uri)
    except nbd.Error as e:
        print("ledger check: cannot connect to %s: %s" % (uri, e), file=sys.stderr)
        return 2
    highest = max(acked) if acked else -1
    end_slot = min(h.get_size() // BLOCK_SIZE, highest + 1 + CHECK_MARGIN_RECORDS)
    first_slot = min(first_slot, end_slot)
    counts = collections.Counter()
    violations = []
    try:
        for first, data in read_chunks(h, first_slot, end_slot):
            for i in range(len(data) // BLOCK_SIZE):
                kind, why = judge(first + i, data[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE], acked, runs, highest)
                counts[kind] += 1
                if why is not None:
                    violations.append(why)
    except nbd.Error as e:
        violations.append("a read failed after %d of slots %d..%d: %s" % (
            sum(counts.values()), first_slot, end_slot - 1, e))
    acked_checked = sum(1 for i in acked if i >= first_slot)
    print("ledger check: slots=%d..%d acknowledged=%d checked=%d present=%d unacknowledged_present=%d zeros=%d "
          "torn=%d violations=%d" % (first_slot, end_slot - 1, len(acked), acked_checked, counts["present"],
                                     counts["unacknowledged"], counts["zeros"], counts["torn"], len(violations)))
    for v in violations[:VIOLATIONS_SHOWN_MAX]:
        print("VIOLATION: " + v)
    if len(violations) > VIOLATIONS_SHOWN_MAX:
        print("... and %d more violations" % (len(violations) - VIOLATIONS_SHOWN_MAX))
    return 1 if violations else 0


def cmd_noise(uri):
    try:
        h = connect(uri)
    except nbd.Error as e:
        print("ledger noise: cannot connect to %s: %s" % (uri, e), file=sys.stderr)
        return 2
    blocks = h.get_size() // BLOCK_SIZE
    # Incompressible bytes, sliced at random offsets: each write differs, none costs urandom.
    pool = os.urandom(2 * NOISE_WRITE_BYTES_MAX)
    choose = random.Random()
    writes = flushes = written_bytes = 0
    began = time.monotonic()
    while True:
        size = choose.randrange(NOISE_WRITE_BYTES_MIN // BLOCK_SIZE, NOISE_WRITE_BYTES_MAX // BLOCK_SIZE + 1) * BLOCK_SIZE
        offset = choose.randrange(blocks - size // BLOCK_SIZE + 1) * BLOCK_SIZE
        start = choose.randrange(len(pool) - size + 1)
        try:
            h.pwrite(pool[start:start + size], offset)
            if writes == 0:
                # tests/ledger.sh waits for this line before it picks the moment of the kill.
                print("ledger noise: first write acknowledged", file=sys.stderr, flush=True)
            writes += 1
            written_bytes += size
            if choose.randrange(NOISE_FLUSH_ONE_IN) == 0:
                h.flush()
                flushes += 1
        except nbd.Error as e:
            if connection_died(h):
                print("ledger noise: connection died (%s) after %d writes (%d MiB) and %d flushes"
                      % (e, writes, written_bytes >> 20, flushes), file=sys.stderr)
                return 0
            print("ledger noise: server error on a live connection: %s" % e, file=sys.stderr)
            return 1
        ahead_s = written_bytes / NOISE_BYTES_PER_S_MAX - (time.monotonic() - began)
        if ahead_s > 0:
            time.sleep(ahead_s)


def main(argv):
    if len(argv) == 5 and argv[1] == "write":
        return cmd_write(argv[2], argv[3], int(argv[4]))
    if len(argv) in (4, 5) and argv[1] == "check":
        return cmd_check(argv[2], argv[3], int(argv[4]) if len(argv) == 5 else 0)
    if len(argv) == 3 and argv[1] == "noise":
        return cmd_noise(argv[2])
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
