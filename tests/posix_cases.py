#!/usr/bin/python3
"""POSIX cases with their expected results, run on a mounted filesystem as root and as other
users, in the spirit of the well-known conformance suites (chmod, chown, link, mkdir, mkfifo,
mknod, open, rename, rmdir, symlink, truncate, unlink, utimensat, with their error cases and
permission matrices). Prints one line per failed case and a count; exit status 1 if any failed.

    tests/posix_cases.py DIR [--skip NAME,NAME...]
"""
import errno
import os
import stat
import sys

ALICE, BOB = (1000, 1000), (1001, 1001)
cases = []


def case(name, who=None):
    def register(fn):
        cases.append((name, who, fn))
        return fn
    return register


def fails(e, fn, *args):
    try:
        fn(*args)
    except OSError as x:
        assert x.errno == e, f"errno {errno.errorcode.get(x.errno)} instead of {errno.errorcode[e]}"
        return
    raise AssertionError(f"succeeded, expected {errno.errorcode[e]}")


def touch(p, mode=0o644):
    os.close(os.open(p, os.O_WRONLY | os.O_CREAT, mode))


# ---- mkdir, rmdir -------------------------------------------------------------------------
@case("mkdir: new directory has the mode asked and 2 links; parent gains one")
def _(d):
    n = os.stat(d).st_nlink
    os.mkdir(f"{d}/x", 0o751)
    s = os.stat(f"{d}/x")
    assert stat.S_ISDIR(s.st_mode) and stat.S_IMODE(s.st_mode) == 0o751 and s.st_nlink == 2
    assert os.stat(d).st_nlink == n + 1


@case("mkdir: EEXIST on an existing name")
def _(d):
    touch(f"{d}/f")
    fails(errno.EEXIST, os.mkdir, f"{d}/f")


@case("mkdir: ENOENT below a missing directory")
def _(d):
    fails(errno.ENOENT, os.mkdir, f"{d}/missing/x")


@case("mkdir: ENOTDIR below a file")
def _(d):
    touch(f"{d}/f")
    fails(errno.ENOTDIR, os.mkdir, f"{d}/f/x")


@case("mkdir: ENAMETOOLONG for a 256-byte name")
def _(d):
    fails(errno.ENAMETOOLONG, os.mkdir, f"{d}/" + "n" * 256)


@case("mkdir: a 255-byte name works")
def _(d):
    os.mkdir(f"{d}/" + "n" * 255)


@case("rmdir: ENOTEMPTY for a directory with an entry")
def _(d):
    os.mkdir(f"{d}/x")
    touch(f"{d}/x/f")
    fails(errno.ENOTEMPTY, os.rmdir, f"{d}/x")


@case("rmdir: ENOTDIR on a file")
def _(d):
    touch(f"{d}/f")
    fails(errno.ENOTDIR, os.rmdir, f"{d}/f")


@case("rmdir: removes an empty directory; the parent loses a link")
def _(d):
    os.mkdir(f"{d}/x")
    n = os.stat(d).st_nlink
    os.rmdir(f"{d}/x")
    assert not os.path.exists(f"{d}/x") and os.stat(d).st_nlink == n - 1


# ---- open, creat, truncate ----------------------------------------------------------------
@case("open: O_CREAT|O_EXCL fails with EEXIST")
def _(d):
    touch(f"{d}/f")
    fails(errno.EEXIST, os.open, f"{d}/f", os.O_CREAT | os.O_EXCL | os.O_WRONLY)


@case("open: ENOENT without O_CREAT")
def _(d):
    fails(errno.ENOENT, os.open, f"{d}/nothing", os.O_RDONLY)


@case("open: EISDIR when a directory is opened for writing")
def _(d):
    fails(errno.EISDIR, os.open, d, os.O_WRONLY)


@case("open: O_TRUNC empties the file")
def _(d):
    with open(f"{d}/f", "wb") as f:
        f.write(b"12345")
    os.close(os.open(f"{d}/f", os.O_WRONLY | os.O_TRUNC))
    assert os.stat(f"{d}/f").st_size == 0


@case("open: O_APPEND writes at the end")
def _(d):
    with open(f"{d}/f", "wb") as f:
        f.write(b"ab")
    fd = os.open(f"{d}/f", os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"c")
    os.close(fd)
    assert open(f"{d}/f", "rb").read() == b"abc"


@case("truncate: grows with zeroes and shrinks")
def _(d):
    with open(f"{d}/f", "wb") as f:
        f.write(b"xyz")
    os.truncate(f"{d}/f", 10)
    assert open(f"{d}/f", "rb").read() == b"xyz" + bytes(7)
    os.truncate(f"{d}/f", 1)
    assert open(f"{d}/f", "rb").read() == b"x"


