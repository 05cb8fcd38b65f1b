//! The context stack, kept per thread in the client.
//!
//! The real driver's current context is per thread, and so is ours: each
//! thread's stack lives here, and every call carries the top of it to the
//! server, which makes that context current for the call. So threads never
//! see each other's contexts, and push/pop/set cost no round trip.

use std::cell::{Cell, RefCell};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

use gpuplex_protocol::{calls, Ctx, CuError, Stream};

use crate::ffi::{check_out, entry, ptsz_stream, stream, write_out, CUresult};
use crate::{client, memo};

thread_local! {
    static STACK: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    /// The thread's stream capture mode (`CU_STREAM_CAPTURE_MODE_*`, global
    /// by default), told to the server as it changes: the server's driver
    /// judges the thread's calls during a capture by it.
    static CAPTURE_MODE: Cell<u32> = const { Cell::new(0) };
    static THREAD_ID: u64 = NEXT_THREAD_ID.fetch_add(1, Ordering::Relaxed);
}

static NEXT_THREAD_ID: AtomicU64 = AtomicU64::new(1);

/// A number for the calling thread, sent with each call: the server keeps
/// one per-thread default stream per client thread, as the driver does.
pub fn thread_id() -> u64 {
    THREAD_ID.try_with(|t| *t).unwrap_or(0)
}

/// The calling thread's current context handle, 0 for none. A thread in
/// its exit handlers, whose stack is already gone, has none.
pub fn current() -> u64 {
    STACK.try_with(|s| s.borrow().last().copied().unwrap_or(0)).unwrap_or(0)
}

fn push(ctx: u64) {
    let _ = STACK.try_with(|s| s.borrow_mut().push(ctx));
}

fn pop() -> Option<u64> {
    STACK.try_with(|s| s.borrow_mut().pop()).ok().flatten()
}

/// # Safety
/// `pctx` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut *mut c_void) -> CUresult {
    entry("cuCtxGetCurrent", || {
        client::client()?;
        check_out(pctx)?;
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(pctx, current() as *mut c_void) };
        Ok(())
    })
}

/// # Safety
/// None beyond the CUDA API's.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: *mut c_void) -> CUresult {
    entry("cuCtxSetCurrent", || {
        client::client()?;
        // Replace the top, or pop it for NULL, as the driver documents.
        pop();
        if !ctx.is_null() {
            push(ctx as u64);
        }
        Ok(())
    })
}

/// # Safety
/// None beyond the CUDA API's.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: *mut c_void) -> CUresult {
    entry("cuCtxPushCurrent_v2", || {
        client::client()?;
        if ctx.is_null() {
            return Err(CuError::INVALID_CONTEXT);
        }
        push(ctx as u64);
        Ok(())
    })
}

/// # Safety
/// `pctx` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut *mut c_void) -> CUresult {
    entry("cuCtxPopCurrent_v2", || {
        client::client()?;
        let ctx = pop().ok_or(CuError::INVALID_CONTEXT)?;
        // SAFETY: NULL is skipped; otherwise the caller vouches for it.
        unsafe { write_out(pctx, ctx as *mut c_void) };
        Ok(())
    })
}

fn create(pctx: *mut *mut c_void, flags: u32, dev: i32) -> Result<(), CuError> {
    check_out(pctx)?;
    let reply = client::call(calls::CtxCreate::Request { flags, dev })?;
    // A new context is pushed onto the creating thread's stack.
    push(reply.ctx.0);
    // SAFETY: checked non-NULL; the caller vouches for it.
    unsafe { write_out(pctx, reply.ctx.0 as *mut c_void) };
    Ok(())
}

/// # Safety
/// `pctx` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(pctx: *mut *mut c_void, flags: u32, dev: i32) -> CUresult {
    entry("cuCtxCreate_v2", || create(pctx, flags, dev))
}

/// `CUctxCreateParams`: execution affinity and CIG are not supported.
#[repr(C)]
pub struct CtxCreateParams {
    exec_affinity_params: *mut c_void,
    num_exec_affinity_params: i32,
    cig_params: *mut c_void,
}

/// # Safety
/// `pctx` is valid for a write; `params` is NULL or valid for a read.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut *mut c_void,
    params: *const CtxCreateParams,
    flags: u32,
    dev: i32,
) -> CUresult {
    entry("cuCtxCreate_v4", || {
        // SAFETY: NULL or valid per the contract.
        if let Some(p) = unsafe { params.as_ref() } {
            if p.num_exec_affinity_params != 0 || !p.cig_params.is_null() {
                crate::log::warn("cuCtxCreate_v4: execution affinity and CIG parameters are not supported");
                return Err(CuError::NOT_SUPPORTED);
            }
        }
        create(pctx, flags, dev)
    })
}

fn destroy(ctx: *mut c_void) -> Result<(), CuError> {
    if ctx.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    client::call(calls::CtxDestroy::Request { ctx: Ctx(ctx as u64) })?;
    gone(ctx as u64);
    if current() == ctx as u64 {
        pop();
    }
    Ok(())
}

