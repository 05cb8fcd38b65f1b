//! Graph memory: allocation and free nodes, and the graph memory
//! attributes, each a call to the server. An allocation node's access
//! descriptors, as the program reads them back, are kept here for as long
//! as the process runs (the driver keeps its own with the node).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, PoisonError};

use gpuplex_protocol::{calls, CuError, DevPtr, Graph, GraphNode, Seq};

use super::nodes::{add, deps, made};
use crate::client;
use crate::ffi::{check_out, entry, write_out, CUresult};
use crate::memory::pools::{c_props, read_props, MemPoolProps};
use crate::memory::vmm::{c_access, read_access, MemAccessDesc};

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (and `_v2`, laid out alike).
#[repr(C)]
pub struct MemAllocNodeParams {
    pool_props: MemPoolProps,
    access_descs: *const MemAccessDesc,
    access_desc_count: usize,
    bytesize: usize,
    dptr: u64,
}

/// The access descriptors of the allocation nodes the program read back.
static READ_BACK: Mutex<Option<HashMap<u64, Vec<MemAccessDesc>>>> = Mutex::new(None);

/// `cuGraphAddMemAllocNode`: the node, and its address written into `p`.
///
/// # Safety
/// `p` is NULL or valid for a read and a write, its descriptors for
/// `access_desc_count` reads.
pub(super) unsafe fn add_alloc(
    out: *mut *mut c_void,
    graph: *mut c_void,
    d: Seq<u64>,
    p: *mut MemAllocNodeParams,
) -> Result<(), CuError> {
    check_out(out)?;
    // SAFETY: per the contract.
    let p = unsafe { p.as_mut() }.ok_or(CuError::INVALID_VALUE)?;
    let access = match p.access_desc_count {
        0 => Seq(Vec::new()),
        // SAFETY: as many descriptors as the count says, per the contract.
        n => unsafe { read_access(p.access_descs, n)? },
    };
    let req = calls::GraphAddMemAllocNode::Request {
        graph: Graph(graph as u64),
        deps: d,
        props: read_props(&p.pool_props)?,
        access,
        bytesize: p.bytesize as u64,
    };
    let reply = client::call(req)?;
    p.dptr = reply.dptr.0;
    made(out, reply.node)
}

pub(super) fn free_node(graph: *mut c_void, d: Seq<u64>, dptr: u64) -> Result<GraphNode, CuError> {
    Ok(client::call(calls::GraphAddMemFreeNode::Request { graph: Graph(graph as u64), deps: d, dptr: DevPtr(dptr) })?
        .node)
}

fn alloc_params(node: *mut c_void, p: *mut MemAllocNodeParams) -> Result<(), CuError> {
    check_out(p)?;
    let r = client::call(calls::GraphMemAllocNodeParams::Request { node: GraphNode(node as u64) })?;
    let mut read_back = READ_BACK.lock().unwrap_or_else(PoisonError::into_inner);
    let descs = read_back.get_or_insert_with(HashMap::new).entry(node as u64).or_default();
    *descs = r.access.0.iter().map(c_access).collect();
    let params = MemAllocNodeParams {
        pool_props: c_props(&r.props),
        access_descs: if descs.is_empty() { std::ptr::null() } else { descs.as_ptr() },
        access_desc_count: descs.len(),
        bytesize: r.bytesize as usize,
        dptr: r.dptr.0,
    };
    // SAFETY: checked non-NULL; the export's caller vouches for it.
    unsafe { write_out(p, params) };
    Ok(())
}

/// `cuDeviceSetGraphMemAttribute`: every attribute is a `cuuint64_t`.
///
/// # Safety
/// `value` is NULL or valid for a read.
unsafe fn set_attribute(device: i32, attr: i32, value: *mut c_void) -> Result<(), CuError> {
    // SAFETY: per the contract.
    let value = *unsafe { value.cast::<u64>().as_ref() }.ok_or(CuError::INVALID_VALUE)?;
    client::call(calls::GraphMemAttributeSet::Request { device, attr, value }).map(drop)
}

type Out = *mut *mut c_void;
type Deps = *const *mut c_void;

// Every export's pointers are as the CUDA API requires.
exports! {
    cuGraphAddMemAllocNode(out: Out, g: *mut c_void, d: Deps, n: usize, p: *mut MemAllocNodeParams) =>
        // SAFETY: per the export's contract.
        unsafe { add_alloc(out, g, deps(d, n)?, p) };
    cuGraphAddMemFreeNode(out: Out, g: *mut c_void, d: Deps, n: usize, dptr: u64) =>
        add(out, || free_node(g, deps(d, n)?, dptr));
    cuGraphMemAllocNodeGetParams(node: *mut c_void, p: *mut MemAllocNodeParams) => alloc_params(node, p);
    cuDeviceSetGraphMemAttribute(device: i32, attr: i32, value: *mut c_void) =>
        // SAFETY: per the export's contract.
        unsafe { set_attribute(device, attr, value) };
}
