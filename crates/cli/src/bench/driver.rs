//! The CUDA driver as the bench worker sees it: entry points resolved with
//! dlsym from a libcuda chosen at run time, wrapped so that a status code
//! becomes a `Result` and every resource is released by `Drop`.
//!
//! Loading by path rather than linking is what lets one measuring routine run
//! on the machine's driver and on gpuplex's front-end alike.

use std::ffi::{c_char, c_void, CStr};
use std::fmt;

use libloading::Library;

type CuResult = i32;
type Handle = *mut c_void;
pub type DevPtr = u64;

/// A failed driver call.
#[derive(Debug)]
pub struct CudaError {
    call: &'static str,
    code: CuResult,
    name: String,
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {} ({})", self.call, self.name, self.code)
    }
}

impl std::error::Error for CudaError {}

pub type Result<T> = std::result::Result<T, CudaError>;

macro_rules! entry_points {
    ($($field:ident = $symbol:literal fn($($arg:ty),*);)*) => {
        /// The driver functions the bench calls, by their versioned symbol names.
        struct Entries {
            $($field: unsafe extern "C" fn($($arg),*) -> CuResult,)*
        }

        impl Entries {
            /// # Safety
            /// `lib` is a CUDA driver: its symbols have the driver API's signatures.
            unsafe fn resolve(lib: &Library) -> std::result::Result<Entries, String> {
                Ok(Entries {
                    $($field: {
                        // SAFETY: the driver API declares this symbol with this signature.
                        let symbol = unsafe { lib.get::<unsafe extern "C" fn($($arg),*) -> CuResult>($symbol) };
                        *symbol.map_err(|e| format!("{}: {e}", $symbol))?
                    },)*
                })
            }
        }
    };
}

entry_points! {
    init = "cuInit" fn(u32);
    driver_get_version = "cuDriverGetVersion" fn(*mut i32);
    device_get = "cuDeviceGet" fn(*mut i32, i32);
    device_get_name = "cuDeviceGetName" fn(*mut c_char, i32, i32);
    primary_ctx_retain = "cuDevicePrimaryCtxRetain" fn(*mut Handle, i32);
    primary_ctx_release = "cuDevicePrimaryCtxRelease_v2" fn(i32);
    ctx_set_current = "cuCtxSetCurrent" fn(Handle);
    ctx_synchronize = "cuCtxSynchronize" fn();
    module_load_data = "cuModuleLoadData" fn(*mut Handle, *const c_void);
    module_unload = "cuModuleUnload" fn(Handle);
    module_get_function = "cuModuleGetFunction" fn(*mut Handle, Handle, *const c_char);
    launch_kernel = "cuLaunchKernel"
        fn(Handle, u32, u32, u32, u32, u32, u32, u32, Handle, *mut *mut c_void, *mut *mut c_void);
    stream_create = "cuStreamCreate" fn(*mut Handle, u32);
    stream_destroy = "cuStreamDestroy_v2" fn(Handle);
    stream_synchronize = "cuStreamSynchronize" fn(Handle);
    stream_begin_capture = "cuStreamBeginCapture_v2" fn(Handle, u32);
    stream_end_capture = "cuStreamEndCapture" fn(Handle, *mut Handle);
    graph_instantiate = "cuGraphInstantiateWithFlags" fn(*mut Handle, Handle, u64);
    graph_launch = "cuGraphLaunch" fn(Handle, Handle);
    graph_exec_destroy = "cuGraphExecDestroy" fn(Handle);
    graph_destroy = "cuGraphDestroy" fn(Handle);
    mem_alloc = "cuMemAlloc_v2" fn(*mut DevPtr, usize);
    mem_free = "cuMemFree_v2" fn(DevPtr);
    memcpy_htod = "cuMemcpyHtoD_v2" fn(DevPtr, *const c_void, usize);
    memcpy_dtoh = "cuMemcpyDtoH_v2" fn(*mut c_void, DevPtr, usize);
    mem_alloc_host = "cuMemAllocHost_v2" fn(*mut *mut c_void, usize);
    mem_free_host = "cuMemFreeHost" fn(*mut c_void);
    get_error_name = "cuGetErrorName" fn(CuResult, *mut *const c_char);
}

/// A loaded libcuda.
pub struct Driver {
    e: Entries,
    /// The file the entry points came from.
    pub path: String,
    /// Whether it is gpuplex's front-end (it exports `gpuplex_frontend`).
    pub is_gpuplex: bool,
}

