//! Kernel launches.
//!
//! `cuLaunchKernel` receives `void **kernelParams` with no sizes. The
//! layout (offset and size of each parameter) is asked of the server once
//! per function and cached here; the client then packs the parameters into
//! one buffer exactly as the driver would, and the server launches with
//! that buffer. Nothing assumes 8 bytes per argument or a NULL-terminated
//! list.
//!
//! A launch the client can see will be accepted (dimensions within the
//! device's and the function's limits, dynamic shared memory within the
//! default or the function's raised limit, no attributes) is posted: the program goes on at once, as with
//! the driver's asynchronous launches. Any other launch is waited for, so
//! that its error comes back from the launch itself, exactly as natively.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use gpuplex_protocol::{calls, CuError, Func, Stream};

use crate::ffi::{check_out, entry, ptsz_stream, stream, write_out, CUresult};
use crate::{client, memo};

/// What the client knows of a function: where each parameter goes
/// (`(offset, size)`), and the limits a launch is checked against.
pub(crate) struct FuncInfo {
    layout: Vec<(u32, u32)>,
    /// Bytes the packed parameters span.
    packed: usize,
    max_threads: u32,
    static_shared: u32,
}

/// Handles are never reused within a session, so entries never go stale.
static FUNCS: Mutex<Option<HashMap<u64, Arc<FuncInfo>>>> = Mutex::new(None);

thread_local! {
    /// The function this thread launched last: a loop launches the same
    /// kernels again and again, and this spares each launch the map's lock.
    static LAST: RefCell<Option<(u64, Arc<FuncInfo>)>> = const { RefCell::new(None) };
}

fn info(func: u64) -> Result<Arc<FuncInfo>, CuError> {
    let last = LAST.with_borrow(|last| last.as_ref().filter(|(f, _)| *f == func).map(|(_, info)| info.clone()));
    if let Some(info) = last {
        return Ok(info);
    }
    let cached = FUNCS.lock().unwrap_or_else(PoisonError::into_inner).as_ref().and_then(|m| m.get(&func).cloned());
    let info = match cached {
        Some(info) => info,
        None => fetch_info(func)?,
    };
    LAST.set(Some((func, info.clone())));
    Ok(info)
}

/// Asks the server for what [`info`] keeps of `func`, and keeps it.
fn fetch_info(func: u64) -> Result<Arc<FuncInfo>, CuError> {
    let reply = client::call(calls::ParamLayout::Request { func: Func(func) })?;
    if reply.offsets.0.len() != reply.sizes.0.len() {
        return Err(CuError::UNKNOWN);
    }
    let layout: Vec<(u32, u32)> = reply.offsets.0.into_iter().zip(reply.sizes.0).collect();
    let info = Arc::new(FuncInfo {
        packed: layout.iter().map(|&(o, s)| (o + s) as usize).max().unwrap_or(0),
        layout,
        max_threads: reply.maxThreads.max(0) as u32,
        static_shared: reply.staticShared.max(0) as u32,
    });
    FUNCS.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert_with(HashMap::new).insert(func, info.clone());
    Ok(info)
}

/// Where each parameter of `func` goes: `(offset, size)`.
pub(crate) fn layout(func: u64) -> Result<Vec<(u32, u32)>, CuError> {
    Ok(info(func)?.layout.clone())
}

/// Shared memory every launch may use without opting in.
const DEFAULT_SHARED: u64 = 48 << 10;

/// The devices' launch limits (threads per block, block and grid
/// dimensions), the tightest over all devices so that they hold for any;
/// None without devices.
fn device_limits() -> Result<Option<[u64; 7]>, CuError> {
    static LIMITS: OnceLock<Option<[u64; 7]>> = OnceLock::new();
    let client = client::client()?;
    Ok(*LIMITS.get_or_init(|| {
        let devices = &client.welcome.devices.0;
        let limit =
            |attr: usize| devices.iter().map(|d| d.attributes.0.get(attr).map_or(0, |a| a.value.max(0) as u64)).min();
        // CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, then MAX_BLOCK_DIM_X..Z, MAX_GRID_DIM_X..Z.
        Some([limit(1)?, limit(2)?, limit(3)?, limit(4)?, limit(5)?, limit(6)?, limit(7)?])
    }))
}

/// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`.
const MAX_DYNAMIC_SHARED: i32 = 8;

/// The dynamic shared memory a launch of `func` may use: the function's
/// attribute, which programs raise past the default before such launches.
/// Kept in the memo, which forgets it when an attribute of the function's
/// group is set.
fn max_dynamic_shared(func: u64) -> Result<u64, CuError> {
    let req = calls::cuFuncGetAttribute::Request { attrib: MAX_DYNAMIC_SHARED, hfunc: Func(func) };
    Ok(memo::FUNCTIONS.keep(memo::group_of(func), req)?.pi.max(0) as u64)
}

/// Whether the driver is sure to take `func` launched so, with `params`
/// bytes of parameters, in the current context: what lets a kernel node's
/// change be posted as a launch is.
pub(crate) fn surely_launchable(
    func: u64,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
    params: usize,
) -> Result<bool, CuError> {
    let g = Grid { grid, block, shared_mem, stream: Stream::NULL };
    surely_accepted(func, &*info(func)?, &g, params)
}

/// Whether the driver is sure to accept this launch (so it can be posted).
fn surely_accepted(func: u64, info: &FuncInfo, g: &Grid, params: usize) -> Result<bool, CuError> {
    let Some([threads, bx, by, bz, gx, gy, gz]) = device_limits()? else {
        return Ok(false);
    };
    let [b0, b1, b2] = g.block.map(u64::from);
    let dims_ok = g
        .grid
        .iter()
        .zip([gx, gy, gz])
        .chain(g.block.iter().zip([bx, by, bz]))
        .all(|(&d, max)| d >= 1 && d as u64 <= max);
    let threads_ok = b0 * b1 * b2 <= threads.min(info.max_threads as u64);
    let plain = dims_ok && threads_ok && params == info.packed && crate::context::current() != 0;
    // Within the default, or within what the program raised the limit to.
    let shared_ok = || {
        info.static_shared as u64 + g.shared_mem as u64 <= DEFAULT_SHARED
            || max_dynamic_shared(func).is_ok_and(|max| g.shared_mem as u64 <= max)
    };
    Ok(plain && shared_ok())
}

/// Packs `kernelParams` by the function's layout.
///
/// # Safety
/// `params` holds one valid pointer per parameter of the function, each to
/// a value of that parameter's size, as the CUDA API requires.
unsafe fn pack(info: &FuncInfo, params: *mut *mut c_void) -> Result<Vec<u8>, CuError> {
    let layout = &info.layout;
    let mut buf = vec![0u8; info.packed];
    if layout.is_empty() {
        return Ok(buf);
    }
    if params.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    for (i, &(offset, len)) in layout.iter().enumerate() {
        // SAFETY: one pointer per parameter, per the contract.
        let arg = unsafe { *params.add(i) };
        if arg.is_null() {
            return Err(CuError::INVALID_VALUE);
        }
        // SAFETY: `arg` points at `len` bytes, per the contract.
        let bytes = unsafe { std::slice::from_raw_parts(arg.cast::<u8>(), len as usize) };
        buf[offset as usize..(offset + len) as usize].copy_from_slice(bytes);
    }
    Ok(buf)
}

