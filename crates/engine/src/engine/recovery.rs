//! Opening a bucket: unlocking the data key, taking the writer lock, and rebuilding the
//! committed state from the last checkpoint and the log objects after it.

use super::*;

/// Opens the superblock and returns the unlocked sealer and the bucket's format version;
/// creates the superblock (at that key-derivation cost) if there is none and `create` says so.
pub(super) async fn unlock(
    bucket: &SharedBucket,
    password: &str,
    create: Option<KdfCost>,
) -> Result<(Sealer, u32), EngineError> {
    match bucket.get(SUPERBLOCK_KEY).await {
        Ok(bytes) => {
            let sb = Superblock::from_json(&bytes)?;
            Ok((
                Sealer::new(&sb.unlock(password)?, sb.cipher()),
                sb.format_version(),
            ))
        }
        Err(StoreError::NotFound(_)) if create.is_some() => {
            let kdf_cost = create.expect("checked by the guard");
            let (sb, key) = Superblock::create(password, kdf_cost, Cipher::for_new_buckets())?;
            match bucket
                .put(SUPERBLOCK_KEY, Bytes::from(sb.to_json()), PutMode::Create)
                .await
            {
                Ok(()) => {
                    tracing::info!(cipher = ?sb.cipher(), "created a new bucketfs bucket");
                    Ok((Sealer::new(&key, sb.cipher()), sb.format_version()))
                }
                // Another process created it first: use theirs.
                Err(StoreError::AlreadyExists(_)) => {
                    Box::pin(unlock(bucket, password, None)).await
                }
                // Creating an object can only find nothing when the bucket itself is missing.
                Err(StoreError::NotFound(_)) => Err(EngineError::Store(StoreError::Permanent(
                    "the bucket does not exist; create it first (or check the bucket name in storage.url)".into(),
                ))),
                Err(e) => Err(e.into()),
            }
        }
        Err(StoreError::NotFound(_)) => Err(EngineError::NotInitialised),
        Err(e) => Err(e.into()),
    }
}

async fn rewrite_superblock(bucket: &SharedBucket, sb: &Superblock) -> Result<(), EngineError> {
    let json = Bytes::from(sb.to_json());
    bucket.put(SUPERBLOCK_KEY, json, PutMode::Overwrite).await?;
    Ok(())
}

/// Records in the superblock that the bucket is of this build's format.
pub(super) async fn migrate_superblock(bucket: &SharedBucket) -> Result<(), EngineError> {
    let bytes = bucket.get(SUPERBLOCK_KEY).await?;
    let sb = Superblock::from_json(&bytes)?.migrated(crate::crypto::FORMAT_VERSION);
    rewrite_superblock(bucket, &sb).await?;
    tracing::info!(
        format = crate::crypto::FORMAT_VERSION,
        "bucket migrated to this build's format"
    );
    Ok(())
}

/// Rewraps the data key under a new password; data is not touched.
pub async fn change_password(
    bucket: &SharedBucket,
    old: &str,
    new: &str,
) -> Result<(), EngineError> {
    let bytes = match bucket.get(SUPERBLOCK_KEY).await {
        Err(StoreError::NotFound(_)) => return Err(EngineError::NotInitialised),
        other => other?,
    };
    let sb = Superblock::from_json(&bytes)?.rewrap(old, new)?;
    rewrite_superblock(bucket, &sb).await?;
    Ok(())
}

