//! Graphs: stream capture, instantiation, launch and the queries programs
//! make of them. Capture itself is the server's driver's; this side keeps
//! which of the process's streams capture, because an asynchronous copy
//! from ordinary memory in a capturing stream is captured from a mirror of
//! that memory (`memory::mirrors`), and while any stream captures, other
//! copies from ordinary memory go to the server in their frames, where the
//! driver refuses them as natively rather than capturing a staging slot's
//! address.

use std::collections::HashSet;
use std::ffi::{c_char, c_void};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use gpuplex_protocol::{calls, CuError, Graph, GraphExec, Opcode, Stream};

mod conditional;
mod memory;
mod nodes;
mod user_objects;

use crate::client;
use crate::context;
use crate::ffi::{check_out, entry, ptsz_stream, stream, write_out, CUresult};

/// Streams capturing now, each with the thread of a per-thread stream.
static CAPTURING: Mutex<Option<HashSet<(u64, u64)>>> = Mutex::new(None);
static CAPTURES: AtomicUsize = AtomicUsize::new(0);

/// Whether any stream of the process is capturing.
pub fn capturing() -> bool {
    CAPTURES.load(Ordering::Relaxed) > 0
}

/// Whether stream `s` (as this thread names it) is capturing.
pub fn is_capturing(s: Stream) -> bool {
    capturing()
        && CAPTURING.lock().unwrap_or_else(PoisonError::into_inner).as_ref().is_some_and(|set| set.contains(&key(s)))
}

fn key(s: Stream) -> (u64, u64) {
    (s.0, if s == Stream::PER_THREAD { context::thread_id() } else { 0 })
}

fn note_capture(s: Stream, on: bool) {
    let mut set = CAPTURING.lock().unwrap_or_else(PoisonError::into_inner);
    let set = set.get_or_insert_with(HashSet::new);
    if on {
        set.insert(key(s))
    } else {
        set.remove(&key(s))
    };
    CAPTURES.store(set.len(), Ordering::Relaxed);
    // Kept answers hold only while nothing captures; one fetched before
    // this is not kept after it.
    crate::memo::CAPTURES.forget();
}

/// Before each call: one that may change a graph, or end an executable
/// graph, makes the child graph sets kept so far ([`nodes`]) uncertain.
pub fn before_call(opcode: Opcode) {
    if opcode.section() == "graphs" && !leaves_graphs(opcode) {
        crate::memo::GRAPH_SETS.forget();
    }
}

/// The graph calls known to change no graph and end no executable one:
/// launches, queries, new graphs, user objects, and updates of nodes, which
/// forget for themselves where they change a graph rather than an
/// executable one. A graph call not listed forgets, so a new row is safe.
fn leaves_graphs(opcode: Opcode) -> bool {
    use Opcode::*;
    matches!(
        opcode,
        CaptureMode
            | StreamBeginCapture
            | StreamCaptureInfo
            | cuGraphCreate
            | cuGraphInstantiateWithFlags
            | cuGraphLaunch
            | cuGraphUpload
            | GraphNodes
            | cuGraphNodeGetType
            | GraphEdges
            | GraphNodeEdges
            | GraphKernelNodeSetParams
            | cuGraphClone
            | cuGraphNodeFindInClone
            | GraphHostNodeSetParams
            | LaunchHostFunc
            | GraphMemcpyNodeSetParams
            | GraphMemsetNodeSetParams
            | GraphEventNodeSetEvent
            | GraphChildNodeSetParams
            | GraphMemAllocNodeParams
            | cuGraphMemFreeNodeGetParams
            | cuDeviceGraphMemTrim
            | cuDeviceGetGraphMemAttribute
            | GraphMemAttributeSet
            | cuGraphNodeGetEnabled
            | cuGraphExecGetFlags
            | cuGraphConditionalHandleCreate
            | cuGraphChildGraphNodeGetGraph
            | cuGraphEventRecordNodeGetEvent
            | cuGraphEventWaitNodeGetEvent
            | cuGraphKernelNodeGetAttribute
            | GraphMemsetNodeParams
            | GraphMemcpyNodeParams
            | UserObjectCreate
            | cuUserObjectRetain
            | cuUserObjectRelease
            | cuGraphRetainUserObject
            | cuGraphReleaseUserObject
    )
}

