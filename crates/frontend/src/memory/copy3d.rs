//! 2D and 3D copies, and the linear copies to and from arrays.
//!
//! Each export becomes one [`Copy`] of `depth` slices of `height` rows of
//! `width` bytes, which names the driver function it came from so that the
//! server's driver judges it as natively. Device memory and arrays are the
//! server's to check. A host end in a block shared with the server is
//! named by block and offset, and the GPU reaches it directly; any other
//! host memory travels in the frames, its rows packed, in chunks of whole
//! rows (or pieces of one row, for rows longer than a chunk).

use std::ffi::c_void;

use gpuplex_protocol::{
    calls, CopySide, CuError, Stream, COPY_2D, COPY_2D_UNALIGNED, COPY_3D, COPY_ARRAY_LINEAR, SIDE_ARRAY, SIDE_BLOCK,
    SIDE_DEVICE, SIDE_INLINE,
};

use super::{host, is_device, known_range, mirrors};
use crate::client;
use crate::ffi::{entry, ptsz_stream, stream, CUresult};

/// `CU_MEMORYTYPE_*`.
const HOST: u32 = 1;
const DEVICE: u32 = 2;
const ARRAY: u32 = 3;
const UNIFIED: u32 = 4;

/// Bytes of host memory per inline copy call, well under the frame limit.
const INLINE_CHUNK: u64 = 16 << 20;

/// One end of a copy, as the C structures give it.
#[derive(Clone, Copy)]
pub(super) struct End {
    memory: u32,
    host: *mut u8,
    device: u64,
    array: u64,
    pub(super) x: u64,
    pub(super) y: u64,
    pub(super) z: u64,
    pub(super) pitch: u64,
    pub(super) height: u64,
}

impl End {
    /// Host memory the driver would take as such; unified addresses are
    /// resolved to host or device memory here.
    fn resolve(mut self) -> Result<End, CuError> {
        if self.memory == UNIFIED {
            if is_device(self.device)? {
                self.memory = DEVICE;
            } else {
                self.memory = HOST;
                self.host = self.device as *mut u8;
            }
        }
        Ok(self)
    }

    /// Whether this end is pinned host memory, which the GPU reaches
    /// directly, and so reads after the copy call returns.
    pub(super) fn is_host_pinned(&self) -> bool {
        match self.memory {
            UNIFIED => host::contains(self.device),
            HOST => host::contains(self.host as u64),
            _ => false,
        }
    }

    /// The first byte this end touches from its base, and how many bytes
    /// from there, for a copy of `[width, height, depth]`.
    fn extent(&self, [width, height, depth]: [u64; 3]) -> Option<(u64, u64)> {
        let start =
            self.z.checked_mul(self.height)?.checked_add(self.y)?.checked_mul(self.pitch)?.checked_add(self.x)?;
        let last_row = (depth - 1).checked_mul(self.height)?.checked_add(height - 1)?;
        Some((start, last_row.checked_mul(self.pitch)?.checked_add(width)?))
    }

    /// Whether rows or slices of this end overlap, which the driver refuses
    /// of linear memory: rows narrower than the copy, slices shorter.
    fn overlapping(&self, [width, height, depth]: [u64; 3]) -> bool {
        let rows = (height > 1 || depth > 1) && self.x.checked_add(width).is_none_or(|end| self.pitch < end);
        let slices = depth > 1 && self.y.checked_add(height).is_none_or(|end| self.height < end);
        rows || slices
    }

    /// The host address of row `y` of slice `z`, counted from the end's
    /// first row. Its [`End::extent`] was checked first, so the address is
    /// within what that says; the sums wrap only as pointer arithmetic would.
    fn host_row(&self, z: u64, y: u64) -> *mut u8 {
        let row = self.z.wrapping_add(z).wrapping_mul(self.height).wrapping_add(self.y).wrapping_add(y);
        self.host.wrapping_add(row.wrapping_mul(self.pitch).wrapping_add(self.x) as usize)
    }

