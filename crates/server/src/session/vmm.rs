//! A session's virtual memory: the address ranges it reserved, the physical
//! allocations it created and where they are mapped.
//!
//! Every range and allocation handle a guest names is checked against these
//! before the backend sees it, as device pointers and handles are elsewhere.
//! A mapped range becomes a region of the session's tables, so copies and
//! memsets may touch it like an allocation, across adjacent mappings too (a
//! growing pool maps piece after piece of one range). A physical
//! allocation is charged to the tenant from its creation until it is both
//! released and unmapped, which is when the driver frees it.

use std::collections::BTreeMap;

use gpuplex_protocol::calls::*;
use gpuplex_protocol::{calls, AccessDesc, AllocProp, CallError, CuError, DevPtr, VirtualMemoryCalls, LOCATION_DEVICE};

use super::tables::{HandleMap, Owner, Region};
use super::{invalid, Session};
use crate::backend::Obj;

type R<T> = Result<T, CallError>;

/// The most access descriptors one `cuMemSetAccess` may carry: one per
/// device, and no machine has this many.
const MAX_ACCESS_DESCS: usize = 64;

#[derive(Default)]
pub struct Vmm {
    /// Reserved ranges: base to size.
    reserved: BTreeMap<u64, u64>,
    /// Physical allocations by the session's handle.
    physical: HandleMap<u64, Physical>,
    /// Mappings: base to (size, allocation handle).
    mapped: BTreeMap<u64, (u64, u64)>,
    /// Bytes of the physical allocations the driver still holds.
    held: u64,
}

struct Physical {
    obj: Obj,
    size: u64,
    /// As the guest asked for it, its device numbered as the guest sees it.
    prop: AllocProp,
    /// The guest's references (creation and retains); the handle is its to
    /// use while there are any.
    refs: u32,
    mappings: u32,
}

impl Vmm {
    /// Device memory the session's physical allocations hold.
    pub fn held_bytes(&self) -> u64 {
        self.held
    }

    fn live(&mut self, handle: u64) -> R<&mut Physical> {
        self.physical
            .get_mut(&handle)
            .filter(|p| p.refs > 0)
            .ok_or_else(|| invalid(format!("{handle:#x} is not an allocation handle")))
    }

    /// Forgets an allocation the driver has freed: released and unmapped.
    fn drop_if_done(&mut self, handle: u64) {
        if let Some(p) = self.physical.get(&handle).filter(|p| p.refs == 0 && p.mappings == 0) {
            self.held -= p.size;
            self.physical.remove(&handle);
        }
    }

    /// The mappings that make up exactly `[ptr, ptr + size)`, back to back,
    /// as `(base, size, handle)`.
    fn mappings_of(&self, ptr: u64, size: u64) -> R<Vec<(u64, u64, u64)>> {
        let end = ptr.checked_add(size).filter(|_| size > 0).ok_or_else(|| invalid("empty or overflowing range"))?;
        let mut found = Vec::new();
        let mut at = ptr;
        for (&base, &(len, handle)) in self.mapped.range(ptr..end) {
            if base != at {
                break;
            }
            found.push((base, len, handle));
            at = base + len;
        }
        if at != end {
            return Err(invalid(format!("{size} bytes at {ptr:#x} are not whole mappings of the session")));
        }
        Ok(found)
    }

    /// The mapping holding `ptr`, as `(base, handle)`.
    fn mapping_at(&self, ptr: u64) -> R<(u64, u64)> {
        self.mapped
            .range(..=ptr)
            .next_back()
            .filter(|(&base, &(len, _))| ptr - base < len)
            .map(|(&base, &(_, handle))| (base, handle))
            .ok_or_else(|| invalid(format!("{ptr:#x} is not mapped")))
    }

    /// Whether `[ptr, end)` lies in one reservation and clear of every mapping.
    fn free_to_map(&self, ptr: u64, end: u64) -> bool {
        let reserved = self.reserved.range(..=ptr).next_back().is_some_and(|(&b, &s)| end <= b + s);
        let before = self.mapped.range(..ptr).next_back().is_some_and(|(&b, &(s, _))| b + s > ptr);
        reserved && !before && self.mapped.range(ptr..end).next().is_none()
    }
}

impl Session {
    /// An allocation's properties with the guest's device numbered as the
    /// backend's. The handle types asked for go to the driver as they are:
    /// programs ask for descriptors they never export, and the driver says
    /// whether it can make them; exporting one is what is not offered.
    fn backend_prop(&self, prop: &AllocProp) -> R<AllocProp> {
        let mut backend = prop.clone();
        if prop.location_kind == LOCATION_DEVICE {
            backend.location = self.backend_device(prop.location)?;
        }
        Ok(backend)
    }

