//! A session's place in GPU scheduling: the gate its submissions pass, and
//! the meter that times its work on the GPU.
//!
//! The session's threads (its own and its launcher) call [`Seat::submit`]
//! around every driver call that puts work on a stream. That costs a
//! session holding its turn a few atomic operations: which GPU the context
//! is on is found in a small lock-free table, the submission counts itself
//! in flight and checks that no hand-over has begun (so that the turn cannot
//! end between the check and the driver call), and the stream is marked as
//! having new work with one atomic or. Work the policy does not gate
//! (copies, under time slicing) skips the count: a hand-over need not wait
//! for it. A submission that finds the meter asleep wakes it.
//!
//! The meter is a thread of the session's own. While the session is
//! active it looks every `POLL` while another session waits for one of
//! its GPUs, else every `LOOK_ALONE`: on each stream with new work it records
//! an event, waits for it, and counts the time from the stream's previous
//! event to this one as the session's GPU time, bounded by the time since
//! the first of that work was submitted (a stream that sat idle between
//! the two events was not busy). Alone, it still wakes every `POLL_ALONE`
//! to see whether someone has come to wait. An idle session's meter sleeps
//! until the next submission wakes it. The meter also gives up a GPU whose
//! turn the session holds but no longer uses: its work has finished and
//! nothing new came for `IDLE_GRACE`, or a waiter of a higher class is
//! there, or the slice is over.

use std::collections::HashMap;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing::{debug, trace, warn};

use super::board::{Board, Work, MAX_GPUS};
use super::{now_ns, Place, Policy, Sharing};
use crate::backend::{Backend, Obj};
use crate::ledger::Account;

/// How often an active session's meter looks at its streams while another
/// session waits for a GPU it uses: the delay before a finished turn is
/// noticed, traded against the meter's own use of the CPU and the driver.
const POLL: Duration = Duration::from_micros(100);
/// How often it wakes while nobody waits, to see whether someone has come:
/// the most a newcomer waits before the meter starts looking every `POLL`.
const POLL_ALONE: Duration = Duration::from_millis(2);
/// How often it times the session's work while nobody waits: often enough
/// for status, rarely enough that its events, recorded on the session's own
/// streams, do not slow the session's calls.
const LOOK_ALONE: Duration = Duration::from_millis(50);
/// Idle this long, a meter sleeps until woken instead of polling.
const DEEP_AFTER: Duration = Duration::from_millis(20);
/// A holder whose work has finished keeps its turn this long for its next
/// submission: the gap between a synchronize and the next launch of a
/// busy loop, without the cost of a hand-over.
const IDLE_GRACE: Duration = Duration::from_micros(200);
/// Contexts and streams a seat tracks; work on streams past it is gated
/// but not timed.
const MAX_CTXS: usize = 64;
const MAX_STREAMS: usize = 256;

/// `CU_EVENT_BLOCKING_SYNC`: the meter sleeps, not spins, while it waits.
const BLOCKING_SYNC: u32 = 1;

/// A context and its GPU, in the lock-free table the gate reads.
#[derive(Default)]
struct CtxSlot {
    /// The backend's context; 0 when the slot is free.
    ctx: AtomicU64,
    gpu: AtomicU32,
}

/// A stream, and whether it has work the meter has not timed.
#[derive(Default)]
struct StreamSlot {
    ctx: AtomicU64,
    /// 0 when the slot is free.
    stream: AtomicU64,
    /// [`Work`] kinds submitted since the meter's last look, a bit each.
    fresh: AtomicU32,
    /// When the first of that work was submitted (ns).
    since: AtomicU64,
}

const COMPUTE: u32 = 1;
const COPY: u32 = 2;

