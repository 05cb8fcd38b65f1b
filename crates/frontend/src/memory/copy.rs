//! Copies between host and device: three paths, fastest first.
//!
//! - **Pinned** (host memory in a block shared with the server): the copy
//!   names the block and offset, and the GPU DMAs straight from or to it.
//!   Asynchronous copies are posted, so they overlap with the program as
//!   natively.
//! - **Staged** (ordinary memory, with shared memory): the bytes pass
//!   through the connection's staging slots in chunks, several in flight,
//!   so that this process's memcpy of one chunk overlaps the DMA of others
//!   (GViM's 1-copy path). A slot is reused once the server says its last
//!   copy finished (`StagingWait`).
//! - **Lanes** (large copies without shared memory): the bytes travel in
//!   chunks over several more connections at once (see [`super::lanes`]).
//! - **Inline** (smaller ones): the bytes travel in the frames. An
//!   asynchronous one into pinned memory is posted even so, its bytes
//!   brought before the program can look (see [`super::posted_reads`]).
//!
//! A copy is posted or staged only when this process knows the device range
//! lies in one of its allocations (see [`super::known_range`]); anything
//! else is sent and waited for, so that a bad range fails at once, exactly
//! as the driver reports it.

use gpuplex_protocol::{calls, CuError, DevPtr, Stream};

use super::{host, known_range, mapped, mirrors, parallel, posted_reads};
use crate::client::{self, Conn};

/// Bytes per inline copy call: well under the frame limit.
const INLINE_CHUNK: usize = 16 << 20;
/// Smaller pageable copies travel inline even with shared memory: one
/// frame costs less than a slot's bookkeeping.
const STAGED_MIN: usize = 64 << 10;
/// Without shared memory, copies from this size on go over the lanes.
const LANES_MIN: usize = 1 << 20;

pub fn htod(dst: u64, src: &[u8], stream: Stream, sync: bool) -> Result<(), CuError> {
    if src.is_empty() {
        return Ok(());
    }
    posted_reads::settle(src.as_ptr() as u64, src.len())?;
    let (dst_in_host, shared) = host::copy_ends(dst, src.as_ptr() as u64, src.len());
    if dst_in_host && !crate::graph::capturing() {
        return host_to_host(dst as *mut u8, src.as_ptr(), src.len(), stream);
    }
    let known = known_range(dst, src.len());
    if let Some((block, offset)) = shared {
        let req =
            calls::MemcpyHtoDShared::Request { dst: DevPtr(dst), block, offset, size: src.len() as u64, stream, sync };
        return if known && !sync { client::post(req) } else { client::call(req).map(|_| ()) };
    }
    // Captured from ordinary memory: the graph copies from a mirror of it.
    if let Some((block, offset)) = captured_end(src.as_ptr() as u64, src.len(), stream, sync, true)? {
        let req =
            calls::MemcpyHtoDShared::Request { dst: DevPtr(dst), block, offset, size: src.len() as u64, stream, sync };
        return client::call(req).map(drop);
    }
    let mut conn = client::lock()?;
    // While another stream captures, the server's driver must see ordinary
    // memory as such, and refuse it as it does natively where the capture
    // forbids the copy.
    let capturing = crate::graph::capturing();
    if known && src.len() >= STAGED_MIN && conn.staging.is_some() && !capturing {
        return staged_htod(&mut conn, dst, src, stream);
    }
    if src.len() >= LANES_MIN && !capturing && conn.lanes().is_some() {
        return lanes_htod(&mut conn, dst, src, stream, known && !sync);
    }
    // The bytes travel in the frame, so an asynchronous copy into a known
    // range leaves nothing for the program to wait for: posted.
    let post = known && !sync && !capturing;
    for (i, chunk) in src.chunks(INLINE_CHUNK).enumerate() {
        let req = calls::MemcpyHtoD::Request {
            dst: DevPtr(dst + (i * INLINE_CHUNK) as u64),
            data: chunk.to_vec(),
            stream,
            sync,
        };
        if post {
            conn.post(req)?;
        } else {
            conn.call(req)?;
        }
    }
    Ok(())
}

