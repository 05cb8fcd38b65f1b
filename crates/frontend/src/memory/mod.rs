//! Device memory, copies and memsets.
//!
//! The process records its own allocations, `cuMemAlloc`'s and stream-ordered
//! ones, and the virtual-memory mappings a device may write ([`known_range`]):
//! a copy or memset inside one cannot fail on its range, so it can be posted
//! or staged without waiting; anything else is waited for, so errors come
//! back exactly when the driver would give them. How copies move their bytes
//! is in [`copy`]; pinned host memory in [`host`].

mod arrays;
mod batch;
mod copy;
pub(crate) mod copy3d;
mod hints;
mod host;
mod ipc;
pub mod lanes;
pub mod managed;
pub(crate) mod mapped;
mod mem_ops;
pub mod mirrors;
mod parallel;
pub(crate) mod pools;
pub(crate) mod posted_reads;
mod streaming;
pub(crate) mod vmm;

use std::cell::OnceCell;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Mutex, PoisonError};

use gpuplex_protocol::{calls, CuError, DevPtr, MemPool, Stream};

use crate::client;
use crate::ffi::{check_out, entry, ptsz_stream, stream, write_out, CUresult};
use copy::{dtod, dtoh, htod};

/// Waits for `stream`'s earlier work, before the front-end does the
/// stream's next step itself on host memory: with the bytes that work's
/// posted copies brought, on either connection.
fn stream_done_here(stream: Stream) -> Result<(), CuError> {
    client::call(calls::cuStreamSynchronize::Request { hStream: stream })?;
    posted_reads::wait_in_flight(0, usize::MAX);
    Ok(())
}

/// `cuMemAlloc` and stream-ordered allocations of this process: base to (size, context).
static ALLOCATIONS: Mutex<BTreeMap<u64, (u64, u64)>> = Mutex::new(BTreeMap::new());

fn allocations<T>(f: impl FnOnce(&mut BTreeMap<u64, (u64, u64)>) -> T) -> T {
    f(&mut ALLOCATIONS.lock().unwrap_or_else(PoisonError::into_inner))
}

/// The allocation, or device-writable mapping, holding `ptr`: `(base, size, context)`.
fn allocation(ptr: u64) -> Option<(u64, u64, u64)> {
    let allocated = allocations(|a| {
        let (&base, &(size, ctx)) = a.range(..=ptr).next_back()?;
        (ptr - base < size).then_some((base, size, ctx))
    });
    allocated.or_else(|| vmm::mapping(ptr))
}

/// Whether `[ptr, ptr + len)` lies inside one allocation of this process.
pub fn known_range(ptr: u64, len: usize) -> bool {
    allocation(ptr).is_some_and(|(base, size, _)| ptr.checked_add(len as u64).is_some_and(|end| end <= base + size))
}

/// # Safety
/// `dptr` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut u64, bytesize: usize) -> CUresult {
    entry("cuMemAlloc_v2", || {
        check_out(dptr)?;
        let reply = client::call(calls::cuMemAlloc_v2::Request { bytesize: bytesize as u64 })?;
        allocations(|a| a.insert(reply.dptr.0, (bytesize as u64, crate::context::current())));
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(dptr, reply.dptr.0) };
        Ok(())
    })
}

/// # Safety
/// `dptr` and `pitch` are valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut u64,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: u32,
) -> CUresult {
    entry("cuMemAllocPitch_v2", || {
        check_out(dptr)?;
        check_out(pitch)?;
        let req = calls::cuMemAllocPitch_v2::Request {
            widthInBytes: width as u64,
            height: height as u64,
            elementSizeBytes: element_size,
        };
        let reply = client::call(req)?;
        let size = reply.pitch.checked_mul(height as u64).ok_or(CuError::UNKNOWN)?;
        allocations(|a| a.insert(reply.dptr.0, (size, crate::context::current())));
        // SAFETY: checked non-NULL; the caller vouches for them.
        unsafe {
            write_out(dptr, reply.dptr.0);
            write_out(pitch, reply.pitch as usize);
        }
        Ok(())
    })
}