impl Driver {
    /// Loads `library`: a path, or a bare name the dynamic linker searches for.
    pub fn load(library: &str) -> std::result::Result<Driver, String> {
        // SAFETY: loading a driver runs its initialisers, which ask nothing of the caller.
        let lib = unsafe { Library::new(library) }.map_err(|e| match std::error::Error::source(&e) {
            Some(why) => format!("cannot load {library}: {why}"),
            None => format!("cannot load {library}: {e}"),
        })?;
        // SAFETY: `lib` was asked for by the name of a CUDA driver.
        let e = unsafe { Entries::resolve(&lib) }.map_err(|e| format!("{library} is not a CUDA driver: {e}"))?;
        // SAFETY: only the symbol's presence is read, never its value.
        let is_gpuplex = unsafe { lib.get::<*const u8>("gpuplex_frontend") }.is_ok();
        let path = loaded_from(e.init as *const c_void).unwrap_or_else(|| library.to_owned());
        // Never unloaded: a driver's threads and atexit handlers may outlive a dlclose.
        std::mem::forget(lib);
        Ok(Driver { e, path, is_gpuplex })
    }

    fn check(&self, call: &'static str, code: CuResult) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        let mut name: *const c_char = std::ptr::null();
        // SAFETY: `name` is a valid out-pointer; the driver sets it to a static string or leaves it.
        let known = unsafe { (self.e.get_error_name)(code, &mut name) } == 0 && !name.is_null();
        let name = if known {
            // SAFETY: the driver returned a NUL-terminated static string.
            unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
        } else {
            "unknown error".to_owned()
        };
        Err(CudaError { call, code, name })
    }

    pub fn init(&self) -> Result<()> {
        // SAFETY: no pointers.
        self.check("cuInit", unsafe { (self.e.init)(0) })
    }

    pub fn driver_version(&self) -> Result<i32> {
        let mut v = 0;
        // SAFETY: `v` is a valid out-pointer.
        self.check("cuDriverGetVersion", unsafe { (self.e.driver_get_version)(&mut v) })?;
        Ok(v)
    }

    pub fn device(&self, ordinal: i32) -> Result<i32> {
        let mut dev = 0;
        // SAFETY: `dev` is a valid out-pointer.
        self.check("cuDeviceGet", unsafe { (self.e.device_get)(&mut dev, ordinal) })?;
        Ok(dev)
    }

