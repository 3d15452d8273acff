"""Names: mkdir, rmdir, link, unlink, symlink and rename, with what each does to link counts and
to the timestamps of the parent and of the inode, and their own error cases. (The path errors
all calls share are in paths.py; what other users may do is in access.py.)"""
import errno
import os
import stat

from . import ALICE, DIOD, as_user, case, check_times, fails, mode_of, tick, touch

# ---- mkdir ----------------------------------------------------------------------------------


@case("mkdir: new directory has the mode asked and 2 links; parent gains one")
def _(d):
    n = os.stat(d).st_nlink
    os.mkdir(f"{d}/x", 0o751)
    s = os.stat(f"{d}/x")
    assert stat.S_ISDIR(s.st_mode) and stat.S_IMODE(s.st_mode) == 0o751 and s.st_nlink == 2
    assert os.stat(d).st_nlink == n + 1


@case("mkdir: the umask is taken from the mode")
def _(d):
    os.umask(0o027)
    os.mkdir(f"{d}/x", 0o777)
    assert mode_of(f"{d}/x") == 0o750


@case("mkdir: the sticky bit of the mode is kept, setuid and setgid are not")
def _(d):
    os.mkdir(f"{d}/s", 0o1755)
    os.mkdir(f"{d}/g", 0o6755)
    assert mode_of(f"{d}/s") == 0o1755, oct(mode_of(f"{d}/s"))
    assert mode_of(f"{d}/g") == 0o755, oct(mode_of(f"{d}/g"))


@case("mkdir: owned by the caller's uid and gid")
def _(d):
    os.chmod(d, 0o777)
    as_user(ALICE, os.mkdir, f"{d}/x")
    s = os.stat(f"{d}/x")
    assert (s.st_uid, s.st_gid) == (ALICE.uid, ALICE.gid)


@case("mkdir: EEXIST on an existing file, directory or symlink (even dangling)")
def _(d):
    touch(f"{d}/f")
    os.mkdir(f"{d}/x")
    os.symlink("nowhere", f"{d}/l")
    for name in ("f", "x", "l"):
        fails(errno.EEXIST, os.mkdir, f"{d}/{name}")


@case("mkdir: EEXIST for . and ..")
def _(d):
    fails(errno.EEXIST, os.mkdir, f"{d}/.")
    fails(errno.EEXIST, os.mkdir, f"{d}/..")


@case("mkdir: ENOENT for an empty path")
def _(d):
    fails(errno.ENOENT, os.mkdir, "")


@case("mkdir: a trailing slash is allowed")
def _(d):
    os.mkdir(f"{d}/x/")
    assert os.path.isdir(f"{d}/x")


@case("mkdir: a 255-byte name works")
def _(d):
    os.mkdir(f"{d}/" + "n" * 255)
    assert os.listdir(d) == ["n" * 255]


@case("mkdir: updates the parent's mtime and ctime")
def _(d):
    before = os.stat(d)
    tick()
    os.mkdir(f"{d}/x")
    check_times(d, before, mtime=True, ctime=True)


# ---- rmdir ----------------------------------------------------------------------------------


@case("rmdir: removes an empty directory; the parent loses a link")
def _(d):
    os.mkdir(f"{d}/x")
    n = os.stat(d).st_nlink
    os.rmdir(f"{d}/x")
    assert not os.path.exists(f"{d}/x") and os.stat(d).st_nlink == n - 1


@case("rmdir: ENOTEMPTY for a directory with an entry")
def _(d):
    os.mkdir(f"{d}/x")
    touch(f"{d}/x/f")
    fails(errno.ENOTEMPTY, os.rmdir, f"{d}/x")


@case("rmdir: ENOTEMPTY for a directory with only a subdirectory")
def _(d):
    os.makedirs(f"{d}/x/y")
    fails(errno.ENOTEMPTY, os.rmdir, f"{d}/x")


@case("rmdir: ENOTDIR on a file, and on a symlink to a directory")
def _(d):
    touch(f"{d}/f")
    os.mkdir(f"{d}/x")
    os.symlink("x", f"{d}/l")
    fails(errno.ENOTDIR, os.rmdir, f"{d}/f")
    fails(errno.ENOTDIR, os.rmdir, f"{d}/l")