/// # Safety
/// None beyond the CUDA API's.
#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: u64) -> CUresult {
    entry("cuMemFree_v2", || {
        if host::managed_range(dptr, 1) {
            return host::free_allocated(dptr, true);
        }
        let req = calls::cuMemFree_v2::Request { dptr: DevPtr(dptr) };
        // Freeing one of this process's allocations cannot fail, so it is
        // posted; anything else waits for the server's verdict.
        if allocations(|a| a.remove(&dptr)).is_some() {
            client::post(req)
        } else {
            client::call(req).map(|_| ())
        }
    })
}

/// Forgets every allocation of a context the program destroyed or reset.
/// Ranges are only a hint for posting, so forgetting too much is safe.
pub fn forget_allocations() {
    allocations(|a| a.clear());
    vmm::forget_mappings();
}

/// What `cuPointerGetAttribute` knows about a pointer.
struct Pointer {
    device: bool,
    managed: bool,
    base: u64,
    size: u64,
    ctx: u64,
    devptr: Option<u64>,
    /// Device memory's pool and mapping, asked of the server once a query
    /// needs them.
    mapping: OnceCell<calls::PointerMapping::Reply>,
}

impl Pointer {
    fn new(device: bool, managed: bool, (base, size): (u64, u64), ctx: u64, devptr: Option<u64>) -> Pointer {
        Pointer { device, managed, base, size, ctx, devptr, mapping: OnceCell::new() }
    }

    /// Its pool, the mapping that holds it and whether hardware decompresses
    /// it. Host memory (managed memory too) is one block of this process's,
    /// mapped whole, from no pool.
    fn mapping(&self, ptr: u64) -> Result<&calls::PointerMapping::Reply, CuError> {
        if !self.device || self.managed {
            let whole = || calls::PointerMapping::Reply {
                pool: MemPool(0),
                base: DevPtr(self.base),
                size: self.size,
                decompress: false,
            };
            return Ok(self.mapping.get_or_init(whole));
        }
        if let Some(m) = self.mapping.get() {
            return Ok(m);
        }
        let m = match client::call(calls::PointerMapping::Request { dptr: DevPtr(ptr) }) {
            // Freed since it was looked up, by another thread.
            Err(CuError::NOT_FOUND) => return Err(CuError::INVALID_VALUE),
            m => m?,
        };
        Ok(self.mapping.get_or_init(|| m))
    }
}

