//! Bulk work runs at the lowest CPU priority, so that it never holds a core a small request's
//! threads are waiting for (docs/0010-bulk-cpu-priority.md).
//!
//! Bulk work is what a streaming writer makes the engine do: sealing large batches (compression
//! and encryption), writing their objects into a local bucket, merging runs, filling the disk
//! cache. Its threads run under `SCHED_IDLE`: a woken thread of normal priority takes their core
//! at once. A thread at `SCHED_IDLE` gets almost no CPU beside busy normal threads, and clients
//! wait on bulk work too (a barrier after a stream, a writer held back by the dirty-data bound),
//! so a watchdog raises every bulk thread back to normal while bulk threads that want a core get
//! too little of it. Leaving `SCHED_IDLE` needs `CAP_SYS_NICE` (or an `RLIMIT_NICE` that allows
//! nice 0): where the process may not, bulk work runs at normal priority, as everything else.

use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How often the watchdog looks at the bulk threads' scheduler counters while bulk work runs.
const WATCH_INTERVAL: Duration = Duration::from_millis(25);
/// Bulk threads are starved when, over this many consecutive intervals, one of them was ready
/// to run at the interval's end while together they ran less than `1/STARVED_RUN_DIVISOR` of
/// it.
const STARVED_INTERVALS: u32 = 4;
const STARVED_RUN_DIVISOR: u32 = 4;
/// Once raised, bulk threads stay at normal priority this long before they drop again; twice as
/// long as the last time (up to `BOOST_HOLD_MAX`) if they were starved again within
/// `BOOST_HOLD_MIN` of dropping, as under lasting load from other processes.
const BOOST_HOLD_MIN: Duration = Duration::from_secs(1);
const BOOST_HOLD_MAX: Duration = Duration::from_secs(16);

/// Where bulk work stands in this process (`bucketfs status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BulkPriority {
    /// Not configured yet (no engine opened), or `Tuning::bulk_idle_priority` is 0.
    #[default]
    Normal,
    /// Bulk threads run under `SCHED_IDLE`, raised while starved.
    Idle,
    /// Asked for, but the process may not raise a thread back from `SCHED_IDLE`.
    NormalNotPermitted,
}

struct Bulk {
    priority: Mutex<BulkPriority>,
    /// Bulk threads by thread id: how many bulk jobs each runs now (a thread that only ever
    /// runs bulk work counts one for good).
    threads: Mutex<HashMap<libc::pid_t, usize>>,
    /// Bulk jobs running now (`enter`'s guards): the watchdog sleeps while there are none.
    jobs: AtomicU64,
    /// Raised to normal priority by the watchdog (new bulk jobs start raised too).
    boosted: AtomicBool,
    boosts: AtomicU64,
    /// Wakes the watchdog when bulk work starts.
    work: Condvar,
    work_lock: Mutex<()>,
}

fn bulk() -> &'static Bulk {
    static BULK: OnceLock<Bulk> = OnceLock::new();
    BULK.get_or_init(|| Bulk {
        priority: Mutex::new(BulkPriority::Normal),
        threads: Mutex::default(),
        jobs: AtomicU64::new(0),
        boosted: AtomicBool::new(false),
        boosts: AtomicU64::new(0),
        work: Condvar::new(),
        work_lock: Mutex::new(()),
    })
}

fn set_policy(tid: libc::pid_t, policy: libc::c_int) -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler reads `param` and changes only the scheduling of thread `tid`.
    unsafe { libc::sched_setscheduler(tid, policy, &param) == 0 }
}

