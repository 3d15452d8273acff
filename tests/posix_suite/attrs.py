"""Attributes: chmod, chown and utimensat, as root, as the owner and as others, with the
setuid and setgid bits they clear and the timestamps they move."""
import errno
import os
import stat

from . import (ALICE, AT_SYMLINK_NOFOLLOW, BOB, GROUPS_9P, NINEP, STAFF, UTIME_NOW,
               UTIME_OMIT, as_user, case, check_times, fails, member, mode_of, tick, touch,
               user_fails, utimensat)

# ---- chmod ----------------------------------------------------------------------------------


@case("chmod: sets the permission bits, keeps the type")
def _(d):
    touch(f"{d}/f")
    os.chmod(f"{d}/f", 0o4751)
    s = os.stat(f"{d}/f")
    assert stat.S_ISREG(s.st_mode) and stat.S_IMODE(s.st_mode) == 0o4751


@case("chmod: of a directory, a FIFO, a device node")
def _(d):
    os.mkdir(f"{d}/x")
    os.mkfifo(f"{d}/p")
    os.mknod(f"{d}/c", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    for name, want in (("x", stat.S_IFDIR), ("p", stat.S_IFIFO), ("c", stat.S_IFCHR)):
        os.chmod(f"{d}/{name}", 0o1703)
        s = os.lstat(f"{d}/{name}")
        assert stat.S_IFMT(s.st_mode) == want and stat.S_IMODE(s.st_mode) == 0o1703, name


@case("chmod: follows a symlink; the link keeps mode 0777")
def _(d):
    touch(f"{d}/f")
    os.symlink("f", f"{d}/l")
    os.chmod(f"{d}/l", 0o600)
    assert mode_of(f"{d}/f") == 0o600 and mode_of(f"{d}/l") == 0o777


@case("chmod: updates ctime only")
def _(d):
    touch(f"{d}/f")
    before = os.stat(f"{d}/f")
    tick()
    os.chmod(f"{d}/f", 0o600)
    check_times(f"{d}/f", before, mtime=False, ctime=True)


@case("chmod: the owner may; another user is EPERM; root may")
def _(d):
    touch(f"{d}/f", 0o666)
    os.chown(f"{d}/f", ALICE.uid, ALICE.gid)
    as_user(ALICE, os.chmod, f"{d}/f", 0o640)
    assert mode_of(f"{d}/f") == 0o640
    user_fails(BOB, errno.EPERM, os.chmod, f"{d}/f", 0o777)
    os.chmod(f"{d}/f", 0o604)
    assert mode_of(f"{d}/f") == 0o604


@case("chmod: EPERM for another user even with write permission on the file")
def _(d):
    touch(f"{d}/f", 0o666)
    user_fails(ALICE, errno.EPERM, os.chmod, f"{d}/f", 0o600)


@case("chmod: a non-root owner sets the sticky bit on a file (Linux has no EFTYPE)")
def _(d):
    touch(f"{d}/f")
    os.chown(f"{d}/f", ALICE.uid, ALICE.gid)
    as_user(ALICE, os.chmod, f"{d}/f", 0o1644)
    assert mode_of(f"{d}/f") == 0o1644


@case("chmod: setgid asked by an owner outside the file's group is cleared")
def _(d):
    touch(f"{d}/f")
    os.chown(f"{d}/f", ALICE.uid, STAFF)
    as_user(ALICE, os.chmod, f"{d}/f", 0o2755)
    assert mode_of(f"{d}/f") == 0o755, oct(mode_of(f"{d}/f"))


@case("chmod: setgid asked by an owner in the file's group (primary) is kept")
def _(d):
    touch(f"{d}/f")
    os.chown(f"{d}/f", ALICE.uid, ALICE.gid)
    as_user(ALICE, os.chmod, f"{d}/f", 0o2755)
    assert mode_of(f"{d}/f") == 0o2755


@case("chmod: setgid asked by an owner in the file's group (supplementary) is kept",
      skip={NINEP: GROUPS_9P})
def _(d):
    touch(f"{d}/f")
    os.chown(f"{d}/f", ALICE.uid, STAFF)
    as_user(member(ALICE, STAFF), os.chmod, f"{d}/f", 0o2755)
    assert mode_of(f"{d}/f") == 0o2755


@case("chmod: setuid asked by the owner is kept")
def _(d):
    touch(f"{d}/f")
    os.chown(f"{d}/f", ALICE.uid, ALICE.gid)
    as_user(ALICE, os.chmod, f"{d}/f", 0o4755)
    assert mode_of(f"{d}/f") == 0o4755


# ---- chown ----------------------------------------------------------------------------------


@case("chown: root gives a file away")
def _(d):
    touch(f"{d}/f")
    os.chown(f"{d}/f", 1000, 1001)
    s = os.stat(f"{d}/f")
    assert (s.st_uid, s.st_gid) == (1000, 1001)


@case("chown: -1 leaves the uid or the gid as it is")
def _(d):
    touch(f"{d}/f")
    os.chown(f"{d}/f", ALICE.uid, STAFF)
    os.chown(f"{d}/f", -1, BOB.gid)
    assert (os.stat(f"{d}/f").st_uid, os.stat(f"{d}/f").st_gid) == (ALICE.uid, BOB.gid)
    os.chown(f"{d}/f", BOB.uid, -1)
    assert (os.stat(f"{d}/f").st_uid, os.stat(f"{d}/f").st_gid) == (BOB.uid, BOB.gid)


@case("chown: follows a symlink; lchown changes the link itself")
def _(d):
    touch(f"{d}/f")
    os.symlink("f", f"{d}/l")
    os.chown(f"{d}/l", ALICE.uid, ALICE.gid)
    assert os.stat(f"{d}/f").st_uid == ALICE.uid and os.lstat(f"{d}/l").st_uid == 0
    os.lchown(f"{d}/l", BOB.uid, BOB.gid)
    assert os.lstat(f"{d}/l").st_uid == BOB.uid and os.stat(f"{d}/f").st_uid == ALICE.uid


@case("chown: updates ctime only")
def _(d):
    touch(f"{d}/f")
    before = os.stat(f"{d}/f")
    tick()
    os.chown(f"{d}/f", ALICE.uid, ALICE.gid)
    check_times(f"{d}/f", before, mtime=False, ctime=True)


@case("chown: the owner may keep their uid and set a group they are in")
def _(d):
    touch(f"{d}/f")
    os.chown(f"{d}/f", ALICE.uid, STAFF)
    as_user(ALICE, os.chown, f"{d}/f", ALICE.uid, ALICE.gid)
    assert os.stat(f"{d}/f").st_gid == ALICE.gid


@case("chown: the owner may set a supplementary group of theirs", skip={NINEP: GROUPS_9P})
def _(d):
    touch(f"{d}/f")
    os.chown(f"{d}/f", ALICE.uid, ALICE.gid)
    as_user(member(ALICE, STAFF), os.chown, f"{d}/f", -1, STAFF)
    assert os.stat(f"{d}/f").st_gid == STAFF


@case("chown: EPERM for the owner setting a group they are not in")
def _(d):
    touch(f"{d}/f")
    os.chown(f"{d}/f", ALICE.uid, ALICE.gid)
    user_fails(ALICE, errno.EPERM, os.chown, f"{d}/f", -1, STAFF)
    assert os.stat(f"{d}/f").st_gid == ALICE.gid


@case("chown: EPERM for the owner giving the file to another uid")
def _(d):
    touch(f"{d}/f")
    os.chown(f"{d}/f", ALICE.uid, ALICE.gid)
    user_fails(ALICE, errno.EPERM, os.chown, f"{d}/f", BOB.uid, -1)
    assert os.stat(f"{d}/f").st_uid == ALICE.uid


@case("chown: EPERM for another user, even to their own group")
def _(d):
    touch(f"{d}/f", 0o666)
    user_fails(ALICE, errno.EPERM, os.chown, f"{d}/f", -1, ALICE.gid)
    user_fails(ALICE, errno.EPERM, os.chown, f"{d}/f", ALICE.uid, -1)


@case("chown: by the owner clears setuid and setgid (with group execute)")
def _(d):
    touch(f"{d}/f", 0o6755)
    os.chown(f"{d}/f", ALICE.uid, ALICE.gid)
    os.chmod(f"{d}/f", 0o6755)
    as_user(ALICE, os.chown, f"{d}/f", -1, ALICE.gid)
    assert mode_of(f"{d}/f") == 0o755, oct(mode_of(f"{d}/f"))


@case("chown: by root clears setuid, and setgid with group execute")
def _(d):
    touch(f"{d}/f", 0o6755)
    os.chown(f"{d}/f", ALICE.uid, ALICE.gid)
    assert mode_of(f"{d}/f") == 0o755, oct(mode_of(f"{d}/f"))


@case("chown: by root keeps setgid without group execute (a mandatory-locking mark)")
def _(d):
    touch(f"{d}/f", 0o2745)
    os.chown(f"{d}/f", ALICE.uid, ALICE.gid)
    assert mode_of(f"{d}/f") == 0o2745, oct(mode_of(f"{d}/f"))


@case("chown: of a directory keeps its setuid and setgid bits")
def _(d):
    os.mkdir(f"{d}/x")
    os.chmod(f"{d}/x", 0o6755)
    os.chown(f"{d}/x", ALICE.uid, ALICE.gid)
    assert mode_of(f"{d}/x") == 0o6755, oct(mode_of(f"{d}/x"))


# ---- utimensat ------------------------------------------------------------------------------


@case("utimensat: explicit times with nanoseconds are kept")
def _(d):
    touch(f"{d}/f")
    os.utime(f"{d}/f", ns=(1_000_000_123, 2_000_000_456))
    s = os.stat(f"{d}/f")
    assert (s.st_atime_ns, s.st_mtime_ns) == (1_000_000_123, 2_000_000_456)


@case("utimensat: times after 2038 are kept")
def _(d):
    touch(f"{d}/f")
    utimensat(f"{d}/f", (4_000_000_000, 5), (4_000_000_001, 7))
    s = os.stat(f"{d}/f")
    assert (s.st_atime_ns, s.st_mtime_ns) == (4 * 10**18 + 5, 4_000_000_001 * 10**9 + 7)


@case("utimensat: times before 1970 are kept")
def _(d):
    touch(f"{d}/f")
    utimensat(f"{d}/f", (-100_000, 5), (-1, 7))
    s = os.stat(f"{d}/f")
    assert (s.st_atime_ns, s.st_mtime_ns) == (-100_000 * 10**9 + 5, -10**9 + 7), \
        (s.st_atime_ns, s.st_mtime_ns)


@case("utimensat: NULL times set both to now and move ctime on")
def _(d):
    touch(f"{d}/f")
    os.utime(f"{d}/f", ns=(1_000_000_000, 1_000_000_000))
    before = os.stat(f"{d}/f")
    tick()
    utimensat(f"{d}/f", None, None)
    s = os.stat(f"{d}/f")
    assert s.st_atime_ns > 10**18 and s.st_mtime_ns > 10**18
    check_times(f"{d}/f", before, mtime=True, ctime=True)


@case("utimensat: UTIME_NOW for one, UTIME_OMIT for the other")
def _(d):
    touch(f"{d}/f")
    os.utime(f"{d}/f", ns=(1_000_000_000, 2_000_000_000))
    utimensat(f"{d}/f", UTIME_NOW, UTIME_OMIT)
    s = os.stat(f"{d}/f")
    assert s.st_atime_ns > 10**18 and s.st_mtime_ns == 2_000_000_000
    os.utime(f"{d}/f", ns=(1_000_000_000, 2_000_000_000))
    utimensat(f"{d}/f", UTIME_OMIT, UTIME_NOW)
    s = os.stat(f"{d}/f")
    assert s.st_atime_ns == 1_000_000_000 and s.st_mtime_ns > 10**18


@case("utimensat: an explicit time for one, UTIME_OMIT for the other")
def _(d):
    touch(f"{d}/f")
    os.utime(f"{d}/f", ns=(1_000_000_000, 2_000_000_000))
    utimensat(f"{d}/f", UTIME_OMIT, (5, 6))
    s = os.stat(f"{d}/f")
    assert (s.st_atime_ns, s.st_mtime_ns) == (1_000_000_000, 5_000_000_006)
    utimensat(f"{d}/f", (7, 8), UTIME_OMIT)
    s = os.stat(f"{d}/f")
    assert (s.st_atime_ns, s.st_mtime_ns) == (7_000_000_008, 5_000_000_006)


@case("utimensat: an explicit time moves ctime on, not to the time set")
def _(d):
    touch(f"{d}/f")
    before = os.stat(f"{d}/f")
    tick()
    os.utime(f"{d}/f", ns=(1_000_000_000, 1_000_000_000))
    s = os.stat(f"{d}/f")
    assert s.st_ctime_ns > before.st_ctime_ns and s.st_mtime_ns == 1_000_000_000


@case("utimensat: EINVAL for a nanosecond count out of range")
def _(d):
    touch(f"{d}/f")
    fails(errno.EINVAL, utimensat, f"{d}/f", (0, 1_000_000_000), (0, 0))
    fails(errno.EINVAL, utimensat, f"{d}/f", (0, 0), (0, -1))


@case("utimensat: AT_SYMLINK_NOFOLLOW sets the symlink's times, not its target's")
def _(d):
    touch(f"{d}/f")
    os.utime(f"{d}/f", ns=(1_000_000_000, 1_000_000_000))
    os.symlink("f", f"{d}/l")
    utimensat(f"{d}/l", (3, 0), (4, 0), AT_SYMLINK_NOFOLLOW)
    assert os.lstat(f"{d}/l").st_mtime_ns == 4_000_000_000
    assert os.stat(f"{d}/f").st_mtime_ns == 1_000_000_000


@case("utimensat: the owner without write permission may set explicit times and now")
def _(d):
    touch(f"{d}/f", 0o444)
    os.chown(f"{d}/f", ALICE.uid, ALICE.gid)
    as_user(ALICE, utimensat, f"{d}/f", (10, 0), (20, 0))
    assert os.stat(f"{d}/f").st_mtime_ns == 20_000_000_000
    as_user(ALICE, utimensat, f"{d}/f", None, None)
    assert os.stat(f"{d}/f").st_mtime_ns > 10**18


@case("utimensat: another user with write permission may set now, not explicit times")
def _(d):
    touch(f"{d}/f", 0o666)
    os.utime(f"{d}/f", ns=(1_000_000_000, 1_000_000_000))
    as_user(ALICE, utimensat, f"{d}/f", None, None)
    assert os.stat(f"{d}/f").st_mtime_ns > 10**18
    as_user(ALICE, utimensat, f"{d}/f", UTIME_NOW, UTIME_NOW)
    user_fails(ALICE, errno.EPERM, utimensat, f"{d}/f", (1, 0), (1, 0))
    user_fails(ALICE, errno.EPERM, utimensat, f"{d}/f", UTIME_NOW, (1, 0))


@case("utimensat: another user without write permission: EACCES for now, EPERM for times")
def _(d):
    touch(f"{d}/f", 0o644)
    user_fails(ALICE, errno.EACCES, utimensat, f"{d}/f", None, None)
    user_fails(ALICE, errno.EPERM, utimensat, f"{d}/f", (1, 0), (1, 0))


@case("utimensat: root sets explicit times on anyone's file")
def _(d):
    touch(f"{d}/f", 0)
    os.chown(f"{d}/f", ALICE.uid, ALICE.gid)
    utimensat(f"{d}/f", (1, 2), (3, 4))
    assert os.stat(f"{d}/f").st_mtime_ns == 3_000_000_004