@case("truncate: EISDIR on a directory")
def _(d):
    fails(errno.EISDIR, os.truncate, d, 0)


# ---- link, unlink, symlink --------------------------------------------------------------
@case("link: a second name; nlink 2; EEXIST on an existing name")
def _(d):
    touch(f"{d}/f")
    os.link(f"{d}/f", f"{d}/g")
    assert os.stat(f"{d}/f").st_nlink == 2
    assert os.stat(f"{d}/f").st_ino == os.stat(f"{d}/g").st_ino
    fails(errno.EEXIST, os.link, f"{d}/f", f"{d}/g")


@case("link: EPERM for a directory")
def _(d):
    os.mkdir(f"{d}/x")
    fails(errno.EPERM, os.link, f"{d}/x", f"{d}/y")


@case("unlink: the last name removes the file; ENOENT after")
def _(d):
    touch(f"{d}/f")
    os.unlink(f"{d}/f")
    fails(errno.ENOENT, os.stat, f"{d}/f")
    fails(errno.ENOENT, os.unlink, f"{d}/f")


@case("unlink: EISDIR on a directory")
def _(d):
    os.mkdir(f"{d}/x")
    fails(errno.EISDIR, os.unlink, f"{d}/x")


@case("symlink: readlink gives the target; a dangling link is allowed")
def _(d):
    os.symlink("no/such/target", f"{d}/l")
    assert os.readlink(f"{d}/l") == "no/such/target"
    assert stat.S_ISLNK(os.lstat(f"{d}/l").st_mode)
    fails(errno.EEXIST, os.symlink, "x", f"{d}/l")


@case("readlink: EINVAL on a file that is not a symlink")
def _(d):
    touch(f"{d}/f")
    fails(errno.EINVAL, os.readlink, f"{d}/f")


# ---- mkfifo, mknod ------------------------------------------------------------------------
@case("mkfifo: a FIFO; EEXIST on an existing name")
def _(d):
    os.mkfifo(f"{d}/p", 0o640)
    s = os.lstat(f"{d}/p")
    assert stat.S_ISFIFO(s.st_mode) and stat.S_IMODE(s.st_mode) == 0o640
    fails(errno.EEXIST, os.mkfifo, f"{d}/p")