fn begin(s: Stream, mode: u32) -> Result<(), CuError> {
    client::call(calls::StreamBeginCapture::Request { hStream: s, mode })?;
    note_capture(s, true);
    Ok(())
}

/// `CU_STREAM_CAPTURE_STATUS_NONE`.
const NOT_CAPTURING: u32 = 0;

/// `cuStreamIsCapturing`. While no stream of the process captures, none
/// can (a stream joins a capture only through one that captures), so the
/// server's first answer for a stream is kept until a capture begins
/// ([`note_capture`]) or the stream is destroyed; a bad handle still gets
/// the server's error.
fn is_capturing_query(s: Stream, status: *mut u32) -> Result<(), CuError> {
    check_out(status)?;
    let req = calls::cuStreamIsCapturing::Request { hStream: s };
    let reply = if capturing() {
        client::call(req)?
    } else {
        crate::memo::CAPTURES.keep_if(0, req, |r| r.captureStatus == NOT_CAPTURING && !capturing())?
    };
    // SAFETY: checked non-NULL; the caller vouches for it.
    unsafe { write_out(status, reply.captureStatus) };
    Ok(())
}

/// # Safety
/// `status` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(s: *mut c_void, status: *mut u32) -> CUresult {
    entry("cuStreamIsCapturing", || is_capturing_query(stream(s), status))
}

/// # Safety
/// `status` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing_ptsz(s: *mut c_void, status: *mut u32) -> CUresult {
    entry("cuStreamIsCapturing_ptsz", || is_capturing_query(ptsz_stream(s), status))
}

/// `cuStreamBeginCaptureToGraph`: the capture's work joins the program's
/// graph, after its nodes `deps`.
///
/// # Safety
/// `deps` and `data` are NULL or valid for `n` reads.
unsafe fn begin_to_graph(
    s: Stream,
    graph: *mut c_void,
    deps: *const *mut c_void,
    data: *const nodes::EdgeData,
    n: usize,
    mode: u32,
) -> Result<(), CuError> {
    let req = calls::StreamBeginCaptureToGraph::Request {
        hStream: s,
        graph: Graph(graph as u64),
        deps: nodes::deps(deps, n)?,
        // SAFETY: per the contract.
        data: unsafe { nodes::edge_data(data, n) },
        mode,
    };
    client::call(req)?;
    note_capture(s, true);
    Ok(())
}

fn end(s: Stream, graph: *mut *mut c_void) -> Result<(), CuError> {
    check_out(graph)?;
    // The capture is over whatever the answer; a stream that was not
    // capturing was not noted either.
    let reply = client::call(calls::StreamEndCapture::Request { hStream: s });
    note_capture(s, false);
    // SAFETY: checked non-NULL; the caller vouches for it.
    unsafe { write_out(graph, reply?.graph.0 as *mut c_void) };
    Ok(())
}

/// The nodes of the last `cuStreamGetCaptureInfo` of each thread: the
/// driver's own arrays stay valid until the stream's next call, and these
/// until the thread's next query.
struct Answer {
    deps: Vec<*mut c_void>,
    edges: Vec<u64>,
}

thread_local! {
    static ANSWER: std::cell::RefCell<Answer> = const { std::cell::RefCell::new(Answer { deps: Vec::new(), edges: Vec::new() }) };
}