    /// The end moved on by `[x, y, z]` (wrapping: where that overflows, the
    /// server refuses what it names).
    fn offset(&self, [x, y, z]: [u64; 3]) -> End {
        End { x: self.x.wrapping_add(x), y: self.y.wrapping_add(y), z: self.z.wrapping_add(z), ..*self }
    }
}

/// A copy as the exports give it.
struct Copy {
    shape: u32,
    src: End,
    dst: End,
    width: u64,
    height: u64,
    depth: u64,
}

impl Copy {
    fn dims(&self) -> [u64; 3] {
        [self.width, self.height, self.depth]
    }
}

/// How an end travels. Host memory in a shared block goes by block and
/// offset; other host memory inline, or, for a graph (`mirror`), by a
/// mirror's block ([`super::mirrors`]).
fn side(end: &End, dims: [u64; 3], mirror: bool, to_device: bool) -> Result<CopySide, CuError> {
    let mut side = CopySide {
        kind: SIDE_DEVICE,
        at: end.device,
        block: 0,
        x: end.x,
        y: end.y,
        z: end.z,
        pitch: end.pitch,
        height: end.height,
    };
    match end.memory {
        DEVICE => {}
        ARRAY => side = CopySide { kind: SIDE_ARRAY, at: end.array, pitch: 0, height: 0, ..side },
        HOST => {
            // What the driver refuses of a host end it does not see.
            if end.overlapping(dims) {
                return Err(CuError::INVALID_VALUE);
            }
            let (start, len) = end.extent(dims).ok_or(CuError::INVALID_VALUE)?;
            let first = (end.host as u64).checked_add(start).filter(|f| f.checked_add(len).is_some());
            let first = first.ok_or(CuError::INVALID_VALUE)?;
            let shared = match host::shared_range(first, len as usize) {
                None if mirror => mirrors::block_for(first, len as usize, to_device)?,
                found => found,
            };
            side = match shared {
                Some((block, offset)) => CopySide { kind: SIDE_BLOCK, at: offset, block, x: 0, y: 0, z: 0, ..side },
                None => CopySide { kind: SIDE_INLINE, at: 0, block: 0, x: 0, y: 0, z: 0, pitch: 0, height: 0 },
            };
        }
        _ => return Err(CuError::INVALID_VALUE),
    }
    Ok(side)
}

fn copy(c: Copy, stream: Stream, sync: bool) -> Result<(), CuError> {
    let c = Copy { src: c.src.resolve()?, dst: c.dst.resolve()?, ..c };
    if c.width == 0 || c.height == 0 || c.depth == 0 {
        return Ok(());
    }
    if c.src.memory == HOST {
        super::posted_reads::settle_all()?;
    }
    // Also checks that every row's address can be computed.
    let captured = !sync && crate::graph::is_capturing(stream) && !(c.src.memory == HOST && c.dst.memory == HOST);
    let (src, dst) = (side(&c.src, c.dims(), captured, true)?, side(&c.dst, c.dims(), captured, false)?);
    if c.src.memory == HOST && c.dst.memory == HOST {
        return host_to_host(&c, stream);
    }
    if src.kind == SIDE_INLINE {
        return inline(&c, stream, sync, true);
    }
    if dst.kind == SIDE_INLINE {
        return inline(&c, stream, sync, false);
    }
    let req = calls::Memcpy3D::Request {
        copy: gpuplex_protocol::Copy3D { shape: c.shape, src, dst, width: c.width, height: c.height, depth: c.depth },
        input: Vec::new(),
        stream,
        sync,
    };
    // Posted only where nothing can fail: the device ends are the process's
    // own allocations and no array is involved (its bounds are the server's).
    let known = |end: &End| match end.memory {
        DEVICE => {
            !end.overlapping(c.dims())
                && end.extent(c.dims()).is_some_and(|(s, n)| known_range(end.device.wrapping_add(s), n as usize))
        }
        HOST => true,
        _ => false,
    };
    if !sync && c.shape != COPY_2D_UNALIGNED && known(&c.src) && known(&c.dst) {
        return client::post(req);
    }
    client::call(req).map(drop)
}