/// The `extra` form: `{CU_LAUNCH_PARAM_BUFFER_POINTER, p, CU_LAUNCH_PARAM_BUFFER_SIZE, &n, CU_LAUNCH_PARAM_END}`.
///
/// # Safety
/// `extra` is a valid option list ending in `CU_LAUNCH_PARAM_END`.
unsafe fn extra_buffer(extra: *mut *mut c_void) -> Result<Vec<u8>, CuError> {
    const END: usize = 0;
    const BUFFER_POINTER: usize = 1;
    const BUFFER_SIZE: usize = 2;
    let (mut ptr, mut size) = (None, None);
    let mut i = 0;
    loop {
        // SAFETY: the list is terminated, per the contract.
        let key = unsafe { *extra.add(i) } as usize;
        match key {
            END => break,
            // SAFETY: every key but END is followed by its value.
            BUFFER_POINTER => ptr = Some(unsafe { *extra.add(i + 1) }),
            // SAFETY: as above; the value points at a size_t.
            BUFFER_SIZE => size = Some(unsafe { *(*extra.add(i + 1)).cast::<usize>() }),
            _ => return Err(CuError::INVALID_VALUE),
        }
        i += 2;
    }
    match (ptr, size) {
        (Some(p), Some(n)) if !p.is_null() || n == 0 => {
            // SAFETY: the caller's buffer holds `n` bytes.
            Ok(if n == 0 { Vec::new() } else { unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) }.to_vec() })
        }
        _ => Err(CuError::INVALID_VALUE),
    }
}

/// A launch's parameters packed as the server takes them, given as
/// `kernelParams` (packed by the function's layout, fetched once then
/// cached, and returned too) or in `extra`'s buffer.
///
/// # Safety
/// `params`/`extra` as the CUDA API requires.
pub(crate) unsafe fn packed_params(
    func: u64,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Result<(Vec<u8>, Option<Arc<FuncInfo>>), CuError> {
    if !params.is_null() && !extra.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    if extra.is_null() {
        let known = info(func)?;
        // SAFETY: per this function's contract.
        Ok((unsafe { pack(&known, params)? }, Some(known)))
    } else {
        // SAFETY: per this function's contract.
        Ok((unsafe { extra_buffer(extra)? }, None))
    }
}

/// A launch as every entry point describes it.
struct Grid {
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
    stream: Stream,
}

/// # Safety
/// `params`/`extra` as the CUDA API requires.
unsafe fn launch(
    func: *mut c_void,
    g: Grid,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    attrs: Vec<u8>,
) -> Result<(), CuError> {
    if func.is_null() {
        return Err(CuError::INVALID_HANDLE);
    }
    if let Some(e) = crate::module::refused_launch(func as u64) {
        return Err(e);
    }
    let func = func as u64;
    // SAFETY: per this function's contract.
    let (packed, known) = unsafe { packed_params(func, params, extra)? };
    let post = attrs.is_empty() && {
        let known = match known {
            Some(known) => known,
            None => info(func)?,
        };
        surely_accepted(func, &known, &g, packed.len())?
    };
    let req = calls::Launch::Request {
        func: Func(func),
        gridX: g.grid[0],
        gridY: g.grid[1],
        gridZ: g.grid[2],
        blockX: g.block[0],
        blockY: g.block[1],
        blockZ: g.block[2],
        sharedMem: g.shared_mem,
        stream: g.stream,
        params: packed,
        attrs,
    };
    if post {
        client::post(req)
    } else {
        client::call(req).map(|_| ())
    }
}

macro_rules! launch_kernel {
    ($name:ident, $stream:path, $attrs:expr) => {
        /// # Safety
        /// `params`/`extra` as the CUDA API requires.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            f: *mut c_void,
            gx: u32,
            gy: u32,
            gz: u32,
            bx: u32,
            by: u32,
            bz: u32,
            shared_mem: u32,
            s: *mut c_void,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) -> CUresult {
            let g = Grid { grid: [gx, gy, gz], block: [bx, by, bz], shared_mem, stream: $stream(s) };
            // SAFETY: per this function's contract.
            entry(stringify!($name), || unsafe { launch(f, g, params, extra, $attrs) })
        }
    };
}

launch_kernel!(cuLaunchKernel, stream, Vec::new());
launch_kernel!(cuLaunchKernel_ptsz, ptsz_stream, Vec::new());

/// `CU_LAUNCH_ATTRIBUTE_COOPERATIVE` with value 1, as a wire record.
fn cooperative() -> Vec<u8> {
    let mut record = vec![0u8; 68];
    record[..4].copy_from_slice(&2u32.to_le_bytes());
    record[4..8].copy_from_slice(&1i32.to_le_bytes());
    record
}