/// `cuStreamGetCaptureInfo_v2/_v3`; `edges` is NULL for `_v2`.
///
/// # Safety
/// Each pointer is NULL or valid for a write, `status` not NULL.
unsafe fn capture_info(
    s: Stream,
    status: *mut u32,
    id: *mut u64,
    graph: *mut *mut c_void,
    deps: *mut *const *mut c_void,
    edges: *mut *const u64,
    count: *mut usize,
) -> Result<(), CuError> {
    check_out(status)?;
    if (!deps.is_null() || !edges.is_null()) && count.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    let reply = client::call(calls::StreamCaptureInfo::Request { hStream: s, edges: !edges.is_null() })?;
    let n = reply.deps.0.len();
    ANSWER.with(|a| {
        let mut a = a.borrow_mut();
        a.deps = reply.deps.0.iter().map(|&h| h as usize as *mut c_void).collect();
        a.edges = reply.edgeData.0;
        // SAFETY: NULL is skipped; otherwise the caller vouches for each.
        unsafe {
            write_out(status, reply.status);
            write_out(id, reply.id);
            write_out(graph, reply.graph.0 as *mut c_void);
            write_out(deps, if n == 0 { std::ptr::null() } else { a.deps.as_ptr() });
            write_out(
                edges,
                if n == 0 || a.edges.iter().all(|&e| e == 0) { std::ptr::null() } else { a.edges.as_ptr() },
            );
            write_out(count, n);
        }
    });
    Ok(())
}

macro_rules! capture_exports {
    ($begin:ident, $end:ident, $info2:ident, $info3:ident, $stream:path) => {
        /// # Safety
        /// None beyond the CUDA API's.
        #[no_mangle]
        pub unsafe extern "C" fn $begin(s: *mut c_void, mode: u32) -> CUresult {
            entry(stringify!($begin), || begin($stream(s), mode))
        }

        /// # Safety
        /// `graph` is valid for a write.
        #[no_mangle]
        pub unsafe extern "C" fn $end(s: *mut c_void, graph: *mut *mut c_void) -> CUresult {
            entry(stringify!($end), || end($stream(s), graph))
        }

        /// # Safety
        /// As `capture_info`.
        #[no_mangle]
        pub unsafe extern "C" fn $info2(
            s: *mut c_void,
            status: *mut u32,
            id: *mut u64,
            graph: *mut *mut c_void,
            deps: *mut *const *mut c_void,
            count: *mut usize,
        ) -> CUresult {
            // SAFETY: per this function's contract.
            entry(stringify!($info2), || unsafe {
                capture_info($stream(s), status, id, graph, deps, std::ptr::null_mut(), count)
            })
        }

        /// # Safety
        /// As `capture_info`.
        #[no_mangle]
        pub unsafe extern "C" fn $info3(
            s: *mut c_void,
            status: *mut u32,
            id: *mut u64,
            graph: *mut *mut c_void,
            deps: *mut *const *mut c_void,
            edges: *mut *const u64,
            count: *mut usize,
        ) -> CUresult {
            // SAFETY: per this function's contract.
            entry(stringify!($info3), || unsafe { capture_info($stream(s), status, id, graph, deps, edges, count) })
        }
    };
}

capture_exports!(
    cuStreamBeginCapture_v2,
    cuStreamEndCapture,
    cuStreamGetCaptureInfo_v2,
    cuStreamGetCaptureInfo_v3,
    stream
);
capture_exports!(
    cuStreamBeginCapture_v2_ptsz,
    cuStreamEndCapture_ptsz,
    cuStreamGetCaptureInfo_v2_ptsz,
    cuStreamGetCaptureInfo_v3_ptsz,
    ptsz_stream
);

