//! Managed memory: one pointer for the program and its kernels.
//!
//! A managed allocation is host memory shared with the server and
//! registered with its driver for the device, mapped in both processes at
//! the same address (`host::alloc_managed`). The program reads and writes it
//! in place; kernels reach the same pages through the device's mapping of
//! host memory. So both always see the same bytes, which is at least the
//! coherence the driver promises (the other side's writes are seen after
//! the synchronization that orders them), at the cost of every device
//! access crossing the host link instead of device memory. Migration hints
//! (prefetch, advice, stream attachment) therefore change nothing and are
//! only checked. It needs a local server: without shared memory there is no
//! memory both sides can reach, and allocation answers
//! `CUDA_ERROR_NOT_SUPPORTED`.
//!
//! A library's `__managed__` variables are placed by the server's driver,
//! so they cannot be put in shared memory. The server shares a mirror of
//! their pages instead, which is mapped here at the variables' own
//! addresses, and copies each variable to and from it around the calls that
//! reach the device (`server/src/session/managed.rs`).

use std::ffi::c_void;
use std::sync::{Mutex, PoisonError};

use gpuplex_protocol::{calls, CuError, DevPtr, Library};
use gpuplex_transport::shm::Region;

use super::{hints, host};
use crate::client;
use crate::ffi::{check_out, entry, write_out, CUresult};

/// Mirrored pages of managed variables, `(start, end)`, mapped for good.
static MIRRORS: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());

/// The `__managed__` variable `name` of `library`, `(address, size)`, with
/// its pages mirrored here; None where they cannot be (no shared memory, or
/// something of this process's own at those addresses).
pub fn variable(library: u64, name: String) -> Result<Option<(DevPtr, u64)>, CuError> {
    if !host::shared_memory() {
        return Ok(None);
    }
    let mut conn = client::lock()?;
    // The runtime goes on with whatever pointer it gets, so a failure here
    // leaves the caller's copy of the variable to answer.
    let (dptr, bytes, at, len, pages) = match conn.heap.clone() {
        None => match conn.call(calls::LibraryGetManaged::Request { library: Library(library), name }) {
            Ok(r) => {
                let fd = if r.mirrorLen > 0 { Some(conn.recv_fd()?) } else { None };
                let pages = fd.map(|fd| Region::open_at(fd, r.mirror as usize as *mut u8).map_err(|e| e.to_string()));
                (r.dptr, r.bytes, r.mirror, r.mirrorLen, pages)
            }
            Err(e) => return Ok(unmirrored(e)),
        },
        // A VM guest's new pages are chunks of its region's heap.
        Some(heap) => match conn.call(calls::LibraryGetManagedInPlace::Request { library: Library(library), name }) {
            Ok(r) => {
                let at = r.mirror as usize as *mut u8;
                let pages = (r.mirrorLen > 0)
                    .then(|| heap.view(r.offset as usize, r.mirrorLen as usize, at).map_err(|e| e.to_string()));
                (r.dptr, r.bytes, r.mirror, r.mirrorLen, pages)
            }
            Err(e) => return Ok(unmirrored(e)),
        },
    };
    drop(conn);
    let mut mirrors = MIRRORS.lock().unwrap_or_else(PoisonError::into_inner);
    match pages {
        Some(Ok(region)) if region.as_ptr() as u64 == at && region.len() as u64 == len => {
            // The program keeps the variables' addresses as long as it runs.
            std::mem::forget(region);
            mirrors.push((at, at.saturating_add(len)));
        }
        Some(_) => crate::log::warn(&format!("a managed variable's pages at {at:#x} are taken in this process")),
        None => {}
    }
    let page = |p: u64| mirrors.iter().any(|&(start, end)| start <= p && p < end);
    let (start, end) = (dptr.0, dptr.0.saturating_add(bytes));
    let whole = (start & !(host::PAGE - 1)..end).step_by(host::PAGE as usize).all(page);
    Ok(whole.then_some((dptr, bytes)))
}

