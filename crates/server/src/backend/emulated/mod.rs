//! A host-memory test device, for machines without a GPU.
//!
//! It keeps the driver's bookkeeping exactly — contexts, allocations and
//! their bounds, modules parsed from real fatbins and cubins (parameter
//! layouts from `.nv.info`), libraries, streams, events — so that the whole
//! remoting path is tested in CI. It is honest about kernels: a launch runs
//! only if [`kernels`] holds a reference implementation for that kernel's
//! name; anything else fails with `CUDA_ERROR_NOT_SUPPORTED`. Work runs
//! synchronously at call time, which is one valid ordering of every stream.
//! A kernel fault becomes the context's sticky error, as on a GPU.

mod arrays;
mod device;
mod graph;

pub mod kernels;
mod memory;
mod passthrough;
mod pools;
mod tensor_maps;
mod vmm;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use gpuplex_protocol::{
    AccessDesc, AllocProp, ArrayDesc, CallError, CuError, DeviceInfo, Passthrough, PoolProps, ResourceDesc,
    LINK_INPUT_CUBIN, LINK_INPUT_FATBIN, LINK_INPUT_PTX,
};

use super::{
    BResult, Backend, CaptureInfo, ClusterQuery, Conditional, Copy3D, ExecUpdate, GraphAlloc, HostFn, IpcHandle,
    Launch, Linked, Memset, NodeWork, Obj, ParamSlot, TensorMap, TensorMapBytes, CU_EVENT_DISABLE_TIMING,
};
use crate::image::{self, Image, KernelInfo};
use arrays::{Arrays, Device};
use graph::{ConditionalWork, Graphs, Work};
use kernels::KernelLaunch;
use memory::{Memory, Owner};
use pools::Pools;
use vmm::Vmm;

pub struct Emulated {
    devices: Vec<DeviceInfo>,
    state: Mutex<State>,
}

struct State {
    next: u64,
    memory: Memory,
    contexts: HashMap<u64, Context>,
    modules: HashMap<u64, Module>,
    functions: HashMap<u64, Function>,
    libraries: HashMap<u64, Library>,
    kernels: HashMap<u64, KernelRef>,
    streams: HashMap<u64, StreamState>,
    events: HashMap<u64, EventState>,
    vmm: Vmm,
    pools: Pools,
    arrays: Arrays,
    graphs: Graphs,
}

struct Context {
    flags: u32,
    cache_config: i32,
    limits: [u64; 7],
    /// Set by a kernel fault; every later call in the context fails with it.
    sticky: Option<CuError>,
}

struct Module {
    ctx: u64,
    image: Arc<Image>,
    globals: HashMap<String, (u64, u64)>,
    functions: HashMap<String, u64>,
}

struct Function {
    ctx: u64,
    kernel: KernelInfo,
    max_dynamic_shared: i32,
    carveout: i32,
    /// Attributes 11 to 15: required cluster width, height, depth,
    /// non-portable cluster sizes allowed, cluster scheduling preference.
    cluster: [i32; 5],
}

impl Function {
    fn new(ctx: u64, kernel: KernelInfo) -> Function {
        let max_dynamic_shared = (device::SHARED_PER_BLOCK - kernel.shared_bytes.min(device::SHARED_PER_BLOCK)) as i32;
        Function { ctx, kernel, max_dynamic_shared, carveout: -1, cluster: [0; 5] }
    }

    /// The most threads a block of this function may have: its launch
    /// bounds, within the device's limit.
    fn max_threads(&self) -> u32 {
        self.kernel.max_threads_per_block.unwrap_or(device::MAX_THREADS_PER_BLOCK).min(device::MAX_THREADS_PER_BLOCK)
    }

    /// `cuFuncGetAttribute`.
    fn attribute(&self, attr: i32) -> BResult<i32> {
        let k = &self.kernel;
        Ok(match attr {
            0 => self.max_threads() as i32,
            1 => k.shared_bytes as i32,
            4 => k.registers as i32,
            5 | 6 => 90,
            8 => self.max_dynamic_shared,
            9 => self.carveout,
            11..=15 => self.cluster[attr as usize - 11],
            2 | 3 | 7 | 10 => 0,
            _ => return Err(CuError::INVALID_VALUE.into()),
        })
    }

    /// `cuFuncSetAttribute`: the settable attributes.
    fn set_attribute(&mut self, attr: i32, value: i32) -> BResult<()> {
        match attr {
            // In u64: an image may declare any static size.
            8 if value >= 0
                && value as u64 + self.kernel.shared_bytes as u64 <= device::SHARED_PER_BLOCK_OPTIN as u64 =>
            {
                self.max_dynamic_shared = value
            }
            9 if (-1..=100).contains(&value) => self.carveout = value,
            11..=13 if value >= 0 => self.cluster[attr as usize - 11] = value,
            14 if (0..=1).contains(&value) => self.cluster[3] = value,
            15 if (0..=2).contains(&value) => self.cluster[4] = value,
            0..=7 | 10 => return Err(err(CuError::INVALID_VALUE, format!("function attribute {attr} is read-only"))),
            _ => return Err(CuError::INVALID_VALUE.into()),
        }
        Ok(())
    }
}

struct Library {
    image: Arc<Image>,
    kernels: HashMap<String, u64>,
    /// The library's module in each context that used it.
    modules: HashMap<u64, u64>,
    /// Its `__managed__` variables asked for, `(address, size)` by name.
    managed: HashMap<String, (u64, u64)>,
}

struct KernelRef {
    library: u64,
    name: String,
    /// `(attribute, value)` set by cuKernelSetAttribute, in order: they hold
    /// for the kernel's function in every context, now and later.
    set: Vec<(i32, i32)>,
}

struct StreamState {
    ctx: u64,
    flags: u32,
    priority: i32,
    /// Attributes set, by id: kept and given back, having no effect here.
    attributes: HashMap<u32, [u8; 64]>,
}

struct EventState {
    ctx: u64,
    flags: u32,
    recorded: Option<Instant>,
}

const DEFAULT_LIMITS: [u64; 7] = [1024, 1 << 20, 8 << 20, 2, 2048, 64, 0];

/// Stream attributes (`CUstreamAttrID`): an access policy window, a
/// synchronization policy, a priority, memory synchronization domains.
pub(super) const STREAM_ATTRIBUTES: [u32; 5] = [1, 3, STREAM_PRIORITY, 9, 10];
pub(super) const STREAM_PRIORITY: u32 = 8;

/// What the driver refuses of a memset before it sets anything.
fn check_memset(op: &Memset) -> BResult<()> {
    if ![1, 2, 4].contains(&op.element_size) {
        return Err(err(CuError::INVALID_VALUE, format!("{}-byte memset elements", op.element_size)));
    }
    if op.height > 1 && op.pitch < op.row_bytes().ok_or(CuError::INVALID_VALUE)? {
        return Err(err(CuError::INVALID_VALUE, "memset rows overlap"));
    }
    Ok(())
}

/// Sets a checked, non-empty memset's bytes.
fn set_memory(memory: &mut Memory, op: &Memset) -> BResult<()> {
    let element = op.value.to_le_bytes();
    let element = &element[..op.element_size as usize];
    let row = op.row_bytes().ok_or(CuError::INVALID_VALUE)?;
    let extent = op.extent().ok_or(CuError::INVALID_VALUE)?;
    let set = |bytes: &mut [u8]| {
        if op.height == 1 || op.pitch == row {
            fill(bytes, element);
        } else {
            // `pitch > row >= 1` and the extent fits in memory: `height` is below its size.
            for start in (0..bytes.len()).step_by(op.pitch as usize) {
                fill(&mut bytes[start..start + row as usize], element);
            }
        }
    };
    if let Some(bytes) = memory.slice_mut(op.dst, extent) {
        set(bytes);
        return Ok(());
    }
    // Across adjacent mappings: set a copy of the extent and write it back.
    let mut bytes = memory::zeroed(extent)?;
    if !memory.read_at(op.dst, &mut bytes) {
        return Err(CuError::INVALID_VALUE.into());
    }
    set(&mut bytes);
    memory.write_at(op.dst, &bytes).then_some(()).ok_or_else(|| CuError::INVALID_VALUE.into())
}

/// Copies `size` bytes between device addresses (registered host memory
/// has one), across adjacent blocks.
fn copy_memory(memory: &mut Memory, dst: u64, src: u64, size: u64) -> BResult<()> {
    let mut bytes = memory::zeroed(size)?;
    let copied = memory.read_at(src, &mut bytes) && memory.write_at(dst, &bytes);
    copied.then_some(()).ok_or_else(|| CuError::INVALID_VALUE.into())
}

