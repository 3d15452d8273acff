//! Transactions: key-value changes, writes and range deletions applied together, under
//! conditions on keys, or not at all.
//!
//! A transaction is applied to the pending batch under the state lock in one step, so it is in
//! exactly one log object: after a crash it is there whole or not at all. Its conditions are
//! checked under the same lock against everything acknowledged before it (durable or not), so
//! two transactions that expect the same key to be absent cannot both succeed.

use super::*;

/// What a transaction expects of a key when it commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    Absent,
    Present,
    /// The key holds exactly this value (a version number kept in the value is one use).
    Value(Vec<u8>),
}

impl Expect {
    fn holds(&self, found: Option<&[u8]>) -> bool {
        match (self, found) {
            (Expect::Absent, None) => true,
            (Expect::Present, Some(_)) => true,
            (Expect::Value(want), Some(v)) => want.as_slice() == v,
            _ => false,
        }
    }
}

#[derive(Debug, Clone)]
enum Change {
    Kv(KvChange),
    Write {
        ino: u64,
        offset: u64,
        data: Vec<u8>,
    },
    Zero {
        ino: u64,
        offset: u64,
        length: u64,
        punch: bool,
    },
    DropExtents {
        ino: u64,
        from: u64,
        to: u64,
    },
}

/// One atomic change, built with the methods below and applied by [`Engine::commit`]. Changes
/// apply in the order they were added: a write after a range deletion in the same transaction
/// survives it.
#[derive(Debug, Clone, Default)]
pub struct Txn {
    expects: Vec<(Vec<u8>, Expect)>,
    changes: Vec<Change>,
    /// The scopes (inodes) this transaction changes together: a scoped barrier on any of them
    /// must cover the whole log until the transaction is in the bucket (engine/scoped.rs).
    shared: Vec<u64>,
}

impl Txn {
    pub fn new() -> Txn {
        Txn::default()
    }

    /// The transaction commits only if `key` is as expected when it does.
    pub fn expect(&mut self, key: Vec<u8>, expect: Expect) -> &mut Txn {
        self.expects.push((key, expect));
        self
    }

    pub fn put(&mut self, key: Vec<u8>, value: Vec<u8>) -> &mut Txn {
        self.changes.push(Change::Kv(KvChange::Put(key, value)));
        self
    }

    pub fn delete(&mut self, key: Vec<u8>) -> &mut Txn {
        self.changes.push(Change::Kv(KvChange::Delete(key)));
        self
    }

    /// Deletes every pair with a key in `start..end`, in one op whatever their number.
    pub fn delete_range(&mut self, start: Vec<u8>, end: Vec<u8>) -> &mut Txn {
        self.changes
            .push(Change::Kv(KvChange::DeleteRange(start, end)));
        self
    }

    pub fn write(&mut self, ino: u64, offset: u64, data: Vec<u8>) -> &mut Txn {
        self.changes.push(Change::Write { ino, offset, data });
        self
    }

    /// Zeroes `length` bytes at `offset`; whole extents are deallocated when `punch` is true.
    pub fn zero(&mut self, ino: u64, offset: u64, length: u64, punch: bool) -> &mut Txn {
        self.changes.push(Change::Zero {
            ino,
            offset,
            length,
            punch,
        });
        self
    }

    /// Deallocates the extents of `ino` with an index in `from..to` (`to` = u64::MAX: all from
    /// `from` on), in one op whatever their number.
    pub fn drop_extents(&mut self, ino: u64, from: u64, to: u64) -> &mut Txn {
        self.changes.push(Change::DropExtents { ino, from, to });
        self
    }

    /// Marks the transaction as one that changes several scopes (inodes), or one scope and
    /// keys outside every scope, together: `Engine::scoped_flush` of any of `scopes` then waits
    /// for the whole log until it is in the bucket, so a crash keeps the change whole.
    pub fn shared_by(&mut self, scopes: impl IntoIterator<Item = u64>) -> &mut Txn {
        self.shared.extend(scopes);
        self
    }