/// A copy with one end in ordinary host memory: in chunks, each a copy of
/// its own with that end's rows packed in the frame: whole slices, else
/// whole rows, else pieces of one row.
fn inline(c: &Copy, stream: Stream, sync: bool, to_device: bool) -> Result<(), CuError> {
    let (host_end, other) = if to_device { (&c.src, &c.dst) } else { (&c.dst, &c.src) };
    let slice = c.width.checked_mul(c.height).ok_or(CuError::INVALID_VALUE)?;
    let (slices_per, rows_per, piece) = if slice <= INLINE_CHUNK {
        (INLINE_CHUNK / slice, c.height, c.width)
    } else if c.width <= INLINE_CHUNK {
        (1, INLINE_CHUNK / c.width, c.width)
    } else {
        (1, 1, INLINE_CHUNK)
    };
    let mut z = 0;
    while z < c.depth {
        let slices = slices_per.min(c.depth - z);
        let mut y = 0;
        while y < c.height {
            let rows = rows_per.min(c.height - y);
            let mut x = 0;
            while x < c.width {
                let width = piece.min(c.width - x);
                let dims = [width, rows, slices];
                let far = side(&other.offset([x, y, z]), dims, false, false)?;
                let packed = CopySide { kind: SIDE_INLINE, at: 0, block: 0, x: 0, y: 0, z: 0, pitch: 0, height: 0 };
                let (src, dst) = if to_device { (packed, far) } else { (far, packed) };
                // The host rows of this piece, in order.
                let host_rows = (0..slices).flat_map(|dz| (0..rows).map(move |dy| (z + dz, y + dy)));
                let mut input = Vec::new();
                if to_device {
                    input.reserve_exact((width * rows * slices) as usize);
                    for (rz, ry) in host_rows.clone() {
                        // SAFETY: the caller's buffer holds the rows the copy reads, as the API requires.
                        let row = unsafe {
                            std::slice::from_raw_parts(host_end.host_row(rz, ry).add(x as usize), width as usize)
                        };
                        input.extend_from_slice(row);
                    }
                }
                let copy = gpuplex_protocol::Copy3D { shape: c.shape, src, dst, width, height: rows, depth: slices };
                let req = calls::Memcpy3D::Request { copy, input, stream, sync };
                if to_device {
                    let known = other.memory == DEVICE
                        && !other.overlapping(dims)
                        && other
                            .offset([x, y, z])
                            .extent(dims)
                            .is_some_and(|(s, n)| known_range(other.device.wrapping_add(s), n as usize));
                    if !sync && c.shape != COPY_2D_UNALIGNED && known {
                        client::post(req)?;
                    } else {
                        client::call(req)?;
                    }
                } else {
                    let out = client::call(req)?.output;
                    if out.len() as u64 != width * rows * slices {
                        return Err(CuError::UNKNOWN);
                    }
                    for (row, (rz, ry)) in out.chunks_exact(width as usize).zip(host_rows) {
                        // SAFETY: the caller's buffer holds the rows the copy writes, as the API requires.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                row.as_ptr(),
                                host_end.host_row(rz, ry).add(x as usize),
                                row.len(),
                            )
                        };
                    }
                }
                x += width;
            }
            y += rows;
        }
        z += slices;
    }
    Ok(())
}

/// Host to host: ordered after the stream's earlier work, then copied here.
fn host_to_host(c: &Copy, stream: Stream) -> Result<(), CuError> {
    super::stream_done_here(stream)?;
    for z in 0..c.depth {
        for y in 0..c.height {
            // SAFETY: the caller's buffers hold the rows, as the API requires.
            unsafe { std::ptr::copy(c.src.host_row(z, y), c.dst.host_row(z, y), c.width as usize) };
        }
    }
    Ok(())
}

/// `CUDA_MEMCPY2D`: one end's fields.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct End2D {
    x: usize,
    y: usize,
    memory: u32,
    host: *mut c_void,
    device: u64,
    array: *mut c_void,
    pitch: usize,
}

#[repr(C)]
pub struct Memcpy2D {
    src: End2D,
    dst: End2D,
    width: usize,
    height: usize,
}