impl Engine {
    pub async fn open(bucket: SharedBucket, opts: EngineOptions) -> Result<Engine, EngineError> {
        // Background work runs here, whichever runtime later calls into the engine.
        opts.tasks.settle();
        // Check the password before anything is written: a wrong password changes nothing.
        let create = (!opts.read_only).then_some(opts.kdf_cost);
        let (sealer, format_version) = unlock(&bucket, &opts.password, create).await?;
        let lock_holder = if opts.read_only {
            None
        } else {
            Some(Arc::new(lease::acquire(&bucket).await?))
        };
        let sealer = Arc::new(sealer);
        if !opts.read_only {
            crate::bulk::configure(opts.tuning.bulk_idle_priority != 0);
        }
        let opened = async {
            if lock_holder.is_some() {
                bucket.begin_writing().await?;
                if (2..crate::crypto::FORMAT_VERSION).contains(&format_version) {
                    migrate_superblock(&bucket).await?;
                }
            }
            let mut attempt = 1;
            loop {
                let loaded = Self::load(
                    bucket.clone(),
                    sealer.clone(),
                    &opts,
                    lock_holder.clone(),
                    format_version,
                )
                .await;
                match loaded {
                    // A reader beside a running writer lists the bucket while the writer
                    // changes it (a checkpoint replaced, log objects collected), so what it
                    // read may not fit together: it reads again before it calls the bucket
                    // damaged.
                    Err(
                        e @ (EngineError::Corrupt(_)
                        | EngineError::Store(StoreError::NotFound(_))),
                    ) if opts.read_only && attempt < READ_ONLY_OPEN_ATTEMPTS => {
                        tracing::warn!(attempt, error = %e, "the bucket changed while it was read (a writer is running?); reading it again");
                        let pause_ms = 100 * u64::from(attempt);
                        tokio::time::sleep(std::time::Duration::from_millis(pause_ms)).await;
                        attempt += 1;
                    }
                    result => break result,
                }
            }
        }
        .await;
        if let (Err(_), Some(me)) = (&opened, &lock_holder) {
            let _ = lease::release(&bucket, &me.holder).await;
        }
        opened
    }