fn gettid() -> libc::pid_t {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// Whether a thread of this process may go to `SCHED_IDLE` and come back, tried on a thread of
/// its own so that no thread that matters is left behind at idle priority.
fn may_leave_idle() -> bool {
    std::thread::Builder::new()
        .name("bulk-probe".into())
        .spawn(|| set_policy(0, libc::SCHED_IDLE) && set_policy(0, libc::SCHED_OTHER))
        .ok()
        .and_then(|t| t.join().ok())
        .unwrap_or(false)
}

/// Sets bulk work's priority for the process: `SCHED_IDLE` if `idle` and the process may
/// raise threads back, normal otherwise. Every engine open calls it with its tuning; the last
/// call holds for all.
pub fn configure(idle: bool) -> BulkPriority {
    let b = bulk();
    let mut priority = b.priority.lock();
    let wanted = match (idle, *priority) {
        (false, _) => BulkPriority::Normal,
        (true, BulkPriority::Idle) => BulkPriority::Idle,
        (true, _) if may_leave_idle() => BulkPriority::Idle,
        (true, _) => BulkPriority::NormalNotPermitted,
    };
    if wanted == BulkPriority::NormalNotPermitted && *priority != wanted {
        tracing::info!(
            "bulk work runs at normal CPU priority: this process may not raise a thread back \
             from SCHED_IDLE (it needs CAP_SYS_NICE or an RLIMIT_NICE of 20)"
        );
    }
    if wanted == BulkPriority::Idle && *priority != BulkPriority::Idle {
        static WATCHDOG: OnceLock<()> = OnceLock::new();
        WATCHDOG.get_or_init(|| {
            if let Err(e) = std::thread::Builder::new()
                .name("bulk-watchdog".into())
                .spawn(watchdog)
            {
                tracing::warn!(error = %e, "cannot start the bulk-priority watchdog");
            }
        });
    }
    let was_idle = *priority == BulkPriority::Idle;
    *priority = wanted;
    if was_idle && wanted != BulkPriority::Idle {
        for &tid in b.threads.lock().keys() {
            set_policy(tid, libc::SCHED_OTHER);
        }
    }
    wanted
}

/// Bulk work's priority in this process and how many times the watchdog raised it.
pub fn status() -> (BulkPriority, u64) {
    let b = bulk();
    (*b.priority.lock(), b.boosts.load(Ordering::Relaxed))
}

/// Marks the calling thread as running bulk work until the guard drops: it runs under
/// `SCHED_IDLE` meanwhile (if configured, and unless the watchdog has raised bulk work).
#[must_use = "the thread is bulk only while the guard lives"]
pub struct BulkGuard {
    tid: Option<libc::pid_t>,
}

pub fn enter() -> BulkGuard {
    let guard = register();
    if guard.tid.is_some() {
        let b = bulk();
        b.jobs.fetch_add(1, Ordering::Relaxed);
        let _watch = b.work_lock.lock();
        b.work.notify_one();
    }
    guard
}

fn register() -> BulkGuard {
    let b = bulk();
    if *b.priority.lock() != BulkPriority::Idle {
        return BulkGuard { tid: None };
    }
    let tid = gettid();
    let mut threads = b.threads.lock();
    let jobs = threads.entry(tid).or_insert(0);
    *jobs += 1;
    if *jobs == 1 && !b.boosted.load(Ordering::Relaxed) {
        set_policy(tid, libc::SCHED_IDLE);
    }
    BulkGuard { tid: Some(tid) }
}

impl Drop for BulkGuard {
    fn drop(&mut self) {
        let Some(tid) = self.tid else { return };
        bulk().jobs.fetch_sub(1, Ordering::Relaxed);
        let mut threads = bulk().threads.lock();
        if let Some(jobs) = threads.get_mut(&tid) {
            *jobs -= 1;
            if *jobs == 0 {
                threads.remove(&tid);
                // Under the lock: the watchdog never lowers a thread that has left bulk work.
                set_policy(tid, libc::SCHED_OTHER);
            }
        }
    }
}

/// Marks the calling thread as a bulk thread for as long as it lives (the sealing pool's
/// threads, which work only inside a bulk job of another thread).
pub fn enter_for_good() {
    std::mem::forget(register());
}

/// The CPU time a thread has run, in ns (`/proc/self/task/TID/schedstat`), and whether it is
/// ready to run now (state R in `/proc/self/task/TID/stat`). The kernel adds a thread's wait
/// for a core to its counters only once it gets one, so a starved thread shows as one that
/// stays ready without running.
fn sample(tid: libc::pid_t) -> Option<(u64, bool)> {
    let sched = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    let ran = sched.split_whitespace().next()?.parse().ok()?;
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    // The state follows the command name, which is in parentheses and may hold anything.
    let state = stat.rsplit_once(')')?.1.split_whitespace().next()?;
    Some((ran, state == "R"))
}

/// Decides, interval by interval, whether bulk threads are starved.
#[derive(Default)]
struct Starvation {
    intervals: u32,
}

impl Starvation {
    /// One interval of `length`: how long the bulk threads ran in it, summed, and whether one
    /// of them is ready to run at its end. True once they have been starved long enough to be
    /// raised.
    fn observe(&mut self, length: Duration, ran: Duration, ready: bool) -> bool {
        let starved = ready && ran < length / STARVED_RUN_DIVISOR;
        self.intervals = if starved { self.intervals + 1 } else { 0 };
        self.intervals >= STARVED_INTERVALS
    }
}

fn watchdog() {
    let b = bulk();
    let mut last: HashMap<libc::pid_t, u64> = HashMap::new();
    let mut starvation = Starvation::default();
    let mut boosted_until: Option<Instant> = None;
    let mut hold = BOOST_HOLD_MIN;
    let mut dropped_at: Option<Instant> = None;
    loop {
        // Sleeps while no bulk work runs.
        {
            let mut idle = b.work_lock.lock();
            if b.jobs.load(Ordering::Relaxed) == 0 && boosted_until.is_none() {
                b.work.wait_for(&mut idle, Duration::from_secs(5));
                last.clear();
                continue;
            }
        }
        let started = Instant::now();
        std::thread::sleep(WATCH_INTERVAL);
        // The priority's lock before the threads' (as in `configure`).
        if *b.priority.lock() != BulkPriority::Idle {
            boosted_until = None;
            b.boosted.store(false, Ordering::Relaxed);
            let mut idle = b.work_lock.lock();
            b.work.wait_for(&mut idle, Duration::from_secs(5));
            continue;
        }
        let threads = b.threads.lock();
        let (mut ran, mut ready) = (0u64, false);
        let mut now_stats = HashMap::with_capacity(threads.len());
        for &tid in threads.keys() {
            if let Some((r, is_ready)) = sample(tid) {
                ran += r.saturating_sub(*last.get(&tid).unwrap_or(&r));
                ready |= is_ready;
                now_stats.insert(tid, r);
            }
        }
        last = now_stats;
        match boosted_until {
            Some(until) if Instant::now() >= until => {
                boosted_until = None;
                dropped_at = Some(Instant::now());
                b.boosted.store(false, Ordering::Relaxed);
                starvation = Starvation::default();
                for &tid in threads.keys() {
                    set_policy(tid, libc::SCHED_IDLE);
                }
            }
            Some(_) => {}
            None => {
                if starvation.observe(started.elapsed(), Duration::from_nanos(ran), ready) {
                    hold = match dropped_at {
                        Some(at) if at.elapsed() < BOOST_HOLD_MIN => (hold * 2).min(BOOST_HOLD_MAX),
                        _ => BOOST_HOLD_MIN,
                    };
                    boosted_until = Some(Instant::now() + hold);
                    b.boosted.store(true, Ordering::Relaxed);
                    b.boosts.fetch_add(1, Ordering::Relaxed);
                    for &tid in threads.keys() {
                        set_policy(tid, libc::SCHED_OTHER);
                    }
                    tracing::debug!(
                        ran_us = ran / 1000,
                        hold_ms = hold.as_millis() as u64,
                        "bulk work is starved of CPU: it runs at normal priority for a while"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn starvation_needs_consecutive_starved_intervals() {
        let mut s = Starvation::default();
        for _ in 0..STARVED_INTERVALS - 1 {
            assert!(!s.observe(ms(25), ms(1), true));
        }
        // A fed interval starts the count again.
        assert!(!s.observe(ms(25), ms(20), true));
        for _ in 0..STARVED_INTERVALS - 1 {
            assert!(!s.observe(ms(25), ms(1), true));
        }
        assert!(s.observe(ms(25), ms(1), true));
    }

    #[test]
    fn threads_that_wait_for_nothing_are_not_starved() {
        let mut s = Starvation::default();
        for _ in 0..10 {
            assert!(!s.observe(ms(25), Duration::ZERO, false));
        }
    }

    #[test]
    fn a_thread_leaves_bulk_work_at_normal_priority() {
        let priority = configure(true);
        let policy = || unsafe { libc::sched_getscheduler(0) };
        std::thread::spawn(move || {
            {
                let _bulk = enter();
                let _nested = enter();
                if priority == BulkPriority::Idle {
                    assert_eq!(policy(), libc::SCHED_IDLE);
                }
            }
            assert_eq!(policy(), libc::SCHED_OTHER);
        })
        .join()
        .unwrap();
    }
}