/// `CUDA_MEMCPY3D`'s end; `CUDA_MEMCPY3D_PEER`'s is the same with a
/// context where this has a reserved pointer.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct End3D {
    x: usize,
    y: usize,
    z: usize,
    lod: usize,
    memory: u32,
    host: *mut c_void,
    device: u64,
    array: *mut c_void,
    reserved_or_context: *mut c_void,
    pitch: usize,
    height: usize,
}

#[repr(C)]
pub struct Memcpy3D {
    src: End3D,
    dst: End3D,
    width: usize,
    height: usize,
    depth: usize,
}

impl End2D {
    fn end(&self) -> End {
        End {
            memory: self.memory,
            host: self.host.cast(),
            device: self.device,
            array: self.array as u64,
            x: self.x as u64,
            y: self.y as u64,
            z: 0,
            pitch: self.pitch as u64,
            height: 0,
        }
    }
}

impl End3D {
    /// `peer`: the pointer field is a context (ignored: one device), not a
    /// reserved field that must be NULL.
    fn end(&self, peer: bool) -> Result<End, CuError> {
        if self.lod != 0 || (!peer && !self.reserved_or_context.is_null()) {
            return Err(CuError::INVALID_VALUE);
        }
        Ok(End {
            memory: self.memory,
            host: self.host.cast(),
            device: self.device,
            array: self.array as u64,
            x: self.x as u64,
            y: self.y as u64,
            z: self.z as u64,
            pitch: self.pitch as u64,
            height: self.height as u64,
        })
    }
}

/// `p` is an export's argument: NULL or valid for a read.
fn copy_2d(p: *const Memcpy2D, shape: u32, stream: Stream, sync: bool) -> Result<(), CuError> {
    // SAFETY: NULL or valid, per the export's contract.
    let p = unsafe { p.as_ref() }.ok_or(CuError::INVALID_VALUE)?;
    let c =
        Copy { shape, src: p.src.end(), dst: p.dst.end(), width: p.width as u64, height: p.height as u64, depth: 1 };
    copy(c, stream, sync)
}

/// `p` is an export's argument: NULL or valid for a read.
fn copy_3d(p: *const Memcpy3D, peer: bool, stream: Stream, sync: bool) -> Result<(), CuError> {
    // SAFETY: NULL or valid, per the export's contract.
    let p = unsafe { p.as_ref() }.ok_or(CuError::INVALID_VALUE)?;
    let (src, dst) = (p.src.end(peer)?, p.dst.end(peer)?);
    let c = Copy { shape: COPY_3D, src, dst, width: p.width as u64, height: p.height as u64, depth: p.depth as u64 };
    copy(c, stream, sync)
}

/// A memcpy node's copy. Its host ends are in blocks shared with the
/// server, which the server's driver reaches whenever the graph runs: the
/// program's pinned memory, or mirrors of its ordinary memory.
/// `p` is an export's argument: NULL or valid for a read.
pub(crate) fn node_copy(p: *const Memcpy3D) -> Result<gpuplex_protocol::Copy3D, CuError> {
    // SAFETY: NULL or valid, per the export's contract.
    let p = unsafe { p.as_ref() }.ok_or(CuError::INVALID_VALUE)?;
    let (src, dst) = (p.src.end(false)?.resolve()?, p.dst.end(false)?.resolve()?);
    let dims = [p.width as u64, p.height as u64, p.depth as u64];
    if dims.contains(&0) {
        return Err(CuError::INVALID_VALUE);
    }
    let (src, dst) = (side(&src, dims, true, true)?, side(&dst, dims, true, false)?);
    if src.kind == SIDE_INLINE || dst.kind == SIDE_INLINE {
        crate::log::warn(
            "cuGraphAddMemcpyNode: a graph's host memory must be shared with the server, whose driver runs the \
             graph: pinned, or ordinary memory mirrored, which needs a local server",
        );
        return Err(CuError::NOT_SUPPORTED);
    }
    let [width, height, depth] = dims;
    Ok(gpuplex_protocol::Copy3D { shape: COPY_3D, src, dst, width, height, depth })
}