    pub(super) async fn load(
        bucket: SharedBucket,
        sealer: Arc<Sealer>,
        opts: &EngineOptions,
        lock_holder: Option<Arc<Lease>>,
        format_version: u32,
    ) -> Result<Engine, EngineError> {
        let outages = Arc::new(Mutex::new(outage::Outages::default()));
        let bucket: SharedBucket = Arc::new(outage::StoreWatch::new(bucket, outages.clone()));
        let block_cache = BlockCache::new(opts.metadata_cache_bytes_max);
        let disk_cache = match &opts.disk_cache_dir {
            Some(dir) if opts.disk_cache_bytes_max > 0 => {
                match DiskCache::open(dir.clone(), opts.disk_cache_bytes_max) {
                    Ok(cache) => Some(Arc::new(cache)),
                    // A reader beside a writer given the same config: sharing the directory
                    // would empty the other's cache; one of them goes without.
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        tracing::warn!(dir = %dir.display(), "the cache directory is in use by another bucketfs process: running without a disk cache (give this one its own cache.dir)");
                        None
                    }
                    Err(e) => {
                        return Err(EngineError::Store(StoreError::Permanent(format!(
                            "cache directory {}: {e}",
                            dir.display()
                        ))))
                    }
                }
            }
            _ => None,
        };
        let pins = pins::load_pins(&bucket, &sealer).await?;
        let pinned = match &opts.checkpoint {
            Some(name) if !opts.read_only => {
                return Err(EngineError::CheckpointIsReadOnly(name.clone()))
            }
            Some(name) => match pins.by_name.get(name) {
                Some(pin) => Some(pin.seq),
                None => return Err(EngineError::NoSuchCheckpoint(name.clone())),
            },
            None => None,
        };
        let manifest_seq = match pinned {
            Some(seq) => Some(seq),
            None => bucket
                .list("manifest/")
                .await?
                .iter()
                .filter_map(|o| logobj::parse_seq(&o.key, "manifest"))
                .max(),
        };
        let mut committed;
        let checkpoint_seq = match manifest_seq {
            Some(seq) => {
                let base = load_base(&bucket, &sealer, seq, &block_cache, &disk_cache).await?;
                committed = MetaState::new(Arc::new(base));
                seq
            }
            // Format 1: one whole-map checkpoint (or none yet), loaded into memory whole. The
            // first checkpoint of this process writes it as a run, migrating the bucket.
            None => {
                committed = MetaState::default();
                load_format_1_checkpoint(&bucket, &sealer, &mut committed).await?
            }
        };
        let logs: Vec<(u64, u64)> = bucket
            .list("log/")
            .await?
            .iter()
            .filter_map(|o| logobj::parse_seq(&o.key, "log").map(|s| (s, o.size_bytes)))
            .collect();
        // A named checkpoint is the state as of its manifest: nothing after it is replayed.
        let logs: Vec<(u64, u64)> = match pinned {
            Some(seq) => logs.into_iter().filter(|(s, _)| *s <= seq).collect(),
            None => logs,
        };
        let known_logs: BTreeMap<u64, u64> = logs.iter().copied().collect();
        let to_replay: Vec<(u64, u64)> = logs
            .into_iter()
            .filter(|(s, _)| *s > checkpoint_seq)
            .collect();
        // Up to UPLOADS_IN_FLIGHT_MAX objects are uploaded at once but committed in order, so a
        // crash can leave a few stored objects after a missing one. None of them was ever
        // acknowledged; they are dropped. A longer run after a gap means acknowledged data is
        // gone: refuse to guess.
        let mut to_replay = to_replay;
        let mut known_logs = known_logs;
        // Uploads from a journal tier run more at once (bucket/tier.rs); its marker says so.
        let in_flight_max = match bucket.get(crate::bucket::JOURNAL_MARKER_KEY).await {
            Ok(_) => UPLOADS_IN_FLIGHT_MAX.max(crate::bucket::JOURNAL_UPLOADS_IN_FLIGHT),
            Err(StoreError::NotFound(_)) => UPLOADS_IN_FLIGHT_MAX,
            Err(e) => return Err(e.into()),
        };
        if let Some(gap) = to_replay
            .iter()
            .enumerate()
            .position(|(i, (seq, _))| *seq != checkpoint_seq + 1 + i as u64)
        {
            let orphans = to_replay.split_off(gap);
            let missing = checkpoint_seq + 1 + gap as u64;
            // Uploads in flight are the oldest uncommitted objects, so a crash leaves stored
            // objects only within `in_flight_max` of the first missing one.
            let beyond = orphans
                .iter()
                .filter(|(seq, _)| *seq >= missing + in_flight_max as u64)
                .count();
            if beyond > 0 {
                return Err(EngineError::Corrupt(format!(
                    "log object {} is missing but {} later ones exist; the bucket is damaged",
                    logobj::log_key(missing),
                    orphans.len()
                )));
            }
            for (seq, _) in &orphans {
                tracing::warn!(object = %logobj::log_key(*seq), "dropping a log object stored after a crash but never committed");
                known_logs.remove(seq);
                if !opts.read_only {
                    // Durably: its sequence number is used again from here on.
                    bucket
                        .delete(&logobj::log_key(*seq), DeleteMode::Durable)
                        .await?;
                }
            }
        }
        let records = futures::stream::iter(to_replay.iter().copied())
            .map(|(seq, size)| {
                let bucket = bucket.clone();
                let sealer = sealer.clone();
                async move {
                    let key = logobj::log_key(seq);
                    if size < logobj::LOG_HEADER_BYTES as u64 + logobj::LOG_TRAILER_BYTES {
                        return Err(EngineError::Corrupt(format!("{key}: too short")));
                    }
                    let trailer = bucket
                        .get_range(&key, size - logobj::LOG_TRAILER_BYTES..size)
                        .await?;
                    let range = logobj::parse_trailer(&key, size, &trailer)?;
                    let sealed = bucket.get_range(&key, range).await?;
                    Ok::<_, EngineError>(logobj::open_log_meta(&sealer, &key, seq, &sealed)?)
                }
            })
            .buffered(REPLAY_CONCURRENCY);
        let records: Vec<Vec<MetaOp>> = records.try_collect().await?;
        for ops in &records {
            for op in ops {
                committed.apply(op);
            }
        }
        let last_seq = known_logs
            .last_key_value()
            .map_or(0, |(s, _)| *s)
            .max(checkpoint_seq);
        let log_bytes_stored = known_logs.values().sum();
        tracing::info!(
            checkpoint_seq,
            replayed = records.len(),
            last_seq,
            extents = committed.live().extent_count(),
            "opened bucket"
        );
        // Writes retry against the memory tier until their base is there: never let it be tiny.
        let clean_extents = (opts.memory_cache_bytes_max as usize / EXTENT_SIZE_BYTES).max(1024);
        let engine = Engine {
            inner: Arc::new(Inner {
                bucket,
                sealer,
                codec: opts.codec,
                tuning: opts.tuning.clone(),
                tasks: opts.tasks.clone(),
                read_only: opts.read_only,
                state: RwLock::new(State {
                    write_gen: 0,
                    pending: Batch::default(),
                    flushing: VecDeque::new(),
                    committed,
                    commit_gen: 0,
                    clean: super::clean::CleanCache::new(clean_extents),
                    next_batch: 1,
                    shared: HashMap::new(),
                }),
                seal: tokio::sync::Mutex::new(SealCtl {
                    next_seq: last_seq + 1,
                    unsealed: 0,
                }),
                upload: tokio::sync::Mutex::new(UploadCtl {
                    checkpoint_seq,
                    checkpoints_begun: VecDeque::from([(
                        checkpoint_seq,
                        tokio::time::Instant::now(),
                    )]),
                    log_bytes_since_checkpoint: 0,
                    known_logs,
                }),
                durable_gen: AtomicU64::new(0),
                bucket_gen: AtomicU64::new(0),
                journal: (opts.journaled_barriers && !opts.read_only).then(Default::default),
                journal_notify: tokio::sync::Notify::new(),
                side: Mutex::default(),
                poisoned: Mutex::new(None),
                disk_cache,
                lock_holder,
                checkpoint_running: AtomicBool::new(false),
                checkpoint_lag_objects: AtomicU64::new(0),
                checkpoint_lag_bytes: AtomicU64::new(0),
                pins: Mutex::new(pins),
                superblock_format_1: AtomicBool::new(format_version == 1),
                block_cache,
                readahead: Default::default(),
                last_commit_us: AtomicU64::new(0),
                repacked_uncollected: AtomicBool::new(false),
                epoch: tokio::time::Instant::now(),
                object_buffers: Arc::default(),
                extent_buffers: ExtentBuffers::default(),
                background_flush: AtomicBool::new(false),
                barrier_cadence: BarrierCadence::new(&opts.tuning),
                write_behind_running: AtomicBool::new(false),
                log_bytes_stored: AtomicU64::new(log_bytes_stored),
                upload_failing: AtomicBool::new(false),
                upload_failures: AtomicU64::new(0),
                upload_error: Mutex::new(String::new()),
                repack_sweep_from: Mutex::new(Vec::new()),
                outage: outages,
                outage_timeout: opts.outage_timeout,
                committed_notify: tokio::sync::Notify::new(),
                stored_notify: tokio::sync::Notify::new(),
                queue: Mutex::new(VecDeque::new()),
                counters: Counters::default(),
            }),
        };
        if !opts.read_only {
            engine.replay_records().await?;
            engine.replay_side_records().await?;
            if engine.journaling() {
                engine.spawn_coalescer();
            }
            engine.spawn_periodic_flush(opts.flush_interval);
            if let Some(quiet) = opts.tuning.quiet_checkpoint_after() {
                engine.spawn_quiet_checkpoints(quiet);
            }
        }
        Ok(engine)
    }
}

