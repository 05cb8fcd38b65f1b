//! Memory a session shares with its client: the connection's region (rings
//! and staging slots) and pinned host blocks.
//!
//! For a local guest every piece is a sealed memfd the server creates, maps
//! and registers with the driver, then passes to the client. A VM guest's
//! pieces are chunks of its VM's region (`transport::vm`) that it claimed
//! and names here, mapped and registered the same way. The GPU reads and
//! writes those pages directly, so a copy from pinned guest memory costs
//! the guest nothing and runs at the DMA engine's speed. Clients name
//! memory by block and offset, never by address, and every range is
//! checked here.
//!
//! A staged copy marks its slot busy with an event recorded after it in its
//! stream; the client waits for that event (`StagingWait`) before reusing
//! the slot, which is what lets chunks pipeline.
//!
//! Registrations are made from the session's current context (portable, so
//! every context may use them) and end with that context; memory whose
//! context is gone is registered again from the current one on next use.
//! (A server-wide context just for registrations would cost every embedded
//! server one more context creation, about a tenth of a second.)

use std::collections::HashMap;
use std::sync::Arc;

use gpuplex_protocol::{CallError, CuError, InPlace, SharedLayout};
use gpuplex_transport::shm::{Layout, Region};
use gpuplex_transport::vm::Heap;
use tracing::warn;

use super::invalid;
use crate::backend::{Backend, Obj, CU_EVENT_DISABLE_TIMING};

/// Ring size: big enough that a burst of posted launches never waits for
/// the session, small next to the staging area.
const RING_BYTES: usize = 4 << 20;
/// Staging for pageable copies: slots of this size, this many, enough to
/// keep the copy engine busy while the client fills the next slots. Only
/// this one setting has been measured (`docs/performance.md`).
const SLOT_BYTES: usize = 2 << 20;
const SLOTS: usize = 8;
/// Pinned host memory one session may hold.
const HOST_BUDGET: u64 = 64 << 30;

/// Block 0: the connection's staging slots.
pub const STAGING: u64 = 0;

pub struct Shared {
    /// The connection's region, once the client asked for one.
    connection: Option<Connection>,
    /// A VM guest's heap, where its staging and blocks lie.
    heap: Option<Heap>,
    blocks: HashMap<u64, HostBlock>,
    next_block: u64,
    host_bytes: u64,
}

struct Connection {
    region: Arc<Region>,
    staging: usize,
    slots: usize,
    /// The context the staging area is registered from, if any.
    registered: Option<Obj>,
    /// Each slot's completion event and its context, once used.
    slot_events: Vec<Option<(Obj, Obj)>>,
}

pub struct HostBlock {
    pub region: Region,
    pub devptr: u64,
    registered: Option<Obj>,
}

/// A host range a copy may use: where it is in this process.
pub struct HostRange {
    pub ptr: *mut u8,
    /// The staging slot it lies in, for copies through block 0.
    pub slot: Option<usize>,
}

impl Connection {
    fn new(region: Arc<Region>, staging: usize, slots: usize) -> Connection {
        Connection { region, staging, slots, registered: None, slot_events: vec![None; slots] }
    }
}

/// `at` as a place to map a block, if it is one (page-aligned).
fn page(at: u64) -> *mut u8 {
    if at & 4095 == 0 {
        at as usize as *mut u8
    } else {
        std::ptr::null_mut()
    }
}

/// Registers `len` bytes at `ptr` from `ctx`, unless `registered` names the
/// context they are registered from already.
///
/// # Safety
/// The memory stays mapped until it is unregistered or that context ends.
pub(super) unsafe fn register_once(
    backend: &dyn Backend,
    ctx: Obj,
    registered: &mut Option<Obj>,
    ptr: *mut u8,
    len: usize,
) -> Result<(), CallError> {
    if registered.is_none() {
        // SAFETY: the caller's guarantee.
        unsafe { backend.host_register(ctx, ptr, len) }?;
        *registered = Some(ctx);
    }
    Ok(())
}

impl Shared {
    pub fn new() -> Shared {
        Shared { connection: None, heap: None, blocks: HashMap::new(), next_block: STAGING + 1, host_bytes: 0 }
    }