fn err(code: CuError, detail: impl Into<String>) -> CallError {
    CallError::new(code, detail)
}

impl Emulated {
    pub fn new() -> Emulated {
        Emulated {
            devices: vec![device::info()],
            state: Mutex::new(State {
                next: 0x1_0000,
                memory: Memory::new(device::TOTAL_MEMORY),
                contexts: HashMap::new(),
                modules: HashMap::new(),
                functions: HashMap::new(),
                libraries: HashMap::new(),
                kernels: HashMap::new(),
                streams: HashMap::new(),
                events: HashMap::new(),
                vmm: Vmm::default(),
                pools: Pools::default(),
                arrays: Arrays::default(),
                graphs: Graphs::default(),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a copy between registered host memory (at its own device
    /// address) and the device, if `stream` is capturing.
    fn record_host_copy(&self, ctx: Obj, stream: Obj, dst: u64, src: u64, len: usize) -> Option<BResult<()>> {
        let mut s = self.state();
        if let Err(e) = s.stream(ctx, stream) {
            return Some(Err(e));
        }
        s.graphs.record(stream, Work::Copy { dst, src, size: len as u64 })
    }
}

impl Default for Emulated {
    fn default() -> Self {
        Emulated::new()
    }
}

impl State {
    fn id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// A live context without a sticky error.
    fn ctx(&mut self, ctx: Obj) -> BResult<&mut Context> {
        let c = self.contexts.get_mut(&ctx.0).ok_or_else(|| err(CuError::INVALID_CONTEXT, "unknown context"))?;
        match c.sticky {
            Some(e) => Err(err(e, "the context has a sticky error from an earlier kernel")),
            None => Ok(c),
        }
    }

    fn stream(&mut self, ctx: Obj, stream: Obj) -> BResult<()> {
        self.ctx(ctx)?;
        if stream.0 > 2 && !self.streams.contains_key(&stream.0) {
            return Err(err(CuError::INVALID_HANDLE, "unknown stream"));
        }
        Ok(())
    }

    fn event(&mut self, event: Obj) -> BResult<&mut EventState> {
        self.events.get_mut(&event.0).ok_or_else(|| err(CuError::INVALID_HANDLE, "unknown event"))
    }

    fn function(&self, func: Obj) -> BResult<&Function> {
        self.functions.get(&func.0).ok_or_else(|| err(CuError::INVALID_HANDLE, "unknown function"))
    }

    fn load_module(&mut self, ctx: u64, image: Arc<Image>) -> BResult<u64> {
        let id = self.id();
        let mut globals = HashMap::new();
        for g in &image.globals {
            match self.memory.alloc(g.size.max(1), Owner::Global { module: id }, &g.init) {
                Ok(addr) => {
                    globals.insert(g.name.clone(), (addr, g.size));
                }
                Err(e) => {
                    self.memory.free_where(|o| o == Owner::Global { module: id });
                    return Err(e.into());
                }
            }
        }
        self.modules.insert(id, Module { ctx, image, globals, functions: HashMap::new() });
        Ok(id)
    }

    fn unload_module(&mut self, id: u64) {
        if let Some(m) = self.modules.remove(&id) {
            for f in m.functions.values() {
                self.functions.remove(f);
            }
            self.memory.free_where(|o| o == Owner::Global { module: id });
        }
    }

    fn module_function(&mut self, module: u64, name: &str) -> BResult<u64> {
        let m = self.modules.get(&module).ok_or_else(|| err(CuError::INVALID_HANDLE, "unknown module"))?;
        if let Some(&f) = m.functions.get(name) {
            return Ok(f);
        }
        let kernel = m
            .image
            .kernels
            .iter()
            .find(|k| k.name == name)
            .cloned()
            .ok_or_else(|| err(CuError::NOT_FOUND, format!("no kernel {name:?} in the module")))?;
        let ctx = m.ctx;
        let id = self.id();
        self.functions.insert(id, Function::new(ctx, kernel));
        if let Some(m) = self.modules.get_mut(&module) {
            m.functions.insert(name.to_owned(), id);
        }
        Ok(id)
    }

    /// The library's module in `ctx`, loaded on first use as the driver's
    /// lazy loading does.
    fn library_module(&mut self, ctx: u64, library: Obj) -> BResult<u64> {
        let lib = self.libraries.get(&library.0).ok_or_else(|| err(CuError::INVALID_HANDLE, "unknown library"))?;
        if let Some(&m) = lib.modules.get(&ctx) {
            return Ok(m);
        }
        let image = lib.image.clone();
        let m = self.load_module(ctx, image)?;
        if let Some(lib) = self.libraries.get_mut(&library.0) {
            lib.modules.insert(ctx, m);
        }
        Ok(m)
    }

    fn global(&self, module: u64, name: &str) -> BResult<(u64, u64)> {
        let m = self.modules.get(&module).ok_or_else(|| err(CuError::INVALID_HANDLE, "unknown module"))?;
        m.globals.get(name).copied().ok_or_else(|| err(CuError::NOT_FOUND, format!("no global {name:?} in the module")))
    }

    /// Checks a launch as the driver does before it queues one.
    /// The reference implementation of a launch of `func` in `ctx`, once the
    /// launch is checked as the driver would check it.
    fn kernel(&self, ctx: Obj, func: Obj, launch: &Launch) -> BResult<kernels::ReferenceKernel> {
        let f = self.function(func)?;
        if f.ctx != ctx.0 {
            return Err(err(CuError::INVALID_HANDLE, "function belongs to another context"));
        }
        self.check_launch(f, launch)?;
        let name = &f.kernel.name;
        kernels::lookup(name).ok_or_else(|| {
            err(
                CuError::NOT_SUPPORTED,
                format!(
                    "kernel {name} cannot run: the emulated backend is a host-memory test device, not a GPU, and \
                     runs only the reference kernels of gpuplex's own tests (use --backend cuda on a GPU machine)"
                ),
            )
        })
    }

    /// Runs a launch `kernel` has checked. A fault is the context's sticky
    /// error, as a GPU reports it later: the launch itself succeeded.
    fn run_kernel(&mut self, ctx: Obj, func: Obj, launch: &Launch, params: &[u8]) -> BResult<()> {
        let run = self.kernel(ctx, func, launch)?;
        let f = self.function(func)?;
        let (name, layout) = (f.kernel.name.clone(), f.kernel.params.clone());
        let k = KernelLaunch {
            grid: launch.grid,
            block: launch.block,
            shared_mem: launch.shared_mem,
            params,
            layout: &layout,
        };
        let mut device =
            Device { memory: &mut self.memory, arrays: &mut self.arrays, conditions: &mut self.graphs.conditions };
        match run(&k, &mut device) {
            Ok(()) => Ok(()),
            Err(fault) if fault == CuError::ILLEGAL_ADDRESS || fault == CuError::ASSERT => {
                self.ctx(ctx)?.sticky = Some(fault);
                Ok(())
            }
            Err(e) => Err(err(e, format!("reference kernel {name:?} refused its arguments"))),
        }
    }

    /// Runs an executable graph's work in order; the first failure ends it.
    fn run_graph(&mut self, ctx: Obj, work: Vec<Work>) -> BResult<()> {
        for w in work {
            match w {
                Work::Kernel { func, launch, params } => self.run_kernel(ctx, func, &launch, &params)?,
                Work::Memset(op) => set_memory(&mut self.memory, &op)?,
                Work::Copy { dst, src, size } => copy_memory(&mut self.memory, dst, src, size)?,
                // SAFETY: a memcpy node's host ends are registered host
                // memory, which the session keeps (or guards) while its
                // graphs may run.
                Work::Copy3D(c) => unsafe { self.arrays.copy(&mut self.memory, &c)? },
                Work::Event { event, wait: false } => self.event(Obj(event))?.recorded = Some(Instant::now()),
                // Everything before it has run already.
                Work::Event { wait: true, .. } | Work::Empty | Work::MemAlloc(_) | Work::MemFree(_) => {}
                // SAFETY: the session's function and data, kept while its graphs live.
                Work::Host(f) => unsafe { (f.run)(f.data) },
                Work::Child(work) => {
                    // The child graph's work, in its own order.
                    self.run_graph(ctx, work.into_iter().map(|(_, w)| w).collect())?;
                }
                Work::Conditional(c) => self.run_conditional(ctx, &c)?,
            }
            self.ctx(ctx)?;
        }
        Ok(())
    }

    /// Runs the body a conditional node's value picks; a while node's again
    /// for as long as its value stays true.
    fn run_conditional(&mut self, ctx: Obj, c: &ConditionalWork) -> BResult<()> {
        let body = |s: &mut Self, i: usize| match c.bodies.get(i) {
            Some(work) => s.run_graph(ctx, work.iter().map(|(_, w)| w.clone()).collect()),
            None => Ok(()),
        };
        let value = |s: &Self| s.graphs.conditions.value(c.handle);
        match c.kind {
            graph::IF => body(self, if value(self)? != 0 { 0 } else { 1 }),
            graph::SWITCH => body(self, value(self)? as usize),
            _ => {
                // The device is locked while a graph runs: a loop that
                // never ends is refused instead of hanging every guest.
                for _ in 0..MAX_ROUNDS {
                    if value(self)? == 0 {
                        return Ok(());
                    }
                    body(self, 0)?;
                }
                Err(err(
                    CuError::NOT_SUPPORTED,
                    format!("a while node ran {MAX_ROUNDS} rounds, as many as the emulated device runs"),
                ))
            }
        }
    }

    fn check_launch(&self, f: &Function, launch: &Launch) -> BResult<()> {
        let bad = |what: String| Err(err(CuError::INVALID_VALUE, what));
        let threads: u64 = launch.block.iter().map(|&d| d as u64).product();
        if launch.block.iter().zip(device::MAX_BLOCK).any(|(&d, max)| d == 0 || d > max)
            || threads > f.max_threads() as u64
        {
            return bad(format!("block {:?} exceeds the device's limits", launch.block));
        }
        if launch.grid.iter().zip(device::MAX_GRID).any(|(&d, max)| d == 0 || d > max) {
            return bad(format!("grid {:?} exceeds the device's limits", launch.grid));
        }
        if launch.shared_mem as i64 > f.max_dynamic_shared as i64 {
            return bad(format!("{} bytes of dynamic shared memory", launch.shared_mem));
        }
        Ok(())
    }

    fn destroy_context(&mut self, ctx: u64) {
        self.contexts.remove(&ctx);
        let modules: Vec<u64> = self.modules.iter().filter(|(_, m)| m.ctx == ctx).map(|(id, _)| *id).collect();
        for m in modules {
            self.unload_module(m);
        }
        for lib in self.libraries.values_mut() {
            lib.modules.remove(&ctx);
        }
        self.streams.retain(|_, s| s.ctx != ctx);
        self.events.retain(|_, e| e.ctx != ctx);
        self.graphs.context_gone(ctx);
        self.arrays.context_gone(&mut self.memory, ctx);
        self.memory.free_where(|o| o == Owner::Alloc { ctx } || o == Owner::Host { ctx });
    }
}

/// `CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE`, the one flag occupancy queries take.
const OCCUPANCY_FLAGS: u32 = 0x1;

/// `CU_EVENT_INTERPROCESS`.
const CU_EVENT_INTERPROCESS: u32 = 0x4;

/// The test device's IPC handle of an object of `kind` (1 memory, 2 event).
fn ipc_handle(kind: u8, object: u64) -> IpcHandle {
    let mut h = [0u8; 64];
    h[..16].copy_from_slice(b"gpuplex emulated");
    h[16] = kind;
    h[24..32].copy_from_slice(&object.to_le_bytes());
    h[32..36].copy_from_slice(&std::process::id().to_le_bytes());
    h
}

/// The most rounds one while node runs on the test device.
const MAX_ROUNDS: u32 = 1 << 16;

fn check_occupancy_flags(flags: u32) -> BResult<()> {
    if flags & !OCCUPANCY_FLAGS != 0 {
        return Err(err(CuError::INVALID_VALUE, format!("occupancy flags {flags:#x}")));
    }
    Ok(())
}

/// Blocks of `block` threads with `smem` bytes of dynamic shared memory each
/// that fit on one multiprocessor, counted as CUDA's occupancy calculator
/// (`cuda_occupancy.h`) counts them. A block size no launch on this device
/// can have is INVALID_VALUE; one the function cannot launch with (past its
/// launch bounds, or with more dynamic shared memory than it may use) fits
/// no block. Counted in u64: sizes come from the guest, and so do the
/// registers and static shared memory of its images.
fn occupancy(f: &Function, block: i32, smem: u64) -> BResult<u32> {
    let threads = u32::try_from(block).ok().filter(|t| (1..=device::MAX_THREADS_PER_BLOCK).contains(t));
    let threads = threads.ok_or_else(|| err(CuError::INVALID_VALUE, format!("a block of {block} threads")))?;
    if threads > f.max_threads() || smem > f.max_dynamic_shared as u64 {
        return Ok(0);
    }
    let warp_threads = threads.div_ceil(32) as u64 * 32;
    let by_threads = device::THREADS_PER_SM as u64 / warp_threads;
    let shared = f.kernel.shared_bytes as u64 + smem;
    let by_shared = (device::SHARED_PER_SM as u64).checked_div(shared).unwrap_or(u64::MAX);
    let by_regs = device::REGISTERS_PER_SM as u64 / (f.kernel.registers.max(1) as u64 * warp_threads);
    Ok(by_threads.min(by_shared).min(by_regs).min(device::BLOCKS_PER_SM as u64) as u32)
}

/// Fills `bytes` (a whole number of elements) with `element` repeated, by
/// doubling copies: a loop per element took 25 s to set 512 MiB in the
/// unoptimized server the end-to-end tests run.
fn fill(bytes: &mut [u8], element: &[u8]) {
    let first = element.len().min(bytes.len());
    bytes[..first].copy_from_slice(&element[..first]);
    let mut filled = first;
    while filled < bytes.len() {
        let n = filled.min(bytes.len() - filled);
        bytes.copy_within(..n, filled);
        filled += n;
    }
}

impl Backend for Emulated {
    fn kind(&self) -> &'static str {
        "emulated"
    }

    fn driver_version(&self) -> i32 {
        13000
    }

    fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }

    fn can_access_peer(&self, _dev: i32, _peer: i32) -> BResult<i32> {
        Ok(0)
    }

    fn ctx_create(&self, _dev: i32, flags: u32) -> BResult<Obj> {
        let mut s = self.state();
        let id = s.id();
        s.contexts.insert(id, Context { flags, cache_config: 0, limits: DEFAULT_LIMITS, sticky: None });
        Ok(Obj(id))
    }

    fn ctx_destroy(&self, ctx: Obj) -> BResult<()> {
        let mut s = self.state();
        if !s.contexts.contains_key(&ctx.0) {
            return Err(err(CuError::INVALID_CONTEXT, "unknown context"));
        }
        s.destroy_context(ctx.0);
        Ok(())
    }

    fn ctx_synchronize(&self, ctx: Obj) -> BResult<()> {
        let s = &mut *self.state();
        s.ctx(ctx)?;
        s.graphs.refuse_any("a wait for the context")?;
        s.pools.release(&mut s.memory);
        Ok(())
    }

    fn ctx_api_version(&self, ctx: Obj) -> BResult<u32> {
        self.state().ctx(ctx).map(|_| 3020)
    }

    fn ctx_get_flags(&self, ctx: Obj) -> BResult<u32> {
        self.state().ctx(ctx).map(|c| c.flags)
    }

    fn ctx_set_flags(&self, ctx: Obj, flags: u32) -> BResult<()> {
        // Whether a context maps host memory is fixed when it is created.
        const CU_CTX_MAP_HOST: u32 = 0x8;
        let mut s = self.state();
        let c = s.ctx(ctx)?;
        c.flags = (c.flags & CU_CTX_MAP_HOST) | (flags & !CU_CTX_MAP_HOST);
        Ok(())
    }

    fn ctx_get_limit(&self, ctx: Obj, limit: i32) -> BResult<u64> {
        let mut s = self.state();
        let c = s.ctx(ctx)?;
        usize::try_from(limit)
            .ok()
            .and_then(|i| c.limits.get(i).copied())
            .ok_or_else(|| CuError::UNSUPPORTED_LIMIT.into())
    }

    fn ctx_set_limit(&self, ctx: Obj, limit: i32, value: u64) -> BResult<()> {
        let mut s = self.state();
        let c = s.ctx(ctx)?;
        let slot = usize::try_from(limit).ok().and_then(|i| c.limits.get_mut(i)).ok_or(CuError::UNSUPPORTED_LIMIT)?;
        *slot = value;
        Ok(())
    }

    fn ctx_get_cache_config(&self, ctx: Obj) -> BResult<i32> {
        self.state().ctx(ctx).map(|c| c.cache_config)
    }

    fn ctx_set_cache_config(&self, ctx: Obj, config: i32) -> BResult<()> {
        if !(0..=3).contains(&config) {
            return Err(CuError::INVALID_VALUE.into());
        }
        self.state().ctx(ctx)?.cache_config = config;
        Ok(())
    }

    fn ctx_stream_priority_range(&self, ctx: Obj) -> BResult<(i32, i32)> {
        self.state().ctx(ctx).map(|_| device::PRIORITY_RANGE)
    }

    fn ctx_id(&self, ctx: Obj) -> BResult<u64> {
        self.state().ctx(ctx).map(|_| ctx.0)
    }

    fn mem_get_info(&self, ctx: Obj) -> BResult<(u64, u64)> {
        let mut s = self.state();
        s.ctx(ctx)?;
        Ok((s.memory.capacity() - s.memory.used(), s.memory.capacity()))
    }

    fn mem_alloc(&self, ctx: Obj, size: u64) -> BResult<u64> {
        let mut s = self.state();
        s.ctx(ctx)?;
        Ok(s.memory.alloc(size, Owner::Alloc { ctx: ctx.0 }, &[])?)
    }

    fn mem_alloc_pitch(&self, ctx: Obj, width: u64, height: u64, element_size: u32) -> BResult<(u64, u64)> {
        if width == 0 || height == 0 || ![4, 8, 16].contains(&element_size) {
            return Err(CuError::INVALID_VALUE.into());
        }
        let pitch = width.checked_next_multiple_of(512).ok_or(CuError::INVALID_VALUE)?;
        let size = pitch.checked_mul(height).ok_or(CuError::INVALID_VALUE)?;
        Ok((self.mem_alloc(ctx, size)?, pitch))
    }

    fn mem_free(&self, ctx: Obj, ptr: u64) -> BResult<()> {
        let s = &mut *self.state();
        s.ctx(ctx)?;
        match s.memory.owner(ptr) {
            Some(Owner::Pooled { pool }) => s.pools.free(&mut s.memory, ptr, pool),
            _ => Ok(s.memory.free(ptr)?),
        }
    }

    fn memcpy_htod(&self, ctx: Obj, dst: u64, src: &[u8], stream: Obj, _sync: bool) -> BResult<()> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        s.memory.write_at(dst, src).then_some(()).ok_or_else(|| CuError::INVALID_VALUE.into())
    }

    fn memcpy_dtoh(&self, ctx: Obj, dst: &mut [u8], src: u64, stream: Obj) -> BResult<()> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        s.memory.read_at(src, dst).then_some(()).ok_or_else(|| CuError::INVALID_VALUE.into())
    }

    fn memcpy_dtod(&self, ctx: Obj, dst: u64, src: u64, size: u64, stream: Obj, _sync: bool) -> BResult<()> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        if let Some(recorded) = s.graphs.record(stream, Work::Copy { dst, src, size }) {
            return recorded;
        }
        copy_memory(&mut s.memory, dst, src, size)
    }

