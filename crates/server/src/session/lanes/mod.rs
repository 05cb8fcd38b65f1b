//! Bulk lanes: more connections that carry a session's large copies when it
//! shares no memory with its client (TCP, or a Unix socket by choice).
//!
//! One stream socket moves a few GB/s: each byte is copied into the kernel
//! by one thread and out of it by another. So a session spreads large
//! copies over several connections, its lanes, in fixed-size chunks. Each
//! lane has a reader and a writer thread here, and a thread in the client,
//! that only move bytes between the socket and pinned slots; every CUDA
//! call stays on the session's thread, so a copy keeps its exact place in
//! its stream. The session DMAs chunks in small batches, each issued in
//! one driver call and marked by an event it checks between chunks, so a
//! slot goes back to its lane as soon as its DMA is done while the copy
//! engine still has work queued (`batches.rs`).
//!
//! Chunks go on whichever lane is ready first, not in turn: host to device
//! the client's lane threads each take the next chunk of the copy, and the
//! session DMAs chunks in the order they arrive, each to its own place;
//! device to host the session DMAs chunks into any free out slot and puts
//! each finished one in an outbox, where the first writer whose lane is
//! ready takes it (`outbox.rs`), a copy cut with small chunks at its ends
//! (`lane::Cut`). Lanes on one machine are far from equal, and in turn they
//! would all wait for the slowest.
//!
//! Device to host, a writer splices its slot's pages into the socket
//! (`vmsplice`) instead of copying them, as the client does the other way:
//! on a loopback the client's read is then the only CPU copy. The slot is
//! lent until the client's receipt for that chunk comes back on the lane
//! (the reader takes it, frees the slot and tells the writer, which keeps
//! at most `outbox::AHEAD` chunks unanswered); with no slot free, the
//! session passes out its oldest batch of DMAs once done, so the client
//! can answer them. The other way, a reader answers each chunk it has read
//! with a receipt, and a client lane sends its next chunk only then
//! (`lane::AHEAD`). How each choice measured: `docs/performance.md`.
//!
//! Joining: `OpenLanes` makes a [`Hub`] under a random key; each lane
//! connects like any client (over TCP, proving the token), and its first
//! frame, `JoinLane`, names the key and its index. It must come from the
//! session's own peer: the same process locally, the same host remotely.
//! A lane that closes, or sends anything but a chunk of the copy under way
//! that has not come already or the receipt for the oldest chunk it was
//! sent, ends its session, as a malformed frame would.

use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use gpuplex_protocol::lane::{ChunkHeader, Cut};
use gpuplex_protocol::{
    calls, codec, CallError, CuError, ErrorDetail, Header, LaneJoin, LaneOffer, LanesCalls, HOST_CALLS_LANE,
};
use gpuplex_transport::shm::Region;
use gpuplex_transport::{Carrier, Lane, Peer, Pipe, TransportError};
use tracing::{debug, warn};

use super::{host_calls::HostCalls, invalid, shared::register_once, Session};
use crate::backend::{Backend, HostCopy, Obj, Way};
use crate::sched::{Seat, Work};
use batches::{Batches, Fences};

/// Chunks from the device a lane's writer keeps unanswered.
pub use outbox::AHEAD as OUT_AHEAD;
use outbox::{Next, OutSlot, Outbox};

mod batches;
mod outbox;

pub type LaneKey = [u8; 32];

/// Lanes per session and bytes per chunk, unless `GPUPLEX_LANES` and
/// `GPUPLEX_LANE_CHUNK_KIB` say otherwise (the server reads them when a client
/// opens lanes). TCP itself is the limit, and host memory under it: 16 lanes
/// of 512 KiB moved the most over loopback, while each lane costs pinned slots
/// and three threads (measured in `docs/performance.md`, *Bulk lanes*).
const LANES: usize = 16;
const CHUNK_BYTES: usize = 512 << 10;
/// Pinned bytes per lane and direction, cut into chunk-sized slots (at
/// least two: one in a DMA while the lane moves the other). Out slots are
/// cut per lane but shared: any lane's writer sends from any of them.
/// Several small slots beat two large ones: a slot the lane just filled is
/// still in the cache when the DMA reads it.
const LANE_BYTES: usize = 2 << 20;

