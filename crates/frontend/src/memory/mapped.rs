//! A remote guest's pinned memory mapped for the device: what
//! `cuMemHostGetDevicePointer` gives where memory is not shared with the
//! server (TCP, the socket carrier).
//!
//! The server cannot reach this process's memory, so it makes a registered
//! block of its own for the range, at the same address where that is free
//! there, so that one pointer serves host and device as under unified
//! addressing, and kernels use the block. Small pinned allocations get one
//! from the start, at an address found free in both processes: programs
//! hand those to kernels as host pointers without asking for a device
//! address (flags, counters, XLA's timer semaphore). Other pinned memory
//! gets one on the first request for its device address, wherever the
//! server can place it. The program's memory and the block agree at the
//! calls where a program could tell them apart:
//!
//! - before each call that reaches the device (a launch, a copy, a wait),
//!   what the program wrote goes to the block, so the kernels it launches
//!   or waits for see it. A kernel that spins until the host sets a flag
//!   (XLA's timer does) is released by the wait that follows the write;
//! - before the reply to each waited call that reaches the device, what
//!   the device wrote comes back (the server compares its blocks then).
//!   An asynchronous copy into the range from the device is such a write.
//!
//! Each side sends only the bytes it changed since they last agreed, so
//! neither undoes a newer write of the other's. While such memory exists,
//! a device call costs a compare of it on each side, and no round trip;
//! a write of the program's while a kernel runs, with no call after it, is
//! not seen. A host function the stream runs gets what the device wrote
//! before it on its own connection, and its writes go back with its answer.
//!
//! The same blocks stand in for the program's ordinary memory that a
//! graph's copies name, where no memory is shared (`mirrors` otherwise);
//! only a graph's launch or a host function sends what the program wrote
//! to those.
//!
//! Freed small allocations keep their pages and blocks for the next ones:
//! some programs (XLA) allocate and free a few bytes of pinned memory every
//! step, and a block costs a round trip to make and one to free.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use gpuplex_protocol::{calls, codec, CuError, MappedFrames, MappedRun, MappedRuns, Seq};
use gpuplex_transport::shm::{differing_runs, take_changes};

use super::host::PAGE;
use super::mirrors::{read_own, write_own_runs};
use crate::client::{self, Conn};

/// Pinned allocations up to this size are mapped from the start, at most
/// this many at once: every device call compares them, so only flags and
/// counters are, not the staging buffers some programs keep by the hundred.
const EAGER_BYTES: usize = 4 << 10;
const EAGER_LIVE: usize = 32;
/// Addresses tried for one small allocation before it goes unmapped.
const TRIES: usize = 4;
/// Freed small allocations kept for reuse, at most.
const KEPT: usize = 64;

struct Mapping {
    /// The program's range.
    start: u64,
    size: usize,
    /// The server's block, and where `start` lies in it.
    block: u64,
    offset: usize,
    /// The device address of `start`.
    devptr: u64,
    /// What the block held, all of it, when the two sides last agreed.
    agreed: Vec<u8>,
    kind: Kind,
}

/// Whose memory a mapping holds, and what reads it on the device.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// A small allocation made here: mapped until [`release`], then kept
    /// for reuse.
    Small,
    /// The program's own, registered, which it may unmap behind our back.
    Registered,
    /// The program's ordinary memory a graph's copies name: only a graph's
    /// launch reads it, so only a launch (or a host function, which a
    /// graph's copy may follow) sends what the program wrote.
    GraphCopies,
}

struct State {
    live: Vec<Mapping>,
    /// Freed small allocations, still mapped here and in the server.
    kept: Vec<Mapping>,
    /// Host functions running ([`host_function_runs`]).
    host_functions: usize,
}

static STATE: Mutex<State> = Mutex::new(State { live: Vec::new(), kept: Vec::new(), host_functions: 0 });
/// Whether any mapping is live: what every device call checks first.
static ANY: AtomicBool = AtomicBool::new(false);

/// Marks a host function running. What the program writes meanwhile goes
/// with the function's answer ([`host_function_done`]), which the device's
/// work after it waits for, rather than on the main connection, which the
/// server may read too late.
pub fn host_function_runs() {
    state().host_functions += 1;
}

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(PoisonError::into_inner)
}

