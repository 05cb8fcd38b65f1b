//! A session's memory pools and the stream-ordered allocations made from
//! them.
//!
//! Every pool a session uses is its own: a device's default pool is one
//! created for the session when first needed, so no two guests ever draw
//! on one pool, and what a pool holds is exactly one session's. The driver
//! says how much that is (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`): freed
//! memory a pool keeps for reuse, and what it rounds allocations up to,
//! included. The session charges the tenant that, read again after every
//! allocation, free, trim and memory query; memory a pool gave back at a
//! synchronization in between stays charged until the next reading, never
//! the other way round. An allocation made while its stream is capturing
//! belongs to the graph, not the pool, and is charged at its size.
//!
//! Memory freed in stream order that no pool reading covers (a `cuMemAlloc`
//! allocation freed that way, a destroyed pool's last allocation) stays
//! charged until an event recorded after the free has passed: the driver
//! frees it only when the stream gets there, which a guest could put off.

use gpuplex_protocol::calls::*;
use gpuplex_protocol::{
    calls, CallError, CuError, DevPtr, MemPool, PoolProps, PoolsCalls, ALLOCATION_PINNED, HANDLE_TYPE_NONE,
    LOCATION_DEVICE,
};
use tracing::warn;

use super::tables::{HandleMap, Kind, Owner, Region};
use super::{invalid, Session};
use crate::backend::{Obj, CU_EVENT_DISABLE_TIMING};

type R<T> = Result<T, CallError>;

/// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`.
const RESERVED_MEM_CURRENT: i32 = 5;

#[derive(Default)]
pub struct Pools {
    pools: HandleMap<u64, Pool>,
    /// Each device's default pool and, once set, its current one, by the
    /// guest's device number.
    defaults: HandleMap<i32, u64>,
    current: HandleMap<i32, u64>,
    /// Live allocations by address.
    allocations: HandleMap<u64, Allocation>,
    /// What the pools hold as last read, and the captured allocations.
    held: u64,
    /// Frees the driver may not have carried out yet, and their bytes.
    pending: Vec<Pending>,
    pending_bytes: u64,
}

/// Bytes freed in stream order, charged until `event` (recorded after the
/// free) has passed; with no event (a free captured into a graph), until the
/// session ends.
struct Pending {
    bytes: u64,
    ctx: Obj,
    event: Option<Obj>,
}

struct Pool {
    obj: Obj,
    /// The guest's number for the pool's device.
    device: i32,
    /// What the driver last said the pool holds.
    reserved: u64,
    /// Allocations not yet freed.
    live: u32,
    /// Destroyed by the guest while allocations were live: the driver frees
    /// it after the last of them, and the session forgets it then.
    destroyed: bool,
}

#[derive(Clone, Copy)]
struct Allocation {
    pool: u64,
    size: u64,
    /// Made while its stream was capturing: the graph's, charged at its size.
    captured: bool,
}

/// The pool attributes gpuplex knows, whose values fit the 8 bytes the
/// driver is given (`CUmemPool_attribute` 1 to 8).
fn known_attribute(attr: i32) -> R<()> {
    if !(1..=8).contains(&attr) {
        return Err(CallError::new(
            CuError::NOT_SUPPORTED,
            format!("pool attribute {attr} is not supported by gpuplex"),
        ));
    }
    Ok(())
}

impl Pools {
    /// Device memory the session's pools, captured allocations and frees
    /// not yet carried out hold.
    pub fn held_bytes(&self) -> u64 {
        self.held + self.pending_bytes
    }

    /// A pool the guest may use, by its handle.
    fn live(&self, h: u64) -> R<&Pool> {
        self.pools
            .get(&h)
            .filter(|p| !p.destroyed)
            .ok_or_else(|| CallError::new(CuError::INVALID_VALUE, format!("{h:#x} is not a memory pool")))
    }

    /// Forgets an allocation the driver no longer has: its charge if it was
    /// a graph's, its place among its pool's live ones. Whether its pool is
    /// done with (destroyed, its last allocation gone).
    fn forget(&mut self, a: Allocation) -> bool {
        if a.captured {
            self.held -= a.size;
        }
        let p = self.pools.get_mut(&a.pool).expect("an allocation's pool outlives it");
        p.live -= 1;
        p.destroyed && p.live == 0
    }

    /// Records that pool `h` holds `bytes`.
    fn set_reserved(&mut self, h: u64, bytes: u64) {
        if let Some(p) = self.pools.get_mut(&h) {
            self.held = self.held - p.reserved + bytes;
            p.reserved = bytes;
        }
    }
}