@case("rmdir: ENOENT for a missing name")
def _(d):
    fails(errno.ENOENT, os.rmdir, f"{d}/nothing")


@case("rmdir: EINVAL for a last component '.', ENOTEMPTY for '..'")
def _(d):
    os.makedirs(f"{d}/x/y")
    fails(errno.EINVAL, os.rmdir, f"{d}/x/y/.")
    fails(errno.ENOTEMPTY, os.rmdir, f"{d}/x/y/..")


@case("rmdir: updates the parent's mtime and ctime")
def _(d):
    os.mkdir(f"{d}/x")
    before = os.stat(d)
    tick()
    os.rmdir(f"{d}/x")
    check_times(d, before, mtime=True, ctime=True)


# ---- link -----------------------------------------------------------------------------------


@case("link: a second name; nlink 2; EEXIST on an existing name")
def _(d):
    touch(f"{d}/f")
    os.link(f"{d}/f", f"{d}/g")
    assert os.stat(f"{d}/f").st_nlink == 2
    assert os.stat(f"{d}/f").st_ino == os.stat(f"{d}/g").st_ino
    fails(errno.EEXIST, os.link, f"{d}/f", f"{d}/g")


@case("link: EEXIST onto a directory, a symlink, '.'")
def _(d):
    touch(f"{d}/f")
    os.mkdir(f"{d}/x")
    os.symlink("nowhere", f"{d}/l")
    for name in ("x", "l", "."):
        fails(errno.EEXIST, os.link, f"{d}/f", f"{d}/{name}")


@case("link: EPERM for a directory")
def _(d):
    os.mkdir(f"{d}/x")
    fails(errno.EPERM, os.link, f"{d}/x", f"{d}/y")


@case("link: ENOENT for a missing source")
def _(d):
    fails(errno.ENOENT, os.link, f"{d}/nothing", f"{d}/y")


@case("link: of a symlink links the symlink itself (linkat without AT_SYMLINK_FOLLOW)")
def _(d):
    touch(f"{d}/f")
    os.symlink("f", f"{d}/l")
    os.link(f"{d}/l", f"{d}/l2", follow_symlinks=False)
    assert os.lstat(f"{d}/l2").st_ino == os.lstat(f"{d}/l").st_ino
    assert stat.S_ISLNK(os.lstat(f"{d}/l2").st_mode) and os.lstat(f"{d}/l").st_nlink == 2


@case("link: updates the file's ctime and the parent's mtime and ctime")
def _(d):
    touch(f"{d}/f")
    file_before, dir_before = os.stat(f"{d}/f"), os.stat(d)
    tick()
    os.link(f"{d}/f", f"{d}/g")
    check_times(f"{d}/f", file_before, mtime=False, ctime=True)
    check_times(d, dir_before, mtime=True, ctime=True)


