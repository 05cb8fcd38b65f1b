//! Graph memory on the real driver: allocation nodes, and setting each
//! device's graph memory attributes. Free nodes are made with the others
//! (`graph.rs`); the rest passes through (`passthrough.rs`). The session has
//! checked every graph, node, device and address first.

use std::ffi::c_void;
use std::ptr::null;

use gpuplex_protocol::AccessDesc;

use super::api::{self, check};
use super::graph::raw_nodes;
use super::pools::{c_props, wire_props};
use super::vmm::c_access;
use super::{enter, handle, raw, size, BResult, Obj};
use crate::backend::GraphAlloc;

pub(super) fn add_alloc_node(ctx: Obj, graph: Obj, deps: &[Obj], alloc: &GraphAlloc) -> BResult<(Obj, u64)> {
    enter(ctx)?;
    let (deps, descs) = (raw_nodes(deps), c_access(&alloc.access));
    let mut p = api::MemAllocNodeParams {
        pool_props: c_props(&alloc.props)?,
        access_descs: if descs.is_empty() { null() } else { descs.as_ptr() },
        access_desc_count: descs.len(),
        bytesize: size(alloc.bytes)?,
        dptr: 0,
    };
    // SAFETY: out-pointer to a local; a live graph and nodes of it; the
    // parameters and descriptors live across the call, which copies them
    // and writes the address into `p`.
    let node =
        handle(|out| unsafe { api::cuGraphAddMemAllocNode(out, raw(graph), deps.as_ptr(), deps.len(), &mut p) })?;
    Ok((node, p.dptr))
}

pub(super) fn alloc_node_params(node: Obj) -> BResult<GraphAlloc> {
    // SAFETY: plain data, all zeros a valid value, filled by the driver.
    let mut p: api::MemAllocNodeParams = unsafe { std::mem::zeroed() };
    // SAFETY: a live allocation node; out-pointer to a local.
    check(unsafe { api::cuGraphMemAllocNodeGetParams(raw(node), &mut p) })?;
    let descs = if p.access_descs.is_null() {
        &[][..]
    } else {
        // SAFETY: the node's own descriptors, as many as it says, valid
        // while the node lives.
        unsafe { std::slice::from_raw_parts(p.access_descs, p.access_desc_count) }
    };
    let access = descs
        .iter()
        .map(|d| AccessDesc { location_kind: d.location.kind as u32, location: d.location.id, flags: d.flags as u32 })
        .collect();
    Ok(GraphAlloc { props: wire_props(&p.pool_props), access, bytes: p.bytesize as u64, dptr: p.dptr })
}

pub(super) fn set_attribute(dev: i32, attr: i32, value: u64) -> BResult<()> {
    let mut value = value;
    // SAFETY: as for reading; the value outlives the call.
    check(unsafe { api::cuDeviceSetGraphMemAttribute(dev, attr, (&raw mut value).cast::<c_void>()) })
}
