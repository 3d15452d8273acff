//! Every task the engine starts goes through a [`TaskSet`], so that whoever opened the engine
//! can stop all of them at once: a crash test stops an engine as `kill -9` stops the process
//! (nothing it started runs on, nothing more reaches the bucket once the bucket is frozen),
//! then reopens the bucket in the same process.
//!
//! They all run on the engine's home runtime, the one it was opened on, whichever runtime
//! the caller runs on: a 9P connection serves its small requests on a runtime of its own
//! thread, and background work started by one of them must neither land there nor end with it.

use parking_lot::Mutex;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

/// The tasks one engine started; cloning shares the set. Finished tasks are forgotten as new
/// ones start, so the set holds about as many handles as tasks are running.
#[derive(Clone, Default)]
pub struct TaskSet {
    running: Arc<Mutex<Vec<JoinHandle<()>>>>,
    home: Arc<OnceLock<Handle>>,
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

    /// Makes the current runtime the set's home, unless it has one: the engine calls this as
    /// it opens. Until then tasks start on the caller's runtime.
    pub fn settle(&self) {
        if let Ok(current) = Handle::try_current() {
            let _ = self.home.set(current);
        }
    }

    fn home(&self) -> Handle {
        match self.home.get() {
            Some(home) => home.clone(),
            None => Handle::current(),
        }
    }

    /// Starts `task` on the home runtime.
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.keep(self.home().spawn(task));
    }

    /// Starts `task` on the home runtime for the caller to wait on or drop; `stop_all` does
    /// not know it, so it must not outlive what its caller waits for.
    pub fn start<T: Send + 'static>(
        &self,
        task: impl Future<Output = T> + Send + 'static,
    ) -> JoinHandle<T> {
        self.home().spawn(task)
    }

    /// Runs `work` on a blocking thread of the home runtime; the returned future gives its
    /// result. If the home runtime is shutting down (the process is stopping) and never starts
    /// it, a caller on another runtime (a 9P connection's) runs it itself.
    pub fn spawn_blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> impl Future<Output = T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let work = Arc::new(Mutex::new(Some(work)));
        let queued = work.clone();
        self.keep(self.home().spawn_blocking(move || {
            let taken = queued.lock().take();
            if let Some(work) = taken {
                let _ = tx.send(work());
            }
        }));
        async move {
            match rx.await {
                Ok(result) => result,
                Err(_) => {
                    let never_started = work.lock().take();
                    match never_started {
                        Some(work) => work(),
                        None => panic!("blocking work panicked"),
                    }
                }
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    /// A task started from another runtime's thread (a 9P connection's) runs on the set's
    /// home and goes on after that runtime is gone.
    #[test]
    fn tasks_run_at_home_and_outlive_the_runtime_that_started_them() {
        let home = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let set = TaskSet::default();
        home.block_on(async { set.settle() });
        let done = Arc::new(AtomicBool::new(false));
        let blocking_done = Arc::new(AtomicBool::new(false));
        let (s, d, b) = (set.clone(), done.clone(), blocking_done.clone());
        std::thread::spawn(move || {
            let other = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            other.block_on(async {
                s.spawn(async move {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    d.store(true, Ordering::SeqCst);
                });
                // Left unawaited: its result is not wanted, only that it runs.
                drop(s.spawn_blocking(move || b.store(true, Ordering::SeqCst)));
            });
            drop(other);
        })
        .join()
        .unwrap();
        home.block_on(async {
            for _ in 0..100 {
                if done.load(Ordering::SeqCst) && blocking_done.load(Ordering::SeqCst) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("a task started from another runtime died with it");
        });
        home.block_on(set.stop_all());
    }

    /// Blocking work asked of a set whose home runtime is gone (a process stopping while a
    /// connection's thread still serves) is done by the caller instead of never.
    #[test]
    fn blocking_work_runs_even_when_the_home_runtime_is_gone() {
        let home = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let set = TaskSet::default();
        home.block_on(async { set.settle() });
        drop(home);
        let other = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert_eq!(other.block_on(set.spawn_blocking(|| 6 * 7)), 42);
    }
}
