//! A remote guest's pinned memory that its kernels reach through a device
//! address: a registered block of the session's stands in for it, and the
//! two copies agree by the runs of bytes each side changed since they last
//! did (`frontend/src/memory/mapped.rs` says when).
//!
//! The session keeps what both sides last agreed on. A run the guest sends
//! goes into the block and into that; before the reply to a waited call
//! that reaches the device, what differs between them (which only the
//! device can have written) goes to the guest, and they agree again. That
//! costs a compare of the blocks per such call, and no round trip.

use std::collections::HashMap;

use gpuplex_protocol::{calls, CallError, CuError, DevPtr, MappedFrames, MappedHostCalls, MappedRun};
use gpuplex_transport::shm::differing_runs;

use super::shared::Shared;
use super::tables::{Owner, Region};
use super::{invalid, Session};

type R<T> = Result<T, CallError>;

/// Bytes of mapped blocks one session may hold: each costs a compare per
/// call that reaches the device on both sides, so this is for flags,
/// counters and small zero-copy buffers, not bulk data.
const BUDGET: u64 = 1 << 30;

/// What the guest and this side last agreed each mapped block holds.
#[derive(Default)]
pub struct Mapped {
    agreed: HashMap<u64, Vec<u8>>,
}

impl Mapped {
    /// Forgets block `id` (freed), if it was a mapped one.
    pub fn forget(&mut self, id: u64) {
        self.agreed.remove(&id);
    }

    fn bytes(&self) -> u64 {
        self.agreed.values().map(|a| a.len() as u64).sum()
    }

    /// What the device changed in the blocks since the guest and this side
    /// last agreed, as frames' worth of runs; they agree on it from now.
    pub fn changes(&mut self, shared: &Shared) -> Vec<Vec<MappedRun>> {
        let mut out = MappedFrames::default();
        for (&block, agreed) in &mut self.agreed {
            let Some(memory) = shared.memory(block) else { continue };
            // SAFETY: the block's live mapping, as long as its agreed copy.
            // The device may be writing it: the copy is what it held then.
            let now = unsafe { std::slice::from_raw_parts(memory, agreed.len()) }.to_vec();
            for (start, n) in differing_runs(agreed, &now) {
                agreed[start..start + n].copy_from_slice(&now[start..start + n]);
                out.add(block, start as u64, &now[start..start + n]);
            }
        }
        out.frames
    }
}

#[allow(non_snake_case)]
impl MappedHostCalls for Session {
    fn HostMirror(&mut self, req: calls::HostMirror::Request) -> R<calls::HostMirror::Reply> {
        if req.size.checked_add(self.mapped.bytes()).is_none_or(|total| total > BUDGET) {
            return Err(CallError::new(CuError::OUT_OF_MEMORY, "mapped host memory beyond 1 GiB in one session"));
        }
        let (_, ctx) = self.current_ctx()?;
        let (block, host) = self.shared.alloc(&*self.backend, ctx, req.size, req.at)?;
        let devptr = host.devptr;
        // A fresh block is zeros, which is what the guest starts from too.
        self.mapped.agreed.insert(block, vec![0; req.size as usize]);
        self.tables.add_region(devptr, Region { size: req.size, ctx: 0, owner: Some(Owner::HostBlock(block)) });
        Ok(calls::HostMirror::Reply { block, devptr: DevPtr(devptr) })
    }

    fn MappedWrite(&mut self, req: calls::MappedWrite::Request) -> R<calls::MappedWrite::Reply> {
        for run in req.runs.0 {
            let agreed = self.mapped.agreed.get_mut(&run.block);
            let agreed = agreed.ok_or_else(|| invalid(format!("host block {} is not mapped", run.block)))?;
            let start = usize::try_from(run.offset).ok().filter(|&s| s <= agreed.len());
            let range = start.and_then(|s| Some(s..s.checked_add(run.data.len()).filter(|&e| e <= agreed.len())?));
            let range = range.ok_or_else(|| {
                invalid(format!("{} bytes at {} are outside host block {}", run.data.len(), run.offset, run.block))
            })?;
            let memory = self.shared.memory(run.block).ok_or_else(|| invalid("a mapped block without memory"))?;
            // SAFETY: a range of the block's live mapping, checked against
            // its length above (the agreed copy is as long as the block).
            unsafe { std::ptr::copy_nonoverlapping(run.data.as_ptr(), memory.add(range.start), run.data.len()) };
            agreed[range].copy_from_slice(&run.data);
        }
        Ok(calls::MappedWrite::Reply {})
    }
}
