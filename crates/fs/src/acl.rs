//! POSIX access control lists (the withdrawn POSIX.1e draft as Linux implements it): the
//! `system.posix_acl_access` and `system.posix_acl_default` attributes, kept in the inode's
//! record (inode.rs) so that a permission check never needs a second lookup.
//!
//! An ACL travels in Linux's xattr form: a little-endian u32 version (2), then entries of a u16
//! tag, a u16 permission set (rwx) and a u32 id. The mode's permission bits and the ACL
//! describe one thing: the owner's bits are the USER_OBJ entry, the group's are the MASK entry
//! (or GROUP_OBJ without a mask), the other's are OTHER. A change to either updates the other.

use crate::perm::Caller;
use crate::FsError;

pub const XATTR_ACCESS: &[u8] = b"system.posix_acl_access";
pub const XATTR_DEFAULT: &[u8] = b"system.posix_acl_default";

const VERSION: u32 = 2;
const ENTRY_BYTES: usize = 8;
/// The most entries an ACL may hold: ext4's limit for a 4 KiB block is about 500; more than
/// anyone manages by hand, and it keeps an inode record small.
pub const ENTRIES_MAX: usize = 1024;
/// The id field of entries that name no user or group.
const UNDEFINED_ID: u32 = u32::MAX;

/// Entry tags, ordered as an ACL lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tag {
    UserObj,
    User,
    GroupObj,
    Group,
    Mask,
    Other,
}

impl Tag {
    fn from_wire(t: u16) -> Option<Tag> {
        Some(match t {
            0x01 => Tag::UserObj,
            0x02 => Tag::User,
            0x04 => Tag::GroupObj,
            0x08 => Tag::Group,
            0x10 => Tag::Mask,
            0x20 => Tag::Other,
            _ => return None,
        })
    }

    fn wire(self) -> u16 {
        match self {
            Tag::UserObj => 0x01,
            Tag::User => 0x02,
            Tag::GroupObj => 0x04,
            Tag::Group => 0x08,
            Tag::Mask => 0x10,
            Tag::Other => 0x20,
        }
    }

    fn named(self) -> bool {
        matches!(self, Tag::User | Tag::Group)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub tag: Tag,
    /// rwx as 4, 2, 1.
    pub perm: u32,
    /// The user or group of a named entry; 0 for the others.
    pub id: u32,
}

/// A valid ACL: exactly one USER_OBJ, GROUP_OBJ and OTHER, a MASK if (and only if it wants)
/// named entries, no id named twice, sorted by tag and id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

impl Acl {
    /// Parses and checks an ACL in xattr form, as Linux does: a malformed one is EINVAL, one
    /// of another version EOPNOTSUPP. An empty value, or a header without entries, is no ACL
    /// (`None`): setting it removes the ACL.
    pub fn from_xattr(v: &[u8]) -> Result<Option<Acl>, FsError> {
        let bad = |why: &str| FsError::Invalid(format!("a POSIX ACL {why}"));
        if v.is_empty() {
            return Ok(None);
        }
        if v.len() < 4 || !(v.len() - 4).is_multiple_of(ENTRY_BYTES) {
            return Err(bad("is 4 bytes and 8 per entry"));
        }
        let version = u32::from_le_bytes(v[..4].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(FsError::NotSupported(format!(
                "POSIX ACLs of version {version} (2 is known)"
            )));
        }
        if v.len() == 4 {
            return Ok(None);
        }
        let count = (v.len() - 4) / ENTRY_BYTES;
        if count > ENTRIES_MAX {
            return Err(FsError::Invalid(format!(
                "a POSIX ACL holds at most {ENTRIES_MAX} entries, not {count}"
            )));
        }
        let mut entries = Vec::with_capacity(count);
        for e in v[4..].chunks_exact(ENTRY_BYTES) {
            let tag = u16::from_le_bytes([e[0], e[1]]);
            let tag = Tag::from_wire(tag).ok_or_else(|| bad(&format!("has no tag {tag:#x}")))?;
            let perm = u32::from(u16::from_le_bytes([e[2], e[3]]));
            if perm > 7 {
                return Err(bad("grants only r, w and x"));
            }
            let id = u32::from_le_bytes(e[4..8].try_into().expect("4 bytes"));
            if tag.named() && id == UNDEFINED_ID {
                return Err(bad(&format!("names no user or group as {id:#x}")));
            }
            let id = if tag.named() { id } else { 0 };
            entries.push(Entry { tag, perm, id });
        }
        Acl::new(entries).map(Some)
    }

