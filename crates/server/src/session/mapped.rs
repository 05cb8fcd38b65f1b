//! A remote guest's pinned memory, which the server cannot map: what the
//! device writes to it reaches the guest in frames ahead of replies.
//!
//! Where its kernels reach it through a device address, a registered block
//! of the session's stands in for it, and the two copies agree by the runs
//! of bytes each side changed since they last did
//! (`frontend/src/memory/mapped.rs` says when). The session keeps what both
//! sides last agreed on. A run the guest sends goes into the block and into
//! that; before the reply to a waited call that reaches the device, what
//! differs between them (which only the device can have written) goes to
//! the guest, and they agree again. That costs a compare of the blocks per
//! such call, and no round trip.
//!
//! An asynchronous copy into such memory that no kernel reaches is posted
//! (`MemcpyDtoHLater`): the session makes it at once, as it would a waited
//! one, and keeps the bytes until that same point. Their guest then learns
//! of them no later than natively: a program can tell a copy finished only
//! through a call that waits for the device, or from a host function the
//! device ran after it, which is enqueued after the copy was made here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use gpuplex_protocol::{
    calls, codec, CallError, CopiedToHost, CuError, DevPtr, Header, MappedFrames, MappedHostCalls, MappedRun,
    MappedRuns, Opcode, Seq,
};
use gpuplex_transport::shm::{differing_runs, joined};
use gpuplex_transport::{Carrier, TransportError};

use super::tables::{Owner, Region};
use super::{invalid, Session};

type R<T> = Result<T, CallError>;

/// Bytes of mapped blocks one session may hold: each costs a compare per
/// call that reaches the device on both sides, so this is for flags,
/// counters and small zero-copy buffers, not bulk data.
const BUDGET: u64 = 1 << 30;

/// Bytes of posted copies a session may hold for its guest, who asks for
/// them well before (the front-end's `posted_reads::OWED_BYTES`).
const COPIES_BUDGET: usize = 64 << 20;
/// And copies at most, however small: each costs its entry and its frame
/// (the front-end's `posted_reads::OWED_COPIES` is well under).
const COPIES_KEPT: usize = 1 << 16;

/// Runs of the device's changes this close go to the guest as one: a value
/// of several bytes often keeps one of them, which splits the changes of an
/// array into a run per element. The guest takes only the bytes that differ
/// from what both sides agreed on, so the equal ones between change nothing.
const NEAR: usize = 64;

/// A block's memory here, and what the guest and this side last agreed it holds.
struct Block {
    memory: usize,
    agreed: Vec<u8>,
}

#[derive(Default)]
struct State {
    blocks: HashMap<u64, Block>,
    /// Posted copies made and not yet sent, in their order.
    copies: Vec<CopiedToHost>,
    copied_bytes: usize,
    /// Posted copies the session got so far: the next one's number.
    next_copy: u64,
}

impl State {
    fn any(&self) -> bool {
        !self.blocks.is_empty() || !self.copies.is_empty()
    }
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Whether the state holds a block or a copy, as of its lock's last
    /// release: most sessions never have one, and every call that reaches
    /// the device asks, so the question takes no lock.
    any: AtomicBool,
}

/// The session's mapped blocks and the bytes of its posted copies, shared
/// with the driver's threads that run the guest's host functions: the
/// guest's function sees what the device wrote before it, and the device's
/// work after it what the function wrote.
#[derive(Clone, Default)]
pub struct Mapped(Arc<Shared>);

/// The state, locked; it updates [`Shared::any`] as it goes.
struct Locked<'a> {
    state: MutexGuard<'a, State>,
    any: &'a AtomicBool,
}

impl std::ops::Deref for Locked<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.state
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.state
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        self.any.store(self.state.any(), Ordering::Release);
    }
}

