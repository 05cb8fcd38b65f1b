//! Pinned host memory.
//!
//! With shared memory, `cuMemAllocHost`/`cuMemHostAlloc` memory is a block
//! the server created and registered with the driver, mapped here (at the
//! server's own address when that range is free, so that one pointer works
//! on host and device as under unified addressing). The GPU reads and
//! writes it directly: copies from it cost no copy, and
//! `cuMemHostGetDevicePointer` gives kernels zero-copy access.
//!
//! `cuMemHostRegister` of the program's own memory moves that memory into
//! such a block: the pages are copied into it and the block is mapped over
//! them, at the same address, so the program keeps its pointer and the GPU
//! sees its writes with no further copies. This costs one copy of the range
//! at registration (and one back at unregistration), and is done only for
//! private anonymous memory (heap, stack, anonymous mappings), where the
//! swap is invisible; a write by another thread during the swap would be
//! lost, as it would be if the program freed memory it was using. Other
//! memory (file mappings, shared memory) is registered only locally: copies
//! from it are staged.
//!
//! Without shared memory (the socket carrier, a remote server), host
//! memory is ordinary memory tracked here, copies carry its bytes, and
//! memsets and copies that name it as a device address are done here in
//! their stream's order (`memory::memset`, `copy::dtod`). Memory that has
//! no shared block gets a device address on request from a block of the
//! server's kept in step with it (`mapped`), so kernels reach it too.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Mutex, PoisonError};

use std::os::fd::AsRawFd;

use gpuplex_protocol::{calls, CuError};
use gpuplex_transport::shm::{Region, Reservation};

use crate::client;
use crate::ffi::{check_out, entry, write_out, CUresult};

pub const PAGE: u64 = 4096;
const CU_MEMHOSTREGISTER_IOMEMORY: u32 = 0x04;
const KNOWN_HOSTALLOC_FLAGS: u32 = 0x07;
const KNOWN_HOSTREGISTER_FLAGS: u32 = 0x0f;
/// `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`, `..._NOT_REGISTERED`.
const ALREADY_REGISTERED: CuError = CuError(712);
const NOT_REGISTERED: CuError = CuError(713);

/// Host memory this process allocated or registered through the driver API.
pub struct HostBlock {
    pub size: usize,
    flags: u32,
    /// Allocated here (freed with cuMemFreeHost), or registered user memory.
    allocated: bool,
    /// Managed memory (`managed.rs`), freed with cuMemFree.
    managed: bool,
    /// The server's block, when the memory is shared with it.
    pub shared: Option<SharedBlock>,
}

pub struct SharedBlock {
    pub id: u64,
    /// The device address of the block's first byte (which may sit before
    /// the registered pointer: blocks are whole pages).
    devptr: u64,
    /// Where the block's first byte is mapped here.
    base: u64,
    len: u64,
}

static BLOCKS: Mutex<BTreeMap<u64, HostBlock>> = Mutex::new(BTreeMap::new());

fn with<T>(f: impl FnOnce(&mut BTreeMap<u64, HostBlock>) -> T) -> T {
    f(&mut BLOCKS.lock().unwrap_or_else(PoisonError::into_inner))
}

/// `f(start, block)` for the block holding `ptr`, if any.
fn containing<T>(ptr: u64, f: impl FnOnce(u64, &HostBlock) -> T) -> Option<T> {
    with(|blocks| block_holding(blocks, ptr, 0).map(|(start, b)| f(start, b)))
}

/// The block holding `ptr` and all of `[ptr, ptr + len)`, and where it starts.
fn block_holding(blocks: &BTreeMap<u64, HostBlock>, ptr: u64, len: usize) -> Option<(u64, &HostBlock)> {
    let (&start, b) = blocks.range(..=ptr).next_back()?;
    let end = ptr.checked_add(len as u64)?;
    (ptr - start < b.size as u64 && end <= start + b.size as u64).then_some((start, b))
}

