//! The GPU a server drives, behind one trait.
//!
//! [`Backend`] is the driver API reduced to what sessions need, in terms of
//! backend objects ([`Obj`]) rather than client handles: the session layer
//! has already looked every client handle up in its own tables and checked
//! every device range before a backend method runs. Two implementations:
//! [`cuda`] drives real GPUs through the CUDA driver loaded at run time;
//! `emulated` (with the cargo feature of that name) is a host-memory test
//! device for tests and machines without a GPU.
//!
//! Methods that take a `ctx` run with that context current on the calling
//! thread. Streams are passed as [`Obj`]s too, with the special values of
//! [`gpuplex_protocol::Stream`] (0 NULL, 1 legacy, 2 per-thread) kept as is.

pub mod cuda;
#[cfg(feature = "emulated")]
pub mod emulated;

use gpuplex_protocol::{AccessDesc, AllocProp, ArrayDesc, CallError, DeviceInfo, Passthrough, PoolProps, ResourceDesc};

pub type BResult<T> = Result<T, CallError>;

pub use crate::ledger::IpcHandle;

/// `cuEventCreate`'s flag for an event that only orders and waits: cheaper to record.
pub const CU_EVENT_DISABLE_TIMING: u32 = 0x2;

/// A backend object: the real driver's pointer, or an emulated id. Never
/// shown to a client.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct Obj(pub u64);

/// Where one kernel parameter sits in the packed parameter buffer.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ParamSlot {
    pub offset: u32,
    pub size: u32,
}

/// A launch as the backend receives it.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem: u32,
    pub stream: Obj,
    /// Launch attributes, each `(CUlaunchAttributeID, 64-byte value)`,
    /// already checked by the session to carry no handles.
    pub attrs: Vec<(u32, [u8; 64])>,
}

/// What a cluster occupancy query asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterQuery {
    /// How many clusters of the launch's cluster size can be co-resident.
    MaxActiveClusters,
    /// The largest cluster size the launch could use.
    MaxPotentialClusterSize,
}

/// A tensor map (TMA descriptor) to encode: `cuTensorMapEncodeTiled`'s or
/// `cuTensorMapEncodeIm2col`'s parameters, every list as long as the rank
/// asks (`strides` one shorter).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorMap {
    pub data_type: u32,
    pub address: u64,
    pub dims: Vec<u64>,
    pub strides: Vec<u64>,
    pub element_strides: Vec<u32>,
    pub window: TensorWindow,
    pub interleave: u32,
    pub swizzle: u32,
    pub l2_promotion: u32,
    pub oob_fill: u32,
}

/// What one copy through a tensor map moves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TensorWindow {
    /// A box of these dimensions.
    Tiled(Vec<u32>),
    /// Pixels of an image: the box's corners in the spatial dimensions.
    Im2col { lower: Vec<i32>, upper: Vec<i32>, channels: u32, pixels: u32 },
}

/// `CUtensorMap`: opaque to all but the device.
pub type TensorMapBytes = [u8; 128];

/// A memset of `height` rows of `width` elements of `element_size` bytes,
/// rows `pitch` bytes apart (1-D memsets have height 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Memset {
    pub dst: u64,
    pub pitch: u64,
    pub value: u32,
    pub element_size: u32,
    pub width: u64,
    pub height: u64,
}

impl Memset {
    /// Whether the memset sets no byte at all. Sessions answer such a memset
    /// themselves, so backends never see one.
    pub fn is_empty(&self) -> bool {
        self.width == 0 || self.height == 0
    }

    /// The bytes one row sets.
    pub fn row_bytes(&self) -> Option<u64> {
        self.width.checked_mul(self.element_size as u64)
    }

    /// The bytes from `dst` the memset may touch.
    pub fn extent(&self) -> Option<u64> {
        if self.is_empty() {
            return Some(0);
        }
        self.pitch.checked_mul(self.height - 1)?.checked_add(self.row_bytes()?)
    }
}

/// Where one end of a 2D or 3D copy is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    Host(*mut u8),
    Device(u64),
    Array(Obj),
}

