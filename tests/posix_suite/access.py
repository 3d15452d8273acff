"""Who may do what: the permission matrices of files (open for reading and writing) and
directories (list, search, create and remove in them) for the owner, group and other classes,
root's powers, sticky directories, setgid directories, and the permissions rename and link
need. Cases act as alice (uid 1000, group 1000), bob (1001) and carol (1002)."""
import errno
import os

from . import (ALICE, BOB, CAROL, DIOD, DIOD_USERS, GROUPS_9P, NINEP, STAFF, as_user, case,
               fails, member, mkdir, mode_of, outcome, touch, user_fails)

# The class a permission applies to, as (owner, group) of the file or directory for alice, and
# the shift of its bits in the mode. Every other class gets all permissions, so that a case
# also shows that the first class that matches decides, not the most generous one.
CLASSES = {
    "owner": ((ALICE.uid, STAFF), 6),
    "group": ((0, ALICE.gid), 3),
    "other": ((0, STAFF), 0),
}


def class_mode(shift, bits):
    return (0o777 & ~(0o7 << shift)) | (bits << shift)


def want(allowed):
    return "ok" if allowed else "EACCES"


# ---- open: the file matrix -------------------------------------------------------------------

def file_case(cls, bits):
    (uid, gid), shift = CLASSES[cls]
    mode = class_mode(shift, bits)
    rwx = "".join(c if bits & b else "-" for c, b in (("r", 4), ("w", 2), ("x", 1)))

    @case(f"open: as alice in the file's {cls} class with {rwx} (mode {mode:04o})")
    def _(d):
        touch(f"{d}/f", mode, b"abc")
        os.chown(f"{d}/f", uid, gid)
        os.chmod(f"{d}/f", mode)
        p = f"{d}/f"
        got = as_user(ALICE, lambda: [outcome(os.open, p, fl)
                                      for fl in (os.O_RDONLY, os.O_WRONLY, os.O_RDWR)])
        expected = [want(bits & 4), want(bits & 2), want(bits & 6 == 6)]
        assert got == expected, f"O_RDONLY, O_WRONLY, O_RDWR gave {got}, expected {expected}"


for cls in CLASSES:
    for bits in (0, 4, 2, 6):
        file_case(cls, bits)


# ---- directories: the matrix ------------------------------------------------------------------

def dir_case(cls, bits):
    (uid, gid), shift = CLASSES[cls]
    mode = class_mode(shift, bits)
    rwx = "".join(c if bits & b else "-" for c, b in (("r", 4), ("w", 2), ("x", 1)))

    @case(f"directory: as alice in its {cls} class with {rwx}: list, stat below, create, "
          f"unlink (mode {mode:04o})")
    def _(d):
        x = f"{d}/x"
        os.mkdir(x)
        touch(f"{x}/old", 0o600)
        os.chown(x, uid, gid)
        os.chmod(x, mode)

        def steps():
            return [outcome(os.listdir, x), outcome(os.stat, f"{x}/old"),
                    outcome(os.open, f"{x}/new", os.O_WRONLY | os.O_CREAT, 0o644),
                    outcome(os.unlink, f"{x}/old")]
        got = as_user(ALICE, steps)
        r, w, s = bits & 4, bits & 2, bits & 1
        expected = [want(r), want(s), want(w and s), want(w and s)]
        assert got == expected, f"list, stat, create, unlink gave {got}, expected {expected}"


for bits in range(8):
    dir_case("owner", bits)
    dir_case("other", bits)
for bits in (3, 5, 6):
    dir_case("group", bits)


@case("directory: EACCES for mkdir, rmdir, link, symlink, mkfifo, rename in a r-x directory")
def _(d):
    x = f"{d}/x"
    mkdir(x, 0o777)
    touch(f"{x}/f")
    os.mkdir(f"{x}/sub")
    touch(f"{d}/outside", 0o666)
    os.chmod(x, 0o755)

    def steps():
        fails(errno.EACCES, os.mkdir, f"{x}/new")
        fails(errno.EACCES, os.rmdir, f"{x}/sub")
        fails(errno.EACCES, os.link, f"{d}/outside", f"{x}/new")
        fails(errno.EACCES, os.symlink, "t", f"{x}/new")
        fails(errno.EACCES, os.mkfifo, f"{x}/new")
        fails(errno.EACCES, os.rename, f"{x}/f", f"{x}/g")
    as_user(ALICE, steps)


@case("directory: a file's own mode does not matter for unlinking it")
def _(d):
    mkdir(f"{d}/x", 0o777)
    touch(f"{d}/x/f", 0)
    as_user(ALICE, os.unlink, f"{d}/x/f")
    assert not os.path.exists(f"{d}/x/f")


@case("directory: a group member is refused what only others may (mode 0705)")
def _(d):
    mkdir(f"{d}/x", 0o705)
    os.chown(f"{d}/x", 0, ALICE.gid)
    touch(f"{d}/x/f")
    user_fails(ALICE, errno.EACCES, os.listdir, f"{d}/x")
    user_fails(ALICE, errno.EACCES, os.stat, f"{d}/x/f")


