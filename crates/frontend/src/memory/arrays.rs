//! Arrays, texture and surface objects. The server keeps the arrays and
//! checks every object against its session's; this side reads and writes
//! the C structures, and keeps each object's descriptors to answer the
//! `Get` calls as the driver would, from what the program gave.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, PoisonError};

use gpuplex_protocol::{
    calls, Array, ArrayDesc, CuError, ResourceDesc, RESOURCE_LINEAR, RESOURCE_PITCH2D, RESOURCE_VIEW_DESC_BYTES,
    TEXTURE_DESC_BYTES,
};

use crate::client;
use crate::ffi::{check_out, entry, write_out, CUresult};

/// `CUDA_ARRAY_DESCRIPTOR`.
#[repr(C)]
pub struct ArrayDescriptor {
    width: usize,
    height: usize,
    format: u32,
    channels: u32,
}

/// `CUDA_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
pub struct Array3DDescriptor {
    width: usize,
    height: usize,
    depth: usize,
    format: u32,
    channels: u32,
    flags: u32,
}

/// `CUDA_RESOURCE_DESC`: its union as the words it is laid out in.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Resource {
    kind: u32,
    words: [u64; 16],
    flags: u32,
}

/// `CUDA_TEXTURE_DESC` and `CUDA_RESOURCE_VIEW_DESC`, as bytes.
type TextureDesc = [u8; TEXTURE_DESC_BYTES];
type ViewDesc = [u8; RESOURCE_VIEW_DESC_BYTES];

/// What a texture or surface object was made from.
struct Made {
    res: Resource,
    tex: Option<TextureDesc>,
    view: Option<ViewDesc>,
}

/// This process's objects, keyed by `(surface, object)`.
static OBJECTS: Mutex<Option<HashMap<(bool, u64), Made>>> = Mutex::new(None);

fn objects<T>(f: impl FnOnce(&mut HashMap<(bool, u64), Made>) -> T) -> T {
    f(OBJECTS.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert_with(HashMap::new))
}

fn create(handle: *mut *mut c_void, desc: ArrayDesc) -> Result<(), CuError> {
    check_out(handle)?;
    let reply = client::call(calls::ArrayCreate::Request { desc })?;
    // SAFETY: checked non-NULL; the caller vouches for it.
    unsafe { write_out(handle, reply.array.0 as *mut c_void) };
    Ok(())
}

/// # Safety
/// `handle` is valid for a write, `desc` NULL or valid for a read.
#[no_mangle]
pub unsafe extern "C" fn cuArrayCreate_v2(handle: *mut *mut c_void, desc: *const ArrayDescriptor) -> CUresult {
    entry("cuArrayCreate_v2", || {
        // SAFETY: NULL or valid, per the contract.
        let d = unsafe { desc.as_ref() }.ok_or(CuError::INVALID_VALUE)?;
        let desc = ArrayDesc {
            width: d.width as u64,
            height: d.height as u64,
            depth: 0,
            format: d.format,
            channels: d.channels,
            flags: 0,
        };
        create(handle, desc)
    })
}

/// A `CUDA_ARRAY3D_DESCRIPTOR` as it travels.
///
/// # Safety
/// `desc` is NULL or valid for a read.
unsafe fn read_3d(desc: *const Array3DDescriptor) -> Result<ArrayDesc, CuError> {
    // SAFETY: NULL or valid, per the contract.
    let d = unsafe { desc.as_ref() }.ok_or(CuError::INVALID_VALUE)?;
    Ok(ArrayDesc {
        width: d.width as u64,
        height: d.height as u64,
        depth: d.depth as u64,
        format: d.format,
        channels: d.channels,
        flags: d.flags,
    })
}

/// # Safety
/// `handle` is valid for a write, `desc` NULL or valid for a read.
#[no_mangle]
pub unsafe extern "C" fn cuArray3DCreate_v2(handle: *mut *mut c_void, desc: *const Array3DDescriptor) -> CUresult {
    // SAFETY: per the contract.
    entry("cuArray3DCreate_v2", || create(handle, unsafe { read_3d(desc)? }))
}

/// # Safety
/// `handle` is valid for a write, `desc` NULL or valid for a read.
#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    handle: *mut *mut c_void,
    desc: *const Array3DDescriptor,
    levels: u32,
) -> CUresult {
    entry("cuMipmappedArrayCreate", || {
        check_out(handle)?;
        // SAFETY: per the contract.
        let desc = unsafe { read_3d(desc)? };
        let reply = client::call(calls::MipmappedArrayCreate::Request { desc, levels })?;
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(handle, reply.mipmap.0 as *mut c_void) };
        Ok(())
    })
}

pub(super) fn descriptor(array: *mut c_void) -> Result<ArrayDesc, CuError> {
    Ok(client::call(calls::ArrayDescriptor::Request { array: Array(array as u64) })?.desc)
}

/// # Safety
/// `desc` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuArrayGetDescriptor_v2(desc: *mut ArrayDescriptor, array: *mut c_void) -> CUresult {
    entry("cuArrayGetDescriptor_v2", || {
        check_out(desc)?;
        let d = descriptor(array)?;
        let c = ArrayDescriptor {
            width: d.width as usize,
            height: d.height as usize,
            format: d.format,
            channels: d.channels,
        };
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(desc, c) };
        Ok(())
    })
}