/// The shared block holding all of `[ptr, ptr + len)`, as `(block id, offset in the block)`.
fn shared_holding(blocks: &BTreeMap<u64, HostBlock>, ptr: u64, len: usize) -> Option<(u64, u64)> {
    let (_, b) = block_holding(blocks, ptr, len)?;
    b.shared.as_ref().map(|s| (s.id, ptr - s.base))
}

impl HostBlock {
    /// The bytes posted copies owe to this block at `start` (memory the
    /// server cannot reach), before it goes back to the program or away.
    fn settle_owed(&self, start: u64) -> Result<(), CuError> {
        match self.shared {
            None => super::posted_reads::settle(start, self.size),
            Some(_) => Ok(()),
        }
    }

    /// The device address of `ptr` (inside this block), if it is mapped.
    fn device_address(&self, ptr: u64) -> Option<u64> {
        self.shared.as_ref().map(|s| s.devptr + (ptr - s.base))
    }
}

/// The shared block holding all of `[ptr, ptr + len)`, as `(block id,
/// offset in the block)`.
pub fn shared_range(ptr: u64, len: usize) -> Option<(u64, u64)> {
    with(|blocks| shared_holding(blocks, ptr, len))
}

/// Where `offset` of shared block `id` is mapped in this process.
pub fn block_address(id: u64, offset: u64) -> Option<u64> {
    with(|blocks| {
        let s = blocks.values().find_map(|b| b.shared.as_ref().filter(|s| s.id == id))?;
        (offset < s.len).then(|| s.base + offset)
    })
}

/// The host memory known here that holds `ptr`: `(start, size, device
/// address of ptr if mapped, whether it is managed memory)`.
pub fn lookup(ptr: u64) -> Option<(u64, u64, Option<u64>, bool)> {
    let (start, size, devptr, managed, shared) =
        containing(ptr, |start, b| (start, b.size as u64, b.device_address(ptr), b.managed, b.shared.is_some()))?;
    // Without shared memory, a range is mapped once the server holds a block for it.
    let devptr = if shared { devptr } else { super::mapped::mapped_address(start, ptr) };
    Some((start, size, devptr, managed))
}

/// Whether all of `[ptr, ptr + len)` is host memory known here that the
/// server cannot reach (no shared memory: a remote guest's pinned memory).
pub fn local_only(ptr: u64, len: usize) -> bool {
    within_one(ptr, len, |b| b.shared.is_none())
}

/// For a copy of `len` bytes between `device` and the program's `host`
/// memory, in one look at the table (it is asked on every copy): whether
/// the device end is host memory known here too, and the shared block
/// holding the host end, as [`shared_range`] has it.
pub fn copy_ends(device: u64, host: u64, len: usize) -> (bool, Option<(u64, u64)>) {
    with(|blocks| (block_holding(blocks, device, len).is_some(), shared_holding(blocks, host, len)))
}

/// Whether all of `[ptr, ptr + len)` lies in one block known here that `which` accepts.
fn within_one(ptr: u64, len: usize, which: impl FnOnce(&HostBlock) -> bool) -> bool {
    with(|blocks| block_holding(blocks, ptr, len).is_some_and(|(_, b)| which(b)))
}

/// Whether `ptr` lies in host memory known here.
pub fn contains(ptr: u64) -> bool {
    containing(ptr, |_, _| ()).is_some()
}

