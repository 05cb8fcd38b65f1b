//! Interprocess handles on the real driver: the session has checked that a
//! handle is one its tenant gave out, and every pointer its own.

use std::ffi::c_void;

use gpuplex_protocol::CuError;

use super::api::{self, check};
use super::{enter, handle, raw, BResult, Cuda, Obj};
use crate::backend::{Ipc, IpcHandle};

/// `CUipcMemHandle` and `CUipcEventHandle`, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct IpcBytes {
    reserved: IpcHandle,
}

pub(super) fn get_mem_handle(dptr: u64) -> BResult<IpcHandle> {
    let mut h = IpcBytes { reserved: [0; 64] };
    // SAFETY: the base of one of the session's allocations; out-pointer to a local.
    check(unsafe { api::cuIpcGetMemHandle(&mut h, dptr) })?;
    Ok(h.reserved)
}

/// The memory mapped, and its size.
pub(super) fn open_mem_handle(handle: &IpcHandle, flags: u32) -> BResult<(u64, u64)> {
    let mut dptr = 0u64;
    // SAFETY: a handle's bytes by value; out-pointer to a local.
    check(unsafe { api::cuIpcOpenMemHandle_v2(&mut dptr, IpcBytes { reserved: *handle }, flags) })?;
    let (mut base, mut size) = (0u64, 0usize);
    // SAFETY: the address just mapped; out-pointers to locals.
    let range = check(unsafe { api::cuMemGetAddressRange_v2(&mut base, &mut size, dptr) });
    match range {
        Ok(()) if base == dptr => Ok((dptr, size as u64)),
        // Unmapped again rather than left without a size to check against.
        _ => {
            let _ = close_mem_handle(dptr);
            Err(CuError::INVALID_VALUE.into())
        }
    }
}

pub(super) fn close_mem_handle(dptr: u64) -> BResult<()> {
    // SAFETY: memory the session opened from a handle.
    check(unsafe { api::cuIpcCloseMemHandle(dptr) })
}

pub(super) fn get_event_handle(event: Obj) -> BResult<IpcHandle> {
    let mut h = IpcBytes { reserved: [0; 64] };
    // SAFETY: one of the session's events; out-pointer to a local.
    check(unsafe { api::cuIpcGetEventHandle(&mut h, raw(event)) })?;
    Ok(h.reserved)
}

pub(super) fn open_event_handle(h: &IpcHandle) -> BResult<Obj> {
    // SAFETY: a handle's bytes by value; out-pointer to a local.
    handle(|e: *mut *mut c_void| unsafe { api::cuIpcOpenEventHandle(e, IpcBytes { reserved: *h }) })
}

impl Ipc for Cuda {
    fn ipc_get_mem_handle(&self, ctx: Obj, dptr: u64) -> BResult<IpcHandle> {
        enter(ctx)?;
        get_mem_handle(dptr)
    }

    fn ipc_open_mem_handle(&self, ctx: Obj, handle: &IpcHandle, flags: u32) -> BResult<(u64, u64)> {
        enter(ctx)?;
        open_mem_handle(handle, flags)
    }

    fn ipc_close_mem_handle(&self, ctx: Obj, dptr: u64) -> BResult<()> {
        enter(ctx)?;
        close_mem_handle(dptr)
    }

    fn ipc_get_event_handle(&self, ctx: Obj, event: Obj) -> BResult<IpcHandle> {
        enter(ctx)?;
        get_event_handle(event)
    }

    fn ipc_open_event_handle(&self, ctx: Obj, handle: &IpcHandle) -> BResult<Obj> {
        enter(ctx)?;
        open_event_handle(handle)
    }
}