macro_rules! launch_cooperative {
    ($name:ident, $stream:path) => {
        /// # Safety
        /// `params` as the CUDA API requires.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            f: *mut c_void,
            gx: u32,
            gy: u32,
            gz: u32,
            bx: u32,
            by: u32,
            bz: u32,
            shared_mem: u32,
            s: *mut c_void,
            params: *mut *mut c_void,
        ) -> CUresult {
            let g = Grid { grid: [gx, gy, gz], block: [bx, by, bz], shared_mem, stream: $stream(s) };
            // SAFETY: per this function's contract.
            entry(stringify!($name), || unsafe { launch(f, g, params, std::ptr::null_mut(), cooperative()) })
        }
    };
}

launch_cooperative!(cuLaunchCooperativeKernel, stream);
launch_cooperative!(cuLaunchCooperativeKernel_ptsz, ptsz_stream);

/// `CUlaunchConfig`.
#[repr(C)]
pub struct LaunchConfig {
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
    stream: *mut c_void,
    attrs: *const LaunchAttribute,
    num_attrs: u32,
}

/// `CUlaunchAttribute`: an id, padding to 8, a 64-byte value union.
#[repr(C)]
pub struct LaunchAttribute {
    id: u32,
    pad: u32,
    value: [u8; 64],
}

/// A `CUlaunchConfig` as a grid and attribute records.
///
/// # Safety
/// `config` is NULL or valid, with `num_attrs` attributes.
unsafe fn read_config(config: *const LaunchConfig, ptsz: bool) -> Result<(Grid, Vec<u8>), CuError> {
    // SAFETY: NULL or valid, per the contract.
    let c = unsafe { config.as_ref() }.ok_or(CuError::INVALID_VALUE)?;
    let mut attrs = Vec::with_capacity(c.num_attrs as usize * 68);
    if c.num_attrs > 0 {
        if c.attrs.is_null() {
            return Err(CuError::INVALID_VALUE);
        }
        // SAFETY: `num_attrs` entries, per the contract.
        for a in unsafe { std::slice::from_raw_parts(c.attrs, c.num_attrs as usize) } {
            attrs.extend_from_slice(&a.id.to_le_bytes());
            attrs.extend_from_slice(&a.value);
        }
    }
    let s = if ptsz { ptsz_stream(c.stream) } else { stream(c.stream) };
    Ok((Grid { grid: c.grid, block: c.block, shared_mem: c.shared_mem, stream: s }, attrs))
}

/// # Safety
/// `config` is valid; `params`/`extra` as the CUDA API requires.
unsafe fn launch_ex(
    config: *const LaunchConfig,
    f: *mut c_void,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    ptsz: bool,
) -> Result<(), CuError> {
    // SAFETY: per this function's contract.
    let (g, attrs) = unsafe { read_config(config, ptsz)? };
    // SAFETY: per this function's contract.
    unsafe { launch(f, g, params, extra, attrs) }
}

/// `query` 0: how many clusters fit; 1: the largest cluster size.
///
/// # Safety
/// `out` is valid for a write; `config` as in `read_config`.
unsafe fn occupancy_clusters(
    query: u32,
    out: *mut i32,
    f: *mut c_void,
    config: *const LaunchConfig,
) -> Result<(), CuError> {
    check_out(out)?;
    // SAFETY: per this function's contract.
    let (g, attrs) = unsafe { read_config(config, false)? };
    let reply = client::call(calls::OccupancyClusters::Request {
        query,
        func: Func(f as u64),
        gridX: g.grid[0],
        gridY: g.grid[1],
        gridZ: g.grid[2],
        blockX: g.block[0],
        blockY: g.block[1],
        blockZ: g.block[2],
        sharedMem: g.shared_mem,
        stream: g.stream,
        attrs,
    })?;
    // SAFETY: checked non-NULL; the caller vouches for it.
    unsafe { write_out(out, reply.value) };
    Ok(())
}