/// Device memory of this process (its allocations, else any range the
/// server knows, such as module globals), or host memory known here.
fn pointer(ptr: u64) -> Result<Option<Pointer>, CuError> {
    if let Some((base, size, ctx)) = allocation(ptr) {
        return Ok(Some(Pointer::new(true, false, (base, size), ctx, Some(ptr))));
    }
    if let Some((base, size, devptr, managed)) = host::lookup(ptr) {
        // Managed memory is the device's as much as the host's.
        return Ok(Some(Pointer::new(managed, managed, (base, size), crate::context::current(), devptr)));
    }
    if mapped_here(ptr) {
        return Ok(None);
    }
    match client::call(calls::cuMemGetAddressRange_v2::Request { dptr: DevPtr(ptr) }) {
        Ok(r) => Ok(Some(Pointer::new(true, false, (r.pbase.0, r.psize), crate::context::current(), Some(ptr)))),
        Err(CuError::NOT_FOUND) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether `ptr` lies in memory this process mapped itself (its heap, its
/// stack, files): ordinary host memory, not CUDA's. Device memory is never
/// mapped into the program, and under unified addressing the driver keeps
/// device ranges apart from the process's own mappings; frameworks ask
/// about their host buffers often enough that the answer must not wait.
fn mapped_here(ptr: u64) -> bool {
    let start = ptr & !(host::PAGE - 1);
    // SAFETY: msync only looks the range up; MS_ASYNC writes nothing back
    // and fails with ENOMEM where any of the page is not mapped.
    unsafe { libc::msync(start as *mut c_void, host::PAGE as usize, libc::MS_ASYNC) == 0 }
}

/// `CU_POINTER_ATTRIBUTE_P2P_TOKENS`: deprecated, and refused by the driver
/// even where other attributes that do not apply read as zero.
const P2P_TOKENS: i32 = 5;

/// Writes attribute `attr` of `p` (at `ptr`) to `data`, each of the
/// width and value the driver writes (booleans are 4 bytes).
///
/// # Safety
/// `data` is valid for a write of the attribute's type.
unsafe fn write_attribute(data: *mut c_void, attr: i32, p: &Pointer, ptr: u64) -> Result<(), CuError> {
    const CU_MEMORYTYPE_HOST: u32 = 1;
    const CU_MEMORYTYPE_DEVICE: u32 = 2;
    let flag = |on: bool| u32::from(on);
    // SAFETY: per this function's contract, `data` takes each arm's type,
    // the attribute's type in cuda.h.
    unsafe {
        match attr {
            1 => write_out(data.cast::<u64>(), p.ctx),
            2 => write_out(data.cast::<u32>(), if p.device { CU_MEMORYTYPE_DEVICE } else { CU_MEMORYTYPE_HOST }),
            3 => write_out(data.cast::<u64>(), p.devptr.ok_or(CuError::INVALID_VALUE)?),
            4 if p.device && !p.managed => return Err(CuError::INVALID_VALUE),
            4 => write_out(data.cast::<u64>(), ptr),
            P2P_TOKENS => return Err(CuError::INVALID_VALUE),
            // SYNC_MEMOPS: never set here; managed memory always has it.
            6 => write_out(data.cast::<u32>(), flag(p.managed)),
            7 => write_out(data.cast::<u64>(), p.base), // BUFFER_ID: unique while the buffer lives
            8 => write_out(data.cast::<u32>(), flag(p.managed)),
            9 => {
                let req = calls::cuCtxGetDevice_v2::Request { ctx: gpuplex_protocol::Ctx(p.ctx) };
                write_out(data.cast::<i32>(), crate::memo::CONTEXTS.keep(0, req)?.device)
            }
            // IS_LEGACY_CUDA_IPC_CAPABLE: device allocations have handles
            // between one tenant's processes (`ipc`).
            10 => write_out(data.cast::<u32>(), flag(p.device && !p.managed)),
            11 => write_out(data.cast::<u64>(), p.base),
            12 => write_out(data.cast::<usize>(), p.size as usize),
            13 => write_out(data.cast::<u32>(), flag(p.devptr.is_some())),
            // ALLOWED_HANDLE_TYPES and IS_GPU_DIRECT_RDMA_CAPABLE: a guest's
            // memory is exported to no other device or driver.
            14 => write_out(data.cast::<u64>(), 0),
            15 => write_out(data.cast::<u32>(), 0),
            // ACCESS_FLAGS: read and write, wherever the device reaches it.
            16 => write_out(data.cast::<u32>(), if p.devptr.is_some() { 3 } else { 0 }),
            17 => write_out(data.cast::<u64>(), p.mapping(ptr)?.pool.0), // MEMPOOL_HANDLE
            18 => write_out(data.cast::<usize>(), p.mapping(ptr)?.size as usize), // MAPPING_SIZE
            19 => write_out(data.cast::<u64>(), p.mapping(ptr)?.base.0), // MAPPING_BASE_ADDR
            20 => write_out(data.cast::<u64>(), p.base),                 // MEMORY_BLOCK_ID, as BUFFER_ID
            21 => write_out(data.cast::<u32>(), flag(p.mapping(ptr)?.decompress)), // IS_HW_DECOMPRESS_CAPABLE
            _ => {
                crate::log::warn(&format!("cuPointerGetAttribute: attribute {attr} is not supported by gpuplex"));
                return Err(CuError::NOT_SUPPORTED);
            }
        }
    }
    Ok(())
}

/// What the driver answers about memory it does not know: no context,
/// type or device, the pointer as its host address, device ordinal -2.
///
/// # Safety
/// `data` is valid for a write of the attribute's type.
unsafe fn write_unknown(data: *mut c_void, attr: i32, ptr: u64) -> Result<(), CuError> {
    // SAFETY: per this function's contract.
    unsafe {
        match attr {
            4 => write_out(data.cast::<u64>(), ptr),
            P2P_TOKENS => return Err(CuError::INVALID_VALUE),
            9 => write_out(data.cast::<i32>(), -2),
            // The driver leaves the range of memory it does not know unwritten.
            11 | 12 => {}
            1..=21 => std::ptr::write_bytes(data.cast::<u8>(), 0, attribute_size(attr)),
            _ => {
                crate::log::warn(&format!("cuPointerGetAttributes: attribute {attr} is not supported by gpuplex"));
                return Err(CuError::NOT_SUPPORTED);
            }
        }
    }
    Ok(())
}

/// # Safety
/// `data` is valid for a write of the attribute's type.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(data: *mut c_void, attr: i32, ptr: u64) -> CUresult {
    entry("cuPointerGetAttribute", || {
        check_out(data)?;
        client::client()?;
        let p = pointer(ptr)?.ok_or(CuError::INVALID_VALUE)?;
        // SAFETY: per this function's contract.
        unsafe { write_attribute(data, attr, &p, ptr) }
    })
}

/// Every attribute is written, in order, as the driver does: one that does
/// not apply to the memory (a device allocation's host address) reads as
/// zero, and an attribute the driver refuses ends the call with its error.
///
/// # Safety
/// `attrs` holds `n` attributes and `data` `n` pointers, each valid for a
/// write of its attribute's type.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttributes(n: u32, attrs: *mut i32, data: *mut *mut c_void, ptr: u64) -> CUresult {
    entry("cuPointerGetAttributes", || {
        client::client()?;
        if n == 0 || attrs.is_null() || data.is_null() {
            return Err(CuError::INVALID_VALUE);
        }
        let p = pointer(ptr)?;
        for i in 0..n as usize {
            // SAFETY: per this function's contract.
            let (attr, out) = unsafe { (*attrs.add(i), *data.add(i)) };
            if out.is_null() {
                continue;
            }
            // SAFETY: per this function's contract.
            let written = unsafe {
                match &p {
                    Some(p) => write_attribute(out, attr, p, ptr),
                    None => write_unknown(out, attr, ptr),
                }
            };
            match written {
                Ok(()) => {}
                // SAFETY: as above; zero is "none" for every attribute.
                Err(CuError::INVALID_VALUE) if attr != P2P_TOKENS => unsafe {
                    std::ptr::write_bytes(out.cast::<u8>(), 0, attribute_size(attr))
                },
                Err(e) => return Err(e),
            }
        }
        Ok(())
    })
}

/// Bytes of an attribute's value, as the driver writes it.
fn attribute_size(attr: i32) -> usize {
    match attr {
        2 | 6 | 8 | 9 | 10 | 13 | 15 | 16 | 21 => 4,
        _ => 8,
    }
}

fn host_in<'a>(src: *const c_void, n: usize) -> Result<&'a [u8], CuError> {
    if src.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: the caller passes a host buffer of `n` bytes, as the API requires.
    Ok(unsafe { std::slice::from_raw_parts(src.cast::<u8>(), n) })
}

fn host_out<'a>(dst: *mut c_void, n: usize) -> Result<&'a mut [u8], CuError> {
    if dst.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: the caller passes a writable host buffer of `n` bytes.
    Ok(unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), n) })
}

