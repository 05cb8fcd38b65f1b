//! Graphs built node by node: kernels, copies, memsets, empty nodes, child
//! graphs and events, their dependencies, and what programs ask and change
//! of them afterwards.
//!
//! Every handle a node names is checked as for the call it stands for: a
//! kernel's parameters as a launch's, a copy's ends and a memset's rows
//! against the session's memory, dependencies against the nodes of the same
//! graph. A copy's host ends must be host blocks the session shares with
//! the guest (not a staging slot, which other copies reuse): the driver
//! reaches them whenever the graph runs.

use gpuplex_protocol::calls::*;
use gpuplex_protocol::{
    CallError, CopySide, CuError, Graph, GraphExec, GraphNode, Seq, Stream, COPY_3D, SIDE_ARRAY, SIDE_BLOCK,
    SIDE_DEVICE, SIDE_INLINE,
};

use super::host_calls::{self, HostCall};
use super::tables::{Entry, Kind, Owner};
use super::{invalid, Session};
use crate::backend::{self, ExecUpdate, HostFn, NodeWork, Obj, Place};

type R<T> = Result<T, CallError>;

/// The most host functions one session hands the driver: each stays until
/// the session ends, since a graph may run it until then.
const MAX_HOST_FNS: usize = 1 << 20;

/// The most dependencies one call may name: far more than programs use,
/// few enough that checking them is cheap.
pub(super) const MAX_DEPS: usize = 4096;

impl Session {
    /// `nodes`, each a node of `graph`, as the backend's.
    pub(super) fn nodes_of(&self, graph: u64, nodes: &[u64]) -> R<Vec<Obj>> {
        if nodes.len() > MAX_DEPS {
            return Err(invalid(format!("{} nodes in one call", nodes.len())));
        }
        nodes
            .iter()
            .map(|&n| match self.tables.get(Kind::GraphNode, n)? {
                e if e.owner == Owner::Graph(graph) => Ok(e.obj),
                _ => Err(invalid(format!("node {n:#x} is not in the graph"))),
            })
            .collect()
    }

    /// The handle of a node of `graph`, issued once per node.
    pub(super) fn node_handle(&mut self, graph: u64, node: Obj) -> u64 {
        if node == Obj(0) {
            return 0;
        }
        self.tables.add(Kind::GraphNode, Entry { obj: node, ctx: 0, owner: Owner::Graph(graph) })
    }

    pub(super) fn add_node(&mut self, graph: Graph, deps: &Seq<u64>, node: NodeWork<'_>) -> R<GraphNode> {
        let g = self.tables.get(Kind::Graph, graph.0)?.obj;
        let deps = self.nodes_of(graph.0, &deps.0)?;
        let (_, ctx) = self.current_ctx()?;
        // SAFETY: a memcpy node's host ends are checked ranges of the
        // session's shared blocks, which stay mapped (or guarded, once freed)
        // while the session has graphs.
        let obj = unsafe { self.backend.graph_add_node(ctx, g, &deps, &node)? };
        Ok(GraphNode(self.node_handle(graph.0, obj)))
    }

    /// A kernel's launch as a node holds it, its parameters checked.
    fn kernel_node(
        &mut self,
        func: gpuplex_protocol::Func,
        dims: [u32; 6],
        shared_mem: u32,
        params: &[u8],
    ) -> R<(Obj, backend::Launch)> {
        let (_, func) = self.kernel_with(func, params)?;
        Ok((func, self.launch_config(dims, shared_mem, Stream::NULL, &[])?))
    }

    pub(super) fn graph_add_kernel_node(&mut self, req: GraphAddKernelNode::Request) -> R<GraphAddKernelNode::Reply> {
        let dims = [req.gridX, req.gridY, req.gridZ, req.blockX, req.blockY, req.blockZ];
        let (func, launch) = self.kernel_node(req.func, dims, req.sharedMem, &req.params)?;
        let node =
            self.add_node(req.graph, &req.deps, NodeWork::Kernel { func, launch: &launch, params: &req.params })?;
        Ok(GraphAddKernelNode::Reply { node })
    }

    pub(super) fn graph_add_memcpy_node(&mut self, req: GraphAddMemcpyNode::Request) -> R<GraphAddMemcpyNode::Reply> {
        let copy = self.memcpy_node(&req.copy)?;
        let node = self.add_node(req.graph, &req.deps, NodeWork::Memcpy(&copy))?;
        Ok(GraphAddMemcpyNode::Reply { node })
    }

