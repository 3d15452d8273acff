"""File contents and special files: open (creation, flags, umask), truncate and ftruncate,
write, mkfifo and mknod."""
import errno
import os
import stat

from . import (ALICE, BOB, DIOD, DIOD_USERS, STAFF, as_user, case, check_times, fails,
               mkdir, mode_of, tick, touch, user_fails)

# ---- open -----------------------------------------------------------------------------------


@case("open: O_CREAT makes a regular file with the mode less the umask, owned by the caller")
def _(d):
    os.umask(0o027)
    os.chmod(d, 0o777)
    as_user(ALICE, lambda: os.close(os.open(f"{d}/f", os.O_WRONLY | os.O_CREAT, 0o777)))
    s = os.stat(f"{d}/f")
    assert stat.S_ISREG(s.st_mode) and stat.S_IMODE(s.st_mode) == 0o750
    assert (s.st_uid, s.st_gid, s.st_size) == (ALICE.uid, ALICE.gid, 0)


@case("open: O_CREAT keeps setuid, setgid and sticky bits of the mode for root")
def _(d):
    os.close(os.open(f"{d}/f", os.O_WRONLY | os.O_CREAT, 0o7755))
    assert mode_of(f"{d}/f") == 0o7755, oct(mode_of(f"{d}/f"))


@case("open: O_CREAT of an existing file keeps its mode and data")
def _(d):
    touch(f"{d}/f", 0o600, b"abc")
    os.close(os.open(f"{d}/f", os.O_RDWR | os.O_CREAT, 0o777))
    assert mode_of(f"{d}/f") == 0o600 and os.stat(f"{d}/f").st_size == 3


