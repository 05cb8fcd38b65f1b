//! A session's graphs: streams it captures, graphs it captured or made,
//! their instantiations and launches. Graphs, executable graphs and nodes
//! are handles of the session's tables like every other object; the driver
//! owns the capture itself.
//!
//! A client thread's capture mode decides which of its calls a capture in
//! progress forbids. The session runs every client thread's calls on one
//! thread, so before each call it gives that thread the calling client
//! thread's mode (the client posts a thread's mode when it changes).

use gpuplex_protocol::calls::*;
use gpuplex_protocol::capture_mode::{GLOBAL, RELAXED};
use gpuplex_protocol::{calls, CallError, CuError, Graph, GraphExec, GraphsCalls, Seq};
use tracing::{debug, warn};

use super::tables::{Entry, Kind, Owner};
use super::{invalid, Session};
use crate::backend::{Backend, Obj};
use crate::sched::Work;

type R<T> = Result<T, CallError>;

impl Session {
    pub(super) fn capture_mode(&mut self, req: CaptureMode::Request) -> R<CaptureMode::Reply> {
        match req.mode {
            GLOBAL => self.capture_modes.remove(&self.thread),
            mode if mode <= RELAXED => self.capture_modes.insert(self.thread, mode),
            _ => return Err(CallError::new(CuError::INVALID_VALUE, format!("capture mode {}", req.mode))),
        };
        Ok(CaptureMode::Reply {})
    }

    /// Runs `f` with the driver's capture rules relaxed on the session's
    /// thread while a stream captures: for what the server does of its own
    /// accord (a mirror's registration, teardown), which no capture of the
    /// guest's should refuse.
    pub(super) fn relaxed<T>(&mut self, f: impl FnOnce(&mut Session) -> T) -> T {
        if self.capturing.is_empty() || self.driver_capture_mode == RELAXED {
            return f(self);
        }
        let before = self.backend.exchange_capture_mode(RELAXED);
        let out = f(self);
        if let Ok(mode) = before {
            if let Err(e) = self.backend.exchange_capture_mode(mode) {
                warn!("capture mode {mode} not restored: {e}");
            }
        }
        out
    }

    /// Ends the captures a guest left running, discarding their graphs, so
    /// that nothing of its teardown is refused as unsafe in a capture.
    pub(super) fn end_captures(&mut self) {
        for (ctx, stream) in std::mem::take(&mut self.capturing) {
            match self.backend.stream_end_capture(ctx, stream) {
                Ok(graph) if graph != Obj(0) => drop(self.backend.graph_destroy(graph)),
                Ok(_) => {}
                Err(e) => debug!("a capture left running ended: {e}"),
            }
        }
    }

    /// Gives the session's thread the calling client thread's capture mode.
    pub(super) fn apply_capture_mode(&mut self) {
        let want = self.capture_modes.get(&self.thread).copied().unwrap_or(GLOBAL);
        if want != self.driver_capture_mode {
            match self.backend.exchange_capture_mode(want) {
                Ok(_) => self.driver_capture_mode = want,
                Err(e) => warn!("capture mode {want} not set: {e}"),
            }
        }
    }

    /// The handle of a graph the driver made or gave.
    pub(super) fn graph_handle(&mut self, graph: Obj) -> u64 {
        self.made_graphs = true;
        self.tables.add(Kind::Graph, Entry { obj: graph, ctx: 0, owner: Owner::Ctx(0) })
    }

    fn node_handles(&mut self, graph: u64, nodes: Vec<Obj>) -> Vec<u64> {
        let entry = |obj| Entry { obj, ctx: 0, owner: Owner::Graph(graph) };
        nodes.into_iter().map(|n| self.tables.add(Kind::GraphNode, entry(n))).collect()
    }

    pub(super) fn begin_capture(&mut self, req: StreamBeginCapture::Request) -> R<StreamBeginCapture::Reply> {
        let (ctx, stream) = self.stream(req.hStream)?;
        self.capture_begun(ctx, stream, |b| b.stream_begin_capture(ctx, stream, req.mode))?;
        Ok(StreamBeginCapture::Reply {})
    }

    pub(super) fn begin_capture_to_graph(
        &mut self,
        req: StreamBeginCaptureToGraph::Request,
    ) -> R<StreamBeginCaptureToGraph::Reply> {
        let (ctx, stream) = self.stream(req.hStream)?;
        let graph = self.tables.get(Kind::Graph, req.graph.0)?.obj;
        let deps = self.nodes_of(req.graph.0, &req.deps.0)?;
        if !req.data.0.is_empty() && req.data.0.len() != deps.len() {
            return Err(invalid("edge data for every dependency or none"));
        }
        self.capture_begun(ctx, stream, |b| {
            b.stream_begin_capture_to_graph(ctx, stream, graph, &deps, &req.data.0, req.mode)
        })?;
        self.capturing_into.push((stream, req.graph.0));
        Ok(StreamBeginCaptureToGraph::Reply {})
    }