struct Shared {
    backend: Arc<dyn Backend>,
    board: Arc<Board>,
    seat: usize,
    row: usize,
    /// The board's GPU of each backend ordinal.
    gpus: Vec<usize>,
    /// Whether submissions wait for the session's turn.
    gated: bool,
    account: Account,
    ctxs: Vec<CtxSlot>,
    streams: Vec<StreamSlot>,
    /// The stream slot last submitted to: a session mostly uses one.
    last_stream: AtomicUsize,
    /// Set by a submission, cleared by the meter's look.
    fresh: AtomicBool,
    /// When the last submission to a stream the meter does not time passed
    /// the gate (ns): a turn is not given up just after it was used. (The
    /// meter's look waits for the work it times, which says as much.)
    active_at: AtomicU64,
    /// Gated submissions that have passed the gate and not yet marked their
    /// work fresh for the meter.
    submitting: AtomicU32,
    /// Whether one of the session's streams is capturing (see
    /// [`Seat::set_capturing`]).
    capturing: AtomicBool,
    /// Held while a turn is given up, and by a submission that waited
    /// while it checks that it holds the turn and counts itself in
    /// `submitting`: work that passed the gate reaches the driver before
    /// its session's turn ends, so two sessions' work never shares the GPU.
    turn: Mutex<()>,
    /// Set while a turn is given up. A submission that holds the turn
    /// counts itself in `submitting` and then checks this, without the
    /// lock; the giver sets this and then waits for `submitting` to drain
    /// (all sequentially consistent), so one of them sees the other.
    releasing: AtomicBool,
    /// Whether the meter sleeps until woken.
    deep: AtomicBool,
    stopped: Mutex<bool>,
    wake: Condvar,
    /// The meter's events, by stream slot; held for a whole look, so a
    /// context is never destroyed under it.
    events: Mutex<HashMap<usize, Events>>,
}

/// A stream's events: the last one timed (where its next span starts) and
/// one to record next.
#[derive(Default)]
struct Events {
    ctx: Obj,
    stream: u64,
    last: Option<Obj>,
    spare: Option<Obj>,
}

/// A session's seat on the board and its meter.
pub struct Seat {
    shared: Arc<Shared>,
    meter: Mutex<Option<JoinHandle<()>>>,
}

impl Seat {
    /// Takes a session's place on the board, and starts its meter.
    pub fn start(backend: Arc<dyn Backend>, place: Place, account: Account) -> Seat {
        let shared = Arc::new(Shared {
            backend,
            board: place.board,
            seat: place.seat,
            row: place.row,
            gpus: place.gpus,
            gated: place.sharing == Sharing::Isolated,
            account,
            ctxs: (0..MAX_CTXS).map(|_| CtxSlot::default()).collect(),
            streams: (0..MAX_STREAMS).map(|_| StreamSlot::default()).collect(),
            last_stream: AtomicUsize::new(0),
            fresh: AtomicBool::new(false),
            active_at: AtomicU64::new(0),
            submitting: AtomicU32::new(0),
            capturing: AtomicBool::new(false),
            turn: Mutex::new(()),
            releasing: AtomicBool::new(false),
            deep: AtomicBool::new(true),
            stopped: Mutex::new(false),
            wake: Condvar::new(),
            events: Mutex::default(),
        });
        let metering = shared.clone();
        let meter = std::thread::Builder::new()
            .name("gpuplex-meter".into())
            .spawn(move || meter(&metering))
            .map_err(|e| warn!("the session's GPU time will not be measured: {e}"))
            .ok();
        Seat { shared, meter: Mutex::new(meter) }
    }

    /// A context that came to life on backend device `ordinal`; its
    /// default stream is timed.
    pub fn context(&self, ctx: Obj, ordinal: i32) {
        let s = &self.shared;
        let gpu = usize::try_from(ordinal).ok().and_then(|o| s.gpus.get(o)).map_or(u32::MAX, |&g| g as u32);
        match s.ctxs.iter().find(|c| c.ctx.load(Relaxed) == 0) {
            Some(slot) => {
                slot.gpu.store(gpu, Relaxed);
                slot.ctx.store(ctx.0, Release);
            }
            None => warn!("more than {MAX_CTXS} contexts: work on the others is neither gated nor timed"),
        }
        self.stream(ctx, LEGACY);
    }

