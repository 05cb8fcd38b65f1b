//! Stream-ordered allocation and memory pools. The server keeps every pool
//! and allocation (a session's pools are its own, and charged to its
//! tenant); this side reads and writes the C structures and records
//! allocations as `cuMemAlloc`'s are, so that copies into them can be posted.

use std::ffi::c_void;

use gpuplex_protocol::{calls, CuError, DevPtr, MemPool, PoolProps, Stream};

use super::allocations;
use super::vmm::{read_access, MemAccessDesc, MemLocation};
use crate::client;
use crate::ffi::{check_out, entry, ptsz_stream, stream, write_out, CUresult};

/// `CUmemPoolProps`.
#[repr(C)]
pub struct MemPoolProps {
    kind: u32,
    handle_types: u32,
    location: MemLocation,
    win32_security_attributes: *mut c_void,
    max_size: usize,
    usage: u16,
    reserved: [u8; 54],
}

/// Pool properties as the program gives them; what this build cannot
/// carry (reserved bytes, Windows attributes) must be empty.
pub(crate) fn read_props(p: &MemPoolProps) -> Result<PoolProps, CuError> {
    if p.reserved.iter().any(|&b| b != 0) || !p.win32_security_attributes.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    Ok(PoolProps {
        kind: p.kind,
        handle_types: p.handle_types,
        location_kind: p.location.kind,
        location: p.location.id,
        max_size: p.max_size as u64,
        usage: p.usage.into(),
    })
}

/// Pool properties as the program reads them.
pub(crate) fn c_props(p: &PoolProps) -> MemPoolProps {
    MemPoolProps {
        kind: p.kind,
        handle_types: p.handle_types,
        location: MemLocation { kind: p.location_kind, id: p.location },
        win32_security_attributes: std::ptr::null_mut(),
        max_size: p.max_size as usize,
        usage: p.usage as u16,
        reserved: [0; 54],
    }
}

/// `CU_MEM_LOCATION_TYPE_DEVICE` and `CU_MEM_ALLOCATION_TYPE_PINNED`.
const LOCATION_DEVICE: u32 = 1;
const ALLOCATION_PINNED: u32 = 1;

fn alloc(dptr: *mut u64, size: usize, pool: MemPool, stream: Stream) -> Result<(), CuError> {
    check_out(dptr)?;
    let reply = client::call(calls::MemAllocAsync::Request { size: size as u64, pool, stream })?;
    allocations(|a| a.insert(reply.dptr.0, (size as u64, crate::context::current())));
    // SAFETY: checked non-NULL; the caller vouches for it.
    unsafe { write_out(dptr, reply.dptr.0) };
    Ok(())
}

fn free(dptr: u64, stream: Stream) -> Result<(), CuError> {
    let req = calls::MemFreeAsync::Request { dptr: DevPtr(dptr), stream };
    // As with cuMemFree, one of this process's allocations is posted.
    if allocations(|a| a.remove(&dptr)).is_some() {
        client::post(req)
    } else {
        client::call(req).map(drop)
    }
}

exports! {
    cuMemAllocAsync(dptr: *mut u64, size: usize, s: *mut c_void) => alloc(dptr, size, MemPool(0), stream(s));
    cuMemAllocAsync_ptsz(dptr: *mut u64, size: usize, s: *mut c_void) => alloc(dptr, size, MemPool(0), ptsz_stream(s));
    cuMemAllocFromPoolAsync(dptr: *mut u64, size: usize, pool: *mut c_void, s: *mut c_void) => alloc(dptr, size, named(pool)?, stream(s));
    cuMemAllocFromPoolAsync_ptsz(dptr: *mut u64, size: usize, pool: *mut c_void, s: *mut c_void) => alloc(dptr, size, named(pool)?, ptsz_stream(s));
    cuMemFreeAsync(dptr: u64, s: *mut c_void) => free(dptr, stream(s));
    cuMemFreeAsync_ptsz(dptr: u64, s: *mut c_void) => free(dptr, ptsz_stream(s));
}

/// A pool argument, which has no NULL meaning where one is named.
fn named(pool: *mut c_void) -> Result<MemPool, CuError> {
    match pool as u64 {
        0 => Err(CuError::INVALID_VALUE),
        h => Ok(MemPool(h)),
    }
}

/// # Safety
/// `pool` is valid for a write, `props` for a read.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(pool: *mut *mut c_void, props: *const MemPoolProps) -> CUresult {
    entry("cuMemPoolCreate", || {
        check_out(pool)?;
        // SAFETY: NULL or valid, per the contract.
        let props = read_props(unsafe { props.as_ref() }.ok_or(CuError::INVALID_VALUE)?)?;
        let reply = client::call(calls::MemPoolCreate::Request { props })?;
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(pool, reply.pool.0 as *mut c_void) };
        Ok(())
    })
}

/// Bytes of a pool attribute's value: an `int` for the reuse policies, a
/// `cuuint64_t` for the rest; None for one this build does not know.
fn attribute_size(attr: i32) -> Option<usize> {
    match attr {
        1..=3 => Some(4),
        4..=8 => Some(8),
        _ => None,
    }
}