@case("mknod: a character device keeps its device number")
def _(d):
    os.mknod(f"{d}/c", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    s = os.lstat(f"{d}/c")
    assert stat.S_ISCHR(s.st_mode) and os.major(s.st_rdev) == 1 and os.minor(s.st_rdev) == 3


# ---- rename -------------------------------------------------------------------------------
@case("rename: a file over a file replaces it")
def _(d):
    with open(f"{d}/a", "w") as f:
        f.write("a")
    with open(f"{d}/b", "w") as f:
        f.write("b")
    os.rename(f"{d}/a", f"{d}/b")
    assert open(f"{d}/b").read() == "a" and not os.path.exists(f"{d}/a")


@case("rename: a directory over an empty directory; over a non-empty one ENOTEMPTY")
def _(d):
    os.mkdir(f"{d}/a")
    os.mkdir(f"{d}/b")
    os.mkdir(f"{d}/c")
    touch(f"{d}/c/f")
    fails(errno.ENOTEMPTY, os.rename, f"{d}/a", f"{d}/c")
    os.rename(f"{d}/a", f"{d}/b")
    assert os.path.isdir(f"{d}/b") and not os.path.exists(f"{d}/a")


@case("rename: a directory over a file ENOTDIR; a file over a directory EISDIR")
def _(d):
    os.mkdir(f"{d}/x")
    touch(f"{d}/f")
    fails(errno.ENOTDIR, os.rename, f"{d}/x", f"{d}/f")
    fails(errno.EISDIR, os.rename, f"{d}/f", f"{d}/x")


@case("rename: a directory into its own subtree is EINVAL")
def _(d):
    os.makedirs(f"{d}/x/y")
    fails(errno.EINVAL, os.rename, f"{d}/x", f"{d}/x/y/z")


@case("rename: across directories moves '..' and the link counts")
def _(d):
    os.mkdir(f"{d}/a")
    os.mkdir(f"{d}/b")
    os.mkdir(f"{d}/a/m")
    os.rename(f"{d}/a/m", f"{d}/b/m")
    assert os.stat(f"{d}/a").st_nlink == 2 and os.stat(f"{d}/b").st_nlink == 3
    assert os.stat(f"{d}/b/m/..").st_ino == os.stat(f"{d}/b").st_ino


@case("rename: ENOENT for a missing source")
def _(d):
    fails(errno.ENOENT, os.rename, f"{d}/nothing", f"{d}/x")


# ---- chmod, chown, utimensat as root --------------------------------------------------------
@case("chmod: sets the permission bits, keeps the type")
def _(d):
    touch(f"{d}/f")
    os.chmod(f"{d}/f", 0o4751)
    s = os.stat(f"{d}/f")
    assert stat.S_ISREG(s.st_mode) and stat.S_IMODE(s.st_mode) == 0o4751


@case("chown: root gives a file away")
def _(d):
    touch(f"{d}/f")
    os.chown(f"{d}/f", 1000, 1001)
    s = os.stat(f"{d}/f")
    assert (s.st_uid, s.st_gid) == (1000, 1001)


@case("utimensat: explicit times with nanoseconds are kept")
def _(d):
    touch(f"{d}/f")
    os.utime(f"{d}/f", ns=(1_000_000_123, 2_000_000_456))
    s = os.stat(f"{d}/f")
    assert (s.st_atime_ns, s.st_mtime_ns) == (1_000_000_123, 2_000_000_456)


# ---- as other users -----------------------------------------------------------------------
@case("as alice: EACCES creating in root's 0755 directory", ALICE)
def _(d):
    fails(errno.EACCES, touch, f"{d}/root-owned/x")


@case("as alice: EACCES reading root's 0600 file", ALICE)
def _(d):
    fails(errno.EACCES, os.open, f"{d}/secret", os.O_RDONLY)


@case("as alice: EACCES searching root's 0700 directory", ALICE)
def _(d):
    fails(errno.EACCES, os.stat, f"{d}/private/inside")


@case("as alice: creates in a 1777 directory, owns the file", ALICE)
def _(d):
    touch(f"{d}/shared/alice")
    s = os.stat(f"{d}/shared/alice")
    assert (s.st_uid, s.st_gid) == ALICE


@case("as alice: EPERM chmod of root's file", ALICE)
def _(d):
    fails(errno.EPERM, os.chmod, f"{d}/shared/rootfile", 0o777)


@case("as alice: EPERM chown of her own file to bob", ALICE)
def _(d):
    touch(f"{d}/shared/alice2")
    fails(errno.EPERM, os.chown, f"{d}/shared/alice2", BOB[0], -1)


@case("as alice: EPERM setting explicit times on root's file", ALICE)
def _(d):
    fails(errno.EPERM, os.utime, f"{d}/shared/rootfile", (1, 1))


@case("as bob: EPERM (sticky) unlinking alice's file in a 1777 directory", BOB)
def _(d):
    fails(errno.EPERM, os.unlink, f"{d}/shared/alice")


@case("as bob: EPERM (sticky) renaming alice's file away", BOB)
def _(d):
    fails(errno.EPERM, os.rename, f"{d}/shared/alice", f"{d}/shared/bobs")


@case("as alice: the group of a setgid directory is inherited", ALICE)
def _(d):
    touch(f"{d}/setgid/a")
    assert os.stat(f"{d}/setgid/a").st_gid == 4242


def fixtures(d):
    """What the other users' cases expect to exist, made by root."""
    os.mkdir(f"{d}/root-owned", 0o755)
    touch(f"{d}/secret", 0o600)
    os.mkdir(f"{d}/private", 0o700)
    touch(f"{d}/private/inside")
    os.mkdir(f"{d}/shared")
    os.chmod(f"{d}/shared", 0o1777)
    touch(f"{d}/shared/rootfile", 0o666)
    os.mkdir(f"{d}/setgid")
    os.chown(f"{d}/setgid", 0, 4242)
    os.chmod(f"{d}/setgid", 0o2777)


def run(fn, d, who):
    """Runs a case in a child (as `who` if given); None if it passed, else why not."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            if who:
                os.setgroups([])
                os.setresgid(who[1], who[1], who[1])
                os.setresuid(who[0], who[0], who[0])
            fn(d)
            msg = b""
        except BaseException as x:  # noqa: B902 - report everything the case raised
            msg = f"{type(x).__name__}: {x}".encode() or b"failed"
        os.write(w, msg)
        os._exit(0)
    os.close(w)
    msg = b""
    while chunk := os.read(r, 4096):
        msg += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return msg.decode() or None


def main():
    root = sys.argv[1]
    skip = set()
    if "--skip" in sys.argv:
        skip = set(sys.argv[sys.argv.index("--skip") + 1].split(","))
    os.chmod(root, 0o777)
    shared = os.path.join(root, "users")
    os.mkdir(shared, 0o755)
    fixtures(shared)
    passed = failed = skipped = 0
    for i, (name, who, fn) in enumerate(cases):
        if name.split(":")[0] in skip:
            skipped += 1
            continue
        d = shared if who else os.path.join(root, f"case{i}")
        if not who:
            os.mkdir(d)
        why = run(fn, d, who)
        if why is None:
            passed += 1
        else:
            failed += 1
            print(f"FAILED: {name}: {why}")
    print(f"posix cases: {passed} passed, {failed} failed, {skipped} skipped")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
