//! Posted launches run on a thread of the session's own, its launcher,
//! while the session reads and checks the frames that follow them.
//!
//! Reading, checking and resolving a launch costs the session a fraction of
//! what the driver's launch itself costs. On one thread the two add up;
//! here they overlap, and the launcher's core runs nothing but the driver's
//! launch path, as a native program's loop does.
//!
//! - **Batches.** A posted launch read while more frames wait joins a batch
//!   (up to [`MAX_BATCH`]); the batch goes to the launcher when it is full
//!   or when no frame waits. One hand-over per batch keeps the two cores
//!   from trading cache lines for every launch.
//! - **Inline.** A batch with nothing after it runs on the session's own
//!   thread when the launcher has nothing in hand: a lone launch followed
//!   by a synchronize gains nothing from another thread, and waking one
//!   that sleeps costs tens of microseconds on a VM.
//! - **Order.** The session drains the launcher (waits until every launch
//!   handed over has run) before any other call, and before recording a
//!   launch's own failed check, so every call reaches the driver in the
//!   order the client sent it, and the first error of a run of posted calls
//!   is still the one the client sees.
//! - **Backpressure.** At most [`MAX_IN_FLIGHT`] launches are handed over
//!   and unfinished; past that the session waits, its ring fills and the
//!   client waits for room, as a native program waits on a full launch
//!   queue.
//!
//! A side that waits spins for [`SPIN`], then sleeps until the other wakes
//! it, so an idle launcher costs no CPU; a session held back by
//! backpressure sleeps at once, its wait being long and known. What it
//! measured against native: `docs/performance.md`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use gpuplex_protocol::{CallError, CuError, Opcode};
use tracing::{debug, warn};

use crate::backend::{self, Backend, Obj};
use crate::sched::{Seat, Work};

/// Launches per hand-over at most: enough that the hand-over's cost
/// vanishes, few enough that the first of them is not kept long from the
/// GPU.
const MAX_BATCH: usize = 32;
/// Launches handed over and not yet run, at most.
const MAX_IN_FLIGHT: u64 = 256;
/// How long a side spins before it sleeps: long enough to span the gap
/// between batches of a busy client.
const SPIN: Duration = Duration::from_micros(50);
/// The longest sleep between checks. Each side wakes the other when it
/// should (the launcher also as it exits, even by a panic), so this only
/// bounds the cost of a wake-up lost by a bug.
const NAP: Duration = Duration::from_millis(100);

/// A launch checked against the session's tables, ready for the backend.
pub(super) struct ReadyLaunch {
    pub ctx: Obj,
    pub func: Obj,
    pub launch: backend::Launch,
    pub params: Vec<u8>,
}

impl ReadyLaunch {
    /// Launches it once the session's turn on the GPU allows.
    pub fn run(&self, backend: &dyn Backend, seat: &Seat) -> Result<(), CallError> {
        seat.submit(self.ctx, self.launch.stream, Work::Compute, || {
            backend.launch(self.ctx, self.func, &self.launch, &self.params)
        })
    }
}

pub(super) struct Launcher {
    backend: Arc<dyn Backend>,
    seat: Arc<Seat>,
    /// Launches read and not yet handed over or run.
    batch: Vec<ReadyLaunch>,
    /// Started by the first hand-over.
    worker: Option<Worker>,
}

struct Worker {
    shared: Arc<Shared>,
    thread: JoinHandle<()>,
}

/// What the session and its launcher share.
struct Shared {
    inbox: Mutex<Inbox>,
    /// Launches handed over, raised after their batch is queued.
    handed: AtomicU64,
    /// Launches the launcher has run (or seen fail).
    done: AtomicU64,
    /// Set (before `done` moves) when the inbox holds a failure: the session
    /// drains before every call, and mostly nothing failed.
    failed: AtomicBool,
    stop: AtomicBool,
    /// The session's thread, and the count of launches done it waits for
    /// (`u64::MAX` while it waits for nothing): woken once, when they are.
    session: Thread,
    wake_session_at: AtomicU64,
}

#[derive(Default)]
struct Inbox {
    batches: VecDeque<Vec<ReadyLaunch>>,
    /// Batches run, for the session to empty and reuse: launches are freed
    /// on the thread that allocated them.
    spent: Vec<Vec<ReadyLaunch>>,
    /// The first launch the backend refused since the last drain.
    failed: Option<CallError>,
}