/// The largest copy the lanes carry: more than any device holds. A larger
/// one ends its session (its client's lanes would be out of step), rather
/// than have the session count that many chunks.
const MAX_COPY: u64 = 1 << 40;

/// A session's lanes as they join, shared with the lane connections.
pub struct Hub {
    pub session: u64,
    peer: Peer,
    slots: Arc<Slots>,
    joined: Mutex<Vec<Option<LaneEnd>>>,
    /// Cloned for each lane's reader and writer (see [`FromLane`]).
    filled: Sender<FromLane>,
    freed: Sender<FromLane>,
    /// Chunks from the device, for every lane's writer.
    outbox: Arc<Outbox>,
}

/// The pinned memory chunks land in and leave from: per lane, a few slots
/// for each direction (see [`LANE_BYTES`]).
struct Slots {
    region: Region,
    chunk: usize,
    lanes: usize,
    /// Per lane and direction.
    per_lane: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    In,
    Out,
}

/// How a session's lanes are cut: what the next `OpenLanes` gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub lanes: usize,
    pub chunk: usize,
    /// Slots per lane and direction: 2 MiB worth, at least two.
    pub slots: usize,
}

impl Shape {
    /// The defaults, or what `GPUPLEX_LANES` and `GPUPLEX_LANE_CHUNK_KIB` say.
    pub fn configured() -> Shape {
        let lanes = setting("GPUPLEX_LANES", LANES, 1..=32);
        let chunk = setting("GPUPLEX_LANE_CHUNK_KIB", CHUNK_BYTES >> 10, 64..=16 << 10) << 10;
        Shape { lanes, chunk, slots: (LANE_BYTES / chunk).max(2) }
    }
}

impl Slots {
    fn new(shape: Shape) -> std::io::Result<Slots> {
        let Shape { lanes, chunk, slots: per_lane } = shape;
        let region = Region::create("gpuplex-lanes", lanes * 2 * per_lane * chunk)?;
        Ok(Slots { region, chunk, lanes, per_lane })
    }

    fn ptr(&self, lane: usize, direction: Direction, slot: usize) -> *mut u8 {
        assert!(lane < self.lanes && slot < self.per_lane);
        let index = (lane * 2 + (direction == Direction::Out) as usize) * self.per_lane + slot;
        // SAFETY: the index is inside the region, by the assertion.
        unsafe { self.region.as_ptr().add(index * self.chunk) }
    }
}

/// From the lanes' threads to the session: an in slot of `lane`'s its
/// reader filled, an out slot free again (its chunk's receipt came, or its
/// failed chunk's header went), or word that the thread stopped.
enum FromLane {
    Filled { lane: usize, slot: usize, header: ChunkHeader },
    Free(OutSlot),
    Stopped(usize),
}

/// The session's end of one lane. Each slot belongs to exactly one side at
/// a time, passed over these channels, the hub's and its outbox.
struct LaneEnd {
    lane: Lane,
    free_in: Sender<usize>,
}

/// The lanes as the session uses them.
pub struct Lanes {
    hub: Arc<Hub>,
    /// Taken from the hub by the first copy, once every lane has joined.
    ends: Vec<LaneEnd>,
    /// What every reader filled, in the order they did.
    filled: Receiver<FromLane>,
    /// The out slots the lanes freed, in the order they did.
    freed: Receiver<FromLane>,
    /// The out slots taken off `freed` (at first, all of them), not yet
    /// used; the last freed is used first, while it may still be cached.
    free_out: Vec<OutSlot>,
    /// Per lane, its in slots the session holds (in a batch).
    held_in: Vec<usize>,
    /// The context the slots are registered from, if any.
    registered: Option<Obj>,
    /// The events that mark batches done, made in the registered context.
    fences: Option<Fences>,
    /// Why the lanes can no longer be trusted; ends the session.
    lost: Option<String>,
}

/// Every live session's hub and host-call endpoint, by key.
#[derive(Default)]
pub struct Hubs {
    lanes: Mutex<HashMap<LaneKey, Arc<Hub>>>,
    host_calls: Mutex<HashMap<LaneKey, Arc<HostCalls>>>,
}

