//! Real GPUs through the CUDA driver API, loaded at run time.
//!
//! This is the backend a production server runs: every [`Backend`] call
//! becomes one or a few driver calls on the host's real GPUs.
//!
//! `libcuda` is opened with `dlopen` when the server starts ([`Cuda::open`])
//! rather than linked, so the project builds and its tests run on machines
//! without CUDA, and a server without a driver says so instead of failing
//! to start. Each entry point is looked up once, with a prototype declared
//! here (`api.rs`): enum-typed parameters and results are plain integers,
//! because the values come from clients and from drivers newer than these
//! bindings, and an unknown value in a Rust enum is undefined behaviour. An
//! entry point an older driver lacks answers `CUDA_ERROR_NOT_SUPPORTED`
//! rather than panicking.
//!
//! Every session thread runs its own contexts, so each call taking a
//! context first makes it current on the calling thread; a thread-local
//! remembers the current one so that repeated calls cost nothing.
//!
//! The session layer passes only live objects of the kind each parameter
//! names (or the special stream values 0, 1, 2), and device ranges it has
//! checked against its allocations; the `SAFETY` comments below lean on
//! that as "the session's guarantee".

use std::cell::Cell;
use std::ffi::{c_int, c_uint, c_void, CStr, CString};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::sys;
use gpuplex_protocol::{
    AccessDesc, AllocProp, ArrayDesc, Attribute, CallError, CuError, DeviceInfo, PoolProps, ResourceDesc, Seq,
    DEVICE_ATTRIBUTE_COUNT,
};

use super::{
    one_by_one, BResult, Backend, CaptureInfo, ClusterQuery, Conditional, Copy3D, CopyEnd, ExecUpdate, GraphAlloc,
    HostCopy, HostFn, IpcHandle, Launch, Linked, Memset, NodeWork, Obj, ParamSlot, Place, TensorMap, TensorMapBytes,
    Way,
};

mod api;
mod arrays;
mod graph;
mod graph_memory;
mod image;
mod ipc;
mod link;
mod passthrough;
mod pools;
mod tensor_maps;
mod vmm;

use api::{check, or_older, Raw};
use image::Image;

/// Checks a client's module image the way the driver will be handed it
/// (the framing of a fatbin or ELF stays inside its bytes), without a driver:
/// for fuzzing and for callers that want the verdict before loading.
pub fn check_image(image: &[u8]) -> BResult<()> {
    Image::new(image).map(drop)
}

/// The driver object an [`Obj`] holds (stream specials 0, 1, 2 included).
fn raw<T>(o: Obj) -> *mut T {
    o.0 as usize as *mut T
}

/// The [`Obj`] for a driver object.
fn obj<T>(p: *mut T) -> Obj {
    Obj(p as usize as u64)
}

/// Calls `f` with the `extra` option list that hands the driver a packed
/// parameter buffer, valid for the call. A kernel without parameters still
/// gets a real (if unread) address, with size 0.
fn with_packed<T>(params: &[u8], f: impl FnOnce(*mut *mut c_void) -> T) -> T {
    static NO_PARAMS: u64 = 0;
    let buffer: *const c_void = if params.is_empty() { (&raw const NO_PARAMS).cast() } else { params.as_ptr().cast() };
    let mut bytes: usize = params.len();
    let marker = |m: u32| std::ptr::without_provenance_mut::<c_void>(m as usize);
    let mut extra = [
        marker(sys::CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT),
        buffer.cast_mut(),
        marker(sys::CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT),
        (&raw mut bytes).cast(),
        marker(sys::CU_LAUNCH_PARAM_END_AS_INT),
    ];
    f(extra.as_mut_ptr())
}

/// A size as the driver takes it.
fn size(v: u64) -> BResult<usize> {
    usize::try_from(v).map_err(|_| CallError::new(CuError::INVALID_VALUE, format!("size {v} too large")))
}

/// A name as the driver takes it.
fn c_name(name: &str) -> BResult<CString> {
    CString::new(name).map_err(|_| CallError::new(CuError::INVALID_VALUE, "name contains NUL"))
}

/// The NULL stream and `CU_STREAM_LEGACY`, which the synchronous copies use.
fn is_legacy(stream: Obj) -> bool {
    stream.0 == 0 || stream.0 == 1
}

fn sync_stream(stream: Obj) -> BResult<()> {
    // SAFETY: the stream is live or special (the session's guarantee).
    check(unsafe { api::cuStreamSynchronize(raw(stream)) })
}

/// Bumped whenever a context is destroyed, which stales every thread's
/// [`CURRENT`]: a new context may reuse a destroyed one's address, and a
/// destroyed context stays "current" on other threads.
static GENERATION: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// `(context, GENERATION)` when this thread made `context` current.
    static CURRENT: Cell<Option<(u64, u64)>> = const { Cell::new(None) };
}

/// Makes `ctx` current on this thread, unless it already is.
fn enter(ctx: Obj) -> BResult<()> {
    let generation = GENERATION.load(Ordering::Acquire);
    if CURRENT.get() == Some((ctx.0, generation)) {
        return Ok(());
    }
    CURRENT.set(None);
    // SAFETY: the context is live (the session's guarantee).
    check(unsafe { api::cuCtxSetCurrent(raw(ctx)) })?;
    CURRENT.set(Some((ctx.0, generation)));
    Ok(())
}

/// `CUlaunchAttribute`, with the id as a plain integer (cudarc's is an enum,
/// and ids come from clients).
#[repr(C, align(8))]
struct LaunchAttribute {
    id: u32,
    pad: [u8; 4],
    value: [u8; 64],
}

/// `CUlaunchConfig`, pointing at [`LaunchAttribute`]s.
#[repr(C)]
struct LaunchConfig {
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem: c_uint,
    stream: sys::CUstream,
    attrs: *mut LaunchAttribute,
    num_attrs: c_uint,
}

// Both must match cudarc's bindgen layouts of cuda.h byte for byte.
const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<LaunchAttribute>() == size_of::<sys::CUlaunchAttribute>());
    assert!(align_of::<LaunchAttribute>() == align_of::<sys::CUlaunchAttribute>());
    assert!(offset_of!(LaunchAttribute, value) == offset_of!(sys::CUlaunchAttribute, value));
    assert!(size_of::<LaunchConfig>() == size_of::<sys::CUlaunchConfig>());
    assert!(align_of::<LaunchConfig>() == align_of::<sys::CUlaunchConfig>());
    assert!(offset_of!(LaunchConfig, block) == offset_of!(sys::CUlaunchConfig, blockDimX));
    assert!(offset_of!(LaunchConfig, shared_mem) == offset_of!(sys::CUlaunchConfig, sharedMemBytes));
    assert!(offset_of!(LaunchConfig, stream) == offset_of!(sys::CUlaunchConfig, hStream));
    assert!(offset_of!(LaunchConfig, attrs) == offset_of!(sys::CUlaunchConfig, attrs));
    assert!(offset_of!(LaunchConfig, num_attrs) == offset_of!(sys::CUlaunchConfig, numAttrs));
};