impl Shared {
    fn inbox(&self) -> MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Launches handed over and not yet run.
    fn in_flight(&self) -> u64 {
        self.handed.load(Ordering::Acquire) - self.done.load(Ordering::Acquire)
    }

    fn done(&self) -> u64 {
        self.done.load(Ordering::SeqCst)
    }
}

impl Launcher {
    pub fn new(backend: Arc<dyn Backend>, seat: Arc<Seat>) -> Launcher {
        Launcher { backend, seat, batch: Vec::with_capacity(MAX_BATCH), worker: None }
    }

    /// Takes a launch read while the session posts.
    pub fn push(&mut self, launch: ReadyLaunch) {
        self.batch.push(launch);
    }

    /// After a posted call: the batch goes on unless more frames wait and
    /// it has room for them.
    pub fn posted(&mut self, frame_waiting: bool, deferred: &mut Option<(Opcode, CallError)>) {
        if !self.batch.is_empty() && (!frame_waiting || self.batch.len() >= MAX_BATCH) {
            self.send_batch(frame_waiting, deferred);
        }
    }

    /// Before anything but a posted launch: every launch read so far has
    /// run when this returns, and the first to fail is in `deferred`
    /// unless an earlier posted call failed already.
    pub fn drain(&mut self, deferred: &mut Option<(Opcode, CallError)>) {
        if !self.batch.is_empty() {
            self.send_batch(false, deferred);
        }
        let Some(worker) = &self.worker else { return };
        let shared = worker.shared.clone();
        if !self.wait_for(shared.handed.load(Ordering::Acquire), SPIN) {
            deferred.get_or_insert((Opcode::Launch, launcher_lost()));
            return;
        }
        let failed = if shared.failed.swap(false, Ordering::AcqRel) { shared.inbox().failed.take() } else { None };
        if let Some(e) = failed {
            deferred.get_or_insert((Opcode::Launch, e));
        }
    }

    /// Runs the batch here when the launcher has nothing in hand and no
    /// frame waits; else hands it over.
    fn send_batch(&mut self, frame_waiting: bool, deferred: &mut Option<(Opcode, CallError)>) {
        let idle = self.worker.as_ref().is_none_or(|w| w.shared.in_flight() == 0);
        if idle && !frame_waiting {
            return self.run_here(deferred);
        }
        let Some((shared, launcher)) = self.worker().map(|w| (w.shared.clone(), w.thread.thread().clone())) else {
            return self.run_here(deferred);
        };
        let batch = std::mem::take(&mut self.batch);
        let n = batch.len() as u64;
        let spent = {
            let mut inbox = shared.inbox();
            inbox.batches.push_back(batch);
            inbox.spent.pop()
        };
        let handed = shared.handed.fetch_add(n, Ordering::Release) + n;
        launcher.unpark();
        // Emptied here, where its launches were allocated.
        self.batch = spent.map_or_else(
            || Vec::with_capacity(MAX_BATCH),
            |mut b| {
                b.clear();
                b
            },
        );
        // A wait this long is known in advance: sleep at once.
        if shared.in_flight() > MAX_IN_FLIGHT && !self.wait_for(handed - MAX_IN_FLIGHT / 2, Duration::ZERO) {
            deferred.get_or_insert((Opcode::Launch, launcher_lost()));
        }
    }

    /// Runs the batch on the session's thread.
    fn run_here(&mut self, deferred: &mut Option<(Opcode, CallError)>) {
        for launch in self.batch.drain(..) {
            if let Err(e) = launch.run(&*self.backend, &self.seat) {
                debug!(code = e.code.0, detail = %e.detail, "posted launch failed");
                deferred.get_or_insert((Opcode::Launch, e));
            }
        }
    }

