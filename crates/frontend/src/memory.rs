//! Copies, memsets and host memory.
//!
//! Host buffers never leave this process, so every copy that touches one
//! carries its bytes through the connection, in chunks that fit a frame.
//! Copies complete before they return (asynchronous ones too), which is
//! within what CUDA allows and keeps stream order trivially exact.
//! "Pinned" host memory is ordinary memory tracked here, so that its
//! queries and frees behave; zero-copy mapping needs a shared arena and is
//! refused (`cuMemHostGetDevicePointer` answers NOT_SUPPORTED).

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Mutex, PoisonError};

use gpuplex_protocol::{calls, CuError, DevPtr, Stream};

use crate::client;
use crate::ffi::{check_out, entry, ptsz_stream, stream, write_out, CUresult};

/// Bytes per copy call: well under the frame limit.
const CHUNK: usize = 16 << 20;

const CU_MEMHOSTREGISTER_IOMEMORY: u32 = 0x04;
const KNOWN_HOSTALLOC_FLAGS: u32 = 0x07;
const KNOWN_HOSTREGISTER_FLAGS: u32 = 0x0f;

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

fn htod(dst: u64, src: &[u8], stream: Stream, sync: bool) -> Result<(), CuError> {
    for (i, chunk) in src.chunks(CHUNK).enumerate() {
        let dst = DevPtr(dst + (i * CHUNK) as u64);
        client::call(calls::MemcpyHtoD::Request { dst, data: chunk.to_vec(), stream, sync })?;
    }
    Ok(())
}

fn dtoh(dst: &mut [u8], src: u64, stream: Stream) -> Result<(), CuError> {
    for (i, chunk) in dst.chunks_mut(CHUNK).enumerate() {
        let src = DevPtr(src + (i * CHUNK) as u64);
        let reply = client::call(calls::MemcpyDtoH::Request { src, size: chunk.len() as u64, stream, sync: true })?;
        if reply.data.len() != chunk.len() {
            return Err(CuError::UNKNOWN);
        }
        chunk.copy_from_slice(&reply.data);
    }
    Ok(())
}

fn dtod(dst: u64, src: u64, n: usize, stream: Stream, sync: bool) -> Result<(), CuError> {
    client::call(calls::MemcpyDtoD::Request { dst: DevPtr(dst), src: DevPtr(src), size: n as u64, stream, sync })?;
    Ok(())
}

/// Entry points whose bodies are one expression over their arguments.
macro_rules! exports {
    ($( $name:ident ($($arg:ident: $ty:ty),*) => $body:expr; )*) => {$(
        /// # Safety
        /// Pointers are valid for the byte counts, as the CUDA API requires.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
            entry(stringify!($name), || $body)
        }
    )*};
}

exports! {
    cuMemcpyHtoD_v2(dst: u64, src: *const c_void, n: usize) => htod(dst, host_in(src, n)?, Stream::NULL, true);
    cuMemcpyHtoD_v2_ptds(dst: u64, src: *const c_void, n: usize) => htod(dst, host_in(src, n)?, Stream::PER_THREAD, true);
    cuMemcpyHtoDAsync_v2(dst: u64, src: *const c_void, n: usize, s: *mut c_void) => htod(dst, host_in(src, n)?, stream(s), false);
    cuMemcpyHtoDAsync_v2_ptsz(dst: u64, src: *const c_void, n: usize, s: *mut c_void) => htod(dst, host_in(src, n)?, ptsz_stream(s), false);
    cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, n: usize) => dtoh(host_out(dst, n)?, src, Stream::NULL);
    cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: u64, n: usize) => dtoh(host_out(dst, n)?, src, Stream::PER_THREAD);
    cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: u64, n: usize, s: *mut c_void) => dtoh(host_out(dst, n)?, src, stream(s));
    cuMemcpyDtoHAsync_v2_ptsz(dst: *mut c_void, src: u64, n: usize, s: *mut c_void) => dtoh(host_out(dst, n)?, src, ptsz_stream(s));
    cuMemcpyDtoD_v2(dst: u64, src: u64, n: usize) => dtod(dst, src, n, Stream::NULL, false);
    cuMemcpyDtoD_v2_ptds(dst: u64, src: u64, n: usize) => dtod(dst, src, n, Stream::PER_THREAD, false);
    cuMemcpyDtoDAsync_v2(dst: u64, src: u64, n: usize, s: *mut c_void) => dtod(dst, src, n, stream(s), false);
    cuMemcpyDtoDAsync_v2_ptsz(dst: u64, src: u64, n: usize, s: *mut c_void) => dtod(dst, src, n, ptsz_stream(s), false);
    cuMemcpy(dst: u64, src: u64, n: usize) => unified_copy(dst, src, n, Stream::NULL, true);
    cuMemcpy_ptds(dst: u64, src: u64, n: usize) => unified_copy(dst, src, n, Stream::PER_THREAD, true);
    cuMemcpyAsync(dst: u64, src: u64, n: usize, s: *mut c_void) => unified_copy(dst, src, n, stream(s), false);
    cuMemcpyAsync_ptsz(dst: u64, src: u64, n: usize, s: *mut c_void) => unified_copy(dst, src, n, ptsz_stream(s), false);
}

