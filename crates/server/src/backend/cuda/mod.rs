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
use gpuplex_protocol::{Attribute, CallError, CuError, DeviceInfo, Seq, DEVICE_ATTRIBUTE_COUNT};

use super::{one_by_one, BResult, Backend, CaptureInfo, Copy3D, CopyEnd, HostCopy, Launch, Memset, Obj, Place, Way};
use crate::backend::{Contexts, Memory};

mod api;
mod arrays;
mod graph;
mod graph_memory;
mod image;
mod ipc;
mod link;
mod modules;
mod passthrough;
mod pools;
mod streams;
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
    fn passthrough(&self) -> &dyn gpuplex_protocol::Passthrough {
        self
    }
}

#[cfg(test)]
mod tests;

impl Contexts for Cuda {
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
}

impl Memory for Cuda {
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

    fn mem_mapping(&self, ctx: Option<Obj>, ptr: u64) -> BResult<(u64, u64, bool)> {
        const MAPPING_SIZE: c_int = 18;
        const MAPPING_BASE_ADDR: c_int = 19;
        const IS_HW_DECOMPRESS_CAPABLE: c_int = 21;
        ctx.map_or(Ok(()), enter)?;
        // SAFETY: each use below passes a local of the attribute's type.
        let attribute = |attr: c_int, out: *mut c_void| unsafe { api::cuPointerGetAttribute(out, attr, ptr) };
        let size = query(|p: *mut usize| attribute(MAPPING_SIZE, p.cast()))?;
        let base = query(|p: *mut u64| attribute(MAPPING_BASE_ADDR, p.cast()))?;
        // A driver older than the attribute (12.8) refuses it: no such hardware there.
        let decompress = query(|p: *mut c_int| attribute(IS_HW_DECOMPRESS_CAPABLE, p.cast())).unwrap_or(0);
        Ok((base, size as u64, decompress != 0))
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
}