/// Opens the runs manifest `seq` names (their indexes only) and reads its object table.
async fn load_base(
    bucket: &SharedBucket,
    sealer: &Arc<Sealer>,
    seq: u64,
    cache: &Arc<BlockCache>,
    disk: &Option<Arc<DiskCache>>,
) -> Result<Base, EngineError> {
    let key = logobj::manifest_key(seq);
    let bytes = bucket.get(&key).await?;
    let manifest = logobj::decode_manifest(sealer, &key, seq, &bytes)?;
    // Each part costs a tail and an index read: many at once, or a remote bucket's round trip
    // each would add up at open.
    let runs: Vec<Arc<RunReader>> = futures::stream::iter(manifest.runs.iter().rev())
        .map(|run| async move {
            let reader = RunReader::open(
                bucket.clone(),
                sealer.clone(),
                &run.key(),
                run.seal_id(),
                run.size_bytes,
            )
            .await?;
            Ok::<_, EngineError>(Arc::new(
                reader
                    .with_cache(cache.clone())
                    .with_disk_cache(disk.clone()),
            ))
        })
        .buffered(RUN_OPEN_CONCURRENCY)
        .try_collect()
        .await?;
    let objects = match manifest.objects {
        Some(table) => table,
        None => rebuild_object_table(&runs, &key).await?,
    };
    let stored: u64 = runs.iter().map(|r| r.entry_count()).sum();
    tracing::info!(manifest = %key, runs = runs.len(), entries_stored = stored, objects = objects.live_objects().len(), "opened metadata runs");
    Ok(Base {
        runs,
        infos: manifest.runs,
        objects,
        manifest_seq: seq,
        sweep: manifest
            .sweep
            .map(|(first_seq, from)| crate::meta::BottomSweep { first_seq, from }),
    })
}