impl Session {
    /// A pool the guest names; NULL is not one.
    pub(super) fn pool_obj(&self, pool: MemPool) -> R<Obj> {
        Ok(self.tables.pools.live(pool.0)?.obj)
    }

    /// The session's default pool on a device, created on first use.
    fn default_pool(&mut self, dev: i32) -> R<u64> {
        if let Some(&h) = self.tables.pools.defaults.get(&dev) {
            return Ok(h);
        }
        let props = PoolProps {
            kind: ALLOCATION_PINNED,
            handle_types: HANDLE_TYPE_NONE,
            location_kind: LOCATION_DEVICE,
            location: self.backend_device(dev)?,
            max_size: 0,
            usage: 0,
        };
        let h = self.add_pool(&props, dev)?;
        self.tables.pools.defaults.insert(dev, h);
        Ok(h)
    }

    fn current_pool(&mut self, dev: i32) -> R<u64> {
        match self.tables.pools.current.get(&dev) {
            Some(&h) => Ok(h),
            None => self.default_pool(dev),
        }
    }

    fn add_pool(&mut self, props: &PoolProps, dev: i32) -> R<u64> {
        let ctx = self.context_if_any();
        let obj = self.backend.mem_pool_create(ctx, props)?;
        let h = self.tables.issue();
        self.tables.pools.pools.insert(h, Pool { obj, device: dev, reserved: 0, live: 0, destroyed: false });
        Ok(h)
    }

    /// Reads what pool `h` holds again; a destroyed pool's reading stands
    /// until the session forgets it.
    fn reread(&mut self, h: u64) {
        let Some(p) = self.tables.pools.pools.get(&h) else { return };
        if p.destroyed {
            return;
        }
        // The server's own reading: a capture of the guest's must neither
        // refuse it nor be invalidated by it (in global mode the driver
        // counts it as unsafe).
        let obj = p.obj;
        match self.relaxed(|s| s.backend.mem_pool_get_attribute(obj, RESERVED_MEM_CURRENT)) {
            Ok(bytes) => self.tables.pools.set_reserved(h, bytes),
            Err(e) => warn!("pool {h:#x}: its reserve could not be read: {e}"),
        }
    }

    pub(super) fn reread_pools(&mut self) {
        self.release_pending();
        let handles: Vec<u64> = self.tables.pools.pools.keys().copied().collect();
        for h in handles {
            self.reread(h);
        }
    }

    /// Gives back what the session's pools keep for reuse, so that a charge
    /// they stand in the way of may fit; whether anything came back.
    fn trim_pools(&mut self) -> bool {
        let before = self.tables.pools.held;
        let live: Vec<(u64, Obj)> =
            self.tables.pools.pools.iter().filter(|(_, p)| !p.destroyed).map(|(&h, p)| (h, p.obj)).collect();
        for (h, obj) in live {
            if let Err(e) = self.relaxed(|s| s.backend.mem_pool_trim(obj, 0)) {
                warn!("pool {h:#x}: trim failed: {e}");
            }
            self.reread(h);
        }
        self.tables.pools.held < before
    }

    /// Keeps `bytes` freed in stream order charged until the stream has got
    /// past the free.
    fn hold_until_done(&mut self, ctx: Obj, stream: Obj, bytes: u64) {
        let capturing = self.capturing.contains(&(ctx, stream));
        // The server's own event, relaxed as in `reread` while another stream captures.
        let marked = (!capturing).then(|| {
            self.relaxed(|s| {
                let event = s.backend.event_create(ctx, CU_EVENT_DISABLE_TIMING).ok()?;
                match s.backend.event_record(ctx, event, stream, 0) {
                    Ok(()) => Some(event),
                    Err(_) => {
                        let _ = s.backend.event_destroy(ctx, event);
                        None
                    }
                }
            })
        });
        let pools = &mut self.tables.pools;
        pools.pending.push(Pending { bytes, ctx, event: marked.flatten() });
        pools.pending_bytes += bytes;
    }

    /// Stops charging the frees the driver has carried out.
    pub(super) fn release_pending(&mut self) {
        // The server's own queries, relaxed as in `reread`.
        self.relaxed(|s| {
            let backend = &s.backend;
            let pools = &mut s.tables.pools;
            pools.pending.retain(|p| {
                let Some(event) = p.event else { return true };
                if let Err(e) = backend.event_query(p.ctx, event) {
                    if e.code == CuError::NOT_READY {
                        return true;
                    }
                }
                let _ = backend.event_destroy(p.ctx, event);
                pools.pending_bytes -= p.bytes;
                false
            });
        })
    }

