//! Write-behind: writes start on their way to the bucket before the barrier that will ask for
//! them, while clients ask for barriers often.

use super::*;

impl Engine {
    /// While clients ask for a barrier every few milliseconds (an fsync per transaction), a
    /// write is sealed and uploaded as soon as it is applied, so the barrier that follows finds
    /// it on its way: the upload overlaps the client's own round trip from the write's reply to
    /// its flush, instead of starting after it. While they ask every few hundred milliseconds,
    /// writes are sealed and uploaded once `Tuning::write_behind_gathered_bytes` have gathered, so a
    /// barrier seals at most about that much itself. One write-behind at a time: writes applied
    /// meanwhile go together in its next object, so a burst of writes is not cut into an object
    /// each. The task starts when the writer's task next waits, so a caller that answers its
    /// client from that task (the NBD server does) sends the reply first. Yielding here instead
    /// would put the task at the back of the run queue and wake the other worker to steal it, a
    /// wake-up per write (docs/benchmarks/2026-11-24-rw-sync-gap.md).
    pub(super) fn write_behind(&self, pending_bytes: usize) {
        if !self.write_behind_due(pending_bytes)
            || self.inner.write_behind_running.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let engine = self.clone();
        self.inner.tasks.spawn(async move {
            let covered = {
                let _running = ClearOnDrop(&engine.inner.write_behind_running);
                engine.write_behind_until_caught_up().await
            };
            // A write applied after the last look found the flag still set and started nothing.
            if let Some(gen) = covered {
                let pending_bytes = {
                    let st = engine.inner.state.read();
                    (st.write_gen > gen).then(|| st.pending.data_bytes())
                };
                if let Some(pending_bytes) = pending_bytes {
                    engine.write_behind(pending_bytes);
                }
            }
        });
    }

    /// Whether the barriers' cadence calls for a write-behind with this much pending.
    pub(super) fn write_behind_due(&self, pending_bytes: usize) -> bool {
        // With journaled barriers a barrier costs a journal write, and the bucket gets the
        // batches together.
        if self.journaling() {
            return false;
        }
        match self.inner.barrier_cadence.write_behind() {
            WriteBehind::EveryWrite => true,
            WriteBehind::Gathered => {
                pending_bytes as u64 >= self.inner.tuning.write_behind_gathered_bytes
            }
            WriteBehind::Off => false,
        }
    }

    /// Seals and uploads what is pending until nothing more is due, or an upload fails (`None`:
    /// the next barrier retries it). Returns the write generation it made durable.
    pub(super) async fn write_behind_until_caught_up(&self) -> Option<u64> {
        loop {
            let target = self.inner.state.read().write_gen;
            if self.inner.durable_gen.load(Ordering::Acquire) >= target {
                return Some(target);
            }
            self.inner
                .counters
                .write_behind_flushes
                .fetch_add(1, Ordering::Relaxed);
            let mut untimed = PartTimes::default();
            self.seal_pending(target, Waiting::Client, &mut untimed)
                .await;
            if let Err(e) = self.upload_queued(target, &mut untimed).await {
                tracing::error!(error = %e, "write-behind flush failed; the writes stay in memory and the next flush retries");
                return None;
            }
            let pending_bytes = self.inner.state.read().pending.data_bytes();
            if !self.write_behind_due(pending_bytes) {
                return Some(target);
            }
        }
    }
}