    /// A VM guest's heap, once it shares memory in place.
    pub fn heap(&self) -> Option<&Heap> {
        self.heap.as_ref()
    }

    /// Whether the client shares memory with this process.
    pub fn connected(&self) -> bool {
        self.connection.is_some()
    }

    /// Creates the connection's region; its staging area is registered on
    /// first use.
    pub fn connect(&mut self) -> Result<(Arc<Region>, Layout, SharedLayout), CallError> {
        if self.connection.is_some() {
            return Err(invalid("memory is already shared"));
        }
        let layout = Layout { ring_bytes: RING_BYTES, staging_bytes: SLOT_BYTES * SLOTS };
        let region = Region::create("gpuplex-connection", layout.total())
            .map_err(|e| CallError::new(CuError::OUT_OF_MEMORY, format!("shared region: {e}")))?;
        let region = Arc::new(region);
        self.connection = Some(Connection::new(region.clone(), layout.staging_offset(), SLOTS));
        let reply = SharedLayout { ring_bytes: RING_BYTES as u64, slot_bytes: SLOT_BYTES as u64, slots: SLOTS as u32 };
        Ok((region, layout, reply))
    }

    /// Takes a VM guest's staging area, in the heap of its region; its rings
    /// are the slot's own, already in use.
    pub fn connect_in_place(&mut self, heap: Heap, req: &InPlace) -> Result<SharedLayout, CallError> {
        if self.connection.is_some() {
            return Err(invalid("memory is already shared"));
        }
        let slots = req.bytes / SLOT_BYTES as u64;
        if req.bytes % SLOT_BYTES as u64 != 0 || !(1..=SLOTS as u64).contains(&slots) {
            return Err(invalid(format!("a staging area of {} bytes", req.bytes)));
        }
        let (offset, len) = (usize::try_from(req.offset).unwrap_or(usize::MAX), req.bytes as usize);
        let view = heap.view(offset, len, std::ptr::null_mut()).map_err(|e| invalid(e.to_string()))?;
        self.connection = Some(Connection::new(Arc::new(view), 0, slots as usize));
        self.heap = Some(heap);
        Ok(SharedLayout { ring_bytes: 0, slot_bytes: SLOT_BYTES as u64, slots: slots as u32 })
    }

    /// A new pinned block of `size` bytes, placed at `at` in this process
    /// if that is free (so that a client mapping it at the same address
    /// sees one address for host and device, as unified addressing does).
    pub fn alloc(
        &mut self,
        backend: &dyn Backend,
        ctx: Obj,
        size: u64,
        at: u64,
    ) -> Result<(u64, &HostBlock), CallError> {
        let total = self.charge(size)?;
        let len = usize::try_from(size).map_err(|_| invalid("host block too large"))?;
        let region = Region::create_at("gpuplex-pinned", len, page(at))
            .map_err(|e| CallError::new(CuError::OUT_OF_MEMORY, format!("host block: {e}")))?;
        self.add_block(backend, ctx, region, total)
    }

    /// A VM guest's block: `size` bytes at `offset` of its region's heap,
    /// mapped at `at` here if that is free.
    pub fn place(
        &mut self,
        backend: &dyn Backend,
        ctx: Obj,
        offset: u64,
        size: u64,
        at: u64,
    ) -> Result<(u64, &HostBlock), CallError> {
        let heap = self.heap.as_ref().ok_or_else(|| invalid("no heap: not a VM's connection"))?;
        let total = self.charge(size)?;
        let (offset, len) = (usize::try_from(offset), usize::try_from(size));
        let (Ok(offset), Ok(len)) = (offset, len) else { return Err(invalid("a host block beyond the heap")) };
        let region = heap.view(offset, len, page(at)).map_err(|e| invalid(e.to_string()))?;
        self.add_block(backend, ctx, region, total)
    }

    /// The pinned bytes the session would hold with `size` more.
    fn charge(&self, size: u64) -> Result<u64, CallError> {
        if size == 0 {
            return Err(invalid("a host block of 0 bytes"));
        }
        let total = self.host_bytes.checked_add(size).filter(|&t| t <= HOST_BUDGET);
        total.ok_or_else(|| CallError::new(CuError::OUT_OF_MEMORY, "pinned host memory budget spent"))
    }