/// Asks the server for a block of `len` bytes (whole pages) and maps it
/// here. For a block of its own (`at == 0`), at the same address as in the
/// server: a place free here is reserved first and the server maps its side
/// there if it can, else its own place is tried here (kernels and memsets
/// take the program's pointer to pinned memory as the device's, as unified
/// addressing has it). For one that stands for the program's memory at
/// `at`, anywhere, for the caller to move.
pub fn new_block(len: u64, flags: u32, at: u64, mirror: bool) -> Result<(SharedBlock, Region), CuError> {
    let mut conn = client::lock()?;
    if conn.heap.is_some() {
        let (id, devptr, view) = conn.place_block(len as usize, flags, at, mirror)?;
        let base = if at != 0 { at } else { view.as_ptr() as u64 };
        return Ok((SharedBlock { id, devptr, base, len }, view));
    }
    let reservation = if at == 0 { Reservation::new(len as usize).ok() } else { None };
    let want = reservation.as_ref().map_or(at, |r| r.as_ptr() as u64);
    let reply = conn.call(calls::HostAlloc::Request { size: len, flags, at: want, mirror })?;
    let fd = conn.recv_fd()?;
    drop(conn);
    let block = |base| SharedBlock { id: reply.block, devptr: reply.devptr.0, base, len };
    let mapped = match reservation {
        Some(r) if reply.address == want => r.fill(fd),
        unfilled => {
            // Given back first: the server's place may overlap it.
            drop(unfilled);
            let here = if at != 0 { std::ptr::null_mut() } else { reply.address as usize as *mut u8 };
            Region::open_at(fd, here)
        }
    };
    let region = match mapped {
        Ok(r) if r.len() as u64 == len => r,
        other => {
            crate::log::error(&format!("cannot map a pinned block: {:?}", other.err()));
            release(block(0));
            return Err(CuError::OUT_OF_MEMORY);
        }
    };
    if at == 0 && region.as_ptr() as u64 != reply.address {
        crate::log::warn(&format!(
            "pinned memory at {:p} here is at {:#x} in the server (both places were taken): a kernel or memset given this pointer fails",
            region.as_ptr(),
            reply.address
        ));
    }
    let base = if at != 0 { at } else { region.as_ptr() as u64 };
    Ok((block(base), region))
}

pub fn shared_memory() -> bool {
    client::lock().map(|c| c.staging.is_some()).unwrap_or(false)
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
    let (p, shared) = if shared_memory() {
        let (block, region) = new_block((size as u64).next_multiple_of(PAGE), flags, 0, false)?;
        let p = region.as_ptr();
        // The mapping is the program's now; cuMemFreeHost unmaps it.
        std::mem::forget(region);
        (p.cast::<c_void>(), Some(block))
    } else if let Some(p) = super::mapped::alloc(size)? {
        (p as *mut c_void, None)
    } else {
        (anonymous(size)?, None)
    };
    with(|b| b.insert(p as u64, HostBlock { size, flags, allocated: true, managed: false, shared }));
    // SAFETY: checked non-NULL; the caller vouches for it.
    unsafe { write_out(pp, p) };
    Ok(())
}

pub(super) fn anonymous(size: usize) -> Result<*mut c_void, CuError> {
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
    Ok(p)
}

/// Maps `len` bytes of new anonymous memory at exactly `at`, if nothing is there.
pub(super) fn anonymous_at(at: u64, len: usize) -> bool {
    let (rw, flags) = (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS);
    // SAFETY: MAP_FIXED_NOREPLACE replaces nothing: the call fails where
    // anything is mapped in the range.
    let p = unsafe { libc::mmap(at as *mut c_void, len, rw, flags | libc::MAP_FIXED_NOREPLACE, -1, 0) };
    if p == libc::MAP_FAILED {
        return false;
    }
    if p as u64 != at {
        // A kernel older than the flag took it as a hint.
        // SAFETY: the mapping just made, which nothing uses.
        unsafe { libc::munmap(p, len) };
        return false;
    }
    true
}

/// Gives a block back to the server (after which its pages are only ours).
fn release(block: SharedBlock) {
    free_block(block.id);
}

/// Frees the server's block `id`; this process's mapping is the caller's.
pub fn free_block(id: u64) {
    if let Err(e) = client::lock().and_then(|mut conn| conn.free_block(id)) {
        crate::log::warn(&format!("freeing pinned block {id}: {e:?}"));
    }
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
        free_allocated(p as u64, false)
    })
}