    /// A memcpy node's copy, its ends checked: host ends must be shared
    /// blocks, which outlive the call (staging slots and inline bytes do not).
    fn memcpy_node(&mut self, c: &gpuplex_protocol::Copy3D) -> R<backend::Copy3D> {
        if c.shape != COPY_3D {
            return Err(invalid("a memcpy node is a 3D copy"));
        }
        super::arrays::check_shape(c)?;
        if c.src.kind == SIDE_INLINE || c.dst.kind == SIDE_INLINE {
            return Err(CallError::new(
                CuError::NOT_SUPPORTED,
                "a memcpy node's host memory must be shared with the server (allocated with cuMemAllocHost)",
            ));
        }
        let (_, ctx) = self.current_ctx()?;
        let (src, src_slot) = self.copy_end(ctx, &c.src, c, std::ptr::null_mut())?;
        let (dst, dst_slot) = self.copy_end(ctx, &c.dst, c, std::ptr::null_mut())?;
        if src_slot.is_some() || dst_slot.is_some() {
            return Err(invalid("a staging slot cannot be a memcpy node's host memory"));
        }
        Ok(backend::Copy3D { shape: COPY_3D, src, dst, width: c.width, height: c.height, depth: c.depth })
    }

    pub(super) fn graph_add_memset_node(&mut self, req: GraphAddMemsetNode::Request) -> R<GraphAddMemsetNode::Reply> {
        let op = self.memset_node(req.dst, req.pitch, req.value, req.elementSize, req.width, req.height)?;
        let node = self.add_node(req.graph, &req.deps, NodeWork::Memset(&op))?;
        Ok(GraphAddMemsetNode::Reply { node })
    }

    /// A memset node's work, its range checked.
    fn memset_node(
        &mut self,
        dst: gpuplex_protocol::DevPtr,
        pitch: u64,
        value: u32,
        element_size: u32,
        width: u64,
        height: u64,
    ) -> R<backend::Memset> {
        let op = backend::Memset { dst: dst.0, pitch, value, element_size, width, height };
        self.check_memset(&op)?;
        Ok(op)
    }

    pub(super) fn graph_memcpy_node_set(
        &mut self,
        req: GraphMemcpyNodeSetParams::Request,
    ) -> R<GraphMemcpyNodeSetParams::Reply> {
        let (node, exec) = self.node_in(req.node, req.exec)?;
        let copy = self.memcpy_node(&req.copy)?;
        self.set_node(node, exec, &NodeWork::Memcpy(&copy))?;
        Ok(GraphMemcpyNodeSetParams::Reply {})
    }

    pub(super) fn graph_memset_node_set(
        &mut self,
        req: GraphMemsetNodeSetParams::Request,
    ) -> R<GraphMemsetNodeSetParams::Reply> {
        let (node, exec) = self.node_in(req.node, req.exec)?;
        let op = self.memset_node(req.dst, req.pitch, req.value, req.elementSize, req.width, req.height)?;
        self.set_node(node, exec, &NodeWork::Memset(&op))?;
        Ok(GraphMemsetNodeSetParams::Reply {})
    }

    pub(super) fn graph_child_node_set(
        &mut self,
        req: GraphChildNodeSetParams::Request,
    ) -> R<GraphChildNodeSetParams::Reply> {
        let (node, exec) = self.node_in(req.node, req.exec)?;
        let child = self.tables.get(Kind::Graph, req.child.0)?.obj;
        self.set_node(node, exec, &NodeWork::Child(child))?;
        Ok(GraphChildNodeSetParams::Reply {})
    }

    pub(super) fn graph_event_node_set(
        &mut self,
        req: GraphEventNodeSetEvent::Request,
    ) -> R<GraphEventNodeSetEvent::Reply> {
        let (node, exec) = self.node_in(req.node, req.exec)?;
        let event = self.tables.get(Kind::Event, req.event.0)?.obj;
        self.set_node(node, exec, &NodeWork::Event { event, wait: req.wait })?;
        Ok(GraphEventNodeSetEvent::Reply {})
    }

    pub(super) fn graph_add_empty_node(&mut self, req: GraphAddEmptyNode::Request) -> R<GraphAddEmptyNode::Reply> {
        Ok(GraphAddEmptyNode::Reply { node: self.add_node(req.graph, &req.deps, NodeWork::Empty)? })
    }