    fn new(mut entries: Vec<Entry>) -> Result<Acl, FsError> {
        let bad = |why: &str| Err(FsError::Invalid(format!("a POSIX ACL {why}")));
        if entries.windows(2).any(|w| w[0].tag > w[1].tag) {
            return bad("lists owner, users, group, groups, mask and other in that order");
        }
        // Ids within a tag may come in any order (libacl sends them sorted).
        entries.sort_by_key(|e| (e.tag, e.id));
        let count = |t: Tag| entries.iter().filter(|e| e.tag == t).count();
        if count(Tag::UserObj) != 1 || count(Tag::GroupObj) != 1 || count(Tag::Other) != 1 {
            return bad("has one entry each for the owner, the group and others");
        }
        let named = count(Tag::User) + count(Tag::Group);
        match count(Tag::Mask) {
            0 if named > 0 => return bad("with named users or groups has a mask"),
            0 | 1 => {}
            _ => return bad("has at most one mask"),
        }
        if entries
            .windows(2)
            .any(|w| w[0].tag.named() && w[0].tag == w[1].tag && w[0].id == w[1].id)
        {
            return bad("names each user and group once");
        }
        Ok(Acl { entries })
    }

    /// The ACL of the permission bits `mode` alone (no named entries, no mask).
    pub fn of_mode(mode: u32) -> Acl {
        let e = |tag, shift: u32| Entry {
            tag,
            perm: (mode >> shift) & 7,
            id: 0,
        };
        Acl {
            entries: vec![e(Tag::UserObj, 6), e(Tag::GroupObj, 3), e(Tag::Other, 0)],
        }
    }