/// A variable the server would not mirror: the caller's copy answers.
fn unmirrored(e: CuError) -> Option<(DevPtr, u64)> {
    crate::log::warn(&format!("a managed variable cannot be mirrored: {e:?}"));
    None
}

/// `CU_MEM_ATTACH_GLOBAL`, `_HOST`, `_SINGLE`.
const ATTACH_GLOBAL: u32 = 1;
const ATTACH_HOST: u32 = 2;
const ATTACH_SINGLE: u32 = 4;
/// `CU_DEVICE_CPU`.
const DEVICE_CPU: i32 = -1;

/// `CUmemLocation`, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemLocation {
    kind: u32,
    id: i32,
}

fn alloc(dptr: *mut u64, size: usize, flags: u32) -> Result<(), CuError> {
    check_out(dptr)?;
    crate::client::client()?;
    if crate::context::current() == 0 {
        return Err(CuError::INVALID_CONTEXT);
    }
    if size == 0 || (flags != ATTACH_GLOBAL && flags != ATTACH_HOST) {
        return Err(CuError::INVALID_VALUE);
    }
    let Some(p) = host::alloc_managed(size)? else {
        crate::log::warn("managed memory needs a local server (shared memory); returning CUDA_ERROR_NOT_SUPPORTED");
        return Err(CuError::NOT_SUPPORTED);
    };
    hints::forget(p, size as u64);
    // SAFETY: checked non-NULL; the caller vouches for it.
    unsafe { write_out(dptr, p) };
    Ok(())
}

/// # Safety
/// `dptr` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(dptr: *mut u64, size: usize, flags: u32) -> CUresult {
    entry("cuMemAllocManaged", || alloc(dptr, size, flags))
}

/// A range a hint may name: inside one managed allocation.
fn hinted(ptr: u64, count: usize) -> Result<(), CuError> {
    crate::client::client()?;
    if count == 0 || !host::managed_range(ptr, count as u64) {
        return Err(CuError::INVALID_VALUE);
    }
    Ok(())
}

/// A device the program may name, or the host.
fn place(device: i32) -> Result<(), CuError> {
    let devices = crate::client::client()?.welcome.devices.0.len();
    if device == DEVICE_CPU || usize::try_from(device).is_ok_and(|d| d < devices) {
        Ok(())
    } else {
        Err(CuError::INVALID_DEVICE)
    }
}

/// `CU_MEM_LOCATION_TYPE_DEVICE`, `_HOST`, `_HOST_NUMA`, `_HOST_NUMA_CURRENT`.
fn location(l: MemLocation) -> Result<(), CuError> {
    match l.kind {
        1 => place(l.id),
        2..=4 => Ok(()),
        _ => Err(CuError::INVALID_VALUE),
    }
}

/// `CU_MEM_ADVISE_SET_READ_MOSTLY` to `CU_MEM_ADVISE_UNSET_ACCESSED_BY`.
fn advice(advice: u32) -> Result<(), CuError> {
    if (1..=6).contains(&advice) {
        Ok(())
    } else {
        Err(CuError::INVALID_VALUE)
    }
}

/// A legacy device number as a location: `CU_DEVICE_CPU` is the host.
fn at_device(device: i32) -> hints::Location {
    if device == DEVICE_CPU {
        (hints::HOST, 0)
    } else {
        (hints::DEVICE, device)
    }
}

fn prefetch(p: u64, n: usize, to: hints::Location) -> Result<(), CuError> {
    hinted(p, n)?;
    location(MemLocation { kind: to.0, id: to.1 })?;
    hints::prefetched(p, n as u64, to);
    Ok(())
}

fn advise(p: u64, n: usize, a: u32, at: hints::Location) -> Result<(), CuError> {
    hinted(p, n)?;
    advice(a)?;
    location(MemLocation { kind: at.0, id: at.1 })?;
    hints::advise(p, n as u64, a, at);
    Ok(())
}