// SAFETY: a host place is an address like the others; only the functions
// whose contracts vouch for it dereference it, on whatever thread.
unsafe impl Send for Place {}

/// One end of a 2D or 3D copy: its place, the first byte's position, and
/// for host and device memory the bytes between rows and the rows of a
/// slice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyEnd {
    pub place: Place,
    pub x: u64,
    pub y: u64,
    pub z: u64,
    pub pitch: u64,
    pub height: u64,
}

/// A copy of `depth` slices of `height` rows of `width` bytes, made with
/// the driver function `shape` names (`gpuplex_protocol::COPY_3D`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copy3D {
    pub shape: u32,
    pub src: CopyEnd,
    pub dst: CopyEnd,
    pub width: u64,
    pub height: u64,
    pub depth: u64,
}

/// [`Memory::memcpy_host_batch`] as one call per copy: its default, and
/// what a backend falls back to where it cannot batch.
///
/// # Safety
/// As for [`Memory::memcpy_host_batch`].
pub unsafe fn one_by_one<B: Memory + ?Sized>(backend: &B, ctx: Obj, copies: &[HostCopy], stream: Obj) -> BResult<()> {
    for c in copies {
        // SAFETY: the caller's guarantee, copy by copy.
        unsafe {
            match c.way {
                Way::ToDevice => backend.memcpy_htod_host(ctx, c.device, c.host, c.len, stream, false),
                Way::FromDevice => backend.memcpy_dtoh_host(ctx, c.host, c.device, c.len, stream, false),
            }
        }?;
    }
    Ok(())
}

/// One copy of [`Memory::memcpy_host_batch`].
#[derive(Debug, Clone, Copy)]
pub struct HostCopy {
    pub way: Way,
    pub device: u64,
    pub host: *mut u8,
    pub len: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    ToDevice,
    FromDevice,
}

/// What a server needs from a GPU driver: one trait per family of calls,
/// each implemented in its family's file of a backend. All methods are
/// callable from any session thread at once.
pub trait Backend:
    Contexts + Memory + VirtualMemory + Arrays + Pools + Modules + Streams + Graphs + Ipc + Send + Sync
{
    /// The calls of the API table's `pass` rows.
    fn passthrough(&self) -> &dyn Passthrough;
}

/// Devices and their contexts.
pub trait Contexts {
    /// `cuda` or `emulated`.
    fn kind(&self) -> &'static str;
    fn driver_version(&self) -> i32;
    /// Fetched once at start-up.
    fn devices(&self) -> &[DeviceInfo];
    fn can_access_peer(&self, dev: i32, peer: i32) -> BResult<i32>;
    fn ctx_create(&self, dev: i32, flags: u32) -> BResult<Obj>;
    fn ctx_destroy(&self, ctx: Obj) -> BResult<()>;
    fn ctx_synchronize(&self, ctx: Obj) -> BResult<()>;
    fn ctx_api_version(&self, ctx: Obj) -> BResult<u32>;
    fn ctx_get_flags(&self, ctx: Obj) -> BResult<u32>;
    fn ctx_set_flags(&self, ctx: Obj, flags: u32) -> BResult<()>;
    fn ctx_get_limit(&self, ctx: Obj, limit: i32) -> BResult<u64>;
    fn ctx_set_limit(&self, ctx: Obj, limit: i32, value: u64) -> BResult<()>;
    fn ctx_get_cache_config(&self, ctx: Obj) -> BResult<i32>;
    fn ctx_set_cache_config(&self, ctx: Obj, config: i32) -> BResult<()>;
    /// `(least, greatest)`.
    fn ctx_stream_priority_range(&self, ctx: Obj) -> BResult<(i32, i32)>;
    fn ctx_id(&self, ctx: Obj) -> BResult<u64>;
}

