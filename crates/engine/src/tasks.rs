//! Every task the engine starts goes through a [`TaskSet`], so that whoever opened the engine
//! can stop all of them at once: a crash test stops an engine as `kill -9` stops the process
//! (nothing it started runs on, nothing more reaches the bucket once the bucket is frozen),
//! then reopens the bucket in the same process.

use parking_lot::Mutex;
use std::future::Future;
use std::sync::Arc;
use tokio::task::JoinHandle;

/// The tasks one engine started; cloning shares the set. Finished tasks are forgotten as new
/// ones start, so the set holds about as many handles as tasks are running.
#[derive(Clone, Default)]
pub struct TaskSet {
    running: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl std::fmt::Debug for TaskSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskSet")
            .field("running", &self.running.lock().len())
            .finish()
    }
}

impl TaskSet {
    fn keep(&self, handle: JoinHandle<()>) {
        let mut running = self.running.lock();
        running.retain(|h| !h.is_finished());
        running.push(handle);
    }

    /// Starts `task` on the current runtime.
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.keep(tokio::spawn(task));
    }

    /// Runs `work` on a blocking thread; the returned future gives its result.
    pub fn spawn_blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> impl Future<Output = T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.keep(tokio::task::spawn_blocking(move || {
            let _ = tx.send(work());
        }));
        async move { rx.await.expect("blocking work does not panic") }
    }

    /// Stops every task (those waiting on a request are dropped where they wait) and returns once
    /// none runs any more, blocking work included: afterwards nothing this set started holds
    /// the engine.
    pub async fn stop_all(&self) {
        loop {
            let handles = std::mem::take(&mut *self.running.lock());
            if handles.is_empty() {
                return;
            }
            for h in &handles {
                h.abort();
            }
            for h in handles {
                let _ = h.await;
            }
        }
    }
}
