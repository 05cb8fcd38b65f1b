//! Arrays, texture and surface objects, and 2D and 3D copies on the real
//! driver. The session has checked every handle and device range first
//! (see `session/arrays.rs`); these only build the C structures and call
//! the driver function the guest called.

use std::ffi::{c_int, c_uint, c_void};
use std::ptr::null_mut;

use cudarc::driver::sys::CUstream;
use gpuplex_protocol::{
    ArrayDesc, CallError, CuError, ResourceDesc, COPY_2D, COPY_2D_UNALIGNED, COPY_3D, COPY_ARRAY_LINEAR,
    RESOURCE_ARRAY, RESOURCE_LINEAR, RESOURCE_PITCH2D, RESOURCE_VIEW_DESC_BYTES, TEXTURE_DESC_BYTES,
};

use super::api::{self, check};
use super::{enter, obj, query, raw, size, sync_stream, BResult, Copy3D, CopyEnd, Cuda, Obj, Place};
use crate::backend::Arrays;

/// `CUDA_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
#[derive(Default)]
pub(super) struct Array3DDescriptor {
    width: usize,
    height: usize,
    depth: usize,
    format: c_int,
    channels: c_uint,
    flags: c_uint,
}

/// `CUDA_MEMCPY3D` (`reserved` fields NULL); `CUDA_MEMCPY2D` is its
/// fields without z, LOD, slice height, reserved and depth.
#[repr(C)]
pub(super) struct Memcpy3D {
    src: End3D,
    dst: End3D,
    width: usize,
    height: usize,
    depth: usize,
}

#[repr(C)]
struct End3D {
    x: usize,
    y: usize,
    z: usize,
    lod: usize,
    memory_type: c_int,
    host: *mut c_void,
    device: u64,
    array: *mut c_void,
    reserved: *mut c_void,
    pitch: usize,
    height: usize,
}

#[repr(C)]
pub(super) struct Memcpy2D {
    src: End2D,
    dst: End2D,
    width: usize,
    height: usize,
}

#[repr(C)]
struct End2D {
    x: usize,
    y: usize,
    memory_type: c_int,
    host: *mut c_void,
    device: u64,
    array: *mut c_void,
    pitch: usize,
}

/// `CU_MEMORYTYPE_*` and the pointer fields of one end.
fn memory(place: Place) -> (c_int, *mut c_void, u64, *mut c_void) {
    match place {
        Place::Host(p) => (1, p.cast(), 0, null_mut()),
        Place::Device(d) => (2, null_mut(), d, null_mut()),
        Place::Array(a) => (3, null_mut(), 0, raw(a)),
    }
}

fn end_3d(e: &CopyEnd) -> BResult<End3D> {
    let (memory_type, host, device, array) = memory(e.place);
    Ok(End3D {
        x: size(e.x)?,
        y: size(e.y)?,
        z: size(e.z)?,
        lod: 0,
        memory_type,
        host,
        device,
        array,
        reserved: null_mut(),
        pitch: size(e.pitch)?,
        height: size(e.height)?,
    })
}

fn end_2d(e: &CopyEnd) -> BResult<End2D> {
    let (memory_type, host, device, array) = memory(e.place);
    Ok(End2D { x: size(e.x)?, y: size(e.y)?, memory_type, host, device, array, pitch: size(e.pitch)? })
}

impl Memcpy3D {
    /// All zeros, for the driver to fill in.
    pub(super) fn empty() -> Memcpy3D {
        let end = || End3D {
            x: 0,
            y: 0,
            z: 0,
            lod: 0,
            memory_type: 0,
            host: null_mut(),
            device: 0,
            array: null_mut(),
            reserved: null_mut(),
            pitch: 0,
            height: 0,
        };
        Memcpy3D { src: end(), dst: end(), width: 0, height: 0, depth: 0 }
    }
}

/// One end of a copy as the driver describes it; a unified address is
/// taken as the device address it also is.
fn end_of(e: &End3D) -> BResult<CopyEnd> {
    let place = match e.memory_type {
        1 => Place::Host(e.host.cast()),
        2 | 4 => Place::Device(e.device),
        3 => Place::Array(obj(e.array)),
        other => return Err(CallError::new(CuError::UNKNOWN, format!("memory type {other} from the driver"))),
    };
    let (x, y, z, pitch, height) = (e.x as u64, e.y as u64, e.z as u64, e.pitch as u64, e.height as u64);
    Ok(CopyEnd { place, x, y, z, pitch, height })
}

/// A copy as the driver's `CUDA_MEMCPY3D` describes it.
pub(super) fn copy_of(c: &Memcpy3D) -> BResult<Copy3D> {
    let (width, height, depth) = (c.width as u64, c.height as u64, c.depth as u64);
    Ok(Copy3D { shape: COPY_3D, src: end_of(&c.src)?, dst: end_of(&c.dst)?, width, height, depth })
}

/// `CUDA_MEMCPY3D` for a copy.
pub(super) fn memcpy_3d(c: &Copy3D) -> BResult<Memcpy3D> {
    let (width, height, depth) = (size(c.width)?, size(c.height)?, size(c.depth)?);
    Ok(Memcpy3D { src: end_3d(&c.src)?, dst: end_3d(&c.dst)?, width, height, depth })
}