    /// Charges `bytes` to the tenant; if that is refused while the session's
    /// pools keep freed memory, they give it back and the charge is tried
    /// again, as the driver itself reclaims a pool's memory before failing.
    pub(super) fn charge_reclaiming(&mut self, bytes: u64) -> R<()> {
        if !self.tables.pools.pending.is_empty() {
            self.release_pending();
            self.account.settle(self.tables.charged_bytes());
        }
        match self.account.charge(bytes) {
            Err(e) if e.code == CuError::OUT_OF_MEMORY && self.trim_pools() => {
                self.account.settle(self.tables.charged_bytes());
                self.account.charge(bytes)
            }
            outcome => outcome,
        }
    }

    /// The guest's device number of the context a stream lives in.
    fn stream_device(&mut self, stream: gpuplex_protocol::Stream) -> R<i32> {
        let ctx = if stream.is_default() { self.current.0 } else { self.tables.get(Kind::Stream, stream.0)?.ctx };
        Ok(self.tables.ctx(ctx)?.device)
    }

    pub(super) fn mem_alloc_async(&mut self, req: MemAllocAsync::Request) -> R<MemAllocAsync::Reply> {
        let (ctx, stream) = self.stream(req.stream)?;
        let h = match req.pool.0 {
            0 => {
                let dev = self.stream_device(req.stream)?;
                self.current_pool(dev)?
            }
            h => h,
        };
        let obj = self.pool_obj(MemPool(h))?;
        if req.size == 0 {
            return Err(invalid("zero-byte allocation"));
        }
        self.charge_reclaiming(req.size)?;
        // What the pools hold now, read again (a synchronization may have
        // given memory back since, a reclaim just did): the allocation's
        // growth is measured from here.
        self.reread(h);
        let before = self.tables.pools.held;
        let ptr = self.backend.mem_alloc_from_pool(ctx, req.size, obj, stream)?;
        let captured = self.made_graphs && self.backend.stream_capture_status(ctx, stream).is_ok_and(|s| s != 0);
        let pools = &mut self.tables.pools;
        if let Some(stale) = pools.allocations.insert(ptr, Allocation { pool: h, size: req.size, captured }) {
            // The driver gave this address again: the allocation recorded
            // under it (a failed capture's) is gone.
            pools.forget(stale);
        }
        pools.pools.get_mut(&h).expect("checked live").live += 1;
        if captured {
            pools.held += req.size;
        }
        self.tables.add_region(ptr, Region { size: req.size, ctx: 0, owner: Some(Owner::Pool(h)) });
        self.reread(h);
        // The pool may have grown by more than was asked (it rounds up):
        // that is the tenant's too, and refused like any other charge.
        let grown = self.tables.pools.held.saturating_sub(before);
        if grown > req.size {
            if let Err(e) = self.account.charge(grown - req.size) {
                self.free_pooled(ctx, ptr, Some(stream))?;
                return Err(e);
            }
        }
        Ok(MemAllocAsync::Reply { dptr: DevPtr(ptr) })
    }

    /// Frees one of the session's pool allocations, in stream order or at
    /// once, and forgets it.
    fn free_pooled(&mut self, ctx: Obj, ptr: u64, stream: Option<Obj>) -> R<()> {
        match stream {
            Some(stream) => self.backend.mem_free_async(ctx, ptr, stream)?,
            None => self.backend.mem_free(ctx, ptr)?,
        }
        let pools = &mut self.tables.pools;
        let a = pools.allocations.remove(&ptr).expect("the caller found it");
        if pools.forget(a) {
            // The driver releases the pool once the free is carried out.
            let last = pools.pools.remove(&a.pool).map_or(0, |p| p.reserved);
            pools.held -= last;
            if let Some(stream) = stream {
                self.hold_until_done(ctx, stream, last);
            }
        }
        self.tables.remove_region(ptr);
        self.reread(a.pool);
        Ok(())
    }

    /// `cuMemFree` of a pool allocation, which the driver allows.
    pub(super) fn free_pooled_now(&mut self, ptr: u64) -> Option<R<()>> {
        self.tables.pools.allocations.contains_key(&ptr).then(|| {
            let (_, ctx) = self.current_ctx()?;
            self.free_pooled(ctx, ptr, None)
        })
    }