pub fn dtoh(dst: &mut [u8], src: u64, stream: Stream, sync: bool) -> Result<(), CuError> {
    if dst.is_empty() {
        return Ok(());
    }
    let (src_in_host, shared) = host::copy_ends(src, dst.as_ptr() as u64, dst.len());
    if src_in_host && !crate::graph::capturing() {
        return host_to_host(dst.as_mut_ptr(), src as *const u8, dst.len(), stream);
    }
    let known = known_range(src, dst.len());
    if let Some((block, offset)) = shared {
        let req =
            calls::MemcpyDtoHShared::Request { block, offset, src: DevPtr(src), size: dst.len() as u64, stream, sync };
        return if known && !sync { client::post(req) } else { client::call(req).map(|_| ()) };
    }
    if let Some((block, offset)) = captured_end(dst.as_ptr() as u64, dst.len(), stream, sync, false)? {
        let req =
            calls::MemcpyDtoHShared::Request { block, offset, src: DevPtr(src), size: dst.len() as u64, stream, sync };
        return client::call(req).map(drop);
    }
    if dst.len() >= LANES_MIN {
        // The lanes write as their chunks come, maybe ahead of older bytes.
        posted_reads::settle(dst.as_ptr() as u64, dst.len())?;
    }
    let mut conn = client::lock()?;
    let capturing = crate::graph::capturing();
    if known && dst.len() >= STAGED_MIN && conn.staging.is_some() && !capturing {
        return staged_dtoh(&mut conn, dst, src, stream);
    }
    if dst.len() >= LANES_MIN && !capturing && conn.lanes().is_some() {
        return lanes_dtoh(&mut conn, dst, src, stream);
    }
    // Into pinned memory the server cannot reach, an asynchronous copy
    // leaves the program nothing to wait for: posted.
    let at = dst.as_ptr() as u64;
    if known && !sync && !capturing && dst.len() < LANES_MIN && host::local_only(at, dst.len()) {
        if let Some((block, offset)) = mapped::block_range(at, dst.len()) {
            let size = dst.len() as u64;
            let req = calls::MemcpyDtoHShared::Request { block, offset, src: DevPtr(src), size, stream, sync };
            return conn.post(req);
        }
        if posted_reads::post(&mut conn, at, dst.len(), src, stream)? {
            return Ok(());
        }
    }
    for (i, chunk) in dst.chunks_mut(INLINE_CHUNK).enumerate() {
        let src = DevPtr(src + (i * INLINE_CHUNK) as u64);
        let reply = conn.call(calls::MemcpyDtoH::Request { src, size: chunk.len() as u64, stream, sync: true })?;
        if reply.data.len() != chunk.len() {
            return Err(CuError::UNKNOWN);
        }
        chunk.copy_from_slice(&reply.data);
    }
    Ok(())
}

/// A copy between host memory and a "device" end that is pinned memory of
/// this process (a device address too, natively): the device would copy
/// once the stream's earlier work is done, so that is waited for and the
/// bytes are copied here, where both ends are. Not while a stream
/// captures: the copy is then the capture's, made by the server.
fn host_to_host(dst: *mut u8, src: *const u8, n: usize, stream: Stream) -> Result<(), CuError> {
    super::stream_done_here(stream)?;
    // SAFETY: the caller found its pinned end in a host block of this
    // process (`host::copy_ends`, `host::local_only`), and its other end
    // is the program's, valid for n bytes per the CUDA call's contract;
    // `copy` allows them to overlap.
    unsafe { std::ptr::copy(src, dst, n) };
    Ok(())
}

/// The mirror block and offset of an asynchronous copy's host end in
/// ordinary memory, when its stream captures (see [`super::mirrors`]).
fn captured_end(
    ptr: u64,
    len: usize,
    stream: Stream,
    sync: bool,
    to_device: bool,
) -> Result<Option<(u64, u64)>, CuError> {
    if sync || !crate::graph::is_capturing(stream) {
        return Ok(None);
    }
    mirrors::block_for(ptr, len, to_device)
}

pub fn dtod(dst: u64, src: u64, n: usize, stream: Stream, sync: bool) -> Result<(), CuError> {
    // Pinned memory the server cannot reach (a remote guest's) is a device
    // address natively too: its end of the copy is done here (a capture
    // cannot record that, and the server refuses it as out of its reach).
    match (host::local_only(dst, n), host::local_only(src, n)) {
        _ if crate::graph::capturing() => {}
        (false, false) => {}
        (false, true) => {
            // SAFETY: `local_only` found all n bytes in a host block of this process.
            let src = unsafe { std::slice::from_raw_parts(src as *const u8, n) };
            return htod(dst, src, stream, sync);
        }
        (true, false) => {
            // SAFETY: as above, for the destination.
            let dst = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, n) };
            return dtoh(dst, src, stream, sync);
        }
        (true, true) => return host_to_host(dst as *mut u8, src as *const u8, n, stream),
    }
    let req = calls::MemcpyDtoD::Request { dst: DevPtr(dst), src: DevPtr(src), size: n as u64, stream, sync };
    if !sync && known_range(dst, n) && known_range(src, n) {
        return client::post(req);
    }
    client::call(req).map(|_| ())
}

/// The slot after the last one used, so that back-to-back copies do not
/// wait on each other's slot.
fn next_slot(conn: &mut Conn, slots: usize) -> usize {
    let staging = conn.staging.as_mut().expect("staged copies need staging");
    let slot = staging.next;
    staging.next = (slot + 1) % slots;
    slot
}