/// Device memory, copies and memsets; managed variables; host memory shared
/// with a client, registered for the device.
pub trait Memory {
    /// `(free, total)` bytes of the context's device.
    fn mem_get_info(&self, ctx: Obj) -> BResult<(u64, u64)>;
    fn mem_alloc(&self, ctx: Obj, size: u64) -> BResult<u64>;
    /// `(pointer, pitch)`.
    fn mem_alloc_pitch(&self, ctx: Obj, width: u64, height: u64, element_size: u32) -> BResult<(u64, u64)>;
    fn mem_free(&self, ctx: Obj, ptr: u64) -> BResult<()>;
    /// The driver's mapping that holds device address `ptr`, as
    /// `(base, size, decompress)`: its `MAPPING_BASE_ADDR`, `MAPPING_SIZE`
    /// and `IS_HW_DECOMPRESS_CAPABLE` pointer attributes.
    fn mem_mapping(&self, ctx: Option<Obj>, ptr: u64) -> BResult<(u64, u64, bool)>;
    /// Copies `src` to device address `dst` in `stream`'s order. Returns once
    /// `src` may be reused; `sync` asks for completion as well.
    fn memcpy_htod(&self, ctx: Obj, dst: u64, src: &[u8], stream: Obj, sync: bool) -> BResult<()>;
    /// Copies to `dst` in `stream`'s order; always complete on return.
    fn memcpy_dtoh(&self, ctx: Obj, dst: &mut [u8], src: u64, stream: Obj) -> BResult<()>;
    fn memcpy_dtod(&self, ctx: Obj, dst: u64, src: u64, size: u64, stream: Obj, sync: bool) -> BResult<()>;
    fn memset(&self, ctx: Obj, op: &Memset, stream: Obj, sync: bool) -> BResult<()>;
    /// A library's `__managed__` variable, `(address, size)`, one for every context.
    fn library_get_managed(&self, library: Obj, name: &str) -> BResult<(u64, u64)>;
    /// Reads managed memory from the host, as the program would: without
    /// waiting for the device.
    ///
    /// # Safety
    /// `[ptr, ptr + out.len())` lies in a managed variable of a loaded library.
    unsafe fn managed_read(&self, ptr: u64, out: &mut [u8]) -> BResult<()>;
    /// Writes managed memory from the host, as [`Memory::managed_read`] reads it.
    ///
    /// # Safety
    /// As for [`Memory::managed_read`].
    unsafe fn managed_write(&self, ptr: u64, data: &[u8]) -> BResult<()>;
    /// Pins and maps `len` bytes of host memory at `ptr`, from `ctx` (the
    /// registration ends with it) for every context; returns their device
    /// address (`ptr` itself under unified addressing).
    ///
    /// # Safety
    /// The memory stays mapped until [`Memory::host_unregister`] or the
    /// context's end.
    unsafe fn host_register(&self, ctx: Obj, ptr: *mut u8, len: usize) -> BResult<u64>;
    fn host_unregister(&self, ctx: Obj, ptr: *mut u8) -> BResult<()>;
    /// Copies registered host memory to device address `dst` in `stream`'s
    /// order: the GPU reads the host memory when the copy runs, so the
    /// caller keeps it unchanged until then (or asks for `sync`).
    ///
    /// # Safety
    /// `src` is registered host memory, readable for `len` bytes.
    unsafe fn memcpy_htod_host(
        &self,
        ctx: Obj,
        dst: u64,
        src: *const u8,
        len: usize,
        stream: Obj,
        sync: bool,
    ) -> BResult<()>;
    /// Copies device memory to registered host memory in `stream`'s order.
    ///
    /// # Safety
    /// `dst` is registered host memory, writable for `len` bytes.
    unsafe fn memcpy_dtoh_host(
        &self,
        ctx: Obj,
        dst: *mut u8,
        src: u64,
        len: usize,
        stream: Obj,
        sync: bool,
    ) -> BResult<()>;
    /// Several copies between registered host memory and the device, all
    /// one way, in `stream`'s order (the batch as a whole; within it, in any
    /// order). The driver takes a batch in one call, and the copy engine
    /// moves it faster than one call per copy.
    ///
    /// # Safety
    /// Each copy's `host` is registered host memory, valid for `len` bytes,
    /// left alone until the copies have run.
    unsafe fn memcpy_host_batch(&self, ctx: Obj, copies: &[HostCopy], stream: Obj) -> BResult<()> {
        // SAFETY: the caller's guarantee.
        unsafe { one_by_one(self, ctx, copies, stream) }
    }
}

