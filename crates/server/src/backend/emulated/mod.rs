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
mod ipc;

pub mod kernels;
mod memory;
mod modules;
mod passthrough;
mod pools;
mod streams;
mod tensor_maps;
mod user_objects;
mod vmm;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use gpuplex_protocol::{CallError, CuError, DeviceInfo, Passthrough};

use super::{BResult, Backend, IpcHandle, Launch, Memset, Obj};
use crate::backend::{self, Contexts};
use crate::image::{Image, KernelInfo};
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
    user_objects: user_objects::UserObjects,
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
                user_objects: Default::default(),
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
    fn passthrough(&self) -> &dyn Passthrough {
        self
    }
}

#[cfg(test)]
mod tests;

impl Contexts for Emulated {
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
}

impl backend::Memory for Emulated {
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

    /// Each block is a mapping of its own; no hardware decompresses here.
    fn mem_mapping(&self, ctx: Option<Obj>, ptr: u64) -> BResult<(u64, u64, bool)> {
        let mut s = self.state();
        if let Some(ctx) = ctx {
            s.ctx(ctx)?;
        }
        let (base, size) = s.memory.block_holding(ptr).ok_or(CuError::INVALID_VALUE)?;
        Ok((base, size, false))
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

    unsafe fn host_register(&self, ctx: Obj, ptr: *mut u8, len: usize) -> BResult<u64> {
        let mut s = self.state();
        s.ctx(ctx)?;
        if s.graphs.forbids_unsafe_calls() {
            return Err(err(CuError::STREAM_CAPTURE_UNSUPPORTED, "registering host memory while a stream captures"));
        }
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
}
