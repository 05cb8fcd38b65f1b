//! Graphs built node by node. Each node is made by the server's driver; this
//! side reads the C structures, packs a kernel node's parameters as a
//! launch's, and keeps the kernel parameters it set on each node so that
//! `cuGraphKernelNodeGetParams` can hand back arguments the program may read
//! and change, as the driver's copies are.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, PoisonError};

use gpuplex_protocol::{calls, CuError, DevPtr, Event, Func, Graph, GraphExec, GraphNode, Seq};

use super::write_lists;
use crate::client;
use crate::ffi::{check_out, entry, write_out, CUresult};
use crate::memory::copy3d::{node_copy, program_copy, Memcpy3D};

/// `CUDA_KERNEL_NODE_PARAMS_v1`; v2 adds `kern` and `ctx`.
#[repr(C)]
pub struct KernelNodeParams {
    func: *mut c_void,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
}

#[repr(C)]
pub struct KernelNodeParamsV2 {
    v1: KernelNodeParams,
    kern: *mut c_void,
    ctx: *mut c_void,
}

/// `CUDA_MEMSET_NODE_PARAMS`.
#[repr(C)]
pub struct MemsetNodeParams {
    dst: u64,
    pitch: usize,
    value: u32,
    element_size: u32,
    width: usize,
    height: usize,
}

/// `CUDA_HOST_NODE_PARAMS`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct HostNodeParams {
    run: Option<HostFn>,
    data: *mut c_void,
}

// SAFETY: the program's function and data, only ever handed back to it.
unsafe impl Send for HostNodeParams {}

/// Each host node's function as this process last set it.
static HOST_NODES: Mutex<Option<HashMap<u64, HostNodeParams>>> = Mutex::new(None);

fn host_nodes<T>(f: impl FnOnce(&mut HashMap<u64, HostNodeParams>) -> T) -> T {
    f(HOST_NODES.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert_with(HashMap::new))
}

/// The number the server runs a host node's function by.
fn host_id(p: *const HostNodeParams) -> Result<(HostNodeParams, u64), CuError> {
    // SAFETY: NULL or valid, as the export's caller vouches.
    let p = *unsafe { p.as_ref() }.ok_or(CuError::INVALID_VALUE)?;
    let run = p.run.ok_or(CuError::INVALID_VALUE)?;
    Ok((p, crate::host_calls::register(run, p.data)?))
}

fn add_host(out: Out, graph: *mut c_void, d: Seq<u64>, p: *const HostNodeParams) -> Result<(), CuError> {
    check_out(out)?;
    let (params, id) = host_id(p)?;
    let node = client::call(calls::GraphAddHostNode::Request { graph: Graph(graph as u64), deps: d, id })?.node;
    host_nodes(|m| m.insert(node.0, params));
    made(out, node)
}

fn set_host(node: *mut c_void, exec: u64, p: *const HostNodeParams) -> Result<(), CuError> {
    edits(exec);
    let (params, id) = host_id(p)?;
    client::call(calls::GraphHostNodeSetParams::Request { node: GraphNode(node as u64), exec: GraphExec(exec), id })?;
    // An executable graph's copy changes; the node itself keeps its function.
    if exec == 0 {
        host_nodes(|m| m.insert(node as u64, params));
    }
    Ok(())
}

fn get_host(node: *mut c_void, p: *mut HostNodeParams) -> Result<(), CuError> {
    check_out(p)?;
    let params = host_nodes(|m| m.get(&(node as u64)).copied()).ok_or_else(|| {
        crate::log::warn("cuGraphHostNodeGetParams: only for host nodes the program added or set itself");
        CuError::NOT_SUPPORTED
    })?;
    // SAFETY: checked non-NULL; the export's caller vouches for it.
    unsafe { write_out(p, params) };
    Ok(())
}

/// `CUgraphExecUpdateResultInfo`.
#[repr(C)]
pub struct ExecUpdateResultInfo {
    result: u32,
    error_node: *mut c_void,
    error_from: *mut c_void,
}

/// A kernel node's launch as this process last set it: its parameters
/// packed, and a pointer to each of them there.
struct KernelNode {
    func: u64,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
    packed: Vec<u8>,
    args: Vec<*mut c_void>,
}

// SAFETY: `args` point into the node's own `packed`, which moves with it.
unsafe impl Send for KernelNode {}

static KERNEL_NODES: Mutex<Option<HashMap<u64, KernelNode>>> = Mutex::new(None);

fn kernel_nodes<T>(f: impl FnOnce(&mut HashMap<u64, KernelNode>) -> T) -> T {
    f(KERNEL_NODES.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert_with(HashMap::new))
}

