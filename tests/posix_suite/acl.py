"""POSIX ACLs: the access ACL of files and directories (named user and group entries, the mask,
the owner entry), how it and the mode keep each other in step, who may set and read one, the
default ACL of a directory and what new files and directories inherit from it, and the raw
system.posix_acl_access value the kernel accepts or refuses. ACLs are set and read with the acl
package's setfacl and getfacl, or as the raw extended attribute where an exact errno matters.
Ids are numeric throughout: the cases' users need not be in /etc/passwd."""
import errno
import os
import struct
import subprocess

from . import (ALICE, BOB, CAROL, DIOD, DIOD_USERS, GROUPS_9P, NINEP, STAFF, as_user, case,
               fails, member, mode_of, outcome, touch, user_fails)

ACCESS = "system.posix_acl_access"
DEFAULT = "system.posix_acl_default"

# The tags of the extended attribute's entries, and the id of those that name no one.
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
NO_ID = 0xFFFFFFFF
VERSION = 2


def encode(entries, version=VERSION):
    """The extended attribute's value: a little-endian u32 version, then (u16 tag, u16 perm,
    u32 id) per entry; an entry given as (tag, perm) names no one."""
    out = struct.pack("<I", version)
    for e in entries:
        tag, perm, uid = e if len(e) == 3 else (*e, NO_ID)
        out += struct.pack("<HHI", tag, perm, uid)
    return out


def decode(value):
    """The entries of an extended attribute's value, as (tag, perm, id)."""
    assert len(value) >= 4 and (len(value) - 4) % 8 == 0, f"{len(value)} bytes"
    (version,) = struct.unpack_from("<I", value)
    assert version == VERSION, f"version {version}"
    return [struct.unpack_from("<HHI", value, off) for off in range(4, len(value), 8)]


def setfacl(*args):
    """Runs setfacl; raises AssertionError with what it printed if it fails."""
    r = subprocess.run(["/usr/bin/setfacl", *args], capture_output=True, text=True)
    assert r.returncode == 0, f"setfacl {' '.join(args)}: {r.stderr.strip()}"


def setfacl_status(*args):
    """setfacl's exit status, for a run that is meant to fail."""
    return subprocess.run(["/usr/bin/setfacl", *args], capture_output=True).returncode


def getfacl(p, default=False):
    """The entries of p's access (or default) ACL as getfacl prints them, numeric, without the
    header and the effective rights: ['user::rw-', 'user:1001:r--', ...]. (With -d alone,
    getfacl prints the default entries without their 'default:' prefix.)"""
    r = subprocess.run(["/usr/bin/getfacl", "-c", "-n", "-p", "-E", "-d" if default else "-a",
                        p], capture_output=True, text=True)
    assert r.returncode == 0, f"getfacl {p}: {r.stderr.strip()}"
    return [line for line in r.stdout.splitlines() if line]


def effective(p):
    """getfacl's '#effective:' notes of p's access ACL: {entry: effective rights}."""
    r = subprocess.run(["/usr/bin/getfacl", "-c", "-n", "-p", "-a", p], capture_output=True,
                       text=True)
    assert r.returncode == 0, f"getfacl {p}: {r.stderr.strip()}"
    notes = {}
    for line in r.stdout.splitlines():
        if "#effective:" in line:
            entry, rights = line.split("#effective:")
            notes[entry.strip()] = rights.strip()
    return notes


def check_acl(p, want, default=False):
    got = getfacl(p, default)
    assert got == want, f"{'default' if default else 'access'} ACL of " \
        f"{os.path.basename(p)}: {got} instead of {want}"


def check_mode(p, want):
    got = mode_of(p)
    assert got == want, f"mode of {os.path.basename(p)}: {got:04o} instead of {want:04o}"


def xattrs(p):
    """The system.posix_acl_* names listxattr shows for p, as a set (their order is the
    filesystem's own)."""
    return {n for n in os.listxattr(p) if n.startswith("system.posix_acl_")}


def opens(p):
    """What opening p for reading and for writing gives."""
    return [outcome(os.open, p, os.O_RDONLY), outcome(os.open, p, os.O_WRONLY)]