    /// Registers a block's memory and keeps it, the session then holding
    /// `total` pinned bytes.
    fn add_block(
        &mut self,
        backend: &dyn Backend,
        ctx: Obj,
        region: Region,
        total: u64,
    ) -> Result<(u64, &HostBlock), CallError> {
        // SAFETY: the region lives in `self.blocks` until it is unregistered.
        let devptr = unsafe { backend.host_register(ctx, region.as_ptr(), region.len()) }?;
        let id = self.next_block;
        self.next_block += 1;
        self.host_bytes = total;
        Ok((id, self.blocks.entry(id).or_insert(HostBlock { region, devptr, registered: Some(ctx) })))
    }

    pub fn free(&mut self, backend: &dyn Backend, id: u64) -> Result<HostBlock, CallError> {
        let block = self.blocks.remove(&id).ok_or_else(|| invalid(format!("no host block {id}")))?;
        if let Some(ctx) = block.registered {
            backend.host_unregister(ctx, block.region.as_ptr())?;
        }
        self.host_bytes -= block.region.len() as u64;
        Ok(block)
    }

    /// `len` bytes at `offset` of block `id`, checked, and registered (from
    /// `ctx` if their registration is gone).
    pub fn range(
        &mut self,
        backend: &dyn Backend,
        ctx: Obj,
        id: u64,
        offset: u64,
        len: u64,
    ) -> Result<HostRange, CallError> {
        let fail = || invalid(format!("{len} bytes at offset {offset} are outside host block {id}"));
        let end = offset.checked_add(len).ok_or_else(fail)?;
        let (base, slot) = if id == STAGING {
            let c = self.connection.as_mut().ok_or_else(|| invalid("no staging without shared memory"))?;
            if end > (SLOT_BYTES * c.slots) as u64 {
                return Err(fail());
            }
            // A staged copy stays inside one slot, so that one event covers
            // it; an empty range holds no byte of any slot (it may start
            // where the last slot ends), so it has none.
            let slot = (offset / SLOT_BYTES as u64) as usize;
            let slot = match len {
                0 => None,
                _ if (end - 1) / SLOT_BYTES as u64 == slot as u64 => Some(slot),
                _ => return Err(fail()),
            };
            // SAFETY: the staging area lies inside the region (layout).
            let staging = unsafe { c.region.as_ptr().add(c.staging) };
            // SAFETY: the region stays mapped until teardown, which
            // unregisters it first.
            unsafe { register_once(backend, ctx, &mut c.registered, staging, SLOT_BYTES * c.slots) }?;
            (staging, slot)
        } else {
            let b = self.blocks.get_mut(&id).ok_or_else(|| invalid(format!("no host block {id}")))?;
            if end > b.region.len() as u64 {
                return Err(fail());
            }
            // SAFETY: the block stays mapped until it is unregistered.
            unsafe { register_once(backend, ctx, &mut b.registered, b.region.as_ptr(), b.region.len()) }?;
            (b.region.as_ptr(), None)
        };
        // SAFETY: `offset + len` is at most the size of a live mapping.
        Ok(HostRange { ptr: unsafe { base.add(offset as usize) }, slot })
    }

    /// The host block (not the staging area) holding `ptr` in this process,
    /// as `(block, offset)`.
    pub fn block_at(&self, ptr: u64) -> Option<(u64, u64)> {
        self.blocks.iter().find_map(|(&id, b)| {
            let base = b.region.as_ptr() as u64;
            (base <= ptr && ptr - base < b.region.len() as u64).then(|| (id, ptr - base))
        })
    }

    /// Records, after a staged copy in `stream`, the event that frees `slot`.
    pub fn mark_slot(&mut self, backend: &dyn Backend, slot: usize, ctx: Obj, stream: Obj) -> Result<(), CallError> {
        let c = self.connection.as_mut().ok_or_else(|| invalid("no staging without shared memory"))?;
        let held = c.slot_events.get(slot).ok_or_else(|| invalid(format!("no staging slot {slot}")))?;
        let event = match *held {
            Some((ev_ctx, ev)) if ev_ctx == ctx => ev,
            old => {
                if let Some((ev_ctx, ev)) = old {
                    let _ = backend.event_synchronize(ev_ctx, ev);
                    let _ = backend.event_destroy(ev_ctx, ev);
                }
                let ev = backend.event_create(ctx, CU_EVENT_DISABLE_TIMING)?;
                c.slot_events[slot] = Some((ctx, ev));
                ev
            }
        };
        backend.event_record(ctx, event, stream, 0)
    }