/// # Safety
/// None beyond the CUDA API's.
#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: *mut c_void) -> CUresult {
    entry("cuCtxDestroy_v2", || destroy(ctx))
}

/// # Safety
/// None beyond the CUDA API's.
#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy(ctx: *mut c_void) -> CUresult {
    entry("cuCtxDestroy", || destroy(ctx))
}

fn release_primary(dev: i32) -> Result<(), CuError> {
    let reply = client::call(calls::PrimaryCtxRelease::Request { dev });
    memo::PRIMARY.forget();
    if !reply?.active {
        gone(primary_handle(dev)?);
    }
    Ok(())
}

fn reset_primary(dev: i32) -> Result<(), CuError> {
    let reset = client::call(calls::PrimaryCtxReset::Request { dev });
    memo::PRIMARY.forget();
    reset?;
    gone(primary_handle(dev)?);
    Ok(())
}

/// What the process kept about a context that no longer exists.
fn gone(ctx: u64) {
    crate::export_tables::context_gone(ctx);
    crate::memory::forget_allocations();
    memo::CONTEXTS.forget();
    memo::FUNCTIONS.forget();
    memo::GRAPH_SETS.forget();
}

/// # Safety
/// `flags` and `active` are valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(dev: i32, flags: *mut u32, active: *mut i32) -> CUresult {
    entry("cuDevicePrimaryCtxGetState", || {
        check_out(flags)?;
        check_out(active)?;
        // An inactive context is not kept: a reset one that is still
        // retained comes back to life on its next use.
        let reply = memo::PRIMARY.keep_if(0, calls::cuDevicePrimaryCtxGetState::Request { dev }, |r| r.active != 0)?;
        // SAFETY: checked non-NULL; the caller vouches for them.
        unsafe {
            write_out(flags, reply.flags);
            write_out(active, reply.active);
        }
        Ok(())
    })
}

/// The session's primary context handle for a device.
pub fn primary_handle(dev: i32) -> Result<u64, CuError> {
    let welcome = &client::client()?.welcome;
    usize::try_from(dev)
        .ok()
        .and_then(|d| welcome.primary_contexts.0.get(d))
        .map(|c| c.0)
        .ok_or(CuError::INVALID_DEVICE)
}

/// # Safety
/// None beyond the CUDA API's.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: i32) -> CUresult {
    entry("cuDevicePrimaryCtxRelease_v2", || release_primary(dev))
}

/// # Safety
/// None beyond the CUDA API's.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease(dev: i32) -> CUresult {
    entry("cuDevicePrimaryCtxRelease", || release_primary(dev))
}

/// # Safety
/// None beyond the CUDA API's.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: i32) -> CUresult {
    entry("cuDevicePrimaryCtxReset_v2", || reset_primary(dev))
}

/// # Safety
/// None beyond the CUDA API's.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset(dev: i32) -> CUresult {
    entry("cuDevicePrimaryCtxReset", || reset_primary(dev))
}

/// # Safety
/// `mode` is valid for reads and writes.
#[no_mangle]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(mode: *mut u32) -> CUresult {
    entry("cuThreadExchangeStreamCaptureMode", || {
        check_out(mode)?;
        // SAFETY: checked non-NULL; the caller vouches for it.
        let wanted = unsafe { mode.read() };
        // GLOBAL, THREAD_LOCAL, RELAXED.
        if wanted > 2 {
            return Err(CuError::INVALID_VALUE);
        }
        let old = CAPTURE_MODE.with(|m| m.replace(wanted));
        // Before cuInit there is no server to tell, nor a capture for the mode to matter to.
        if old != wanted && client::client().is_ok() {
            client::post(calls::CaptureMode::Request { mode: wanted })?;
        }
        // SAFETY: as above.
        unsafe { write_out(mode, old) };
        Ok(())
    })
}

/// `cuStreamGetCtx_v2`: the stream's context, and its green context, which
/// is NULL since gpuplex makes none. Either out-pointer may be NULL.
fn stream_ctx(s: Stream, pctx: *mut *mut c_void, pgreen: *mut *mut c_void) -> Result<(), CuError> {
    if pctx.is_null() && pgreen.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    let reply = client::call(calls::cuStreamGetCtx::Request { hStream: s })?;
    // SAFETY: NULL is skipped; otherwise the caller vouches for the pointers.
    unsafe {
        write_out(pctx, reply.pctx.0 as *mut c_void);
        write_out(pgreen, std::ptr::null_mut());
    }
    Ok(())
}

exports! {
    cuStreamGetCtx_v2(s: *mut c_void, pctx: *mut *mut c_void, pgreen: *mut *mut c_void) => stream_ctx(stream(s), pctx, pgreen);
    cuStreamGetCtx_v2_ptsz(s: *mut c_void, pctx: *mut *mut c_void, pgreen: *mut *mut c_void) => stream_ctx(ptsz_stream(s), pctx, pgreen);
}