    /// The guest's current context, if it has a live one.
    pub(super) fn context_if_any(&mut self) -> Option<Obj> {
        self.current_ctx().ok().map(|(_, ctx)| ctx)
    }

    pub(super) fn mem_granularity(&mut self, req: MemGranularity::Request) -> R<MemGranularity::Reply> {
        let prop = self.backend_prop(&req.prop)?;
        let ctx = self.context_if_any();
        Ok(MemGranularity::Reply { granularity: self.backend.mem_granularity(ctx, &prop, req.option)? })
    }

    pub(super) fn mem_create(&mut self, req: MemCreate::Request) -> R<MemCreate::Reply> {
        let prop = self.backend_prop(&req.prop)?;
        if req.size == 0 {
            return Err(invalid("zero-byte allocation"));
        }
        self.account.charge(req.size)?;
        let ctx = self.context_if_any();
        let obj = self.backend.mem_create(ctx, req.size, &prop, req.flags)?;
        let handle = self.tables.issue();
        let vmm = &mut self.tables.vmm;
        vmm.physical.insert(handle, Physical { obj, size: req.size, prop: req.prop, refs: 1, mappings: 0 });
        vmm.held += req.size;
        Ok(MemCreate::Reply { handle })
    }

    pub(super) fn mem_release(&mut self, req: MemRelease::Request) -> R<MemRelease::Reply> {
        let obj = self.tables.vmm.live(req.handle)?.obj;
        self.backend.mem_release(obj)?;
        self.tables.vmm.live(req.handle)?.refs -= 1;
        self.tables.vmm.drop_if_done(req.handle);
        Ok(MemRelease::Reply {})
    }

    pub(super) fn mem_retain(&mut self, req: MemRetain::Request) -> R<MemRetain::Reply> {
        let (_, handle) = self.tables.vmm.mapping_at(req.addr.0)?;
        self.backend.mem_retain(req.addr.0)?;
        self.tables.vmm.physical.get_mut(&handle).expect("a mapping's allocation").refs += 1;
        Ok(MemRetain::Reply { handle })
    }

    pub(super) fn mem_properties(&mut self, req: MemProperties::Request) -> R<MemProperties::Reply> {
        Ok(MemProperties::Reply { prop: self.tables.vmm.live(req.handle)?.prop.clone() })
    }

    pub(super) fn mem_address_reserve(&mut self, req: MemAddressReserve::Request) -> R<MemAddressReserve::Reply> {
        if req.size == 0 {
            return Err(invalid("zero-byte reservation"));
        }
        let ctx = self.context_if_any();
        let ptr = self.backend.mem_address_reserve(ctx, req.size, req.alignment, req.addr.0, req.flags)?;
        self.tables.vmm.reserved.insert(ptr, req.size);
        Ok(MemAddressReserve::Reply { ptr: DevPtr(ptr) })
    }

    pub(super) fn mem_address_free(&mut self, req: MemAddressFree::Request) -> R<MemAddressFree::Reply> {
        let (ptr, vmm) = (req.ptr.0, &self.tables.vmm);
        if vmm.reserved.get(&ptr) != Some(&req.size) {
            return Err(invalid(format!("{} bytes at {ptr:#x} are not a reservation of the session", req.size)));
        }
        if vmm.mapped.range(ptr..ptr + req.size).next().is_some() {
            return Err(invalid("the reservation still has mappings"));
        }
        self.backend.mem_address_free(ptr, req.size)?;
        self.tables.vmm.reserved.remove(&ptr);
        Ok(MemAddressFree::Reply {})
    }

    pub(super) fn mem_map(&mut self, req: MemMap::Request) -> R<MemMap::Reply> {
        let (ptr, size) = (req.ptr.0, req.size);
        let p = self.tables.vmm.live(req.handle)?;
        let fits = req.offset.checked_add(size).is_some_and(|end| end <= p.size);
        let end =
            ptr.checked_add(size).filter(|_| size > 0 && fits).ok_or_else(|| invalid("outside the allocation"))?;
        let obj = p.obj;
        if !self.tables.vmm.free_to_map(ptr, end) {
            return Err(invalid(format!("{size} bytes at {ptr:#x} are not a free part of one reservation")));
        }
        self.backend.mem_map(ptr, size, req.offset, obj, req.flags)?;
        let vmm = &mut self.tables.vmm;
        vmm.mapped.insert(ptr, (size, req.handle));
        vmm.live(req.handle)?.mappings += 1;
        self.tables.add_region(ptr, Region { size, ctx: 0, owner: Some(Owner::Mapping(req.handle)) });
        Ok(MemMap::Reply {})
    }