def create(p, mode):
    """A regular file made with open(O_CREAT, mode), leaving the mode to umask and ACLs."""
    os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode))


# ---- the access ACL and the mode ------------------------------------------------------------


@case("acl: a named user entry makes the group bits the mask; getfacl reads back what was set")
def _(d):
    f = f"{d}/f"
    touch(f, 0o640)
    setfacl("-m", f"u:{BOB.uid}:rw", f)
    check_mode(f, 0o660)
    want = ["user::rw-", f"user:{BOB.uid}:rw-", "group::r--", "mask::rw-", "other::---"]
    check_acl(f, want)
    entries = decode(os.getxattr(f, ACCESS))
    assert entries == [(USER_OBJ, 6, NO_ID), (USER, 6, BOB.uid), (GROUP_OBJ, 4, NO_ID),
                       (MASK, 6, NO_ID), (OTHER, 0, NO_ID)], entries
    # What getfacl printed, set on another file, gives that file the same ACL and mode.
    touch(f"{d}/g", 0o600)
    setfacl("--set", ",".join(want), f"{d}/g")
    check_acl(f"{d}/g", want)
    check_mode(f"{d}/g", 0o660)


@case("acl: a named user entry grants that user what it says, and no one else",
      skip={DIOD: DIOD_USERS})
def _(d):
    f = f"{d}/f"
    touch(f, 0o600, b"abc")
    setfacl("-m", f"u:{BOB.uid}:r", f)
    check_mode(f, 0o640)
    assert as_user(BOB, opens, f) == ["ok", "EACCES"]
    assert as_user(ALICE, opens, f) == ["EACCES", "EACCES"]


@case("acl: a named user entry decides for its user even where the group or other class would "
      "grant more",
      skip={DIOD: DIOD_USERS})
def _(d):
    f = f"{d}/f"
    touch(f, 0o666)
    os.chown(f, 0, BOB.gid)
    setfacl("-m", f"u:{BOB.uid}:r", f)
    assert as_user(BOB, opens, f) == ["ok", "EACCES"]
    assert as_user(ALICE, opens, f) == ["ok", "ok"]


@case("acl: the mask limits a named user entry",
      skip={DIOD: DIOD_USERS})
def _(d):
    f = f"{d}/f"
    touch(f, 0o600)
    setfacl("-m", f"u:{BOB.uid}:rw", f)
    assert as_user(BOB, opens, f) == ["ok", "ok"]
    setfacl("-m", "m::r", f)
    check_mode(f, 0o640)
    check_acl(f, ["user::rw-", f"user:{BOB.uid}:rw-", "group::---", "mask::r--", "other::---"])
    assert as_user(BOB, opens, f) == ["ok", "EACCES"]


@case("acl: a named group entry grants its members, through supplementary groups too",
      skip={NINEP: GROUPS_9P})
def _(d):
    f = f"{d}/f"
    touch(f, 0o600)
    setfacl("-m", f"g:{STAFF}:rw", f)
    check_mode(f, 0o660)
    assert as_user(member(ALICE, STAFF), opens, f) == ["ok", "ok"]
    assert as_user(ALICE, opens, f) == ["EACCES", "EACCES"]


@case("acl: the owner entry alone decides for the owner: not a named entry for the owner's uid, "
      "not the mask",
      skip={DIOD: DIOD_USERS})
def _(d):
    f = f"{d}/f"
    touch(f, 0o066)
    os.chown(f, ALICE.uid, ALICE.gid)
    setfacl("-m", f"u:{ALICE.uid}:rw", f)
    check_acl(f, ["user::---", f"user:{ALICE.uid}:rw-", "group::rw-", "mask::rw-", "other::rw-"])
    assert as_user(ALICE, opens, f) == ["EACCES", "EACCES"]
    assert as_user(BOB, opens, f) == ["ok", "ok"]
    g = f"{d}/g"
    touch(g, 0o600)
    os.chown(g, ALICE.uid, ALICE.gid)
    setfacl("-m", f"u:{BOB.uid}:rw,m::---", g)
    check_mode(g, 0o600)
    assert as_user(ALICE, opens, g) == ["ok", "ok"]
    assert as_user(BOB, opens, g) == ["EACCES", "EACCES"]


