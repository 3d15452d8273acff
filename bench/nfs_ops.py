#!/usr/bin/python3
"""Small-file create, stat and remove per second over NFSv3, through libnfs's synchronous C API
(libnfs.so.13 through tests/libnfs.py, the library libnfs-utils' nfs-cp uses too), so that bench/fs drives
every NFS server with one and the same client and no kernel mount.

    bench/nfs_ops.py URL FILES

URL is a libnfs URL of the export, e.g. nfs://127.0.0.1/export?version=3&nfsport=P&mountport=M.
In a new directory `small` of the export (it must not exist), three timed phases, each one
synchronous call after the other on one connection:
  create: nfs_creat (as nfs-cp makes its file) and nfs_close of FILES new empty files;
  stat:   after the kernel's caches are dropped (a server's own caches stay), nfs_stat64 of
          each file;
  remove: nfs_unlink of each file.
libnfs 4.0 resolves every path from the export's root, so per file it sends, to any server:
create 2 LOOKUP + CREATE, stat 2 LOOKUP + GETATTR, remove LOOKUP + REMOVE (counted on the
wire against ganesha and bucketfs). The directory is removed at the end. Prints one JSON
object: create_per_s, stat_per_s, remove_per_s. Needs root for drop_caches.
"""
import json
import os
import stat
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from libnfs import Nfs, NfsError  # noqa: E402  (tests/libnfs.py: the ctypes binding)


def drop_caches():
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def main():
    url, files = sys.argv[1], int(sys.argv[2])
    try:
        nfs = Nfs(url)
        nfs.mkdir("/small")
        names = [f"/small/f{i:06}" for i in range(files)]
        out = {}
        t = time.perf_counter()
        for n in names:
            nfs.creat(n)
        out["create_per_s"] = files / (time.perf_counter() - t)

        drop_caches()
        t = time.perf_counter()
        for n in names:
            st = nfs.stat(n)
            if not stat.S_ISREG(st.mode) or st.size != 0:
                sys.exit(f"nfs_ops: {n} is not the empty file just made (mode {st.mode:o}, size {st.size})")
        out["stat_per_s"] = files / (time.perf_counter() - t)

        t = time.perf_counter()
        for n in names:
            nfs.unlink(n)
        out["remove_per_s"] = files / (time.perf_counter() - t)

        nfs.rmdir("/small")
        nfs.close()
    except NfsError as e:
        sys.exit(f"nfs_ops: {e}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
