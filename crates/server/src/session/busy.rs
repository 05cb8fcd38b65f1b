//! How much of the time a session keeps the GPU busy, by sampling.
//!
//! A thread of the session's own asks the driver, every [`SAMPLE`], whether
//! any of the session's streams still has work that has not finished, and
//! counts the samples and the busy ones in the session's ledger slot; the
//! supervisor turns them into a share of each interval. The driver cannot
//! be asked which process a GPU is running at a given moment from inside a
//! virtual machine (NVML lists no processes there), so this counts the time
//! a session's work is on the GPU, running or queued behind other work: a
//! tenant waiting for a time slice counts as busy.
//!
//! The driver is asked only after the session queued asynchronous work
//! (launches, asynchronous copies and memsets, event records and waits),
//! and until it finds that work done: a query beside a synchronous call
//! slowed that call, and a synchronous call leaves nothing queued. Its
//! own brief work, a synchronous copy, is not counted. The session's own
//! thread pays a flag store per such call and a lock when a stream or a
//! context comes or goes.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use gpuplex_protocol::CuError;

use crate::backend::{Backend, Obj};
use crate::ledger::Account;

/// How often the session's streams are looked at.
pub const SAMPLE: Duration = Duration::from_millis(20);

/// `CU_STREAM_LEGACY`: each context's default stream.
const LEGACY: Obj = Obj(1);

struct Shared {
    /// The streams to look at, each with its context: `(ctx, stream)`.
    watched: Mutex<Vec<(Obj, Obj)>>,
    /// Set when the session queues asynchronous work.
    queued: AtomicBool,
    stopped: Mutex<bool>,
    wake: Condvar,
}

pub struct Busy {
    shared: Arc<Shared>,
    sampler: Option<JoinHandle<()>>,
}

impl Busy {
    /// Starts sampling for the session whose slot `account` is.
    pub fn start(backend: Arc<dyn Backend>, account: Account) -> Busy {
        let shared = Arc::new(Shared {
            watched: Mutex::default(),
            queued: AtomicBool::new(false),
            stopped: Mutex::new(false),
            wake: Condvar::new(),
        });
        let sampling = shared.clone();
        let sampler = std::thread::Builder::new()
            .name("gpuplex-busy".into())
            .spawn(move || sample(&sampling, &*backend, &account))
            .map_err(|e| tracing::warn!("the session's GPU use will show as idle: {e}"))
            .ok();
        Busy { shared, sampler }
    }

    fn watched(&self) -> MutexGuard<'_, Vec<(Obj, Obj)>> {
        self.shared.watched.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The session queued work that may outlast the call (if `queued`).
    pub fn queued(&self, queued: bool) {
        if queued && !self.shared.queued.load(Relaxed) {
            self.shared.queued.store(true, Relaxed);
        }
    }

    /// A context that came to life: its default stream is watched.
    pub fn context(&self, ctx: Obj) {
        self.watched().push((ctx, LEGACY));
    }

    pub fn stream(&self, ctx: Obj, stream: Obj) {
        self.watched().push((ctx, stream));
    }

    /// Before a stream is destroyed (waits for a sample under way).
    pub fn stream_gone(&self, stream: Obj) {
        self.watched().retain(|&(_, s)| s != stream);
    }

    /// Before a context is destroyed, with its streams.
    pub fn context_gone(&self, ctx: Obj) {
        self.watched().retain(|&(c, _)| c != ctx);
    }

    /// Stops sampling, before the session's contexts go.
    pub fn stop(&mut self) {
        *self.shared.stopped.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.shared.wake.notify_all();
        if let Some(sampler) = self.sampler.take() {
            let _ = sampler.join();
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.stop();
    }
}

fn sample(shared: &Shared, backend: &dyn Backend, account: &Account) {
    let slot = account.slot();
    let mut was_busy = false;
    let mut stopped = shared.stopped.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        stopped = shared.wake.wait_timeout(stopped, SAMPLE).unwrap_or_else(PoisonError::into_inner).0;
        if *stopped {
            return;
        }
        let queued = shared.queued.swap(false, Relaxed);
        let busy = (queued || was_busy) && {
            let watched = shared.watched.lock().unwrap_or_else(PoisonError::into_inner);
            let busy = |&(ctx, stream): &(Obj, Obj)| {
                backend.stream_query(ctx, stream).is_err_and(|e| e.code == CuError::NOT_READY)
            };
            watched.iter().any(busy)
        };
        was_busy = busy;
        // Only this thread writes these two.
        slot.samples.store(slot.samples.load(Relaxed) + 1, Relaxed);
        if busy {
            slot.busy_samples.store(slot.busy_samples.load(Relaxed) + 1, Relaxed);
        }
    }
}