/// Frees memory allocated here (`managed` or pinned), mapping and block.
pub fn free_allocated(p: u64, managed: bool) -> Result<(), CuError> {
    let block = with(|b| match b.get(&p) {
        Some(block) if block.allocated && block.managed == managed => b.remove(&p),
        _ => None,
    });
    let block = block.ok_or(CuError::INVALID_VALUE)?;
    // Copies' bytes owed to it come now, not to land on whatever is mapped
    // there next. An error this brings is an earlier call's: reported
    // once the memory is freed.
    let settled = block.settle_owed(p);
    if block.shared.is_none() && super::mapped::release(p) {
        return settled;
    }
    // SAFETY: the program's mapping of the block (or its anonymous memory),
    // now forgotten here, so nothing refers to it through us.
    unsafe { libc::munmap(p as *mut c_void, block.shared.as_ref().map_or(block.size, |s| s.len as usize)) };
    if let Some(shared) = block.shared {
        release(shared);
    }
    settled
}

/// `CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP`.
const PORTABLE_DEVICEMAP: u32 = 0x03;

/// Managed memory: a block shared with the server and registered with the
/// driver, mapped here at the very address the device knows it by, so that
/// one pointer serves the program and its kernels. The address is chosen
/// free here first and the server asked to map the block there too (its
/// worker has far fewer mappings); where something of the worker's is
/// there, another is tried, the refused ones held meanwhile so that each
/// try offers a new one. None without shared memory.
pub fn alloc_managed(size: usize) -> Result<Option<u64>, CuError> {
    const TRIES: usize = 4;
    if !shared_memory() {
        return Ok(None);
    }
    let len = (size as u64).next_multiple_of(PAGE);
    // Reservations to give back: all but the one the block is mapped over.
    let mut held = Vec::new();
    let placed = loop {
        let at = match reserve(len) {
            Ok(at) => at,
            Err(e) => break Err(e),
        };
        held.push(at);
        let (block, region) = match new_block(len, PORTABLE_DEVICEMAP, at, false) {
            Ok(b) => b,
            Err(e) => break Err(e),
        };
        // SAFETY: replaces exactly the reservation made above with the block.
        if block.devptr == at && unsafe { map_over(at, len, &region) } {
            held.pop();
            break Ok((at, block));
        }
        release(block);
        if held.len() == TRIES {
            crate::log::warn("managed memory: its block could not be mapped at one address in both processes");
            break Err(CuError::OUT_OF_MEMORY);
        }
    };
    for at in held {
        // SAFETY: a reservation of ours that nothing uses.
        unsafe { libc::munmap(at as *mut c_void, len as usize) };
    }
    let (at, block) = placed?;
    let block = HostBlock { size, flags: PORTABLE_DEVICEMAP, allocated: true, managed: true, shared: Some(block) };
    with(|b| b.insert(at, block));
    Ok(Some(at))
}

/// `len` bytes of address space nobody may use yet.
fn reserve(len: u64) -> Result<u64, CuError> {
    // SAFETY: an inaccessible anonymous mapping of new pages.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if at == libc::MAP_FAILED {
        return Err(CuError::OUT_OF_MEMORY);
    }
    Ok(at as u64)
}

/// Whether `[ptr, ptr + len)` lies in one managed allocation.
pub fn managed_range(ptr: u64, len: u64) -> bool {
    containing(ptr, |start, b| b.managed && ptr.checked_add(len).is_some_and(|end| end <= start + b.size as u64))
        .unwrap_or(false)
}

/// # Safety
/// `flags` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetFlags(flags: *mut u32, p: *mut c_void) -> CUresult {
    entry("cuMemHostGetFlags", || {
        check_out(flags)?;
        client::client()?;
        let found = containing(p as u64, |_, b| b.flags);
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(flags, found.ok_or(CuError::INVALID_VALUE)?) };
        Ok(())
    })
}

