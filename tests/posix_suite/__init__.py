"""The pieces every group of POSIX cases shares: the case registry with its skip tags, the users
the cases act as, and helpers that run a step as another user, check an errno, and compare
timestamps."""
import ctypes
import errno
import os
import pickle
import time
from typing import NamedTuple

# Skip tags: where a case cannot pass for a reason outside the filesystem under test.
NINEP = "9p"  # 9P2000.L itself: a server knows the caller's uid only (groups from its user db)
FUSE = "fuse"  # bucketfs's FUSE client (`bucketfs mount`); to be fixed there
DIOD = "diod"  # diod, the third-party 9P2000.L server

GROUPS_9P = "9P2000.L names only the caller's uid: the server takes the groups from its own " \
    "user database, where alice is in no supplementary group"
DIOD_USERS = "diod refuses to attach a uid its user database does not know (bob 1001, " \
    "carol 1002): their every call is EPERM"


class User(NamedTuple):
    name: str
    uid: int
    gid: int
    groups: tuple = ()


# alice is uid 1000 and bob uid 1001, each in a group of their own number and no other. A 9P
# server looks a caller's groups up in its user database, so the supplementary groups a case
# sets with setgroups are visible to the kernel only: such cases carry the "9p" tag.
ALICE = User("alice", 1000, 1000)
BOB = User("bob", 1001, 1001)
CAROL = User("carol", 1002, 1002)
# A group no user has as its primary group.
STAFF = 4242


def member(u, *groups):
    """`u` with supplementary groups."""
    return u._replace(groups=tuple(groups))


class Case(NamedTuple):
    name: str
    fn: object
    skip: dict  # tag -> why the case cannot pass where that tag is skipped


CASES = []


def case(name, skip=None):
    """Registers a case: fn(d) runs as root (umask 022) in a fresh directory d, mode 0755."""
    def register(fn):
        CASES.append(Case(name, fn, dict(skip or {})))
        return fn
    return register


def fails(e, fn, *args, **kwargs):
    """fn(*args) must fail with errno e."""
    try:
        fn(*args, **kwargs)
    except OSError as x:
        assert x.errno == e, f"errno {errno.errorcode.get(x.errno)} instead of {errno.errorcode[e]}"
        return
    raise AssertionError(f"succeeded, expected {errno.errorcode[e]}")


def as_user(who, fn, *args, **kwargs):
    """Runs fn(*args) in a child with `who`'s credentials; returns what it returned, or raises
    AssertionError with what it raised."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.setgroups(list(who.groups))
            os.setresgid(who.gid, who.gid, who.gid)
            os.setresuid(who.uid, who.uid, who.uid)
            out = ("ok", fn(*args, **kwargs))
        except BaseException as x:  # noqa: B902 - the parent reports whatever it was
            out = ("raised", f"{type(x).__name__}: {x}")
        try:
            data = pickle.dumps(out)
        except Exception as x:  # an unpicklable result is the case's own mistake
            data = pickle.dumps(("raised", f"result not picklable: {x}"))
        os.write(w, data)
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    kind, value = pickle.loads(data) if data else ("raised", "the child died")
    if kind == "raised":
        raise AssertionError(f"as {who.name}: {value}")
    return value


def outcome(fn, *args):
    """'ok' or the errno name fn(*args) failed with; closes a descriptor it returns."""
    try:
        r = fn(*args)
        if isinstance(r, int):
            os.close(r)
        return "ok"
    except OSError as x:
        return errno.errorcode[x.errno]


def user_fails(who, e, fn, *args):
    """fn(*args) as `who` must fail with errno e."""
    as_user(who, fails, e, fn, *args)


def touch(p, mode=0o644, data=b""):
    """A regular file with exactly `mode` (umask aside) and `data`."""
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, data)
    os.close(fd)
    os.chmod(p, mode)


def mkdir(p, mode=0o755, owner=None):
    """A directory with exactly `mode`, owned by `owner` (a User) if given."""
    os.mkdir(p)
    if owner:
        os.chown(p, owner.uid, owner.gid)
    os.chmod(p, mode)


def own(p, who, gid=None):
    os.chown(p, who.uid, who.gid if gid is None else gid)


def mode_of(p):
    return os.lstat(p).st_mode & 0o7777


def tick():
    """Lets the clock move on, so that a timestamp set after this differs from one before."""
    time.sleep(0.03)


def check_times(p, before, mtime, ctime, follow=True):
    """p's mtime and ctime moved on from the stat result `before` (if asked) or did not."""
    s = os.stat(p) if follow else os.lstat(p)
    for what, want, old, new in (("mtime", mtime, before.st_mtime_ns, s.st_mtime_ns),
                                 ("ctime", ctime, before.st_ctime_ns, s.st_ctime_ns)):
        if want:
            assert new > old, f"{what} of {os.path.basename(p)} did not move on"
        else:
            assert new == old, f"{what} of {os.path.basename(p)} changed"


# utimensat with UTIME_NOW and UTIME_OMIT, which os.utime cannot express.
UTIME_NOW = (1 << 30) - 1
UTIME_OMIT = (1 << 30) - 2
AT_FDCWD = -100
AT_SYMLINK_NOFOLLOW = 0x100
_libc = ctypes.CDLL(None, use_errno=True)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def utimensat(path, atime, mtime, flags=0):
    """atime and mtime: (sec, nsec), UTIME_NOW or UTIME_OMIT; both None: times NULL."""
    def spec(t):
        return _Timespec(0, t) if isinstance(t, int) else _Timespec(*t)
    times = None if atime is None else (_Timespec * 2)(spec(atime), spec(mtime))
    if _libc.utimensat(AT_FDCWD, os.fsencode(path), times, flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), path)