    fn fills(&self) -> impl Iterator<Item = (u64, u64, u64, Fill<'_>)> + '_ {
        self.changes.iter().filter_map(|c| match c {
            Change::Write { ino, offset, data } if !data.is_empty() => {
                Some((*ino, *offset, data.len() as u64, Fill::Data(data)))
            }
            Change::Zero {
                ino,
                offset,
                length,
                punch,
            } if *length > 0 => Some((*ino, *offset, *length, Fill::Zeroes { punch: *punch })),
            _ => None,
        })
    }
}

/// A value read from a committed base, and that base.
type BaseValue = (Arc<Base>, Option<Vec<u8>>);

impl Engine {
    /// Applies the transaction atomically if its conditions hold, else changes nothing and
    /// answers [`EngineError::Conflict`] naming the first key that did not match. Durable at the
    /// next barrier, like any write.
    pub async fn commit(&self, txn: &Txn) -> Result<(), EngineError> {
        self.check_writable()?;
        let writes_data = txn.fills().next().is_some();
        if writes_data {
            self.make_room().await?;
        }
        let mut copies: Vec<std::vec::IntoIter<Arc<Vec<u8>>>> = txn
            .fills()
            .map(|(_, offset, length, fill)| {
                self.copy_whole_extents(offset, length, fill).into_iter()
            })
            .collect();
        // Values of condition keys read from the committed base, valid while it is the base
        // (a checkpoint replaces it with one that reads the same).
        let mut from_base: HashMap<Vec<u8>, BaseValue> = HashMap::new();
        loop {
            let (missing, commit_gen, base, unread) = {
                let mut st = self.inner.state.write();
                let base = st.committed.base().clone();
                let mut unread = Vec::new();
                for (key, expect) in &txn.expects {
                    let value = match st.kv_get(key) {
                        Here::Is(v) => v,
                        Here::NotHere => match from_base.get(key) {
                            Some((b, v)) if Arc::ptr_eq(b, &base) => v.clone(),
                            _ => {
                                unread.push(key.clone());
                                continue;
                            }
                        },
                    };
                    if !expect.holds(value.as_deref()) {
                        return Err(EngineError::Conflict {
                            key: key.escape_ascii().to_string(),
                            expected: format!("{expect:?}"),
                        });
                    }
                }
                let mut missing = Vec::new();
                if unread.is_empty() {
                    for (ino, offset, length, _) in txn.fills() {
                        io::stored_bases(&mut st, ino, offset, length, &mut missing);
                    }
                    if missing.is_empty() {
                        self.apply_txn(&mut st, txn, &mut copies);
                        st.write_gen += 1;
                        self.note_shared(&mut st, &txn.shared);
                        let pending_bytes = st.pending.data_bytes();
                        drop(st);
                        if writes_data {
                            self.write_behind(pending_bytes);
                        }
                        return Ok(());
                    }
                }
                (missing, st.commit_gen, base, unread)
            };
            for key in unread {
                match base.kv_get(&key).await {
                    Ok(v) => {
                        from_base.insert(key, (base.clone(), v));
                    }
                    // The base was replaced and its runs collected meanwhile: look again.
                    Err(crate::lsm::RunError::Store(StoreError::NotFound(_))) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            if !missing.is_empty() {
                self.fetch_bases(&missing, commit_gen, &base).await?;
            }
        }
    }

    fn apply_txn(
        &self,
        st: &mut State,
        txn: &Txn,
        copies: &mut [std::vec::IntoIter<Arc<Vec<u8>>>],
    ) {
        let mut copies = copies.iter_mut();
        for change in &txn.changes {
            match change {
                Change::Kv(c) => io::apply_kv(st, c.clone()),
                Change::DropExtents { ino, from, to } => st.cut_extents(*ino, *from, *to),
                Change::Write { data, .. } if data.is_empty() => {}
                Change::Zero { length: 0, .. } => {}
                Change::Write { ino, offset, data } => {
                    let whole = copies.next().expect("one list of copies per fill");
                    let length = data.len() as u64;
                    self.apply_write(st, *ino, *offset, length, Fill::Data(data), whole);
                }
                Change::Zero {
                    ino,
                    offset,
                    length,
                    punch,
                } => {
                    let whole = copies.next().expect("one list of copies per fill");
                    let fill = Fill::Zeroes { punch: *punch };
                    self.apply_write(st, *ino, *offset, *length, fill, whole);
                }
            }
        }
    }
}