    pub fn stream(&self, ctx: Obj, stream: Obj) {
        let stream = default_as_legacy(stream);
        let s = &self.shared;
        match s.streams.iter().find(|t| t.stream.load(Relaxed) == 0) {
            Some(slot) => {
                slot.fresh.store(0, Relaxed);
                slot.ctx.store(ctx.0, Relaxed);
                slot.stream.store(stream.0, Release);
            }
            None => debug!("more than {MAX_STREAMS} streams: work on the others is not timed"),
        }
    }

    /// Before a stream is destroyed. Its events belong to the context and
    /// stay until the meter next looks, so this never waits for the meter.
    pub fn stream_gone(&self, ctx: Obj, stream: Obj) {
        let stream = default_as_legacy(stream);
        for slot in &self.shared.streams {
            if slot.ctx.load(Relaxed) == ctx.0 && slot.stream.load(Relaxed) == stream.0 {
                slot.stream.store(0, Release);
            }
        }
    }

    /// Before a context is destroyed, with its streams: waits for a look
    /// under way, and destroys the meter's events in it.
    pub fn context_gone(&self, ctx: Obj) {
        let s = &self.shared;
        let mut events = s.lock_events();
        for slot in s.streams.iter().filter(|t| t.ctx.load(Relaxed) == ctx.0) {
            slot.stream.store(0, Release);
        }
        let theirs: Vec<usize> = events.iter().filter(|(_, e)| e.ctx == ctx).map(|(&i, _)| i).collect();
        for i in theirs {
            let e = events.remove(&i).expect("listed above");
            s.destroy(e);
        }
        for slot in s.ctxs.iter().filter(|c| c.ctx.load(Relaxed) == ctx.0) {
            slot.ctx.store(0, Release);
        }
    }

    /// Runs `submit`, which puts `work` on `stream` of `ctx`, once the
    /// policy lets the session use the context's GPU.
    pub fn submit<T>(&self, ctx: Obj, stream: Obj, work: Work, submit: impl FnOnce() -> T) -> T {
        let s = &self.shared;
        // Work the policy does not gate may share the GPU with another
        // session's, so a hand-over need not wait for it: it is not counted
        // in `submitting`, which spares a small copy two locked operations.
        let gpu = if s.gates(work) { s.gpu_of(ctx) } else { None };
        if let Some(gpu) = gpu {
            s.pass_gate(gpu);
        }
        let slot = s.stream_slot(ctx, default_as_legacy(stream));
        // The clock is read only where its time is kept (most submissions
        // find their stream marked already): on a VM a clock read is a good
        // part of what this costs a launch.
        let started = slot.is_none_or(|i| s.streams[i].fresh.load(Relaxed) == 0).then(now_ns);
        let result = submit();
        match slot {
            // Work the meter does not time: only this says the session is active.
            None => s.active_at.store(started.unwrap_or_else(now_ns), Relaxed),
            Some(i) => s.mark_fresh(i, work, started),
        }
        // Either way the meter must be awake: the session may have just
        // taken a turn, which only the meter gives up when it goes unused.
        s.wake_meter();
        if gpu.is_some() {
            s.submitting.fetch_sub(1, SeqCst);
        }
        result
    }

    /// Stops the meter and gives up every turn, before the session's
    /// contexts go.
    /// While a stream of the session captures, the meter records no events
    /// and a hand-over waits for no work: captured work does not run, and
    /// the driver would take an event recorded on the stream into the
    /// capture, or fail it for a wait from another thread. Turned on before
    /// the capture begins, and only once a look or hand-over under way is over.
    pub fn set_capturing(&self, on: bool) {
        let s = &self.shared;
        if s.capturing.swap(on, SeqCst) != on && on {
            drop(s.lock_events());
            drop(s.lock_turn());
        }
    }