impl State {
    fn add(&mut self, m: Mapping) {
        self.live.push(m);
        ANY.store(true, Ordering::Release);
    }

    fn remove(&mut self, start: u64) -> Option<Mapping> {
        let i = self.live.iter().position(|m| m.start == start)?;
        let m = self.live.swap_remove(i);
        ANY.store(!self.live.is_empty(), Ordering::Release);
        Some(m)
    }
}

/// New pinned memory of `size` bytes, mapped for the device at its own
/// address; None where it is not small, or no address was free in both
/// processes (the caller then allocates it unmapped).
pub fn alloc(size: usize) -> Result<Option<u64>, CuError> {
    if size > EAGER_BYTES {
        return Ok(None);
    }
    let len = size.next_multiple_of(PAGE as usize);
    let mut conn = client::lock()?;
    {
        let mut state = state();
        if state.live.iter().filter(|m| m.kind == Kind::Small).count() >= EAGER_LIVE {
            return Ok(None);
        }
        if let Some(i) = state.kept.iter().position(|m| m.agreed.len() == len) {
            let m = state.kept.swap_remove(i);
            let at = m.start;
            state.add(Mapping { size, ..m });
            return Ok(Some(at));
        }
    }
    // An address free here is offered; where the server has something
    // there, the address it chose instead is tried here. Refused addresses
    // stay held meanwhile, so that each try is a new one.
    let mut held = Vec::new();
    let mut placed = None;
    while placed.is_none() && held.len() < TRIES {
        let Ok(at) = super::host::anonymous(len) else { break };
        let at = at as u64;
        held.push(at);
        let Ok(reply) = conn.call(calls::HostMirror::Request { size: len as u64, at }) else { break };
        let theirs = reply.devptr.0;
        if theirs == at {
            held.pop();
            placed = Some((at, reply.block));
        } else if super::host::anonymous_at(theirs, len) {
            placed = Some((theirs, reply.block));
        } else {
            crate::log::debug(&format!("mapped pinned memory: {at:#x} is taken there, {theirs:#x} here"));
            let _ = conn.free_block(reply.block);
        }
    }
    for at in held {
        // SAFETY: a fresh anonymous mapping of ours that nothing uses.
        unsafe { libc::munmap(at as *mut libc::c_void, len) };
    }
    let Some((at, block)) = placed else {
        crate::log::debug(&format!("mapped pinned memory: {size} bytes left unmapped"));
        return Ok(None);
    };
    // A fresh block is zeros on both sides.
    let m = Mapping { start: at, size, block, offset: 0, devptr: at, agreed: vec![0; len], kind: Kind::Small };
    state().add(m);
    Ok(Some(at))
}

/// The device address of `ptr`, in the program's pinned range `[start,
/// start + size)`, which is mapped for the device on the first request.
pub fn device_address(start: u64, size: usize, ptr: u64) -> Result<u64, CuError> {
    // The block starts from the program's bytes, which must be all there.
    super::posted_reads::settle(start, size)?;
    // Held throughout, so that two threads asking at once map it once.
    let mut conn = client::lock()?;
    if let Some(devptr) = mapped_address(start, ptr) {
        return Ok(devptr);
    }
    let (_, devptr) = map(&mut conn, start, size, Kind::Registered).inspect_err(|e| {
        crate::log::warn(&format!("cuMemHostGetDevicePointer: the server holds no block for this memory: {e:?}"));
    })?;
    Ok(devptr + (ptr - start))
}

/// Has the server make a block for the program's `[start, start + size)`,
/// in whole pages around it, and records the mapping: the block, and the
/// device address of `start`. The program's bytes go with the next device
/// call that compares this kind.
fn map(conn: &mut Conn, start: u64, size: usize, kind: Kind) -> Result<(u64, u64), CuError> {
    let base = start & !(PAGE - 1);
    let offset = (start - base) as usize;
    let len = (offset + size).next_multiple_of(PAGE as usize);
    let reply = conn.call(calls::HostMirror::Request { size: len as u64, at: base })?;
    let devptr = reply.devptr.0 + offset as u64;
    state().add(Mapping { start, size, block: reply.block, offset, devptr, agreed: vec![0; len], kind });
    Ok((reply.block, devptr))
}

