//! Exports: the directories NFS clients may mount, which clients may, whether they may change
//! anything, and as whom their root user acts.
//!
//! Every file handle carries the id of the export it was given under (a hash of the export's
//! path, so it is the same after a restart), under the handle's keyed tag. Each call is judged
//! by that export: a handle given under one export cannot be used to reach another, or by a
//! client the export does not admit, and `..` stops at the export's root. As with any NFS
//! server, a hard link from inside an export to a file outside it reaches that file.

use crate::rpc::Credentials;
use bucketfs_fs::{Caller, Fs, FsError, Inode, ROOT_INO};
use ipnet::IpNet;
use std::net::IpAddr;

/// The user (and group) a squashed root and an AUTH_NONE caller act as.
pub const NOBODY: u32 = 65534;

/// Which clients an export admits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Clients {
    Any,
    Networks(Vec<IpNet>),
}

/// One export, as the configuration describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportRule {
    /// An absolute path in the filesystem.
    pub path: String,
    pub read_only: bool,
    pub clients: Clients,
    /// Root of a client that is not on loopback acts as NOBODY.
    pub root_squash: bool,
}

impl ExportRule {
    /// The whole filesystem, writable, for every client that can connect, root squashed
    /// unless it comes from loopback: what serves when no export is configured.
    pub fn everything() -> ExportRule {
        ExportRule {
            path: "/".into(),
            read_only: false,
            clients: Clients::Any,
            root_squash: true,
        }
    }
}

/// Reads a `clients` entry: "*", an address ("192.0.2.7", "::1") or a network in CIDR
/// notation ("10.0.0.0/8").
pub fn parse_clients(entries: &[String]) -> Result<Clients, String> {
    let mut nets = Vec::new();
    for entry in entries {
        if entry == "*" {
            return Ok(Clients::Any);
        }
        let net = match entry.parse::<IpNet>() {
            Ok(net) => net,
            Err(_) => match entry.parse::<IpAddr>() {
                Ok(addr) => IpNet::from(addr),
                Err(_) => {
                    return Err(format!(
                        "{entry:?} is not \"*\", an IP address or a network such as \
                         \"10.0.0.0/8\""
                    ))
                }
            },
        };
        nets.push(net.trunc());
    }
    Ok(Clients::Networks(nets))
}

/// Checks an export's path: absolute, without empty, `.` or `..` components; returns it
/// without a trailing slash ("/" stays "/").
pub fn normal_path(path: &str) -> Result<String, String> {
    if !path.starts_with('/') {
        return Err(format!("{path:?} is not an absolute path"));
    }
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    if parts.iter().any(|p| *p == "." || *p == "..") {
        return Err(format!("{path:?} has a . or .. component"));
    }
    Ok(format!("/{}", parts.join("/")))
}

/// An export as served: its rule and its id in file handles.
#[derive(Debug)]
pub struct Export {
    pub rule: ExportRule,
    pub id: u32,
}

/// A client's address as one family: an IPv4 client seen through an IPv6 socket is IPv4.
fn canonical(peer: IpAddr) -> IpAddr {
    peer.to_canonical()
}

impl Export {
    /// Whether a client at `peer` may use this export. `None` is a caller inside this
    /// process (the tests), admitted like loopback.
    pub fn admits(&self, peer: Option<IpAddr>) -> bool {
        let Some(peer) = peer.map(canonical) else {
            return true;
        };
        match &self.rule.clients {
            Clients::Any => true,
            Clients::Networks(nets) => nets.iter().any(|n| n.contains(&peer)),
        }
    }

    /// The caller a credential names, after root squashing: AUTH_NONE acts as nobody; root
    /// of a client that is not on loopback acts as nobody when the export squashes root.
    pub fn caller(&self, peer: Option<IpAddr>, cred: &Credentials) -> Caller {
        let Credentials::Sys {
            uid, gid, groups, ..
        } = cred
        else {
            return Caller::user(NOBODY, NOBODY);
        };
        let local = peer.is_none_or(|p| canonical(p).is_loopback());
        if self.rule.root_squash && !local {
            let squash = |id: u32| if id == 0 { NOBODY } else { id };
            return Caller {
                uid: squash(*uid),
                gid: squash(*gid),
                groups: groups.iter().map(|g| squash(*g)).collect(),
            };
        }
        Caller {
            uid: *uid,
            gid: *gid,
            groups: groups.clone(),
        }
    }

    /// The export's directory as it is now, looked up as root.
    pub async fn root(&self, fs: &Fs) -> Result<Inode, FsError> {
        let mut inode = fs.getattr(ROOT_INO).await?;
        for name in self.rule.path.split('/').filter(|n| !n.is_empty()) {
            inode = fs
                .lookup(&Caller::root(), inode.ino, name.as_bytes())
                .await?;
        }
        Ok(inode)
    }
}