impl Hubs {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<LaneKey, Arc<Hub>>> {
        self.lanes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(in crate::session) fn host_calls(&self) -> std::sync::MutexGuard<'_, HashMap<LaneKey, Arc<HostCalls>>> {
        self.host_calls.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Forgets the hubs and host calls of a session that ended.
    pub fn close(&self, session: u64) {
        self.lock().retain(|_, hub| hub.session != session);
        self.host_calls().retain(|_, calls| calls.session != session);
    }
}

fn setting(name: &str, default: usize, range: std::ops::RangeInclusive<usize>) -> usize {
    match std::env::var(name).ok().map(|v| v.parse::<usize>()) {
        None => default,
        Some(Ok(v)) if range.contains(&v) => v,
        Some(_) => {
            warn!("{name} must be a number in {range:?}; using {default}");
            default
        }
    }
}

/// A fresh key for a session's lanes, from the kernel's random source.
pub fn random_key() -> std::io::Result<LaneKey> {
    let mut key = [0u8; 32];
    let mut filled = 0;
    while filled < key.len() {
        // SAFETY: writes at most the rest of `key`.
        let n = unsafe { libc::getrandom(key[filled..].as_mut_ptr().cast(), key.len() - filled, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
            continue;
        }
        filled += n as usize;
    }
    Ok(key)
}

impl Lanes {
    /// Answers `OpenLanes`: the hub lanes join under `key` (which the
    /// supervisor gave the session, so that it can route lanes to it), and
    /// the offer for the client.
    pub fn open(session: u64, peer: Peer, key: LaneKey, hubs: &Hubs) -> Result<(Lanes, LaneOffer), CallError> {
        let shape = Shape::configured();
        let (count, chunk) = (shape.lanes, shape.chunk);
        let out_of_memory = |e: std::io::Error| CallError::new(CuError::OUT_OF_MEMORY, format!("lane slots: {e}"));
        let slots = Arc::new(Slots::new(shape).map_err(out_of_memory)?);
        let ((filled_tx, filled), (freed_tx, freed)) = (channel(), channel());
        let joined = Mutex::new((0..count).map(|_| None).collect());
        let free_out = (0..count).flat_map(|l| (0..shape.slots).map(move |slot| (l, slot))).collect();
        let outbox = Arc::default();
        let hub = Arc::new(Hub { session, peer, slots, joined, filled: filled_tx, freed: freed_tx, outbox });
        hubs.lock().insert(key, hub.clone());
        let offer = LaneOffer { key, lanes: count as u32, chunk_bytes: chunk as u64 };
        let lanes = Lanes {
            hub,
            ends: Vec::new(),
            filled,
            freed,
            free_out,
            held_in: vec![0; count],
            registered: None,
            fences: None,
            lost: None,
        };
        Ok((lanes, offer))
    }

    /// Why the session must end, if a lane failed it.
    pub fn lost(&self) -> Option<&str> {
        self.lost.as_deref()
    }

    fn lose(&mut self, why: String) -> CallError {
        warn!("lanes lost: {why}");
        self.lost.get_or_insert(why);
        CallError::new(CuError::DEVICE_UNAVAILABLE, "a lane failed; the session ends")
    }

    /// Every lane's end; the client opens them all before any copy.
    fn ends(&mut self) -> Result<(), CallError> {
        if self.ends.is_empty() {
            let mut joined = self.hub.joined.lock().unwrap_or_else(PoisonError::into_inner);
            if joined.iter().any(Option::is_none) {
                drop(joined);
                return Err(self.lose("a copy came before every lane had joined".into()));
            }
            self.ends = joined.iter_mut().filter_map(Option::take).collect();
        }
        Ok(())
    }

    /// Readies a copy of `size` bytes: every lane's end, and the slots
    /// registered from the target's context. The inner result is the copy's
    /// outcome so far (the target's own error, if it has one); the outer
    /// one, lost lanes, or a copy over [`MAX_COPY`], which ends the session.
    fn start(
        &mut self,
        backend: &dyn Backend,
        target: &Result<(Obj, Obj), CallError>,
        size: u64,
    ) -> Result<Result<(), CallError>, CallError> {
        if size > MAX_COPY {
            return Err(self.lose(format!("a copy of {size} bytes: more than any device holds")));
        }
        self.ends()?;
        let (ctx, _) = match target {
            Ok(target) => *target,
            Err(e) => return Ok(Err(e.clone())),
        };
        let region = &self.hub.slots.region;
        // SAFETY: the region lives in the hub until teardown unregisters it.
        let registered = unsafe { register_once(backend, ctx, &mut self.registered, region.as_ptr(), region.len()) };
        Ok(registered.and_then(|()| self.fences_in(backend, ctx)))
    }

    /// Makes the lanes' stream and batch events in `ctx`, unless they are
    /// there already.
    fn fences_in(&mut self, backend: &dyn Backend, ctx: Obj) -> Result<(), CallError> {
        if self.fences.as_ref().is_some_and(|f| f.ctx == ctx) {
            return Ok(());
        }
        if let Some(old) = self.fences.take() {
            old.destroy(backend);
        }
        self.fences = Some(Fences::new(backend, ctx)?);
        Ok(())
    }

    /// Host to device: takes every chunk of `copy` off the lanes, as they
    /// come, and DMAs each from its slot to its place in `dst`, after what
    /// `target`'s stream holds, unless the copy already failed. Complete on
    /// return.
    pub fn htod(
        &mut self,
        backend: &dyn Backend,
        target: Result<(Obj, Obj), CallError>,
        dst: u64,
        size: u64,
        copy: u64,
    ) -> Result<(), CallError> {
        let mut outcome = self.start(backend, &target, size)?;
        let cut = Cut::to_device(size, self.hub.slots.chunk as u64);
        let mut arrived = vec![false; cut.count() as usize];
        let mut batches = Batches::new(backend, &target, self.fences.as_ref());
        let (started, mut first) = (Instant::now(), None);
        for _ in 0..arrived.len() {
            let (l, slot, header) = self.next_filled(&mut batches, &mut outcome)?;
            first.get_or_insert_with(|| started.elapsed());
            self.held_in[l] += 1;
            let Some(i) = header.index_in(copy, &cut) else {
                return Err(self.lose(format!("lane {l} sent {header:?}, no chunk of copy {copy} ({size} bytes)")));
            };
            if std::mem::replace(&mut arrived[i as usize], true) {
                return Err(self.lose(format!("lane {l} sent chunk {i} of copy {copy} again")));
            }
            let (offset, len) = (header.offset.get(), header.length.get());
            if outcome.is_ok() && target.is_ok() {
                let host = self.hub.slots.ptr(l, Direction::In, slot);
                let dma = HostCopy { way: Way::ToDevice, device: dst + offset, host, len: len as usize };
                // SAFETY: a registered slot holding `len` <= chunk bytes,
                // handed back only once the batches return it.
                let done = unsafe { batches.push((l, slot), Some(dma), &mut outcome) };
                self.hand_back_all_in(done);
            } else {
                self.hand_back_in(l, slot);
            }
        }
        let last = started.elapsed();
        let done = batches.finish(&mut outcome);
        self.hand_back_all_in(done);
        debug!(copy, size, first = ?first, last = ?last, done = ?started.elapsed(), "lanes: host to device");
        outcome
    }

    /// The next chunk any reader filled. Before waiting for one, it hands
    /// back the slots of finished DMAs and makes sure that every lane has a
    /// slot to read into: a lane whose slots are all in batches could hold
    /// the very chunk waited for.
    fn next_filled(
        &mut self,
        batches: &mut Batches<(usize, usize)>,
        outcome: &mut Result<(), CallError>,
    ) -> Result<(usize, usize, ChunkHeader), CallError> {
        let next = match self.filled.try_recv() {
            Ok(next) => next,
            Err(_) => {
                let mut done = batches.seal(outcome);
                done.append(&mut batches.done(outcome));
                self.hand_back_all_in(done);
                if self.held_in.iter().any(|&held| held == self.hub.slots.per_lane) {
                    let done = batches.finish(outcome);
                    self.hand_back_all_in(done);
                }
                // The hub holds a sender: this never disconnects.
                self.filled.recv().unwrap_or(FromLane::Stopped(usize::MAX))
            }
        };
        match next {
            FromLane::Filled { lane, slot, header } => Ok((lane, slot, header)),
            FromLane::Stopped(l) => Err(self.lose(format!("lane {l} closed mid-copy"))),
            FromLane::Free(_) => unreachable!("only readers send here"),
        }
    }

    fn hand_back_in(&mut self, l: usize, slot: usize) {
        self.held_in[l] -= 1;
        // A reader that is gone shows as `Stopped` when chunks are next awaited.
        let _ = self.ends[l].free_in.send(slot);
    }

    fn hand_back_all_in(&mut self, done: Vec<(usize, usize)>) {
        for (l, slot) in done {
            self.hand_back_in(l, slot);
        }
    }

    /// Device to host: DMAs chunks into free out slots, and passes each
    /// batch to the writers once its DMAs are done (the first writer ready
    /// takes each chunk); then tells them that the copy has ended. Every
    /// chunk is sent, failed ones as a bare header with the copy's error.
    pub fn dtoh(
        &mut self,
        backend: &dyn Backend,
        target: Result<(Obj, Obj), CallError>,
        src: u64,
        size: u64,
        copy: u64,
    ) -> Result<(), CallError> {
        let mut outcome = self.start(backend, &target, size)?;
        let mut batches = Batches::new(backend, &target, self.fences.as_ref());
        let started = Instant::now();
        let cut = Cut::from_device(size, self.hub.slots.chunk as u64, self.hub.slots.lanes as u64);
        for (_, offset, len) in cut.chunks() {
            let (l, slot) = loop {
                self.take_free_out(false)?;
                if let Some(free) = self.free_out.pop() {
                    break free;
                }
                // Every slot is in a batch, in the outbox, or lent until
                // the client's receipt. Pass the oldest batch out once its
                // DMAs are done (not all of them: more DMAs may queue
                // behind it meanwhile), so the client can read and answer
                // it; with none issued, wait for a receipt.
                if batches.is_empty() {
                    self.take_free_out(true)?;
                } else {
                    let done = batches.wait_oldest(&mut outcome);
                    self.pass_out(done, &outcome);
                }
            };
            let host = self.hub.slots.ptr(l, Direction::Out, slot);
            let dma = HostCopy { way: Way::FromDevice, device: src + offset, host, len: len as usize };
            // SAFETY: a registered slot with room for `len` <= chunk bytes,
            // not given to the writer before the batches return it.
            let done =
                unsafe { batches.push(((l, slot), ChunkHeader::new(copy, offset, len)), Some(dma), &mut outcome) };
            self.pass_out(done, &outcome);
        }
        let done = batches.finish(&mut outcome);
        self.pass_out(done, &outcome);
        debug!(copy, size, done = ?started.elapsed(), "lanes: device to host");
        self.hub.outbox.end(copy);
        // A writer that stopped meanwhile would never end its lane's share.
        self.take_free_out(false)?;
        outcome
    }

    /// Takes the out slots the lanes freed off their channel: those freed
    /// already, and if `wait`, at least one.
    fn take_free_out(&mut self, wait: bool) -> Result<(), CallError> {
        let mut next = if wait { self.freed.recv().ok() } else { self.freed.try_recv().ok() };
        while let Some(freed) = next {
            match freed {
                FromLane::Free(slot) => self.free_out.push(slot),
                FromLane::Stopped(l) => return Err(self.lose(format!("lane {l} closed mid-copy"))),
                FromLane::Filled { .. } => unreachable!("only writers send here"),
            }
            next = self.freed.try_recv().ok();
        }
        Ok(())
    }

    /// Gives chunks whose DMAs are done to the writers, marked failed if
    /// the copy has failed.
    fn pass_out(&self, done: Vec<(OutSlot, ChunkHeader)>, outcome: &Result<(), CallError>) {
        for (slot, header) in done {
            let header = match outcome {
                Ok(()) => header,
                Err(e) => header.failed(e.code.0),
            };
            self.hub.outbox.put(slot, header);
        }
    }

    /// Forgets a registration that died with its context.
    pub fn context_gone(&mut self, ctx: Obj) {
        if self.registered == Some(ctx) {
            self.registered = None;
        }
        if self.fences.as_ref().is_some_and(|f| f.ctx == ctx) {
            self.fences = None;
        }
    }

    /// Stops the writers, unregisters the slots and closes every lane.
    /// (The registry forgets the hub when the session closes.)
    pub fn teardown(&mut self, backend: &dyn Backend) {
        self.hub.outbox.close();
        if let Some(fences) = self.fences.take() {
            fences.destroy(backend);
        }
        if let Some(ctx) = self.registered.take() {
            if let Err(e) = backend.host_unregister(ctx, self.hub.slots.region.as_ptr()) {
                warn!("teardown: lane slots unregister failed: {e}");
            }
        }
        let joined = self.hub.joined.lock().unwrap_or_else(PoisonError::into_inner);
        for end in self.ends.iter().chain(joined.iter().flatten()) {
            end.lane.shutdown();
        }
    }
}

/// Whether a lane may join a session: the same process locally, the same
/// host remotely, the same virtual machine (whose processes are one tenant).
pub(super) fn same_origin(session: Peer, lane: Peer) -> bool {
    match (session, lane) {
        (Peer::Local { pid, .. }, Peer::Local { pid: lane_pid, .. }) => pid == lane_pid,
        (Peer::Remote(a), Peer::Remote(b)) => a.ip() == b.ip(),
        (Peer::Vm { region: a, .. }, Peer::Vm { region: b, .. }) => a == b,
        _ => false,
    }
}

/// Serves a connection whose first frame was `JoinLane`: joins it to its
/// session's hub, then reads chunks on this thread (a writer thread sends)
/// until the lane or the session ends.
pub fn run_lane(mut carrier: Box<dyn Carrier>, header: &Header, join: LaneJoin, hubs: &Hubs) {
    if join.index == HOST_CALLS_LANE {
        return super::host_calls::join(carrier, header, &join, hubs);
    }
    let peer = carrier.peer();
    let hub = hubs.lock().get(&join.key).cloned();
    let refuse = |carrier: &mut dyn Carrier, why: &str| {
        warn!(%peer, "refused a lane: {why}");
        let payload = codec::encode(&ErrorDetail { detail: why.into() });
        let _ = carrier.send(&Header::reply(header, CuError::INVALID_VALUE.0, payload.len()), &payload);
    };
    let Some(hub) = hub else { return refuse(carrier.as_mut(), "no session has that lane key") };
    if !same_origin(hub.peer, peer) {
        return refuse(carrier.as_mut(), "a lane must come from its session's own peer");
    }
    let index = join.index as usize;
    if index >= hub.slots.lanes {
        return refuse(carrier.as_mut(), "no such lane");
    }
    let lane = match carrier.into_lane() {
        Ok(lane) => lane,
        Err(e) => return warn!(%peer, "cannot make a lane: {}", crate::chain(&e)),
    };
    let span = tracing::info_span!("lane", session = hub.session, index);
    let _enter = span.enter();
    match attach(&hub, index, &lane) {
        Ok(reading) => {
            // However the reading ends, the session hears of it, whichever
            // way it copies: its out slots come back through here too.
            let (filled, freed) = (hub.filled.clone(), hub.freed.clone());
            let _farewell = Farewell(move || {
                let _ = filled.send(FromLane::Stopped(index));
                let _ = freed.send(FromLane::Stopped(index));
            });
            let ok = lane.send_frame(&Header::reply(header, 0, 0), &[]);
            let read = ok.and_then(|()| read_chunks(&lane, &hub, index, reading));
            match read {
                Ok(()) => debug!("lane closed"),
                Err(e) => warn!("lane failed: {}", crate::chain(&e)),
            }
        }
        Err(why) => {
            warn!(%peer, "refused a lane: {why}");
            let payload = codec::encode(&ErrorDetail { detail: why.into() });
            let _ = lane.send_frame(&Header::reply(header, CuError::INVALID_VALUE.0, payload.len()), &payload);
        }
    }
    // Whatever ended the reading, the session learns it from the closed channel.
    lane.shutdown();
}

/// Runs its closure when dropped: how a lane's thread tells the session it
/// stopped, even by a panic.
struct Farewell<F: FnMut()>(F);

impl<F: FnMut()> Drop for Farewell<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

/// Starts the lane's writer and gives the session its end; returns what
/// the reader needs.
fn attach(hub: &Hub, index: usize, lane: &Lane) -> Result<Reading, &'static str> {
    let mut joined = hub.joined.lock().unwrap_or_else(PoisonError::into_inner);
    if joined[index].is_some() {
        return Err("that lane has joined already");
    }
    let (free_in, reader_free) = channel();
    let (lend, lent) = channel();
    let (answer, answered) = channel();
    for slot in 0..hub.slots.per_lane {
        free_in.send(slot).expect("receiver held here");
    }
    let shared = |_| "cannot share the lane's socket";
    let sender = Arc::new(Mutex::new(lane.try_clone().map_err(shared)?));
    let session_side = lane.try_clone().map_err(shared)?;
    let writing = Writing {
        sender: sender.clone(),
        slots: hub.slots.clone(),
        index,
        outbox: hub.outbox.clone(),
        answered,
        freed: hub.freed.clone(),
        lend,
    };
    std::thread::Builder::new()
        .name("gpuplex-lane-out".into())
        .spawn(move || write_chunks(writing))
        .map_err(|_| "cannot start the lane's writer")?;
    joined[index] = Some(LaneEnd { lane: session_side, free_in });
    Ok(Reading { free: reader_free, lent, answer, sender })
}

/// What a lane's reader needs besides the lane: its free in slots, the out
/// slots its writer lent, word to its writer of each receipt, and the
/// sending side, shared with the writer, to answer chunks with.
struct Reading {
    free: Receiver<usize>,
    lent: Receiver<Lent>,
    answer: Sender<()>,
    sender: Arc<Mutex<Lane>>,
}

/// An out slot whose chunk the kernel may still be reading, until the
/// client's receipt for it comes.
struct Lent {
    slot: OutSlot,
    header: ChunkHeader,
}

/// Reads what the client sends on the lane: chunks of copies to the device,
/// each into a free in slot and answered with a receipt, and receipts for
/// the chunks from the device, each freeing the out slot lent longest.
fn read_chunks(lane: &Lane, hub: &Hub, index: usize, reading: Reading) -> Result<(), TransportError> {
    let (slots, Reading { free, lent, answer, sender }) = (&hub.slots, reading);
    loop {
        let header = match lane.recv_header() {
            Err(TransportError::Closed) => return Ok(()),
            other => other?,
        };
        if header.is_receipt() {
            // The writer lends a slot before it sends; the client can only
            // answer what it has read, so a receipt finds its slot here.
            let Some(Lent { slot, .. }) = lent.try_recv().ok().filter(|l| header.acknowledges(&l.header)) else {
                return Err(TransportError::Chunk);
            };
            if hub.freed.send(FromLane::Free(slot)).is_err() || answer.send(()).is_err() {
                return Ok(());
            }
            continue;
        }
        let len = header.payload_len();
        if header.status.get() != 0 || len > slots.chunk as u64 {
            return Err(TransportError::Chunk);
        }
        let Ok(slot) = free.recv() else { return Ok(()) };
        // SAFETY: the slot is this reader's until it passes it on below,
        // and `len` fits it.
        let buf = unsafe { std::slice::from_raw_parts_mut(slots.ptr(index, Direction::In, slot), len as usize) };
        lane.recv_exact(buf)?;
        // The client sends another chunk on this lane only for a receipt.
        // (The writer has nothing to send meanwhile, unless the client
        // sends chunks before it has read the last copy's.)
        let receipt = ChunkHeader::receipt(header.copy.get(), header.offset.get());
        sender.lock().unwrap_or_else(PoisonError::into_inner).send_chunk(&receipt, &[])?;
        if hub.filled.send(FromLane::Filled { lane: index, slot, header }).is_err() {
            return Ok(());
        }
    }
}

/// What a lane's writer needs: the sending side (shared with the reader),
/// the slots, where finished chunks wait, word of each receipt, and where
/// to give back a failed chunk's slot.
struct Writing {
    sender: Arc<Mutex<Lane>>,
    slots: Arc<Slots>,
    index: usize,
    outbox: Arc<Outbox>,
    answered: Receiver<()>,
    freed: Sender<FromLane>,
    lend: Sender<Lent>,
}

/// Sends chunks from the outbox while its lane has fewer than
/// [`outbox::AHEAD`] unanswered, and ends the lane's share of each copy. A
/// chunk's bytes go by reference to its slot's pages (`vmsplice`) where the
/// kernel allows it, so the slot is lent until the client's receipt, which
/// the reader takes; a failed chunk's slot carries nothing and is given
/// back at once.
fn write_chunks(w: Writing) {
    let (index, stopped) = (w.index, w.freed.clone());
    let _farewell = Farewell(move || drop(stopped.send(FromLane::Stopped(index))));
    gpuplex_transport::block_sigpipe_on_this_thread();
    let pipe = Pipe::new(w.slots.chunk).map_err(|e| debug!("lane writer copies what it sends: no vmsplice ({e})")).ok();
    let (mut unanswered, mut ended) = (0, 0);
    loop {
        unanswered -= w.answered.try_iter().count();
        if unanswered == outbox::AHEAD {
            // The reader is gone when its end of the channel is.
            let Ok(()) = w.answered.recv() else { return };
            unanswered -= 1;
        }
        let Some(next) = w.outbox.next(ended) else { return };
        let lane = w.sender.lock().unwrap_or_else(PoisonError::into_inner);
        let sent = match next {
            Next::Chunk(slot, header) if header.payload_len() > 0 => {
                // SAFETY: the session gave this slot, DMA complete, to the
                // outbox, and this writer took it; it lends it until the
                // client's receipt. The header's length fits it.
                let data = unsafe {
                    std::slice::from_raw_parts(
                        w.slots.ptr(slot.0, Direction::Out, slot.1),
                        header.payload_len() as usize,
                    )
                };
                if w.lend.send(Lent { slot, header }).is_err() {
                    return;
                }
                unanswered += 1;
                match &pipe {
                    Some(pipe) => lane.send_chunk_spliced(&header, data, pipe),
                    None => lane.send_chunk(&header, data),
                }
            }
            Next::Chunk(slot, header) => {
                lane.send_chunk(&header, &[]).map(|()| drop(w.freed.send(FromLane::Free(slot))))
            }
            Next::End(copy) => {
                ended = copy;
                lane.send_chunk(&ChunkHeader::end(copy), &[])
            }
        };
        if let Err(e) = sent {
            debug!("lane writer stops: {e}");
            lane.shutdown();
            return;
        }
    }
}

type R<T> = Result<T, CallError>;

/// Runs a lane copy to or from `target` as the session's copy work: timed,
/// and under `band` held back for the turn. A copy whose target failed its
/// checks only drains the lanes, and reaches no GPU.
fn copying<T>(seat: &Seat, target: &Result<(Obj, Obj), CallError>, copy: impl FnOnce() -> T) -> T {
    match target {
        Ok((ctx, stream)) => seat.submit(*ctx, *stream, Work::Copy, copy),
        Err(_) => copy(),
    }
}

#[allow(non_snake_case)]
impl LanesCalls for Session {
    fn MemcpyHtoDLanes(&mut self, req: calls::MemcpyHtoDLanes::Request) -> R<calls::MemcpyHtoDLanes::Reply> {
        // A failed check still takes the copy's chunks off the lanes.
        let target = self.tables.check_range(req.dst.0, req.size).and_then(|()| self.stream(req.stream));
        let lanes = self.lanes.as_mut().ok_or_else(|| invalid("no lanes are open"))?;
        copying(&self.seat, &target, || lanes.htod(&*self.backend, target.clone(), req.dst.0, req.size, req.copy))?;
        Ok(calls::MemcpyHtoDLanes::Reply {})
    }

    fn MemcpyDtoHLanes(&mut self, req: calls::MemcpyDtoHLanes::Request) -> R<calls::MemcpyDtoHLanes::Reply> {
        let target = self.tables.check_range(req.src.0, req.size).and_then(|()| self.stream(req.stream));
        let lanes = self.lanes.as_mut().ok_or_else(|| invalid("no lanes are open"))?;
        copying(&self.seat, &target, || lanes.dtoh(&*self.backend, target.clone(), req.src.0, req.size, req.copy))?;
        Ok(calls::MemcpyDtoHLanes::Reply {})
    }
}