/// Virtual memory management. Locations name backend devices; `ctx`, where
/// the guest has one current, is made current first.
pub trait VirtualMemory {
    // where the guest has one current, is made current first.
    fn mem_granularity(&self, ctx: Option<Obj>, prop: &AllocProp, option: u32) -> BResult<u64>;
    /// A physical allocation, as the driver's handle.
    fn mem_create(&self, ctx: Option<Obj>, size: u64, prop: &AllocProp, flags: u64) -> BResult<Obj>;
    fn mem_release(&self, handle: Obj) -> BResult<()>;
    /// The allocation mapped at `ptr`, with a reference more.
    fn mem_retain(&self, ptr: u64) -> BResult<Obj>;
    fn mem_address_reserve(&self, ctx: Option<Obj>, size: u64, alignment: u64, addr: u64, flags: u64) -> BResult<u64>;
    fn mem_address_free(&self, ptr: u64, size: u64) -> BResult<()>;
    fn mem_map(&self, ptr: u64, size: u64, offset: u64, handle: Obj, flags: u64) -> BResult<()>;
    fn mem_unmap(&self, ptr: u64, size: u64) -> BResult<()>;
    fn mem_set_access(&self, ptr: u64, size: u64, access: &[AccessDesc]) -> BResult<()>;
    fn mem_get_access(&self, location_kind: u32, location: i32, ptr: u64) -> BResult<u64>;
}

/// Arrays, texture and surface objects. A resource's `at` is the backend's
/// array for arrays, a device address otherwise.
pub trait Arrays {
    // array for arrays, a device address otherwise.
    fn array_create(&self, ctx: Obj, desc: &ArrayDesc) -> BResult<Obj>;
    fn array_destroy(&self, ctx: Obj, array: Obj) -> BResult<()>;
    fn array_descriptor(&self, ctx: Obj, array: Obj) -> BResult<ArrayDesc>;
    /// A mipmapped array of `levels` levels, level 0 shaped as `desc`.
    fn mipmap_create(&self, ctx: Obj, desc: &ArrayDesc, levels: u32) -> BResult<Obj>;
    /// A level's array, which goes with the mipmapped array.
    fn mipmap_level(&self, ctx: Obj, mipmap: Obj, level: u32) -> BResult<Obj>;
    fn mipmap_destroy(&self, ctx: Obj, mipmap: Obj) -> BResult<()>;
    /// A 2D or 3D copy, or a linear one to or from an array.
    ///
    /// # Safety
    /// Host ends are valid for the rows the copy reads or writes.
    unsafe fn memcpy_3d(&self, ctx: Obj, copy: &Copy3D, stream: Obj, sync: bool) -> BResult<()>;
    /// A texture object over `res`; `tex` and `view` are the C structures'
    /// bytes, of their exact sizes.
    fn tex_object_create(&self, ctx: Obj, res: &ResourceDesc, tex: &[u8], view: Option<&[u8]>) -> BResult<u64>;
    fn tex_object_destroy(&self, ctx: Obj, object: u64) -> BResult<()>;
    fn surf_object_create(&self, ctx: Obj, res: &ResourceDesc) -> BResult<u64>;
    fn surf_object_destroy(&self, ctx: Obj, object: u64) -> BResult<()>;
}

/// Stream-ordered allocation from memory pools; locations name backend devices.
pub trait Pools {
    fn mem_pool_create(&self, ctx: Option<Obj>, props: &PoolProps) -> BResult<Obj>;
    fn mem_pool_destroy(&self, pool: Obj) -> BResult<()>;
    fn mem_alloc_from_pool(&self, ctx: Obj, size: u64, pool: Obj, stream: Obj) -> BResult<u64>;
    /// Frees a pool's or `cuMemAlloc`'s allocation once `stream` reaches this point.
    fn mem_free_async(&self, ctx: Obj, ptr: u64, stream: Obj) -> BResult<()>;
    fn mem_pool_trim(&self, pool: Obj, keep: u64) -> BResult<()>;
    /// Attribute values of either C type as u64.
    fn mem_pool_set_attribute(&self, pool: Obj, attr: i32, value: u64) -> BResult<()>;
    fn mem_pool_get_attribute(&self, pool: Obj, attr: i32) -> BResult<u64>;
    fn mem_pool_set_access(&self, pool: Obj, access: &[AccessDesc]) -> BResult<()>;
    fn mem_pool_get_access(&self, pool: Obj, location_kind: u32, location: i32) -> BResult<u64>;
}

