#!/usr/bin/python3
"""libnfs's synchronous C API (libnfs.so.13, Debian's libnfs13, which libnfs-utils' tools use)
through ctypes: one NFS client for the tests and benchmarks that need more than nfs-ls, nfs-cp
and nfs-cat (a rename, a mkdir, a stat with owners), with no kernel mount.

As a command, one operation per call, against the export of a libnfs URL:

    tests/libnfs.py URL mkdir PATH | rmdir PATH | unlink PATH | creat PATH
    tests/libnfs.py URL rename FROM TO
    tests/libnfs.py URL stat PATH        # prints: uid gid mode(octal) size

URL is e.g. nfs://127.0.0.1/?version=3&nfsport=P&mountport=P; PATHs are from the export's
root. Failure prints libnfs's message and exits 1. Calls go out as the process's uid and gid
(AUTH_SYS).
"""
import ctypes
import sys


class NfsUrl(ctypes.Structure):
    """libnfs.h's struct nfs_url, the fields read here, in their order there."""
    _fields_ = [("server", ctypes.c_char_p), ("path", ctypes.c_char_p), ("file", ctypes.c_char_p)]


class NfsStat64(ctypes.Structure):
    """libnfs.h's struct nfs_stat_64."""
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "dev", "ino", "mode", "nlink", "uid", "gid", "rdev", "size", "blksize", "blocks",
        "atime", "mtime", "ctime", "atime_nsec", "mtime_nsec", "ctime_nsec", "used")]


LIB = ctypes.CDLL("libnfs.so.13", use_errno=True)
P = ctypes.c_void_p
for _name, _restype, _argtypes in [
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
    ("nfs_rename", ctypes.c_int, [P, ctypes.c_char_p, ctypes.c_char_p]),
]:
    getattr(LIB, _name).restype = _restype
    getattr(LIB, _name).argtypes = _argtypes


class NfsError(Exception):
    pass


class Nfs:
    """One mounted export; each method is one synchronous libnfs call."""

    def __init__(self, url):
        self.ctx = LIB.nfs_init_context()
        if not self.ctx:
            raise NfsError("nfs_init_context failed")
        parsed = LIB.nfs_parse_url_dir(self.ctx, url.encode())
        if not parsed:
            raise NfsError(f"URL {url}: {self.error()}")
        try:
            self.check(LIB.nfs_mount(self.ctx, parsed.contents.server, parsed.contents.path),
                       f"mount {url}")
        finally:
            LIB.nfs_destroy_url(parsed)

    def error(self):
        return LIB.nfs_get_error(self.ctx).decode(errors="replace")

    def check(self, rc, what):
        """libnfs's synchronous calls return 0, or a negative errno with the message kept."""
        if rc < 0:
            raise NfsError(f"{what}: {self.error()}")

    def mkdir(self, path):
        self.check(LIB.nfs_mkdir(self.ctx, path.encode()), f"mkdir {path}")

    def rmdir(self, path):
        self.check(LIB.nfs_rmdir(self.ctx, path.encode()), f"rmdir {path}")

    def unlink(self, path):
        self.check(LIB.nfs_unlink(self.ctx, path.encode()), f"unlink {path}")

    def rename(self, old, new):
        self.check(LIB.nfs_rename(self.ctx, old.encode(), new.encode()), f"rename {old} {new}")

    def creat(self, path, mode=0o644):
        """A new empty file, created and closed (as nfs-cp makes its file)."""
        fh = P()
        self.check(LIB.nfs_creat(self.ctx, path.encode(), mode, ctypes.byref(fh)), f"creat {path}")
        self.check(LIB.nfs_close(self.ctx, fh), f"close {path}")

    def stat(self, path):
        st = NfsStat64()
        self.check(LIB.nfs_stat64(self.ctx, path.encode(), ctypes.byref(st)), f"stat {path}")
        return st

    def close(self):
        LIB.nfs_destroy_context(self.ctx)


def main(argv):
    if len(argv) < 4:
        sys.exit(__doc__)
    url, op, args = argv[1], argv[2], argv[3:]
    try:
        nfs = Nfs(url)
        if op == "stat":
            st = nfs.stat(*args)
            print(st.uid, st.gid, f"{st.mode & 0o7777:o}", st.size)
        elif op in ("mkdir", "rmdir", "unlink", "creat", "rename"):
            getattr(nfs, op)(*args)
        else:
            sys.exit(f"libnfs.py: unknown operation {op!r}\n{__doc__}")
        nfs.close()
    except (NfsError, TypeError) as e:
        sys.exit(f"libnfs.py: {e}")


if __name__ == "__main__":
    main(sys.argv)