    pub fn device_name(&self, dev: i32) -> Result<String> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: the buffer holds more than the length passed, so its last byte stays 0.
        self.check("cuDeviceGetName", unsafe { (self.e.device_get_name)(buf.as_mut_ptr(), 255, dev) })?;
        // SAFETY: NUL-terminated within the buffer, as above.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
    }

    /// Retains `dev`'s primary context and makes it current on this thread.
    pub fn primary_context(&self, dev: i32) -> Result<PrimaryContext<'_>> {
        let mut ctx = std::ptr::null_mut();
        // SAFETY: `ctx` is a valid out-pointer.
        self.check("cuDevicePrimaryCtxRetain", unsafe { (self.e.primary_ctx_retain)(&mut ctx, dev) })?;
        let retained = PrimaryContext { driver: self, dev };
        // SAFETY: `ctx` is the live context just retained.
        self.check("cuCtxSetCurrent", unsafe { (self.e.ctx_set_current)(ctx) })?;
        Ok(retained)
    }

    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: no pointers.
        self.check("cuCtxSynchronize", unsafe { (self.e.ctx_synchronize)() })
    }

    /// Loads a module from NUL-terminated PTX.
    pub fn load_ptx(&self, ptx: &CStr) -> Result<Module<'_>> {
        let mut m = std::ptr::null_mut();
        // SAFETY: `m` is a valid out-pointer; the image is NUL-terminated text, as PTX must be.
        self.check("cuModuleLoadData", unsafe { (self.e.module_load_data)(&mut m, ptx.as_ptr().cast()) })?;
        Ok(Module { driver: self, handle: m })
    }

    pub fn create_stream(&self) -> Result<Stream<'_>> {
        let mut s = std::ptr::null_mut();
        // SAFETY: `s` is a valid out-pointer.
        self.check("cuStreamCreate", unsafe { (self.e.stream_create)(&mut s, 0) })?;
        Ok(Stream { driver: self, handle: s })
    }

    /// Launches a parameterless kernel as `<<<1, 1, 0, stream>>>`.
    pub fn launch_empty(&self, f: &Function<'_>, stream: &Stream<'_>) -> Result<()> {
        let null = std::ptr::null_mut();
        // SAFETY: the function takes no parameters, so no parameter array is needed; both handles are live.
        let code = unsafe { (self.e.launch_kernel)(f.handle, 1, 1, 1, 1, 1, 1, 0, stream.handle, null, null) };
        self.check("cuLaunchKernel", code)
    }

    /// A graph of `kernels` launches of `f` one after another, captured from
    /// `stream` and instantiated.
    pub fn capture_graph(&self, f: &Function<'_>, stream: &Stream<'_>, kernels: usize) -> Result<GraphExec<'_>> {
        /// `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`: other threads' calls go on as they are.
        const THREAD_LOCAL: u32 = 1;
        // SAFETY: a live stream.
        self.check("cuStreamBeginCapture", unsafe { (self.e.stream_begin_capture)(stream.handle, THREAD_LOCAL) })?;
        let launched = (0..kernels).try_for_each(|_| self.launch_empty(f, stream));
        let mut graph = std::ptr::null_mut();
        // SAFETY: the stream captures; `graph` is a valid out-pointer.
        let ended = self.check("cuStreamEndCapture", unsafe { (self.e.stream_end_capture)(stream.handle, &mut graph) });
        launched?;
        ended?;
        let mut exec = std::ptr::null_mut();
        // SAFETY: the graph just captured; `exec` is a valid out-pointer.
        let made =
            self.check("cuGraphInstantiateWithFlags", unsafe { (self.e.graph_instantiate)(&mut exec, graph, 0) });
        // SAFETY: the graph, not needed once instantiated (or not).
        unsafe { (self.e.graph_destroy)(graph) };
        made?;
        Ok(GraphExec { driver: self, handle: exec })
    }

    pub fn launch_graph(&self, exec: &GraphExec<'_>, stream: &Stream<'_>) -> Result<()> {
        // SAFETY: both handles are live.
        self.check("cuGraphLaunch", unsafe { (self.e.graph_launch)(exec.handle, stream.handle) })
    }

    /// Launches a kernel whose one parameter is a `u64` as `<<<grid, block>>>`
    /// on the default stream.
    pub fn launch_u64(&self, f: &Function<'_>, grid: u32, block: u32, arg: u64) -> Result<()> {
        let mut arg = arg;
        let mut params = [(&raw mut arg).cast::<c_void>()];
        let (null, stream) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: the function takes one u64, which `params` points to for the
        // call; the handle is live and the null stream is the default one.
        let code =
            unsafe { (self.e.launch_kernel)(f.handle, grid, 1, 1, block, 1, 1, 0, stream, params.as_mut_ptr(), null) };
        self.check("cuLaunchKernel", code)
    }

    /// Waits for the default stream's work.
    pub fn synchronize_default_stream(&self) -> Result<()> {
        // SAFETY: the null stream is the default one, always valid.
        self.check("cuStreamSynchronize", unsafe { (self.e.stream_synchronize)(std::ptr::null_mut()) })
    }

    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer<'_>> {
        let mut ptr = 0;
        // SAFETY: `ptr` is a valid out-pointer.
        self.check("cuMemAlloc_v2", unsafe { (self.e.mem_alloc)(&mut ptr, bytes) })?;
        Ok(DeviceBuffer { driver: self, ptr, len: bytes })
    }

    /// Page-locked host memory from `cuMemAllocHost`.
    pub fn alloc_host(&self, bytes: usize) -> Result<PinnedBuffer<'_>> {
        let mut ptr = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer.
        self.check("cuMemAllocHost_v2", unsafe { (self.e.mem_alloc_host)(&mut ptr, bytes) })?;
        Ok(PinnedBuffer { driver: self, ptr: ptr.cast(), len: bytes })
    }

    /// A synchronous copy of `src` to the start of `dst`.
    pub fn htod(&self, dst: &DeviceBuffer<'_>, src: &[u8]) -> Result<()> {
        assert!(src.len() <= dst.len, "copy larger than its device buffer");
        // SAFETY: `src` is readable for its length; `dst` is a live allocation at least as long.
        self.check("cuMemcpyHtoD_v2", unsafe { (self.e.memcpy_htod)(dst.ptr, src.as_ptr().cast(), src.len()) })
    }

    /// A synchronous copy of the start of `src` into `dst`.
    pub fn dtoh(&self, dst: &mut [u8], src: &DeviceBuffer<'_>) -> Result<()> {
        assert!(dst.len() <= src.len, "copy larger than its device buffer");
        // SAFETY: `dst` is writable for its length; `src` is a live allocation at least as long.
        self.check("cuMemcpyDtoH_v2", unsafe { (self.e.memcpy_dtoh)(dst.as_mut_ptr().cast(), src.ptr, dst.len()) })
    }
}