    pub(super) fn mem_free_async(&mut self, req: MemFreeAsync::Request) -> R<MemFreeAsync::Reply> {
        let ptr = req.dptr.0;
        // Freeing NULL is a no-op, as with free(3).
        if ptr == 0 {
            return Ok(MemFreeAsync::Reply {});
        }
        let (ctx, stream) = self.stream(req.stream)?;
        if self.tables.pools.allocations.contains_key(&ptr) {
            self.free_pooled(ctx, ptr, Some(stream))?;
        } else if self.tables.region_at(ptr).is_some_and(|r| r.owner.is_none()) {
            // A cuMemAlloc allocation may be freed in stream order too.
            self.backend.mem_free_async(ctx, ptr, stream)?;
            let size = self.tables.region_at(ptr).map_or(0, |r| r.size);
            self.tables.remove_region(ptr);
            self.hold_until_done(ctx, stream, size);
        } else {
            return Err(invalid(format!("{ptr:#x} is not an allocation")));
        }
        Ok(MemFreeAsync::Reply {})
    }

    pub(super) fn mem_pool_create(&mut self, req: MemPoolCreate::Request) -> R<MemPoolCreate::Reply> {
        if req.props.location_kind != LOCATION_DEVICE || req.props.kind != ALLOCATION_PINNED {
            return Err(CallError::new(CuError::NOT_SUPPORTED, "only pools of pinned device memory are offered"));
        }
        let dev = req.props.location;
        let props = PoolProps { location: self.backend_device(dev)?, ..req.props };
        Ok(MemPoolCreate::Reply { pool: MemPool(self.add_pool(&props, dev)?) })
    }

    pub(super) fn mem_pool_destroy(&mut self, req: cuMemPoolDestroy::Request) -> R<cuMemPoolDestroy::Reply> {
        let h = req.pool.0;
        let obj = self.pool_obj(req.pool)?;
        if self.tables.pools.defaults.values().any(|&d| d == h) {
            return Err(invalid("a device's default pool cannot be destroyed"));
        }
        // Frees still on their way keep the pool alive in the driver: the
        // reading stands, charged, until they are carried out (at once, but
        // for a capture, which a wait would break).
        let (_, ctx) = self.current_ctx()?;
        let settled = self.capturing.is_empty() && self.backend.ctx_synchronize(ctx).is_ok();
        self.reread(h);
        self.backend.mem_pool_destroy(obj)?;
        let pools = &mut self.tables.pools;
        // A device whose current pool this was goes back to its default.
        pools.current.retain(|_, &mut c| c != h);
        let p = pools.pools.get_mut(&h).expect("checked live");
        p.destroyed = true;
        if p.live == 0 && settled {
            pools.set_reserved(h, 0);
            pools.pools.remove(&h);
        }
        Ok(cuMemPoolDestroy::Reply {})
    }

    pub(super) fn mem_pool_trim(&mut self, req: cuMemPoolTrimTo::Request) -> R<cuMemPoolTrimTo::Reply> {
        let obj = self.pool_obj(req.pool)?;
        self.backend.mem_pool_trim(obj, req.minBytesToKeep)?;
        self.reread(req.pool.0);
        Ok(cuMemPoolTrimTo::Reply {})
    }

    pub(super) fn mem_pool_set_attribute(
        &mut self,
        req: MemPoolSetAttribute::Request,
    ) -> R<MemPoolSetAttribute::Reply> {
        let obj = self.pool_obj(req.pool)?;
        known_attribute(req.attr)?;
        self.backend.mem_pool_set_attribute(obj, req.attr, req.value)?;
        Ok(MemPoolSetAttribute::Reply {})
    }

    pub(super) fn mem_pool_get_attribute(
        &mut self,
        req: MemPoolGetAttribute::Request,
    ) -> R<MemPoolGetAttribute::Reply> {
        let obj = self.pool_obj(req.pool)?;
        known_attribute(req.attr)?;
        let value = self.backend.mem_pool_get_attribute(obj, req.attr)?;
        if req.attr == RESERVED_MEM_CURRENT {
            self.tables.pools.set_reserved(req.pool.0, value);
        }
        Ok(MemPoolGetAttribute::Reply { value })
    }

    pub(super) fn mem_pool_set_access(&mut self, req: MemPoolSetAccess::Request) -> R<MemPoolSetAccess::Reply> {
        let obj = self.pool_obj(req.pool)?;
        let access = self.backend_access(req.access.0)?;
        self.backend.mem_pool_set_access(obj, &access)?;
        Ok(MemPoolSetAccess::Reply {})
    }

    pub(super) fn mem_pool_get_access(&mut self, req: MemPoolGetAccess::Request) -> R<MemPoolGetAccess::Reply> {
        let obj = self.pool_obj(req.pool)?;
        let location = self.backend_location(req.locationKind, req.location)?;
        Ok(MemPoolGetAccess::Reply { flags: self.backend.mem_pool_get_access(obj, req.locationKind, location)? })
    }