macro_rules! first_capture_exports {
    ($begin:ident, $info:ident, $stream:path) => {
        /// The first form, before capture modes: a global capture.
        ///
        /// # Safety
        /// None beyond the CUDA API's.
        #[no_mangle]
        pub unsafe extern "C" fn $begin(s: *mut c_void) -> CUresult {
            // The mode the first `cuStreamBeginCapture` had.
            entry(stringify!($begin), || begin($stream(s), gpuplex_protocol::capture_mode::GLOBAL))
        }

        /// The first form: status and id only.
        ///
        /// # Safety
        /// `status` is valid for a write, `id` NULL or valid.
        #[no_mangle]
        pub unsafe extern "C" fn $info(s: *mut c_void, status: *mut u32, id: *mut u64) -> CUresult {
            use std::ptr::null_mut;
            // SAFETY: per this function's contract; the rest are NULL.
            entry(stringify!($info), || unsafe {
                capture_info($stream(s), status, id, null_mut(), null_mut(), null_mut(), null_mut())
            })
        }
    };
}

first_capture_exports!(cuStreamBeginCapture, cuStreamGetCaptureInfo, stream);
first_capture_exports!(cuStreamBeginCapture_ptsz, cuStreamGetCaptureInfo_ptsz, ptsz_stream);

fn instantiate(exec: *mut *mut c_void, graph: *mut c_void, flags: u64) -> Result<(), CuError> {
    check_out(exec)?;
    let reply = client::call(calls::cuGraphInstantiateWithFlags::Request { hGraph: Graph(graph as u64), flags })?;
    // SAFETY: checked non-NULL; the caller vouches for it.
    unsafe { write_out(exec, reply.phGraphExec.0 as *mut c_void) };
    Ok(())
}

macro_rules! instantiate_with_log {
    ($name:ident) => {
        /// The form with an error node and a log: neither is ever filled,
        /// as the driver leaves them when instantiation succeeds.
        ///
        /// # Safety
        /// `exec` is valid for a write; `error_node` NULL or valid; `log` valid for `log_len` bytes.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            exec: *mut *mut c_void,
            graph: *mut c_void,
            error_node: *mut *mut c_void,
            log: *mut c_char,
            log_len: usize,
        ) -> CUresult {
            entry(stringify!($name), || {
                // SAFETY: NULL is skipped; otherwise the caller vouches for it.
                unsafe { write_out(error_node, std::ptr::null_mut()) };
                if !log.is_null() && log_len > 0 {
                    // SAFETY: at least one byte, per the contract.
                    unsafe { log.write(0) };
                }
                instantiate(exec, graph, 0)
            })
        }
    };
}

instantiate_with_log!(cuGraphInstantiate);
instantiate_with_log!(cuGraphInstantiate_v2);

/// `CUDA_GRAPH_INSTANTIATE_PARAMS`.
#[repr(C)]
pub struct InstantiateParams {
    flags: u64,
    upload_stream: *mut c_void,
    error_node: *mut c_void,
    result: i32,
}

/// `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD`: an upload to `upload_stream` as well.
const FLAG_UPLOAD: u64 = 2;

/// # Safety
/// `params` is valid for reads and writes.
unsafe fn instantiate_with_params(
    exec: *mut *mut c_void,
    graph: *mut c_void,
    params: *mut InstantiateParams,
    to_stream: fn(*mut c_void) -> Stream,
) -> Result<(), CuError> {
    // SAFETY: NULL or valid, per the contract.
    let p = unsafe { params.as_mut() }.ok_or(CuError::INVALID_VALUE)?;
    p.error_node = std::ptr::null_mut();
    let done = instantiate(exec, graph, p.flags & !FLAG_UPLOAD).and_then(|()| {
        if p.flags & FLAG_UPLOAD == 0 {
            return Ok(());
        }
        // SAFETY: just written by `instantiate`.
        let exec = GraphExec(unsafe { *exec } as u64);
        client::call(calls::cuGraphUpload::Request { hGraphExec: exec, hStream: to_stream(p.upload_stream) }).map(drop)
    });
    // CUDA_GRAPH_INSTANTIATE_SUCCESS, else _ERROR.
    p.result = if done.is_ok() { 0 } else { 1 };
    done
}