    pub fn to_xattr(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(4 + self.entries.len() * ENTRY_BYTES);
        v.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.entries {
            v.extend_from_slice(&e.tag.wire().to_le_bytes());
            v.extend_from_slice(&(e.perm as u16).to_le_bytes());
            let id = if e.tag.named() { e.id } else { UNDEFINED_ID };
            v.extend_from_slice(&id.to_le_bytes());
        }
        v
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Only the three entries the mode bits hold: such an access ACL is not kept, the mode
    /// says it all.
    pub fn is_minimal(&self) -> bool {
        self.entries.len() == 3
    }

    fn find(&self, tag: Tag) -> Option<usize> {
        self.entries.iter().position(|e| e.tag == tag)
    }

    /// The entry the mode's group bits stand for: the mask, or the owning group without one.
    fn group_class(&self) -> usize {
        self.find(Tag::Mask)
            .or_else(|| self.find(Tag::GroupObj))
            .expect("a valid ACL has a group entry")
    }

    fn perm_of(&self, tag: Tag) -> u32 {
        self.find(tag).map_or(0, |i| self.entries[i].perm)
    }

    /// The permission bits (0o777) this ACL shows in the mode.
    pub fn mode_bits(&self) -> u32 {
        self.perm_of(Tag::UserObj) << 6
            | self.entries[self.group_class()].perm << 3
            | self.perm_of(Tag::Other)
    }

    /// What chmod does to an access ACL: the owner, group-class and other entries take the
    /// new bits; named entries stay (the mask limits them).
    pub fn set_mode_bits(&mut self, mode: u32) {
        let at = |acl: &Acl, tag| acl.find(tag).expect("a valid ACL has it");
        let owner = at(self, Tag::UserObj);
        self.entries[owner].perm = (mode >> 6) & 7;
        let group = self.group_class();
        self.entries[group].perm = (mode >> 3) & 7;
        let other = at(self, Tag::Other);
        self.entries[other].perm = mode & 7;
    }

    /// The access ACL of a new inode created with `mode` in a directory whose default ACL
    /// this is: this ACL with the owner, group-class and other entries limited by the mode's
    /// bits; and the mode, its permission bits limited by the ACL. No umask applies.
    pub fn for_new_inode(&self, mode: u32) -> (Acl, u32) {
        let mut acl = self.clone();
        let owner = acl.find(Tag::UserObj).expect("valid");
        acl.entries[owner].perm &= (mode >> 6) & 7;
        let group = acl.group_class();
        acl.entries[group].perm &= (mode >> 3) & 7;
        let other = acl.find(Tag::Other).expect("valid");
        acl.entries[other].perm &= mode & 7;
        let mode = (mode & !0o777) | acl.mode_bits();
        (acl, mode)
    }

    /// Whether the ACL grants `caller` (not root) every bit of `want` on an inode owned by
    /// `uid` and `gid`: the owner entry for the owner; else a named user entry, limited by the
    /// mask; else, if any group entry matches, whether one of them grants it all (limited by
    /// the mask); else the other entry.
    pub fn permits(&self, caller: &Caller, uid: u32, gid: u32, want: u32) -> bool {
        let grants = |perm: u32| perm & want == want;
        let mask = self.find(Tag::Mask).map_or(7, |i| self.entries[i].perm);
        if caller.uid == uid {
            return grants(self.perm_of(Tag::UserObj));
        }
        let e = &self.entries;
        if let Some(u) = e.iter().find(|e| e.tag == Tag::User && e.id == caller.uid) {
            return grants(u.perm & mask);
        }
        let groups = e.iter().filter(|e| match e.tag {
            Tag::GroupObj => caller.in_group(gid),
            Tag::Group => caller.in_group(e.id),
            _ => false,
        });
        let mut matched = false;
        for g in groups {
            matched = true;
            if grants(g.perm) {
                return grants(g.perm & mask);
            }
        }
        !matched && grants(self.perm_of(Tag::Other))
    }
}

/// An ACL's xattr form from (tag, permissions, id) triples, as given: the tests' way to write
/// one, malformed ones included.
#[cfg(test)]
pub(crate) fn xattr_of(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = VERSION.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::xattr_of as acl;
    use super::*;

    const U: u32 = u32::MAX;

    #[test]
    fn valid_acls_round_trip_sorted_and_bad_ones_are_refused() {
        let v = acl(&[
            (0x01, 6, U),
            (0x02, 4, 1001),
            (0x04, 4, U),
            (0x10, 6, U),
            (0x20, 0, U),
        ]);
        let a = Acl::from_xattr(&v).unwrap().unwrap();
        assert_eq!(a.to_xattr(), v);
        assert_eq!(a.mode_bits(), 0o660);
        assert!(!a.is_minimal());
        // Ids within a tag may come in any order; tags may not.
        let two = acl(&[
            (0x01, 6, U),
            (0x02, 4, 1002),
            (0x02, 4, 1001),
            (0x04, 4, U),
            (0x10, 6, U),
            (0x20, 0, U),
        ]);
        let sorted = Acl::from_xattr(&two).unwrap().unwrap();
        assert_eq!(sorted.entries()[1].id, 1001);
        assert_eq!(Acl::from_xattr(&[]).unwrap(), None, "no value: no ACL");
        assert_eq!(
            Acl::from_xattr(&v[..4]).unwrap(),
            None,
            "no entries: no ACL"
        );
        let mut v3 = v.clone();
        v3[0] = 3;
        assert!(matches!(
            Acl::from_xattr(&v3),
            Err(FsError::NotSupported(_))
        ));
        for bad in [
            v[..3].to_vec(),
            v[..v.len() - 1].to_vec(),
            acl(&[(0x20, 0, U), (0x01, 6, U), (0x04, 4, U)]),
            acl(&[
                (0x01, 6, U),
                (0x02, 4, U),
                (0x04, 4, U),
                (0x10, 6, U),
                (0x20, 0, U),
            ]),
            acl(&[(0x01, 6, U), (0x02, 4, 1001), (0x04, 4, U), (0x20, 0, U)]),
            acl(&[(0x01, 6, U), (0x04, 4, U)]),
            acl(&[(0x01, 6, U), (0x01, 6, U), (0x04, 4, U), (0x20, 0, U)]),
            acl(&[
                (0x01, 6, U),
                (0x02, 4, 7),
                (0x02, 6, 7),
                (0x04, 4, U),
                (0x10, 6, U),
                (0x20, 0, U),
            ]),
            acl(&[(0x01, 8, U), (0x04, 4, U), (0x20, 0, U)]),
            acl(&[(0x01, 6, U), (0x40, 4, U), (0x04, 4, U), (0x20, 0, U)]),
        ] {
            assert!(
                matches!(Acl::from_xattr(&bad), Err(FsError::Invalid(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_permission_algorithm_matches_posix_1e() {
        // Owner 1000, group 50; bob (1001) named rw, group 60 named rwx, mask r-x, others ---.
        let a = Acl::from_xattr(&acl(&[
            (0x01, 7, U),
            (0x02, 6, 1001),
            (0x04, 0, U),
            (0x08, 7, 60),
            (0x10, 5, U),
            (0x20, 0, U),
        ]))
        .unwrap()
        .unwrap();
        let may = |c: &Caller, want| a.permits(c, 1000, 50, want);
        assert!(may(&Caller::user(1000, 1), 7), "the owner, unmasked");
        let bob = Caller::user(1001, 1);
        assert!(may(&bob, 4));
        assert!(!may(&bob, 2), "bob's w is masked");
        let mut in_60 = Caller::user(2000, 2000);
        in_60.groups.push(60);
        assert!(may(&in_60, 5) && !may(&in_60, 2));
        let in_50 = Caller::user(2001, 50);
        assert!(
            !may(&in_50, 4),
            "a matching group entry that grants nothing denies"
        );
        assert!(!may(&Caller::user(3000, 3000), 4), "others get nothing");
        let mut both = Caller::user(2002, 50);
        both.groups.push(60);
        assert!(may(&both, 4), "any matching group entry that grants it");
    }

    #[test]
    fn chmod_and_creation_keep_mode_and_acl_in_step() {
        let mut a = Acl::from_xattr(&acl(&[
            (0x01, 7, U),
            (0x02, 7, 1001),
            (0x04, 5, U),
            (0x10, 7, U),
            (0x20, 5, U),
        ]))
        .unwrap()
        .unwrap();
        a.set_mode_bits(0o640);
        assert_eq!(a.mode_bits(), 0o640);
        assert_eq!(
            a.perm_of(Tag::GroupObj),
            5,
            "chmod moves the mask, not the group"
        );
        let (new, mode) = a.for_new_inode(0o100_666);
        assert_eq!(mode, 0o100_640);
        assert_eq!(new.perm_of(Tag::User), 7, "named entries are kept, masked");
        let minimal = Acl::of_mode(0o751);
        assert!(minimal.is_minimal());
        assert_eq!(minimal.mode_bits(), 0o751);
        assert_eq!(Acl::from_xattr(&minimal.to_xattr()).unwrap(), Some(minimal));
    }
}