/// # Safety
/// `pdptr` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(pdptr: *mut u64, p: *mut c_void, flags: u32) -> CUresult {
    entry("cuMemHostGetDevicePointer_v2", || {
        check_out(pdptr)?;
        client::client()?;
        if flags != 0 {
            return Err(CuError::INVALID_VALUE);
        }
        let found = containing(p as u64, |start, b| (start, b.size, b.device_address(p as u64)));
        let dptr = match found {
            Some((_, _, Some(dptr))) => dptr,
            Some((start, size, None)) => super::mapped::device_address(start, size, p as u64)?,
            None => return Err(CuError::INVALID_VALUE),
        };
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(pdptr, dptr) };
        Ok(())
    })
}

/// Whether every page of `[start, end)` is private anonymous memory, per
/// `/proc/self/maps`.
fn private_anonymous(start: u64, end: u64) -> bool {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else { return false };
    let mut covered = start;
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms), Some(_), Some(_), Some(inode)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        let path = f.next().unwrap_or("");
        let Some((lo, hi)) = range.split_once('-') else { continue };
        let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16)) else { continue };
        if hi <= covered || lo > covered {
            continue;
        }
        let anonymous = inode == "0" && (path.is_empty() || path == "[heap]" || path == "[stack]");
        if !perms.starts_with("rw") || !perms.ends_with('p') || !anonymous {
            return false;
        }
        covered = hi;
        if covered >= end {
            return true;
        }
    }
    false
}

/// Moves `[start, start + len)` (whole pages of private anonymous memory)
/// into a new shared block, in place.
fn share_in_place(start: u64, len: u64, flags: u32) -> Result<SharedBlock, CuError> {
    let (block, region) = new_block(len, flags, start, false)?;
    // SAFETY: `region` is a fresh mapping of `len` bytes; the source range
    // is the program's, readable (checked private anonymous, rw).
    unsafe { std::ptr::copy_nonoverlapping(start as *const u8, region.as_ptr(), len as usize) };
    // SAFETY: replaces exactly the program's pages, which now hold nothing
    // the block does not; `region` (the temporary view) goes after.
    if !unsafe { map_over(start, len, &region) } {
        release(block);
        return Err(CuError::OUT_OF_MEMORY);
    }
    Ok(block)
}

/// Maps `region`'s block at `at` for `len` bytes, over whatever is there.
///
/// # Safety
/// `[at, at + len)` is the caller's to replace: nothing else uses it.
unsafe fn map_over(at: u64, len: u64, region: &Region) -> bool {
    let (rw, fixed) = (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_FIXED);
    let (fd, offset) = (region.fd().as_raw_fd(), region.file_offset() as libc::off_t);
    // SAFETY: per this function's contract.
    let p = unsafe { libc::mmap(at as *mut c_void, len as usize, rw, fixed, fd, offset) };
    p != libc::MAP_FAILED
}

/// Puts private anonymous memory back under a registered range, keeping
/// its contents, so the block can go.
fn unshare_in_place(block: &SharedBlock) {
    let len = block.len as usize;
    // Saved in a mapping of its own: the range may hold heap the allocator
    // would hand out again, so a heap buffer could overlap it.
    let Ok(saved) = anonymous(len) else {
        crate::log::error("cannot unregister host memory: out of memory to save it");
        return;
    };
    // SAFETY: the range is the block's mapping over the program's pages:
    // its bytes are saved, fresh private pages replace it, and the bytes go
    // back, so the program sees the same memory, now its own.
    unsafe {
        std::ptr::copy_nonoverlapping(block.base as *const u8, saved.cast::<u8>(), len);
        let p = libc::mmap(
            block.base as *mut c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        );
        if p != libc::MAP_FAILED {
            std::ptr::copy_nonoverlapping(saved.cast::<u8>(), block.base as *mut u8, len);
        }
        libc::munmap(saved, len);
    }
}