/// The file that holds `addr`, as the dynamic linker knows it.
fn loaded_from(addr: *const c_void) -> Option<String> {
    // SAFETY: all-zero is a valid Dl_info (null pointers).
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid out-pointer; dladdr only looks `addr` up.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr set a NUL-terminated name owned by the linker.
    let name = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned();
    Some(std::fs::canonicalize(&name).map(|p| p.display().to_string()).unwrap_or(name))
}

/// A retained primary context, released on drop.
pub struct PrimaryContext<'d> {
    driver: &'d Driver,
    dev: i32,
}

impl Drop for PrimaryContext<'_> {
    fn drop(&mut self) {
        // SAFETY: releases the retain this value holds.
        unsafe { (self.driver.e.primary_ctx_release)(self.dev) };
    }
}

pub struct Module<'d> {
    driver: &'d Driver,
    handle: Handle,
}

impl<'d> Module<'d> {
    pub fn function(&self, name: &CStr) -> Result<Function<'_>> {
        let mut f = std::ptr::null_mut();
        // SAFETY: `f` is a valid out-pointer, the module is live and `name` NUL-terminated.
        let code = unsafe { (self.driver.e.module_get_function)(&mut f, self.handle, name.as_ptr()) };
        self.driver.check("cuModuleGetFunction", code)?;
        Ok(Function { handle: f, _module: std::marker::PhantomData })
    }
}

impl Drop for Module<'_> {
    fn drop(&mut self) {
        // SAFETY: the module is live and unloaded once.
        unsafe { (self.driver.e.module_unload)(self.handle) };
    }
}

/// A kernel; it lives as long as its module.
pub struct Function<'m> {
    handle: Handle,
    _module: std::marker::PhantomData<&'m ()>,
}

pub struct Stream<'d> {
    driver: &'d Driver,
    handle: Handle,
}

impl Stream<'_> {
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the stream is live.
        self.driver.check("cuStreamSynchronize", unsafe { (self.driver.e.stream_synchronize)(self.handle) })
    }
}

impl Drop for Stream<'_> {
    fn drop(&mut self) {
        // SAFETY: the stream is live and destroyed once.
        unsafe { (self.driver.e.stream_destroy)(self.handle) };
    }
}

/// An executable graph, destroyed on drop.
pub struct GraphExec<'d> {
    driver: &'d Driver,
    handle: Handle,
}

impl Drop for GraphExec<'_> {
    fn drop(&mut self) {
        // SAFETY: the executable graph is live and destroyed once.
        unsafe { (self.driver.e.graph_exec_destroy)(self.handle) };
    }
}

/// Device memory from `cuMemAlloc`, freed on drop.
pub struct DeviceBuffer<'d> {
    driver: &'d Driver,
    ptr: DevPtr,
    len: usize,
}

impl DeviceBuffer<'_> {
    /// Frees now, reporting the driver's answer (drop ignores it).
    pub fn free(self) -> Result<()> {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: the allocation is live; ManuallyDrop keeps drop from freeing it again.
        this.driver.check("cuMemFree_v2", unsafe { (this.driver.e.mem_free)(this.ptr) })
    }
}

impl Drop for DeviceBuffer<'_> {
    fn drop(&mut self) {
        // SAFETY: the allocation is live and freed once.
        unsafe { (self.driver.e.mem_free)(self.ptr) };
    }
}

/// Host memory from `cuMemAllocHost`, freed on drop.
pub struct PinnedBuffer<'d> {
    driver: &'d Driver,
    ptr: *mut u8,
    len: usize,
}

impl std::ops::Deref for PinnedBuffer<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` bytes at `ptr` are this buffer's own, readable and writable until drop.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::ops::DerefMut for PinnedBuffer<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PinnedBuffer<'_> {
    fn drop(&mut self) {
        // SAFETY: the block is live and freed once.
        unsafe { (self.driver.e.mem_free_host)(self.ptr.cast()) };
    }
}