/// # Safety
/// Host ends are valid for the rows the copy reads or writes.
pub(super) unsafe fn copy(c: &Copy3D, stream: Obj, sync: bool) -> BResult<()> {
    let s: CUstream = raw(stream);
    let (width, height) = (size(c.width)?, size(c.height)?);
    match c.shape {
        COPY_3D => {
            let p = memcpy_3d(c)?;
            // SAFETY: the structure lives across the call; its host pointers
            // are the caller's to vouch for, the rest the session checked.
            check(unsafe { api::cuMemcpy3DAsync_v2(&p, s) })?;
        }
        COPY_2D | COPY_2D_UNALIGNED => {
            let p = Memcpy2D { src: end_2d(&c.src)?, dst: end_2d(&c.dst)?, width, height };
            // SAFETY: as above. The unaligned form is synchronous, on the
            // legacy stream: there is no other.
            check(unsafe {
                if c.shape == COPY_2D_UNALIGNED {
                    api::cuMemcpy2DUnaligned_v2(&p)
                } else {
                    api::cuMemcpy2DAsync_v2(&p, s)
                }
            })?;
        }
        // SAFETY: the caller's guarantee.
        COPY_ARRAY_LINEAR => unsafe { linear(c, s) }?,
        shape => return Err(CallError::new(CuError::INVALID_VALUE, format!("copy shape {shape}"))),
    }
    if sync {
        sync_stream(stream)?;
    }
    Ok(())
}

/// The linear copies to and from arrays. Those with host memory go on the
/// copy's stream (the synchronous forms would order it after the legacy
/// stream instead; the caller waits for a synchronous one); those between an
/// array and device memory have only a synchronous form, on the legacy
/// stream, as the guest's call had.
///
/// # Safety
/// As for [`copy`].
unsafe fn linear(c: &Copy3D, s: CUstream) -> BResult<()> {
    let n = size(c.width)?;
    let (src_x, dst_x) = (size(c.src.x)?, size(c.dst.x)?);
    // SAFETY: host pointers are the caller's to vouch for, arrays and
    // device ranges the session checked.
    check(unsafe {
        match (c.src.place, c.dst.place) {
            (Place::Host(h), Place::Array(a)) => api::cuMemcpyHtoAAsync_v2(raw(a), dst_x, h.cast(), n, s),
            (Place::Array(a), Place::Host(h)) => api::cuMemcpyAtoHAsync_v2(h.cast(), raw(a), src_x, n, s),
            (Place::Device(d), Place::Array(a)) => api::cuMemcpyDtoA_v2(raw(a), dst_x, d + c.src.x, n),
            (Place::Array(a), Place::Device(d)) => api::cuMemcpyAtoD_v2(d + c.dst.x, raw(a), src_x, n),
            (Place::Array(from), Place::Array(to)) => api::cuMemcpyAtoA_v2(raw(to), dst_x, raw(from), src_x, n),
            _ => return Err(CallError::new(CuError::INVALID_VALUE, "a linear array copy without an array")),
        }
    })
}

fn c_desc(desc: &ArrayDesc) -> BResult<Array3DDescriptor> {
    Ok(Array3DDescriptor {
        width: size(desc.width)?,
        height: size(desc.height)?,
        depth: size(desc.depth)?,
        format: desc.format as c_int,
        channels: desc.channels,
        flags: desc.flags,
    })
}

pub(super) fn create(desc: &ArrayDesc) -> BResult<Obj> {
    let d = c_desc(desc)?;
    // SAFETY: out-pointer to a local; the descriptor lives across the call.
    super::handle(|a| unsafe { api::cuArray3DCreate_v2(a, &d) })
}

pub(super) fn mipmap_create(desc: &ArrayDesc, levels: u32) -> BResult<Obj> {
    let d = c_desc(desc)?;
    // SAFETY: as above.
    super::handle(|m| unsafe { api::cuMipmappedArrayCreate(m, &d, levels) })
}

pub(super) fn mipmap_level(mipmap: Obj, level: u32) -> BResult<Obj> {
    // SAFETY: out-pointer to a local; one of the session's mipmapped arrays.
    super::handle(|a| unsafe { api::cuMipmappedArrayGetLevel(a, raw(mipmap), level) })
}

pub(super) fn mipmap_destroy(mipmap: Obj) -> BResult<()> {
    // SAFETY: one of the session's mipmapped arrays, forgotten by it after this.
    check(unsafe { api::cuMipmappedArrayDestroy(raw(mipmap)) })
}

pub(super) fn destroy(array: Obj) -> BResult<()> {
    // SAFETY: one of the session's arrays, forgotten by it after this.
    check(unsafe { api::cuArrayDestroy(raw(array)) })
}