    /// Waits until no copy uses `slot`.
    pub fn wait_slot(&self, backend: &dyn Backend, slot: u32) -> Result<(), CallError> {
        let c = self.connection.as_ref().ok_or_else(|| invalid("no staging without shared memory"))?;
        match c.slot_events.get(slot as usize) {
            Some(Some((ctx, ev))) => backend.event_synchronize(*ctx, *ev),
            Some(None) => Ok(()),
            None => Err(invalid(format!("no staging slot {slot}"))),
        }
    }

    /// Forgets what died with a context: slot events and registrations.
    pub fn context_gone(&mut self, ctx: Obj) {
        if let Some(c) = &mut self.connection {
            for e in &mut c.slot_events {
                if e.is_some_and(|(ev_ctx, _)| ev_ctx == ctx) {
                    *e = None;
                }
            }
            if c.registered == Some(ctx) {
                c.registered = None;
            }
        }
        for b in self.blocks.values_mut() {
            if b.registered == Some(ctx) {
                b.registered = None;
            }
        }
    }

    /// Unregisters what is still registered (before the contexts go, so
    /// each registration is undone from its own context); the mappings go
    /// when `self` does.
    pub fn teardown(&mut self, backend: &dyn Backend) {
        for (_, block) in self.blocks.drain() {
            if let Some(ctx) = block.registered {
                if let Err(e) = backend.host_unregister(ctx, block.region.as_ptr()) {
                    warn!("teardown: host block unregister failed: {e}");
                }
            }
        }
        if let Some(c) = &mut self.connection {
            if let Some(ctx) = c.registered.take() {
                // SAFETY: the staging offset lies inside the region.
                let staging = unsafe { c.region.as_ptr().add(c.staging) };
                if let Err(e) = backend.host_unregister(ctx, staging) {
                    warn!("teardown: staging unregister failed: {e}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::emulated::Emulated;
    use crate::backend::prelude::*;

    /// Whatever block, offset and length a client names, the answer is a
    /// range inside that block (a non-empty staged one with the slot it
    /// lies in, which can be marked) or INVALID_VALUE, never a panic.
    #[test]
    fn every_named_range_is_inside_its_block_or_refused() {
        let backend = Emulated::new();
        let ctx = backend.ctx_create(0, 0).unwrap();
        let mut shared = Shared::new();
        shared.connect().unwrap();
        let block_bytes = 8192u64;
        let block = shared.alloc(&backend, ctx, block_bytes, 0).unwrap().0;
        let (slot, staging) = (SLOT_BYTES as u64, (SLOT_BYTES * SLOTS) as u64);
        let offsets = [0, 1, slot - 1, slot, staging - 1, staging, staging + 1, block_bytes, u64::MAX - 1, u64::MAX];
        let lens = [0, 1, 2, block_bytes, slot - 1, slot, slot + 1, staging, u64::MAX];
        for id in [STAGING, block, block + 1] {
            let size = if id == STAGING { staging } else { block_bytes };
            for offset in offsets {
                for len in lens {
                    let what = format!("block {id}, {len} bytes at {offset}");
                    let range = match shared.range(&backend, ctx, id, offset, len) {
                        Ok(range) => range,
                        Err(e) => {
                            assert_eq!(e.code, CuError::INVALID_VALUE, "{what}");
                            continue;
                        }
                    };
                    assert!(id != block + 1 && offset.checked_add(len).is_some_and(|end| end <= size), "{what}");
                    match range.slot {
                        Some(s) => {
                            assert!(id == STAGING && len > 0, "{what}");
                            assert!(offset / slot == s as u64 && (offset + len - 1) / slot == s as u64, "{what}");
                            shared.mark_slot(&backend, s, ctx, Obj(0)).unwrap();
                        }
                        None => assert!(id != STAGING || len == 0, "{what}"),
                    }
                }
            }
        }
        // Where the fuzzer found a panic: no bytes, just past the last slot.
        assert_eq!(shared.range(&backend, ctx, STAGING, staging, 0).unwrap().slot, None);
        assert_eq!(shared.range(&backend, ctx, STAGING, staging - 1, 1).unwrap().slot, Some(SLOTS - 1));
        assert_eq!(shared.mark_slot(&backend, SLOTS, ctx, Obj(0)).unwrap_err().code, CuError::INVALID_VALUE);
        assert_eq!(shared.wait_slot(&backend, SLOTS as u32).unwrap_err().code, CuError::INVALID_VALUE);
        shared.teardown(&backend);
    }

    /// A VM guest names its staging area and blocks in its region's heap:
    /// what lies outside it, or is not page-aligned, or is no whole number
    /// of staging slots, is refused; what lies inside is the guest's bytes.
    #[test]
    fn a_vm_guest_s_pieces_are_its_heap_s_or_refused() {
        use gpuplex_transport::vm::{VmCarrier, VmListener, CHUNK, MIN_REGION};
        use gpuplex_transport::{Carrier, Listener};
        let path = std::env::temp_dir().join(format!("gpuplex-shared-vm-{}", std::process::id()));
        let listener = VmListener::create(&path, MIN_REGION + 4 * SLOT_BYTES * SLOTS).unwrap();
        let guest = VmCarrier::connect(&path).unwrap();
        let server = listener.accept().unwrap();
        let _ = std::fs::remove_file(&path);
        let (mine, theirs) = (guest.heap().unwrap(), server.heap().unwrap());
        let backend = Emulated::new();
        let ctx = backend.ctx_create(0, 0).unwrap();

        let mut shared = Shared::new();
        let staging = mine.alloc(SLOT_BYTES * SLOTS).unwrap() as u64;
        for (offset, bytes) in [
            (staging, 0),
            (staging, SLOT_BYTES as u64 + 1),
            (staging, 2 * (SLOT_BYTES * SLOTS) as u64),
            (0, SLOT_BYTES as u64),
            (u64::MAX - 4095, SLOT_BYTES as u64),
        ] {
            let e = shared.connect_in_place(theirs.clone(), &InPlace { offset, bytes }).unwrap_err();
            assert_eq!(e.code, CuError::INVALID_VALUE, "{bytes} bytes at {offset:#x}");
        }
        let layout = shared
            .connect_in_place(theirs.clone(), &InPlace { offset: staging, bytes: (2 * SLOT_BYTES) as u64 })
            .unwrap();
        assert_eq!((layout.slots, layout.slot_bytes), (2, SLOT_BYTES as u64));
        assert!(shared.range(&backend, ctx, STAGING, 2 * SLOT_BYTES as u64 - 1, 2).is_err(), "past its two slots");

        let at = mine.alloc(CHUNK).unwrap() as u64;
        for (offset, size) in [(at + 1, 4096), (at, 0), (0, 4096), (at, u64::MAX), (u64::MAX - 4095, 4096)] {
            assert!(shared.place(&backend, ctx, offset, size, 0).is_err(), "{size} bytes at {offset:#x}");
        }
        let view = mine.view(at as usize, CHUNK, std::ptr::null_mut()).unwrap();
        // SAFETY: a fresh view of CHUNK bytes.
        unsafe { view.as_ptr().add(7).write(9) };
        let (id, block) = shared.place(&backend, ctx, at, CHUNK as u64, 0).unwrap();
        // SAFETY: the block is CHUNK bytes.
        assert_eq!(unsafe { block.region.as_ptr().add(7).read() }, 9, "the server sees the guest's bytes");
        assert!(shared.range(&backend, ctx, id, CHUNK as u64 - 1, 1).is_ok());
        assert!(shared.range(&backend, ctx, id, CHUNK as u64, 1).is_err());
        shared.free(&backend, id).unwrap();
        shared.teardown(&backend);
        let refused = Shared::new().place(&backend, ctx, at, 4096, 0).map(|_| ()).unwrap_err();
        assert_eq!(refused.code, CuError::INVALID_VALUE, "no heap: a local guest's session");
    }
}