    /// Begins a capture with `begin`; the seat keeps off the session's
    /// streams from before it starts.
    fn capture_begun(&mut self, ctx: Obj, stream: Obj, begin: impl FnOnce(&dyn Backend) -> R<()>) -> R<()> {
        self.made_graphs = true;
        self.seat.set_capturing(true);
        match begin(&*self.backend) {
            Ok(()) => self.capturing.push((ctx, stream)),
            Err(e) => {
                self.seat.set_capturing(!self.capturing.is_empty());
                return Err(e);
            }
        }
        Ok(())
    }

    pub(super) fn end_capture(&mut self, req: StreamEndCapture::Request) -> R<StreamEndCapture::Reply> {
        let (ctx, stream) = self.stream(req.hStream)?;
        let capturing = self.backend.stream_capture_info(ctx, stream, false).map(|i| i.graph).ok();
        let ended = self.backend.stream_end_capture(ctx, stream);
        // The capture is over whether or not it made a graph.
        self.capture_gone(|c| c == (ctx, stream));
        if let Some(at) = self.capturing_into.iter().position(|&(s, _)| s == stream) {
            // The program's own graph, which stays its whatever the outcome.
            let (_, graph) = self.capturing_into.swap_remove(at);
            ended?;
            return Ok(StreamEndCapture::Reply { graph: Graph(graph) });
        }
        if ended.is_err() {
            // The driver discarded the graph: a handle the capture's queries
            // gave for it (and its nodes') must name nothing now.
            if let Some(h) = capturing.and_then(|g| self.tables.issued(Kind::Graph, 0, g)) {
                let _ = self.tables.remove(Kind::Graph, h);
            }
        }
        Ok(StreamEndCapture::Reply { graph: Graph(self.graph_handle(ended?)) })
    }

    /// Refuses a copy with the server's own buffers (a frame's bytes) in a
    /// capture, as the driver refuses pageable memory where the device
    /// cannot reach it: the graph would use the buffers after they are gone.
    pub(super) fn refuse_in_capture(&self, ctx: Obj, stream: Obj, what: &str) -> R<()> {
        // The legacy stream never captures.
        if self.capturing.is_empty() || stream.0 <= 1 {
            return Ok(());
        }
        self.backend.refuse_in_capture(ctx, stream, what)
    }

    /// Forgets the captures `gone` picks, which have ended.
    pub(super) fn capture_gone(&mut self, gone: impl Fn((Obj, Obj)) -> bool) {
        let before = self.capturing.len();
        self.capturing.retain(|&c| !gone(c));
        if self.capturing.len() != before {
            self.seat.set_capturing(!self.capturing.is_empty());
        }
    }

    pub(super) fn capture_info(&mut self, req: StreamCaptureInfo::Request) -> R<StreamCaptureInfo::Reply> {
        let (ctx, stream) = self.stream(req.hStream)?;
        let info = self.backend.stream_capture_info(ctx, stream, req.edges)?;
        let graph = if info.graph == Obj(0) { 0 } else { self.graph_handle(info.graph) };
        let deps = if graph == 0 { Vec::new() } else { self.node_handles(graph, info.deps) };
        Ok(StreamCaptureInfo::Reply {
            status: info.status,
            id: info.id,
            graph: Graph(graph),
            deps: Seq(deps),
            edgeData: Seq(info.edges),
        })
    }

    pub(super) fn update_capture_deps(
        &mut self,
        req: StreamUpdateCaptureDependencies::Request,
    ) -> R<StreamUpdateCaptureDependencies::Reply> {
        let (ctx, stream) = self.stream(req.hStream)?;
        if req.deps.0.len() > super::nodes::MAX_DEPS {
            return Err(CallError::new(CuError::INVALID_VALUE, format!("{} nodes in one call", req.deps.0.len())));
        }
        let deps = req.deps.0.iter().map(|&n| Ok(self.tables.get(Kind::GraphNode, n)?.obj)).collect::<R<Vec<Obj>>>()?;
        self.backend.stream_update_capture_deps(ctx, stream, &deps, req.flags)?;
        Ok(StreamUpdateCaptureDependencies::Reply {})
    }

    pub(super) fn graph_create(&mut self, req: cuGraphCreate::Request) -> R<cuGraphCreate::Reply> {
        let graph = self.backend.graph_create(req.flags)?;
        Ok(cuGraphCreate::Reply { phGraph: Graph(self.graph_handle(graph)) })
    }