    pub(super) fn graph_add_child_node(
        &mut self,
        req: GraphAddChildGraphNode::Request,
    ) -> R<GraphAddChildGraphNode::Reply> {
        let child = self.tables.get(Kind::Graph, req.child.0)?.obj;
        Ok(GraphAddChildGraphNode::Reply { node: self.add_node(req.graph, &req.deps, NodeWork::Child(child))? })
    }

    /// A conditional node: its body graphs are the node's, named by handles
    /// that go when the node (or its graph) goes, and that cuGraphDestroy
    /// refuses.
    pub(super) fn graph_add_conditional_node(
        &mut self,
        req: GraphAddConditionalNode::Request,
    ) -> R<GraphAddConditionalNode::Reply> {
        let g = self.tables.get(Kind::Graph, req.graph.0)?.obj;
        let deps = self.nodes_of(req.graph.0, &req.deps.0)?;
        let (_, ctx) = if req.ctx.0 == 0 { self.current_ctx()? } else { self.resolve_ctx(req.ctx.0)? };
        let cond = backend::Conditional { handle: req.handle, kind: req.kind, size: req.size };
        let (node, bodies) = self.backend.graph_add_conditional_node(ctx, g, &deps, &cond)?;
        let node = self.node_handle(req.graph.0, node);
        let body = |b| Entry { obj: b, ctx: 0, owner: Owner::Node(node) };
        let bodies = bodies.into_iter().map(|b| self.tables.add(Kind::Graph, body(b))).collect();
        self.made_graphs = true;
        Ok(GraphAddConditionalNode::Reply { node: GraphNode(node), bodies: Seq(bodies) })
    }

    pub(super) fn graph_add_event_node(&mut self, req: GraphAddEventNode::Request) -> R<GraphAddEventNode::Reply> {
        let event = self.tables.get(Kind::Event, req.event.0)?.obj;
        let node = self.add_node(req.graph, &req.deps, NodeWork::Event { event, wait: req.wait })?;
        Ok(GraphAddEventNode::Reply { node })
    }

    pub(super) fn graph_dependencies(&mut self, req: GraphDependencies::Request) -> R<GraphDependencies::Reply> {
        let g = self.tables.get(Kind::Graph, req.graph.0)?.obj;
        if req.from.0.len() != req.to.0.len() {
            return Err(invalid("as many nodes each side of the edges"));
        }
        if !req.data.0.is_empty() && req.data.0.len() != req.from.0.len() {
            return Err(invalid("edge data for every edge or none"));
        }
        let (from, to) = (self.nodes_of(req.graph.0, &req.from.0)?, self.nodes_of(req.graph.0, &req.to.0)?);
        self.backend.graph_dependencies(g, &from, &to, &req.data.0, req.remove)?;
        Ok(GraphDependencies::Reply {})
    }

    pub(super) fn graph_edges(&mut self, req: GraphEdges::Request) -> R<GraphEdges::Reply> {
        let g = self.tables.get(Kind::Graph, req.graph.0)?.obj;
        let edges = self.backend.graph_edges(g)?;
        let (mut from, mut to) = (Vec::with_capacity(edges.len()), Vec::with_capacity(edges.len()));
        let mut data = Vec::with_capacity(edges.len());
        for (f, t, d) in edges {
            from.push(self.node_handle(req.graph.0, f));
            to.push(self.node_handle(req.graph.0, t));
            data.push(d);
        }
        Ok(GraphEdges::Reply { from: Seq(from), to: Seq(to), data: Seq(data) })
    }

    /// A node of one of the session's graphs, as `(graph handle, backend node)`.
    pub(super) fn node(&self, node: GraphNode) -> R<(u64, Obj)> {
        match self.tables.get(Kind::GraphNode, node.0)? {
            Entry { obj, owner: Owner::Graph(g), .. } => Ok((g, obj)),
            _ => Err(invalid("not a graph's node")),
        }
    }

    pub(super) fn child_graph(
        &mut self,
        req: cuGraphChildGraphNodeGetGraph::Request,
    ) -> R<cuGraphChildGraphNodeGetGraph::Reply> {
        let (_, node) = self.node(req.hNode)?;
        let graph = self.backend.graph_child_graph(node)?;
        let entry = Entry { obj: graph, ctx: 0, owner: Owner::Node(req.hNode.0) };
        Ok(cuGraphChildGraphNodeGetGraph::Reply { phGraph: Graph(self.tables.add(Kind::Graph, entry)) })
    }