pub(super) fn descriptor(array: Obj) -> BResult<ArrayDesc> {
    // SAFETY: out-pointer to a local; one of the session's arrays.
    let d: Array3DDescriptor = query(|d| unsafe { api::cuArray3DGetDescriptor_v2(d, raw(array)) })?;
    Ok(ArrayDesc {
        width: d.width as u64,
        height: d.height as u64,
        depth: d.depth as u64,
        format: d.format as u32,
        channels: d.channels,
        flags: d.flags,
    })
}

/// `CUDA_RESOURCE_DESC`: its union as the words it is laid out in.
#[repr(C)]
pub(super) struct Resource {
    kind: c_int,
    words: [u64; 16],
    flags: c_uint,
}

fn resource(r: &ResourceDesc) -> Resource {
    let mut words = [0u64; 16];
    words[0] = r.at;
    match r.kind {
        RESOURCE_LINEAR | RESOURCE_PITCH2D => {
            // The format and channel count share the second word.
            words[1] = u64::from(r.format) | u64::from(r.channels) << 32;
            if r.kind == RESOURCE_LINEAR {
                words[2] = r.size;
            } else {
                words[2..5].copy_from_slice(&[r.width, r.height, r.pitch]);
            }
        }
        RESOURCE_ARRAY => {}
        // Anything else the driver judges, from the handle word alone.
        _ => {}
    }
    Resource { kind: r.kind as c_int, words, flags: r.flags }
}

/// The texture and view descriptors, 8-byte aligned for the driver.
#[repr(C, align(8))]
struct TextureDesc([u8; TEXTURE_DESC_BYTES]);
#[repr(C, align(8))]
struct ViewDesc([u8; RESOURCE_VIEW_DESC_BYTES]);

pub(super) fn tex_create(res: &ResourceDesc, tex: &[u8], view: Option<&[u8]>) -> BResult<u64> {
    let res = resource(res);
    let mut t = TextureDesc([0; TEXTURE_DESC_BYTES]);
    t.0.copy_from_slice(tex);
    let v = view.map(|v| {
        let mut d = ViewDesc([0; RESOURCE_VIEW_DESC_BYTES]);
        d.0.copy_from_slice(v);
        d
    });
    let view_ptr = v.as_ref().map_or(std::ptr::null(), |d| d as *const ViewDesc);
    // SAFETY: out-pointer to a local; the structures live across the call
    // and are as large as the driver reads.
    query(|o| unsafe { api::cuTexObjectCreate(o, &res, (&raw const t).cast(), view_ptr.cast()) })
}

pub(super) fn tex_destroy(object: u64) -> BResult<()> {
    // SAFETY: one of the session's texture objects.
    check(unsafe { api::cuTexObjectDestroy(object) })
}

pub(super) fn surf_create(res: &ResourceDesc) -> BResult<u64> {
    let res = resource(res);
    // SAFETY: out-pointer to a local; the structure lives across the call.
    query(|o| unsafe { api::cuSurfObjectCreate(o, &res) })
}

pub(super) fn surf_destroy(object: u64) -> BResult<()> {
    // SAFETY: one of the session's surface objects.
    check(unsafe { api::cuSurfObjectDestroy(object) })
}

impl Arrays for Cuda {
    fn array_create(&self, ctx: Obj, desc: &ArrayDesc) -> BResult<Obj> {
        enter(ctx)?;
        create(desc)
    }

    fn array_destroy(&self, ctx: Obj, array: Obj) -> BResult<()> {
        enter(ctx)?;
        destroy(array)
    }

    fn array_descriptor(&self, ctx: Obj, array: Obj) -> BResult<ArrayDesc> {
        enter(ctx)?;
        descriptor(array)
    }

    fn mipmap_create(&self, ctx: Obj, desc: &ArrayDesc, levels: u32) -> BResult<Obj> {
        enter(ctx)?;
        mipmap_create(desc, levels)
    }

    fn mipmap_level(&self, ctx: Obj, mipmap: Obj, level: u32) -> BResult<Obj> {
        enter(ctx)?;
        mipmap_level(mipmap, level)
    }

    fn mipmap_destroy(&self, ctx: Obj, mipmap: Obj) -> BResult<()> {
        enter(ctx)?;
        mipmap_destroy(mipmap)
    }

    unsafe fn memcpy_3d(&self, ctx: Obj, c: &Copy3D, stream: Obj, sync: bool) -> BResult<()> {
        enter(ctx)?;
        // SAFETY: the caller's guarantee.
        unsafe { copy(c, stream, sync) }
    }

    fn tex_object_create(&self, ctx: Obj, res: &ResourceDesc, tex: &[u8], view: Option<&[u8]>) -> BResult<u64> {
        enter(ctx)?;
        tex_create(res, tex, view)
    }

    fn tex_object_destroy(&self, ctx: Obj, object: u64) -> BResult<()> {
        enter(ctx)?;
        tex_destroy(object)
    }

    fn surf_object_create(&self, ctx: Obj, res: &ResourceDesc) -> BResult<u64> {
        enter(ctx)?;
        surf_create(res)
    }

    fn surf_object_destroy(&self, ctx: Obj, object: u64) -> BResult<()> {
        enter(ctx)?;
        surf_destroy(object)
    }
}