exports! {
    cuMemcpyHtoD_v2(dst: u64, src: *const c_void, n: usize) => htod(dst, host_in(src, n)?, Stream::NULL, true);
    cuMemcpyHtoD_v2_ptds(dst: u64, src: *const c_void, n: usize) => htod(dst, host_in(src, n)?, Stream::PER_THREAD, true);
    cuMemcpyHtoDAsync_v2(dst: u64, src: *const c_void, n: usize, s: *mut c_void) => htod(dst, host_in(src, n)?, stream(s), false);
    cuMemcpyHtoDAsync_v2_ptsz(dst: u64, src: *const c_void, n: usize, s: *mut c_void) => htod(dst, host_in(src, n)?, ptsz_stream(s), false);
    cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, n: usize) => dtoh(host_out(dst, n)?, src, Stream::NULL, true);
    cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: u64, n: usize) => dtoh(host_out(dst, n)?, src, Stream::PER_THREAD, true);
    cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: u64, n: usize, s: *mut c_void) => dtoh(host_out(dst, n)?, src, stream(s), false);
    cuMemcpyDtoHAsync_v2_ptsz(dst: *mut c_void, src: u64, n: usize, s: *mut c_void) => dtoh(host_out(dst, n)?, src, ptsz_stream(s), false);
    cuMemcpyDtoD_v2(dst: u64, src: u64, n: usize) => dtod(dst, src, n, Stream::NULL, false);
    cuMemcpyDtoD_v2_ptds(dst: u64, src: u64, n: usize) => dtod(dst, src, n, Stream::PER_THREAD, false);
    cuMemcpyDtoDAsync_v2(dst: u64, src: u64, n: usize, s: *mut c_void) => dtod(dst, src, n, stream(s), false);
    cuMemcpyDtoDAsync_v2_ptsz(dst: u64, src: u64, n: usize, s: *mut c_void) => dtod(dst, src, n, ptsz_stream(s), false);
    // Peer copies are device-to-device copies in unified addressing: the
    // server's driver finds each end's device from its address.
    cuMemcpyPeer(dst: u64, _dc: *mut c_void, src: u64, _sc: *mut c_void, n: usize) => dtod(dst, src, n, Stream::NULL, false);
    cuMemcpyPeer_ptds(dst: u64, _dc: *mut c_void, src: u64, _sc: *mut c_void, n: usize) => dtod(dst, src, n, Stream::PER_THREAD, false);
    cuMemcpyPeerAsync(dst: u64, _dc: *mut c_void, src: u64, _sc: *mut c_void, n: usize, s: *mut c_void) => dtod(dst, src, n, stream(s), false);
    cuMemcpyPeerAsync_ptsz(dst: u64, _dc: *mut c_void, src: u64, _sc: *mut c_void, n: usize, s: *mut c_void) => dtod(dst, src, n, ptsz_stream(s), false);
    cuMemcpy(dst: u64, src: u64, n: usize) => unified_copy(dst, src, n, Stream::NULL, true);
    cuMemcpy_ptds(dst: u64, src: u64, n: usize) => unified_copy(dst, src, n, Stream::PER_THREAD, true);
    cuMemcpyAsync(dst: u64, src: u64, n: usize, s: *mut c_void) => unified_copy(dst, src, n, stream(s), false);
    cuMemcpyAsync_ptsz(dst: u64, src: u64, n: usize, s: *mut c_void) => unified_copy(dst, src, n, ptsz_stream(s), false);
}