/// The object table of a manifest of formats 2 and 3, which kept none: every extent pointer of
/// its runs, read once (the next checkpoint stores the table).
async fn rebuild_object_table(
    runs: &[Arc<RunReader>],
    key: &str,
) -> Result<crate::meta::ObjectTable, EngineError> {
    use crate::meta::run_key;
    let sources: Vec<crate::lsm::merge::Source<'_>> = runs
        .iter()
        .map(|r| crate::lsm::merge::Source::Run(r.as_ref()))
        .collect();
    let mut table = crate::meta::ObjectTable::default();
    let mut lz4 = Vec::new();
    let mut damaged = false;
    crate::lsm::merge::for_each_live_in(&sources, &[], None, |k, v| {
        if run_key::parse_extent(k).is_some() {
            match run_key::parse_ptr(v) {
                Some(ptr) => table.credit(ptr),
                None => damaged = true,
            }
        } else if let Some(seq) = run_key::parse_lz4_object(k) {
            lz4.push(seq);
        } else if run_key::parse_kv(k).is_none() {
            damaged = true;
        }
        !damaged
    })
    .await?;
    if damaged {
        return Err(EngineError::Corrupt(format!(
            "{key}: its runs hold an entry of no known kind"
        )));
    }
    for seq in lz4 {
        table.mark_lz4(seq);
    }
    tracing::info!(manifest = %key, objects = table.live_objects().len(), "rebuilt the object table of a manifest of format 2 or 3");
    Ok(table)
}

/// Loads the newest format-1 checkpoint into `state`; returns the log object it covers (0: none).
async fn load_format_1_checkpoint(
    bucket: &SharedBucket,
    sealer: &Sealer,
    state: &mut MetaState,
) -> Result<u64, EngineError> {
    let checkpoint_seq = bucket
        .list("checkpoint/")
        .await?
        .iter()
        .filter_map(|o| logobj::parse_seq(&o.key, "checkpoint"))
        .max()
        .unwrap_or(0);
    if checkpoint_seq > 0 {
        let key = logobj::checkpoint_key(checkpoint_seq);
        let bytes = bucket.get(&key).await?;
        for op in logobj::decode_checkpoint(sealer, &key, checkpoint_seq, &bytes)? {
            state.apply(&op);
        }
    }
    Ok(checkpoint_seq)
}