/// Modules, libraries, functions and kernels, their launches, and tensor
/// maps for them.
pub trait Modules {
    fn module_load(&self, ctx: Obj, image: &[u8]) -> BResult<Obj>;
    fn module_unload(&self, ctx: Obj, module: Obj) -> BResult<()>;
    /// Links `inputs` (each a `CUjitInputType` and its bytes) with the JIT
    /// `options` (codes and unsigned values) in `ctx`. A link the driver
    /// refuses is an answer too, with its status and logs.
    fn link(&self, ctx: Obj, options: &[(u32, u64)], inputs: &[(u32, &[u8])]) -> BResult<Linked>;
    fn module_get_function(&self, ctx: Obj, module: Obj, name: &str) -> BResult<Obj>;
    /// `(address, size)` of a `__device__` variable.
    fn module_get_global(&self, ctx: Obj, module: Obj, name: &str) -> BResult<(u64, u64)>;
    fn module_function_count(&self, ctx: Obj, module: Obj) -> BResult<u32>;
    /// Every function of the module, as `module_get_function` names them.
    fn module_functions(&self, ctx: Obj, module: Obj) -> BResult<Vec<Obj>>;
    fn module_loading_mode(&self) -> BResult<i32>;
    /// Libraries belong to no context.
    fn library_load(&self, image: &[u8]) -> BResult<Obj>;
    fn library_unload(&self, library: Obj) -> BResult<()>;
    fn library_get_kernel(&self, library: Obj, name: &str) -> BResult<Obj>;
    fn library_get_module(&self, ctx: Obj, library: Obj) -> BResult<Obj>;
    fn library_get_global(&self, ctx: Obj, library: Obj, name: &str) -> BResult<(u64, u64)>;
    fn library_kernel_count(&self, library: Obj) -> BResult<u32>;
    /// The kernel's function in `ctx`.
    fn kernel_get_function(&self, ctx: Obj, kernel: Obj) -> BResult<Obj>;
    fn param_layout(&self, ctx: Obj, func: Obj) -> BResult<Vec<ParamSlot>>;
    /// The function's name, as its image has it (mangled).
    fn func_name(&self, ctx: Obj, func: Obj) -> BResult<String>;
    fn func_get_attribute(&self, ctx: Obj, func: Obj, attr: i32) -> BResult<i32>;
    fn func_set_attribute(&self, ctx: Obj, func: Obj, attr: i32, value: i32) -> BResult<()>;
    fn func_set_cache_config(&self, ctx: Obj, func: Obj, config: i32) -> BResult<()>;
    fn kernel_get_attribute(&self, kernel: Obj, attr: i32, dev: i32) -> BResult<i32>;
    fn kernel_set_attribute(&self, kernel: Obj, attr: i32, value: i32, dev: i32) -> BResult<()>;
    fn kernel_set_cache_config(&self, kernel: Obj, config: i32, dev: i32) -> BResult<()>;
    fn occupancy_max_active_blocks(&self, ctx: Obj, func: Obj, block: i32, smem: u64, flags: u32) -> BResult<i32>;
    fn occupancy_available_smem(&self, ctx: Obj, func: Obj, blocks: i32, block: i32) -> BResult<u64>;
    /// `(min_grid, block)`.
    fn occupancy_max_potential_block_size(
        &self,
        ctx: Obj,
        func: Obj,
        smem: u64,
        limit: i32,
        flags: u32,
    ) -> BResult<(i32, i32)>;
    /// `cuOccupancyMaxActiveClusters` or `cuOccupancyMaxPotentialClusterSize`
    /// for `launch`.
    fn occupancy_clusters(&self, ctx: Obj, func: Obj, launch: &Launch, query: ClusterQuery) -> BResult<i32>;
    /// `params` is packed by the function's layout.
    fn launch(&self, ctx: Obj, func: Obj, launch: &Launch, params: &[u8]) -> BResult<()>;
    /// A tensor map, as the driver encodes it for the device.
    fn tensor_map_encode(&self, map: &TensorMap) -> BResult<TensorMapBytes>;
    /// `map` with its global address replaced.
    fn tensor_map_replace_address(&self, map: &TensorMapBytes, address: u64) -> BResult<TensorMapBytes>;
}