    /// The launcher, started if need be; `None` if no thread can start.
    fn worker(&mut self) -> Option<&Worker> {
        if self.worker.is_none() {
            let shared = Arc::new(Shared {
                inbox: Mutex::default(),
                handed: AtomicU64::new(0),
                done: AtomicU64::new(0),
                failed: AtomicBool::new(false),
                stop: AtomicBool::new(false),
                session: std::thread::current(),
                wake_session_at: AtomicU64::new(u64::MAX),
            });
            let (theirs, backend, seat) = (shared.clone(), self.backend.clone(), self.seat.clone());
            let spawned = std::thread::Builder::new()
                .name("gpuplex-launch".into())
                .spawn(move || work(&theirs, &*backend, &seat));
            match spawned {
                Ok(thread) => self.worker = Some(Worker { shared, thread }),
                Err(e) => warn!("no launcher thread, launching on the session's: {e}"),
            }
        }
        self.worker.as_ref()
    }

    /// Waits until the launcher has run `count` launches, spinning for
    /// `spin` first; false if it died before (a panic in the backend),
    /// which drops it with whatever it held.
    fn wait_for(&mut self, count: u64, spin: Duration) -> bool {
        let Some(worker) = &self.worker else { return true };
        let shared = &worker.shared;
        if shared.done() < count {
            shared.wake_session_at.store(count, Ordering::SeqCst);
            wait_until(spin, || shared.done() >= count || worker.thread.is_finished());
            shared.wake_session_at.store(u64::MAX, Ordering::SeqCst);
        }
        if shared.done() >= count {
            return true;
        }
        warn!("the launcher thread died");
        self.worker = None;
        false
    }

    /// Runs what was read, waits for what was handed over, and ends the
    /// launcher: the session is closing. Errors have nobody to go to.
    pub fn stop(&mut self) {
        let mut ignored = None;
        self.drain(&mut ignored);
        if let Some(worker) = self.worker.take() {
            worker.shared.stop.store(true, Ordering::Release);
            worker.thread.thread().unpark();
            let _ = worker.thread.join();
        }
    }
}

fn launcher_lost() -> CallError {
    CallError::new(CuError::UNKNOWN, "the session's launcher thread died; launches handed to it may not have run")
}

/// The launcher: runs batches in order until told to stop.
fn work(shared: &Shared, backend: &dyn Backend, seat: &Seat) {
    /// Wakes the session however the launcher ends, so that it never waits
    /// for one that is gone.
    struct Farewell<'a>(&'a Thread);
    impl Drop for Farewell<'_> {
        fn drop(&mut self) {
            self.0.unpark();
        }
    }
    let _farewell = Farewell(&shared.session);
    let (started, mut waited, mut batches) = (Instant::now(), Duration::ZERO, 0u64);
    let mut taken = 0u64;
    loop {
        let next = shared.inbox().batches.pop_front();
        let Some(batch) = next else {
            if shared.stop.load(Ordering::Acquire) {
                // How well the session kept it fed, for whoever tunes this.
                let (lived, waited) = (started.elapsed().as_secs_f64() * 1e3, waited.as_secs_f64() * 1e3);
                debug!(launches = taken, batches, lived_ms = lived, waited_ms = waited, "launcher stops");
                return;
            }
            let wait = Instant::now();
            wait_until(SPIN, || shared.handed.load(Ordering::Acquire) > taken || shared.stop.load(Ordering::Acquire));
            waited += wait.elapsed();
            continue;
        };
        batches += 1;
        let mut failed = None;
        for launch in &batch {
            if let Err(e) = launch.run(backend, seat) {
                debug!(code = e.code.0, detail = %e.detail, "posted launch failed");
                failed.get_or_insert(e);
            }
        }
        taken += batch.len() as u64;
        {
            let mut inbox = shared.inbox();
            if let Some(e) = failed {
                inbox.failed.get_or_insert(e);
                shared.failed.store(true, Ordering::Release);
            }
            inbox.spent.push(batch);
        }
        shared.done.store(taken, Ordering::SeqCst);
        if taken >= shared.wake_session_at.load(Ordering::SeqCst) {
            shared.session.unpark();
        }
    }
}

/// Spins for `spin`, then sleeps until woken (or [`NAP`] passes) between
/// checks; returns once `ready` holds.
fn wait_until(spin: Duration, ready: impl Fn() -> bool) {
    let start = Instant::now();
    let mut turns = 0u32;
    while !ready() {
        turns = turns.wrapping_add(1);
        if turns % 64 == 0 && start.elapsed() >= spin {
            std::thread::park_timeout(NAP);
        } else {
            std::hint::spin_loop();
        }
    }
}