@case("acl: chmod of a file with an extended ACL sets the mask, not the group entry",
      skip={DIOD: DIOD_USERS})
def _(d):
    f = f"{d}/f"
    touch(f, 0o660)
    setfacl("-m", f"u:{BOB.uid}:rw", f)
    os.chmod(f, 0o640)
    check_mode(f, 0o640)
    check_acl(f, ["user::rw-", f"user:{BOB.uid}:rw-", "group::rw-", "mask::r--", "other::---"])
    notes = effective(f)
    assert notes == {f"user:{BOB.uid}:rw-": "r--", "group::rw-": "r--"}, notes
    assert as_user(BOB, opens, f) == ["ok", "EACCES"]


@case("acl: an ACL of the three base entries is the mode and stores no extended attribute; "
      "setfacl -b leaves the owner, group and other entries")
def _(d):
    f = f"{d}/f"
    touch(f, 0o777)
    setfacl("--set", "u::rw,g::r,o::-", f)
    check_mode(f, 0o640)
    check_acl(f, ["user::rw-", "group::r--", "other::---"])
    assert xattrs(f) == set(), xattrs(f)
    # The same through the attribute itself.
    os.setxattr(f, ACCESS, encode([(USER_OBJ, 6), (GROUP_OBJ, 0), (OTHER, 4)]))
    check_mode(f, 0o604)
    assert xattrs(f) == set(), xattrs(f)
    # Removing the extended entries: the group bits are the group entry again, not the mask.
    g = f"{d}/g"
    touch(g, 0o640)
    setfacl("-m", f"u:{BOB.uid}:rwx", g)
    check_mode(g, 0o670)
    setfacl("-b", g)
    check_mode(g, 0o640)
    check_acl(g, ["user::rw-", "group::r--", "other::---"])
    assert xattrs(g) == set(), xattrs(g)


# ---- who may set and read an ACL ------------------------------------------------------------


@case("acl: only the owner or root may set an ACL (EPERM); anyone may read it",
      skip={DIOD: DIOD_USERS})
def _(d):
    f = f"{d}/f"
    touch(f, 0o640)
    os.chown(f, ALICE.uid, ALICE.gid)
    acl = encode([(USER_OBJ, 6), (USER, 4, CAROL.uid), (GROUP_OBJ, 4), (MASK, 4), (OTHER, 0)])
    user_fails(BOB, errno.EPERM, os.setxattr, f, ACCESS, acl)
    assert as_user(BOB, setfacl_status, "-m", f"u:{BOB.uid}:rw", f) != 0
    assert xattrs(f) == set(), xattrs(f)
    as_user(ALICE, os.setxattr, f, ACCESS, acl)
    assert as_user(BOB, os.getxattr, f, ACCESS) == acl
    assert as_user(BOB, xattrs, f) == {ACCESS}
    os.setxattr(f, ACCESS, encode([(USER_OBJ, 6), (GROUP_OBJ, 0), (OTHER, 0)]))
    check_mode(f, 0o600)
    assert as_user(BOB, outcome, os.getxattr, f, ACCESS) == "ENODATA"



@case("acl: malformed system.posix_acl_access values are refused and change nothing")
def _(d):
    f = f"{d}/f"
    touch(f, 0o640)
    base = [(USER_OBJ, 6), (GROUP_OBJ, 4), (OTHER, 0)]
    good = [(USER_OBJ, 6), (USER, 6, BOB.uid), (GROUP_OBJ, 4), (MASK, 6), (OTHER, 0)]
    refused = {
        # A version other than 2 is a format the kernel does not know.
        "version 1": (errno.EOPNOTSUPP, encode(good, version=1)),
        "a named entry without a mask": (errno.EINVAL, encode(
            [(USER_OBJ, 6), (USER, 6, BOB.uid), (GROUP_OBJ, 4), (OTHER, 0)])),
        "no owner entry": (errno.EINVAL, encode(good[1:])),
        "no other entry": (errno.EINVAL, encode(good[:-1])),
        "two masks": (errno.EINVAL, encode(good[:4] + [(MASK, 6)] + good[4:])),
        "entries out of order": (errno.EINVAL, encode(
            [(USER_OBJ, 6), (GROUP_OBJ, 4), (USER, 6, BOB.uid), (MASK, 6), (OTHER, 0)])),
        "an unknown tag": (errno.EINVAL, encode(base[:1] + [(0x40, 6)] + base[1:])),
        "a permission above rwx": (errno.EINVAL, encode([(USER_OBJ, 0o16)] + base[1:])),
        "a named user without an id": (errno.EINVAL, encode(
            [(USER_OBJ, 6), (USER, 6, NO_ID), (GROUP_OBJ, 4), (MASK, 6), (OTHER, 0)])),
        "a length not 4 + 8n": (errno.EINVAL, encode(good) + b"\0\0"),
        "a length below 4": (errno.EINVAL, b"\x02\0"),
    }
    for what, (e, value) in refused.items():
        try:
            fails(e, os.setxattr, f, ACCESS, value)
        except AssertionError as x:
            raise AssertionError(f"{what}: {x}") from None
    check_mode(f, 0o640)
    assert xattrs(f) == set(), xattrs(f)