/// Streams and events.
pub trait Streams {
    fn stream_create(&self, ctx: Obj, flags: u32, priority: i32) -> BResult<Obj>;
    fn stream_destroy(&self, ctx: Obj, stream: Obj) -> BResult<()>;
    fn stream_synchronize(&self, ctx: Obj, stream: Obj) -> BResult<()>;
    fn stream_query(&self, ctx: Obj, stream: Obj) -> BResult<()>;
    fn stream_wait_event(&self, ctx: Obj, stream: Obj, event: Obj, flags: u32) -> BResult<()>;
    fn stream_id(&self, ctx: Obj, stream: Obj) -> BResult<u64>;
    /// `CUstreamCaptureStatus` (0: not capturing).
    fn stream_capture_status(&self, ctx: Obj, stream: Obj) -> BResult<u32>;
    /// Fails if `stream` is capturing, and invalidates its capture, as the
    /// driver does with work a graph cannot hold: `what` names it.
    fn refuse_in_capture(&self, ctx: Obj, stream: Obj, what: &str) -> BResult<()>;
    fn event_create(&self, ctx: Obj, flags: u32) -> BResult<Obj>;
    fn event_destroy(&self, ctx: Obj, event: Obj) -> BResult<()>;
    fn event_record(&self, ctx: Obj, event: Obj, stream: Obj, flags: u32) -> BResult<()>;
    fn event_synchronize(&self, ctx: Obj, event: Obj) -> BResult<()>;
    fn event_query(&self, ctx: Obj, event: Obj) -> BResult<()>;
    fn event_elapsed(&self, ctx: Obj, start: Obj, end: Obj) -> BResult<f32>;
    /// Runs `f` once the stream's earlier work is done (and, while the
    /// stream captures, makes it a host node).
    fn launch_host_func(&self, ctx: Obj, stream: Obj, f: HostFn) -> BResult<()>;
}