macro_rules! instantiate_with_params {
    ($name:ident, $stream:path) => {
        /// # Safety
        /// `exec` is valid for a write, `params` for reads and writes.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            exec: *mut *mut c_void,
            graph: *mut c_void,
            params: *mut InstantiateParams,
        ) -> CUresult {
            // SAFETY: per this function's contract.
            entry(stringify!($name), || unsafe { instantiate_with_params(exec, graph, params, $stream) })
        }
    };
}

instantiate_with_params!(cuGraphInstantiateWithParams, stream);
instantiate_with_params!(cuGraphInstantiateWithParams_ptsz, ptsz_stream);

/// `cuGraphGetNodes` and `cuGraphGetRootNodes`: NULL `nodes` asks how many;
/// otherwise up to `*count` are written, the rest of the room NULL, and
/// `*count` says how many there were.
///
/// # Safety
/// `count` is valid for reads and writes; `nodes` NULL or valid for `*count` writes.
unsafe fn nodes(graph: *mut c_void, out: *mut *mut c_void, count: *mut usize, roots: bool) -> Result<(), CuError> {
    check_out(count)?;
    let reply = client::call(calls::GraphNodes::Request { hGraph: Graph(graph as u64), roots })?;
    // SAFETY: per this function's contract.
    unsafe { write_lists(count, &mut [(out, &reply.nodes.0)]) };
    Ok(())
}

/// Answers a query for lists of nodes as the driver does: with every list
/// NULL, `*count` is how many there are; otherwise up to `*count` of each
/// are written (the rest of the room NULL) and `*count` says how many.
/// The lists are as long as each other.
///
/// # Safety
/// `count` is valid for reads and writes, each list NULL (all of them) or
/// valid for `*count` writes.
pub(super) unsafe fn write_lists(count: *mut usize, lists: &mut [(*mut *mut c_void, &Vec<u64>)]) {
    let found = lists.first().map_or(0, |(_, l)| l.len());
    if lists.iter().all(|(out, _)| out.is_null()) {
        // SAFETY: valid, per the contract.
        unsafe { write_out(count, found) };
        return;
    }
    // SAFETY: valid for reads, per the contract.
    let room = unsafe { *count };
    for (out, list) in lists.iter().filter(|(out, _)| !out.is_null()) {
        for i in 0..room {
            let node = list.get(i).map_or(std::ptr::null_mut(), |&h| h as usize as *mut c_void);
            // SAFETY: `i < room`, the list's room per the contract.
            unsafe { out.add(i).write(node) };
        }
    }
    // SAFETY: valid, per the contract.
    unsafe { write_out(count, found.min(room)) };
}

/// # Safety
/// As `nodes`.
#[no_mangle]
pub unsafe extern "C" fn cuGraphGetNodes(graph: *mut c_void, out: *mut *mut c_void, count: *mut usize) -> CUresult {
    // SAFETY: per this function's contract.
    entry("cuGraphGetNodes", || unsafe { nodes(graph, out, count, false) })
}

/// # Safety
/// As `nodes`.
#[no_mangle]
pub unsafe extern "C" fn cuGraphGetRootNodes(graph: *mut c_void, out: *mut *mut c_void, count: *mut usize) -> CUresult {
    // SAFETY: per this function's contract.
    entry("cuGraphGetRootNodes", || unsafe { nodes(graph, out, count, true) })
}

/// The server's driver describes the graph; the file is written here, in
/// the program's file system, where the caller means it.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cuGraphDebugDotPrint(graph: *mut c_void, path: *const c_char, flags: u32) -> CUresult {
    entry("cuGraphDebugDotPrint", || {
        if path.is_null() {
            return Err(CuError::INVALID_VALUE);
        }
        // SAFETY: per this function's contract.
        let path = std::ffi::OsStr::from_bytes(unsafe { std::ffi::CStr::from_ptr(path) }.to_bytes());
        let reply = client::call(calls::GraphDebugDot::Request { hGraph: Graph(graph as u64), flags })?;
        std::fs::write(path, &reply.dot).map_err(|e| {
            crate::log::warn(&format!("cuGraphDebugDotPrint: cannot write {}: {e}", path.to_string_lossy()));
            CuError::OPERATING_SYSTEM
        })
    })
}