    pub fn stop(&self) {
        *self.shared.stopped.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.shared.wake.notify_all();
        let meter = self.meter.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(meter) = meter {
            let _ = meter.join();
        }
        // The work since the meter's last look counts too.
        if self.shared.fresh.swap(false, SeqCst) {
            look(&self.shared);
        }
        let mut events = self.shared.lock_events();
        for (_, e) in events.drain() {
            self.shared.destroy(e);
        }
        self.shared.board.vacate(self.shared.seat);
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `CU_STREAM_LEGACY`: each context's default stream.
const LEGACY: Obj = Obj(1);

/// The NULL stream is the legacy default stream (and 0 marks a free slot).
fn default_as_legacy(stream: Obj) -> Obj {
    if stream.0 == 0 {
        LEGACY
    } else {
        stream
    }
}

impl Shared {
    /// Tells the meter that stream slot `i` has new work, submitted at
    /// `started` if the caller read the clock.
    fn mark_fresh(&self, i: usize, work: Work, started: Option<u64>) {
        let bit = if work == Work::Compute { COMPUTE } else { COPY };
        let t = &self.streams[i];
        // The first work since the meter's last look starts its span.
        // Work after it needs no mark of its own: the look that takes
        // the bit records its event after this work.
        if t.fresh.load(Relaxed) & bit == 0 && t.fresh.fetch_or(bit, Release) == 0 {
            t.since.store(started.unwrap_or_else(now_ns), Relaxed);
        }
    }

    /// Marks the session fresh, waking its meter if it sleeps until then.
    fn wake_meter(&self) {
        if self.fresh.load(Relaxed) {
            return;
        }
        // Either this sees the meter going to sleep or the meter sees this
        // store before it sleeps (both sequentially consistent). The meter
        // checks `fresh` and then sleeps under the lock: taken before the
        // notice, it cannot fall between the two and be lost.
        self.fresh.store(true, SeqCst);
        if self.deep.load(SeqCst) {
            drop(self.stopped.lock().unwrap_or_else(PoisonError::into_inner));
            self.wake.notify_one();
        }
    }

    fn lock_events(&self) -> MutexGuard<'_, HashMap<usize, Events>> {
        self.events.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn destroy(&self, e: Events) {
        for ev in [e.last, e.spare].into_iter().flatten() {
            let _ = self.backend.event_destroy(e.ctx, ev);
        }
    }

    fn gpu_of(&self, ctx: Obj) -> Option<usize> {
        let slot = self.ctxs.iter().find(|c| c.ctx.load(Acquire) == ctx.0)?;
        Some(slot.gpu.load(Relaxed) as usize).filter(|&g| g < MAX_GPUS)
    }

    fn stream_slot(&self, ctx: Obj, stream: Obj) -> Option<usize> {
        let is = |i: usize| {
            let t = &self.streams[i];
            t.stream.load(Acquire) == stream.0 && t.ctx.load(Relaxed) == ctx.0
        };
        let last = self.last_stream.load(Relaxed);
        if is(last) {
            return Some(last);
        }
        let found = (0..MAX_STREAMS).find(|&i| is(i))?;
        self.last_stream.store(found, Relaxed);
        Some(found)
    }

    fn lock_turn(&self) -> MutexGuard<'_, ()> {
        self.turn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the policy holds `work` back until the session's turn.
    fn gates(&self, work: Work) -> bool {
        let policy = self.board.policy();
        self.gated && policy != Policy::None && (work == Work::Compute || policy == Policy::Band)
    }

    /// Returns once the session holds `gpu`, counted in `submitting`.
    fn pass_gate(&self, gpu: usize) {
        let board = &self.board;
        // The common case, a holder whose turn goes on, takes no lock.
        if board.holds(gpu, self.seat) && !self.turn_is_over(gpu) {
            self.submitting.fetch_add(1, SeqCst);
            if !self.releasing.load(SeqCst) && board.holds(gpu, self.seat) {
                return;
            }
            self.submitting.fetch_sub(1, SeqCst);
        }
        loop {
            if board.holds(gpu, self.seat) {
                if self.turn_is_over(gpu) {
                    self.hand_over(gpu);
                }
            } else if !board.try_take(gpu, self.seat) {
                board.wait_turn(gpu, self.seat);
            }
            let _turn = self.lock_turn();
            if board.holds(gpu, self.seat) {
                self.submitting.fetch_add(1, SeqCst);
                return;
            }
            // The meter gave the turn up meanwhile: wait for it again.
        }
    }

    /// Whether a waiter should have `gpu`, which this session holds: one of
    /// a higher class waits, or the slice is over and a waiter goes before
    /// this session (which otherwise starts a new slice).
    fn turn_is_over(&self, gpu: usize) -> bool {
        let board = &self.board;
        // Alone, as a session mostly is, the GPU's own line answers: every
        // submission asks, and its tenant's class lies on other pages.
        if board.gpu(gpu).waiting_total() == 0 {
            return false;
        }
        let (above, any) = board.waiters(gpu, board.class_of(self.seat));
        above || (any && board.held_for(gpu) >= board.slice() && !board.keep_turn(gpu, self.seat))
    }

    /// Lets the session's queued work on `gpu` finish, gives the turn to the
    /// next waiter, and waits for it to come back.
    fn hand_over(&self, gpu: usize) {
        trace!(gpu, seat = self.seat, "handing the turn over at a submission");
        self.give_up(gpu);
        self.board.wait_turn(gpu, self.seat);
    }

    /// Gives up `gpu` once the session's work on it has finished: work of
    /// its other threads that passed the gate, then everything queued.
    fn give_up(&self, gpu: usize) {
        let _turn = self.lock_turn();
        self.releasing.store(true, SeqCst);
        while self.submitting.load(SeqCst) > 0 {
            std::thread::yield_now();
        }
        self.board.heads_up(gpu, self.seat);
        self.drain(gpu);
        self.board.release(gpu, self.seat);
        self.releasing.store(false, SeqCst);
    }

    fn drain(&self, gpu: usize) {
        if self.capturing.load(SeqCst) {
            return;
        }
        for c in &self.ctxs {
            let ctx = c.ctx.load(Acquire);
            if ctx != 0 && c.gpu.load(Relaxed) as usize == gpu {
                // A failure is the guest's to see at its own synchronize.
                let _ = self.backend.ctx_synchronize(Obj(ctx));
            }
        }
    }

    /// The GPUs this session has contexts on or holds the turn of, each
    /// once: a turn outlives the contexts whose work took it, and must
    /// still be given up.
    fn gpus(&self) -> impl Iterator<Item = usize> + '_ {
        let live = self.ctxs.iter().filter(|c| c.ctx.load(Relaxed) != 0);
        let mask = live.map(|c| c.gpu.load(Relaxed)).filter(|&g| (g as usize) < MAX_GPUS).fold(0u32, |m, g| m | 1 << g);
        (0..MAX_GPUS).filter(move |&g| mask & (1 << g) != 0 || self.board.holds(g, self.seat))
    }
}

fn meter(s: &Shared) {
    let since = |t: u64| Duration::from_nanos(now_ns().saturating_sub(t));
    // When the session's work was last timed, and when it was last seen
    // finished (a look waits for the work it times).
    let (mut looked, mut idle_since) = (now_ns(), now_ns());
    loop {
        // Work not yet timed keeps the meter awake until its look.
        let deep = !s.fresh.load(SeqCst) && since(idle_since) >= DEEP_AFTER && !holds_any(s);
        {
            let stopped = s.stopped.lock().unwrap_or_else(PoisonError::into_inner);
            if *stopped {
                return;
            }
            s.deep.store(deep, SeqCst);
            let stopped = if deep {
                s.wake
                    .wait_while(stopped, |stop| !*stop && !s.fresh.load(SeqCst))
                    .unwrap_or_else(PoisonError::into_inner)
            } else {
                let poll = if contended(s) { POLL } else { POLL_ALONE };
                s.wake.wait_timeout(stopped, poll).unwrap_or_else(PoisonError::into_inner).0
            };
            if *stopped {
                return;
            }
            s.deep.store(false, Release);
        }
        let due = contended(s) || since(looked) >= LOOK_ALONE;
        if due && s.fresh.swap(false, Acquire) {
            look(s);
            (looked, idle_since) = (now_ns(), now_ns());
        }
        give_up_unused_turns(s, idle_since);
    }
}

/// Whether another session waits for a GPU this one uses.
fn contended(s: &Shared) -> bool {
    s.gpus().any(|g| s.board.gpu(g).waiting_total() > 0)
}

fn holds_any(s: &Shared) -> bool {
    s.gpus().any(|g| s.board.holds(g, s.seat))
}

/// Times the work submitted since the last look.
fn look(s: &Shared) {
    let mut events = s.lock_events();
    if s.capturing.load(SeqCst) {
        // Work submitted meanwhile goes untimed.
        for t in &s.streams {
            t.fresh.store(0, Relaxed);
        }
        return;
    }
    // Record an event after each stream's new work.
    let mut marked = Vec::new();
    for (i, t) in s.streams.iter().enumerate() {
        let kinds = t.fresh.swap(0, Acquire);
        let stream = t.stream.load(Acquire);
        if kinds == 0 || stream == 0 {
            continue;
        }
        let ctx = Obj(t.ctx.load(Relaxed));
        let e = events.entry(i).or_insert_with(|| Events { ctx, stream, ..Events::default() });
        if (e.ctx, e.stream) != (ctx, stream) {
            // The slot now holds another stream: its last event says
            // nothing about this one.
            let old = std::mem::replace(e, Events { ctx, stream, ..Events::default() });
            s.destroy(old);
        }
        let ev = match e.spare.take() {
            Some(ev) => ev,
            None => match s.backend.event_create(ctx, BLOCKING_SYNC) {
                Ok(ev) => ev,
                Err(_) => continue,
            },
        };
        if s.backend.event_record(ctx, ev, Obj(stream), 0).is_err() {
            e.spare = Some(ev);
            continue;
        }
        let gpu = s.gpu_of(ctx);
        marked.push((i, ev, kinds, t.since.load(Relaxed), gpu));
    }
    if marked.is_empty() {
        return;
    }
    let slot = s.account.slot();
    slot.running_since.store(marked.iter().map(|m| m.3).min().unwrap_or(0), Relaxed);
    let mut per_gpu = [(0u64, 0u64, u64::MAX); MAX_GPUS];
    for (i, ev, kinds, since, gpu) in marked {
        let e = events.get_mut(&i).expect("inserted above");
        let done = s.backend.event_synchronize(e.ctx, ev).is_ok();
        let seen = now_ns();
        let span = seen.saturating_sub(since);
        let ns = match e.last {
            Some(last) if done => match s.backend.event_elapsed(e.ctx, last, ev) {
                Ok(ms) if ms >= 0.0 => ((ms as f64 * 1e6) as u64).min(span),
                _ => span,
            },
            _ => span,
        };
        e.spare = e.last.replace(ev);
        if let Some(g) = gpu {
            let p = &mut per_gpu[g];
            if kinds & COMPUTE != 0 {
                p.0 += ns
            } else {
                p.1 += ns
            }
            p.2 = p.2.min(since);
        }
    }
    drop(events);
    slot.running_since.store(0, Relaxed);
    let now = now_ns();
    for (gpu, &(compute, copy, since)) in per_gpu.iter().enumerate() {
        if compute + copy == 0 {
            continue;
        }
        // Streams that ran side by side are not more time than went by.
        let wall = now.saturating_sub(since).max(1);
        let scale = |ns: u64| if compute + copy > wall { ns * wall / (compute + copy) } else { ns };
        let (compute, copy) = (scale(compute), scale(copy));
        s.board.charge(s.row, gpu, Work::Compute, compute);
        s.board.charge(s.row, gpu, Work::Copy, copy);
        slot.compute_ns.fetch_add(compute, Relaxed);
        slot.copy_ns.fetch_add(copy, Relaxed);
    }
}

/// Gives up the turn on each GPU the session holds but does not use.
fn give_up_unused_turns(s: &Shared, idle_since: u64) {
    if s.fresh.load(Acquire) || s.submitting.load(SeqCst) > 0 {
        return;
    }
    let board = &s.board;
    let active = idle_since.max(s.active_at.load(Relaxed));
    let idle = Duration::from_nanos(now_ns().saturating_sub(active));
    for gpu in s.gpus().filter(|&g| board.holds(g, s.seat)) {
        if idle >= IDLE_GRACE || s.turn_is_over(gpu) {
            trace!(gpu, seat = s.seat, idle = ?idle, "giving up the turn from the meter");
            s.give_up(gpu);
        }
    }
}