impl Mapped {
    fn state(&self) -> Locked<'_> {
        let state = self.0.state.lock().unwrap_or_else(PoisonError::into_inner);
        Locked { state, any: &self.0.any }
    }

    /// Forgets block `id` (to be freed), if it was a mapped one.
    pub fn forget(&self, id: u64) {
        self.state().blocks.remove(&id);
    }

    /// Forgets every block, before they are freed.
    pub fn clear(&self) {
        self.state().blocks.clear();
    }

    fn bytes(&self) -> u64 {
        self.state().blocks.values().map(|b| b.agreed.len() as u64).sum()
    }

    /// What the device changed in the blocks since the guest and this side
    /// last agreed, as frames' worth of runs, and the copies made since the
    /// last call; they agree on it from now.
    fn changes(&self) -> (Vec<Vec<MappedRun>>, Vec<CopiedToHost>) {
        let mut out = MappedFrames::default();
        let mut state = self.state();
        for (&id, block) in state.blocks.iter_mut() {
            // SAFETY: the block's live mapping, as long as its agreed copy
            // (blocks are forgotten before they are freed). The device may
            // be writing it: the copy is what it held then.
            let live = unsafe { std::slice::from_raw_parts(block.memory as *const u8, block.agreed.len()) };
            // Mostly nothing changed: compared in place, copied only if not.
            if live == block.agreed.as_slice() {
                continue;
            }
            let now = live.to_vec();
            for (start, n) in joined(differing_runs(&block.agreed, &now), NEAR) {
                block.agreed[start..start + n].copy_from_slice(&now[start..start + n]);
                out.add(id, start as u64, &now[start..start + n]);
            }
        }
        state.copied_bytes = 0;
        (out.frames, std::mem::take(&mut state.copies))
    }

    /// Sends what the device changed as `MappedRuns` frames, then the
    /// copies' bytes as `CopiedToHost` frames, each under the header
    /// `header` makes for its opcode and payload length.
    #[inline]
    pub fn send_changes(
        &self,
        carrier: &mut dyn Carrier,
        header: impl Fn(Opcode, usize) -> Header,
    ) -> Result<(), TransportError> {
        // Only the session's thread adds blocks and copies, before the calls
        // and host functions that could find them: a false here is not
        // stale. Asked after every call that reaches the device, so inline.
        if !self.0.any.load(Ordering::Acquire) {
            return Ok(());
        }
        self.send_all_changes(carrier, &header)
    }

    fn send_all_changes(
        &self,
        carrier: &mut dyn Carrier,
        header: &dyn Fn(Opcode, usize) -> Header,
    ) -> Result<(), TransportError> {
        let (runs, copies) = self.changes();
        for runs in runs {
            let payload = codec::encode(&MappedRuns { runs: Seq(runs) });
            carrier.send(&header(Opcode::MappedRuns, payload.len()), &payload)?;
        }
        for copy in copies {
            let payload = codec::encode(&copy);
            carrier.send(&header(Opcode::CopiedToHost, payload.len()), &payload)?;
        }
        Ok(())
    }

    /// Takes what the guest wrote, each run checked against its block first.
    pub fn write(&self, runs: Vec<MappedRun>) -> Result<(), CallError> {
        let mut state = self.state();
        for run in runs {
            let block = state.blocks.get_mut(&run.block);
            let block = block.ok_or_else(|| invalid(format!("host block {} is not mapped", run.block)))?;
            let len = block.agreed.len();
            let start = usize::try_from(run.offset).ok().filter(|&s| s <= len);
            let range = start.and_then(|s| Some(s..s.checked_add(run.data.len()).filter(|&e| e <= len)?));
            let range = range.ok_or_else(|| {
                invalid(format!("{} bytes at {} are outside host block {}", run.data.len(), run.offset, run.block))
            })?;
            // SAFETY: a range of the block's live mapping, checked against
            // its length above (the agreed copy is as long as the block).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    run.data.as_ptr(),
                    (block.memory as *mut u8).add(range.start),
                    run.data.len(),
                )
            };
            block.agreed[range].copy_from_slice(&run.data);
        }
        Ok(())
    }

    /// Keeps what a posted copy read for the guest's memory at `dst`: its
    /// bytes, or that it failed, which the guest is told too, so that it
    /// stops waiting for them.
    fn keep(&self, dst: u64, read: Result<Vec<u8>, CallError>) -> Result<(), CallError> {
        let mut state = self.state();
        let seq = state.next_copy;
        state.next_copy += 1;
        let read = read.and_then(|data| {
            if state.copied_bytes + data.len() > COPIES_BUDGET || state.copies.len() >= COPIES_KEPT {
                let why = "posted copies to host memory hold 64 MiB or 65536 copies the guest has not asked for";
                return Err(CallError::new(CuError::OUT_OF_MEMORY, why));
            }
            Ok(data)
        });
        let (data, outcome) = match read {
            Ok(data) => (data, Ok(())),
            Err(e) => (Vec::new(), Err(e)),
        };
        state.copied_bytes += data.len();
        state.copies.push(CopiedToHost { seq, dst, data });
        outcome
    }
}

#[allow(non_snake_case)]
impl MappedHostCalls for Session {
    fn HostMirror(&mut self, req: calls::HostMirror::Request) -> R<calls::HostMirror::Reply> {
        if req.size.checked_add(self.mapped.bytes()).is_none_or(|total| total > BUDGET) {
            return Err(CallError::new(CuError::OUT_OF_MEMORY, "mapped host memory beyond 1 GiB in one session"));
        }
        let (_, ctx) = self.current_ctx()?;
        // Made for a graph's copies while the guest captures them, too.
        let (block, devptr, memory) = self.relaxed(|s| {
            let (block, host) = s.shared.alloc(&*s.backend, ctx, req.size, req.at)?;
            Ok::<_, CallError>((block, host.devptr, host.region.as_ptr() as usize))
        })?;
        // A fresh block is zeros, which is what the guest starts from too.
        self.mapped.state().blocks.insert(block, Block { memory, agreed: vec![0; req.size as usize] });
        self.tables.add_region(devptr, Region { size: req.size, ctx: 0, owner: Some(Owner::HostBlock(block)) });
        Ok(calls::HostMirror::Reply { block, devptr: DevPtr(devptr) })
    }

    fn MappedWrite(&mut self, req: calls::MappedWrite::Request) -> R<calls::MappedWrite::Reply> {
        self.mapped.write(req.runs.0)?;
        Ok(calls::MappedWrite::Reply {})
    }

    fn MemcpyDtoHLater(&mut self, req: calls::MemcpyDtoHLater::Request) -> R<calls::MemcpyDtoHLater::Reply> {
        let read = self.read_device(req.src, req.size, req.stream);
        self.mapped.keep(req.dst, read)?;
        Ok(calls::MemcpyDtoHLater::Reply {})
    }

    fn DeliverCopies(&mut self, _: calls::DeliverCopies::Request) -> R<calls::DeliverCopies::Reply> {
        // The bytes go ahead of the reply, as before any waited device call's.
        Ok(calls::DeliverCopies::Reply {})
    }
}