/// Waits until the server's last copy through `slot` is done.
fn free_slot(conn: &mut Conn, slot: usize) -> Result<(), CuError> {
    let staging = conn.staging.as_mut().expect("staged copies need staging");
    if staging.busy[slot] {
        conn.call(calls::StagingWait::Request { slot: slot as u32 })?;
        conn.staging.as_mut().expect("still there").busy[slot] = false;
    }
    Ok(())
}

/// Host to device through the slots, round-robin. Returns once `src` has
/// been consumed, as the driver's pageable copies do; the last chunks may
/// still be in flight, in stream order before anything sent later.
fn staged_htod(conn: &mut Conn, dst: u64, src: &[u8], stream: Stream) -> Result<(), CuError> {
    let (slot_bytes, slots) = conn.staging.as_ref().map(|s| (s.slot_bytes, s.busy.len())).expect("checked");
    for (i, chunk) in src.chunks(slot_bytes).enumerate() {
        let slot = next_slot(conn, slots);
        free_slot(conn, slot)?;
        let staging = conn.staging.as_mut().expect("checked");
        parallel::copy(&mut staging.slot(slot)[..chunk.len()], chunk);
        staging.busy[slot] = true;
        conn.post(calls::MemcpyHtoDShared::Request {
            dst: DevPtr(dst + (i * slot_bytes) as u64),
            block: 0,
            offset: (slot * slot_bytes) as u64,
            size: chunk.len() as u64,
            stream,
            sync: false,
        })?;
    }
    Ok(())
}

/// Device to host through the slots: every slot is kept filling while
/// this process copies out the oldest.
fn staged_dtoh(conn: &mut Conn, dst: &mut [u8], src: u64, stream: Stream) -> Result<(), CuError> {
    let (slot_bytes, slots) = conn.staging.as_ref().map(|s| (s.slot_bytes, s.busy.len())).expect("checked");
    let total = dst.len();
    let chunks = total.div_ceil(slot_bytes);
    let first = next_slot(conn, slots);
    let fill = |conn: &mut Conn, i: usize| -> Result<(), CuError> {
        let slot = (first + i) % slots;
        free_slot(conn, slot)?;
        let size = slot_bytes.min(total - i * slot_bytes);
        conn.staging.as_mut().expect("checked").busy[slot] = true;
        conn.post(calls::MemcpyDtoHShared::Request {
            block: 0,
            offset: (slot * slot_bytes) as u64,
            src: DevPtr(src + (i * slot_bytes) as u64),
            size: size as u64,
            stream,
            sync: false,
        })
    };
    for i in 0..chunks.min(slots) {
        fill(conn, i)?;
    }
    for i in 0..chunks {
        let slot = (first + i) % slots;
        free_slot(conn, slot)?;
        let at = i * slot_bytes;
        let size = slot_bytes.min(dst.len() - at);
        parallel::copy(&mut dst[at..at + size], &conn.staging.as_mut().expect("checked").slot(slot)[..size]);
        if i + slots < chunks {
            fill(conn, i + slots)?;
        }
    }
    Ok(())
}

/// Host to device over the lanes: the call goes first, in order with every
/// other, then the bytes; returns once the server has read them all (and,
/// unless `posted`, once the copy is done). The server completes a lane
/// copy before it takes the next call, so `sync` needs nothing more.
fn lanes_htod(conn: &mut Conn, dst: u64, src: &[u8], stream: Stream, posted: bool) -> Result<(), CuError> {
    let copy = conn.lanes().expect("checked by the caller").next_copy();
    let req = calls::MemcpyHtoDLanes::Request { dst: DevPtr(dst), size: src.len() as u64, stream, copy };
    let id = conn.send_call(req, posted)?;
    let sent = conn.lanes().expect("still open").send(copy, src);
    sent.map_err(|e| conn.lose_lanes(e))?;
    if !posted {
        conn.await_reply::<calls::MemcpyHtoDLanes::Request>(id)?;
    }
    Ok(())
}

/// Device to host over the lanes. A copy that fails still sends every
/// chunk, as a bare header with the error, so the lanes stay in step.
fn lanes_dtoh(conn: &mut Conn, dst: &mut [u8], src: u64, stream: Stream) -> Result<(), CuError> {
    let lanes = conn.lanes().expect("checked by the caller");
    let copy = lanes.next_copy();
    let req = calls::MemcpyDtoHLanes::Request { src: DevPtr(src), size: dst.len() as u64, stream, copy };
    let id = conn.send_call(req, false)?;
    let received = conn.lanes().expect("still open").receive(copy, dst);
    let replied = conn.await_reply::<calls::MemcpyDtoHLanes::Request>(id);
    received.map_err(|e| conn.lose_lanes(e))?;
    replied.map(|_| ())
}
