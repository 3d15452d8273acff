#!/usr/bin/python3
"""A data-integrity exerciser in the manner of fsx: random writes, truncates (both ways), holes
punched by truncation, reads and mmap reads on a few files of a mounted filesystem, every read
checked against a model of each file's bytes. It runs for SECONDS; halfway through it fsyncs
every file, writes "synced" to STEP and waits until STEP says "restarted" (the test restarts the
server meanwhile), then goes on checking against the same model.

    tests/fsx.py DIR SECONDS STEP [SEED]

Exit status 0: every read matched. On a mismatch it prints the file, the offset, what was
expected and what was read, and the last operations.
"""
import mmap
import os
import random
import sys
import time

FILES = 4
SIZE_MAX = 3 * 1024 * 1024  # beyond 2 MiB, so extents, holes and partial extents all occur


def main():
    root, seconds, step = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else int(time.time())
    rng = random.Random(seed)
    print(f"fsx: seed {seed}, {seconds} s on {root}", flush=True)
    paths = [os.path.join(root, f"fsx{i}") for i in range(FILES)]
    fds = [os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644) for p in paths]
    model = [bytearray() for _ in paths]
    log = []
    ops = 0
    paused = False
    start = time.monotonic()

    def check(i, off, got, what):
        want = bytes(model[i][off:off + len(got)])
        if got != want:
            at = next(k for k in range(len(got)) if got[k:k + 1] != want[k:k + 1])
            print(f"fsx: MISMATCH ({what}) in {paths[i]} at {off + at}: "
                  f"want {want[at:at + 16].hex()} got {got[at:at + 16].hex()}", flush=True)
            print("fsx: last operations:", *log[-20:], sep="\n  ")
            sys.exit(1)

    while time.monotonic() - start < seconds:
        if not paused and time.monotonic() - start > seconds / 2:
            for fd in fds:
                os.fsync(fd)
            open(step, "w").write("synced")
            while open(step).read().strip() != "restarted":
                time.sleep(0.1)
            paused = True
            log.append("-- server restarted --")
        i = rng.randrange(FILES)
        fd, m = fds[i], model[i]
        op = rng.random()
        if op < 0.45:
            off = rng.randrange(SIZE_MAX)
            n = rng.choice([1, 100, 4096, 8192, 10000, 65536, 200000])
            data = rng.randbytes(n) if rng.random() < 0.7 else bytes([rng.randrange(256)]) * n
            os.pwrite(fd, data, off)
            if off > len(m):
                m.extend(bytes(off - len(m)))
            m[off:off + n] = data
            log.append(f"write {i} {off}+{n}")
        elif op < 0.55:
            size = rng.randrange(SIZE_MAX)
            os.ftruncate(fd, size)
            if size < len(m):
                del m[size:]
            else:
                m.extend(bytes(size - len(m)))
            log.append(f"truncate {i} {size}")
        elif op < 0.85:
            off = rng.randrange(max(1, len(m) + 1000))
            n = rng.choice([1, 512, 4096, 8192, 70000])
            got = os.pread(fd, n, off)
            check(i, off, got, "read")
            if len(got) != max(0, min(n, len(m) - off)):
                print(f"fsx: short read in {paths[i]} at {off}: {len(got)} bytes, "
                      f"file is {len(m)}", flush=True)
                sys.exit(1)
            log.append(f"read {i} {off}+{n}")
        elif op < 0.95:
            if len(m) > 0:
                with mmap.mmap(fd, len(m), prot=mmap.PROT_READ) as mm:
                    off = rng.randrange(len(m))
                    check(i, off, mm[off:off + 10000], "mmap read")
            log.append(f"mmap read {i}")
        else:
            os.fsync(fd)
            log.append(f"fsync {i}")
        if os.fstat(fd).st_size != len(m):
            print(f"fsx: {paths[i]} is {os.fstat(fd).st_size} bytes, the model "
                  f"{len(m)}", flush=True)
            sys.exit(1)
        ops += 1
    for i, fd in enumerate(fds):
        check(i, 0, os.pread(fd, SIZE_MAX + 300000, 0), "final read")
        os.close(fd)
    print(f"fsx: {ops} operations, every read matched", flush=True)


if __name__ == "__main__":
    main()