/// Graphs. Capture is the driver's: work a capturing stream is given is
/// recorded in its graph, not run. Graph memory's locations name backend
/// devices.
pub trait Graphs {
    // recorded in its graph, not run.
    fn stream_begin_capture(&self, ctx: Obj, stream: Obj, mode: u32) -> BResult<()>;
    /// A capture into `graph`, its first work after `deps` (with edge data
    /// `data`, or default edges where empty).
    fn stream_begin_capture_to_graph(
        &self,
        ctx: Obj,
        stream: Obj,
        graph: Obj,
        deps: &[Obj],
        data: &[u64],
        mode: u32,
    ) -> BResult<()>;
    /// The captured graph.
    fn stream_end_capture(&self, ctx: Obj, stream: Obj) -> BResult<Obj>;
    /// `edges`: the dependencies' edge data too.
    fn stream_capture_info(&self, ctx: Obj, stream: Obj, edges: bool) -> BResult<CaptureInfo>;
    /// Sets the calling thread's capture mode; returns the one it had.
    fn exchange_capture_mode(&self, mode: u32) -> BResult<u32>;
    /// Adds to (`flags` 0) or replaces (1) the nodes a capturing stream's
    /// next work depends on.
    fn stream_update_capture_deps(&self, ctx: Obj, stream: Obj, deps: &[Obj], flags: u32) -> BResult<()>;
    fn graph_create(&self, flags: u32) -> BResult<Obj>;
    fn graph_destroy(&self, graph: Obj) -> BResult<()>;
    fn graph_instantiate(&self, ctx: Obj, graph: Obj, flags: u64) -> BResult<Obj>;
    fn graph_exec_destroy(&self, exec: Obj) -> BResult<()>;
    fn graph_launch(&self, ctx: Obj, exec: Obj, stream: Obj) -> BResult<()>;
    fn graph_upload(&self, ctx: Obj, exec: Obj, stream: Obj) -> BResult<()>;
    /// The graph's nodes, or only those that depend on none (`roots`).
    fn graph_nodes(&self, graph: Obj, roots: bool) -> BResult<Vec<Obj>>;
    /// A node of `graph` after `deps`, made in `ctx`.
    ///
    /// # Safety
    /// A memcpy node's host ends stay valid while the graph may run.
    unsafe fn graph_add_node(&self, ctx: Obj, graph: Obj, deps: &[Obj], node: &NodeWork<'_>) -> BResult<Obj>;
    /// Adds (or with `remove`, removes) the edges `from[i] -> to[i]`, each
    /// with `data[i]` (a `CUgraphEdgeData`), or all default where `data` is empty.
    fn graph_dependencies(&self, graph: Obj, from: &[Obj], to: &[Obj], data: &[u64], remove: bool) -> BResult<()>;
    /// `graph` described in DOT, as `cuGraphDebugDotPrint` writes it.
    fn graph_debug_dot(&self, graph: Obj, flags: u32) -> BResult<Vec<u8>>;
    /// Every edge of `graph`, as `(from, to, data)`.
    fn graph_edges(&self, graph: Obj) -> BResult<Vec<(Obj, Obj, u64)>>;
    /// The nodes `node` depends on, or with `dependents` those depending on
    /// it, each with its edge's data.
    fn graph_node_edges(&self, node: Obj, dependents: bool) -> BResult<Vec<(Obj, u64)>>;
    /// New work for a kernel, host, memcpy, memset or event node, of the
    /// node's kind, in its graph or (`exec`) in an executable graph made from it.
    ///
    /// # Safety
    /// As for [`Graphs::graph_add_node`].
    unsafe fn graph_node_set(&self, ctx: Obj, node: Obj, exec: Option<Obj>, work: &NodeWork<'_>) -> BResult<()>;
    fn graph_clone(&self, graph: Obj) -> BResult<Obj>;
    fn graph_node_find_in_clone(&self, node: Obj, clone: Obj) -> BResult<Obj>;
    fn graph_destroy_node(&self, node: Obj) -> BResult<()>;
    /// `cuGraphExecUpdate`: its outcome, and what `CUgraphExecUpdateResultInfo` says.
    fn graph_exec_update(&self, ctx: Obj, exec: Obj, graph: Obj) -> BResult<ExecUpdate>;
    /// A memory allocation node of `graph` after `deps`: `(node, address)`.
    fn graph_add_mem_alloc_node(&self, ctx: Obj, graph: Obj, deps: &[Obj], alloc: &GraphAlloc) -> BResult<(Obj, u64)>;
    /// An allocation node's parameters, its address included.
    fn graph_mem_alloc_node_params(&self, node: Obj) -> BResult<GraphAlloc>;
    /// A child graph node's graph, which belongs to the node.
    fn graph_child_graph(&self, node: Obj) -> BResult<Obj>;
    /// A memset node's parameters.
    fn graph_memset_node_params(&self, node: Obj) -> BResult<Memset>;
    /// A user object of `refs` references whose destructor is `destroy`.
    fn user_object_create(&self, destroy: HostFn, refs: u32, flags: u32) -> BResult<Obj>;
    /// A memcpy node's copy, its host ends where the backend was given them.
    fn graph_memcpy_node_params(&self, node: Obj) -> BResult<Copy3D>;
    /// Sets a `CUgraphMem_attribute` of the device (every one a `cuuint64_t`).
    fn graph_mem_set_attribute(&self, dev: i32, attr: i32, value: u64) -> BResult<()>;
    /// A conditional node of `graph` after `deps`, run in `ctx`: the node
    /// and the body graphs the driver made for it, which belong to the node.
    fn graph_add_conditional_node(
        &self,
        ctx: Obj,
        graph: Obj,
        deps: &[Obj],
        cond: &Conditional,
    ) -> BResult<(Obj, Vec<Obj>)>;
}

/// Memory and events shared between processes by handle.
pub trait Ipc {
    /// The IPC handle of the allocation at `dptr` (its base).
    fn ipc_get_mem_handle(&self, ctx: Obj, dptr: u64) -> BResult<IpcHandle>;
    /// Maps the memory an IPC handle names into `ctx`: `(address, size)`.
    fn ipc_open_mem_handle(&self, ctx: Obj, handle: &IpcHandle, flags: u32) -> BResult<(u64, u64)>;
    fn ipc_close_mem_handle(&self, ctx: Obj, dptr: u64) -> BResult<()>;
    /// The IPC handle of an event made for sharing.
    fn ipc_get_event_handle(&self, ctx: Obj, event: Obj) -> BResult<IpcHandle>;
    fn ipc_open_event_handle(&self, ctx: Obj, handle: &IpcHandle) -> BResult<Obj>;
}

/// The families of [`Backend`] in scope, unnamed, for calling their methods
/// on a concrete backend (a `dyn Backend` needs none of them).
pub mod prelude {
    pub use super::{
        Arrays as _, Contexts as _, Graphs as _, Ipc as _, Memory as _, Modules as _, Pools as _, Streams as _,
        VirtualMemory as _,
    };
}

/// What a link made: the driver's status, its image (on success) and logs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Linked {
    /// The `CUresult`: 0 where the link succeeded.
    pub status: u32,
    pub image: Vec<u8>,
    pub info_log: Vec<u8>,
    pub error_log: Vec<u8>,
}

/// A conditional node's parameters (`CUDA_CONDITIONAL_NODE_PARAMS` less
/// its context and output).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conditional {
    /// A handle `cuGraphConditionalHandleCreate` made.
    pub handle: u64,
    /// `CUgraphConditionalNodeType`: if (0), while (1), switch (2).
    pub kind: u32,
    /// How many body graphs: 1 for while, 1 or 2 (with else) for if, any
    /// above 0 for switch.
    pub size: u32,
}

