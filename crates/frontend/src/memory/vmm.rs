//! Virtual memory management: address ranges reserved, physical allocations
//! created and mapped into them, access granted to devices. Every call goes
//! to the server, which checks ranges and handles against the session's own
//! and charges physical memory to the tenant; this side reads and writes the
//! C structures, and records which mappings the device may read and write,
//! so that copies into them are posted as into allocations (frameworks such
//! as XLA allocate this way).

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Mutex, PoisonError};

use gpuplex_protocol::{calls, AccessDesc, AllocProp, CuError, DevPtr, Seq};

use crate::client;
use crate::ffi::{check_out, entry, write_out, CUresult};

/// `CUmemLocation`.
#[repr(C)]
pub struct MemLocation {
    pub(super) kind: u32,
    pub(super) id: i32,
}

/// `CUmemAllocationProp`.
#[repr(C)]
pub struct AllocationProp {
    kind: u32,
    handle_types: u32,
    location: MemLocation,
    win32_metadata: *mut c_void,
    compression: u8,
    rdma_capable: u8,
    usage: u16,
    reserved: [u8; 4],
}

/// `CUmemAccessDesc`.
#[repr(C)]
pub struct MemAccessDesc {
    location: MemLocation,
    flags: u32,
}

/// An access descriptor as the program reads it.
pub(crate) fn c_access(a: &AccessDesc) -> MemAccessDesc {
    MemAccessDesc { location: MemLocation { kind: a.location_kind, id: a.location }, flags: a.flags }
}

/// A range `cuMemMap` mapped: its size, the context current then, and
/// whether the last `cuMemSetAccess` over it let a device read and write it.
struct Mapping {
    size: u64,
    ctx: u64,
    writable: bool,
}

/// This process's mappings, by base address.
static MAPPINGS: Mutex<BTreeMap<u64, Mapping>> = Mutex::new(BTreeMap::new());

fn mappings<T>(f: impl FnOnce(&mut BTreeMap<u64, Mapping>) -> T) -> T {
    f(&mut MAPPINGS.lock().unwrap_or_else(PoisonError::into_inner))
}

/// The device-writable mapping holding `ptr`: `(base, size, context)`.
pub(super) fn mapping(ptr: u64) -> Option<(u64, u64, u64)> {
    mappings(|m| {
        let (&base, map) = m.range(..=ptr).next_back()?;
        (ptr - base < map.size && map.writable).then_some((base, map.size, map.ctx))
    })
}

/// Forgets every mapping: they are only a hint for posting.
pub(super) fn forget_mappings() {
    mappings(|m| m.clear());
}

/// Forgets the mappings that overlap `[ptr, ptr + size)`.
fn unmapped(ptr: u64, size: u64) {
    let end = ptr.saturating_add(size);
    mappings(|m| m.retain(|&base, map| base >= end || base.saturating_add(map.size) <= ptr));
}