    pub(super) fn graph_destroy(&mut self, req: cuGraphDestroy::Request) -> R<cuGraphDestroy::Reply> {
        let graph = self.tables.get(Kind::Graph, req.hGraph.0)?;
        if let Owner::Node(_) = graph.owner {
            return Err(invalid("a conditional node's body graph goes with its node"));
        }
        self.backend.graph_destroy(graph.obj)?;
        // Its nodes go with it.
        self.tables.remove(Kind::Graph, req.hGraph.0)?;
        Ok(cuGraphDestroy::Reply {})
    }

    pub(super) fn graph_instantiate(
        &mut self,
        req: cuGraphInstantiateWithFlags::Request,
    ) -> R<cuGraphInstantiateWithFlags::Reply> {
        let graph = self.tables.get(Kind::Graph, req.hGraph.0)?;
        let (h, ctx) = self.current_ctx()?;
        let exec = self.backend.graph_instantiate(ctx, graph.obj, req.flags)?;
        let exec = self.tables.add(Kind::GraphExec, Entry { obj: exec, ctx: h, owner: Owner::Ctx(h) });
        Ok(cuGraphInstantiateWithFlags::Reply { phGraphExec: GraphExec(exec) })
    }

    /// An executable graph, and the stream to run it in.
    fn exec_in(&mut self, exec: GraphExec, stream: gpuplex_protocol::Stream) -> R<(Obj, Obj, Obj)> {
        let exec = self.tables.get(Kind::GraphExec, exec.0)?.obj;
        let (ctx, stream) = self.stream(stream)?;
        Ok((ctx, exec, stream))
    }

    /// A graph's work is the session's compute work: held back for its turn.
    pub(super) fn graph_launch(&mut self, req: cuGraphLaunch::Request) -> R<cuGraphLaunch::Reply> {
        let (ctx, exec, stream) = self.exec_in(req.hGraphExec, req.hStream)?;
        let backend = self.backend.clone();
        self.seat.submit(ctx, stream, Work::Compute, || backend.graph_launch(ctx, exec, stream))?;
        Ok(cuGraphLaunch::Reply {})
    }

    pub(super) fn graph_upload(&mut self, req: cuGraphUpload::Request) -> R<cuGraphUpload::Reply> {
        let (ctx, exec, stream) = self.exec_in(req.hGraphExec, req.hStream)?;
        self.backend.graph_upload(ctx, exec, stream)?;
        Ok(cuGraphUpload::Reply {})
    }

    pub(super) fn graph_exec_destroy(&mut self, req: cuGraphExecDestroy::Request) -> R<cuGraphExecDestroy::Reply> {
        let exec = self.tables.get(Kind::GraphExec, req.hGraphExec.0)?;
        self.backend.graph_exec_destroy(exec.obj)?;
        self.tables.remove(Kind::GraphExec, req.hGraphExec.0)?;
        Ok(cuGraphExecDestroy::Reply {})
    }

    pub(super) fn graph_nodes(&mut self, req: GraphNodes::Request) -> R<GraphNodes::Reply> {
        let graph = self.tables.get(Kind::Graph, req.hGraph.0)?;
        let nodes = self.backend.graph_nodes(graph.obj, req.roots)?;
        Ok(GraphNodes::Reply { nodes: Seq(self.node_handles(req.hGraph.0, nodes)) })
    }

    /// Destroys every executable graph and graph, for a session that ends
    /// while its worker lives on (sessions on threads, in tests).
    pub(super) fn release_graphs(&mut self) {
        for (_, exec) in self.tables.all(Kind::GraphExec) {
            if let Err(e) = self.backend.graph_exec_destroy(exec.obj) {
                warn!("teardown: graph exec destroy failed: {e}");
            }
        }
        // Body graphs go with their nodes.
        for (_, graph) in self.tables.all(Kind::Graph).into_iter().filter(|(_, g)| !matches!(g.owner, Owner::Node(_))) {
            if let Err(e) = self.backend.graph_destroy(graph.obj) {
                warn!("teardown: graph destroy failed: {e}");
            }
        }
    }
}

#[allow(non_snake_case)]
impl GraphsCalls for Session {
    fn GraphAddMemAllocNode(
        &mut self,
        req: calls::GraphAddMemAllocNode::Request,
    ) -> R<calls::GraphAddMemAllocNode::Reply> {
        self.graph_add_mem_alloc_node(req)
    }