@case("open: O_CREAT|O_EXCL fails with EEXIST, also on a dangling symlink")
def _(d):
    touch(f"{d}/f")
    os.symlink("nowhere", f"{d}/l")
    fails(errno.EEXIST, os.open, f"{d}/f", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    fails(errno.EEXIST, os.open, f"{d}/l", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    assert not os.path.exists(f"{d}/nowhere")


@case("open: O_CREAT through a dangling symlink creates its target")
def _(d):
    os.symlink("target", f"{d}/l")
    os.close(os.open(f"{d}/l", os.O_CREAT | os.O_WRONLY, 0o644))
    assert stat.S_ISREG(os.lstat(f"{d}/target").st_mode)


@case("open: ENOENT without O_CREAT, and for an empty path")
def _(d):
    fails(errno.ENOENT, os.open, f"{d}/nothing", os.O_RDONLY)
    fails(errno.ENOENT, os.open, "", os.O_RDONLY)


@case("open: EISDIR when a directory is opened for writing; reading it is allowed")
def _(d):
    fails(errno.EISDIR, os.open, d, os.O_WRONLY)
    fails(errno.EISDIR, os.open, d, os.O_RDWR)
    fails(errno.EISDIR, os.open, f"{d}/", os.O_WRONLY | os.O_CREAT, 0o644)
    os.close(os.open(d, os.O_RDONLY))


@case("open: O_DIRECTORY on a file is ENOTDIR; a trailing slash on a file is ENOTDIR")
def _(d):
    touch(f"{d}/f")
    fails(errno.ENOTDIR, os.open, f"{d}/f", os.O_RDONLY | os.O_DIRECTORY)
    fails(errno.ENOTDIR, os.open, f"{d}/f/", os.O_RDONLY)


@case("open: O_NOFOLLOW on a symlink is ELOOP")
def _(d):
    touch(f"{d}/f")
    os.symlink("f", f"{d}/l")
    fails(errno.ELOOP, os.open, f"{d}/l", os.O_RDONLY | os.O_NOFOLLOW)
    os.close(os.open(f"{d}/f", os.O_RDONLY | os.O_NOFOLLOW))


@case("open: ELOOP for a symlink that points at itself")
def _(d):
    os.symlink("l", f"{d}/l")
    fails(errno.ELOOP, os.open, f"{d}/l", os.O_RDONLY)


@case("open: O_CREAT|O_DIRECTORY is EINVAL")
def _(d):
    fails(errno.EINVAL, os.open, f"{d}/x", os.O_RDONLY | os.O_CREAT | os.O_DIRECTORY, 0o755)


@case("open: O_TRUNC empties the file and updates mtime and ctime")
def _(d):
    touch(f"{d}/f", data=b"12345")
    before = os.stat(f"{d}/f")
    tick()
    os.close(os.open(f"{d}/f", os.O_WRONLY | os.O_TRUNC))
    assert os.stat(f"{d}/f").st_size == 0
    check_times(f"{d}/f", before, mtime=True, ctime=True)


@case("open: O_TRUNC with O_RDONLY still empties a file the caller may write")
def _(d):
    touch(f"{d}/f", 0o666, b"12345")
    os.close(os.open(f"{d}/f", os.O_RDONLY | os.O_TRUNC))
    assert os.stat(f"{d}/f").st_size == 0


@case("open: O_TRUNC with O_RDONLY on a file the caller may only read is EACCES")
def _(d):
    touch(f"{d}/f", 0o644, b"12345")
    user_fails(ALICE, errno.EACCES, os.open, f"{d}/f", os.O_RDONLY | os.O_TRUNC)
    assert os.stat(f"{d}/f").st_size == 5


@case("open: O_APPEND writes at the end whatever the offset")
def _(d):
    touch(f"{d}/f", data=b"ab")
    fd = os.open(f"{d}/f", os.O_WRONLY | os.O_APPEND)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, b"c")
    os.close(fd)
    assert open(f"{d}/f", "rb").read() == b"abc"


@case("open: a file created O_CREAT with mode 0 is still writable through that descriptor")
def _(d):
    os.chmod(d, 0o777)

    def create():
        fd = os.open(f"{d}/f", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0)
        os.write(fd, b"mine")
        os.close(fd)
    as_user(ALICE, create)
    assert mode_of(f"{d}/f") == 0 and os.stat(f"{d}/f").st_size == 4


@case("open: O_CREAT updates the parent's mtime and ctime")
def _(d):
    before = os.stat(d)
    tick()
    os.close(os.open(f"{d}/f", os.O_WRONLY | os.O_CREAT, 0o644))
    check_times(d, before, mtime=True, ctime=True)


@case("open: a FIFO opened O_WRONLY|O_NONBLOCK without a reader is ENXIO")
def _(d):
    os.mkfifo(f"{d}/p")
    fails(errno.ENXIO, os.open, f"{d}/p", os.O_WRONLY | os.O_NONBLOCK)
    r = os.open(f"{d}/p", os.O_RDONLY | os.O_NONBLOCK)
    w = os.open(f"{d}/p", os.O_WRONLY | os.O_NONBLOCK)
    os.write(w, b"through")
    assert os.read(r, 100) == b"through"
    os.close(w)
    os.close(r)


# ---- write ----------------------------------------------------------------------------------


@case("write: updates mtime and ctime; a read changes neither")
def _(d):
    touch(f"{d}/f", data=b"abc")
    before = os.stat(f"{d}/f")
    tick()
    assert open(f"{d}/f", "rb").read() == b"abc"
    check_times(f"{d}/f", before, mtime=False, ctime=False)
    with open(f"{d}/f", "r+b") as f:
        f.write(b"x")
    check_times(f"{d}/f", before, mtime=True, ctime=True)


@case("write: by a non-root writer clears setuid, and setgid with group execute")
def _(d):
    touch(f"{d}/f", 0o6777)

    def write():
        with open(f"{d}/f", "r+b") as f:
            f.write(b"x")
    as_user(ALICE, write)
    assert mode_of(f"{d}/f") == 0o777, oct(mode_of(f"{d}/f"))


@case("write: by root keeps setuid and setgid")
def _(d):
    touch(f"{d}/f", 0o6755)
    with open(f"{d}/f", "r+b") as f:
        f.write(b"x")
    assert mode_of(f"{d}/f") == 0o6755, oct(mode_of(f"{d}/f"))


@case("write: by a non-root writer keeps setgid without group execute")
def _(d):
    touch(f"{d}/f", 0o2666)
    os.chown(f"{d}/f", ALICE.uid, ALICE.gid)

    def write():
        with open(f"{d}/f", "r+b") as f:
            f.write(b"x")
    as_user(ALICE, write)
    assert mode_of(f"{d}/f") == 0o2666, oct(mode_of(f"{d}/f"))


# security.capability granting cap_net_raw (struct vfs_cap_data, revision 2, effective).
FILE_CAPS = (0x02000001).to_bytes(4, "little") + (1 << 13).to_bytes(4, "little") + bytes(12)


@case("write: drops the file's capabilities, also when set after an earlier write")
def _(d):
    # The first write finds no capabilities: a client that remembers that must forget it
    # when the capabilities are set.
    touch(f"{d}/f", 0o755)
    with open(f"{d}/f", "r+b", buffering=0) as f:
        f.write(b"x")
        os.setxattr(f"{d}/f", "security.capability", FILE_CAPS)
        assert os.getxattr(f"{d}/f", "security.capability") == FILE_CAPS
        f.write(b"y")
    fails(errno.ENODATA, os.getxattr, f"{d}/f", "security.capability")


# ---- truncate, ftruncate --------------------------------------------------------------------


@case("truncate: grows with zeroes and shrinks")
def _(d):
    touch(f"{d}/f", data=b"xyz")
    os.truncate(f"{d}/f", 10)
    assert open(f"{d}/f", "rb").read() == b"xyz" + bytes(7)
    os.truncate(f"{d}/f", 1)
    assert open(f"{d}/f", "rb").read() == b"x"


@case("truncate: shrinking then growing reads zeroes where the data was")
def _(d):
    touch(f"{d}/f", data=b"abcdef")
    os.truncate(f"{d}/f", 2)
    os.truncate(f"{d}/f", 6)
    assert open(f"{d}/f", "rb").read() == b"ab" + bytes(4)


@case("truncate: a change of size updates mtime and ctime")
def _(d):
    touch(f"{d}/f", data=b"abc")
    before = os.stat(f"{d}/f")
    tick()
    os.truncate(f"{d}/f", 100)
    check_times(f"{d}/f", before, mtime=True, ctime=True)
    before = os.stat(f"{d}/f")
    tick()
    os.truncate(f"{d}/f", 1)
    check_times(f"{d}/f", before, mtime=True, ctime=True)


@case("truncate: EISDIR on a directory")
def _(d):
    fails(errno.EISDIR, os.truncate, d, 0)


@case("truncate: EINVAL for a negative length")
def _(d):
    touch(f"{d}/f")
    fails(errno.EINVAL, os.truncate, f"{d}/f", -1)


@case("truncate: EACCES without write permission, even for the owner",
      skip={DIOD: DIOD_USERS})
def _(d):
    touch(f"{d}/f", 0o444, b"abc")
    os.chown(f"{d}/f", ALICE.uid, ALICE.gid)
    user_fails(ALICE, errno.EACCES, os.truncate, f"{d}/f", 0)
    user_fails(BOB, errno.EACCES, os.truncate, f"{d}/f", 0)
    assert os.stat(f"{d}/f").st_size == 3


@case("truncate: allowed to a non-owner with write permission")
def _(d):
    touch(f"{d}/f", 0o646, b"abc")
    as_user(ALICE, os.truncate, f"{d}/f", 1)
    assert os.stat(f"{d}/f").st_size == 1


@case("truncate: by a non-root writer clears setuid")
def _(d):
    touch(f"{d}/f", 0o4777, b"abc")
    as_user(ALICE, os.truncate, f"{d}/f", 1)
    assert mode_of(f"{d}/f") == 0o777, oct(mode_of(f"{d}/f"))


@case("truncate: follows a symlink")
def _(d):
    touch(f"{d}/f", data=b"abc")
    os.symlink("f", f"{d}/l")
    os.truncate(f"{d}/l", 1)
    assert os.stat(f"{d}/f").st_size == 1


@case("ftruncate: EINVAL on a descriptor open only for reading")
def _(d):
    touch(f"{d}/f", data=b"abc")
    fd = os.open(f"{d}/f", os.O_RDONLY)
    try:
        fails(errno.EINVAL, os.ftruncate, fd, 0)
    finally:
        os.close(fd)


@case("ftruncate: a descriptor open for writing may truncate after a chmod to 0")
def _(d):
    os.chmod(d, 0o777)

    def steps():
        fd = os.open(f"{d}/f", os.O_RDWR | os.O_CREAT, 0o644)
        os.write(fd, b"abcdef")
        os.fchmod(fd, 0)
        os.ftruncate(fd, 2)
        os.close(fd)
    as_user(ALICE, steps)
    assert os.stat(f"{d}/f").st_size == 2


# ---- mkfifo ---------------------------------------------------------------------------------


@case("mkfifo: a FIFO with the mode asked; EEXIST on an existing name")
def _(d):
    os.mkfifo(f"{d}/p", 0o640)
    s = os.lstat(f"{d}/p")
    assert stat.S_ISFIFO(s.st_mode) and stat.S_IMODE(s.st_mode) == 0o640
    fails(errno.EEXIST, os.mkfifo, f"{d}/p")


@case("mkfifo: the umask is taken from the mode")
def _(d):
    os.umask(0o077)
    os.mkfifo(f"{d}/p", 0o666)
    assert mode_of(f"{d}/p") == 0o600


@case("mkfifo: EEXIST onto a file, a directory, a symlink")
def _(d):
    touch(f"{d}/f")
    os.mkdir(f"{d}/x")
    os.symlink("nowhere", f"{d}/l")
    for name in ("f", "x", "l"):
        fails(errno.EEXIST, os.mkfifo, f"{d}/{name}")


@case("mkfifo: by another user, owned by them; updates the parent's mtime and ctime")
def _(d):
    os.chmod(d, 0o777)
    before = os.stat(d)
    tick()
    as_user(ALICE, os.mkfifo, f"{d}/p")
    s = os.lstat(f"{d}/p")
    assert (s.st_uid, s.st_gid) == (ALICE.uid, ALICE.gid)
    check_times(d, before, mtime=True, ctime=True)


# ---- mknod ----------------------------------------------------------------------------------


@case("mknod: a character device keeps its device number")
def _(d):
    os.mknod(f"{d}/c", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    s = os.lstat(f"{d}/c")
    assert stat.S_ISCHR(s.st_mode) and os.major(s.st_rdev) == 1 and os.minor(s.st_rdev) == 3


@case("mknod: a block device keeps its device number, large ones too")
def _(d):
    os.mknod(f"{d}/b", stat.S_IFBLK | 0o640, os.makedev(8, 1))
    os.mknod(f"{d}/big", stat.S_IFBLK | 0o640, os.makedev(259, 300))
    s = os.lstat(f"{d}/b")
    assert stat.S_ISBLK(s.st_mode) and s.st_rdev == os.makedev(8, 1)
    assert stat.S_IMODE(s.st_mode) == 0o640
    assert os.lstat(f"{d}/big").st_rdev == os.makedev(259, 300)


@case("mknod: a regular file, a FIFO and a socket node; type 0 means a regular file")
def _(d):
    os.mknod(f"{d}/r", stat.S_IFREG | 0o600)
    os.mknod(f"{d}/z", 0o600)
    os.mknod(f"{d}/p", stat.S_IFIFO | 0o600)
    os.mknod(f"{d}/s", stat.S_IFSOCK | 0o600)
    assert stat.S_ISREG(os.lstat(f"{d}/r").st_mode) and stat.S_ISREG(os.lstat(f"{d}/z").st_mode)
    assert stat.S_ISFIFO(os.lstat(f"{d}/p").st_mode)
    assert stat.S_ISSOCK(os.lstat(f"{d}/s").st_mode)


@case("mknod: the umask is taken from the mode")
def _(d):
    os.umask(0o077)
    os.mknod(f"{d}/c", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    assert mode_of(f"{d}/c") == 0o600


@case("mknod: EPERM for a directory type; EINVAL for an unknown type")
def _(d):
    fails(errno.EPERM, os.mknod, f"{d}/x", stat.S_IFDIR | 0o755)
    fails(errno.EINVAL, os.mknod, f"{d}/x", 0o170000 | 0o644)


@case("mknod: EEXIST on an existing name")
def _(d):
    touch(f"{d}/f")
    fails(errno.EEXIST, os.mknod, f"{d}/f", stat.S_IFCHR | 0o600, os.makedev(1, 3))


@case("mknod: EPERM for a non-root user's device node; a FIFO is allowed")
def _(d):
    os.chmod(d, 0o777)
    user_fails(ALICE, errno.EPERM, os.mknod, f"{d}/c", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    user_fails(ALICE, errno.EPERM, os.mknod, f"{d}/b", stat.S_IFBLK | 0o600, os.makedev(8, 1))
    as_user(ALICE, os.mknod, f"{d}/p", stat.S_IFIFO | 0o600)
    assert os.lstat(f"{d}/p").st_uid == ALICE.uid


@case("mknod: root's device node in a setgid directory gets the directory's group")
def _(d):
    mkdir(f"{d}/g", 0o2755)
    os.chown(f"{d}/g", 0, STAFF)
    os.mknod(f"{d}/g/c", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    assert os.lstat(f"{d}/g/c").st_gid == STAFF
