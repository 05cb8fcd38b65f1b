//! Memory pools and stream-ordered allocation on the real driver. The
//! session has checked every pool, pointer and device first (see
//! `session/pools.rs`); these only translate the structures and call it.

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

use gpuplex_protocol::{AccessDesc, PoolProps};

use super::api::{self, check, MemLocation};
use super::vmm::{c_access, int};
use super::{enter, handle, query, raw, size, BResult, Cuda, Obj};
use crate::backend::Pools;

/// `CUmemPoolProps` as the driver takes them.
pub(super) fn c_props(props: &PoolProps) -> BResult<api::PoolProps> {
    Ok(api::PoolProps {
        kind: int(props.kind),
        handle_types: int(props.handle_types),
        location: MemLocation { kind: int(props.location_kind), id: props.location },
        win32_security_attributes: null_mut(),
        max_size: size(props.max_size)?,
        usage: u16::try_from(props.usage).map_err(|_| gpuplex_protocol::CuError::INVALID_VALUE)?,
        reserved: [0; 54],
    })
}

/// `CUmemPoolProps` as the driver gave them.
pub(super) fn wire_props(p: &api::PoolProps) -> PoolProps {
    PoolProps {
        kind: p.kind as u32,
        handle_types: p.handle_types as u32,
        location_kind: p.location.kind as u32,
        location: p.location.id,
        max_size: p.max_size as u64,
        usage: p.usage.into(),
    }
}

pub(super) fn create(props: &PoolProps) -> BResult<Obj> {
    let props = c_props(props)?;
    // SAFETY: out-pointer to a local; the structure lives across the call.
    handle(|p| unsafe { api::cuMemPoolCreate(p, &props) })
}

pub(super) fn destroy(pool: Obj) -> BResult<()> {
    // SAFETY: one of the session's pools, forgotten by it after this.
    check(unsafe { api::cuMemPoolDestroy(raw(pool)) })
}

pub(super) fn alloc(bytes: u64, pool: Obj, stream: Obj) -> BResult<u64> {
    let bytes = size(bytes)?;
    // SAFETY: out-pointer to a local; a pool of the session's and a live or special stream.
    query(|p| unsafe { api::cuMemAllocFromPoolAsync(p, bytes, raw(pool), raw(stream)) })
}

pub(super) fn free(ptr: u64, stream: Obj) -> BResult<()> {
    // SAFETY: one of the session's allocations, which it forgets now.
    check(unsafe { api::cuMemFreeAsync(ptr, raw(stream)) })
}

pub(super) fn trim(pool: Obj, keep: u64) -> BResult<()> {
    // SAFETY: one of the session's pools.
    check(unsafe { api::cuMemPoolTrimTo(raw(pool), size(keep)?) })
}

/// Every attribute is an `int` or a `cuuint64_t`; on a little-endian host a
/// u64 holds either, the `int` in its low half.
pub(super) fn set_attribute(pool: Obj, attr: i32, value: u64) -> BResult<()> {
    let mut value = value;
    // SAFETY: the value outlives the call and is as large as any attribute.
    check(unsafe { api::cuMemPoolSetAttribute(raw(pool), attr, (&raw mut value).cast::<c_void>()) })
}

pub(super) fn get_attribute(pool: Obj, attr: i32) -> BResult<u64> {
    // SAFETY: as for `set_attribute`; an `int` fills the low half of a zeroed u64.
    query(|v: *mut u64| unsafe { api::cuMemPoolGetAttribute(raw(pool), attr, v.cast::<c_void>()) })
}

pub(super) fn set_access(pool: Obj, access: &[AccessDesc]) -> BResult<()> {
    let descs = c_access(access);
    // SAFETY: `descs` lives across the call.
    check(unsafe { api::cuMemPoolSetAccess(raw(pool), descs.as_ptr(), descs.len()) })
}

pub(super) fn get_access(pool: Obj, location_kind: u32, location: i32) -> BResult<u64> {
    let location = MemLocation { kind: int(location_kind), id: location };
    // SAFETY: out-pointer to a local; the location lives across the call.
    query(|f: *mut c_int| unsafe { api::cuMemPoolGetAccess(f, raw(pool), &location) }).map(|f| f as u64)
}

impl Pools for Cuda {
    fn mem_pool_create(&self, ctx: Option<Obj>, props: &PoolProps) -> BResult<Obj> {
        ctx.map_or(Ok(()), enter)?;
        create(props)
    }

    fn mem_pool_destroy(&self, pool: Obj) -> BResult<()> {
        destroy(pool)
    }

    fn mem_alloc_from_pool(&self, ctx: Obj, size: u64, pool: Obj, stream: Obj) -> BResult<u64> {
        enter(ctx)?;
        alloc(size, pool, stream)
    }

    fn mem_free_async(&self, ctx: Obj, ptr: u64, stream: Obj) -> BResult<()> {
        enter(ctx)?;
        free(ptr, stream)
    }

    fn mem_pool_trim(&self, pool: Obj, keep: u64) -> BResult<()> {
        trim(pool, keep)
    }

    fn mem_pool_set_attribute(&self, pool: Obj, attr: i32, value: u64) -> BResult<()> {
        set_attribute(pool, attr, value)
    }

    fn mem_pool_get_attribute(&self, pool: Obj, attr: i32) -> BResult<u64> {
        get_attribute(pool, attr)
    }

    fn mem_pool_set_access(&self, pool: Obj, access: &[AccessDesc]) -> BResult<()> {
        set_access(pool, access)
    }

    fn mem_pool_get_access(&self, pool: Obj, location_kind: u32, location: i32) -> BResult<u64> {
        get_access(pool, location_kind, location)
    }
}