/// Whether an address (in unified addressing) is the session's device
/// memory. Our host blocks are known here; anything else is asked of the
/// server, which knows every device range the session holds.
fn is_device(ptr: u64) -> Result<bool, CuError> {
    if HostBlocks::containing(ptr).is_some() {
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
        (false, true) => dtoh(host_out(dst as *mut c_void, n)?, src, stream),
        (false, false) => {
            // Host to host: order after the stream's earlier work, then copy.
            client::call(calls::cuStreamSynchronize::Request { hStream: stream })?;
            let from = host_in(src as *const c_void, n)?.to_vec();
            host_out(dst as *mut c_void, n)?.copy_from_slice(&from);
            Ok(())
        }
    }
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

/// Host memory this process allocated or registered through the driver API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct HostBlock {
    size: usize,
    flags: u32,
    /// Allocated here (and freed with munmap), or registered user memory.
    allocated: bool,
}

struct HostBlocks;

static HOST_BLOCKS: Mutex<BTreeMap<u64, HostBlock>> = Mutex::new(BTreeMap::new());

impl HostBlocks {
    fn with<T>(f: impl FnOnce(&mut BTreeMap<u64, HostBlock>) -> T) -> T {
        f(&mut HOST_BLOCKS.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn containing(ptr: u64) -> Option<(u64, HostBlock)> {
        HostBlocks::with(|blocks| {
            let (&base, &b) = blocks.range(..=ptr).next_back()?;
            (ptr - base < b.size as u64).then_some((base, b))
        })
    }
}

fn alloc_host(pp: *mut *mut c_void, size: usize, flags: u32) -> Result<(), CuError> {
    check_out(pp)?;
    client::client()?;
    if crate::context::current() == 0 {
        return Err(CuError::INVALID_CONTEXT);
    }
    if size == 0 || flags & !KNOWN_HOSTALLOC_FLAGS != 0 {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: an anonymous private mapping; no existing memory is touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CuError::OUT_OF_MEMORY);
    }
    HostBlocks::with(|b| b.insert(p as u64, HostBlock { size, flags, allocated: true }));
    // SAFETY: checked non-NULL; the caller vouches for it.
    unsafe { write_out(pp, p) };
    Ok(())
}

/// # Safety
/// `pp` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) -> CUresult {
    entry("cuMemAllocHost_v2", || alloc_host(pp, size, 0))
}

/// # Safety
/// `pp` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(pp: *mut *mut c_void, size: usize, flags: u32) -> CUresult {
    entry("cuMemHostAlloc", || alloc_host(pp, size, flags))
}

/// # Safety
/// `p` came from cuMemAllocHost or cuMemHostAlloc.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    entry("cuMemFreeHost", || {
        client::client()?;
        if p.is_null() {
            return Ok(());
        }
        let block = HostBlocks::with(|b| match b.get(&(p as u64)) {
            Some(block) if block.allocated => b.remove(&(p as u64)),
            _ => None,
        });
        let block = block.ok_or(CuError::INVALID_VALUE)?;
        // SAFETY: the block was mapped by alloc_host with this size and is
        // now forgotten, so nothing refers to it through us.
        unsafe { libc::munmap(p, block.size) };
        Ok(())
    })
}

/// # Safety
/// `flags` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetFlags(flags: *mut u32, p: *mut c_void) -> CUresult {
    entry("cuMemHostGetFlags", || {
        check_out(flags)?;
        client::client()?;
        let (_, block) = HostBlocks::containing(p as u64).ok_or(CuError::INVALID_VALUE)?;
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(flags, block.flags) };
        Ok(())
    })
}

/// # Safety
/// `p` points at `size` bytes of the caller's memory.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostRegister_v2(p: *mut c_void, size: usize, flags: u32) -> CUresult {
    entry("cuMemHostRegister_v2", || {
        client::client()?;
        if crate::context::current() == 0 {
            return Err(CuError::INVALID_CONTEXT);
        }
        if p.is_null() || size == 0 || flags & !KNOWN_HOSTREGISTER_FLAGS != 0 {
            return Err(CuError::INVALID_VALUE);
        }
        if flags & CU_MEMHOSTREGISTER_IOMEMORY != 0 {
            crate::log::warn("cuMemHostRegister: CU_MEMHOSTREGISTER_IOMEMORY is not supported");
            return Err(CuError::NOT_SUPPORTED);
        }
        let start = p as u64;
        let end = start.checked_add(size as u64).ok_or(CuError::INVALID_VALUE)?;
        HostBlocks::with(|b| {
            let overlaps = b.range(..end).next_back().is_some_and(|(&base, blk)| base + blk.size as u64 > start);
            if overlaps {
                return Err(CuError(712)); // CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
            }
            b.insert(start, HostBlock { size, flags, allocated: false });
            Ok(())
        })
    })
}

/// # Safety
/// None beyond the CUDA API's.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    entry("cuMemHostUnregister", || {
        client::client()?;
        HostBlocks::with(|b| match b.get(&(p as u64)) {
            Some(block) if !block.allocated => {
                b.remove(&(p as u64));
                Ok(())
            }
            _ => Err(CuError(713)), // CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
        })
    })
}