/// Whether `[start, end)` overlaps memory in `blocks`, and whether a page
/// it touches holds a shared block. Ranges may share pages, as natively
/// (two small heap buffers do): only their bytes must not overlap.
fn neighbours(blocks: &BTreeMap<u64, HostBlock>, start: u64, end: u64) -> (bool, bool) {
    let overlaps = blocks.range(..end).next_back().is_some_and(|(&base, b)| base + b.size as u64 > start);
    // Blocks do not overlap, so going down from the range's last page, the
    // first that ends in a page before its first ends the search.
    let (page_start, page_end) = (start & !(PAGE - 1), end.next_multiple_of(PAGE));
    let page_shared = blocks
        .range(..page_end)
        .rev()
        .take_while(|(&base, b)| (base + b.size as u64).next_multiple_of(PAGE) > page_start)
        .any(|(_, b)| b.shared.is_some());
    (overlaps, page_shared)
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
        let (page_start, page_end) = (start & !(PAGE - 1), end.next_multiple_of(PAGE));
        let (overlaps, page_shared) = with(|b| neighbours(b, start, end));
        if overlaps {
            return Err(ALREADY_REGISTERED);
        }
        // Whole pages are swapped into a block, so a range sharing a page
        // with a shared registration stays ours (staged, not mapped).
        let shareable = shared_memory() && !page_shared && private_anonymous(page_start, page_end);
        let shared = if shareable { Some(share_in_place(page_start, page_end - page_start, flags)?) } else { None };
        with(|b| b.insert(start, HostBlock { size, flags, allocated: false, managed: false, shared }));
        Ok(())
    })
}

/// # Safety
/// None beyond the CUDA API's.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    entry("cuMemHostUnregister", || {
        client::client()?;
        let block = with(|b| match b.get(&(p as u64)) {
            Some(block) if !block.allocated => b.remove(&(p as u64)),
            _ => None,
        });
        let block = block.ok_or(NOT_REGISTERED)?;
        // The program may reuse the memory once this returns.
        let settled = block.settle_owed(p as u64);
        match block.shared {
            Some(shared) => {
                unshare_in_place(&shared);
                release(shared);
            }
            None => {
                super::mapped::release(p as u64);
            }
        }
        settled
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(size: usize, shared: bool) -> HostBlock {
        let shared = shared.then_some(SharedBlock { id: 1, devptr: 0, base: 0, len: PAGE });
        HostBlock { size, flags: 0, allocated: false, managed: false, shared }
    }

    #[test]
    fn ranges_may_share_pages_but_not_bytes() {
        let page = 16 * PAGE;
        let blocks = BTreeMap::from([(page + 0x40, block(0x20, true))]);
        // Below, above and touching it in the same page: no overlap, a shared page.
        assert_eq!(neighbours(&blocks, page + 0x20, page + 0x40), (false, true));
        assert_eq!(neighbours(&blocks, page + 0x60, page + 0x61), (false, true));
        // Any byte in common.
        assert_eq!(neighbours(&blocks, page + 0x20, page + 0x41), (true, true));
        assert_eq!(neighbours(&blocks, page + 0x5f, page + 0x100), (true, true));
        assert_eq!(neighbours(&blocks, page, page + PAGE), (true, true));
        // Other pages.
        assert_eq!(neighbours(&blocks, page - PAGE, page), (false, false));
        assert_eq!(neighbours(&blocks, page + PAGE, page + 2 * PAGE), (false, false));
    }

    #[test]
    fn a_shared_block_pages_away_below_is_still_seen() {
        let page = 16 * PAGE;
        // A shared block ending in the range's first page, and an unshared
        // one between it and the range.
        let blocks = BTreeMap::from([(page - 0x10, block(0x20, true)), (page + 0x100, block(0x10, false))]);
        assert_eq!(neighbours(&blocks, page + 0x200, page + 0x300), (false, true));
        assert_eq!(neighbours(&blocks, page + PAGE, page + PAGE + 1), (false, false));
    }
}
