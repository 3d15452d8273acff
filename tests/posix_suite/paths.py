"""The path errors every path-taking call shares, one case per call and condition: a 256-byte
component (ENAMETOOLONG), a missing directory on the way (ENOENT), a file on the way (ENOTDIR),
a symlink loop on the way (ELOOP), and a directory on the way other users may not search
(EACCES, as alice)."""
import errno
import os
import stat

from . import ALICE, case, fails, mkdir, touch, utimensat, as_user

# Each call takes the path under test; `d` holds a file `f` and a directory `dir` to use as
# the other argument where a call takes two.
CALLS = {
    "chmod": lambda d, p: os.chmod(p, 0o600),
    "chown": lambda d, p: os.chown(p, -1, -1),
    "link (source)": lambda d, p: os.link(p, f"{d}/new"),
    "link (new name)": lambda d, p: os.link(f"{d}/f", p),
    "mkdir": lambda d, p: os.mkdir(p),
    "mkfifo": lambda d, p: os.mkfifo(p),
    "mknod": lambda d, p: os.mknod(p, stat.S_IFREG | 0o644),
    "open": lambda d, p: os.open(p, os.O_RDONLY),
    "open O_CREAT": lambda d, p: os.open(p, os.O_WRONLY | os.O_CREAT, 0o644),
    "rename (source)": lambda d, p: os.rename(p, f"{d}/new"),
    "rename (new name)": lambda d, p: os.rename(f"{d}/f", p),
    "rmdir": lambda d, p: os.rmdir(p),
    "symlink (new name)": lambda d, p: os.symlink("target", p),
    "truncate": lambda d, p: os.truncate(p, 0),
    "unlink": lambda d, p: os.unlink(p),
    "utimensat": lambda d, p: utimensat(p, (1, 0), (1, 0)),
}


def setup(d):
    touch(f"{d}/f")
    os.mkdir(f"{d}/dir")
    os.symlink("loop", f"{d}/loop")
    mkdir(f"{d}/closed", 0o700)
    touch(f"{d}/closed/x", 0o666)
    os.mkdir(f"{d}/closed/dir", 0o777)
    os.chmod(d, 0o777)


# condition: (errno, path under d, as whom)
CONDITIONS = {
    "ENAMETOOLONG for a 256-byte component": (errno.ENAMETOOLONG, "n" * 256, None),
    "ENOENT for a missing directory on the way": (errno.ENOENT, "missing/x", None),
    "ENOTDIR for a file on the way": (errno.ENOTDIR, "f/x", None),
    "ELOOP for a symlink loop on the way": (errno.ELOOP, "loop/x", None),
    "EACCES for a directory on the way alice may not search": (errno.EACCES, "closed/x", ALICE),
}


def register(call, fn, condition, e, rel, who):
    # rmdir wants a directory there, the others a file; the name is the same for both.
    if call == "rmdir" and rel == "closed/x":
        rel = "closed/dir"

    @case(f"{call}: {condition}")
    def _(d):
        setup(d)
        if who:
            as_user(who, fails, e, fn, d, f"{d}/{rel}")
        else:
            fails(e, fn, d, f"{d}/{rel}")


for call, fn in CALLS.items():
    for condition, (e, rel, who) in CONDITIONS.items():
        register(call, fn, condition, e, rel, who)