    pub(super) fn device_default_pool(
        &mut self,
        req: cuDeviceGetDefaultMemPool::Request,
    ) -> R<cuDeviceGetDefaultMemPool::Reply> {
        Ok(cuDeviceGetDefaultMemPool::Reply { pool_out: MemPool(self.default_pool(req.dev)?) })
    }

    pub(super) fn device_pool(&mut self, req: cuDeviceGetMemPool::Request) -> R<cuDeviceGetMemPool::Reply> {
        Ok(cuDeviceGetMemPool::Reply { pool: MemPool(self.current_pool(req.dev)?) })
    }

    pub(super) fn device_set_pool(&mut self, req: cuDeviceSetMemPool::Request) -> R<cuDeviceSetMemPool::Reply> {
        self.backend_device(req.dev)?;
        if self.tables.pools.live(req.pool.0)?.device != req.dev {
            return Err(invalid("the pool is not the device's"));
        }
        self.tables.pools.current.insert(req.dev, req.pool.0);
        Ok(cuDeviceSetMemPool::Reply {})
    }

    /// Frees every allocation and destroys every pool, for a session that
    /// ends while its worker lives on (sessions on threads, in tests).
    pub(super) fn release_pools(&mut self) {
        let pools = std::mem::take(&mut self.tables.pools);
        let ctx = self.tables.contexts.values().find_map(|c| c.obj);
        for &ptr in pools.allocations.keys() {
            if let Some(Err(e)) = ctx.map(|ctx| self.backend.mem_free(ctx, ptr)) {
                warn!("teardown: pool allocation free failed: {e}");
            }
        }
        for p in pools.pools.values().filter(|p| !p.destroyed) {
            if let Err(e) = self.backend.mem_pool_destroy(p.obj) {
                warn!("teardown: pool destroy failed: {e}");
            }
        }
    }
}

#[allow(non_snake_case)]
impl PoolsCalls for Session {
    fn MemAllocAsync(&mut self, req: calls::MemAllocAsync::Request) -> R<calls::MemAllocAsync::Reply> {
        self.mem_alloc_async(req)
    }

    fn MemFreeAsync(&mut self, req: calls::MemFreeAsync::Request) -> R<calls::MemFreeAsync::Reply> {
        self.mem_free_async(req)
    }

    fn MemPoolCreate(&mut self, req: calls::MemPoolCreate::Request) -> R<calls::MemPoolCreate::Reply> {
        self.mem_pool_create(req)
    }

    fn cuMemPoolDestroy(&mut self, req: calls::cuMemPoolDestroy::Request) -> R<calls::cuMemPoolDestroy::Reply> {
        self.mem_pool_destroy(req)
    }

    fn cuMemPoolTrimTo(&mut self, req: calls::cuMemPoolTrimTo::Request) -> R<calls::cuMemPoolTrimTo::Reply> {
        self.mem_pool_trim(req)
    }

    fn MemPoolSetAttribute(
        &mut self,
        req: calls::MemPoolSetAttribute::Request,
    ) -> R<calls::MemPoolSetAttribute::Reply> {
        self.mem_pool_set_attribute(req)
    }

    fn MemPoolGetAttribute(
        &mut self,
        req: calls::MemPoolGetAttribute::Request,
    ) -> R<calls::MemPoolGetAttribute::Reply> {
        self.mem_pool_get_attribute(req)
    }

    fn MemPoolSetAccess(&mut self, req: calls::MemPoolSetAccess::Request) -> R<calls::MemPoolSetAccess::Reply> {
        self.mem_pool_set_access(req)
    }

    fn MemPoolGetAccess(&mut self, req: calls::MemPoolGetAccess::Request) -> R<calls::MemPoolGetAccess::Reply> {
        self.mem_pool_get_access(req)
    }

    fn cuDeviceGetDefaultMemPool(
        &mut self,
        req: calls::cuDeviceGetDefaultMemPool::Request,
    ) -> R<calls::cuDeviceGetDefaultMemPool::Reply> {
        self.device_default_pool(req)
    }

    fn cuDeviceGetMemPool(&mut self, req: calls::cuDeviceGetMemPool::Request) -> R<calls::cuDeviceGetMemPool::Reply> {
        self.device_pool(req)
    }

    fn cuDeviceSetMemPool(&mut self, req: calls::cuDeviceSetMemPool::Request) -> R<calls::cuDeviceSetMemPool::Reply> {
        self.device_set_pool(req)
    }
}
