//! Graphs on the real driver: capture from streams, graphs built node by
//! node, instantiation and launch. The session passes only its own live
//! graphs, executable graphs and nodes, and streams of the right context.

use std::ffi::{c_int, c_uint, c_void, CString};
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::{FromRawFd, OwnedFd};
use std::ptr::null_mut;

use gpuplex_protocol::{CallError, CuError, MAX_PAYLOAD};

use super::api::{self, check};
use super::{
    arrays, enter, graph_memory, handle, obj, raw, size, with_packed, BResult, CaptureInfo, Cuda, Launch, Obj,
};
use crate::backend::{Conditional, Copy3D, ExecUpdate, GraphAlloc, Graphs, HostFn, Memset, NodeWork};

pub(super) fn begin_capture(ctx: Obj, stream: Obj, mode: u32) -> BResult<()> {
    enter(ctx)?;
    // SAFETY: a live stream of `ctx`; an unknown mode is the driver's to refuse.
    check(unsafe { api::cuStreamBeginCapture_v2(raw(stream), mode as c_int) })
}

pub(super) fn begin_capture_to_graph(
    ctx: Obj,
    stream: Obj,
    graph: Obj,
    deps: &[Obj],
    data: &[u64],
    mode: u32,
) -> BResult<()> {
    enter(ctx)?;
    let deps = raw_nodes(deps);
    let data = if data.len() == deps.len() && !data.is_empty() { data.as_ptr() } else { std::ptr::null() };
    // SAFETY: a live stream of `ctx`, a live graph and nodes of it, as many
    // edge data or none.
    check(unsafe {
        api::cuStreamBeginCaptureToGraph(raw(stream), raw(graph), deps.as_ptr(), data, deps.len(), mode as c_int)
    })
}

pub(super) fn end_capture(ctx: Obj, stream: Obj) -> BResult<Obj> {
    enter(ctx)?;
    // SAFETY: as above; out-pointer to a local.
    handle(|g: *mut *mut c_void| unsafe { api::cuStreamEndCapture(raw(stream), g) })
}

pub(super) fn capture_info(ctx: Obj, stream: Obj, edges: bool) -> BResult<CaptureInfo> {
    enter(ctx)?;
    let (mut status, mut id, mut graph, mut count) = (0 as c_int, 0u64, null_mut(), 0usize);
    let (mut deps, mut edge_data): (*const *mut c_void, *const u64) = (std::ptr::null(), std::ptr::null());
    let edge_out = if edges { &mut edge_data as *mut *const u64 } else { null_mut() };
    // SAFETY: out-pointers to locals; the driver owns the arrays it points
    // them at, valid until the stream's next call, and they are copied here.
    check(unsafe {
        api::cuStreamGetCaptureInfo_v3(raw(stream), &mut status, &mut id, &mut graph, &mut deps, edge_out, &mut count)
    })?;
    let copy = |p: *const u64| {
        if p.is_null() {
            return Vec::new();
        }
        // SAFETY: `count` entries, per the driver, when not NULL.
        unsafe { std::slice::from_raw_parts(p, count) }.to_vec()
    };
    Ok(CaptureInfo {
        status: status as u32,
        id,
        graph: obj(graph),
        deps: copy(deps.cast()).into_iter().map(Obj).collect(),
        edges: copy(edge_data),
    })
}

pub(super) fn update_capture_deps(ctx: Obj, stream: Obj, deps: &[Obj], flags: u32) -> BResult<()> {
    enter(ctx)?;
    let mut deps = raw_nodes(deps);
    // SAFETY: a live stream of `ctx`; `deps.len()` live nodes of the session's.
    check(unsafe { api::cuStreamUpdateCaptureDependencies(raw(stream), deps.as_mut_ptr(), deps.len(), flags) })
}