/// `cuStreamUpdateCaptureDependencies(_v2)`: edges with data are not offered.
///
/// # Safety
/// `data` is NULL or valid for `n` reads.
unsafe fn update_deps(
    s: Stream,
    deps: *mut *mut c_void,
    data: *const nodes::EdgeData,
    n: usize,
    flags: u32,
) -> Result<(), CuError> {
    // SAFETY: per the contract.
    if !unsafe { nodes::edge_data(data, n) }.0.is_empty() {
        crate::log::warn("cuStreamUpdateCaptureDependencies_v2 with edge data is not supported by gpuplex");
        return Err(CuError::NOT_SUPPORTED);
    }
    let deps = nodes::deps(deps.cast_const(), n)?;
    client::call(calls::StreamUpdateCaptureDependencies::Request { hStream: s, deps, flags }).map(drop)
}

exports! {
    cuStreamBeginCaptureToGraph(s: *mut c_void, g: *mut c_void, d: *const *mut c_void, data: *const nodes::EdgeData, n: usize, mode: u32) =>
        // SAFETY: per the export's contract.
        unsafe { begin_to_graph(stream(s), g, d, data, n, mode) };
    cuStreamBeginCaptureToGraph_ptsz(s: *mut c_void, g: *mut c_void, d: *const *mut c_void, data: *const nodes::EdgeData, n: usize, mode: u32) =>
        // SAFETY: per the export's contract.
        unsafe { begin_to_graph(ptsz_stream(s), g, d, data, n, mode) };
    cuStreamUpdateCaptureDependencies(s: *mut c_void, d: *mut *mut c_void, n: usize, flags: u32) =>
        // SAFETY: no edge data.
        unsafe { update_deps(stream(s), d, std::ptr::null(), n, flags) };
    cuStreamUpdateCaptureDependencies_ptsz(s: *mut c_void, d: *mut *mut c_void, n: usize, flags: u32) =>
        // SAFETY: no edge data.
        unsafe { update_deps(ptsz_stream(s), d, std::ptr::null(), n, flags) };
    cuStreamUpdateCaptureDependencies_v2(s: *mut c_void, d: *mut *mut c_void, data: *const nodes::EdgeData, n: usize, flags: u32) =>
        // SAFETY: per the export's contract.
        unsafe { update_deps(stream(s), d, data, n, flags) };
    cuStreamUpdateCaptureDependencies_v2_ptsz(s: *mut c_void, d: *mut *mut c_void, data: *const nodes::EdgeData, n: usize, flags: u32) =>
        // SAFETY: per the export's contract.
        unsafe { update_deps(ptsz_stream(s), d, data, n, flags) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Calls that change a graph or end an executable one forget the child
    /// sets kept; launches, updates of executable graphs and calls outside
    /// the graph section (tensor maps among them) do not.
    #[test]
    fn only_calls_that_may_change_a_graph_forget_child_sets() {
        let forgets = |opcode| {
            let before = crate::memo::GRAPH_SETS.generation();
            before_call(opcode);
            crate::memo::GRAPH_SETS.generation() != before
        };
        for opcode in [Opcode::GraphAddEmptyNode, Opcode::cuGraphDestroy, Opcode::cuGraphExecDestroy] {
            assert!(forgets(opcode), "{opcode:?}");
        }
        for opcode in [
            Opcode::cuGraphLaunch,
            Opcode::GraphKernelNodeSetParams,
            Opcode::GraphChildNodeSetParams,
            Opcode::LaunchHostFunc,
            Opcode::TensorMapEncode,
            Opcode::Launch,
        ] {
            assert!(!forgets(opcode), "{opcode:?}");
        }
    }
}