# ---- default ACLs ---------------------------------------------------------------------------


@case("acl: a directory's default ACL gives a new file its access ACL, umask aside",
      skip={DIOD: DIOD_USERS})
def _(d):
    x = f"{d}/x"
    os.mkdir(x, 0o755)
    setfacl("-d", "--set", f"u::rwx,g::rwx,o::r-x,u:{BOB.uid}:rwx,m::rwx", x)
    assert xattrs(x) == {DEFAULT}, xattrs(x)
    check_mode(x, 0o755)
    # umask 022 would make 0644; with a default ACL the kernel does not apply it.
    create(f"{x}/f", 0o666)
    check_mode(f"{x}/f", 0o664)
    check_acl(f"{x}/f", ["user::rw-", f"user:{BOB.uid}:rwx", "group::rwx", "mask::rw-",
                         "other::r--"])
    assert xattrs(f"{x}/f") == {ACCESS}, xattrs(f"{x}/f")
    # The mode asked for still limits each class: the owner, the mask, other.
    create(f"{x}/g", 0o640)
    check_mode(f"{x}/g", 0o640)
    check_acl(f"{x}/g", ["user::rw-", f"user:{BOB.uid}:rwx", "group::rwx", "mask::r--",
                         "other::---"])
    assert as_user(BOB, opens, f"{x}/f") == ["ok", "ok"]


@case("acl: setfacl -d -m starts the default ACL from the access ACL")
def _(d):
    x = f"{d}/x"
    os.mkdir(x, 0o750)
    setfacl("-d", "-m", f"u:{BOB.uid}:rwx", x)
    check_acl(x, ["user::rwx", "group::r-x", "other::---"])
    check_acl(x, ["user::rwx", f"user:{BOB.uid}:rwx", "group::r-x", "mask::rwx", "other::---"],
              default=True)


@case("acl: a new directory takes both the access ACL and the default ACL of its parent")
def _(d):
    x = f"{d}/x"
    os.mkdir(x, 0o755)
    setfacl("-d", "-m", f"u:{BOB.uid}:rwx", x)
    os.mkdir(f"{x}/sub", 0o777)
    check_mode(f"{x}/sub", 0o775)
    assert xattrs(f"{x}/sub") == {ACCESS, DEFAULT}, xattrs(f"{x}/sub")
    check_acl(f"{x}/sub", ["user::rwx", f"user:{BOB.uid}:rwx", "group::r-x", "mask::rwx",
                           "other::r-x"])
    check_acl(f"{x}/sub", getfacl(x, default=True), default=True)
    # And so on down.
    create(f"{x}/sub/f", 0o666)
    check_mode(f"{x}/sub/f", 0o664)


@case("acl: a default ACL of base entries only gives no access ACL, and still no umask")
def _(d):
    x = f"{d}/x"
    os.mkdir(x, 0o755)
    setfacl("-d", "--set", "u::rwx,g::rwx,o::rwx", x)
    create(f"{x}/f", 0o666)
    check_mode(f"{x}/f", 0o666)
    assert xattrs(f"{x}/f") == set(), xattrs(f"{x}/f")