/// A graph memory allocation node's parameters (`CUDA_MEM_ALLOC_NODE_PARAMS`).
#[derive(Clone, Debug, PartialEq)]
pub struct GraphAlloc {
    pub props: PoolProps,
    pub access: Vec<AccessDesc>,
    pub bytes: u64,
    /// The address the driver gave; 0 before the node is made.
    pub dptr: u64,
}

/// What a graph node built by hand does.
#[derive(Clone, Copy, Debug)]
pub enum NodeWork<'a> {
    /// `launch`'s stream is unused.
    Kernel {
        func: Obj,
        launch: &'a Launch,
        params: &'a [u8],
    },
    Memcpy(&'a Copy3D),
    Memset(&'a Memset),
    Empty,
    Child(Obj),
    Event {
        event: Obj,
        wait: bool,
    },
    Host(HostFn),
    /// Frees graph memory at this address.
    MemFree(u64),
}

/// A host function as the driver calls it: `run(data)`.
#[derive(Clone, Copy, Debug)]
pub struct HostFn {
    pub run: unsafe extern "C" fn(*mut std::ffi::c_void),
    pub data: *mut std::ffi::c_void,
}

// SAFETY: `data` is what `run` takes, valid on any thread: the session
// keeps it alive while its graphs and streams may call it.
unsafe impl Send for HostFn {}

/// What `cuGraphExecUpdate` says: the call's own result, and
/// `CUgraphExecUpdateResultInfo`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecUpdate {
    pub status: u32,
    pub result: u32,
    pub error_node: Obj,
    pub error_from: Obj,
}

/// What `cuStreamGetCaptureInfo` tells of a stream.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CaptureInfo {
    /// `CUstreamCaptureStatus`: 0 none, 1 active, 2 invalidated.
    pub status: u32,
    pub id: u64,
    /// The graph being captured, null when none.
    pub graph: Obj,
    /// The nodes the next work captured in the stream will depend on.
    pub deps: Vec<Obj>,
    /// Their edge data (`CUgraphEdgeData`, 8 bytes each), where asked for.
    pub edges: Vec<u64>,
}
