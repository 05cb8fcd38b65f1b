//! Conditional nodes. The handle a kernel sets is the server's driver's,
//! made by a `pass` row of the table; a node's body graphs are made with it
//! and named as the server's graphs are.

use std::ffi::c_void;

use gpuplex_protocol::{calls, Ctx, CuError, Graph, Seq};

use super::nodes::made;
use crate::client;
use crate::ffi::check_out;

/// `CUDA_CONDITIONAL_NODE_PARAMS`.
#[repr(C)]
pub struct ConditionalNodeParams {
    handle: u64,
    kind: u32,
    size: u32,
    bodies: *mut *mut c_void,
    ctx: *mut c_void,
}

/// `cuGraphAddNode` for a conditional node: the node, and its body graphs'
/// array written into `p` as the driver writes it.
///
/// # Safety
/// `p` is valid for a read and a write.
pub(super) unsafe fn add(
    out: *mut *mut c_void,
    graph: *mut c_void,
    d: Seq<u64>,
    p: *mut ConditionalNodeParams,
) -> Result<(), CuError> {
    check_out(out)?;
    // SAFETY: per the contract.
    let p = unsafe { &mut *p };
    let req = calls::GraphAddConditionalNode::Request {
        graph: Graph(graph as u64),
        deps: d,
        handle: p.handle,
        kind: p.kind,
        size: p.size,
        ctx: Ctx(p.ctx as u64),
    };
    let reply = client::call(req)?;
    // The driver's array is valid while the node lives; the program may
    // read it until then, and nodes are not told apart once gone, so it
    // stays for as long as the process runs (a word per body).
    let bodies: Vec<*mut c_void> = reply.bodies.0.iter().map(|&g| g as *mut c_void).collect();
    p.bodies = Box::leak(bodies.into_boxed_slice()).as_mut_ptr();
    made(out, reply.node)
}
