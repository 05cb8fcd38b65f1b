//! Graphs on the real driver: capture from streams, instantiation and
//! launch. The session passes only its own live graphs, executable graphs
//! and nodes, and streams of the right context.

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

use super::api::{self, check};
use super::{enter, handle, obj, query, raw, BResult, CaptureInfo, Obj};

pub(super) fn begin_capture(ctx: Obj, stream: Obj, mode: u32) -> BResult<()> {
    enter(ctx)?;
    // SAFETY: a live stream of `ctx`; an unknown mode is the driver's to refuse.
    check(unsafe { api::cuStreamBeginCapture_v2(raw(stream), mode as c_int) })
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
    let mut nodes: Vec<*mut c_void> = vec![null_mut(); count];
    check(list(nodes.as_mut_ptr(), &mut count))?;
    nodes.truncate(count);
    Ok(nodes.into_iter().map(obj).collect())
}

pub(super) fn node_type(node: Obj) -> BResult<u32> {
    // SAFETY: a live node of one of the session's graphs; out-pointer to a local.
    query(|t: *mut c_int| unsafe { api::cuGraphNodeGetType(raw(node), t) }).map(|t| t as u32)
}