/// A memcpy node's copy as the server describes it, in the program's terms:
/// a shared block's host end at the program's own address (for a mirror,
/// the ordinary memory it mirrors), whose first byte's position the
/// address holds.
pub(crate) fn program_copy(c: &gpuplex_protocol::Copy3D) -> Result<Memcpy3D, CuError> {
    let end = |s: &CopySide| -> Result<End3D, CuError> {
        let mut e = End3D {
            x: s.x as usize,
            y: s.y as usize,
            z: s.z as usize,
            lod: 0,
            memory: DEVICE,
            host: std::ptr::null_mut(),
            device: 0,
            array: std::ptr::null_mut(),
            reserved_or_context: std::ptr::null_mut(),
            pitch: s.pitch as usize,
            height: s.height as usize,
        };
        match s.kind {
            SIDE_DEVICE => e.device = s.at,
            SIDE_ARRAY => (e.memory, e.array) = (ARRAY, s.at as *mut c_void),
            SIDE_BLOCK => {
                let at = host::block_address(s.block, s.at).or_else(|| mirrors::program_address(s.block, s.at));
                (e.memory, e.host) = (HOST, at.ok_or(CuError::UNKNOWN)? as *mut c_void);
            }
            _ => return Err(CuError::UNKNOWN),
        }
        Ok(e)
    };
    let [width, height, depth] = [c.width, c.height, c.depth].map(|n| n as usize);
    Ok(Memcpy3D { src: end(&c.src)?, dst: end(&c.dst)?, width, height, depth })
}

/// A linear copy of `n` bytes to or from an array, at byte offsets.
fn linear(src: End, dst: End, n: usize, stream: Stream, sync: bool) -> Result<(), CuError> {
    copy(Copy { shape: COPY_ARRAY_LINEAR, src, dst, width: n as u64, height: 1, depth: 1 }, stream, sync)
}

fn host_at(p: *const c_void, n: usize) -> End {
    End { memory: HOST, host: p.cast_mut().cast(), device: 0, array: 0, x: 0, y: 0, z: 0, pitch: n as u64, height: 1 }
}

fn device_at(d: u64, n: usize) -> End {
    End { memory: DEVICE, device: d, ..host_at(std::ptr::null(), n) }
}

/// An address in unified addressing: host or device memory, found out
/// when the copy is made.
pub(super) fn unified_at(ptr: u64) -> End {
    End { memory: UNIFIED, device: ptr, ..host_at(std::ptr::null(), 0) }
}

/// An asynchronous 3D copy of `[width in bytes, height, depth]`.
pub(super) fn copy_3d_async(
    src: End,
    dst: End,
    [width, height, depth]: [u64; 3],
    stream: Stream,
) -> Result<(), CuError> {
    copy(Copy { shape: COPY_3D, src, dst, width, height, depth }, stream, false)
}

pub(super) fn array_at(a: *mut c_void, offset: usize) -> End {
    End { memory: ARRAY, array: a as u64, x: offset as u64, pitch: 0, ..host_at(std::ptr::null(), 0) }
}