@case("directory: supplementary groups count for the group class", skip={NINEP: GROUPS_9P})
def _(d):
    mkdir(f"{d}/x", 0o070)
    os.chown(f"{d}/x", 0, STAFF)
    touch(f"{d}/x/f", 0o060)
    os.chown(f"{d}/x/f", 0, STAFF)
    user_fails(ALICE, errno.EACCES, os.listdir, f"{d}/x")
    as_user(member(ALICE, STAFF), lambda: open(f"{d}/x/f", "r+b").close())


# ---- access(2) ------------------------------------------------------------------------------


@case("access: R_OK, W_OK, X_OK follow the class bits for alice")
def _(d):
    touch(f"{d}/f", 0o750)
    os.chown(f"{d}/f", ALICE.uid, ALICE.gid)
    touch(f"{d}/g", 0o750)
    os.chown(f"{d}/g", 0, ALICE.gid)
    touch(f"{d}/o", 0o751)

    def probe():
        return [os.access(f"{d}/{n}", m) for n in "fgo" for m in (os.R_OK, os.W_OK, os.X_OK)]
    got = as_user(ALICE, probe)
    expected = [True, True, True, True, False, True, False, False, True]
    assert got == expected, f"{got} instead of {expected}"


# ---- root ------------------------------------------------------------------------------------


@case("root: reads and writes a mode-0 file and lists and searches a mode-0 directory")
def _(d):
    touch(f"{d}/f", 0, b"abc")
    os.chown(f"{d}/f", ALICE.uid, ALICE.gid)
    with open(f"{d}/f", "r+b") as f:
        assert f.read() == b"abc"
        f.write(b"d")
    mkdir(f"{d}/x", 0, ALICE)
    touch(f"{d}/x/f")
    assert os.listdir(f"{d}/x") == ["f"] and os.stat(f"{d}/x/f").st_size == 0


@case("root: X_OK only if someone may execute")
def _(d):
    touch(f"{d}/f", 0o644)
    touch(f"{d}/g", 0o001)
    assert not os.access(f"{d}/f", os.X_OK) and os.access(f"{d}/g", os.X_OK)


@case("root: unlinks and renames in anyone's sticky directory")
def _(d):
    mkdir(f"{d}/t", 0o1777, ALICE)
    touch(f"{d}/t/a")
    touch(f"{d}/t/b")
    os.chown(f"{d}/t/a", BOB.uid, BOB.gid)
    os.chown(f"{d}/t/b", BOB.uid, BOB.gid)
    os.unlink(f"{d}/t/a")
    os.rename(f"{d}/t/b", f"{d}/t/c")


# ---- sticky directories ----------------------------------------------------------------------

def sticky(d):
    """A 1777 directory of alice's with bob's file `f` and subdirectory `sub` in it."""
    t = f"{d}/t"
    mkdir(t, 0o1777, ALICE)
    touch(f"{t}/f", 0o666)
    os.chown(f"{t}/f", BOB.uid, BOB.gid)
    os.mkdir(f"{t}/sub")
    os.chown(f"{t}/sub", BOB.uid, BOB.gid)
    return t


@case("sticky: another user may not unlink, rename away or rmdir what is not theirs")
def _(d):
    t = sticky(d)

    def steps():
        fails(errno.EPERM, os.unlink, f"{t}/f")
        fails(errno.EPERM, os.rename, f"{t}/f", f"{t}/g")
        fails(errno.EPERM, os.rmdir, f"{t}/sub")
    as_user(CAROL, steps)
    assert os.path.exists(f"{t}/f") and os.path.isdir(f"{t}/sub")


@case("sticky: another user may not rename onto what is not theirs",
      skip={DIOD: DIOD_USERS})
def _(d):
    t = sticky(d)
    as_user(CAROL, touch, f"{t}/mine")
    user_fails(CAROL, errno.EPERM, os.rename, f"{t}/mine", f"{t}/f")


@case("sticky: the file's owner may unlink and rename it",
      skip={DIOD: DIOD_USERS})
def _(d):
    t = sticky(d)
    as_user(BOB, os.rename, f"{t}/f", f"{t}/g")
    as_user(BOB, os.unlink, f"{t}/g")
    as_user(BOB, os.rmdir, f"{t}/sub")


@case("sticky: the directory's owner may unlink and rename anyone's file")
def _(d):
    t = sticky(d)
    as_user(ALICE, os.rename, f"{t}/f", f"{t}/g")
    as_user(ALICE, os.unlink, f"{t}/g")
    as_user(ALICE, os.rmdir, f"{t}/sub")


@case("sticky: anyone with write permission may create in it",
      skip={DIOD: DIOD_USERS})
def _(d):
    t = sticky(d)
    as_user(CAROL, touch, f"{t}/c")
    assert os.stat(f"{t}/c").st_uid == CAROL.uid


@case("sticky: without the sticky bit, another user may unlink anyone's file",
      skip={DIOD: DIOD_USERS})