    pub(super) fn mem_unmap(&mut self, req: MemUnmap::Request) -> R<MemUnmap::Reply> {
        let mappings = self.tables.vmm.mappings_of(req.ptr.0, req.size)?;
        self.backend.mem_unmap(req.ptr.0, req.size)?;
        for (base, _, handle) in mappings {
            self.tables.vmm.mapped.remove(&base);
            self.tables.remove_region(base);
            if let Some(p) = self.tables.vmm.physical.get_mut(&handle) {
                p.mappings -= 1;
            }
            self.tables.vmm.drop_if_done(handle);
        }
        Ok(MemUnmap::Reply {})
    }

    /// Access descriptors with their devices numbered as the backend's.
    pub(super) fn backend_access(&self, mut access: Vec<AccessDesc>) -> R<Vec<AccessDesc>> {
        if access.is_empty() || access.len() > MAX_ACCESS_DESCS {
            return Err(invalid(format!("{} access descriptors", access.len())));
        }
        for a in &mut access {
            a.location = self.backend_location(a.location_kind, a.location)?;
        }
        Ok(access)
    }

    /// A location whose access is asked about or granted: devices only.
    pub(super) fn backend_location(&self, kind: u32, location: i32) -> R<i32> {
        if kind != LOCATION_DEVICE {
            return Err(CallError::new(CuError::NOT_SUPPORTED, "access is granted to devices only"));
        }
        self.backend_device(location)
    }

    pub(super) fn mem_set_access(&mut self, req: MemSetAccess::Request) -> R<MemSetAccess::Reply> {
        let access = self.backend_access(req.access.0)?;
        self.tables.vmm.mappings_of(req.ptr.0, req.size)?;
        self.backend.mem_set_access(req.ptr.0, req.size, &access)?;
        Ok(MemSetAccess::Reply {})
    }

    pub(super) fn mem_get_access(&mut self, req: MemGetAccess::Request) -> R<MemGetAccess::Reply> {
        let location = self.backend_location(req.locationKind, req.location)?;
        self.tables.vmm.mapping_at(req.ptr.0)?;
        Ok(MemGetAccess::Reply { flags: self.backend.mem_get_access(req.locationKind, location, req.ptr.0)? })
    }

    /// Unmaps, releases and frees everything, for a session that ends while
    /// its worker lives on (sessions on threads, in tests).
    pub(super) fn release_virtual_memory(&mut self) {
        let vmm = std::mem::take(&mut self.tables.vmm);
        for (&base, &(size, _)) in &vmm.mapped {
            if let Err(e) = self.backend.mem_unmap(base, size) {
                tracing::warn!("teardown: unmap failed: {e}");
            }
        }
        for p in vmm.physical.values() {
            for _ in 0..p.refs {
                if let Err(e) = self.backend.mem_release(p.obj) {
                    tracing::warn!("teardown: release failed: {e}");
                }
            }
        }
        for (&base, &size) in &vmm.reserved {
            if let Err(e) = self.backend.mem_address_free(base, size) {
                tracing::warn!("teardown: address free failed: {e}");
            }
        }
    }
}

#[allow(non_snake_case)]
impl VirtualMemoryCalls for Session {
    fn MemGranularity(&mut self, req: calls::MemGranularity::Request) -> R<calls::MemGranularity::Reply> {
        self.mem_granularity(req)
    }

    fn MemCreate(&mut self, req: calls::MemCreate::Request) -> R<calls::MemCreate::Reply> {
        self.mem_create(req)
    }

    fn MemRelease(&mut self, req: calls::MemRelease::Request) -> R<calls::MemRelease::Reply> {
        self.mem_release(req)
    }

    fn MemRetain(&mut self, req: calls::MemRetain::Request) -> R<calls::MemRetain::Reply> {
        self.mem_retain(req)
    }

    fn MemProperties(&mut self, req: calls::MemProperties::Request) -> R<calls::MemProperties::Reply> {
        self.mem_properties(req)
    }

    fn MemAddressReserve(&mut self, req: calls::MemAddressReserve::Request) -> R<calls::MemAddressReserve::Reply> {
        self.mem_address_reserve(req)
    }

    fn MemAddressFree(&mut self, req: calls::MemAddressFree::Request) -> R<calls::MemAddressFree::Reply> {
        self.mem_address_free(req)
    }

    fn MemMap(&mut self, req: calls::MemMap::Request) -> R<calls::MemMap::Reply> {
        self.mem_map(req)
    }

    fn MemUnmap(&mut self, req: calls::MemUnmap::Request) -> R<calls::MemUnmap::Reply> {
        self.mem_unmap(req)
    }

    fn MemSetAccess(&mut self, req: calls::MemSetAccess::Request) -> R<calls::MemSetAccess::Reply> {
        self.mem_set_access(req)
    }

    fn MemGetAccess(&mut self, req: calls::MemGetAccess::Request) -> R<calls::MemGetAccess::Reply> {
        self.mem_get_access(req)
    }
}