exports! {
    cuMemcpy2D_v2(p: *const Memcpy2D) => copy_2d(p, COPY_2D, Stream::NULL, true);
    cuMemcpy2D_v2_ptds(p: *const Memcpy2D) => copy_2d(p, COPY_2D, Stream::PER_THREAD, true);
    cuMemcpy2DUnaligned_v2(p: *const Memcpy2D) => copy_2d(p, COPY_2D_UNALIGNED, Stream::NULL, true);
    cuMemcpy2DUnaligned_v2_ptds(p: *const Memcpy2D) => copy_2d(p, COPY_2D_UNALIGNED, Stream::PER_THREAD, true);
    cuMemcpy2DAsync_v2(p: *const Memcpy2D, s: *mut c_void) => copy_2d(p, COPY_2D, stream(s), false);
    cuMemcpy2DAsync_v2_ptsz(p: *const Memcpy2D, s: *mut c_void) => copy_2d(p, COPY_2D, ptsz_stream(s), false);
    cuMemcpy3D_v2(p: *const Memcpy3D) => copy_3d(p, false, Stream::NULL, true);
    cuMemcpy3D_v2_ptds(p: *const Memcpy3D) => copy_3d(p, false, Stream::PER_THREAD, true);
    cuMemcpy3DAsync_v2(p: *const Memcpy3D, s: *mut c_void) => copy_3d(p, false, stream(s), false);
    cuMemcpy3DAsync_v2_ptsz(p: *const Memcpy3D, s: *mut c_void) => copy_3d(p, false, ptsz_stream(s), false);
    cuMemcpy3DPeer(p: *const Memcpy3D) => copy_3d(p, true, Stream::NULL, true);
    cuMemcpy3DPeer_ptds(p: *const Memcpy3D) => copy_3d(p, true, Stream::PER_THREAD, true);
    cuMemcpy3DPeerAsync(p: *const Memcpy3D, s: *mut c_void) => copy_3d(p, true, stream(s), false);
    cuMemcpy3DPeerAsync_ptsz(p: *const Memcpy3D, s: *mut c_void) => copy_3d(p, true, ptsz_stream(s), false);
    cuMemcpyHtoA_v2(a: *mut c_void, off: usize, h: *const c_void, n: usize) => linear(host_at(h, n), array_at(a, off), n, Stream::NULL, true);
    cuMemcpyHtoA_v2_ptds(a: *mut c_void, off: usize, h: *const c_void, n: usize) => linear(host_at(h, n), array_at(a, off), n, Stream::PER_THREAD, true);
    cuMemcpyHtoAAsync_v2(a: *mut c_void, off: usize, h: *const c_void, n: usize, s: *mut c_void) => linear(host_at(h, n), array_at(a, off), n, stream(s), false);
    cuMemcpyHtoAAsync_v2_ptsz(a: *mut c_void, off: usize, h: *const c_void, n: usize, s: *mut c_void) => linear(host_at(h, n), array_at(a, off), n, ptsz_stream(s), false);
    cuMemcpyAtoH_v2(h: *mut c_void, a: *mut c_void, off: usize, n: usize) => linear(array_at(a, off), host_at(h, n), n, Stream::NULL, true);
    cuMemcpyAtoH_v2_ptds(h: *mut c_void, a: *mut c_void, off: usize, n: usize) => linear(array_at(a, off), host_at(h, n), n, Stream::PER_THREAD, true);
    cuMemcpyAtoHAsync_v2(h: *mut c_void, a: *mut c_void, off: usize, n: usize, s: *mut c_void) => linear(array_at(a, off), host_at(h, n), n, stream(s), false);
    cuMemcpyAtoHAsync_v2_ptsz(h: *mut c_void, a: *mut c_void, off: usize, n: usize, s: *mut c_void) => linear(array_at(a, off), host_at(h, n), n, ptsz_stream(s), false);
    cuMemcpyDtoA_v2(a: *mut c_void, off: usize, d: u64, n: usize) => linear(device_at(d, n), array_at(a, off), n, Stream::NULL, true);
    cuMemcpyDtoA_v2_ptds(a: *mut c_void, off: usize, d: u64, n: usize) => linear(device_at(d, n), array_at(a, off), n, Stream::PER_THREAD, true);
    cuMemcpyAtoD_v2(d: u64, a: *mut c_void, off: usize, n: usize) => linear(array_at(a, off), device_at(d, n), n, Stream::NULL, true);
    cuMemcpyAtoD_v2_ptds(d: u64, a: *mut c_void, off: usize, n: usize) => linear(array_at(a, off), device_at(d, n), n, Stream::PER_THREAD, true);
    cuMemcpyAtoA_v2(dst: *mut c_void, dst_off: usize, src: *mut c_void, src_off: usize, n: usize) => linear(array_at(src, src_off), array_at(dst, dst_off), n, Stream::NULL, true);
    cuMemcpyAtoA_v2_ptds(dst: *mut c_void, dst_off: usize, src: *mut c_void, src_off: usize, n: usize) => linear(array_at(src, src_off), array_at(dst, dst_off), n, Stream::PER_THREAD, true);
}