/// CUDA allows at most 32764 bytes of kernel parameters, each at least one
/// byte: a bound on the parameter walk that no real kernel reaches.
const MAX_PARAMS: usize = 32764;

/// Why the CUDA backend could not start.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("CUDA driver library libcuda.so not found; use --backend emulated on machines without a GPU")]
    NoDriver,
    #[error("the libcuda.so found is gpuplex's own front-end, not NVIDIA's driver; take gpuplex's directory off the server's LD_LIBRARY_PATH")]
    FoundFrontend,
    #[error("{call}: {error}")]
    Driver { call: &'static str, error: CallError },
    #[error("device {ordinal}: {call}: {error}")]
    Device { ordinal: i32, call: &'static str, error: CallError },
}

/// The real CUDA driver. Holds only what it read at start-up; every object
/// lives in the driver and travels as an [`Obj`].
pub struct Cuda {
    driver_version: i32,
    devices: Vec<DeviceInfo>,
}

impl Cuda {
    /// Loads the driver, initialises it and reads the device table.
    pub fn open() -> Result<Cuda, CudaError> {
        // SAFETY: only tries to open the library by its usual names, which
        // runs its initialisers as any CUDA program does.
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaError::NoDriver);
        }
        // A server that loaded gpuplex's libcuda would serve its clients by
        // calling itself.
        // SAFETY: the library is present; the marker is only looked up.
        if unsafe { sys::culib().get::<*const u8>(b"gpuplex_frontend\0") }.is_ok() {
            return Err(CudaError::FoundFrontend);
        }
        let at = |call: &'static str| move |error| CudaError::Driver { call, error };
        // SAFETY: plain value argument; the driver is present.
        check(unsafe { api::cuInit(0) }).map_err(at("cuInit"))?;
        let mut driver_version = 0;
        // SAFETY: out-pointer to a local.
        check(unsafe { api::cuDriverGetVersion(&mut driver_version) }).map_err(at("cuDriverGetVersion"))?;
        let mut count = 0;
        // SAFETY: out-pointer to a local.
        check(unsafe { api::cuDeviceGetCount(&mut count) }).map_err(at("cuDeviceGetCount"))?;
        let devices = (0..count).map(device_info).collect::<Result<_, _>>()?;
        Ok(Cuda { driver_version, devices })
    }
}

/// Everything a client answers locally about device `ordinal`.
fn device_info(ordinal: c_int) -> Result<DeviceInfo, CudaError> {
    let at = |call: &'static str| move |error| CudaError::Device { ordinal, call, error };
    let mut dev: sys::CUdevice = 0;
    // SAFETY: out-pointer to a local; the ordinal is below the device count.
    check(unsafe { api::cuDeviceGet(&mut dev, ordinal) }).map_err(at("cuDeviceGet"))?;

    let mut name = [0u8; 256];
    // SAFETY: the driver writes at most `len` bytes into the buffer.
    check(unsafe { api::cuDeviceGetName(name.as_mut_ptr().cast(), name.len() as c_int, dev) })
        .map_err(at("cuDeviceGetName"))?;
    let mut uuid = sys::CUuuid { bytes: [0; 16] };
    // SAFETY: out-pointer to a local `CUuuid`.
    check(unsafe { api::cuDeviceGetUuid_v2(&mut uuid, dev) }).map_err(at("cuDeviceGetUuid_v2"))?;
    let mut total_mem = 0usize;
    // SAFETY: out-pointer to a local.
    check(unsafe { api::cuDeviceTotalMem_v2(&mut total_mem, dev) }).map_err(at("cuDeviceTotalMem_v2"))?;
    let mut bus_id = [0u8; 64];
    // SAFETY: the driver writes at most `len` bytes into the buffer.
    check(unsafe { api::cuDeviceGetPCIBusId(bus_id.as_mut_ptr().cast(), bus_id.len() as c_int, dev) })
        .map_err(at("cuDeviceGetPCIBusId"))?;

    // Every id, answered or not: the client replays errors too.
    let attributes = (0..DEVICE_ATTRIBUTE_COUNT as c_int)
        .map(|id| {
            // A guest's ordinary memory lives in another process, out of
            // the device's reach whatever this machine's driver offers.
            if GUEST_UNREACHABLE.contains(&id) {
                return Attribute { status: 0, value: 0 };
            }
            let mut value = 0;
            // SAFETY: out-pointer to a local; the id is a plain integer,
            // which the driver validates.
            match check(unsafe { api::cuDeviceGetAttribute(&mut value, id, dev) }) {
                Ok(()) => Attribute { status: 0, value },
                Err(e) => Attribute { status: e.code.0, value: 0 },
            }
        })
        .collect();

    Ok(DeviceInfo {
        name: text(&name),
        uuid: uuid.bytes.map(|b| b.to_ne_bytes()[0]),
        total_mem: total_mem as u64,
        pci_bus_id: text(&bus_id),
        attributes: Seq(attributes),
    })
}

/// `CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS` and
/// `..._PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES`.
const GUEST_UNREACHABLE: [c_int; 2] = [88, 100];

/// A C string the driver wrote into `buf`, up to its NUL.
fn text(buf: &[u8]) -> String {
    match CStr::from_bytes_until_nul(buf) {
        Ok(s) => s.to_string_lossy().into_owned(),
        Err(_) => String::from_utf8_lossy(buf).into_owned(),
    }
}

/// Runs a query that writes one value through an out-pointer.
fn query<T: Default>(call: impl FnOnce(*mut T) -> Raw) -> BResult<T> {
    let mut out = T::default();
    check(call(&mut out))?;
    Ok(out)
}

/// Runs a query that creates or finds an object.
fn handle<T>(call: impl FnOnce(*mut *mut T) -> Raw) -> BResult<Obj> {
    let mut out: *mut T = null_mut();
    check(call(&mut out))?;
    Ok(obj(out))
}

/// Runs a query that answers `(device pointer, size)`.
fn global(call: impl FnOnce(*mut sys::CUdeviceptr, *mut usize) -> Raw) -> BResult<(u64, u64)> {
    let (mut ptr, mut bytes) = (0, 0usize);
    check(call(&mut ptr, &mut bytes))?;
    Ok((ptr, bytes as u64))
}

/// The driver's launch configuration for `launch`; it points into `attrs`,
/// which must outlive its use.
fn launch_config(launch: &Launch, attrs: &mut Vec<LaunchAttribute>) -> BResult<LaunchConfig> {
    *attrs = launch.attrs.iter().map(|&(id, value)| LaunchAttribute { id, pad: [0; 4], value }).collect();
    Ok(LaunchConfig {
        grid: launch.grid,
        block: launch.block,
        shared_mem: launch.shared_mem,
        stream: raw(launch.stream),
        attrs: if attrs.is_empty() { null_mut() } else { attrs.as_mut_ptr() },
        num_attrs: c_uint::try_from(attrs.len())
            .map_err(|_| CallError::new(CuError::INVALID_VALUE, "too many launch attributes"))?,
    })
}

