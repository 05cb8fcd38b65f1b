//! Graph memory: allocation and free nodes, and resetting each device's
//! graph memory watermarks (the other queries pass through).
//!
//! An allocation node's memory is at an address the driver gives when the
//! node is made, valid while the graph runs between that node and a free
//! node. The tenant is charged its size from the node's making until the
//! context ends, as a `cuMemAlloc` allocation is (the driver keeps graph
//! memory reserved for executable graphs after their graph is gone, until a
//! trim), and the address is a region of the context's, so that copies and
//! memsets may name it.

use gpuplex_protocol::calls::*;
use gpuplex_protocol::{CallError, CuError, DevPtr, GraphNode, PoolProps, Seq, ALLOCATION_PINNED, LOCATION_DEVICE};

use super::tables::{Kind, Region};
use super::{invalid, Session};
use crate::backend::{GraphAlloc, NodeWork};

type R<T> = Result<T, CallError>;

/// `CU_GRAPH_MEM_ATTR_USED_MEM_HIGH` and `_RESERVED_MEM_HIGH`, the two a
/// program may reset (to 0).
const USED_HIGH: i32 = 1;
const RESERVED_HIGH: i32 = 3;

impl Session {
    pub(super) fn graph_add_mem_alloc_node(
        &mut self,
        req: GraphAddMemAllocNode::Request,
    ) -> R<GraphAddMemAllocNode::Reply> {
        if req.props.location_kind != LOCATION_DEVICE || req.props.kind != ALLOCATION_PINNED {
            return Err(CallError::new(CuError::NOT_SUPPORTED, "graph memory is pinned device memory only"));
        }
        if req.bytesize == 0 {
            return Err(invalid("a graph allocation of 0 bytes"));
        }
        let props = PoolProps { location: self.backend_device(req.props.location)?, ..req.props };
        let access = if req.access.0.is_empty() { Vec::new() } else { self.backend_access(req.access.0)? };
        let g = self.tables.get(Kind::Graph, req.graph.0)?.obj;
        let deps = self.nodes_of(req.graph.0, &req.deps.0)?;
        let (h, ctx) = self.current_ctx()?;
        self.charge_reclaiming(req.bytesize)?;
        let alloc = GraphAlloc { props, access, bytes: req.bytesize, dptr: 0 };
        let (node, dptr) = self.backend.graph_add_mem_alloc_node(ctx, g, &deps, &alloc)?;
        // The driver may give an address again to a later node of the graph
        // (after a free): the region, and its charge, are replaced.
        self.tables.add_region(dptr, Region { size: req.bytesize, ctx: h, owner: None });
        Ok(GraphAddMemAllocNode::Reply { node: GraphNode(self.node_handle(req.graph.0, node)), dptr: DevPtr(dptr) })
    }

    pub(super) fn graph_add_mem_free_node(
        &mut self,
        req: GraphAddMemFreeNode::Request,
    ) -> R<GraphAddMemFreeNode::Reply> {
        if self.tables.region_at(req.dptr.0).is_none() {
            return Err(invalid(format!("{:#x} is no allocation of the session's", req.dptr.0)));
        }
        Ok(GraphAddMemFreeNode::Reply { node: self.add_node(req.graph, &req.deps, NodeWork::MemFree(req.dptr.0))? })
    }

    pub(super) fn graph_mem_alloc_node_params(
        &mut self,
        req: GraphMemAllocNodeParams::Request,
    ) -> R<GraphMemAllocNodeParams::Reply> {
        let (_, node) = self.node(req.node)?;
        let alloc = self.backend.graph_mem_alloc_node_params(node)?;
        let mut props = alloc.props;
        props.location = self.guest_device(props.location);
        let mut access = alloc.access;
        for a in &mut access {
            a.location = self.guest_device(a.location);
        }
        Ok(GraphMemAllocNodeParams::Reply {
            props,
            access: Seq(access),
            bytesize: alloc.bytes,
            dptr: DevPtr(alloc.dptr),
        })
    }

    pub(super) fn graph_mem_set_attribute(
        &mut self,
        req: GraphMemAttributeSet::Request,
    ) -> R<GraphMemAttributeSet::Reply> {
        if ![USED_HIGH, RESERVED_HIGH].contains(&req.attr) || req.value != 0 {
            return Err(invalid(format!("graph memory attribute {} set to {}", req.attr, req.value)));
        }
        self.backend.graph_mem_set_attribute(self.backend_device(req.device)?, req.attr, 0)?;
        Ok(GraphMemAttributeSet::Reply {})
    }

    /// The guest's number for a backend device (one it cannot see: as is).
    fn guest_device(&self, backend: i32) -> i32 {
        self.devices.iter().position(|&d| d == backend).map_or(backend, |i| i as i32)
    }
}