    fn GraphAddMemFreeNode(
        &mut self,
        req: calls::GraphAddMemFreeNode::Request,
    ) -> R<calls::GraphAddMemFreeNode::Reply> {
        self.graph_add_mem_free_node(req)
    }

    fn GraphMemAllocNodeParams(
        &mut self,
        req: calls::GraphMemAllocNodeParams::Request,
    ) -> R<calls::GraphMemAllocNodeParams::Reply> {
        self.graph_mem_alloc_node_params(req)
    }

    fn GraphMemAttributeSet(
        &mut self,
        req: calls::GraphMemAttributeSet::Request,
    ) -> R<calls::GraphMemAttributeSet::Reply> {
        self.graph_mem_set_attribute(req)
    }

    fn CaptureMode(&mut self, req: calls::CaptureMode::Request) -> R<calls::CaptureMode::Reply> {
        self.capture_mode(req)
    }

    fn StreamBeginCapture(&mut self, req: calls::StreamBeginCapture::Request) -> R<calls::StreamBeginCapture::Reply> {
        self.begin_capture(req)
    }

    fn StreamBeginCaptureToGraph(
        &mut self,
        req: calls::StreamBeginCaptureToGraph::Request,
    ) -> R<calls::StreamBeginCaptureToGraph::Reply> {
        self.begin_capture_to_graph(req)
    }

    fn StreamEndCapture(&mut self, req: calls::StreamEndCapture::Request) -> R<calls::StreamEndCapture::Reply> {
        self.end_capture(req)
    }

    fn StreamCaptureInfo(&mut self, req: calls::StreamCaptureInfo::Request) -> R<calls::StreamCaptureInfo::Reply> {
        self.capture_info(req)
    }

    fn cuGraphCreate(&mut self, req: calls::cuGraphCreate::Request) -> R<calls::cuGraphCreate::Reply> {
        self.graph_create(req)
    }

    fn cuGraphDestroy(&mut self, req: calls::cuGraphDestroy::Request) -> R<calls::cuGraphDestroy::Reply> {
        self.graph_destroy(req)
    }

    fn cuGraphInstantiateWithFlags(
        &mut self,
        req: calls::cuGraphInstantiateWithFlags::Request,
    ) -> R<calls::cuGraphInstantiateWithFlags::Reply> {
        self.graph_instantiate(req)
    }

    fn cuGraphLaunch(&mut self, req: calls::cuGraphLaunch::Request) -> R<calls::cuGraphLaunch::Reply> {
        self.graph_launch(req)
    }

    fn cuGraphUpload(&mut self, req: calls::cuGraphUpload::Request) -> R<calls::cuGraphUpload::Reply> {
        self.graph_upload(req)
    }

    fn cuGraphExecDestroy(&mut self, req: calls::cuGraphExecDestroy::Request) -> R<calls::cuGraphExecDestroy::Reply> {
        self.graph_exec_destroy(req)
    }

    fn GraphAddKernelNode(&mut self, req: calls::GraphAddKernelNode::Request) -> R<calls::GraphAddKernelNode::Reply> {
        self.graph_add_kernel_node(req)
    }

    fn GraphAddMemcpyNode(&mut self, req: calls::GraphAddMemcpyNode::Request) -> R<calls::GraphAddMemcpyNode::Reply> {
        self.graph_add_memcpy_node(req)
    }

    fn GraphAddMemsetNode(&mut self, req: calls::GraphAddMemsetNode::Request) -> R<calls::GraphAddMemsetNode::Reply> {
        self.graph_add_memset_node(req)
    }

    fn cuGraphChildGraphNodeGetGraph(
        &mut self,
        req: calls::cuGraphChildGraphNodeGetGraph::Request,
    ) -> R<calls::cuGraphChildGraphNodeGetGraph::Reply> {
        self.child_graph(req)
    }

    fn GraphMemsetNodeParams(
        &mut self,
        req: calls::GraphMemsetNodeParams::Request,
    ) -> R<calls::GraphMemsetNodeParams::Reply> {
        self.memset_node_params(req)
    }

    fn UserObjectCreate(&mut self, req: calls::UserObjectCreate::Request) -> R<calls::UserObjectCreate::Reply> {
        self.user_object_create(req)
    }

    fn GraphMemcpyNodeParams(
        &mut self,
        req: calls::GraphMemcpyNodeParams::Request,
    ) -> R<calls::GraphMemcpyNodeParams::Reply> {
        self.memcpy_node_params(req)
    }

    fn GraphAddConditionalNode(
        &mut self,
        req: calls::GraphAddConditionalNode::Request,
    ) -> R<calls::GraphAddConditionalNode::Reply> {
        self.graph_add_conditional_node(req)
    }

