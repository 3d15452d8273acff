#!/usr/bin/python3
"""The operations of bench/fs on one directory: small-file create, stat and unlink per second,
1 MiB sequential write (ending with fsync) and cold read in MB/s, untar of a tree in seconds,
and the p99 of a 4 KiB write + fsync alone and while another writer streams a large file.
Prints one JSON object.

    bench/fs_ops.py DIR FILES WRITE_MIB TARBALL
"""
import json
import os
import subprocess
import sys
import threading
import time


def drop_caches():
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def p99_write_fsync(path, count, until=None):
    """p99 in ms of `count` 4 KiB write + fsync pairs (fewer if `until` is set first, at least
    20)."""
    lat = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    block = os.urandom(4096)
    for i in range(count):
        if until is not None and until.is_set() and i >= 20:
            break
        t = time.perf_counter()
        os.pwrite(fd, block, (i % 256) * 4096)
        os.fsync(fd)
        lat.append(time.perf_counter() - t)
    os.close(fd)
    lat.sort()
    return lat[int(len(lat) * 0.99) - 1] * 1000


def main():
    root, files, mib, tarball = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    out = {}
    d = os.path.join(root, "small")
    os.mkdir(d)
    names = [os.path.join(d, f"f{i:06}") for i in range(files)]
    t = time.perf_counter()
    for n in names:
        os.close(os.open(n, os.O_WRONLY | os.O_CREAT, 0o644))
    out["create_per_s"] = files / (time.perf_counter() - t)
    drop_caches()
    t = time.perf_counter()
    for n in names:
        os.stat(n)
    out["stat_per_s"] = files / (time.perf_counter() - t)
    t = time.perf_counter()
    for n in names:
        os.unlink(n)
    out["unlink_per_s"] = files / (time.perf_counter() - t)

    big = os.path.join(root, "big")
    chunk = os.urandom(1 << 20)
    t = time.perf_counter()
    fd = os.open(big, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for _ in range(mib):
        os.write(fd, chunk)
    os.fsync(fd)
    os.close(fd)
    out["write_mb_s"] = mib * 1.048576 / (time.perf_counter() - t)
    drop_caches()
    t = time.perf_counter()
    fd = os.open(big, os.O_RDONLY)
    while os.read(fd, 1 << 20):
        pass
    os.close(fd)
    out["read_mb_s"] = mib * 1.048576 / (time.perf_counter() - t)
    os.unlink(big)

    tree = os.path.join(root, "tree")
    os.mkdir(tree)
    t = time.perf_counter()
    subprocess.run(["tar", "-C", tree, "-xf", tarball], check=True)
    subprocess.run(["sync", os.path.join(tree, os.listdir(tree)[0])], check=True)
    out["untar_s"] = time.perf_counter() - t
    subprocess.run(["rm", "-rf", tree], check=True)

    small = os.path.join(root, "fsynced")
    out["fsync_4k_p99_ms_idle"] = p99_write_fsync(small, 200)
    stop, done = threading.Event(), threading.Event()

    def stream():
        # Another client writing 2 GiB sequentially (the condition), or less if the
        # measurement ends first.
        fd = os.open(os.path.join(root, "stream"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        for _ in range(2048):
            if stop.is_set():
                break
            os.write(fd, chunk)
        os.close(fd)
        done.set()

    writer = threading.Thread(target=stream)
    writer.start()
    time.sleep(0.5)
    out["fsync_4k_p99_ms_busy"] = p99_write_fsync(small, 200, until=done)
    stop.set()
    writer.join()
    os.unlink(os.path.join(root, "stream"))
    os.unlink(small)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