    /// The work is bounded by the bytes set: an empty memset returns at once
    /// whatever its height, and rows may not overlap, so there are never
    /// more rows than bytes. The whole extent is found before any row is
    /// set, so a refused memset sets nothing.
    fn memset(&self, ctx: Obj, op: &Memset, stream: Obj, _sync: bool) -> BResult<()> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        check_memset(op)?;
        if op.is_empty() {
            return Ok(());
        }
        if let Some(recorded) = s.graphs.record(stream, Work::Memset(*op)) {
            return recorded;
        }
        set_memory(&mut s.memory, op)
    }

    fn mem_granularity(&self, ctx: Option<Obj>, prop: &AllocProp, option: u32) -> BResult<u64> {
        let mut s = self.state();
        ctx.map_or(Ok(()), |c| s.ctx(c).map(drop))?;
        s.vmm.granularity(prop, option, self.devices.len())
    }

    fn mem_create(&self, ctx: Option<Obj>, size: u64, prop: &AllocProp, flags: u64) -> BResult<Obj> {
        let s = &mut *self.state();
        ctx.map_or(Ok(()), |c| s.ctx(c).map(drop))?;
        s.vmm.create(&mut s.memory, size, prop, flags, self.devices.len())
    }

    fn mem_release(&self, handle: Obj) -> BResult<()> {
        let s = &mut *self.state();
        s.vmm.release(&mut s.memory, handle)
    }

    fn mem_retain(&self, ptr: u64) -> BResult<Obj> {
        let s = &mut *self.state();
        s.vmm.retain(&s.memory, ptr)
    }

    fn mem_address_reserve(&self, ctx: Option<Obj>, size: u64, alignment: u64, _addr: u64, flags: u64) -> BResult<u64> {
        let s = &mut *self.state();
        ctx.map_or(Ok(()), |c| s.ctx(c).map(drop))?;
        s.vmm.address_reserve(&mut s.memory, size, alignment, flags)
    }

    fn mem_address_free(&self, ptr: u64, size: u64) -> BResult<()> {
        let s = &mut *self.state();
        s.vmm.address_free(&s.memory, ptr, size)
    }

    fn mem_map(&self, ptr: u64, size: u64, offset: u64, handle: Obj, flags: u64) -> BResult<()> {
        let s = &mut *self.state();
        s.vmm.map(&mut s.memory, ptr, size, offset, handle, flags)
    }

    fn mem_unmap(&self, ptr: u64, size: u64) -> BResult<()> {
        let s = &mut *self.state();
        s.vmm.unmap(&mut s.memory, ptr, size)
    }

    fn mem_set_access(&self, ptr: u64, size: u64, access: &[AccessDesc]) -> BResult<()> {
        let s = &mut *self.state();
        s.vmm.set_access(&mut s.memory, ptr, size, access, self.devices.len())
    }

    fn mem_get_access(&self, location_kind: u32, location: i32, ptr: u64) -> BResult<u64> {
        let s = &*self.state();
        s.vmm.get_access(&s.memory, location_kind, location, ptr, self.devices.len())
    }

    fn array_create(&self, ctx: Obj, desc: &ArrayDesc) -> BResult<Obj> {
        let s = &mut *self.state();
        s.ctx(ctx)?;
        s.arrays.create(&mut s.memory, ctx.0, desc)
    }

    fn array_destroy(&self, ctx: Obj, array: Obj) -> BResult<()> {
        let s = &mut *self.state();
        s.ctx(ctx)?;
        s.arrays.destroy(&mut s.memory, array)
    }

    fn array_descriptor(&self, ctx: Obj, array: Obj) -> BResult<ArrayDesc> {
        let s = &mut *self.state();
        s.ctx(ctx)?;
        s.arrays.descriptor(array)
    }

    fn mipmap_create(&self, ctx: Obj, desc: &ArrayDesc, levels: u32) -> BResult<Obj> {
        let s = &mut *self.state();
        s.ctx(ctx)?;
        s.arrays.mipmap_create(&mut s.memory, ctx.0, desc, levels)
    }

    fn mipmap_level(&self, ctx: Obj, mipmap: Obj, level: u32) -> BResult<Obj> {
        let s = &mut *self.state();
        s.ctx(ctx)?;
        s.arrays.mipmap_level(mipmap, level)
    }

    fn mipmap_destroy(&self, ctx: Obj, mipmap: Obj) -> BResult<()> {
        let s = &mut *self.state();
        s.ctx(ctx)?;
        s.arrays.mipmap_destroy(&mut s.memory, mipmap)
    }

    unsafe fn memcpy_3d(&self, ctx: Obj, copy: &Copy3D, stream: Obj, _sync: bool) -> BResult<()> {
        let s = &mut *self.state();
        s.stream(ctx, stream)?;
        s.graphs.refuse(
            stream,
            CuError::STREAM_CAPTURE_UNSUPPORTED,
            "the emulated device captures no 2D or 3D copies",
        )?;
        // SAFETY: the caller's guarantee.
        unsafe { s.arrays.copy(&mut s.memory, copy) }
    }

    fn tex_object_create(&self, ctx: Obj, res: &ResourceDesc, tex: &[u8], view: Option<&[u8]>) -> BResult<u64> {
        if view.is_some() {
            return Err(err(CuError::NOT_SUPPORTED, "the emulated device takes no resource views"));
        }
        let s = &mut *self.state();
        s.ctx(ctx)?;
        s.arrays.object(ctx.0, res, Some(tex))
    }

    fn tex_object_destroy(&self, ctx: Obj, object: u64) -> BResult<()> {
        let s = &mut *self.state();
        s.ctx(ctx)?;
        s.arrays.destroy_object(object)
    }

    fn surf_object_create(&self, ctx: Obj, res: &ResourceDesc) -> BResult<u64> {
        let s = &mut *self.state();
        s.ctx(ctx)?;
        s.arrays.object(ctx.0, res, None)
    }

    fn surf_object_destroy(&self, ctx: Obj, object: u64) -> BResult<()> {
        let s = &mut *self.state();
        s.ctx(ctx)?;
        s.arrays.destroy_object(object)
    }

    fn mem_pool_create(&self, ctx: Option<Obj>, props: &PoolProps) -> BResult<Obj> {
        let s = &mut *self.state();
        ctx.map_or(Ok(()), |c| s.ctx(c).map(drop))?;
        s.pools.create(props, self.devices.len())
    }

    fn mem_pool_destroy(&self, pool: Obj) -> BResult<()> {
        let s = &mut *self.state();
        s.pools.destroy(&mut s.memory, pool)
    }

    fn mem_alloc_from_pool(&self, ctx: Obj, size: u64, pool: Obj, stream: Obj) -> BResult<u64> {
        let s = &mut *self.state();
        s.stream(ctx, stream)?;
        s.graphs.refuse(stream, CuError::STREAM_CAPTURE_UNSUPPORTED, "an allocation")?;
        s.pools.alloc(&mut s.memory, size, pool)
    }

    fn mem_free_async(&self, ctx: Obj, ptr: u64, stream: Obj) -> BResult<()> {
        let s = &mut *self.state();
        s.stream(ctx, stream)?;
        s.graphs.refuse(stream, CuError::STREAM_CAPTURE_UNSUPPORTED, "a free")?;
        match s.memory.owner(ptr) {
            Some(Owner::Pooled { pool }) => s.pools.free(&mut s.memory, ptr, pool),
            _ => Ok(s.memory.free(ptr)?),
        }
    }

    fn mem_pool_trim(&self, pool: Obj, keep: u64) -> BResult<()> {
        let s = &mut *self.state();
        s.pools.trim(&mut s.memory, pool, keep)
    }

    fn mem_pool_set_attribute(&self, pool: Obj, attr: i32, value: u64) -> BResult<()> {
        self.state().pools.set_attribute(pool, attr, value)
    }

    fn mem_pool_get_attribute(&self, pool: Obj, attr: i32) -> BResult<u64> {
        self.state().pools.get_attribute(pool, attr)
    }

    fn mem_pool_set_access(&self, pool: Obj, access: &[AccessDesc]) -> BResult<()> {
        self.state().pools.set_access(pool, access, self.devices.len())
    }

    fn mem_pool_get_access(&self, pool: Obj, location_kind: u32, location: i32) -> BResult<u64> {
        self.state().pools.get_access(pool, location_kind, location)
    }

    unsafe fn host_register(&self, ctx: Obj, ptr: *mut u8, len: usize) -> BResult<u64> {
        let mut s = self.state();
        s.ctx(ctx)?;
        // SAFETY: the caller keeps the memory mapped until unregistering.
        Ok(unsafe { s.memory.register(ptr, len, ctx.0) }?)
    }

    fn host_unregister(&self, _ctx: Obj, ptr: *mut u8) -> BResult<()> {
        Ok(self.state().memory.unregister(ptr as u64)?)
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
        if let Some(recorded) = self.record_host_copy(ctx, stream, dst, src as u64, len) {
            return recorded;
        }
        // SAFETY: the caller's guarantee; the copy completes before returning.
        self.memcpy_htod(ctx, dst, unsafe { std::slice::from_raw_parts(src, len) }, stream, sync)
    }

    unsafe fn memcpy_dtoh_host(
        &self,
        ctx: Obj,
        dst: *mut u8,
        src: u64,
        len: usize,
        stream: Obj,
        _sync: bool,
    ) -> BResult<()> {
        if let Some(recorded) = self.record_host_copy(ctx, stream, dst as u64, src, len) {
            return recorded;
        }
        // SAFETY: the caller's guarantee; the copy completes before returning.
        self.memcpy_dtoh(ctx, unsafe { std::slice::from_raw_parts_mut(dst, len) }, src, stream)
    }

    fn module_load(&self, ctx: Obj, image: &[u8]) -> BResult<Obj> {
        let parsed = image::parse(image).map_err(|e| err(CuError::INVALID_IMAGE, e.to_string()))?;
        let mut s = self.state();
        s.ctx(ctx)?;
        s.load_module(ctx.0, Arc::new(parsed)).map(Obj)
    }

    fn module_unload(&self, ctx: Obj, module: Obj) -> BResult<()> {
        let mut s = self.state();
        s.ctx(ctx)?;
        if !s.modules.contains_key(&module.0) {
            return Err(CuError::INVALID_HANDLE.into());
        }
        s.unload_module(module.0);
        Ok(())
    }

    fn module_get_function(&self, ctx: Obj, module: Obj, name: &str) -> BResult<Obj> {
        let mut s = self.state();
        s.ctx(ctx)?;
        s.module_function(module.0, name).map(Obj)
    }

    fn module_get_global(&self, ctx: Obj, module: Obj, name: &str) -> BResult<(u64, u64)> {
        let mut s = self.state();
        s.ctx(ctx)?;
        s.global(module.0, name)
    }

    fn module_function_count(&self, ctx: Obj, module: Obj) -> BResult<u32> {
        let mut s = self.state();
        s.ctx(ctx)?;
        let m = s.modules.get(&module.0).ok_or(CuError::INVALID_HANDLE)?;
        Ok(m.image.kernels.len() as u32)
    }

    fn module_functions(&self, ctx: Obj, module: Obj) -> BResult<Vec<Obj>> {
        let mut s = self.state();
        s.ctx(ctx)?;
        let m = s.modules.get(&module.0).ok_or(CuError::INVALID_HANDLE)?;
        let names: Vec<String> = m.image.kernels.iter().map(|k| k.name.clone()).collect();
        names.iter().map(|name| s.module_function(module.0, name).map(Obj)).collect()
    }

    fn module_loading_mode(&self) -> BResult<i32> {
        // CU_MODULE_LAZY_LOADING: libraries load into a context on first use.
        Ok(2)
    }

    fn library_load(&self, image: &[u8]) -> BResult<Obj> {
        let parsed = image::parse(image).map_err(|e| err(CuError::INVALID_IMAGE, e.to_string()))?;
        let mut s = self.state();
        let id = s.id();
        s.libraries.insert(
            id,
            Library {
                image: Arc::new(parsed),
                kernels: HashMap::new(),
                modules: HashMap::new(),
                managed: HashMap::new(),
            },
        );
        Ok(Obj(id))
    }

    fn library_unload(&self, library: Obj) -> BResult<()> {
        let mut s = self.state();
        let lib = s.libraries.remove(&library.0).ok_or(CuError::INVALID_HANDLE)?;
        for m in lib.modules.values() {
            s.unload_module(*m);
        }
        for k in lib.kernels.values() {
            s.kernels.remove(k);
        }
        s.memory.free_where(|o| o == Owner::Managed { library: library.0 });
        Ok(())
    }

    fn library_get_kernel(&self, library: Obj, name: &str) -> BResult<Obj> {
        let mut s = self.state();
        let lib = s.libraries.get(&library.0).ok_or(CuError::INVALID_HANDLE)?;
        if let Some(&k) = lib.kernels.get(name) {
            return Ok(Obj(k));
        }
        if !lib.image.kernels.iter().any(|k| k.name == name) {
            return Err(err(CuError::NOT_FOUND, format!("no kernel {name:?} in the library")));
        }
        let id = s.id();
        s.kernels.insert(id, KernelRef { library: library.0, name: name.to_owned(), set: Vec::new() });
        if let Some(lib) = s.libraries.get_mut(&library.0) {
            lib.kernels.insert(name.to_owned(), id);
        }
        Ok(Obj(id))
    }

    fn library_get_module(&self, ctx: Obj, library: Obj) -> BResult<Obj> {
        let mut s = self.state();
        s.ctx(ctx)?;
        s.library_module(ctx.0, library).map(Obj)
    }

    fn library_get_global(&self, ctx: Obj, library: Obj, name: &str) -> BResult<(u64, u64)> {
        let mut s = self.state();
        s.ctx(ctx)?;
        let m = s.library_module(ctx.0, library)?;
        s.global(m, name)
    }

    /// Device memory of the library's own, placed when first asked for: the
    /// emulated device's kernels reach variables through pointers only.
    fn library_get_managed(&self, library: Obj, name: &str) -> BResult<(u64, u64)> {
        let mut s = self.state();
        let lib = s.libraries.get(&library.0).ok_or(CuError::INVALID_HANDLE)?;
        if let Some(&placed) = lib.managed.get(name) {
            return Ok(placed);
        }
        let missing = || err(CuError::NOT_FOUND, format!("no managed variable {name:?} in the library"));
        let global = lib.image.globals.iter().find(|g| g.name == name).ok_or_else(missing)?.clone();
        let ptr = s.memory.alloc(global.size.max(1), Owner::Managed { library: library.0 }, &global.init)?;
        let placed = (ptr, global.size);
        if let Some(lib) = s.libraries.get_mut(&library.0) {
            lib.managed.insert(name.to_owned(), placed);
        }
        Ok(placed)
    }

    unsafe fn managed_read(&self, ptr: u64, out: &mut [u8]) -> BResult<()> {
        let gone = || err(CuError::ILLEGAL_ADDRESS, "a managed variable whose context is gone");
        self.state().memory.read_at(ptr, out).then_some(()).ok_or_else(gone)
    }

    unsafe fn managed_write(&self, ptr: u64, data: &[u8]) -> BResult<()> {
        let gone = || err(CuError::ILLEGAL_ADDRESS, "a managed variable whose context is gone");
        self.state().memory.write_at(ptr, data).then_some(()).ok_or_else(gone)
    }

    fn library_kernel_count(&self, library: Obj) -> BResult<u32> {
        let s = self.state();
        let lib = s.libraries.get(&library.0).ok_or(CuError::INVALID_HANDLE)?;
        Ok(lib.image.kernels.len() as u32)
    }

    fn kernel_get_function(&self, ctx: Obj, kernel: Obj) -> BResult<Obj> {
        let mut s = self.state();
        s.ctx(ctx)?;
        let k = s.kernels.get(&kernel.0).ok_or(CuError::INVALID_HANDLE)?;
        let (library, name, set) = (Obj(k.library), k.name.clone(), k.set.clone());
        let m = s.library_module(ctx.0, library)?;
        let f = s.module_function(m, &name)?;
        if let Some(func) = s.functions.get_mut(&f) {
            for (attr, value) in set {
                func.set_attribute(attr, value)?;
            }
        }
        Ok(Obj(f))
    }

    fn param_layout(&self, _ctx: Obj, func: Obj) -> BResult<Vec<ParamSlot>> {
        Ok(self.state().function(func)?.kernel.params.clone())
    }

    fn func_name(&self, _ctx: Obj, func: Obj) -> BResult<String> {
        Ok(self.state().function(func)?.kernel.name.clone())
    }

    fn func_get_attribute(&self, _ctx: Obj, func: Obj, attr: i32) -> BResult<i32> {
        self.state().function(func)?.attribute(attr)
    }

    fn func_set_attribute(&self, _ctx: Obj, func: Obj, attr: i32, value: i32) -> BResult<()> {
        let mut s = self.state();
        s.functions.get_mut(&func.0).ok_or(CuError::INVALID_HANDLE)?.set_attribute(attr, value)
    }

    fn func_set_cache_config(&self, _ctx: Obj, func: Obj, config: i32) -> BResult<()> {
        self.state().function(func)?;
        if !(0..=3).contains(&config) {
            return Err(CuError::INVALID_VALUE.into());
        }
        Ok(())
    }

    fn kernel_get_attribute(&self, kernel: Obj, attr: i32, _dev: i32) -> BResult<i32> {
        let s = self.state();
        let k = s.kernels.get(&kernel.0).ok_or(CuError::INVALID_HANDLE)?;
        let lib = s.libraries.get(&k.library).ok_or(CuError::INVALID_HANDLE)?;
        let info = lib.image.kernels.iter().find(|i| i.name == k.name).ok_or(CuError::INVALID_HANDLE)?;
        // A function not yet tuned, with what cuKernelSetAttribute set.
        let mut f = Function::new(0, info.clone());
        for &(a, v) in &k.set {
            f.set_attribute(a, v)?;
        }
        f.attribute(attr)
    }

    fn kernel_set_attribute(&self, kernel: Obj, attr: i32, value: i32, _dev: i32) -> BResult<()> {
        let mut s = self.state();
        let k = s.kernels.get(&kernel.0).ok_or(CuError::INVALID_HANDLE)?;
        let (library, name) = (k.library, k.name.clone());
        let lib = s.libraries.get(&library).ok_or(CuError::INVALID_HANDLE)?;
        let info = lib.image.kernels.iter().find(|i| i.name == name).ok_or(CuError::INVALID_HANDLE)?;
        // Checked as for a fresh function; then kept for functions to come.
        Function::new(0, info.clone()).set_attribute(attr, value)?;
        let modules: Vec<u64> = lib.modules.values().copied().collect();
        if let Some(k) = s.kernels.get_mut(&kernel.0) {
            k.set.retain(|&(a, _)| a != attr);
            k.set.push((attr, value));
        }
        // The kernel's functions that exist already: those of its library's modules.
        let targets: Vec<u64> =
            modules.iter().filter_map(|m| s.modules.get(m).and_then(|m| m.functions.get(&name).copied())).collect();
        for f in targets {
            if let Some(func) = s.functions.get_mut(&f) {
                func.set_attribute(attr, value)?;
            }
        }
        Ok(())
    }

    fn kernel_set_cache_config(&self, kernel: Obj, config: i32, _dev: i32) -> BResult<()> {
        if !self.state().kernels.contains_key(&kernel.0) {
            return Err(CuError::INVALID_HANDLE.into());
        }
        if !(0..=3).contains(&config) {
            return Err(CuError::INVALID_VALUE.into());
        }
        Ok(())
    }

    fn occupancy_max_active_blocks(&self, _ctx: Obj, func: Obj, block: i32, smem: u64, flags: u32) -> BResult<i32> {
        check_occupancy_flags(flags)?;
        let s = self.state();
        Ok(occupancy(s.function(func)?, block, smem)? as i32)
    }

    /// As the occupancy calculator: `blocks` must fit with no dynamic shared
    /// memory at all, else INVALID_VALUE.
    fn occupancy_available_smem(&self, _ctx: Obj, func: Obj, blocks: i32, block: i32) -> BResult<u64> {
        let s = self.state();
        let f = s.function(func)?;
        if blocks <= 0 || occupancy(f, block, 0)? < blocks as u32 {
            return Err(err(CuError::INVALID_VALUE, format!("{blocks} blocks of {block} threads do not fit")));
        }
        let per_block = device::SHARED_PER_SM as u64 / blocks as u64;
        let (fixed, dynamic) = (f.kernel.shared_bytes as u64, f.max_dynamic_shared as u64);
        Ok(per_block.min(fixed + dynamic).saturating_sub(fixed))
    }

    fn occupancy_max_potential_block_size(
        &self,
        _ctx: Obj,
        func: Obj,
        smem: u64,
        limit: i32,
        flags: u32,
    ) -> BResult<(i32, i32)> {
        check_occupancy_flags(flags)?;
        let s = self.state();
        let f = s.function(func)?;
        let max = match u32::try_from(limit) {
            Ok(limit) if limit > 0 => f.max_threads().min(limit),
            _ => f.max_threads(),
        };
        // As the occupancy calculator: whole warps from the largest size
        // down (the largest itself even if it is not), keeping the first
        // that holds the most threads. At most 32 sizes.
        let (mut blocks, mut best, mut most) = (0, 0, 0);
        for warps in (1..=max.div_ceil(32)).rev() {
            let block = max.min(warps * 32);
            let n = occupancy(f, block as i32, smem)?;
            if n * block > most {
                (blocks, best, most) = (n, block, n * block);
            }
        }
        Ok(((blocks * device::MULTIPROCESSORS) as i32, best as i32))
    }

    fn occupancy_clusters(&self, ctx: Obj, func: Obj, launch: &Launch, query: ClusterQuery) -> BResult<i32> {
        const CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: u32 = 4;
        /// The largest cluster every device of this kind accepts.
        const PORTABLE_CLUSTER: i32 = 8;
        let mut s = self.state();
        s.stream(ctx, launch.stream)?;
        let f = s.function(func)?;
        s.check_launch(f, launch)?;
        // The attribute's three unsigned dimensions, multiplied without
        // overflow (a 0 among them makes the size 0).
        let cluster: u64 = launch.attrs.iter().find(|a| a.0 == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION).map_or(1, |a| {
            a.1[..12]
                .chunks_exact(4)
                .fold(1u64, |n, d| n.saturating_mul(u32::from_le_bytes(d.try_into().expect("4 bytes")) as u64))
        });
        // `check_launch` has bounded the block by the device's limit.
        let threads: u64 = launch.block.iter().map(|&d| d as u64).product();
        Ok(match query {
            ClusterQuery::MaxPotentialClusterSize => PORTABLE_CLUSTER,
            ClusterQuery::MaxActiveClusters if cluster == 0 || cluster > PORTABLE_CLUSTER as u64 => 0,
            ClusterQuery::MaxActiveClusters => {
                let blocks = occupancy(f, threads as i32, launch.shared_mem as u64)?;
                (blocks as u64 * device::MULTIPROCESSORS as u64 / cluster) as i32
            }
        })
    }

    fn launch(&self, ctx: Obj, func: Obj, launch: &Launch, params: &[u8]) -> BResult<()> {
        let mut s = self.state();
        s.stream(ctx, launch.stream)?;
        s.kernel(ctx, func, launch)?;
        let work = Work::Kernel { func, launch: launch.clone(), params: params.to_vec() };
        if let Some(recorded) = s.graphs.record(launch.stream, work) {
            return recorded;
        }
        s.run_kernel(ctx, func, launch, params)
    }

    fn stream_create(&self, ctx: Obj, flags: u32, priority: i32) -> BResult<Obj> {
        let mut s = self.state();
        s.ctx(ctx)?;
        if flags > 1 {
            return Err(CuError::INVALID_VALUE.into());
        }
        let (least, greatest) = device::PRIORITY_RANGE;
        let priority = priority.clamp(greatest, least);
        let id = s.id();
        s.streams.insert(id, StreamState { ctx: ctx.0, flags, priority, attributes: HashMap::new() });
        Ok(Obj(id))
    }

    fn stream_destroy(&self, ctx: Obj, stream: Obj) -> BResult<()> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        s.streams.remove(&stream.0).map(|_| ()).ok_or_else(|| CuError::INVALID_HANDLE.into())
    }

    fn stream_synchronize(&self, ctx: Obj, stream: Obj) -> BResult<()> {
        let s = &mut *self.state();
        s.stream(ctx, stream)?;
        s.graphs.refuse(stream, CuError::STREAM_CAPTURE_UNSUPPORTED, "a wait for the stream")?;
        s.pools.release(&mut s.memory);
        Ok(())
    }

    fn stream_query(&self, ctx: Obj, stream: Obj) -> BResult<()> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        s.graphs.refuse(stream, CuError::STREAM_CAPTURE_UNSUPPORTED, "a query of the stream")
    }

    fn stream_wait_event(&self, ctx: Obj, stream: Obj, event: Obj, _flags: u32) -> BResult<()> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        s.event(event)?;
        s.graphs.refuse(stream, CuError::NOT_SUPPORTED, "the emulated device captures no event waits")
    }

    /// The stream attributes a device takes: an access policy window, a
    /// synchronization policy, a priority and memory synchronization domains.
    fn stream_id(&self, ctx: Obj, stream: Obj) -> BResult<u64> {
        self.state().stream(ctx, stream).map(|_| stream.0)
    }

    fn stream_capture_status(&self, ctx: Obj, stream: Obj) -> BResult<u32> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        Ok(s.graphs.info(stream).status)
    }

    fn tensor_map_encode(&self, map: &TensorMap) -> BResult<TensorMapBytes> {
        tensor_maps::encode(map)
    }

    fn tensor_map_replace_address(&self, map: &TensorMapBytes, address: u64) -> BResult<TensorMapBytes> {
        tensor_maps::replace_address(map, address)
    }

    fn refuse_in_capture(&self, ctx: Obj, stream: Obj, what: &str) -> BResult<()> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        s.graphs.refuse(stream, CuError::STREAM_CAPTURE_UNSUPPORTED, what)
    }

    fn event_create(&self, ctx: Obj, flags: u32) -> BResult<Obj> {
        let mut s = self.state();
        s.ctx(ctx)?;
        if flags & !0xf != 0 {
            return Err(CuError::INVALID_VALUE.into());
        }
        let id = s.id();
        s.events.insert(id, EventState { ctx: ctx.0, flags, recorded: None });
        Ok(Obj(id))
    }

    fn event_destroy(&self, _ctx: Obj, event: Obj) -> BResult<()> {
        self.state().events.remove(&event.0).map(|_| ()).ok_or_else(|| CuError::INVALID_HANDLE.into())
    }

    fn event_record(&self, ctx: Obj, event: Obj, stream: Obj, _flags: u32) -> BResult<()> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        s.event(event)?;
        s.graphs.refuse(stream, CuError::NOT_SUPPORTED, "the emulated device captures no event records")?;
        s.event(event)?.recorded = Some(Instant::now());
        Ok(())
    }

    fn event_synchronize(&self, ctx: Obj, event: Obj) -> BResult<()> {
        let s = &mut *self.state();
        s.ctx(ctx)?;
        s.event(event)?;
        s.pools.release(&mut s.memory);
        Ok(())
    }

    fn event_query(&self, ctx: Obj, event: Obj) -> BResult<()> {
        let mut s = self.state();
        s.ctx(ctx)?;
        s.event(event).map(|_| ())
    }

    fn event_elapsed(&self, ctx: Obj, start: Obj, end: Obj) -> BResult<f32> {
        let mut s = self.state();
        s.ctx(ctx)?;
        let timed = |e: &EventState| match e.recorded {
            Some(t) if e.flags & CU_EVENT_DISABLE_TIMING == 0 => Ok(t),
            _ => Err(err(CuError::INVALID_HANDLE, "event was not recorded with timing")),
        };
        let a = timed(s.event(start)?)?;
        let b = timed(s.event(end)?)?;
        let ms = if b >= a { (b - a).as_secs_f64() * 1e3 } else { -((a - b).as_secs_f64() * 1e3) };
        Ok(ms as f32)
    }

    fn stream_begin_capture(&self, ctx: Obj, stream: Obj, _mode: u32) -> BResult<()> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        s.graphs.begin(stream)
    }

    fn stream_begin_capture_to_graph(
        &self,
        ctx: Obj,
        stream: Obj,
        graph: Obj,
        deps: &[Obj],
        data: &[u64],
        _mode: u32,
    ) -> BResult<()> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        if data.iter().any(|&d| d != 0) {
            return Err(CallError::new(CuError::NOT_SUPPORTED, "edge data into a capture on the emulated device"));
        }
        s.graphs.begin_into(stream, graph, deps)
    }

    fn stream_end_capture(&self, ctx: Obj, stream: Obj) -> BResult<Obj> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        s.graphs.end(stream)
    }

    fn stream_capture_info(&self, ctx: Obj, stream: Obj, _edges: bool) -> BResult<CaptureInfo> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        Ok(s.graphs.info(stream))
    }

    /// Kept per thread, not enforced (see `graph.rs`).
    fn exchange_capture_mode(&self, mode: u32) -> BResult<u32> {
        thread_local! {
            static MODE: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
        }
        if mode > 2 {
            return Err(CuError::INVALID_VALUE.into());
        }
        Ok(MODE.replace(mode))
    }

    fn stream_update_capture_deps(&self, ctx: Obj, stream: Obj, deps: &[Obj], flags: u32) -> BResult<()> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        s.graphs.update_capture_deps(stream, deps, flags)
    }

    fn graph_create(&self, flags: u32) -> BResult<Obj> {
        if flags != 0 {
            return Err(CuError::INVALID_VALUE.into());
        }
        Ok(self.state().graphs.create())
    }

    fn graph_destroy(&self, graph: Obj) -> BResult<()> {
        self.state().graphs.destroy(graph)
    }

    fn graph_instantiate(&self, ctx: Obj, graph: Obj, flags: u64) -> BResult<Obj> {
        let mut s = self.state();
        s.ctx(ctx)?;
        if flags != 0 {
            return Err(err(CuError::NOT_SUPPORTED, "the emulated device instantiates graphs with no flags"));
        }
        s.graphs.instantiate(ctx, graph)
    }

    fn graph_exec_destroy(&self, exec: Obj) -> BResult<()> {
        self.state().graphs.exec_destroy(exec)
    }

    fn graph_launch(&self, ctx: Obj, exec: Obj, stream: Obj) -> BResult<()> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        s.graphs.refuse(stream, CuError::NOT_SUPPORTED, "the emulated device captures no graph launches")?;
        let work = s.graphs.exec(ctx, exec)?;
        s.graphs.launching(exec);
        s.run_graph(ctx, work)
    }

    fn graph_upload(&self, ctx: Obj, exec: Obj, stream: Obj) -> BResult<()> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        s.graphs.exec(ctx, exec).map(drop)
    }

    fn graph_nodes(&self, graph: Obj, roots: bool) -> BResult<Vec<Obj>> {
        self.state().graphs.nodes(graph, roots)
    }

    unsafe fn graph_add_node(&self, ctx: Obj, graph: Obj, deps: &[Obj], node: &NodeWork<'_>) -> BResult<Obj> {
        let mut s = self.state();
        s.ctx(ctx)?;
        match *node {
            NodeWork::Kernel { func, .. } => drop(s.function(func)?),
            NodeWork::Event { event, .. } => drop(s.event(event)?),
            _ => {}
        }
        s.graphs.add_node(graph, deps, node)
    }

    fn graph_dependencies(&self, graph: Obj, from: &[Obj], to: &[Obj], data: &[u64], remove: bool) -> BResult<()> {
        self.state().graphs.dependencies(graph, from, to, data, remove)
    }

    /// The memory is placed at once, in the context, and kept until the
    /// context ends: the test device reserves graph memory for good.
    /// An allocation's handle names it by address; opening one is another
    /// worker's business, which the test device of one worker cannot do.
    fn ipc_get_mem_handle(&self, ctx: Obj, dptr: u64) -> BResult<IpcHandle> {
        let mut s = self.state();
        s.ctx(ctx)?;
        if !matches!(s.memory.owner(dptr), Some(Owner::Alloc { .. })) {
            return Err(err(CuError::INVALID_VALUE, "not the base of an allocation"));
        }
        Ok(ipc_handle(1, dptr))
    }

    fn ipc_open_mem_handle(&self, _ctx: Obj, _handle: &IpcHandle, _flags: u32) -> BResult<(u64, u64)> {
        Err(err(CuError::NOT_SUPPORTED, "the emulated device of one worker cannot map another's memory"))
    }

    fn ipc_close_mem_handle(&self, _ctx: Obj, _dptr: u64) -> BResult<()> {
        Err(err(CuError::NOT_SUPPORTED, "the emulated device opens no IPC memory"))
    }

    fn ipc_get_event_handle(&self, ctx: Obj, event: Obj) -> BResult<IpcHandle> {
        let mut s = self.state();
        s.ctx(ctx)?;
        match s.events.get(&event.0) {
            Some(e) if e.flags & CU_EVENT_INTERPROCESS != 0 => Ok(ipc_handle(2, event.0)),
            _ => Err(err(CuError::INVALID_VALUE, "not an event made for interprocess use")),
        }
    }

    fn ipc_open_event_handle(&self, _ctx: Obj, _handle: &IpcHandle) -> BResult<Obj> {
        Err(err(CuError::NOT_SUPPORTED, "the emulated device of one worker cannot reach another's events"))
    }

    fn graph_child_graph(&self, node: Obj) -> BResult<Obj> {
        self.state().graphs.child_graph(node)
    }

    fn graph_memset_node_params(&self, node: Obj) -> BResult<Memset> {
        match self.state().graphs.node_work(node)? {
            Work::Memset(m) => Ok(*m),
            _ => Err(err(CuError::INVALID_VALUE, "not a memset node")),
        }
    }

    /// The test device cannot compile or link: a link of one image it
    /// loads (cubin, fatbin or PTX) is that image, and anything else is
    /// refused with a log that says so.
    fn link(&self, ctx: Obj, _options: &[(u32, u64)], inputs: &[(u32, &[u8])]) -> BResult<Linked> {
        self.state().ctx(ctx)?;
        match inputs {
            [(kind, image)] if [LINK_INPUT_CUBIN, LINK_INPUT_PTX, LINK_INPUT_FATBIN].contains(kind) => {
                match image::parse(image) {
                    Ok(_) => {
                        // Loaded back by address alone, PTX must end in its NUL.
                        let mut image = image.to_vec();
                        if *kind == LINK_INPUT_PTX && image.last() != Some(&0) {
                            image.push(0);
                        }
                        Ok(Linked { image, ..Linked::default() })
                    }
                    Err(e) => Ok(Linked {
                        // As the driver answers an input it cannot read, PTX or not.
                        status: CuError::INVALID_IMAGE.0,
                        error_log: format!("the input is no image the device loads: {e}").into_bytes(),
                        ..Linked::default()
                    }),
                }
            }
            _ => Ok(Linked {
                status: CuError::NOT_SUPPORTED.0,
                error_log: b"the emulated device links one cubin, fatbin or PTX input only".to_vec(),
                ..Linked::default()
            }),
        }
    }

    fn graph_add_conditional_node(
        &self,
        ctx: Obj,
        graph: Obj,
        deps: &[Obj],
        cond: &Conditional,
    ) -> BResult<(Obj, Vec<Obj>)> {
        let mut s = self.state();
        s.ctx(ctx)?;
        s.graphs.add_conditional(graph, deps, cond.handle, cond.kind, cond.size)
    }

    fn graph_add_mem_alloc_node(&self, ctx: Obj, graph: Obj, deps: &[Obj], alloc: &GraphAlloc) -> BResult<(Obj, u64)> {
        let mut s = self.state();
        s.ctx(ctx)?;
        let dptr = s.memory.alloc(alloc.bytes.max(1), Owner::Alloc { ctx: ctx.0 }, &[])?;
        let node = s.graphs.add_work(graph, deps, Work::MemAlloc(GraphAlloc { dptr, ..alloc.clone() }));
        if node.is_err() {
            let _ = s.memory.free(dptr);
        }
        Ok((node?, dptr))
    }

    fn graph_mem_alloc_node_params(&self, node: Obj) -> BResult<GraphAlloc> {
        match self.state().graphs.node_work(node)? {
            Work::MemAlloc(a) => Ok(a.clone()),
            _ => Err(err(CuError::INVALID_VALUE, "not an allocation node")),
        }
    }

    /// Only the high watermarks may be set, and only to 0.
    fn graph_mem_set_attribute(&self, _dev: i32, attr: i32, value: u64) -> BResult<()> {
        match (attr, value) {
            (1 | 3, 0) => Ok(()),
            _ => Err(err(CuError::INVALID_VALUE, format!("graph memory attribute {attr} set to {value}"))),
        }
    }

    fn passthrough(&self) -> &dyn Passthrough {
        self
    }

    fn graph_edges(&self, graph: Obj) -> BResult<Vec<(Obj, Obj, u64)>> {
        self.state().graphs.edges(graph)
    }

    fn graph_node_edges(&self, node: Obj, dependents: bool) -> BResult<Vec<(Obj, u64)>> {
        self.state().graphs.node_edges(node, dependents)
    }

    unsafe fn graph_node_set(&self, ctx: Obj, node: Obj, exec: Option<Obj>, work: &NodeWork<'_>) -> BResult<()> {
        let mut s = self.state();
        s.ctx(ctx)?;
        s.graphs.node_set(node, exec, work)
    }

    fn launch_host_func(&self, ctx: Obj, stream: Obj, f: HostFn) -> BResult<()> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        if let Some(recorded) = s.graphs.record(stream, Work::Host(f)) {
            return recorded;
        }
        // The stream's earlier work has run: every call runs at once here.
        // The device stays locked while the guest runs the function, as it
        // is for a kernel.
        // SAFETY: the session's function and data.
        unsafe { (f.run)(f.data) };
        Ok(())
    }

    fn graph_clone(&self, graph: Obj) -> BResult<Obj> {
        self.state().graphs.clone_graph(graph)
    }

    fn graph_node_find_in_clone(&self, node: Obj, clone: Obj) -> BResult<Obj> {
        self.state().graphs.find_in_clone(node, clone)
    }

    fn graph_destroy_node(&self, node: Obj) -> BResult<()> {
        self.state().graphs.destroy_node(node)
    }

    fn graph_exec_update(&self, ctx: Obj, exec: Obj, graph: Obj) -> BResult<ExecUpdate> {
        let mut s = self.state();
        s.ctx(ctx)?;
        s.graphs.exec_update(exec, graph)
    }
}

#[cfg(test)]
mod tests;