pub(super) fn exchange_capture_mode(mode: u32) -> BResult<u32> {
    let mut mode = mode as c_int;
    // SAFETY: in-out pointer to a local.
    check(unsafe { api::cuThreadExchangeStreamCaptureMode(&mut mode) })?;
    Ok(mode as u32)
}

pub(super) fn create(flags: u32) -> BResult<Obj> {
    // SAFETY: out-pointer to a local.
    handle(|g: *mut *mut c_void| unsafe { api::cuGraphCreate(g, flags) })
}

pub(super) fn destroy(graph: Obj) -> BResult<()> {
    // SAFETY: a live graph of the session's.
    check(unsafe { api::cuGraphDestroy(raw(graph)) })
}

pub(super) fn instantiate(ctx: Obj, graph: Obj, flags: u64) -> BResult<Obj> {
    enter(ctx)?;
    // SAFETY: a live graph; out-pointer to a local.
    handle(|e: *mut *mut c_void| unsafe { api::cuGraphInstantiateWithFlags(e, raw(graph), flags) })
}

pub(super) fn exec_destroy(exec: Obj) -> BResult<()> {
    // SAFETY: a live executable graph of the session's.
    check(unsafe { api::cuGraphExecDestroy(raw(exec)) })
}

pub(super) fn launch(ctx: Obj, exec: Obj, stream: Obj) -> BResult<()> {
    enter(ctx)?;
    // SAFETY: a live executable graph; a live or special stream.
    check(unsafe { api::cuGraphLaunch(raw(exec), raw(stream)) })
}

pub(super) fn upload(ctx: Obj, exec: Obj, stream: Obj) -> BResult<()> {
    enter(ctx)?;
    // SAFETY: as above.
    check(unsafe { api::cuGraphUpload(raw(exec), raw(stream)) })
}

pub(super) fn nodes(graph: Obj, roots: bool) -> BResult<Vec<Obj>> {
    let list = |nodes: *mut *mut c_void, count: *mut usize| {
        // SAFETY: a live graph; `nodes` NULL (asking the count) or room for `*count`.
        unsafe {
            if roots {
                api::cuGraphGetRootNodes(raw(graph), nodes, count)
            } else {
                api::cuGraphGetNodes(raw(graph), nodes, count)
            }
        }
    };
    let mut count = 0usize;
    check(list(null_mut(), &mut count))?;
    // The driver refuses a list with room for nothing.
    if count == 0 {
        return Ok(Vec::new());
    }
    let mut nodes: Vec<*mut c_void> = vec![null_mut(); count];
    check(list(nodes.as_mut_ptr(), &mut count))?;
    nodes.truncate(count);
    Ok(nodes.into_iter().map(obj).collect())
}

/// `CUDA_KERNEL_NODE_PARAMS_v2`.
#[repr(C)]
pub(super) struct KernelNodeParams {
    func: *mut c_void,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem: c_uint,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
    kern: *mut c_void,
    ctx: *mut c_void,
}

/// `CUDA_MEMSET_NODE_PARAMS`.
#[repr(C)]
pub(super) struct MemsetNodeParams {
    dst: u64,
    pitch: usize,
    value: c_uint,
    element_size: c_uint,
    width: usize,
    height: usize,
}

/// `CUDA_HOST_NODE_PARAMS`.
#[repr(C)]
pub(super) struct HostNodeParams {
    run: unsafe extern "C" fn(*mut c_void),
    data: *mut c_void,
}

impl HostNodeParams {
    fn of(f: HostFn) -> HostNodeParams {
        HostNodeParams { run: f.run, data: f.data }
    }
}

/// `CUgraphNodeParams` holding a conditional node's parameters
/// (`CUDA_CONDITIONAL_NODE_PARAMS`), the one kind made through the generic
/// `cuGraphAddNode`; the driver writes the node's body graphs' array into it.
#[repr(C)]
pub(super) struct ConditionalNodeParams {
    node_type: c_int,
    reserved0: [c_int; 3],
    handle: u64,
    kind: c_int,
    size: c_uint,
    bodies: *mut *mut c_void,
    ctx: *mut c_void,
    /// The rest of the union (29 words in all) and `reserved2`.
    rest: [i64; 26],
}