impl Backend for Cuda {
    fn kind(&self) -> &'static str {
        "cuda"
    }

    fn driver_version(&self) -> i32 {
        self.driver_version
    }

    fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }

    fn can_access_peer(&self, dev: i32, peer: i32) -> BResult<i32> {
        // SAFETY: out-pointer to a local; the driver validates the ordinals.
        query(|can| unsafe { api::cuDeviceCanAccessPeer(can, dev, peer) })
    }

    fn ctx_create(&self, dev: i32, flags: u32) -> BResult<Obj> {
        let mut ctx: sys::CUcontext = null_mut();
        // SAFETY: out-pointer to a local; NULL create-params are allowed.
        let r = unsafe { api::cuCtxCreate_v4(&mut ctx, null_mut(), flags, dev) };
        // SAFETY: as above (`_v4` is new in driver 12.5).
        check(or_older(r, || unsafe { api::cuCtxCreate_v2(&mut ctx, flags, dev) }))?;
        // The new context was pushed on this thread's context stack. Pop it,
        // which brings back the context `CURRENT` records, so that the stack
        // never grows past one entry.
        let mut popped: sys::CUcontext = null_mut();
        // SAFETY: out-pointer to a local.
        if let Err(e) = check(unsafe { api::cuCtxPopCurrent_v2(&mut popped) }) {
            CURRENT.set(None);
            tracing::warn!("cuCtxPopCurrent after cuCtxCreate: {e}");
        }
        Ok(obj(ctx))
    }

    fn ctx_destroy(&self, ctx: Obj) -> BResult<()> {
        // SAFETY: the context is live (the session's guarantee).
        check(unsafe { api::cuCtxDestroy_v2(raw(ctx)) })?;
        // If it was current here, the stack is now empty; elsewhere it stays
        // current but destroyed. Either way no `CURRENT` may be trusted.
        GENERATION.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    fn ctx_synchronize(&self, ctx: Obj) -> BResult<()> {
        enter(ctx)?;
        // SAFETY: no arguments; `ctx` is current.
        check(unsafe { api::cuCtxSynchronize() })
    }

    fn ctx_api_version(&self, ctx: Obj) -> BResult<u32> {
        enter(ctx)?;
        // SAFETY: live context, out-pointer to a local.
        query(|v| unsafe { api::cuCtxGetApiVersion(raw(ctx), v) })
    }

    fn ctx_get_flags(&self, ctx: Obj) -> BResult<u32> {
        enter(ctx)?;
        // SAFETY: out-pointer to a local.
        query(|f| unsafe { api::cuCtxGetFlags(f) })
    }

    fn ctx_set_flags(&self, ctx: Obj, flags: u32) -> BResult<()> {
        enter(ctx)?;
        // SAFETY: plain value; the driver validates it.
        check(unsafe { api::cuCtxSetFlags(flags) })
    }

    fn ctx_get_limit(&self, ctx: Obj, limit: i32) -> BResult<u64> {
        enter(ctx)?;
        // SAFETY: out-pointer to a local; the limit is a plain integer.
        query(|v| unsafe { api::cuCtxGetLimit(v, limit) }).map(|v: usize| v as u64)
    }

    fn ctx_set_limit(&self, ctx: Obj, limit: i32, value: u64) -> BResult<()> {
        enter(ctx)?;
        let value = size(value)?;
        // SAFETY: plain values; the driver validates them.
        check(unsafe { api::cuCtxSetLimit(limit, value) })
    }

    fn ctx_get_cache_config(&self, ctx: Obj) -> BResult<i32> {
        enter(ctx)?;
        // SAFETY: out-pointer to a local `int`.
        query(|c| unsafe { api::cuCtxGetCacheConfig(c) })
    }

    fn ctx_set_cache_config(&self, ctx: Obj, config: i32) -> BResult<()> {
        enter(ctx)?;
        // SAFETY: plain value; the driver validates it.
        check(unsafe { api::cuCtxSetCacheConfig(config) })
    }

    fn ctx_stream_priority_range(&self, ctx: Obj) -> BResult<(i32, i32)> {
        enter(ctx)?;
        let (mut least, mut greatest) = (0, 0);
        // SAFETY: out-pointers to locals.
        check(unsafe { api::cuCtxGetStreamPriorityRange(&mut least, &mut greatest) })?;
        Ok((least, greatest))
    }

    fn ctx_id(&self, ctx: Obj) -> BResult<u64> {
        enter(ctx)?;
        // SAFETY: live context, out-pointer to a local.
        query(|id| unsafe { api::cuCtxGetId(raw(ctx), id) })
    }

    fn mem_get_info(&self, ctx: Obj) -> BResult<(u64, u64)> {
        enter(ctx)?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: out-pointers to locals.
        check(unsafe { api::cuMemGetInfo_v2(&mut free, &mut total) })?;
        Ok((free as u64, total as u64))
    }

    fn mem_alloc(&self, ctx: Obj, bytes: u64) -> BResult<u64> {
        enter(ctx)?;
        let bytes = size(bytes)?;
        // SAFETY: out-pointer to a local.
        query(|p| unsafe { api::cuMemAlloc_v2(p, bytes) })
    }

    fn mem_alloc_pitch(&self, ctx: Obj, width: u64, height: u64, element_size: u32) -> BResult<(u64, u64)> {
        enter(ctx)?;
        let (width, height) = (size(width)?, size(height)?);
        let (mut ptr, mut pitch) = (0, 0usize);
        // SAFETY: out-pointers to locals.
        check(unsafe { api::cuMemAllocPitch_v2(&mut ptr, &mut pitch, width, height, element_size) })?;
        Ok((ptr, pitch as u64))
    }

    fn mem_free(&self, ctx: Obj, ptr: u64) -> BResult<()> {
        enter(ctx)?;
        // SAFETY: the pointer is one of the session's allocations.
        check(unsafe { api::cuMemFree_v2(ptr) })
    }

    /// `src` must be pageable memory (it is: a frame buffer), from which an
    /// async copy returns only once the driver has staged the bytes.
    fn memcpy_htod(&self, ctx: Obj, dst: u64, src: &[u8], stream: Obj, sync: bool) -> BResult<()> {
        enter(ctx)?;
        let (from, len) = (src.as_ptr().cast(), src.len());
        if sync && is_legacy(stream) {
            // SAFETY: `src` is readable for `len` bytes; the session checked
            // the device range.
            return check(unsafe { api::cuMemcpyHtoD_v2(dst, from, len) });
        }
        // SAFETY: as above; the stream is live or special. From pageable
        // memory the call returns once `src` is staged, so the borrow
        // ending afterwards is fine.
        check(unsafe { api::cuMemcpyHtoDAsync_v2(dst, from, len, raw(stream)) })?;
        if sync {
            sync_stream(stream)?;
        }
        Ok(())
    }

    fn memcpy_dtoh(&self, ctx: Obj, dst: &mut [u8], src: u64, stream: Obj) -> BResult<()> {
        enter(ctx)?;
        let (to, len) = (dst.as_mut_ptr().cast(), dst.len());
        if is_legacy(stream) {
            // SAFETY: `dst` is writable for `len` bytes; the session checked
            // the device range; the copy is complete on return.
            return check(unsafe { api::cuMemcpyDtoH_v2(to, src, len) });
        }
        // SAFETY: as above; the stream is live or special. Into pageable
        // memory the copy is complete on return, and the stream is
        // synchronised besides.
        check(unsafe { api::cuMemcpyDtoHAsync_v2(to, src, len, raw(stream)) })?;
        sync_stream(stream)
    }

    fn memcpy_dtod(&self, ctx: Obj, dst: u64, src: u64, bytes: u64, stream: Obj, sync: bool) -> BResult<()> {
        enter(ctx)?;
        let bytes = size(bytes)?;
        // SAFETY: the session checked both device ranges; the stream is
        // live or special.
        check(unsafe { api::cuMemcpyDtoDAsync_v2(dst, src, bytes, raw(stream)) })?;
        if sync {
            sync_stream(stream)?;
        }
        Ok(())
    }

    fn memset(&self, ctx: Obj, op: &Memset, stream: Obj, sync: bool) -> BResult<()> {
        enter(ctx)?;
        let (dst, v, s) = (op.dst, op.value, raw(stream));
        let (pitch, w, h) = (size(op.pitch)?, size(op.width)?, size(op.height)?);
        // SAFETY: the session checked `op.extent()` bytes from `dst`; the
        // stream is live or special. Values narrow as the C API's do.
        let r = unsafe {
            match (op.element_size, op.height == 1) {
                (1, true) => api::cuMemsetD8Async(dst, v as u8, w, s),
                (2, true) => api::cuMemsetD16Async(dst, v as u16, w, s),
                (4, true) => api::cuMemsetD32Async(dst, v, w, s),
                (1, false) => api::cuMemsetD2D8Async(dst, pitch, v as u8, w, h, s),
                (2, false) => api::cuMemsetD2D16Async(dst, pitch, v as u16, w, h, s),
                (4, false) => api::cuMemsetD2D32Async(dst, pitch, v, w, h, s),
                (n, _) => return Err(CallError::new(CuError::INVALID_VALUE, format!("memset element size {n}"))),
            }
        };
        check(r)?;
        if sync {
            sync_stream(stream)?;
        }
        Ok(())
    }

    fn library_get_managed(&self, library: Obj, name: &str) -> BResult<(u64, u64)> {
        let name = c_name(name)?;
        // SAFETY: out-pointers to locals; live library; NUL-terminated name.
        global(|p, n| unsafe { api::cuLibraryGetManaged(p, n, raw(library), name.as_ptr()) })
    }

    unsafe fn managed_read(&self, ptr: u64, out: &mut [u8]) -> BResult<()> {
        // SAFETY: managed memory is this process's to read from the host;
        // the range is a variable's (the caller's guarantee).
        unsafe { std::ptr::copy_nonoverlapping(ptr as usize as *const u8, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    unsafe fn managed_write(&self, ptr: u64, data: &[u8]) -> BResult<()> {
        // SAFETY: as for reading.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr as usize as *mut u8, data.len()) };
        Ok(())
    }

    fn mem_granularity(&self, ctx: Option<Obj>, prop: &AllocProp, option: u32) -> BResult<u64> {
        ctx.map_or(Ok(()), enter)?;
        vmm::granularity(prop, option)
    }

    fn mem_create(&self, ctx: Option<Obj>, size: u64, prop: &AllocProp, flags: u64) -> BResult<Obj> {
        ctx.map_or(Ok(()), enter)?;
        vmm::create(size, prop, flags)
    }

    fn mem_release(&self, handle: Obj) -> BResult<()> {
        vmm::release(handle)
    }

    fn mem_retain(&self, ptr: u64) -> BResult<Obj> {
        vmm::retain(ptr)
    }

    fn mem_address_reserve(&self, ctx: Option<Obj>, size: u64, alignment: u64, addr: u64, flags: u64) -> BResult<u64> {
        ctx.map_or(Ok(()), enter)?;
        vmm::address_reserve(size, alignment, addr, flags)
    }

    fn mem_address_free(&self, ptr: u64, size: u64) -> BResult<()> {
        vmm::address_free(ptr, size)
    }

    fn mem_map(&self, ptr: u64, size: u64, offset: u64, handle: Obj, flags: u64) -> BResult<()> {
        vmm::map(ptr, size, offset, handle, flags)
    }

    fn mem_unmap(&self, ptr: u64, size: u64) -> BResult<()> {
        vmm::unmap(ptr, size)
    }

    fn mem_set_access(&self, ptr: u64, size: u64, access: &[AccessDesc]) -> BResult<()> {
        vmm::set_access(ptr, size, access)
    }

    fn mem_get_access(&self, location_kind: u32, location: i32, ptr: u64) -> BResult<u64> {
        vmm::get_access(location_kind, location, ptr)
    }

    fn array_create(&self, ctx: Obj, desc: &ArrayDesc) -> BResult<Obj> {
        enter(ctx)?;
        arrays::create(desc)
    }

    fn array_destroy(&self, ctx: Obj, array: Obj) -> BResult<()> {
        enter(ctx)?;
        arrays::destroy(array)
    }

    fn array_descriptor(&self, ctx: Obj, array: Obj) -> BResult<ArrayDesc> {
        enter(ctx)?;
        arrays::descriptor(array)
    }

    fn mipmap_create(&self, ctx: Obj, desc: &ArrayDesc, levels: u32) -> BResult<Obj> {
        enter(ctx)?;
        arrays::mipmap_create(desc, levels)
    }

    fn mipmap_level(&self, ctx: Obj, mipmap: Obj, level: u32) -> BResult<Obj> {
        enter(ctx)?;
        arrays::mipmap_level(mipmap, level)
    }

    fn mipmap_destroy(&self, ctx: Obj, mipmap: Obj) -> BResult<()> {
        enter(ctx)?;
        arrays::mipmap_destroy(mipmap)
    }

    unsafe fn memcpy_3d(&self, ctx: Obj, copy: &Copy3D, stream: Obj, sync: bool) -> BResult<()> {
        enter(ctx)?;
        // SAFETY: the caller's guarantee.
        unsafe { arrays::copy(copy, stream, sync) }
    }

    fn tex_object_create(&self, ctx: Obj, res: &ResourceDesc, tex: &[u8], view: Option<&[u8]>) -> BResult<u64> {
        enter(ctx)?;
        arrays::tex_create(res, tex, view)
    }

    fn tex_object_destroy(&self, ctx: Obj, object: u64) -> BResult<()> {
        enter(ctx)?;
        arrays::tex_destroy(object)
    }

    fn surf_object_create(&self, ctx: Obj, res: &ResourceDesc) -> BResult<u64> {
        enter(ctx)?;
        arrays::surf_create(res)
    }

    fn surf_object_destroy(&self, ctx: Obj, object: u64) -> BResult<()> {
        enter(ctx)?;
        arrays::surf_destroy(object)
    }

    fn mem_pool_create(&self, ctx: Option<Obj>, props: &PoolProps) -> BResult<Obj> {
        ctx.map_or(Ok(()), enter)?;
        pools::create(props)
    }

    fn mem_pool_destroy(&self, pool: Obj) -> BResult<()> {
        pools::destroy(pool)
    }

    fn mem_alloc_from_pool(&self, ctx: Obj, size: u64, pool: Obj, stream: Obj) -> BResult<u64> {
        enter(ctx)?;
        pools::alloc(size, pool, stream)
    }

    fn mem_free_async(&self, ctx: Obj, ptr: u64, stream: Obj) -> BResult<()> {
        enter(ctx)?;
        pools::free(ptr, stream)
    }

    fn mem_pool_trim(&self, pool: Obj, keep: u64) -> BResult<()> {
        pools::trim(pool, keep)
    }

    fn mem_pool_set_attribute(&self, pool: Obj, attr: i32, value: u64) -> BResult<()> {
        pools::set_attribute(pool, attr, value)
    }

    fn mem_pool_get_attribute(&self, pool: Obj, attr: i32) -> BResult<u64> {
        pools::get_attribute(pool, attr)
    }

    fn mem_pool_set_access(&self, pool: Obj, access: &[AccessDesc]) -> BResult<()> {
        pools::set_access(pool, access)
    }

    fn mem_pool_get_access(&self, pool: Obj, location_kind: u32, location: i32) -> BResult<u64> {
        pools::get_access(pool, location_kind, location)
    }

    unsafe fn host_register(&self, ctx: Obj, ptr: *mut u8, len: usize) -> BResult<u64> {
        enter(ctx)?;
        const PORTABLE_DEVICEMAP: c_uint = 0x01 | 0x02;
        // SAFETY: the caller keeps `len` bytes at `ptr` mapped until
        // unregistering them.
        check(unsafe { api::cuMemHostRegister_v2(ptr.cast(), len, PORTABLE_DEVICEMAP) })?;
        // SAFETY: out-pointer to a local; the memory was just registered.
        query(|d| unsafe { api::cuMemHostGetDevicePointer_v2(d, ptr.cast(), 0) })
    }

    fn host_unregister(&self, ctx: Obj, ptr: *mut u8) -> BResult<()> {
        enter(ctx)?;
        // SAFETY: the driver checks that `ptr` starts a registration.
        check(unsafe { api::cuMemHostUnregister(ptr.cast()) })
    }

    unsafe fn memcpy_htod_host(
        &self,
        ctx: Obj,
        dst: u64,
        src: *const u8,
        len: usize,
        stream: Obj,
        sync: bool,
    ) -> BResult<()> {
        enter(ctx)?;
        // SAFETY: registered memory (the caller's guarantee) and a checked
        // device range; the DMA runs in stream order.
        check(unsafe { api::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, raw(stream)) })?;
        if sync {
            sync_stream(stream)?;
        }
        Ok(())
    }

    unsafe fn memcpy_host_batch(&self, ctx: Obj, copies: &[HostCopy], stream: Obj) -> BResult<()> {
        enter(ctx)?;
        // The driver refuses batches in the legacy default stream (null or
        // `CU_STREAM_LEGACY`): those copies go one call each.
        if stream.0 <= 1 {
            // SAFETY: the caller's guarantee.
            return unsafe { one_by_one(self, ctx, copies, stream) };
        }
        // Host memory is addressed by its pointer under unified addressing.
        let (mut dsts, mut srcs): (Vec<u64>, Vec<u64>) = copies
            .iter()
            .map(|c| match c.way {
                Way::ToDevice => (c.device, c.host as u64),
                Way::FromDevice => (c.host as u64, c.device),
            })
            .unzip();
        let mut sizes: Vec<usize> = copies.iter().map(|c| c.len).collect();
        let mut attrs = api::MemcpyAttributes { src_access_order: api::SRC_ACCESS_ORDER_STREAM, ..Default::default() };
        let mut first = 0;
        let n = copies.len();
        // SAFETY: three arrays of `n` entries and one attribute applying
        // from the first copy on; registered host memory (the caller's
        // guarantee) and checked device ranges.
        let batch = unsafe {
            api::cuMemcpyBatchAsync_v2(
                dsts.as_mut_ptr(),
                srcs.as_mut_ptr(),
                sizes.as_mut_ptr(),
                n,
                &mut attrs,
                &mut first,
                1,
                raw(stream),
            )
        };
        match batch {
            // A driver before CUDA 13: one call per copy.
            // SAFETY: the caller's guarantee.
            Err(api::Missing(_)) => unsafe { one_by_one(self, ctx, copies, stream) },
            batch => check(batch),
        }
    }

    unsafe fn memcpy_dtoh_host(
        &self,
        ctx: Obj,
        dst: *mut u8,
        src: u64,
        len: usize,
        stream: Obj,
        sync: bool,
    ) -> BResult<()> {
        enter(ctx)?;
        // SAFETY: as above.
        check(unsafe { api::cuMemcpyDtoHAsync_v2(dst.cast(), src, len, raw(stream)) })?;
        if sync {
            sync_stream(stream)?;
        }
        Ok(())
    }

    fn module_load(&self, ctx: Obj, image: &[u8]) -> BResult<Obj> {
        enter(ctx)?;
        let image = Image::new(image)?;
        // SAFETY: out-pointer to a local; `Image` checked the binary's
        // framing against its length, or NUL-terminated the text.
        handle(|m| unsafe { api::cuModuleLoadData(m, image.as_ptr()) })
    }

    fn module_unload(&self, ctx: Obj, module: Obj) -> BResult<()> {
        enter(ctx)?;
        // SAFETY: the module is live.
        check(unsafe { api::cuModuleUnload(raw(module)) })
    }

    fn module_get_function(&self, ctx: Obj, module: Obj, name: &str) -> BResult<Obj> {
        enter(ctx)?;
        let name = c_name(name)?;
        // SAFETY: out-pointer to a local; live module; NUL-terminated name.
        handle(|f| unsafe { api::cuModuleGetFunction(f, raw(module), name.as_ptr()) })
    }

    fn module_get_global(&self, ctx: Obj, module: Obj, name: &str) -> BResult<(u64, u64)> {
        enter(ctx)?;
        let name = c_name(name)?;
        // SAFETY: out-pointers to locals; live module; NUL-terminated name.
        global(|p, n| unsafe { api::cuModuleGetGlobal_v2(p, n, raw(module), name.as_ptr()) })
    }

    fn module_function_count(&self, ctx: Obj, module: Obj) -> BResult<u32> {
        enter(ctx)?;
        // SAFETY: out-pointer to a local; live module.
        query(|n| unsafe { api::cuModuleGetFunctionCount(n, raw(module)) })
    }

    fn module_functions(&self, ctx: Obj, module: Obj) -> BResult<Vec<Obj>> {
        enter(ctx)?;
        // SAFETY: out-pointer to a local; live module.
        let count: c_uint = query(|n| unsafe { api::cuModuleGetFunctionCount(n, raw(module)) })?;
        let mut funcs: Vec<sys::CUfunction> = vec![null_mut(); count as usize];
        // SAFETY: `funcs` has room for `count` handles; live module.
        check(unsafe { api::cuModuleEnumerateFunctions(funcs.as_mut_ptr(), count, raw(module)) })?;
        Ok(funcs.into_iter().map(obj).collect())
    }

    fn module_loading_mode(&self) -> BResult<i32> {
        // SAFETY: out-pointer to a local `int`.
        query(|m| unsafe { api::cuModuleGetLoadingMode(m) })
    }

    fn library_load(&self, image: &[u8]) -> BResult<Obj> {
        let image = Image::new(image)?;
        // SAFETY: out-pointer to a local; the image as for modules; no
        // options (NULL arrays, zero counts).
        handle(|l| unsafe {
            api::cuLibraryLoadData(l, image.as_ptr(), null_mut(), null_mut(), 0, null_mut(), null_mut(), 0)
        })
    }

    fn library_unload(&self, library: Obj) -> BResult<()> {
        // SAFETY: the library is live.
        check(unsafe { api::cuLibraryUnload(raw(library)) })
    }

    fn library_get_kernel(&self, library: Obj, name: &str) -> BResult<Obj> {
        let name = c_name(name)?;
        // SAFETY: out-pointer to a local; live library; NUL-terminated name.
        handle(|k| unsafe { api::cuLibraryGetKernel(k, raw(library), name.as_ptr()) })
    }

    fn library_get_module(&self, ctx: Obj, library: Obj) -> BResult<Obj> {
        enter(ctx)?;
        // SAFETY: out-pointer to a local; live library.
        handle(|m| unsafe { api::cuLibraryGetModule(m, raw(library)) })
    }

    fn library_get_global(&self, ctx: Obj, library: Obj, name: &str) -> BResult<(u64, u64)> {
        enter(ctx)?;
        let name = c_name(name)?;
        // SAFETY: out-pointers to locals; live library; NUL-terminated name.
        global(|p, n| unsafe { api::cuLibraryGetGlobal(p, n, raw(library), name.as_ptr()) })
    }

    fn library_kernel_count(&self, library: Obj) -> BResult<u32> {
        // SAFETY: out-pointer to a local; live library.
        query(|n| unsafe { api::cuLibraryGetKernelCount(n, raw(library)) })
    }

    fn kernel_get_function(&self, ctx: Obj, kernel: Obj) -> BResult<Obj> {
        enter(ctx)?;
        // SAFETY: out-pointer to a local; live kernel.
        handle(|f| unsafe { api::cuKernelGetFunction(f, raw(kernel)) })
    }

    fn func_name(&self, ctx: Obj, func: Obj) -> BResult<String> {
        enter(ctx)?;
        let mut name = std::ptr::null();
        // SAFETY: a live function; out-pointer to a local. The driver's
        // string lives as long as the module, and is copied at once.
        check(unsafe { api::cuFuncGetName(&mut name, raw(func)) })?;
        if name.is_null() {
            return Err(CuError::NOT_FOUND.into());
        }
        // SAFETY: a NUL-terminated string of the driver's, per its contract.
        Ok(unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned())
    }

    fn param_layout(&self, ctx: Obj, func: Obj) -> BResult<Vec<ParamSlot>> {
        enter(ctx)?;
        let mut slots = Vec::new();
        for index in 0..=MAX_PARAMS {
            let (mut offset, mut bytes) = (0usize, 0usize);
            // SAFETY: out-pointers to locals; live function.
            let r = check(unsafe { api::cuFuncGetParamInfo(raw(func), index, &mut offset, &mut bytes) });
            match r {
                Ok(()) => {}
                // The driver's way of saying there are no more.
                Err(e) if e.code == CuError::INVALID_VALUE => return Ok(slots),
                Err(e) => return Err(e),
            }
            let (Ok(offset), Ok(size)) = (u32::try_from(offset), u32::try_from(bytes)) else {
                return Err(CallError::new(CuError::INVALID_VALUE, "parameter beyond 4 GiB"));
            };
            slots.push(ParamSlot { offset, size });
        }
        Err(CallError::new(CuError::NOT_SUPPORTED, format!("more than {MAX_PARAMS} kernel parameters")))
    }

    fn func_get_attribute(&self, ctx: Obj, func: Obj, attr: i32) -> BResult<i32> {
        enter(ctx)?;
        // SAFETY: out-pointer to a local; live function; the attribute is a
        // plain integer, which the driver validates.
        query(|v| unsafe { api::cuFuncGetAttribute(v, attr, raw(func)) })
    }

    fn func_set_attribute(&self, ctx: Obj, func: Obj, attr: i32, value: i32) -> BResult<()> {
        enter(ctx)?;
        // SAFETY: live function; plain values, which the driver validates.
        check(unsafe { api::cuFuncSetAttribute(raw(func), attr, value) })
    }

    fn func_set_cache_config(&self, ctx: Obj, func: Obj, config: i32) -> BResult<()> {
        enter(ctx)?;
        // SAFETY: live function; plain value, which the driver validates.
        check(unsafe { api::cuFuncSetCacheConfig(raw(func), config) })
    }

    fn kernel_get_attribute(&self, kernel: Obj, attr: i32, dev: i32) -> BResult<i32> {
        // SAFETY: out-pointer to a local; live kernel; plain integers, which
        // the driver validates.
        query(|v| unsafe { api::cuKernelGetAttribute(v, attr, raw(kernel), dev) })
    }

    fn kernel_set_attribute(&self, kernel: Obj, attr: i32, value: i32, dev: i32) -> BResult<()> {
        // SAFETY: live kernel; plain integers, which the driver validates.
        check(unsafe { api::cuKernelSetAttribute(attr, value, raw(kernel), dev) })
    }

    fn kernel_set_cache_config(&self, kernel: Obj, config: i32, dev: i32) -> BResult<()> {
        // SAFETY: live kernel; plain integers, which the driver validates.
        check(unsafe { api::cuKernelSetCacheConfig(raw(kernel), config, dev) })
    }

    fn occupancy_max_active_blocks(&self, ctx: Obj, func: Obj, block: i32, smem: u64, flags: u32) -> BResult<i32> {
        enter(ctx)?;
        let smem = size(smem)?;
        // SAFETY: out-pointer to a local; live function; plain values.
        query(|n| unsafe {
            api::cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(n, raw(func), block, smem, flags)
        })
    }

    fn occupancy_available_smem(&self, ctx: Obj, func: Obj, blocks: i32, block: i32) -> BResult<u64> {
        enter(ctx)?;
        // SAFETY: out-pointer to a local; live function; plain values.
        query(|n| unsafe { api::cuOccupancyAvailableDynamicSMemPerBlock(n, raw(func), blocks, block) })
            .map(|n: usize| n as u64)
    }

    fn occupancy_max_potential_block_size(
        &self,
        ctx: Obj,
        func: Obj,
        smem: u64,
        limit: i32,
        flags: u32,
    ) -> BResult<(i32, i32)> {
        enter(ctx)?;
        let smem = size(smem)?;
        let (mut min_grid, mut block) = (0, 0);
        // SAFETY: out-pointers to locals; live function; no per-block
        // shared-memory callback; plain values.
        check(unsafe {
            api::cuOccupancyMaxPotentialBlockSizeWithFlags(
                &mut min_grid,
                &mut block,
                raw(func),
                None,
                smem,
                limit,
                flags,
            )
        })?;
        Ok((min_grid, block))
    }

    /// `params` must be exactly the layout's bytes: driver 580 refuses a
    /// longer buffer (`CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`) but launches with
    /// a shorter one, leaving the rest of the parameters undefined.
    fn occupancy_clusters(&self, ctx: Obj, func: Obj, launch: &Launch, query: ClusterQuery) -> BResult<i32> {
        enter(ctx)?;
        let mut attrs = Vec::new();
        let config = launch_config(launch, &mut attrs)?;
        let mut n: c_int = 0;
        // SAFETY: out-pointer to a local; `config` and its attributes outlive
        // the call; live function; the stream is live or special.
        check(unsafe {
            match query {
                ClusterQuery::MaxActiveClusters => api::cuOccupancyMaxActiveClusters(&mut n, raw(func), &config),
                ClusterQuery::MaxPotentialClusterSize => {
                    api::cuOccupancyMaxPotentialClusterSize(&mut n, raw(func), &config)
                }
            }
        })?;
        Ok(n)
    }

    fn launch(&self, ctx: Obj, func: Obj, launch: &Launch, params: &[u8]) -> BResult<()> {
        enter(ctx)?;
        let mut attrs = Vec::new();
        let config = launch_config(launch, &mut attrs)?;
        // SAFETY: `config` and the attributes it points to outlive the call,
        // and `with_packed` keeps `extra` valid across it; the call copies
        // the parameters before returning and only reads them; live
        // function; the stream is live or special; the session checked the
        // attributes carry no handles.
        check(with_packed(params, |extra| unsafe {
            if launch.attrs.is_empty() {
                // The plain entry point: the driver's fastest path.
                let [gx, gy, gz] = launch.grid;
                let [bx, by, bz] = launch.block;
                let (smem, stream) = (launch.shared_mem, raw(launch.stream));
                api::cuLaunchKernel(raw(func), gx, gy, gz, bx, by, bz, smem, stream, null_mut(), extra)
            } else {
                api::cuLaunchKernelEx(&config, raw(func), null_mut(), extra)
            }
        }))
    }

    fn stream_create(&self, ctx: Obj, flags: u32, priority: i32) -> BResult<Obj> {
        enter(ctx)?;
        // SAFETY: out-pointer to a local; plain values.
        handle(|s| unsafe { api::cuStreamCreateWithPriority(s, flags, priority) })
    }

    fn stream_destroy(&self, ctx: Obj, stream: Obj) -> BResult<()> {
        enter(ctx)?;
        // SAFETY: the stream is live.
        check(unsafe { api::cuStreamDestroy_v2(raw(stream)) })
    }

    fn stream_synchronize(&self, ctx: Obj, stream: Obj) -> BResult<()> {
        enter(ctx)?;
        sync_stream(stream)
    }

    fn stream_query(&self, ctx: Obj, stream: Obj) -> BResult<()> {
        enter(ctx)?;
        // SAFETY: the stream is live or special.
        check(unsafe { api::cuStreamQuery(raw(stream)) })
    }

    fn stream_wait_event(&self, ctx: Obj, stream: Obj, event: Obj, flags: u32) -> BResult<()> {
        enter(ctx)?;
        // SAFETY: the stream is live or special; the event is live.
        check(unsafe { api::cuStreamWaitEvent(raw(stream), raw(event), flags) })
    }

    fn stream_capture_status(&self, ctx: Obj, stream: Obj) -> BResult<u32> {
        enter(ctx)?;
        // SAFETY: the stream is live or special; out-pointer to a local (the
        // status is a C enum, an int).
        query(|p| unsafe { api::cuStreamIsCapturing(raw(stream), p) })
    }

    fn tensor_map_encode(&self, map: &TensorMap) -> BResult<TensorMapBytes> {
        tensor_maps::encode(map)
    }

    fn tensor_map_replace_address(&self, map: &TensorMapBytes, address: u64) -> BResult<TensorMapBytes> {
        tensor_maps::replace_address(map, address)
    }

    fn refuse_in_capture(&self, ctx: Obj, stream: Obj, what: &str) -> BResult<()> {
        match self.stream_capture_status(ctx, stream)? {
            0 => Ok(()),
            1 => {
                // Waiting for a capturing stream is refused and invalidates
                // its capture: the driver's own way to end one as failed.
                let _ = sync_stream(stream);
                Err(CallError::new(
                    CuError::STREAM_CAPTURE_UNSUPPORTED,
                    format!("{what} while the stream is capturing"),
                ))
            }
            _ => Err(CuError::STREAM_CAPTURE_INVALIDATED.into()),
        }
    }

    fn stream_id(&self, ctx: Obj, stream: Obj) -> BResult<u64> {
        enter(ctx)?;
        // SAFETY: the stream is live or special; out-pointer to a local.
        query(|id| unsafe { api::cuStreamGetId(raw(stream), id) })
    }

    fn event_create(&self, ctx: Obj, flags: u32) -> BResult<Obj> {
        enter(ctx)?;
        // SAFETY: out-pointer to a local; plain value.
        handle(|e| unsafe { api::cuEventCreate(e, flags) })
    }

    fn event_destroy(&self, ctx: Obj, event: Obj) -> BResult<()> {
        enter(ctx)?;
        // SAFETY: the event is live.
        check(unsafe { api::cuEventDestroy_v2(raw(event)) })
    }

    fn event_record(&self, ctx: Obj, event: Obj, stream: Obj, flags: u32) -> BResult<()> {
        enter(ctx)?;
        let (e, s) = (raw(event), raw(stream));
        // SAFETY: the event is live; the stream is live or special.
        check(unsafe {
            if flags == 0 {
                api::cuEventRecord(e, s)
            } else {
                api::cuEventRecordWithFlags(e, s, flags)
            }
        })
    }

    fn event_synchronize(&self, ctx: Obj, event: Obj) -> BResult<()> {
        enter(ctx)?;
        // SAFETY: the event is live.
        check(unsafe { api::cuEventSynchronize(raw(event)) })
    }

    fn event_query(&self, ctx: Obj, event: Obj) -> BResult<()> {
        enter(ctx)?;
        // SAFETY: the event is live.
        check(unsafe { api::cuEventQuery(raw(event)) })
    }

    fn event_elapsed(&self, ctx: Obj, start: Obj, end: Obj) -> BResult<f32> {
        enter(ctx)?;
        let (a, b) = (raw(start), raw(end));
        let mut ms = 0f32;
        // SAFETY: out-pointer to a local; both events are live.
        let r = unsafe { api::cuEventElapsedTime_v2(&mut ms, a, b) };
        // SAFETY: as above (`_v2` is new in driver 12.8).
        check(or_older(r, || unsafe { api::cuEventElapsedTime(&mut ms, a, b) }))?;
        Ok(ms)
    }

    fn stream_begin_capture(&self, ctx: Obj, stream: Obj, mode: u32) -> BResult<()> {
        graph::begin_capture(ctx, stream, mode)
    }

    fn stream_begin_capture_to_graph(
        &self,
        ctx: Obj,
        stream: Obj,
        graph: Obj,
        deps: &[Obj],
        data: &[u64],
        mode: u32,
    ) -> BResult<()> {
        graph::begin_capture_to_graph(ctx, stream, graph, deps, data, mode)
    }

    fn stream_end_capture(&self, ctx: Obj, stream: Obj) -> BResult<Obj> {
        graph::end_capture(ctx, stream)
    }

    fn stream_capture_info(&self, ctx: Obj, stream: Obj, edges: bool) -> BResult<CaptureInfo> {
        graph::capture_info(ctx, stream, edges)
    }

    fn exchange_capture_mode(&self, mode: u32) -> BResult<u32> {
        graph::exchange_capture_mode(mode)
    }

    fn stream_update_capture_deps(&self, ctx: Obj, stream: Obj, deps: &[Obj], flags: u32) -> BResult<()> {
        graph::update_capture_deps(ctx, stream, deps, flags)
    }

    fn graph_create(&self, flags: u32) -> BResult<Obj> {
        graph::create(flags)
    }

    fn graph_destroy(&self, graph: Obj) -> BResult<()> {
        graph::destroy(graph)
    }

    fn graph_instantiate(&self, ctx: Obj, graph: Obj, flags: u64) -> BResult<Obj> {
        graph::instantiate(ctx, graph, flags)
    }

    fn graph_exec_destroy(&self, exec: Obj) -> BResult<()> {
        graph::exec_destroy(exec)
    }

    fn graph_launch(&self, ctx: Obj, exec: Obj, stream: Obj) -> BResult<()> {
        graph::launch(ctx, exec, stream)
    }

    fn graph_upload(&self, ctx: Obj, exec: Obj, stream: Obj) -> BResult<()> {
        graph::upload(ctx, exec, stream)
    }

    fn graph_nodes(&self, graph: Obj, roots: bool) -> BResult<Vec<Obj>> {
        graph::nodes(graph, roots)
    }

    unsafe fn graph_add_node(&self, ctx: Obj, graph: Obj, deps: &[Obj], node: &NodeWork<'_>) -> BResult<Obj> {
        // SAFETY: the caller's guarantee.
        unsafe { graph::add_node(ctx, graph, deps, node) }
    }

    fn graph_add_mem_alloc_node(&self, ctx: Obj, graph: Obj, deps: &[Obj], alloc: &GraphAlloc) -> BResult<(Obj, u64)> {
        graph_memory::add_alloc_node(ctx, graph, deps, alloc)
    }

    fn graph_mem_alloc_node_params(&self, node: Obj) -> BResult<GraphAlloc> {
        graph_memory::alloc_node_params(node)
    }

    fn graph_mem_set_attribute(&self, dev: i32, attr: i32, value: u64) -> BResult<()> {
        graph_memory::set_attribute(dev, attr, value)
    }

    fn graph_child_graph(&self, node: Obj) -> BResult<Obj> {
        graph::child_graph(node)
    }

    fn graph_memset_node_params(&self, node: Obj) -> BResult<Memset> {
        graph::memset_params(node)
    }

    fn ipc_get_mem_handle(&self, ctx: Obj, dptr: u64) -> BResult<IpcHandle> {
        enter(ctx)?;
        ipc::get_mem_handle(dptr)
    }

    fn ipc_open_mem_handle(&self, ctx: Obj, handle: &IpcHandle, flags: u32) -> BResult<(u64, u64)> {
        enter(ctx)?;
        ipc::open_mem_handle(handle, flags)
    }

    fn ipc_close_mem_handle(&self, ctx: Obj, dptr: u64) -> BResult<()> {
        enter(ctx)?;
        ipc::close_mem_handle(dptr)
    }

    fn ipc_get_event_handle(&self, ctx: Obj, event: Obj) -> BResult<IpcHandle> {
        enter(ctx)?;
        ipc::get_event_handle(event)
    }

    fn ipc_open_event_handle(&self, ctx: Obj, handle: &IpcHandle) -> BResult<Obj> {
        enter(ctx)?;
        ipc::open_event_handle(handle)
    }

    fn link(&self, ctx: Obj, options: &[(u32, u64)], inputs: &[(u32, &[u8])]) -> BResult<Linked> {
        link::link(ctx, options, inputs)
    }

    fn graph_add_conditional_node(
        &self,
        ctx: Obj,
        graph: Obj,
        deps: &[Obj],
        cond: &Conditional,
    ) -> BResult<(Obj, Vec<Obj>)> {
        graph::add_conditional_node(ctx, graph, deps, cond)
    }

    fn passthrough(&self) -> &dyn gpuplex_protocol::Passthrough {
        self
    }

    fn graph_dependencies(&self, graph: Obj, from: &[Obj], to: &[Obj], data: &[u64], remove: bool) -> BResult<()> {
        graph::dependencies(graph, from, to, data, remove)
    }

    fn graph_edges(&self, graph: Obj) -> BResult<Vec<(Obj, Obj, u64)>> {
        graph::edges(graph)
    }

    fn graph_node_edges(&self, node: Obj, dependents: bool) -> BResult<Vec<(Obj, u64)>> {
        graph::node_edges(node, dependents)
    }

    unsafe fn graph_node_set(&self, ctx: Obj, node: Obj, exec: Option<Obj>, work: &NodeWork<'_>) -> BResult<()> {
        // SAFETY: the caller's guarantee.
        unsafe { graph::node_set(ctx, node, exec, work) }
    }

    fn launch_host_func(&self, ctx: Obj, stream: Obj, f: HostFn) -> BResult<()> {
        graph::launch_host_func(ctx, stream, f)
    }

    fn graph_clone(&self, graph: Obj) -> BResult<Obj> {
        graph::clone(graph)
    }

    fn graph_node_find_in_clone(&self, node: Obj, clone: Obj) -> BResult<Obj> {
        graph::find_in_clone(node, clone)
    }

    fn graph_destroy_node(&self, node: Obj) -> BResult<()> {
        graph::destroy_node(node)
    }

    fn graph_exec_update(&self, ctx: Obj, exec: Obj, graph: Obj) -> BResult<ExecUpdate> {
        graph::exec_update(ctx, exec, graph)
    }
}

#[cfg(test)]
mod tests;