@case("link: of a FIFO and of a device node")
def _(d):
    os.mkfifo(f"{d}/p")
    os.mknod(f"{d}/c", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    os.link(f"{d}/p", f"{d}/p2")
    os.link(f"{d}/c", f"{d}/c2")
    assert stat.S_ISFIFO(os.lstat(f"{d}/p2").st_mode) and os.lstat(f"{d}/p").st_nlink == 2
    assert os.lstat(f"{d}/c2").st_rdev == os.makedev(1, 3)


# ---- unlink ---------------------------------------------------------------------------------


@case("unlink: the last name removes the file; ENOENT after")
def _(d):
    touch(f"{d}/f")
    os.unlink(f"{d}/f")
    fails(errno.ENOENT, os.stat, f"{d}/f")
    fails(errno.ENOENT, os.unlink, f"{d}/f")


@case("unlink: EISDIR on a directory and on '.'")
def _(d):
    os.mkdir(f"{d}/x")
    fails(errno.EISDIR, os.unlink, f"{d}/x")
    fails(errno.EISDIR, os.unlink, f"{d}/x/.")


@case("unlink: a symlink goes, its target stays")
def _(d):
    touch(f"{d}/f")
    os.symlink("f", f"{d}/l")
    os.unlink(f"{d}/l")
    assert not os.path.lexists(f"{d}/l") and os.path.exists(f"{d}/f")


@case("unlink: a FIFO, a device node, a socket node")
def _(d):
    os.mkfifo(f"{d}/p")
    os.mknod(f"{d}/c", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    os.mknod(f"{d}/s", stat.S_IFSOCK | 0o600)
    for name in ("p", "c", "s"):
        os.unlink(f"{d}/{name}")
    assert os.listdir(d) == []


@case("unlink: one of two names; the other's nlink drops and its ctime moves on")
def _(d):
    touch(f"{d}/f")
    os.link(f"{d}/f", f"{d}/g")
    before = os.stat(f"{d}/g")
    tick()
    os.unlink(f"{d}/f")
    check_times(f"{d}/g", before, mtime=False, ctime=True)
    assert os.stat(f"{d}/g").st_nlink == 1


@case("unlink: updates the parent's mtime and ctime")
def _(d):
    touch(f"{d}/f")
    before = os.stat(d)
    tick()
    os.unlink(f"{d}/f")
    check_times(d, before, mtime=True, ctime=True)


@case("unlink: an open file keeps its data for the descriptor",
      skip={DIOD: "diod serves paths: a read of an unlinked open file is ENOENT"})
def _(d):
    fd = os.open(f"{d}/f", os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, b"still here")
    os.unlink(f"{d}/f")
    assert not os.path.exists(f"{d}/f")
    assert os.pread(fd, 100, 0) == b"still here"
    assert os.fstat(fd).st_nlink == 0
    os.close(fd)


# ---- symlink, readlink ----------------------------------------------------------------------


@case("symlink: readlink gives the target; a dangling link is allowed; EEXIST")
def _(d):
    os.symlink("no/such/target", f"{d}/l")
    assert os.readlink(f"{d}/l") == "no/such/target"
    assert stat.S_ISLNK(os.lstat(f"{d}/l").st_mode)
    fails(errno.EEXIST, os.symlink, "x", f"{d}/l")


@case("symlink: mode 0777 whatever the umask; size is the target's length")
def _(d):
    os.umask(0o077)
    os.symlink("abcdef", f"{d}/l")
    s = os.lstat(f"{d}/l")
    assert stat.S_IMODE(s.st_mode) == 0o777 and s.st_size == 6


@case("symlink: EEXIST onto a file, a directory, '.'")
def _(d):
    touch(f"{d}/f")
    os.mkdir(f"{d}/x")
    for name in ("f", "x", "."):
        fails(errno.EEXIST, os.symlink, "t", f"{d}/{name}")


@case("symlink: ENOENT for an empty target")
def _(d):
    fails(errno.ENOENT, os.symlink, "", f"{d}/l")


@case("symlink: a 4095-byte target is kept; 4096 bytes is ENAMETOOLONG")
def _(d):
    long = "/".join(["t" * 200] * 21)[:4095]
    assert len(long) == 4095
    os.symlink(long, f"{d}/l")
    assert os.readlink(f"{d}/l") == long
    fails(errno.ENAMETOOLONG, os.symlink, long + "x", f"{d}/m")


@case("symlink: updates the parent's mtime and ctime")
def _(d):
    before = os.stat(d)
    tick()
    os.symlink("t", f"{d}/l")
    check_times(d, before, mtime=True, ctime=True)


@case("symlink: followed by stat and open, not by lstat")
def _(d):
    touch(f"{d}/f", 0o600, b"data")
    os.symlink("f", f"{d}/l")
    assert os.stat(f"{d}/l").st_ino == os.stat(f"{d}/f").st_ino
    assert os.lstat(f"{d}/l").st_ino != os.stat(f"{d}/f").st_ino
    assert open(f"{d}/l", "rb").read() == b"data"


@case("readlink: EINVAL on a file that is not a symlink")
def _(d):
    touch(f"{d}/f")
    fails(errno.EINVAL, os.readlink, f"{d}/f")


# ---- rename ---------------------------------------------------------------------------------


@case("rename: a file over a file replaces it")
def _(d):
    touch(f"{d}/a", data=b"a")
    touch(f"{d}/b", data=b"b")
    os.rename(f"{d}/a", f"{d}/b")
    assert open(f"{d}/b", "rb").read() == b"a" and not os.path.exists(f"{d}/a")


@case("rename: a file onto itself does nothing")
def _(d):
    touch(f"{d}/a", data=b"a")
    os.rename(f"{d}/a", f"{d}/a")
    assert open(f"{d}/a", "rb").read() == b"a"


@case("rename: onto another name of the same inode does nothing; both names stay")
def _(d):
    touch(f"{d}/a")
    os.link(f"{d}/a", f"{d}/b")
    os.rename(f"{d}/a", f"{d}/b")
    assert os.path.exists(f"{d}/a") and os.path.exists(f"{d}/b")
    assert os.stat(f"{d}/a").st_nlink == 2


@case("rename: a replaced file with another name loses a link and its ctime moves on",
      skip={DIOD: "diod's fids name paths: the fid the mount holds for the replaced file, "
                  "walked by its old name, reaches the file renamed onto that name"})
def _(d):
    touch(f"{d}/a")
    touch(f"{d}/b")
    os.link(f"{d}/b", f"{d}/b2")
    before = os.stat(f"{d}/b2")
    tick()
    os.rename(f"{d}/a", f"{d}/b")
    assert os.stat(f"{d}/b2").st_nlink == 1
    check_times(f"{d}/b2", before, mtime=False, ctime=True)


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


@case("rename: a directory into its own subtree, or onto itself below, is EINVAL")
def _(d):
    os.makedirs(f"{d}/x/y")
    fails(errno.EINVAL, os.rename, f"{d}/x", f"{d}/x/y/z")
    fails(errno.EINVAL, os.rename, f"{d}/x", f"{d}/x/z")


@case("rename: EBUSY for '.' or '..' as the last component of either name")
def _(d):
    os.makedirs(f"{d}/x/y")
    fails(errno.EBUSY, os.rename, f"{d}/x/y/.", f"{d}/z")
    fails(errno.EBUSY, os.rename, f"{d}/x/y/..", f"{d}/z")
    fails(errno.EBUSY, os.rename, f"{d}/x/y", f"{d}/x/.")


@case("rename: ENOTDIR for a file named with a trailing slash")
def _(d):
    touch(f"{d}/f")
    fails(errno.ENOTDIR, os.rename, f"{d}/f/", f"{d}/g")


@case("rename: a symlink moves as itself")
def _(d):
    os.symlink("target", f"{d}/l")
    os.rename(f"{d}/l", f"{d}/m")
    assert os.readlink(f"{d}/m") == "target" and not os.path.lexists(f"{d}/l")


@case("rename: across directories moves '..' and the link counts")
def _(d):
    os.mkdir(f"{d}/a")
    os.mkdir(f"{d}/b")
    os.mkdir(f"{d}/a/m")
    os.rename(f"{d}/a/m", f"{d}/b/m")
    assert os.stat(f"{d}/a").st_nlink == 2 and os.stat(f"{d}/b").st_nlink == 3
    assert os.stat(f"{d}/b/m/..").st_ino == os.stat(f"{d}/b").st_ino


@case("rename: a directory replacing an empty one keeps the parent's link count")
def _(d):
    os.mkdir(f"{d}/a")
    os.mkdir(f"{d}/b")
    n = os.stat(d).st_nlink
    os.rename(f"{d}/a", f"{d}/b")
    assert os.stat(d).st_nlink == n - 1


@case("rename: ENOENT for a missing source")
def _(d):
    fails(errno.ENOENT, os.rename, f"{d}/nothing", f"{d}/x")


@case("rename: updates both parents' mtime and ctime, and the file's ctime")
def _(d):
    os.mkdir(f"{d}/a")
    os.mkdir(f"{d}/b")
    touch(f"{d}/a/f")
    a, b, f = os.stat(f"{d}/a"), os.stat(f"{d}/b"), os.stat(f"{d}/a/f")
    tick()
    os.rename(f"{d}/a/f", f"{d}/b/f")
    check_times(f"{d}/a", a, mtime=True, ctime=True)
    check_times(f"{d}/b", b, mtime=True, ctime=True)
    check_times(f"{d}/b/f", f, mtime=False, ctime=True)


@case("rename: a file keeps its inode number, data and mode")
def _(d):
    touch(f"{d}/a", 0o640, b"abc")
    ino = os.stat(f"{d}/a").st_ino
    os.rename(f"{d}/a", f"{d}/b")
    s = os.stat(f"{d}/b")
    assert s.st_ino == ino and mode_of(f"{d}/b") == 0o640
    assert open(f"{d}/b", "rb").read() == b"abc"