const _: () = assert!(std::mem::size_of::<ConditionalNodeParams>() == 256);

/// `CU_GRAPH_NODE_TYPE_CONDITIONAL`.
const NODE_CONDITIONAL: c_int = 13;

/// `CUgraphExecUpdateResultInfo`.
#[repr(C)]
pub(super) struct ExecUpdateResultInfo {
    result: c_int,
    error_node: *mut c_void,
    error_from: *mut c_void,
}

/// Calls `f` with the parameters of a kernel node, valid across the call.
fn kernel_params<T>(func: Obj, launch: &Launch, params: &[u8], f: impl FnOnce(&KernelNodeParams) -> T) -> T {
    with_packed(params, |extra| {
        let p = KernelNodeParams {
            func: raw(func),
            grid: launch.grid,
            block: launch.block,
            shared_mem: launch.shared_mem,
            kernel_params: null_mut(),
            extra,
            kern: null_mut(),
            ctx: null_mut(),
        };
        f(&p)
    })
}

pub(super) fn raw_nodes(nodes: &[Obj]) -> Vec<*mut c_void> {
    nodes.iter().map(|&n| raw(n)).collect()
}

/// # Safety
/// A memcpy node's host ends stay valid while the graph may run.
pub(super) unsafe fn add_node(ctx: Obj, graph: Obj, deps: &[Obj], node: &NodeWork<'_>) -> BResult<Obj> {
    enter(ctx)?;
    let (g, deps) = (raw(graph), raw_nodes(deps));
    let (d, n) = (deps.as_ptr(), deps.len());
    let (copy, memset) = structures(node)?;
    // SAFETY: out-pointer to a local; a live graph of the session's and its
    // nodes; the parameter structures live across the call, which copies
    // them; handles and ranges the session checked.
    handle(|out| unsafe {
        match *node {
            NodeWork::Kernel { func, launch, params } => {
                kernel_params(func, launch, params, |p| api::cuGraphAddKernelNode_v2(out, g, d, n, p))
            }
            NodeWork::Memcpy(_) => api::cuGraphAddMemcpyNode(out, g, d, n, copy.as_ref().expect("made"), raw(ctx)),
            NodeWork::Memset(_) => api::cuGraphAddMemsetNode(out, g, d, n, memset.as_ref().expect("made"), raw(ctx)),
            NodeWork::Empty => api::cuGraphAddEmptyNode(out, g, d, n),
            NodeWork::Child(child) => api::cuGraphAddChildGraphNode(out, g, d, n, raw(child)),
            NodeWork::Event { event, wait: false } => api::cuGraphAddEventRecordNode(out, g, d, n, raw(event)),
            NodeWork::Event { event, wait: true } => api::cuGraphAddEventWaitNode(out, g, d, n, raw(event)),
            NodeWork::Host(f) => api::cuGraphAddHostNode(out, g, d, n, &HostNodeParams::of(f)),
            NodeWork::MemFree(dptr) => api::cuGraphAddMemFreeNode(out, g, d, n, dptr),
        }
    })
}

pub(super) fn add_conditional_node(ctx: Obj, graph: Obj, deps: &[Obj], cond: &Conditional) -> BResult<(Obj, Vec<Obj>)> {
    enter(ctx)?;
    let deps = raw_nodes(deps);
    let mut p = ConditionalNodeParams {
        node_type: NODE_CONDITIONAL,
        reserved0: [0; 3],
        handle: cond.handle,
        kind: cond.kind as c_int,
        size: cond.size,
        bodies: null_mut(),
        ctx: raw(ctx),
        rest: [0; 26],
    };
    // SAFETY: out-pointer to a local; a live graph and nodes of it; the
    // parameters live across the call, which reads them and writes the
    // bodies' array into them.
    let node = handle(|out| unsafe {
        api::cuGraphAddNode_v2(out, raw(graph), deps.as_ptr(), std::ptr::null(), deps.len(), &mut p)
    })?;
    if p.bodies.is_null() {
        return Ok((node, Vec::new()));
    }
    // SAFETY: the driver's array of `size` graphs, valid while the node lives.
    let bodies = unsafe { std::slice::from_raw_parts(p.bodies, cond.size as usize) };
    Ok((node, bodies.iter().map(|&g| obj(g)).collect()))
}

