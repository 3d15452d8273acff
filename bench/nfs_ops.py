#!/usr/bin/python3
"""Small-file create, stat and remove per second over NFSv3, through libnfs's synchronous C API
(libnfs.so.13, Debian's libnfs13, which libnfs-utils' nfs-cp uses too), so that bench/fs drives
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
import ctypes
import json
import stat
import sys
import time

# libnfs.h: the parts of these structs that are read here, in their order there.
class NfsUrl(ctypes.Structure):
    _fields_ = [("server", ctypes.c_char_p), ("path", ctypes.c_char_p), ("file", ctypes.c_char_p)]


class NfsStat64(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "dev", "ino", "mode", "nlink", "uid", "gid", "rdev", "size", "blksize", "blocks",
        "atime", "mtime", "ctime", "atime_nsec", "mtime_nsec", "ctime_nsec", "used")]


LIB = ctypes.CDLL("libnfs.so.13", use_errno=True)
P = ctypes.c_void_p
for name, restype, argtypes in [
    ("nfs_init_context", P, []),
    ("nfs_destroy_context", None, [P]),
    ("nfs_get_error", ctypes.c_char_p, [P]),
    ("nfs_parse_url_dir", ctypes.POINTER(NfsUrl), [P, ctypes.c_char_p]),
    ("nfs_destroy_url", None, [ctypes.POINTER(NfsUrl)]),
    ("nfs_mount", ctypes.c_int, [P, ctypes.c_char_p, ctypes.c_char_p]),
    ("nfs_mkdir", ctypes.c_int, [P, ctypes.c_char_p]),
    ("nfs_rmdir", ctypes.c_int, [P, ctypes.c_char_p]),
    ("nfs_creat", ctypes.c_int, [P, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(P)]),
    ("nfs_close", ctypes.c_int, [P, P]),
    ("nfs_stat64", ctypes.c_int, [P, ctypes.c_char_p, ctypes.POINTER(NfsStat64)]),
    ("nfs_unlink", ctypes.c_int, [P, ctypes.c_char_p]),
]:
    getattr(LIB, name).restype = restype
    getattr(LIB, name).argtypes = argtypes


def check(nfs, rc, what):
    """libnfs's synchronous calls return 0, or a negative errno with the message in the context."""
    if rc < 0:
        sys.exit(f"nfs_ops: {what}: {LIB.nfs_get_error(nfs).decode(errors='replace')}")


def drop_caches():
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def main():
    url, files = sys.argv[1], int(sys.argv[2])
    nfs = LIB.nfs_init_context()
    if not nfs:
        sys.exit("nfs_ops: nfs_init_context failed")
    parsed = LIB.nfs_parse_url_dir(nfs, url.encode())
    if not parsed:
        check(nfs, -1, f"URL {url}")
    check(nfs, LIB.nfs_mount(nfs, parsed.contents.server, parsed.contents.path), f"mount {url}")
    LIB.nfs_destroy_url(parsed)

    check(nfs, LIB.nfs_mkdir(nfs, b"/small"), "mkdir /small")
    names = [f"/small/f{i:06}".encode() for i in range(files)]
    out = {}
    fh = P()
    t = time.perf_counter()
    for n in names:
        check(nfs, LIB.nfs_creat(nfs, n, 0o644, ctypes.byref(fh)), f"creat {n.decode()}")
        check(nfs, LIB.nfs_close(nfs, fh), f"close {n.decode()}")
    out["create_per_s"] = files / (time.perf_counter() - t)

    drop_caches()
    st = NfsStat64()
    t = time.perf_counter()
    for n in names:
        check(nfs, LIB.nfs_stat64(nfs, n, ctypes.byref(st)), f"stat {n.decode()}")
        if not stat.S_ISREG(st.mode) or st.size != 0:
            sys.exit(f"nfs_ops: {n.decode()} is not the empty file just made (mode {st.mode:o}, size {st.size})")
    out["stat_per_s"] = files / (time.perf_counter() - t)

    t = time.perf_counter()
    for n in names:
        check(nfs, LIB.nfs_unlink(nfs, n), f"unlink {n.decode()}")
    out["remove_per_s"] = files / (time.perf_counter() - t)

    check(nfs, LIB.nfs_rmdir(nfs, b"/small"), "rmdir /small")
    LIB.nfs_destroy_context(nfs)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