def _(d):
    t = sticky(d)
    os.chmod(t, 0o777)
    as_user(CAROL, os.unlink, f"{t}/f")


# ---- setgid directories ---------------------------------------------------------------------

def setgid_dir(d):
    mkdir(f"{d}/g", 0o2777)
    os.chown(f"{d}/g", 0, STAFF)
    os.chmod(f"{d}/g", 0o2777)
    return f"{d}/g"


@case("setgid: a new file takes the directory's group, whoever makes it")
def _(d):
    g = setgid_dir(d)
    as_user(ALICE, touch, f"{g}/a")
    s = os.stat(f"{g}/a")
    assert (s.st_uid, s.st_gid) == (ALICE.uid, STAFF)


@case("setgid: a new directory takes the group and the setgid bit")
def _(d):
    g = setgid_dir(d)
    as_user(ALICE, os.mkdir, f"{g}/x", 0o755)
    s = os.stat(f"{g}/x")
    assert s.st_gid == STAFF and mode_of(f"{g}/x") == 0o2755, oct(mode_of(f"{g}/x"))


@case("setgid: a non-member's new file loses a setgid bit with group execute")
def _(d):
    g = setgid_dir(d)
    as_user(ALICE, lambda: os.close(os.open(f"{g}/a", os.O_WRONLY | os.O_CREAT, 0o2755)))
    assert mode_of(f"{g}/a") == 0o755, oct(mode_of(f"{g}/a"))


@case("setgid: a non-member's new file keeps a setgid bit without group execute")
def _(d):
    g = setgid_dir(d)
    as_user(ALICE, lambda: os.close(os.open(f"{g}/a", os.O_WRONLY | os.O_CREAT, 0o2744)))
    assert mode_of(f"{g}/a") == 0o2744, oct(mode_of(f"{g}/a"))


@case("setgid: symlinks and FIFOs take the directory's group too")
def _(d):
    g = setgid_dir(d)
    as_user(ALICE, os.symlink, "t", f"{g}/l")
    as_user(ALICE, os.mkfifo, f"{g}/p")
    assert os.lstat(f"{g}/l").st_gid == STAFF and os.lstat(f"{g}/p").st_gid == STAFF


# ---- rename and link: what permissions they need --------------------------------------------


@case("rename: EACCES without write permission on the source directory")
def _(d):
    mkdir(f"{d}/a", 0o755, ALICE)
    mkdir(f"{d}/b", 0o777)
    touch(f"{d}/a/f")
    os.chown(f"{d}/a/f", ALICE.uid, ALICE.gid)
    os.chmod(f"{d}/a", 0o555)
    user_fails(ALICE, errno.EACCES, os.rename, f"{d}/a/f", f"{d}/b/f")


@case("rename: EACCES without write permission on the target directory")
def _(d):
    mkdir(f"{d}/a", 0o777)
    mkdir(f"{d}/b", 0o555, ALICE)
    as_user(ALICE, touch, f"{d}/a/f")
    user_fails(ALICE, errno.EACCES, os.rename, f"{d}/a/f", f"{d}/b/f")


@case("rename: moving a directory to another parent needs write permission on it")
def _(d):
    mkdir(f"{d}/a", 0o777)
    mkdir(f"{d}/b", 0o777)
    mkdir(f"{d}/a/sub", 0o555, ALICE)
    user_fails(ALICE, errno.EACCES, os.rename, f"{d}/a/sub", f"{d}/b/sub")
    as_user(ALICE, os.rename, f"{d}/a/sub", f"{d}/a/other")


@case("rename: another user's file in a writable, non-sticky directory")
def _(d):
    mkdir(f"{d}/a", 0o777)
    touch(f"{d}/a/f", 0o600)
    as_user(ALICE, os.rename, f"{d}/a/f", f"{d}/a/g")
    assert os.stat(f"{d}/a/g").st_uid == 0


@case("link: a hard link to another user's file needs read and write permission on it "
      "(fs.protected_hardlinks)")
def _(d):
    mkdir(f"{d}/a", 0o777)
    touch(f"{d}/a/ro", 0o644)
    touch(f"{d}/a/rw", 0o666)
    protected = open("/proc/sys/fs/protected_hardlinks").read().strip() == "1"
    if protected:
        user_fails(ALICE, errno.EPERM, os.link, f"{d}/a/ro", f"{d}/a/ro2")
    else:
        as_user(ALICE, os.link, f"{d}/a/ro", f"{d}/a/ro2")
    as_user(ALICE, os.link, f"{d}/a/rw", f"{d}/a/rw2")
    assert os.stat(f"{d}/a/rw").st_nlink == 2


@case("open: O_CREAT of an existing file needs the permission its access mode asks")
def _(d):
    mkdir(f"{d}/a", 0o777)
    touch(f"{d}/a/f", 0o644)
    user_fails(ALICE, errno.EACCES, os.open, f"{d}/a/f", os.O_WRONLY | os.O_CREAT, 0o666)
    as_user(ALICE, lambda: os.close(os.open(f"{d}/a/f", os.O_RDONLY | os.O_CREAT, 0o666)))