/// Whether an address (in unified addressing) is the session's device
/// memory. Our host blocks are known here; anything else is asked of the
/// server, which knows every device range the session holds.
fn is_device(ptr: u64) -> Result<bool, CuError> {
    if host::contains(ptr) {
        return Ok(false);
    }
    if known_range(ptr, 1) {
        return Ok(true);
    }
    if mapped_here(ptr) {
        return Ok(false);
    }
    match client::call(calls::cuMemGetAddressRange_v2::Request { dptr: DevPtr(ptr) }) {
        Ok(_) => Ok(true),
        Err(CuError::NOT_FOUND) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `cuMemcpy`: the direction follows from where each pointer lives.
fn unified_copy(dst: u64, src: u64, n: usize, stream: Stream, sync: bool) -> Result<(), CuError> {
    if n == 0 {
        return Ok(());
    }
    match (is_device(dst)?, is_device(src)?) {
        (true, true) => dtod(dst, src, n, stream, sync),
        (true, false) => htod(dst, host_in(src as *const c_void, n)?, stream, sync),
        (false, true) => dtoh(host_out(dst as *mut c_void, n)?, src, stream, sync),
        (false, false) => {
            // Host to host: order after the stream's earlier work, then copy.
            client::call(calls::cuStreamSynchronize::Request { hStream: stream })?;
            let from = host_in(src as *const c_void, n)?.to_vec();
            host_out(dst as *mut c_void, n)?.copy_from_slice(&from);
            Ok(())
        }
    }
}

/// A memset of pinned memory the server cannot reach (a remote guest's):
/// the device would write it once the stream's earlier work is done, so
/// that is waited for and the rows are written here. Later work on the
/// stream reads this memory only as later calls send it, which is after.
fn memset_here(
    dst: u64,
    value: u32,
    element_size: u32,
    [row, height, pitch]: [usize; 3],
    stream: Stream,
) -> Result<(), CuError> {
    if !dst.is_multiple_of(element_size as u64) || (height > 1 && !pitch.is_multiple_of(element_size as usize)) {
        return Err(CuError::INVALID_VALUE);
    }
    stream_done_here(stream)?;
    let bytes = &value.to_ne_bytes()[..element_size as usize];
    for r in 0..height {
        let start = (dst as usize + r * pitch) as *mut u8;
        // SAFETY: the whole extent lies in one host block of this process
        // (`host::local_only`), and `row` bytes from each row start are in it.
        let row = unsafe { std::slice::from_raw_parts_mut(start, row) };
        for (i, b) in row.iter_mut().enumerate() {
            *b = bytes[i % bytes.len()];
        }
    }
    Ok(())
}

/// Sets `height` rows of `width` elements, `pitch` bytes apart.
fn memset(
    dst: u64,
    value: u32,
    element_size: u32,
    [width, height, pitch]: [usize; 3],
    stream: Stream,
    sync: bool,
) -> Result<(), CuError> {
    let req = calls::Memset::Request {
        dst: DevPtr(dst),
        pitch: pitch as u64,
        value,
        elementSize: element_size,
        width: width as u64,
        height: height as u64,
        stream,
        sync,
    };
    let row = width.checked_mul(element_size as usize);
    let extent = row.and_then(|row| pitch.checked_mul(height.saturating_sub(1))?.checked_add(row));
    let checkable = height <= 1 || pitch >= row.unwrap_or(usize::MAX);
    if let (Some(row), Some(extent)) = (row, extent) {
        if checkable && extent > 0 && host::local_only(dst, extent) && !crate::graph::capturing() {
            return memset_here(dst, value, element_size, [row, height, pitch], stream);
        }
    }
    if !sync && checkable && extent.is_some_and(|e| known_range(dst, e)) {
        return client::post(req);
    }
    client::call(req).map(|_| ())
}

exports! {
    cuMemsetD8_v2(dst: u64, v: u8, n: usize) => memset(dst, v as u32, 1, [n, 1, 0], Stream::NULL, true);
    cuMemsetD8_v2_ptds(dst: u64, v: u8, n: usize) => memset(dst, v as u32, 1, [n, 1, 0], Stream::PER_THREAD, true);
    cuMemsetD16_v2(dst: u64, v: u16, n: usize) => memset(dst, v as u32, 2, [n, 1, 0], Stream::NULL, true);
    cuMemsetD16_v2_ptds(dst: u64, v: u16, n: usize) => memset(dst, v as u32, 2, [n, 1, 0], Stream::PER_THREAD, true);
    cuMemsetD32_v2(dst: u64, v: u32, n: usize) => memset(dst, v, 4, [n, 1, 0], Stream::NULL, true);
    cuMemsetD32_v2_ptds(dst: u64, v: u32, n: usize) => memset(dst, v, 4, [n, 1, 0], Stream::PER_THREAD, true);
    cuMemsetD8Async(dst: u64, v: u8, n: usize, s: *mut c_void) => memset(dst, v as u32, 1, [n, 1, 0], stream(s), false);
    cuMemsetD8Async_ptsz(dst: u64, v: u8, n: usize, s: *mut c_void) => memset(dst, v as u32, 1, [n, 1, 0], ptsz_stream(s), false);
    cuMemsetD16Async(dst: u64, v: u16, n: usize, s: *mut c_void) => memset(dst, v as u32, 2, [n, 1, 0], stream(s), false);
    cuMemsetD16Async_ptsz(dst: u64, v: u16, n: usize, s: *mut c_void) => memset(dst, v as u32, 2, [n, 1, 0], ptsz_stream(s), false);
    cuMemsetD32Async(dst: u64, v: u32, n: usize, s: *mut c_void) => memset(dst, v, 4, [n, 1, 0], stream(s), false);
    cuMemsetD32Async_ptsz(dst: u64, v: u32, n: usize, s: *mut c_void) => memset(dst, v, 4, [n, 1, 0], ptsz_stream(s), false);
    cuMemsetD2D8_v2(dst: u64, pitch: usize, v: u8, w: usize, h: usize) => memset(dst, v as u32, 1, [w, h, pitch], Stream::NULL, true);
    cuMemsetD2D8_v2_ptds(dst: u64, pitch: usize, v: u8, w: usize, h: usize) => memset(dst, v as u32, 1, [w, h, pitch], Stream::PER_THREAD, true);
    cuMemsetD2D16_v2(dst: u64, pitch: usize, v: u16, w: usize, h: usize) => memset(dst, v as u32, 2, [w, h, pitch], Stream::NULL, true);
    cuMemsetD2D16_v2_ptds(dst: u64, pitch: usize, v: u16, w: usize, h: usize) => memset(dst, v as u32, 2, [w, h, pitch], Stream::PER_THREAD, true);
    cuMemsetD2D32_v2(dst: u64, pitch: usize, v: u32, w: usize, h: usize) => memset(dst, v, 4, [w, h, pitch], Stream::NULL, true);
    cuMemsetD2D32_v2_ptds(dst: u64, pitch: usize, v: u32, w: usize, h: usize) => memset(dst, v, 4, [w, h, pitch], Stream::PER_THREAD, true);
    cuMemsetD2D8Async(dst: u64, pitch: usize, v: u8, w: usize, h: usize, s: *mut c_void) => memset(dst, v as u32, 1, [w, h, pitch], stream(s), false);
    cuMemsetD2D8Async_ptsz(dst: u64, pitch: usize, v: u8, w: usize, h: usize, s: *mut c_void) => memset(dst, v as u32, 1, [w, h, pitch], ptsz_stream(s), false);
    cuMemsetD2D16Async(dst: u64, pitch: usize, v: u16, w: usize, h: usize, s: *mut c_void) => memset(dst, v as u32, 2, [w, h, pitch], stream(s), false);
    cuMemsetD2D16Async_ptsz(dst: u64, pitch: usize, v: u16, w: usize, h: usize, s: *mut c_void) => memset(dst, v as u32, 2, [w, h, pitch], ptsz_stream(s), false);
    cuMemsetD2D32Async(dst: u64, pitch: usize, v: u32, w: usize, h: usize, s: *mut c_void) => memset(dst, v, 4, [w, h, pitch], stream(s), false);
    cuMemsetD2D32Async_ptsz(dst: u64, pitch: usize, v: u32, w: usize, h: usize, s: *mut c_void) => memset(dst, v, 4, [w, h, pitch], ptsz_stream(s), false);
}