/// `cuMemRangeGetAttribute`: one attribute into `data` (`size` bytes).
///
/// # Safety
/// `data` is valid for `size` bytes of writes.
unsafe fn range_attribute(data: *mut c_void, size: usize, attr: u32, p: u64, n: usize) -> Result<(), CuError> {
    check_out(data)?;
    hinted(p, n)?;
    let values = hints::attribute(p, n as u64, attr, size)?;
    // SAFETY: `size` bytes, as many as the values take; per the contract.
    unsafe { std::ptr::copy_nonoverlapping(values.as_ptr().cast::<u8>(), data.cast::<u8>(), values.len() * 4) };
    Ok(())
}

/// `cuMemRangeGetAttributes`: `count` attributes, each into its buffer.
///
/// # Safety
/// Each array holds `count` entries, each buffer its size's bytes.
unsafe fn range_attributes(
    data: *const *mut c_void,
    sizes: *const usize,
    attrs: *const u32,
    count: usize,
    p: u64,
    n: usize,
) -> Result<(), CuError> {
    if count == 0 || data.is_null() || sizes.is_null() || attrs.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    for i in 0..count {
        // SAFETY: `count` entries each, per the contract.
        unsafe { range_attribute(*data.add(i), *sizes.add(i), *attrs.add(i), p, n)? };
    }
    Ok(())
}

// Hints are checked, and kept for the range attributes; they move nothing:
// the memory is where both sides reach it already.
exports! {
    cuMemPrefetchAsync(p: u64, n: usize, dev: i32, _s: *mut c_void) => place(dev).and_then(|()| prefetch(p, n, at_device(dev)));
    cuMemPrefetchAsync_ptsz(p: u64, n: usize, dev: i32, _s: *mut c_void) => place(dev).and_then(|()| prefetch(p, n, at_device(dev)));
    cuMemPrefetchAsync_v2(p: u64, n: usize, l: MemLocation, _f: u32, _s: *mut c_void) => prefetch(p, n, (l.kind, l.id));
    cuMemPrefetchAsync_v2_ptsz(p: u64, n: usize, l: MemLocation, _f: u32, _s: *mut c_void) => prefetch(p, n, (l.kind, l.id));
    cuMemAdvise(p: u64, n: usize, a: u32, dev: i32) => place(dev).and_then(|()| advise(p, n, a, at_device(dev)));
    cuMemAdvise_v2(p: u64, n: usize, a: u32, l: MemLocation) => advise(p, n, a, (l.kind, l.id));
    cuMemRangeGetAttribute(data: *mut c_void, size: usize, attr: u32, p: u64, n: usize) =>
        // SAFETY: per the export's contract.
        unsafe { range_attribute(data, size, attr, p, n) };
    cuMemRangeGetAttributes(data: *const *mut c_void, sizes: *const usize, attrs: *const u32, count: usize, p: u64, n: usize) =>
        // SAFETY: per the export's contract.
        unsafe { range_attributes(data, sizes, attrs, count, p, n) };
}

fn attach(ptr: u64, length: usize, flags: u32) -> Result<(), CuError> {
    if ![ATTACH_GLOBAL, ATTACH_HOST, ATTACH_SINGLE].contains(&flags) {
        return Err(CuError::INVALID_VALUE);
    }
    // A length of 0 attaches the whole allocation.
    hinted(ptr, length.max(1))
}

/// # Safety
/// None beyond the CUDA API's.
#[no_mangle]
pub unsafe extern "C" fn cuStreamAttachMemAsync(_s: *mut c_void, ptr: u64, length: usize, flags: u32) -> CUresult {
    entry("cuStreamAttachMemAsync", || attach(ptr, length, flags))
}

/// # Safety
/// None beyond the CUDA API's.
#[no_mangle]
pub unsafe extern "C" fn cuStreamAttachMemAsync_ptsz(_s: *mut c_void, ptr: u64, length: usize, flags: u32) -> CUresult {
    entry("cuStreamAttachMemAsync_ptsz", || attach(ptr, length, flags))
}