    fn GraphAddEmptyNode(&mut self, req: calls::GraphAddEmptyNode::Request) -> R<calls::GraphAddEmptyNode::Reply> {
        self.graph_add_empty_node(req)
    }

    fn GraphAddChildGraphNode(
        &mut self,
        req: calls::GraphAddChildGraphNode::Request,
    ) -> R<calls::GraphAddChildGraphNode::Reply> {
        self.graph_add_child_node(req)
    }

    fn GraphAddEventNode(&mut self, req: calls::GraphAddEventNode::Request) -> R<calls::GraphAddEventNode::Reply> {
        self.graph_add_event_node(req)
    }

    fn GraphDependencies(&mut self, req: calls::GraphDependencies::Request) -> R<calls::GraphDependencies::Reply> {
        self.graph_dependencies(req)
    }

    fn GraphEdges(&mut self, req: calls::GraphEdges::Request) -> R<calls::GraphEdges::Reply> {
        self.graph_edges(req)
    }

    fn GraphNodeEdges(&mut self, req: calls::GraphNodeEdges::Request) -> R<calls::GraphNodeEdges::Reply> {
        self.graph_node_edges(req)
    }

    fn GraphKernelNodeSetParams(
        &mut self,
        req: calls::GraphKernelNodeSetParams::Request,
    ) -> R<calls::GraphKernelNodeSetParams::Reply> {
        self.graph_kernel_node_set(req)
    }

    fn cuGraphClone(&mut self, req: calls::cuGraphClone::Request) -> R<calls::cuGraphClone::Reply> {
        self.graph_clone(req)
    }

    fn cuGraphNodeFindInClone(
        &mut self,
        req: calls::cuGraphNodeFindInClone::Request,
    ) -> R<calls::cuGraphNodeFindInClone::Reply> {
        self.graph_find_in_clone(req)
    }

    fn cuGraphDestroyNode(&mut self, req: calls::cuGraphDestroyNode::Request) -> R<calls::cuGraphDestroyNode::Reply> {
        self.graph_destroy_node(req)
    }

    fn GraphExecUpdate(&mut self, req: calls::GraphExecUpdate::Request) -> R<calls::GraphExecUpdate::Reply> {
        self.graph_exec_update(req)
    }

    fn GraphAddHostNode(&mut self, req: calls::GraphAddHostNode::Request) -> R<calls::GraphAddHostNode::Reply> {
        self.graph_add_host_node(req)
    }

    fn GraphHostNodeSetParams(
        &mut self,
        req: calls::GraphHostNodeSetParams::Request,
    ) -> R<calls::GraphHostNodeSetParams::Reply> {
        self.graph_host_node_set(req)
    }

    fn GraphMemcpyNodeSetParams(
        &mut self,
        req: calls::GraphMemcpyNodeSetParams::Request,
    ) -> R<calls::GraphMemcpyNodeSetParams::Reply> {
        self.graph_memcpy_node_set(req)
    }

    fn GraphMemsetNodeSetParams(
        &mut self,
        req: calls::GraphMemsetNodeSetParams::Request,
    ) -> R<calls::GraphMemsetNodeSetParams::Reply> {
        self.graph_memset_node_set(req)
    }

    fn GraphChildNodeSetParams(
        &mut self,
        req: calls::GraphChildNodeSetParams::Request,
    ) -> R<calls::GraphChildNodeSetParams::Reply> {
        self.graph_child_node_set(req)
    }

    fn GraphEventNodeSetEvent(
        &mut self,
        req: calls::GraphEventNodeSetEvent::Request,
    ) -> R<calls::GraphEventNodeSetEvent::Reply> {
        self.graph_event_node_set(req)
    }

    fn LaunchHostFunc(&mut self, req: calls::LaunchHostFunc::Request) -> R<calls::LaunchHostFunc::Reply> {
        self.launch_host_func(req)
    }

    fn StreamUpdateCaptureDependencies(
        &mut self,
        req: calls::StreamUpdateCaptureDependencies::Request,
    ) -> R<calls::StreamUpdateCaptureDependencies::Reply> {
        self.update_capture_deps(req)
    }

    fn GraphNodes(&mut self, req: calls::GraphNodes::Request) -> R<calls::GraphNodes::Reply> {
        self.graph_nodes(req)
    }

    fn GraphDebugDot(&mut self, req: calls::GraphDebugDot::Request) -> R<calls::GraphDebugDot::Reply> {
        let graph = self.tables.get(Kind::Graph, req.hGraph.0)?.obj;
        Ok(calls::GraphDebugDot::Reply { dot: self.backend.graph_debug_dot(graph, req.flags)? })
    }
}