    pub(super) fn memset_node_params(
        &mut self,
        req: GraphMemsetNodeParams::Request,
    ) -> R<GraphMemsetNodeParams::Reply> {
        let (_, node) = self.node(req.node)?;
        let m = self.backend.graph_memset_node_params(node)?;
        Ok(GraphMemsetNodeParams::Reply {
            dst: gpuplex_protocol::DevPtr(m.dst),
            pitch: m.pitch,
            value: m.value,
            elementSize: m.element_size,
            width: m.width,
            height: m.height,
        })
    }

    /// A memcpy node's copy as the guest named it: host memory by its
    /// shared block, arrays by the session's handles.
    pub(super) fn memcpy_node_params(
        &mut self,
        req: GraphMemcpyNodeParams::Request,
    ) -> R<GraphMemcpyNodeParams::Reply> {
        let (_, node) = self.node(req.node)?;
        let c = self.backend.graph_memcpy_node_params(node)?;
        let (src, dst) = (self.copy_side(&c.src)?, self.copy_side(&c.dst)?);
        let copy =
            gpuplex_protocol::Copy3D { shape: COPY_3D, src, dst, width: c.width, height: c.height, depth: c.depth };
        Ok(GraphMemcpyNodeParams::Reply { copy })
    }

    /// One end of a node's copy as the guest names it. Host memory is a
    /// shared block's (the first byte's position folded into the offset, as
    /// the guest sent it); a device address may be one too, where the
    /// backend maps the block at the same address.
    fn copy_side(&self, e: &backend::CopyEnd) -> R<CopySide> {
        let side =
            CopySide { kind: SIDE_DEVICE, at: 0, block: 0, x: e.x, y: e.y, z: e.z, pitch: e.pitch, height: e.height };
        let block = |ptr: u64| {
            self.shared.block_at(ptr).map(|(block, at)| CopySide {
                kind: SIDE_BLOCK,
                at,
                block,
                x: 0,
                y: 0,
                z: 0,
                ..side
            })
        };
        Ok(match e.place {
            Place::Device(d) => block(d).unwrap_or(CopySide { at: d, ..side }),
            Place::Host(p) => {
                block(p as u64).ok_or_else(|| invalid("a node's host memory is no block of the session's"))?
            }
            Place::Array(a) => {
                let h = self
                    .tables
                    .handle_of(Kind::Array, a)
                    .ok_or_else(|| invalid("a node's array is not the session's"))?;
                CopySide { kind: SIDE_ARRAY, at: h, pitch: 0, height: 0, ..side }
            }
        })
    }

    pub(super) fn graph_node_edges(&mut self, req: GraphNodeEdges::Request) -> R<GraphNodeEdges::Reply> {
        let (graph, node) = self.node(req.node)?;
        let edges = self.backend.graph_node_edges(node, req.dependents)?;
        let data = edges.iter().map(|&(_, d)| d).collect();
        let nodes = edges.into_iter().map(|(n, _)| self.node_handle(graph, n)).collect();
        Ok(GraphNodeEdges::Reply { nodes: Seq(nodes), data: Seq(data) })
    }

    /// Gives a node (in its graph, or in `exec`) its new work.
    fn set_node(&mut self, node: Obj, exec: Option<Obj>, work: &NodeWork<'_>) -> R<()> {
        let (_, ctx) = self.current_ctx()?;
        // SAFETY: as in `add_node`: a memcpy node's host ends are checked
        // ranges of shared blocks (`memcpy_node`), and a child graph's were
        // checked as its nodes were added.
        unsafe { self.backend.graph_node_set(ctx, node, exec, work) }
    }

    /// A node, and the executable graph whose copy of it is meant (NULL:
    /// the node itself), as the backend's.
    fn node_in(&self, node: GraphNode, exec: GraphExec) -> R<(Obj, Option<Obj>)> {
        let (_, node) = self.node(node)?;
        let exec = match exec.0 {
            0 => None,
            h => Some(self.tables.get(Kind::GraphExec, h)?.obj),
        };
        Ok((node, exec))
    }