/// A block of the server's standing in for `[ptr, ptr + len)` of the
/// program's ordinary memory in a graph's copies where no memory is shared
/// (`mirrors::block_for` has one shared otherwise): the block and where
/// `ptr` lies in it, kept in step with the program's bytes as mapped pinned
/// memory is. None where the range is not readable memory.
pub fn mirror(ptr: u64, len: usize) -> Result<Option<(u64, u64)>, CuError> {
    let end = ptr.checked_add(len as u64).ok_or(CuError::INVALID_VALUE)?;
    super::posted_reads::settle(ptr, len)?;
    let mut conn = client::lock()?;
    if let Some(place) = state().live.iter().find_map(|m| m.place(ptr, end)) {
        return Ok(Some(place));
    }
    if !read_own(ptr, &mut vec![0; len]) {
        return Ok(None);
    }
    let (block, _) = map(&mut conn, ptr, len, Kind::GraphCopies)?;
    Ok(Some((block, ptr & (PAGE - 1))))
}

/// The block and offset of `[ptr, ptr + len)` where it lies in pinned
/// memory mapped for the device, which a copy to the host may then write
/// as the device's work does.
pub fn block_range(ptr: u64, len: usize) -> Option<(u64, u64)> {
    if !ANY.load(Ordering::Acquire) {
        return None;
    }
    let end = ptr.checked_add(len as u64)?;
    state().live.iter().filter(|m| m.kind != Kind::GraphCopies).find_map(|m| m.place(ptr, end))
}

/// The program's address that `offset` of block `block` stands for.
pub fn program_address(block: u64, offset: u64) -> Option<u64> {
    let state = state();
    let m = state.live.iter().find(|m| m.block == block)?;
    let at = offset.checked_sub(m.offset as u64)?;
    (at < m.size as u64).then(|| m.start + at)
}

/// The device address of `ptr` in the range at `start`, if it is mapped:
/// asking maps nothing.
pub fn mapped_address(start: u64, ptr: u64) -> Option<u64> {
    if !ANY.load(Ordering::Acquire) {
        return None;
    }
    let mapped = |m: &&Mapping| m.start == start && m.kind != Kind::GraphCopies;
    state().live.iter().find(mapped).map(|m| m.devptr + (ptr - start))
}

/// Ends the mapping of the range at `start`, before the program's memory
/// is freed or unregistered. True where the memory is kept mapped for a
/// later allocation: the caller must leave it be.
pub fn release(start: u64) -> bool {
    if !ANY.load(Ordering::Acquire) {
        return false;
    }
    let Ok(mut conn) = client::lock() else { return false };
    let gone = {
        let mut state = state();
        match state.remove(start) {
            Some(m) if m.kind == Kind::Small && state.kept.len() < KEPT => {
                state.kept.push(m);
                return true;
            }
            gone => gone,
        }
    };
    if let Some(m) = gone {
        if let Err(e) = conn.free_block(m.block) {
            crate::log::warn(&format!("freeing the server's block for mapped host memory: {e:?}"));
        }
    }
    false
}

/// Before a call that reaches the device: what the program wrote, to the
/// server's blocks (posted, ahead of the call); to those standing in for a
/// graph's copies only before a graph's launch.
pub fn to_device(conn: &mut Conn, graph_launch: bool) {
    if !ANY.load(Ordering::Acquire) {
        return;
    }
    let frames = {
        let mut state = state();
        match state.host_functions {
            0 => changes(&mut state, graph_launch),
            _ => Vec::new(),
        }
    };
    for runs in frames {
        // An error comes back with the next waited call; a lost connection ends it.
        let _ = conn.post(calls::MappedWrite::Request { runs: Seq(runs) });
    }
}

/// A host function has run: what the program wrote since the two sides
/// last agreed, for its answer, as frames' worth of runs. From now the
/// program's writes go on the main connection again, before the answer
/// lets the device's work go on.
pub fn host_function_done() -> Vec<Vec<MappedRun>> {
    let mut state = state();
    state.host_functions = state.host_functions.saturating_sub(1);
    changes(&mut state, true)
}