fn pool_attribute(name: &str, attr: i32) -> Result<usize, CuError> {
    attribute_size(attr).ok_or_else(|| {
        crate::log::warn(&format!("{name}: pool attribute {attr} is not supported by gpuplex"));
        CuError::NOT_SUPPORTED
    })
}

/// # Safety
/// `value` is valid for a read of the attribute's type.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(pool: *mut c_void, attr: i32, value: *mut c_void) -> CUresult {
    entry("cuMemPoolSetAttribute", || {
        let size = pool_attribute("cuMemPoolSetAttribute", attr)?;
        if value.is_null() {
            return Err(CuError::INVALID_VALUE);
        }
        // SAFETY: per the contract, `value` holds the attribute's type.
        let value = unsafe {
            match size {
                4 => u64::from(value.cast::<u32>().read_unaligned()),
                _ => value.cast::<u64>().read_unaligned(),
            }
        };
        client::call(calls::MemPoolSetAttribute::Request { pool: MemPool(pool as u64), attr, value }).map(drop)
    })
}

/// # Safety
/// `value` is valid for a write of the attribute's type.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAttribute(pool: *mut c_void, attr: i32, value: *mut c_void) -> CUresult {
    entry("cuMemPoolGetAttribute", || {
        let size = pool_attribute("cuMemPoolGetAttribute", attr)?;
        check_out(value)?;
        let reply = client::call(calls::MemPoolGetAttribute::Request { pool: MemPool(pool as u64), attr })?;
        // SAFETY: per the contract, `value` takes the attribute's type.
        unsafe {
            match size {
                4 => write_out(value.cast::<u32>(), reply.value as u32),
                _ => write_out(value.cast::<u64>(), reply.value),
            }
        }
        Ok(())
    })
}

/// # Safety
/// `map` is valid for `count` reads.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAccess(pool: *mut c_void, map: *const MemAccessDesc, count: usize) -> CUresult {
    entry("cuMemPoolSetAccess", || {
        // SAFETY: per this function's contract.
        let access = unsafe { read_access(map, count)? };
        client::call(calls::MemPoolSetAccess::Request { pool: MemPool(pool as u64), access }).map(drop)
    })
}

/// # Safety
/// `flags` is valid for a write, `location` for a read.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAccess(
    flags: *mut u32,
    pool: *mut c_void,
    location: *const MemLocation,
) -> CUresult {
    entry("cuMemPoolGetAccess", || {
        check_out(flags)?;
        // SAFETY: NULL or valid, per the contract.
        let loc = unsafe { location.as_ref() }.ok_or(CuError::INVALID_VALUE)?;
        let req =
            calls::MemPoolGetAccess::Request { pool: MemPool(pool as u64), locationKind: loc.kind, location: loc.id };
        let reply = client::call(req)?;
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(flags, reply.flags as u32) };
        Ok(())
    })
}

/// The device a location names, for the location forms of the pool
/// queries (CUDA 13): pools of device memory only.
///
/// # Safety
/// `location` is NULL or valid for a read.
unsafe fn device_of(name: &str, location: *const MemLocation, kind: u32) -> Result<i32, CuError> {
    // SAFETY: NULL or valid, per the contract.
    let loc = unsafe { location.as_ref() }.ok_or(CuError::INVALID_VALUE)?;
    if loc.kind != LOCATION_DEVICE || kind != ALLOCATION_PINNED {
        crate::log::warn(&format!("{name}: only pools of pinned device memory are supported by gpuplex"));
        return Err(CuError::NOT_SUPPORTED);
    }
    Ok(loc.id)
}

/// A device's default pool, or its current one, named by a location.
/// `pool` and `location` are an export's arguments: valid for a write and
/// a read.
fn location_pool(
    name: &str,
    pool: *mut *mut c_void,
    location: *const MemLocation,
    kind: u32,
    default: bool,
) -> Result<(), CuError> {
    check_out(pool)?;
    // SAFETY: per the export's contract.
    let dev = unsafe { device_of(name, location, kind)? };
    let h = if default {
        client::call(calls::cuDeviceGetDefaultMemPool::Request { dev })?.pool_out
    } else {
        client::call(calls::cuDeviceGetMemPool::Request { dev })?.pool
    };
    // SAFETY: checked non-NULL; the export's caller vouches for it.
    unsafe { write_out(pool, h.0 as *mut c_void) };
    Ok(())
}

exports! {
    cuMemGetDefaultMemPool(pool: *mut *mut c_void, location: *const MemLocation, kind: u32) =>
        location_pool("cuMemGetDefaultMemPool", pool, location, kind, true);
    cuMemGetMemPool(pool: *mut *mut c_void, location: *const MemLocation, kind: u32) =>
        location_pool("cuMemGetMemPool", pool, location, kind, false);
}

/// # Safety
/// `location` is valid for a read.
#[no_mangle]
pub unsafe extern "C" fn cuMemSetMemPool(location: *const MemLocation, kind: u32, pool: *mut c_void) -> CUresult {
    entry("cuMemSetMemPool", || {
        // SAFETY: per this function's contract.
        let dev = unsafe { device_of("cuMemSetMemPool", location, kind)? };
        client::call(calls::cuDeviceSetMemPool::Request { dev, pool: named(pool)? }).map(drop)
    })
}