    pub(super) fn graph_kernel_node_set(
        &mut self,
        req: GraphKernelNodeSetParams::Request,
    ) -> R<GraphKernelNodeSetParams::Reply> {
        let (node, exec) = self.node_in(req.node, req.exec)?;
        let dims = [req.gridX, req.gridY, req.gridZ, req.blockX, req.blockY, req.blockZ];
        let (func, launch) = self.kernel_node(req.func, dims, req.sharedMem, &req.params)?;
        self.set_node(node, exec, &NodeWork::Kernel { func, launch: &launch, params: &req.params })?;
        Ok(GraphKernelNodeSetParams::Reply {})
    }

    /// The guest's host function `id`, as the driver takes it: one record
    /// per number, kept until the session ends.
    fn host_fn(&mut self, id: u64) -> R<HostFn> {
        let calls = self.host_calls.clone().filter(|c| c.connected()).ok_or_else(host_calls::not_connected)?;
        if let Some(call) = self.host_fns.get(&id) {
            return Ok(call.host_fn());
        }
        if self.host_fns.len() >= MAX_HOST_FNS {
            return Err(CallError::new(CuError::OUT_OF_MEMORY, "too many host functions in one session"));
        }
        let call = HostCall::new(calls, id);
        let f = call.host_fn();
        self.host_fns.insert(id, call);
        Ok(f)
    }

    pub(super) fn graph_add_host_node(&mut self, req: GraphAddHostNode::Request) -> R<GraphAddHostNode::Reply> {
        let f = self.host_fn(req.id)?;
        Ok(GraphAddHostNode::Reply { node: self.add_node(req.graph, &req.deps, NodeWork::Host(f))? })
    }

    pub(super) fn graph_host_node_set(
        &mut self,
        req: GraphHostNodeSetParams::Request,
    ) -> R<GraphHostNodeSetParams::Reply> {
        let (node, exec) = self.node_in(req.node, req.exec)?;
        let f = self.host_fn(req.id)?;
        self.set_node(node, exec, &NodeWork::Host(f))?;
        Ok(GraphHostNodeSetParams::Reply {})
    }

    pub(super) fn launch_host_func(&mut self, req: LaunchHostFunc::Request) -> R<LaunchHostFunc::Reply> {
        let (ctx, stream) = self.stream(req.stream)?;
        let f = self.host_fn(req.id)?;
        self.backend.launch_host_func(ctx, stream, f)?;
        Ok(LaunchHostFunc::Reply {})
    }

    pub(super) fn graph_clone(&mut self, req: cuGraphClone::Request) -> R<cuGraphClone::Reply> {
        let g = self.tables.get(Kind::Graph, req.originalGraph.0)?.obj;
        let clone = self.backend.graph_clone(g)?;
        Ok(cuGraphClone::Reply { phGraphClone: Graph(self.graph_handle(clone)) })
    }

    pub(super) fn graph_find_in_clone(
        &mut self,
        req: cuGraphNodeFindInClone::Request,
    ) -> R<cuGraphNodeFindInClone::Reply> {
        let (_, node) = self.node(req.hOriginalNode)?;
        let clone = self.tables.get(Kind::Graph, req.hClonedGraph.0)?.obj;
        let found = self.backend.graph_node_find_in_clone(node, clone)?;
        Ok(cuGraphNodeFindInClone::Reply { phNode: GraphNode(self.node_handle(req.hClonedGraph.0, found)) })
    }

    pub(super) fn graph_destroy_node(&mut self, req: cuGraphDestroyNode::Request) -> R<cuGraphDestroyNode::Reply> {
        let (_, node) = self.node(req.hNode)?;
        self.backend.graph_destroy_node(node)?;
        self.tables.remove(Kind::GraphNode, req.hNode.0)?;
        Ok(cuGraphDestroyNode::Reply {})
    }

    pub(super) fn graph_exec_update(&mut self, req: GraphExecUpdate::Request) -> R<GraphExecUpdate::Reply> {
        let exec = self.tables.get(Kind::GraphExec, req.exec.0)?;
        let ctx = self.ctx_of(&exec)?;
        let g = self.tables.get(Kind::Graph, req.graph.0)?.obj;
        let ExecUpdate { status, result, error_node, error_from } = self.backend.graph_exec_update(ctx, exec.obj, g)?;
        Ok(GraphExecUpdate::Reply {
            status,
            result,
            errorNode: GraphNode(self.node_handle(req.graph.0, error_node)),
            errorFromNode: GraphNode(self.node_handle(req.graph.0, error_from)),
        })
    }
}