/// # Safety
/// `clusters` is valid for a write; `config` is valid.
#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxActiveClusters(
    clusters: *mut i32,
    f: *mut c_void,
    config: *const LaunchConfig,
) -> CUresult {
    // SAFETY: per this function's contract.
    entry("cuOccupancyMaxActiveClusters", || unsafe { occupancy_clusters(0, clusters, f, config) })
}

/// # Safety
/// `size` is valid for a write; `config` is valid.
#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxPotentialClusterSize(
    size: *mut i32,
    f: *mut c_void,
    config: *const LaunchConfig,
) -> CUresult {
    // SAFETY: per this function's contract.
    entry("cuOccupancyMaxPotentialClusterSize", || unsafe { occupancy_clusters(1, size, f, config) })
}

/// # Safety
/// `config` is valid; `params`/`extra` as the CUDA API requires.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const LaunchConfig,
    f: *mut c_void,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: per this function's contract.
    entry("cuLaunchKernelEx", || unsafe { launch_ex(config, f, params, extra, false) })
}

/// # Safety
/// `config` is valid; `params`/`extra` as the CUDA API requires.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const LaunchConfig,
    f: *mut c_void,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: per this function's contract.
    entry("cuLaunchKernelEx_ptsz", || unsafe { launch_ex(config, f, params, extra, true) })
}

fn param_info(func: *mut c_void, index: usize, offset: *mut usize, size: *mut usize) -> Result<(), CuError> {
    if func.is_null() {
        return Err(CuError::INVALID_HANDLE);
    }
    let &(o, s) = layout(func as u64)?.get(index).ok_or(CuError::INVALID_VALUE)?;
    // SAFETY: NULL is skipped; otherwise the caller vouches for the pointers.
    unsafe {
        write_out(offset, o as usize);
        write_out(size, s as usize);
    }
    Ok(())
}

/// # Safety
/// `offset` and `size` are NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuFuncGetParamInfo(
    func: *mut c_void,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> CUresult {
    entry("cuFuncGetParamInfo", || param_info(func, index, offset, size))
}

/// # Safety
/// `offset` and `size` are NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuKernelGetParamInfo(
    kernel: *mut c_void,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> CUresult {
    // The server takes a kernel handle wherever a function is expected.
    entry("cuKernelGetParamInfo", || param_info(kernel, index, offset, size))
}

fn max_potential_block_size(
    min_grid: *mut i32,
    block: *mut i32,
    func: *mut c_void,
    callback: *const c_void,
    smem: usize,
    limit: i32,
    flags: u32,
) -> Result<(), CuError> {
    check_out(min_grid)?;
    check_out(block)?;
    if !callback.is_null() {
        // The callback lives in this process; the server cannot call it.
        crate::log::warn("cuOccupancyMaxPotentialBlockSize with a shared-memory callback is not supported");
        return Err(CuError::NOT_SUPPORTED);
    }
    let reply = client::call(calls::OccupancyMaxPotentialBlockSize::Request {
        func: Func(func as u64),
        dynamicSMemSize: smem as u64,
        blockSizeLimit: limit,
        flags,
    })?;
    // SAFETY: checked non-NULL; the caller vouches for them.
    unsafe {
        write_out(min_grid, reply.minGridSize);
        write_out(block, reply.blockSize);
    }
    Ok(())
}

/// # Safety
/// `min_grid` and `block` are valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxPotentialBlockSize(
    min_grid: *mut i32,
    block: *mut i32,
    func: *mut c_void,
    callback: *const c_void,
    smem: usize,
    limit: i32,
) -> CUresult {
    entry("cuOccupancyMaxPotentialBlockSize", || {
        max_potential_block_size(min_grid, block, func, callback, smem, limit, 0)
    })
}

/// # Safety
/// `min_grid` and `block` are valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxPotentialBlockSizeWithFlags(
    min_grid: *mut i32,
    block: *mut i32,
    func: *mut c_void,
    callback: *const c_void,
    smem: usize,
    limit: i32,
    flags: u32,
) -> CUresult {
    entry("cuOccupancyMaxPotentialBlockSizeWithFlags", || {
        max_potential_block_size(min_grid, block, func, callback, smem, limit, flags)
    })
}

