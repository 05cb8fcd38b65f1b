//! Virtual memory management on the real driver: address ranges, physical
//! allocations and their mappings. The session has checked every range and
//! handle against its own (see `session/vmm.rs`); these only translate the
//! structures and call the driver.

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

use gpuplex_protocol::{AccessDesc, AllocProp, CallError, CuError};

use super::api::{self, check, AllocationProp, MemLocation};
use super::{enter, query, size, BResult, Cuda, Obj};
use crate::backend::VirtualMemory;

/// A narrow field of the C structure, refused if the guest's value does not fit.
fn narrow<T: TryFrom<u32>>(v: u32, what: &str) -> BResult<T> {
    T::try_from(v).map_err(|_| CallError::new(CuError::INVALID_VALUE, format!("{what} {v} is out of range")))
}

/// An enum value as the driver takes it (a C `int`); an unknown one is the driver's to refuse.
pub(super) fn int(v: u32) -> c_int {
    v as c_int
}

fn c_prop(p: &AllocProp) -> BResult<AllocationProp> {
    Ok(AllocationProp {
        kind: int(p.kind),
        handle_types: int(p.handle_types),
        location: MemLocation { kind: int(p.location_kind), id: p.location },
        win32_metadata: null_mut(),
        compression: narrow(p.compression, "compression type")?,
        rdma_capable: narrow(p.rdma_capable, "gpuDirectRDMACapable")?,
        usage: narrow(p.usage, "usage")?,
        reserved: [0; 4],
    })
}

pub(super) fn granularity(prop: &AllocProp, option: u32) -> BResult<u64> {
    let prop = c_prop(prop)?;
    // SAFETY: out-pointer to a local; the structure lives across the call.
    query(|g: *mut usize| unsafe { api::cuMemGetAllocationGranularity(g, &prop, int(option)) }).map(|g| g as u64)
}

pub(super) fn create(bytes: u64, prop: &AllocProp, flags: u64) -> BResult<Obj> {
    let (prop, bytes) = (c_prop(prop)?, size(bytes)?);
    // SAFETY: as above.
    query(|h| unsafe { api::cuMemCreate(h, bytes, &prop, flags) }).map(Obj)
}

pub(super) fn release(handle: Obj) -> BResult<()> {
    // SAFETY: a handle the session holds a reference to.
    check(unsafe { api::cuMemRelease(handle.0) })
}

pub(super) fn retain(ptr: u64) -> BResult<Obj> {
    // SAFETY: `ptr` lies in one of the session's mappings; out-pointer to a local.
    query(|h| unsafe { api::cuMemRetainAllocationHandle(h, ptr as usize as *mut c_void) }).map(Obj)
}

pub(super) fn address_reserve(bytes: u64, alignment: u64, addr: u64, flags: u64) -> BResult<u64> {
    let (bytes, alignment) = (size(bytes)?, size(alignment)?);
    // SAFETY: out-pointer to a local; `addr` is only a hint.
    query(|p| unsafe { api::cuMemAddressReserve(p, bytes, alignment, addr, flags) })
}

pub(super) fn address_free(ptr: u64, bytes: u64) -> BResult<()> {
    // SAFETY: exactly one of the session's reservations, with nothing mapped in it.
    check(unsafe { api::cuMemAddressFree(ptr, size(bytes)?) })
}

pub(super) fn map(ptr: u64, bytes: u64, offset: u64, handle: Obj, flags: u64) -> BResult<()> {
    // SAFETY: a free range of one of the session's reservations, and one of its allocations.
    check(unsafe { api::cuMemMap(ptr, size(bytes)?, size(offset)?, handle.0, flags) })
}

pub(super) fn unmap(ptr: u64, bytes: u64) -> BResult<()> {
    // SAFETY: whole mappings of the session.
    check(unsafe { api::cuMemUnmap(ptr, size(bytes)?) })
}

/// Access descriptors as the driver takes them.
pub(super) fn c_access(access: &[AccessDesc]) -> Vec<api::AccessDesc> {
    access
        .iter()
        .map(|a| api::AccessDesc {
            location: MemLocation { kind: int(a.location_kind), id: a.location },
            flags: int(a.flags),
        })
        .collect()
}

pub(super) fn set_access(ptr: u64, bytes: u64, access: &[AccessDesc]) -> BResult<()> {
    let descs = c_access(access);
    // SAFETY: mapped ranges of the session; `descs` lives across the call.
    check(unsafe { api::cuMemSetAccess(ptr, size(bytes)?, descs.as_ptr(), descs.len()) })
}

pub(super) fn get_access(location_kind: u32, location: i32, ptr: u64) -> BResult<u64> {
    let location = MemLocation { kind: int(location_kind), id: location };
    // SAFETY: out-pointer to a local; the location lives across the call.
    query(|f| unsafe { api::cuMemGetAccess(f, &location, ptr) })
}

impl VirtualMemory for Cuda {
    fn mem_granularity(&self, ctx: Option<Obj>, prop: &AllocProp, option: u32) -> BResult<u64> {
        ctx.map_or(Ok(()), enter)?;
        granularity(prop, option)
    }

    fn mem_create(&self, ctx: Option<Obj>, size: u64, prop: &AllocProp, flags: u64) -> BResult<Obj> {
        ctx.map_or(Ok(()), enter)?;
        create(size, prop, flags)
    }

    fn mem_release(&self, handle: Obj) -> BResult<()> {
        release(handle)
    }

    fn mem_retain(&self, ptr: u64) -> BResult<Obj> {
        retain(ptr)
    }

    fn mem_address_reserve(&self, ctx: Option<Obj>, size: u64, alignment: u64, addr: u64, flags: u64) -> BResult<u64> {
        ctx.map_or(Ok(()), enter)?;
        address_reserve(size, alignment, addr, flags)
    }

    fn mem_address_free(&self, ptr: u64, size: u64) -> BResult<()> {
        address_free(ptr, size)
    }

    fn mem_map(&self, ptr: u64, size: u64, offset: u64, handle: Obj, flags: u64) -> BResult<()> {
        map(ptr, size, offset, handle, flags)
    }

    fn mem_unmap(&self, ptr: u64, size: u64) -> BResult<()> {
        unmap(ptr, size)
    }

    fn mem_set_access(&self, ptr: u64, size: u64, access: &[AccessDesc]) -> BResult<()> {
        set_access(ptr, size, access)
    }

    fn mem_get_access(&self, location_kind: u32, location: i32, ptr: u64) -> BResult<u64> {
        get_access(location_kind, location, ptr)
    }
}