@case("acl: a regular file has no default ACL (EACCES to set one); setfacl -k removes a "
      "directory's")
def _(d):
    f = f"{d}/f"
    touch(f, 0o644)
    acl = encode([(USER_OBJ, 7), (GROUP_OBJ, 5), (OTHER, 5)])
    fails(errno.EACCES, os.setxattr, f, DEFAULT, acl)
    assert setfacl_status("-d", "-m", f"u:{BOB.uid}:rwx", f) != 0
    fails(errno.ENODATA, os.getxattr, f, DEFAULT)
    assert xattrs(f) == set(), xattrs(f)
    x = f"{d}/x"
    os.mkdir(x, 0o755)
    os.setxattr(x, DEFAULT, acl)
    assert decode(os.getxattr(x, DEFAULT)) == decode(acl)
    setfacl("-k", x)
    assert xattrs(x) == set(), xattrs(x)
    assert getfacl(x, default=True) == []
    fails(errno.ENODATA, os.getxattr, x, DEFAULT)
    create(f"{x}/f", 0o666)
    check_mode(f"{x}/f", 0o644)


# ---- the attribute itself -------------------------------------------------------------------


@case("acl: listxattr shows system.posix_acl_access only while the ACL is extended")
def _(d):
    f = f"{d}/f"
    touch(f, 0o644)
    assert xattrs(f) == set(), xattrs(f)
    fails(errno.ENODATA, os.getxattr, f, ACCESS)
    setfacl("-m", f"u:{BOB.uid}:r", f)
    assert xattrs(f) == {ACCESS}, xattrs(f)
    s = os.stat(f)
    assert s.st_size == 0 and s.st_mode & 0o777 == 0o644
    setfacl("-x", f"u:{BOB.uid}", f)
    # The mask stays behind, so the ACL is still an extended one; -b is what ends it.
    assert xattrs(f) == {ACCESS}, xattrs(f)
    check_acl(f, ["user::rw-", "group::r--", "mask::r--", "other::r--"])
    setfacl("-b", f)
    assert xattrs(f) == set(), xattrs(f)
    check_mode(f, 0o644)


@case("acl: removexattr of system.posix_acl_access drops the ACL and keeps the mode; it "
      "succeeds on a file without one too",
      skip={DIOD: DIOD_USERS})
def _(d):
    f = f"{d}/f"
    touch(f, 0o640)
    setfacl("-m", f"u:{BOB.uid}:rw", f)
    check_mode(f, 0o660)
    os.removexattr(f, ACCESS)
    assert xattrs(f) == set(), xattrs(f)
    # Unlike setfacl -b, the group bits stay what the mask was.
    check_mode(f, 0o660)
    check_acl(f, ["user::rw-", "group::rw-", "other::---"])
    assert as_user(BOB, opens, f) == ["EACCES", "EACCES"]
    touch(f"{d}/g", 0o640)
    os.removexattr(f"{d}/g", ACCESS)
    check_mode(f"{d}/g", 0o640)
    fails(errno.ENODATA, os.getxattr, f"{d}/g", ACCESS)


# ---- directories ----------------------------------------------------------------------------


@case("acl: a named user entry on a directory: r lists it, x searches it",
      skip={DIOD: DIOD_USERS})
def _(d):
    x = f"{d}/x"
    os.mkdir(x, 0o700)
    touch(f"{x}/f", 0o644)
    setfacl("-m", f"u:{BOB.uid}:rx", x)
    check_mode(x, 0o750)

    def steps():
        return [outcome(os.listdir, x), outcome(os.stat, f"{x}/f"),
                outcome(os.open, f"{x}/new", os.O_WRONLY | os.O_CREAT, 0o644)]
    assert as_user(BOB, steps) == ["ok", "ok", "EACCES"]
    assert as_user(ALICE, steps) == ["EACCES", "EACCES", "EACCES"]
    setfacl("-m", f"u:{BOB.uid}:r", x)
    assert as_user(BOB, steps) == ["ok", "EACCES", "EACCES"]
    setfacl("-m", f"u:{BOB.uid}:wx", x)
    assert as_user(BOB, steps) == ["EACCES", "ok", "ok"]
    assert os.stat(f"{x}/new").st_uid == BOB.uid