pub(super) fn child_graph(node: Obj) -> BResult<Obj> {
    // SAFETY: a live node of the session's; out-pointer to a local.
    handle(|g: *mut *mut c_void| unsafe { api::cuGraphChildGraphNodeGetGraph(raw(node), g) })
}

pub(super) fn memset_params(node: Obj) -> BResult<Memset> {
    let mut p = MemsetNodeParams { dst: 0, pitch: 0, value: 0, element_size: 0, width: 0, height: 0 };
    // SAFETY: as above.
    check(unsafe { api::cuGraphMemsetNodeGetParams(raw(node), &mut p) })?;
    Ok(Memset {
        dst: p.dst,
        pitch: p.pitch as u64,
        value: p.value,
        element_size: p.element_size,
        width: p.width as u64,
        height: p.height as u64,
    })
}

pub(super) fn dependencies(graph: Obj, from: &[Obj], to: &[Obj], data: &[u64], remove: bool) -> BResult<()> {
    let (from, to) = (raw_nodes(from), raw_nodes(to));
    let n = from.len().min(to.len());
    let data = if data.len() >= n && !data.is_empty() { data.as_ptr() } else { std::ptr::null() };
    // SAFETY: a live graph and nodes of it, `n` of each, and `n` edge data
    // or none.
    check(unsafe {
        if remove {
            api::cuGraphRemoveDependencies_v2(raw(graph), from.as_ptr(), to.as_ptr(), data, n)
        } else {
            api::cuGraphAddDependencies_v2(raw(graph), from.as_ptr(), to.as_ptr(), data, n)
        }
    })
}

type Listing = (*mut *mut c_void, *mut *mut c_void, *mut u64, *mut usize);

/// Asks a list of the driver twice: its length, then the list.
fn listed(list: impl Fn(Listing) -> api::Raw) -> BResult<Vec<(Obj, Obj, u64)>> {
    let mut count = 0usize;
    check(list((null_mut(), null_mut(), null_mut(), &mut count)))?;
    let (mut a, mut b) = (vec![null_mut(); count], vec![null_mut(); count]);
    let mut data = vec![0u64; count];
    check(list((a.as_mut_ptr(), b.as_mut_ptr(), data.as_mut_ptr(), &mut count)))?;
    Ok(a.into_iter().zip(b).zip(data).take(count).map(|((a, b), d)| (obj(a), obj(b), d)).collect())
}

pub(super) fn edges(graph: Obj) -> BResult<Vec<(Obj, Obj, u64)>> {
    // SAFETY: a live graph; NULL arrays ask the count, else room for `*count`.
    listed(|(from, to, data, count)| unsafe { api::cuGraphGetEdges_v2(raw(graph), from, to, data, count) })
}