/// A callback runs in this process, in stream order: the stream's earlier
/// work is waited for, then the callback runs before the call returns, so
/// nothing queued after it can start early. The caller blocks for that
/// long, which CUDA allows (only the order is promised).
fn run_in_stream_order(stream: Stream) -> Result<(), CuError> {
    client::call(calls::cuStreamSynchronize::Request { hStream: stream }).map(|_| ())
}

type HostFn = unsafe extern "C" fn(user_data: *mut c_void);
type StreamCallback = unsafe extern "C" fn(stream: *mut c_void, status: CUresult, user_data: *mut c_void);

fn launch_host_func(stream: Stream, f: Option<HostFn>, user_data: *mut c_void) -> Result<(), CuError> {
    let f = f.ok_or(CuError::INVALID_VALUE)?;
    // Into a capture, it becomes a host node of the graph, which the server's
    // driver runs (through `host_calls`) whenever the graph runs.
    if crate::graph::is_capturing(stream) {
        let id = crate::host_calls::register(f, user_data)?;
        return client::call(calls::LaunchHostFunc::Request { stream, id }).map(drop);
    }
    // Into a stream, the server's driver runs it once when the stream gets
    // there, while this thread goes on; posted, as a launch is.
    match crate::host_calls::register_once(f, user_data) {
        Ok(id) => client::post(calls::LaunchHostFunc::Request { stream, id }),
        // No connection for host calls (a server that offers none): it runs
        // here, after the stream's work, before the call returns.
        Err(_) => {
            run_in_stream_order(stream)?;
            // SAFETY: the caller's function and data, called as CUDA would.
            unsafe { f(user_data) };
            Ok(())
        }
    }
}

fn add_callback(
    s: *mut c_void,
    stream: Stream,
    cb: Option<StreamCallback>,
    user_data: *mut c_void,
    flags: u32,
) -> Result<(), CuError> {
    let cb = cb.ok_or(CuError::INVALID_VALUE)?;
    if flags != 0 {
        return Err(CuError::INVALID_VALUE);
    }
    // The callback learns how the stream's earlier work ended; a bad
    // handle is the caller's error instead.
    let status = match run_in_stream_order(stream) {
        Ok(()) => 0,
        Err(e @ (CuError::INVALID_HANDLE | CuError::INVALID_CONTEXT | CuError::NOT_INITIALIZED)) => return Err(e),
        Err(e) => e.0,
    };
    // SAFETY: the caller's callback and data, called as CUDA would.
    unsafe { cb(s, status, user_data) };
    Ok(())
}

/// # Safety
/// `f` is a function the caller wants run with `user_data`.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchHostFunc(s: *mut c_void, f: Option<HostFn>, user_data: *mut c_void) -> CUresult {
    entry("cuLaunchHostFunc", || launch_host_func(stream(s), f, user_data))
}

/// # Safety
/// As `cuLaunchHostFunc`.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchHostFunc_ptsz(s: *mut c_void, f: Option<HostFn>, user_data: *mut c_void) -> CUresult {
    entry("cuLaunchHostFunc_ptsz", || launch_host_func(ptsz_stream(s), f, user_data))
}

/// # Safety
/// `cb` is a function the caller wants run with `user_data`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamAddCallback(
    s: *mut c_void,
    cb: Option<StreamCallback>,
    user_data: *mut c_void,
    flags: u32,
) -> CUresult {
    entry("cuStreamAddCallback", || add_callback(s, stream(s), cb, user_data, flags))
}

/// # Safety
/// As `cuStreamAddCallback`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamAddCallback_ptsz(
    s: *mut c_void,
    cb: Option<StreamCallback>,
    user_data: *mut c_void,
    flags: u32,
) -> CUresult {
    entry("cuStreamAddCallback_ptsz", || add_callback(s, ptsz_stream(s), cb, user_data, flags))
}