/// A kernel node's launch, read from either form of the C structure (a v2
/// one may name a `CUkernel` instead of a function).
struct Kernel {
    func: u64,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
    packed: Vec<u8>,
}

/// # Safety
/// `p` is NULL or valid for a read, and its parameters as the CUDA API requires.
unsafe fn kernel_v1(p: *const KernelNodeParams, kern: *mut c_void) -> Result<Kernel, CuError> {
    // SAFETY: NULL or valid, per the contract.
    let p = unsafe { p.as_ref() }.ok_or(CuError::INVALID_VALUE)?;
    let func = if p.func.is_null() { kern } else { p.func } as u64;
    if func == 0 {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: per the contract.
    let (packed, _) = unsafe { crate::launch::packed_params(func, p.kernel_params, p.extra)? };
    Ok(Kernel { func, grid: p.grid, block: p.block, shared_mem: p.shared_mem, packed })
}

/// # Safety
/// As for [`kernel_v1`].
unsafe fn kernel_v2(p: *const KernelNodeParamsV2) -> Result<Kernel, CuError> {
    // SAFETY: NULL or valid, per the contract.
    let p = unsafe { p.as_ref() }.ok_or(CuError::INVALID_VALUE)?;
    // SAFETY: per the contract.
    unsafe { kernel_v1(&p.v1, p.kern) }
}

/// Remembers what a node's kernel now gets, with a pointer to each argument.
fn remember(node: u64, k: Kernel) -> Result<(), CuError> {
    let layout = crate::launch::layout(k.func)?;
    let mut n = KernelNode {
        func: k.func,
        grid: k.grid,
        block: k.block,
        shared_mem: k.shared_mem,
        packed: k.packed,
        args: Vec::new(),
    };
    let base = n.packed.as_mut_ptr();
    n.args = layout.iter().map(|&(offset, _)| base.wrapping_add(offset as usize).cast()).collect();
    kernel_nodes(|m| m.insert(node, n));
    Ok(())
}

pub(super) fn deps(deps: *const *mut c_void, n: usize) -> Result<Seq<u64>, CuError> {
    if n == 0 {
        return Ok(Seq(Vec::new()));
    }
    if deps.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: `n` handles, as the CUDA API requires.
    Ok(Seq(unsafe { std::slice::from_raw_parts(deps, n) }.iter().map(|&d| d as u64).collect()))
}

pub(super) fn made(out: *mut *mut c_void, node: GraphNode) -> Result<(), CuError> {
    // SAFETY: checked non-NULL by the caller; the export's caller vouches for it.
    unsafe { write_out(out, node.0 as *mut c_void) };
    Ok(())
}

fn add_kernel(out: *mut *mut c_void, graph: *mut c_void, d: Seq<u64>, k: Kernel) -> Result<(), CuError> {
    check_out(out)?;
    let req = calls::GraphAddKernelNode::Request {
        graph: Graph(graph as u64),
        deps: d,
        func: Func(k.func),
        gridX: k.grid[0],
        gridY: k.grid[1],
        gridZ: k.grid[2],
        blockX: k.block[0],
        blockY: k.block[1],
        blockZ: k.block[2],
        sharedMem: k.shared_mem,
        params: k.packed.clone(),
    };
    let node = client::call(req)?.node;
    remember(node.0, k)?;
    made(out, node)
}

fn set_kernel(node: *mut c_void, exec: u64, k: Kernel) -> Result<(), CuError> {
    edits(exec);
    let req = calls::GraphKernelNodeSetParams::Request {
        node: GraphNode(node as u64),
        exec: GraphExec(exec),
        func: Func(k.func),
        gridX: k.grid[0],
        gridY: k.grid[1],
        gridZ: k.grid[2],
        blockX: k.block[0],
        blockY: k.block[1],
        blockZ: k.block[2],
        sharedMem: k.shared_mem,
        params: k.packed.clone(),
    };
    // In an executable graph, new arguments for the node's own function in
    // a launch the driver is sure to take cannot fail (XLA changes some every
    // step): posted, as a launch is.
    if exec != 0 && same_function(node as u64, k.func) {
        let Kernel { func, grid, block, shared_mem, ref packed } = k;
        if crate::launch::surely_launchable(func, grid, block, shared_mem, packed.len())? {
            return client::post(req);
        }
    }
    client::call(req)?;
    // An executable graph's copy changes; the node itself keeps its launch.
    if exec == 0 {
        remember(node as u64, k)?;
    }
    Ok(())
}

/// Whether `node` is a kernel node this process made, of function `func`.
fn same_function(node: u64, func: u64) -> bool {
    kernel_nodes(|m| m.get(&node).is_some_and(|n| n.func == func))
}

/// Writes a node's kernel launch as this process set it.
///
/// # Safety
/// `p` is valid for a write.
unsafe fn get_kernel(node: *mut c_void, p: *mut KernelNodeParams) -> Result<(), CuError> {
    check_out(p)?;
    let params = kernel_nodes(|m| {
        m.get(&(node as u64)).map(|n| KernelNodeParams {
            func: n.func as *mut c_void,
            grid: n.grid,
            block: n.block,
            shared_mem: n.shared_mem,
            kernel_params: n.args.as_ptr().cast_mut(),
            extra: std::ptr::null_mut(),
        })
    });
    let Some(params) = params else {
        crate::log::warn("cuGraphKernelNodeGetParams: only for kernel nodes the program added or set itself");
        return Err(CuError::NOT_SUPPORTED);
    };
    // SAFETY: checked non-NULL; per the contract.
    unsafe { write_out(p, params) };
    Ok(())
}

pub(super) fn add(out: *mut *mut c_void, node: impl FnOnce() -> Result<GraphNode, CuError>) -> Result<(), CuError> {
    check_out(out)?;
    made(out, node()?)
}

fn memset_node(graph: *mut c_void, d: Seq<u64>, p: *const MemsetNodeParams) -> Result<GraphNode, CuError> {
    // SAFETY: NULL or valid, as the export's caller vouches.
    let p = unsafe { p.as_ref() }.ok_or(CuError::INVALID_VALUE)?;
    let req = calls::GraphAddMemsetNode::Request {
        graph: Graph(graph as u64),
        deps: d,
        dst: DevPtr(p.dst),
        pitch: p.pitch as u64,
        value: p.value,
        elementSize: p.element_size,
        width: p.width as u64,
        height: p.height as u64,
    };
    Ok(client::call(req)?.node)
}

fn memcpy_node(graph: *mut c_void, d: Seq<u64>, p: *const Memcpy3D) -> Result<GraphNode, CuError> {
    let req = calls::GraphAddMemcpyNode::Request { graph: Graph(graph as u64), deps: d, copy: node_copy(p)? };
    Ok(client::call(req)?.node)
}

fn child_node(graph: *mut c_void, d: Seq<u64>, child: *mut c_void) -> Result<GraphNode, CuError> {
    let req =
        calls::GraphAddChildGraphNode::Request { graph: Graph(graph as u64), deps: d, child: Graph(child as u64) };
    Ok(client::call(req)?.node)
}

fn empty_node(graph: *mut c_void, d: Seq<u64>) -> Result<GraphNode, CuError> {
    Ok(client::call(calls::GraphAddEmptyNode::Request { graph: Graph(graph as u64), deps: d })?.node)
}

fn set_memcpy(node: *mut c_void, exec: u64, p: *const Memcpy3D) -> Result<(), CuError> {
    edits(exec);
    let req = calls::GraphMemcpyNodeSetParams::Request {
        node: GraphNode(node as u64),
        exec: GraphExec(exec),
        copy: node_copy(p)?,
    };
    client::call(req).map(drop)
}

fn set_memset(node: *mut c_void, exec: u64, p: *const MemsetNodeParams) -> Result<(), CuError> {
    edits(exec);
    // SAFETY: NULL or valid, as the export's caller vouches.
    let p = unsafe { p.as_ref() }.ok_or(CuError::INVALID_VALUE)?;
    let req = calls::GraphMemsetNodeSetParams::Request {
        node: GraphNode(node as u64),
        exec: GraphExec(exec),
        dst: DevPtr(p.dst),
        pitch: p.pitch as u64,
        value: p.value,
        elementSize: p.element_size,
        width: p.width as u64,
        height: p.height as u64,
    };
    client::call(req).map(drop)
}

fn get_memset(node: *mut c_void, p: *mut MemsetNodeParams) -> Result<(), CuError> {
    check_out(p)?;
    let r = client::call(calls::GraphMemsetNodeParams::Request { node: GraphNode(node as u64) })?;
    let params = MemsetNodeParams {
        dst: r.dst.0,
        pitch: r.pitch as usize,
        value: r.value,
        element_size: r.elementSize,
        width: r.width as usize,
        height: r.height as usize,
    };
    // SAFETY: checked non-NULL; the caller vouches for it.
    unsafe { write_out(p, params) };
    Ok(())
}

fn get_memcpy(node: *mut c_void, p: *mut Memcpy3D) -> Result<(), CuError> {
    check_out(p)?;
    let r = client::call(calls::GraphMemcpyNodeParams::Request { node: GraphNode(node as u64) })?;
    let params = program_copy(&r.copy)?;
    // SAFETY: checked non-NULL; the caller vouches for it.
    unsafe { write_out(p, params) };
    Ok(())
}

/// A child graph set into an executable graph's node, as XLA does for
/// each of its nested command buffers at every step (alternating between
/// graphs traced for different buffers), is posted where the same set
/// succeeded before and no graph has changed since (no capture runs and no
/// call that may change one was made, `super::before_call`): the driver
/// checks the child against the node's own graph, which has not changed
/// either, so it takes it again.
fn set_child(node: *mut c_void, exec: u64, child: *mut c_void) -> Result<(), CuError> {
    let req = calls::GraphChildNodeSetParams::Request {
        node: GraphNode(node as u64),
        exec: GraphExec(exec),
        child: Graph(child as u64),
    };
    if exec == 0 || crate::graph::capturing() {
        return client::call(req).map(drop);
    }
    crate::memo::GRAPH_SETS.repeat(exec, req)
}

/// A node's parameters set in its graph, rather than in an executable
/// graph, change the graph.
fn edits(exec: u64) {
    if exec == 0 {
        crate::memo::GRAPH_SETS.forget();
    }
}

fn set_event(node: *mut c_void, exec: u64, event: *mut c_void, wait: bool) -> Result<(), CuError> {
    edits(exec);
    let req = calls::GraphEventNodeSetEvent::Request {
        node: GraphNode(node as u64),
        exec: GraphExec(exec),
        event: Event(event as u64),
        wait,
    };
    client::call(req).map(drop)
}

/// `CUgraphNodeParams`: a node type, then that type's parameters.
#[repr(C)]
pub struct NodeParams {
    kind: u32,
    reserved: [i32; 3],
    params: [u64; 29],
    reserved2: i64,
}

const _: () = assert!(std::mem::size_of::<NodeParams>() == 256);

/// `CUDA_MEMCPY_NODE_PARAMS`.
#[repr(C)]
struct MemcpyNodeParams {
    flags: i32,
    reserved: i32,
    ctx: *mut c_void,
    copy: Memcpy3D,
}

/// `CUDA_CHILD_GRAPH_NODE_PARAMS`.
#[repr(C)]
struct ChildGraphNodeParams {
    graph: *mut c_void,
    ownership: u32,
}

/// `CUgraphNodeType` values of the nodes gpuplex builds.
const NODE_KERNEL: u32 = 0;
const NODE_MEMCPY: u32 = 1;
const NODE_MEMSET: u32 = 2;
const NODE_HOST: u32 = 3;
const NODE_GRAPH: u32 = 4;
const NODE_EMPTY: u32 = 5;
const NODE_WAIT_EVENT: u32 = 6;
const NODE_EVENT_RECORD: u32 = 7;
const NODE_MEM_ALLOC: u32 = 10;
const NODE_MEM_FREE: u32 = 11;
const NODE_CONDITIONAL: u32 = 13;

fn unsupported_node(call: &str, kind: u32) -> CuError {
    crate::log::warn(&format!("{call}: graph nodes of type {kind} are not supported by gpuplex"));
    CuError::NOT_SUPPORTED
}

/// `cuGraphAddNode`: the node the parameters' type names, made as by that
/// type's own call. Each type's parameters begin the union, and the kernel
/// node's (`CUDA_KERNEL_NODE_PARAMS_v3`) are laid out as v2's.
///
/// # Safety
/// `p` is NULL or valid for a read, with its type's parameters as the CUDA API requires.
unsafe fn add_any(out: Out, graph: *mut c_void, d: Seq<u64>, p: *const NodeParams) -> Result<(), CuError> {
    // The parameters as written to: an allocation node's address and a
    // conditional node's bodies go back into them (the C API takes them as
    // mutable).
    // SAFETY: per the contract, when not NULL.
    let written = (!p.is_null()).then(|| unsafe { std::ptr::addr_of!((*p).params) }.cast::<u8>().cast_mut());
    // SAFETY: per the contract.
    let p = unsafe { p.as_ref() }.ok_or(CuError::INVALID_VALUE)?;
    let at = p.params.as_ptr();
    // SAFETY: the union holds the parameters of `p.kind`, per the contract.
    unsafe {
        match p.kind {
            NODE_KERNEL => add_kernel(out, graph, d, kernel_v2(at.cast())?),
            NODE_MEMCPY => add(out, || memcpy_node(graph, d, &(*at.cast::<MemcpyNodeParams>()).copy)),
            NODE_MEMSET => add(out, || memset_node(graph, d, at.cast())),
            NODE_HOST => add_host(out, graph, d, at.cast()),
            NODE_GRAPH => {
                let child = &*at.cast::<ChildGraphNodeParams>();
                if child.ownership != 0 {
                    crate::log::warn("cuGraphAddNode: a child graph moved into its node is not supported by gpuplex");
                    return Err(CuError::NOT_SUPPORTED);
                }
                add(out, || child_node(graph, d, child.graph))
            }
            NODE_EMPTY => add(out, || empty_node(graph, d)),
            NODE_WAIT_EVENT => add(out, || event_node(graph, d, *at.cast::<*mut c_void>(), true)),
            NODE_EVENT_RECORD => add(out, || event_node(graph, d, *at.cast::<*mut c_void>(), false)),
            // The address goes back into the caller's parameters, as the driver writes it.
            NODE_MEM_ALLOC => super::memory::add_alloc(out, graph, d, written.expect("not NULL").cast()),
            NODE_MEM_FREE => add(out, || super::memory::free_node(graph, d, *at.cast::<u64>())),
            // The body graphs go back into the caller's parameters.
            NODE_CONDITIONAL => super::conditional::add(out, graph, d, written.expect("not NULL").cast()),
            kind => Err(unsupported_node("cuGraphAddNode", kind)),
        }
    }
}

/// `cuGraphAddNode_v2`. Edges with data (programmatic ones) are added
/// after the node, with their data; if the driver refuses them, the node
/// goes again.
///
/// # Safety
/// As for [`add_any`]; `d` holds `n` nodes.
unsafe fn add_with_edges(
    out: Out,
    graph: *mut c_void,
    d: Deps,
    data: Seq<u64>,
    n: usize,
    p: *const NodeParams,
) -> Result<(), CuError> {
    let from = deps(d, n)?;
    if data.0.is_empty() {
        // SAFETY: per the contract.
        return unsafe { add_any(out, graph, from, p) };
    }
    // SAFETY: per the contract; `out` was written on success.
    let node = unsafe {
        add_any(out, graph, Seq(Vec::new()), p)?;
        *out as u64
    };
    let req = calls::GraphDependencies::Request {
        graph: Graph(graph as u64),
        from,
        to: Seq(vec![node; n]),
        data,
        remove: false,
    };
    client::call(req).map(drop).inspect_err(|_| {
        let _ = client::call(calls::cuGraphDestroyNode::Request { hNode: GraphNode(node) });
    })
}

/// `cuGraphNodeSetParams` and `cuGraphExecNodeSetParams` (`exec` not 0).
///
/// # Safety
/// As for [`add_any`].
unsafe fn set_any(node: *mut c_void, exec: u64, p: *const NodeParams) -> Result<(), CuError> {
    // SAFETY: per the contract.
    let p = unsafe { p.as_ref() }.ok_or(CuError::INVALID_VALUE)?;
    let at = p.params.as_ptr();
    // SAFETY: as in `add_any`.
    unsafe {
        match p.kind {
            NODE_KERNEL => set_kernel(node, exec, kernel_v2(at.cast())?),
            NODE_MEMCPY => set_memcpy(node, exec, &(*at.cast::<MemcpyNodeParams>()).copy),
            NODE_MEMSET => set_memset(node, exec, at.cast()),
            NODE_HOST => set_host(node, exec, at.cast()),
            NODE_GRAPH => set_child(node, exec, (*at.cast::<ChildGraphNodeParams>()).graph),
            NODE_WAIT_EVENT => set_event(node, exec, *at.cast::<*mut c_void>(), true),
            NODE_EVENT_RECORD => set_event(node, exec, *at.cast::<*mut c_void>(), false),
            kind => Err(unsupported_node("cuGraphNodeSetParams", kind)),
        }
    }
}

fn event_node(graph: *mut c_void, d: Seq<u64>, event: *mut c_void, wait: bool) -> Result<GraphNode, CuError> {
    let req =
        calls::GraphAddEventNode::Request { graph: Graph(graph as u64), deps: d, event: Event(event as u64), wait };
    Ok(client::call(req)?.node)
}

/// `CUgraphEdgeData`: ports and type, one byte each, then 5 reserved.
pub type EdgeData = [u8; 8];

/// `n` edges' data as sent: none where every edge is the default.
///
/// # Safety
/// `data` is NULL or valid for `n` reads.
pub(super) unsafe fn edge_data(data: *const EdgeData, n: usize) -> Seq<u64> {
    if data.is_null() || n == 0 {
        return Seq(Vec::new());
    }
    // SAFETY: per the contract; the structure is bytes, aligned anywhere.
    let data: Vec<u64> =
        unsafe { std::slice::from_raw_parts(data, n) }.iter().map(|&d| u64::from_le_bytes(d)).collect();
    Seq(if data.iter().all(|&d| d == 0) { Vec::new() } else { data })
}

/// # Safety
/// `data` is NULL or valid for `n` reads.
unsafe fn dependencies(
    graph: *mut c_void,
    from: *const *mut c_void,
    to: *const *mut c_void,
    data: *const EdgeData,
    n: usize,
    remove: bool,
) -> Result<(), CuError> {
    let req = calls::GraphDependencies::Request {
        graph: Graph(graph as u64),
        from: deps(from, n)?,
        to: deps(to, n)?,
        // SAFETY: per the contract.
        data: unsafe { edge_data(data, n) },
        remove,
    };
    client::call(req).map(drop)
}

/// Writes the data of the edges listed, as many as `room`, where asked for.
///
/// # Safety
/// `out` is NULL or valid for `room` writes.
unsafe fn write_edge_data(out: *mut EdgeData, data: &[u64], room: usize) {
    if out.is_null() {
        return;
    }
    for i in 0..room {
        // SAFETY: `i < room`, per the contract.
        unsafe { out.add(i).write(data.get(i).copied().unwrap_or(0).to_le_bytes()) };
    }
}

/// # Safety
/// As for [`write_lists`], `data` as the lists.
unsafe fn edges(
    graph: *mut c_void,
    from: *mut *mut c_void,
    to: *mut *mut c_void,
    data: *mut EdgeData,
    count: *mut usize,
) -> Result<(), CuError> {
    check_out(count)?;
    let reply = client::call(calls::GraphEdges::Request { graph: Graph(graph as u64) })?;
    // SAFETY: per the contract.
    unsafe {
        // A count-only query writes no edges, nor their data.
        if !(from.is_null() && to.is_null()) {
            write_edge_data(data, &reply.data.0, *count);
        }
        write_lists(count, &mut [(from, &reply.from.0), (to, &reply.to.0)]);
    }
    Ok(())
}

/// # Safety
/// As for [`write_lists`], `data` as the list.
unsafe fn node_edges(
    node: *mut c_void,
    out: *mut *mut c_void,
    data: *mut EdgeData,
    count: *mut usize,
    dependents: bool,
) -> Result<(), CuError> {
    check_out(count)?;
    let reply = client::call(calls::GraphNodeEdges::Request { node: GraphNode(node as u64), dependents })?;
    // SAFETY: per the contract.
    unsafe {
        if !out.is_null() {
            write_edge_data(data, &reply.data.0, *count);
        }
        write_lists(count, &mut [(out, &reply.nodes.0)]);
    }
    Ok(())
}

/// # Safety
/// `info` is valid for a write.
unsafe fn exec_update(exec: *mut c_void, graph: *mut c_void, info: *mut ExecUpdateResultInfo) -> Result<(), CuError> {
    check_out(info)?;
    let reply =
        client::call(calls::GraphExecUpdate::Request { exec: GraphExec(exec as u64), graph: Graph(graph as u64) })?;
    let node = |n: GraphNode| n.0 as *mut c_void;
    let result = ExecUpdateResultInfo {
        result: reply.result,
        error_node: node(reply.errorNode),
        error_from: node(reply.errorFromNode),
    };
    // SAFETY: checked non-NULL; per the contract.
    unsafe { write_out(info, result) };
    CuError::check(reply.status)
}

/// `cuGraphExecUpdate` of CUDA 11, which names only the node that failed.
///
/// # Safety
/// `error_node` and `result` are valid for a write.
unsafe fn exec_update_v1(
    exec: *mut c_void,
    graph: *mut c_void,
    error_node: Out,
    result: *mut u32,
) -> Result<(), CuError> {
    check_out(error_node)?;
    check_out(result)?;
    let mut info =
        ExecUpdateResultInfo { result: 0, error_node: std::ptr::null_mut(), error_from: std::ptr::null_mut() };
    // SAFETY: a local to write to.
    let outcome = unsafe { exec_update(exec, graph, &mut info) };
    // SAFETY: checked non-NULL; the caller vouches for them.
    unsafe {
        write_out(error_node, info.error_node);
        write_out(result, info.result);
    }
    outcome
}

type Deps = *const *mut c_void;
type Out = *mut *mut c_void;
type HostFn = crate::host_calls::HostFn;

// Every export's pointers are as the CUDA API requires; the helpers read
// and write them only as its contract allows.
exports! {
    cuGraphAddKernelNode(out: Out, g: *mut c_void, d: Deps, n: usize, p: *const KernelNodeParams) =>
        // SAFETY: per the export's contract.
        add_kernel(out, g, deps(d, n)?, unsafe { kernel_v1(p, std::ptr::null_mut())? });
    cuGraphAddKernelNode_v2(out: Out, g: *mut c_void, d: Deps, n: usize, p: *const KernelNodeParamsV2) =>
        // SAFETY: per the export's contract.
        add_kernel(out, g, deps(d, n)?, unsafe { kernel_v2(p)? });
    cuGraphKernelNodeSetParams(node: *mut c_void, p: *const KernelNodeParams) =>
        // SAFETY: per the export's contract.
        set_kernel(node, 0, unsafe { kernel_v1(p, std::ptr::null_mut())? });
    cuGraphKernelNodeSetParams_v2(node: *mut c_void, p: *const KernelNodeParamsV2) =>
        // SAFETY: per the export's contract.
        set_kernel(node, 0, unsafe { kernel_v2(p)? });
    cuGraphExecKernelNodeSetParams(e: *mut c_void, node: *mut c_void, p: *const KernelNodeParams) =>
        // SAFETY: per the export's contract.
        set_kernel(node, e as u64, unsafe { kernel_v1(p, std::ptr::null_mut())? });
    cuGraphExecKernelNodeSetParams_v2(e: *mut c_void, node: *mut c_void, p: *const KernelNodeParamsV2) =>
        // SAFETY: per the export's contract.
        set_kernel(node, e as u64, unsafe { kernel_v2(p)? });
    cuGraphKernelNodeGetParams(node: *mut c_void, p: *mut KernelNodeParams) =>
        // SAFETY: per the export's contract.
        unsafe { get_kernel(node, p) };
    cuGraphKernelNodeGetParams_v2(node: *mut c_void, p: *mut KernelNodeParamsV2) =>
        // SAFETY: per the export's contract; v2 begins with v1, and a node
        // this process made names its function, not a kernel.
        unsafe {
            get_kernel(node, p.cast())?;
            (*p).kern = std::ptr::null_mut();
            (*p).ctx = std::ptr::null_mut();
            Ok(())
        };
    cuGraphAddMemcpyNode(out: Out, g: *mut c_void, d: Deps, n: usize, p: *const Memcpy3D, _ctx: *mut c_void) =>
        add(out, || memcpy_node(g, deps(d, n)?, p));
    cuGraphAddMemsetNode(out: Out, g: *mut c_void, d: Deps, n: usize, p: *const MemsetNodeParams, _ctx: *mut c_void) =>
        add(out, || memset_node(g, deps(d, n)?, p));
    cuGraphAddEmptyNode(out: Out, g: *mut c_void, d: Deps, n: usize) =>
        add(out, || empty_node(g, deps(d, n)?));
    cuGraphAddChildGraphNode(out: Out, g: *mut c_void, d: Deps, n: usize, child: *mut c_void) =>
        add(out, || child_node(g, deps(d, n)?, child));
    cuGraphAddEventRecordNode(out: Out, g: *mut c_void, d: Deps, n: usize, e: *mut c_void) =>
        add(out, || event_node(g, deps(d, n)?, e, false));
    cuGraphAddEventWaitNode(out: Out, g: *mut c_void, d: Deps, n: usize, e: *mut c_void) =>
        add(out, || event_node(g, deps(d, n)?, e, true));
    cuGraphAddDependencies(g: *mut c_void, from: Deps, to: Deps, n: usize) =>
        // SAFETY: no edge data.
        unsafe { dependencies(g, from, to, std::ptr::null(), n, false) };
    cuGraphAddDependencies_v2(g: *mut c_void, from: Deps, to: Deps, data: *const EdgeData, n: usize) =>
        // SAFETY: per the export's contract.
        unsafe { dependencies(g, from, to, data, n, false) };
    cuGraphRemoveDependencies(g: *mut c_void, from: Deps, to: Deps, n: usize) =>
        // SAFETY: no edge data.
        unsafe { dependencies(g, from, to, std::ptr::null(), n, true) };
    cuGraphRemoveDependencies_v2(g: *mut c_void, from: Deps, to: Deps, data: *const EdgeData, n: usize) =>
        // SAFETY: per the export's contract.
        unsafe { dependencies(g, from, to, data, n, true) };
    cuGraphGetEdges(g: *mut c_void, from: Out, to: Out, count: *mut usize) =>
        // SAFETY: per the export's contract.
        unsafe { edges(g, from, to, std::ptr::null_mut(), count) };
    cuGraphGetEdges_v2(g: *mut c_void, from: Out, to: Out, data: *mut EdgeData, count: *mut usize) =>
        // SAFETY: per the export's contract.
        unsafe { edges(g, from, to, data, count) };
    cuGraphNodeGetDependencies(node: *mut c_void, out: Out, count: *mut usize) =>
        // SAFETY: per the export's contract.
        unsafe { node_edges(node, out, std::ptr::null_mut(), count, false) };
    cuGraphNodeGetDependencies_v2(node: *mut c_void, out: Out, data: *mut EdgeData, count: *mut usize) =>
        // SAFETY: per the export's contract.
        unsafe { node_edges(node, out, data, count, false) };
    cuGraphNodeGetDependentNodes(node: *mut c_void, out: Out, count: *mut usize) =>
        // SAFETY: per the export's contract.
        unsafe { node_edges(node, out, std::ptr::null_mut(), count, true) };
    cuGraphNodeGetDependentNodes_v2(node: *mut c_void, out: Out, data: *mut EdgeData, count: *mut usize) =>
        // SAFETY: per the export's contract.
        unsafe { node_edges(node, out, data, count, true) };
    cuGraphAddHostNode(out: Out, g: *mut c_void, d: Deps, n: usize, p: *const HostNodeParams) =>
        add_host(out, g, deps(d, n)?, p);
    cuGraphHostNodeSetParams(node: *mut c_void, p: *const HostNodeParams) => set_host(node, 0, p);
    cuGraphExecHostNodeSetParams(e: *mut c_void, node: *mut c_void, p: *const HostNodeParams) =>
        set_host(node, e as u64, p);
    cuGraphHostNodeGetParams(node: *mut c_void, p: *mut HostNodeParams) => get_host(node, p);
    cuGraphMemcpyNodeSetParams(node: *mut c_void, p: *const Memcpy3D) => set_memcpy(node, 0, p);
    cuGraphExecMemcpyNodeSetParams(e: *mut c_void, node: *mut c_void, p: *const Memcpy3D, _ctx: *mut c_void) =>
        set_memcpy(node, e as u64, p);
    cuGraphMemsetNodeSetParams(node: *mut c_void, p: *const MemsetNodeParams) => set_memset(node, 0, p);
    cuGraphExecMemsetNodeSetParams(e: *mut c_void, node: *mut c_void, p: *const MemsetNodeParams, _ctx: *mut c_void) =>
        set_memset(node, e as u64, p);
    cuGraphExecChildGraphNodeSetParams(e: *mut c_void, node: *mut c_void, child: *mut c_void) =>
        set_child(node, e as u64, child);
    cuGraphEventRecordNodeSetEvent(node: *mut c_void, event: *mut c_void) => set_event(node, 0, event, false);
    cuGraphEventWaitNodeSetEvent(node: *mut c_void, event: *mut c_void) => set_event(node, 0, event, true);
    cuGraphExecEventRecordNodeSetEvent(e: *mut c_void, node: *mut c_void, event: *mut c_void) =>
        set_event(node, e as u64, event, false);
    cuGraphExecEventWaitNodeSetEvent(e: *mut c_void, node: *mut c_void, event: *mut c_void) =>
        set_event(node, e as u64, event, true);
    cuGraphAddNode(out: Out, g: *mut c_void, d: Deps, n: usize, p: *const NodeParams) =>
        // SAFETY: per the export's contract.
        unsafe { add_any(out, g, deps(d, n)?, p) };
    cuGraphAddNode_v2(out: Out, g: *mut c_void, d: Deps, data: *const EdgeData, n: usize, p: *const NodeParams) =>
        // SAFETY: per the export's contract.
        unsafe { add_with_edges(out, g, d, edge_data(data, n), n, p) };
    cuGraphNodeSetParams(node: *mut c_void, p: *const NodeParams) =>
        // SAFETY: per the export's contract.
        unsafe { set_any(node, 0, p) };
    cuGraphExecNodeSetParams(e: *mut c_void, node: *mut c_void, p: *const NodeParams) =>
        // SAFETY: per the export's contract.
        unsafe { set_any(node, e as u64, p) };
    cuGraphExecUpdate_v2(e: *mut c_void, g: *mut c_void, info: *mut ExecUpdateResultInfo) =>
        // SAFETY: per the export's contract.
        unsafe { exec_update(e, g, info) };
    cuGraphExecUpdate(e: *mut c_void, g: *mut c_void, error_node: Out, result: *mut u32) =>
        // SAFETY: per the export's contract.
        unsafe { exec_update_v1(e, g, error_node, result) };
    cuGraphMemsetNodeGetParams(node: *mut c_void, p: *mut MemsetNodeParams) => get_memset(node, p);
    cuGraphMemcpyNodeGetParams(node: *mut c_void, p: *mut Memcpy3D) => get_memcpy(node, p);
}