/// The driver writes the description to a file: one in memory, read back
/// whole, so that nothing of the guest's touches the server's file system.
pub(super) fn debug_dot(graph: Obj, flags: u32) -> BResult<Vec<u8>> {
    let system = |what: &str, e: std::io::Error| CallError::new(CuError::OPERATING_SYSTEM, format!("{what}: {e}"));
    // SAFETY: a NUL-terminated name; the descriptor returned is owned below.
    let fd = unsafe { libc::memfd_create(c"gpuplex-graph-dot".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(system("memfd_create", std::io::Error::last_os_error()));
    }
    // SAFETY: a descriptor just created and owned by nothing else.
    let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let path = CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL in a number");
    // SAFETY: a live graph; a NUL-terminated path.
    check(unsafe { api::cuGraphDebugDotPrint(raw(graph), path.as_ptr(), flags) })?;
    file.seek(SeekFrom::Start(0)).map_err(|e| system("reading the description", e))?;
    let mut dot = Vec::new();
    let limit = (MAX_PAYLOAD - 64) as u64;
    file.take(limit + 1).read_to_end(&mut dot).map_err(|e| system("reading the description", e))?;
    if dot.len() as u64 > limit {
        return Err(CallError::new(CuError::OUT_OF_MEMORY, "the graph's description is larger than a frame"));
    }
    Ok(dot)
}

pub(super) fn node_edges(node: Obj, dependents: bool) -> BResult<Vec<(Obj, u64)>> {
    // SAFETY: a live node; as above, the second array unused.
    let pairs = listed(|(nodes, _, data, count)| unsafe {
        if dependents {
            api::cuGraphNodeGetDependentNodes_v2(raw(node), nodes, data, count)
        } else {
            api::cuGraphNodeGetDependencies_v2(raw(node), nodes, data, count)
        }
    })?;
    Ok(pairs.into_iter().map(|(n, _, d)| (n, d)).collect())
}

/// The structures the driver copies for a memcpy or memset node, made
/// first: their sizes may not fit.
fn structures(work: &NodeWork<'_>) -> BResult<(Option<arrays::Memcpy3D>, Option<MemsetNodeParams>)> {
    Ok(match *work {
        NodeWork::Memcpy(c) => (Some(arrays::memcpy_3d(c)?), None),
        NodeWork::Memset(m) => (
            None,
            Some(MemsetNodeParams {
                dst: m.dst,
                pitch: size(m.pitch)?,
                value: m.value,
                element_size: m.element_size,
                width: size(m.width)?,
                height: size(m.height)?,
            }),
        ),
        _ => (None, None),
    })
}

/// # Safety
/// As for [`add_node`].
pub(super) unsafe fn node_set(ctx: Obj, node: Obj, exec: Option<Obj>, work: &NodeWork<'_>) -> BResult<()> {
    enter(ctx)?;
    let (n, e) = (raw(node), exec.map(raw::<c_void>));
    let (copy, memset) = structures(work)?;
    check(match *work {
        NodeWork::Kernel { func, launch, params } => kernel_params(func, launch, params, |p| {
            // SAFETY: a live node (and executable graph); the parameters
            // live across the call, which copies them.
            unsafe {
                match e {
                    Some(e) => api::cuGraphExecKernelNodeSetParams_v2(e, n, p),
                    None => api::cuGraphKernelNodeSetParams_v2(n, p),
                }
            }
        }),
        // SAFETY: as above.
        NodeWork::Host(f) => unsafe {
            let p = HostNodeParams::of(f);
            match e {
                Some(e) => api::cuGraphExecHostNodeSetParams(e, n, &p),
                None => api::cuGraphHostNodeSetParams(n, &p),
            }
        },
        // SAFETY: as above; a memcpy node's host ends per the contract.
        NodeWork::Memcpy(_) => unsafe {
            let c = copy.as_ref().expect("made");
            match e {
                Some(e) => api::cuGraphExecMemcpyNodeSetParams(e, n, c, raw(ctx)),
                None => api::cuGraphMemcpyNodeSetParams(n, c),
            }
        },
        // SAFETY: as above.
        NodeWork::Memset(_) => unsafe {
            let m = memset.as_ref().expect("made");
            match e {
                Some(e) => api::cuGraphExecMemsetNodeSetParams(e, n, m, raw(ctx)),
                None => api::cuGraphMemsetNodeSetParams(n, m),
            }
        },
        // SAFETY: as above; a live event of the session's.
        NodeWork::Event { event, wait } => unsafe {
            match (e, wait) {
                (Some(e), true) => api::cuGraphExecEventWaitNodeSetEvent(e, n, raw(event)),
                (Some(e), false) => api::cuGraphExecEventRecordNodeSetEvent(e, n, raw(event)),
                (None, true) => api::cuGraphEventWaitNodeSetEvent(n, raw(event)),
                (None, false) => api::cuGraphEventRecordNodeSetEvent(n, raw(event)),
            }
        },
        NodeWork::Child(child) => match e {
            // SAFETY: as above; a live graph of the session's.
            Some(e) => unsafe { api::cuGraphExecChildGraphNodeSetParams(e, n, raw(child)) },
            None => return Err(CallError::new(CuError::INVALID_VALUE, "a child graph is set in an executable graph")),
        },
        NodeWork::Empty | NodeWork::MemFree(_) => {
            return Err(CallError::new(CuError::INVALID_VALUE, "an empty or free node has nothing to set"))
        }
    })
}

pub(super) fn launch_host_func(ctx: Obj, stream: Obj, f: HostFn) -> BResult<()> {
    enter(ctx)?;
    // SAFETY: a live or special stream; the session keeps the function's
    // data alive while its streams may run it.
    check(unsafe { api::cuLaunchHostFunc(raw(stream), f.run, f.data) })
}

pub(super) fn clone(graph: Obj) -> BResult<Obj> {
    // SAFETY: out-pointer to a local; a live graph.
    handle(|g: *mut *mut c_void| unsafe { api::cuGraphClone(g, raw(graph)) })
}

pub(super) fn find_in_clone(node: Obj, clone: Obj) -> BResult<Obj> {
    // SAFETY: out-pointer to a local; a live node and graph.
    handle(|n: *mut *mut c_void| unsafe { api::cuGraphNodeFindInClone(n, raw(node), raw(clone)) })
}

pub(super) fn destroy_node(node: Obj) -> BResult<()> {
    // SAFETY: a live node, forgotten by the session after this.
    check(unsafe { api::cuGraphDestroyNode(raw(node)) })
}

pub(super) fn exec_update(ctx: Obj, exec: Obj, graph: Obj) -> BResult<ExecUpdate> {
    enter(ctx)?;
    let mut info = ExecUpdateResultInfo { result: 0, error_node: null_mut(), error_from: null_mut() };
    // SAFETY: a live executable graph and graph; out-pointer to a local.
    let status = match unsafe { api::cuGraphExecUpdate_v2(raw(exec), raw(graph), &mut info) } {
        Ok(code) => code,
        // An older driver: `check` says which entry point it lacks.
        missing => return check(missing).map(|()| ExecUpdate::default()),
    };
    Ok(ExecUpdate {
        status,
        result: info.result as u32,
        error_node: obj(info.error_node),
        error_from: obj(info.error_from),
    })
}

impl Graphs for Cuda {
    fn stream_begin_capture(&self, ctx: Obj, stream: Obj, mode: u32) -> BResult<()> {
        begin_capture(ctx, stream, mode)
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
        begin_capture_to_graph(ctx, stream, graph, deps, data, mode)
    }

    fn stream_end_capture(&self, ctx: Obj, stream: Obj) -> BResult<Obj> {
        end_capture(ctx, stream)
    }

    fn stream_capture_info(&self, ctx: Obj, stream: Obj, edges: bool) -> BResult<CaptureInfo> {
        capture_info(ctx, stream, edges)
    }

    fn exchange_capture_mode(&self, mode: u32) -> BResult<u32> {
        exchange_capture_mode(mode)
    }

    fn stream_update_capture_deps(&self, ctx: Obj, stream: Obj, deps: &[Obj], flags: u32) -> BResult<()> {
        update_capture_deps(ctx, stream, deps, flags)
    }

    fn graph_create(&self, flags: u32) -> BResult<Obj> {
        create(flags)
    }

    fn graph_destroy(&self, graph: Obj) -> BResult<()> {
        destroy(graph)
    }

    fn graph_instantiate(&self, ctx: Obj, graph: Obj, flags: u64) -> BResult<Obj> {
        instantiate(ctx, graph, flags)
    }

    fn graph_exec_destroy(&self, exec: Obj) -> BResult<()> {
        exec_destroy(exec)
    }

    fn graph_launch(&self, ctx: Obj, exec: Obj, stream: Obj) -> BResult<()> {
        launch(ctx, exec, stream)
    }

    fn graph_upload(&self, ctx: Obj, exec: Obj, stream: Obj) -> BResult<()> {
        upload(ctx, exec, stream)
    }

    fn graph_nodes(&self, graph: Obj, roots: bool) -> BResult<Vec<Obj>> {
        nodes(graph, roots)
    }

    unsafe fn graph_add_node(&self, ctx: Obj, graph: Obj, deps: &[Obj], node: &NodeWork<'_>) -> BResult<Obj> {
        // SAFETY: the caller's guarantee.
        unsafe { add_node(ctx, graph, deps, node) }
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
        child_graph(node)
    }

    fn graph_memset_node_params(&self, node: Obj) -> BResult<Memset> {
        memset_params(node)
    }

    fn user_object_create(&self, destroy: HostFn, refs: u32, flags: u32) -> BResult<Obj> {
        // SAFETY: the session keeps `destroy.data` alive for as long as the
        // driver may call `destroy.run` with it.
        handle(|o: *mut *mut c_void| unsafe { api::cuUserObjectCreate(o, destroy.data, destroy.run, refs, flags) })
    }

    fn graph_memcpy_node_params(&self, node: Obj) -> BResult<Copy3D> {
        let mut p = arrays::Memcpy3D::empty();
        // SAFETY: the node is live; the driver fills the structure.
        check(unsafe { api::cuGraphMemcpyNodeGetParams(raw(node), &mut p) })?;
        arrays::copy_of(&p)
    }

    fn graph_add_conditional_node(
        &self,
        ctx: Obj,
        graph: Obj,
        deps: &[Obj],
        cond: &Conditional,
    ) -> BResult<(Obj, Vec<Obj>)> {
        add_conditional_node(ctx, graph, deps, cond)
    }

    fn graph_dependencies(&self, graph: Obj, from: &[Obj], to: &[Obj], data: &[u64], remove: bool) -> BResult<()> {
        dependencies(graph, from, to, data, remove)
    }

    fn graph_edges(&self, graph: Obj) -> BResult<Vec<(Obj, Obj, u64)>> {
        edges(graph)
    }

    fn graph_debug_dot(&self, graph: Obj, flags: u32) -> BResult<Vec<u8>> {
        debug_dot(graph, flags)
    }

    fn graph_node_edges(&self, node: Obj, dependents: bool) -> BResult<Vec<(Obj, u64)>> {
        node_edges(node, dependents)
    }

    unsafe fn graph_node_set(&self, ctx: Obj, node: Obj, exec: Option<Obj>, work: &NodeWork<'_>) -> BResult<()> {
        // SAFETY: the caller's guarantee.
        unsafe { node_set(ctx, node, exec, work) }
    }

    fn graph_clone(&self, graph: Obj) -> BResult<Obj> {
        clone(graph)
    }

    fn graph_node_find_in_clone(&self, node: Obj, clone: Obj) -> BResult<Obj> {
        find_in_clone(node, clone)
    }

    fn graph_destroy_node(&self, node: Obj) -> BResult<()> {
        destroy_node(node)
    }

    fn graph_exec_update(&self, ctx: Obj, exec: Obj, graph: Obj) -> BResult<ExecUpdate> {
        exec_update(ctx, exec, graph)
    }
}