/// What the program wrote since the two sides last agreed, in every mapping
/// (`graph_copies`) or all but those standing in for a graph's copies.
fn changes(state: &mut State, graph_copies: bool) -> Vec<Vec<MappedRun>> {
    if !ANY.load(Ordering::Acquire) {
        return Vec::new();
    }
    let mut out = MappedFrames::default();
    let mut now = Vec::new();
    for m in state.live.iter_mut().filter(|m| graph_copies || m.kind != Kind::GraphCopies) {
        if m.unchanged() {
            continue;
        }
        now.resize(m.size, 0);
        if !m.read(m.start, &mut now) {
            // Registered memory the program unmapped: the device keeps what it had.
            continue;
        }
        let agreed = &mut m.agreed[m.offset..m.offset + m.size];
        for (start, n) in differing_runs(agreed, &now) {
            agreed[start..start + n].copy_from_slice(&now[start..start + n]);
            out.add(m.block, (m.offset + start) as u64, &now[start..start + n]);
        }
    }
    out.frames
}

/// Before the reply to a waited call that reached the device, or before a
/// host function: what the device wrote (a `MappedRuns` frame), into the
/// program's memory where the program has not written since.
pub fn from_device(payload: &[u8]) {
    let Ok(frame) = codec::decode::<MappedRuns>(payload) else {
        return crate::log::warn("undecodable mapped memory from the server");
    };
    let mut state = state();
    let State { live, kept, .. } = &mut *state;
    for run in &frame.runs.0 {
        if let Some(m) = live.iter_mut().chain(kept.iter_mut()).find(|m| m.block == run.block) {
            m.take(run);
        }
    }
}

impl Mapping {
    /// Where `[ptr, end)` lies in the block, `(block, offset)`, if all of
    /// it is in the range.
    fn place(&self, ptr: u64, end: u64) -> Option<(u64, u64)> {
        let inside = self.start <= ptr && end <= self.start + self.size as u64;
        inside.then(|| (self.block, self.offset as u64 + (ptr - self.start)))
    }

    /// Whether the program's bytes are known to be what the sides last
    /// agreed on, found without a copy: in memory allocated here, which
    /// stays mapped, they are compared in place.
    fn unchanged(&self) -> bool {
        if self.kind != Kind::Small {
            return false;
        }
        // SAFETY: inside memory allocated here, mapped while the mapping lives.
        let bytes = unsafe { std::slice::from_raw_parts(self.start as *const u8, self.size) };
        bytes == &self.agreed[self.offset..self.offset + self.size]
    }

    /// Reads the program's bytes at `addr`, inside the range.
    fn read(&self, addr: u64, out: &mut [u8]) -> bool {
        if self.kind != Kind::Small {
            return read_own(addr, out);
        }
        // SAFETY: inside memory allocated here, mapped while the mapping lives.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, out.as_mut_ptr(), out.len()) };
        true
    }

    /// Writes the runs `(start, length)` of `data` to the program's bytes
    /// from `addr` on, inside the range.
    fn write(&self, addr: u64, data: &[u8], runs: &[(usize, usize)]) {
        if self.kind != Kind::Small {
            write_own_runs(addr, data, runs);
            return;
        }
        for &(start, n) in runs {
            // SAFETY: as for reading; the device wrote these bytes, as it
            // would write pinned memory natively.
            unsafe { std::ptr::copy_nonoverlapping(data[start..].as_ptr(), (addr as *mut u8).add(start), n) };
        }
    }

    /// Takes the device's bytes of `run`: into the program's range where the
    /// program has not written since the sides last agreed, and into what
    /// they agree on, all of them. Runs the server sent are its block's own.
    fn take(&mut self, run: &MappedRun) {
        let from = usize::try_from(run.offset).unwrap_or(usize::MAX);
        let Some(to) = from.checked_add(run.data.len()).filter(|&to| to <= self.agreed.len()) else {
            return crate::log::warn("mapped memory from the server outside its block");
        };
        // The part inside the program's range (or a kept allocation's).
        let (lo, hi) = (from.max(self.offset), to.min(self.offset + self.size));
        if lo < hi {
            let mut ours = vec![0; hi - lo];
            let addr = self.start + (lo - self.offset) as u64;
            if self.read(addr, &mut ours) {
                let theirs = &run.data[lo - from..hi - from];
                let taken = take_changes(&mut self.agreed[lo..hi], theirs, &mut ours);
                self.write(addr, &ours, &taken);
            }
        }
        self.agreed[from..to].copy_from_slice(&run.data);
    }
}