/// # Safety
/// `desc` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuArray3DGetDescriptor_v2(desc: *mut Array3DDescriptor, array: *mut c_void) -> CUresult {
    entry("cuArray3DGetDescriptor_v2", || {
        check_out(desc)?;
        let d = descriptor(array)?;
        let c = Array3DDescriptor {
            width: d.width as usize,
            height: d.height as usize,
            depth: d.depth as usize,
            format: d.format,
            channels: d.channels,
            flags: d.flags,
        };
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(desc, c) };
        Ok(())
    })
}

/// A resource as it travels: the handle or address word, and for linear and
/// pitched memory the rest of its fields.
fn resource(r: &Resource) -> ResourceDesc {
    let w = &r.words;
    let mut desc = ResourceDesc {
        kind: r.kind,
        at: w[0],
        format: 0,
        channels: 0,
        width: 0,
        height: 0,
        pitch: 0,
        size: 0,
        flags: r.flags,
    };
    if matches!(r.kind, RESOURCE_LINEAR | RESOURCE_PITCH2D) {
        // The format and channel count share the second word.
        desc.format = w[1] as u32;
        desc.channels = (w[1] >> 32) as u32;
        if r.kind == RESOURCE_LINEAR {
            desc.size = w[2];
        } else {
            (desc.width, desc.height, desc.pitch) = (w[2], w[3], w[4]);
        }
    }
    desc
}

/// # Safety
/// `object` is valid for a write; the descriptors NULL or valid for reads.
#[no_mangle]
pub unsafe extern "C" fn cuTexObjectCreate(
    object: *mut u64,
    res: *const Resource,
    tex: *const TextureDesc,
    view: *const ViewDesc,
) -> CUresult {
    entry("cuTexObjectCreate", || {
        check_out(object)?;
        // SAFETY: NULL or valid, per the contract.
        let (res, tex, view) = unsafe { (*res.as_ref().ok_or(CuError::INVALID_VALUE)?, tex.as_ref(), view.as_ref()) };
        let tex = *tex.ok_or(CuError::INVALID_VALUE)?;
        let req = calls::TexObjectCreate::Request {
            res: resource(&res),
            tex: tex.to_vec(),
            view: view.map_or_else(Vec::new, |v| v.to_vec()),
        };
        let made = client::call(req)?.object;
        objects(|o| o.insert((false, made), Made { res, tex: Some(tex), view: view.copied() }));
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(object, made) };
        Ok(())
    })
}

/// # Safety
/// `object` is valid for a write; `res` NULL or valid for a read.
#[no_mangle]
pub unsafe extern "C" fn cuSurfObjectCreate(object: *mut u64, res: *const Resource) -> CUresult {
    entry("cuSurfObjectCreate", || {
        check_out(object)?;
        // SAFETY: NULL or valid, per the contract.
        let res = unsafe { *res.as_ref().ok_or(CuError::INVALID_VALUE)? };
        let made = client::call(calls::SurfObjectCreate::Request { res: resource(&res) })?.object;
        objects(|o| o.insert((true, made), Made { res, tex: None, view: None }));
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(object, made) };
        Ok(())
    })
}

fn destroy(surface: bool, object: u64) -> Result<(), CuError> {
    if surface {
        client::call(calls::SurfObjectDestroy::Request { object })?;
    } else {
        client::call(calls::TexObjectDestroy::Request { object })?;
    }
    objects(|o| o.remove(&(surface, object)));
    Ok(())
}

/// Writes what an object of this process was made from, as `pick` takes
/// it, to `out`: an export's argument, valid for a write of a `T`.
fn made<T>(out: *mut T, surface: bool, object: u64, pick: impl FnOnce(&Made) -> T) -> Result<(), CuError> {
    check_out(out)?;
    let value = objects(|o| o.get(&(surface, object)).map(pick)).ok_or(CuError::INVALID_VALUE)?;
    // SAFETY: checked non-NULL; the export's caller vouches for it.
    unsafe { write_out(out, value) };
    Ok(())
}

exports! {
    cuTexObjectDestroy(object: u64) => destroy(false, object);
    cuSurfObjectDestroy(object: u64) => destroy(true, object);
    cuTexObjectGetResourceDesc(out: *mut Resource, object: u64) => made(out, false, object, |m| m.res);
    cuSurfObjectGetResourceDesc(out: *mut Resource, object: u64) => made(out, true, object, |m| m.res);
    cuTexObjectGetTextureDesc(out: *mut TextureDesc, object: u64) =>
        made(out, false, object, |m| m.tex.unwrap_or([0; TEXTURE_DESC_BYTES]));
    // Made without a view, an object's view reads as all zeros.
    cuTexObjectGetResourceViewDesc(out: *mut ViewDesc, object: u64) =>
        made(out, false, object, |m| m.view.unwrap_or([0; RESOURCE_VIEW_DESC_BYTES]));
}