/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE` and `CU_MEM_LOCATION_TYPE_DEVICE`.
const READ_WRITE: u32 = 3;
const ON_DEVICE: u32 = 1;

/// The most descriptors one call sends; the server refuses more.
const MAX_ACCESS_DESCS: usize = 64;

/// # Safety
/// `desc` is NULL or valid for `count` reads.
pub(crate) unsafe fn read_access(desc: *const MemAccessDesc, count: usize) -> Result<Seq<AccessDesc>, CuError> {
    if desc.is_null() || count == 0 || count > MAX_ACCESS_DESCS {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: `count` descriptors, per the contract.
    let descs = unsafe { std::slice::from_raw_parts(desc, count) };
    let access =
        descs.iter().map(|d| AccessDesc { location_kind: d.location.kind, location: d.location.id, flags: d.flags });
    Ok(Seq(access.collect()))
}

/// # Safety
/// `prop` is NULL or valid for a read.
unsafe fn read_prop(prop: *const AllocationProp) -> Result<AllocProp, CuError> {
    // SAFETY: NULL or valid, per the contract.
    let p = unsafe { prop.as_ref() }.ok_or(CuError::INVALID_VALUE)?;
    Ok(AllocProp {
        kind: p.kind,
        handle_types: p.handle_types,
        location_kind: p.location.kind,
        location: p.location.id,
        compression: p.compression.into(),
        rdma_capable: p.rdma_capable.into(),
        usage: p.usage.into(),
    })
}

/// # Safety
/// `granularity` is valid for a write, `prop` for a read.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const AllocationProp,
    option: u32,
) -> CUresult {
    entry("cuMemGetAllocationGranularity", || {
        check_out(granularity)?;
        // SAFETY: per this function's contract.
        let prop = unsafe { read_prop(prop)? };
        let reply = client::call(calls::MemGranularity::Request { prop, option })?;
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(granularity, reply.granularity as usize) };
        Ok(())
    })
}

/// # Safety
/// `handle` is valid for a write, `prop` for a read.
#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const AllocationProp,
    flags: u64,
) -> CUresult {
    entry("cuMemCreate", || {
        check_out(handle)?;
        // SAFETY: per this function's contract.
        let prop = unsafe { read_prop(prop)? };
        let reply = client::call(calls::MemCreate::Request { size: size as u64, prop, flags })?;
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(handle, reply.handle) };
        Ok(())
    })
}

/// # Safety
/// None beyond the CUDA API's.
#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: u64) -> CUresult {
    entry("cuMemRelease", || client::call(calls::MemRelease::Request { handle }).map(drop))
}

/// # Safety
/// `handle` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(handle: *mut u64, addr: *mut c_void) -> CUresult {
    entry("cuMemRetainAllocationHandle", || {
        check_out(handle)?;
        let reply = client::call(calls::MemRetain::Request { addr: DevPtr(addr as u64) })?;
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(handle, reply.handle) };
        Ok(())
    })
}

/// # Safety
/// `prop` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationPropertiesFromHandle(prop: *mut AllocationProp, handle: u64) -> CUresult {
    entry("cuMemGetAllocationPropertiesFromHandle", || {
        check_out(prop)?;
        let p = client::call(calls::MemProperties::Request { handle })?.prop;
        // The server kept what the guest gave, so every field fits again.
        let c = AllocationProp {
            kind: p.kind,
            handle_types: p.handle_types,
            location: MemLocation { kind: p.location_kind, id: p.location },
            win32_metadata: std::ptr::null_mut(),
            compression: p.compression as u8,
            rdma_capable: p.rdma_capable as u8,
            usage: p.usage as u16,
            reserved: [0; 4],
        };
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(prop, c) };
        Ok(())
    })
}

/// # Safety
/// `ptr` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut u64,
    size: usize,
    alignment: usize,
    addr: u64,
    flags: u64,
) -> CUresult {
    entry("cuMemAddressReserve", || {
        check_out(ptr)?;
        let req = calls::MemAddressReserve::Request {
            size: size as u64,
            alignment: alignment as u64,
            addr: DevPtr(addr),
            flags,
        };
        let reply = client::call(req)?;
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(ptr, reply.ptr.0) };
        Ok(())
    })
}

/// # Safety
/// None beyond the CUDA API's.
#[no_mangle]
pub unsafe extern "C" fn cuMemAddressFree(ptr: u64, size: usize) -> CUresult {
    entry("cuMemAddressFree", || {
        client::call(calls::MemAddressFree::Request { ptr: DevPtr(ptr), size: size as u64 })?;
        unmapped(ptr, size as u64);
        Ok(())
    })
}

/// # Safety
/// None beyond the CUDA API's.
#[no_mangle]
pub unsafe extern "C" fn cuMemMap(ptr: u64, size: usize, offset: usize, handle: u64, flags: u64) -> CUresult {
    entry("cuMemMap", || {
        let req = calls::MemMap::Request { ptr: DevPtr(ptr), size: size as u64, offset: offset as u64, handle, flags };
        client::call(req)?;
        let map = Mapping { size: size as u64, ctx: crate::context::current(), writable: false };
        mappings(|m| m.insert(ptr, map));
        Ok(())
    })
}

/// # Safety
/// None beyond the CUDA API's.
#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: u64, size: usize) -> CUresult {
    entry("cuMemUnmap", || {
        client::call(calls::MemUnmap::Request { ptr: DevPtr(ptr), size: size as u64 })?;
        unmapped(ptr, size as u64);
        Ok(())
    })
}

/// # Safety
/// `desc` is valid for `count` reads.
#[no_mangle]
pub unsafe extern "C" fn cuMemSetAccess(ptr: u64, size: usize, desc: *const MemAccessDesc, count: usize) -> CUresult {
    entry("cuMemSetAccess", || {
        // SAFETY: per this function's contract.
        let access = unsafe { read_access(desc, count)? };
        let writable = access.0.iter().any(|a| a.location_kind == ON_DEVICE && a.flags == READ_WRITE);
        let req = calls::MemSetAccess::Request { ptr: DevPtr(ptr), size: size as u64, access };
        client::call(req)?;
        let end = ptr.saturating_add(size as u64);
        // A mapping only partly covered is no longer known to be writable.
        mappings(|m| {
            for (&base, map) in m.range_mut(..end) {
                let map_end = base.saturating_add(map.size);
                if map_end > ptr {
                    map.writable = writable && base >= ptr && map_end <= end;
                }
            }
        });
        Ok(())
    })
}

/// # Safety
/// `flags` is valid for a write, `location` for a read.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAccess(flags: *mut u64, location: *const MemLocation, ptr: u64) -> CUresult {
    entry("cuMemGetAccess", || {
        check_out(flags)?;
        // SAFETY: NULL or valid, per the contract.
        let loc = unsafe { location.as_ref() }.ok_or(CuError::INVALID_VALUE)?;
        let req = calls::MemGetAccess::Request { locationKind: loc.kind, location: loc.id, ptr: DevPtr(ptr) };
        let reply = client::call(req)?;
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(flags, reply.flags) };
        Ok(())
    })
}