/// The exports of one server.
#[derive(Debug)]
pub struct Exports {
    list: Vec<Export>,
}

impl Exports {
    /// The exports of `rules` (none: the whole filesystem, see [`ExportRule::everything`]).
    /// Two exports of one path are refused: a handle could not say which one it came from.
    pub fn new(fs: &Fs, rules: Vec<ExportRule>) -> Result<Exports, String> {
        let rules = if rules.is_empty() {
            vec![ExportRule::everything()]
        } else {
            rules
        };
        let mut list: Vec<Export> = Vec::with_capacity(rules.len());
        for mut rule in rules {
            rule.path = normal_path(&rule.path)?;
            if list.iter().any(|e| e.rule.path == rule.path) {
                return Err(format!("{:?} is exported twice", rule.path));
            }
            let tag = fs
                .engine()
                .handle_tag(format!("export {}", rule.path).as_bytes());
            let id = u32::from_be_bytes(tag[..4].try_into().expect("4 of 16 bytes"));
            if list.iter().any(|e| e.id == id) {
                return Err(format!("{:?}: two exports hash to one id", rule.path));
            }
            list.push(Export { rule, id });
        }
        Ok(Exports { list })
    }

    pub fn iter(&self) -> impl Iterator<Item = &Export> {
        self.list.iter()
    }

    pub fn by_id(&self, id: u32) -> Option<&Export> {
        self.list.iter().find(|e| e.id == id)
    }

    /// The export that holds `path` (the deepest one, when exports nest), if any.
    pub fn holding(&self, path: &[u8]) -> Option<&Export> {
        self.list
            .iter()
            .filter(|e| {
                let p = e.rule.path.trim_end_matches('/').as_bytes();
                path.starts_with(p) && (path.len() == p.len() || path[p.len()] == b'/')
            })
            .max_by_key(|e| e.rule.path.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sys(uid: u32, gid: u32, groups: &[u32]) -> Credentials {
        Credentials::Sys {
            machine: b"m".to_vec(),
            uid,
            gid,
            groups: groups.to_vec(),
        }
    }

    #[tokio::test]
    async fn clients_paths_and_squashing() {
        let fs = crate::memory_fs().await;
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let clients = parse_clients(&strings(&["10.1.2.3/8", "192.0.2.7", "::1"])).unwrap();
        let exports = Exports::new(
            &fs,
            vec![
                ExportRule {
                    path: "/data/".into(),
                    read_only: true,
                    clients,
                    root_squash: true,
                },
                ExportRule {
                    path: "/".into(),
                    ..ExportRule::everything()
                },
            ],
        )
        .unwrap();
        let data = exports.holding(b"/data/x").unwrap();
        assert_eq!(data.rule.path, "/data");
        assert_eq!(exports.holding(b"/database").unwrap().rule.path, "/");
        assert_eq!(exports.by_id(data.id).unwrap().rule.path, "/data");

        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        assert!(data.admits(ip("10.200.0.1")));
        assert!(data.admits(ip("::ffff:192.0.2.7")));
        assert!(data.admits(ip("::1")));
        assert!(!data.admits(ip("192.0.2.8")));
        assert!(!data.admits(ip("127.0.0.1")));

        // Root from afar is nobody, groups included; from loopback it stays root; other users
        // keep their ids; AUTH_NONE is nobody everywhere.
        let far = data.caller(ip("10.0.0.9"), &sys(0, 0, &[0, 5]));
        assert_eq!(
            (far.uid, far.gid, far.groups),
            (NOBODY, NOBODY, vec![NOBODY, 5])
        );
        assert!(data.caller(ip("127.0.0.1"), &sys(0, 0, &[])).is_root());
        assert_eq!(data.caller(ip("10.0.0.9"), &sys(7, 8, &[])).uid, 7);
        assert_eq!(data.caller(None, &Credentials::None).uid, NOBODY);

        for (bad, why) in [
            (vec!["10.0.0.0/33"], "not \"*\""),
            (vec!["host.example"], "not \"*\""),
        ] {
            assert!(parse_clients(&strings(&bad)).unwrap_err().contains(why));
        }
        assert!(normal_path("data").is_err());
        assert!(normal_path("/a/../b").is_err());
        assert_eq!(normal_path("//a//b/").unwrap(), "/a/b");
        let twice = Exports::new(
            &fs,
            vec![ExportRule::everything(), ExportRule::everything()],
        );
        assert!(twice.unwrap_err().contains("twice"));
    }
}
