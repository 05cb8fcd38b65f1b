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
use gpuplex_protocol::{CallError, CuError, Graph, GraphExec, Seq};
use tracing::{debug, warn};

use super::tables::{Entry, Kind, Owner};
use super::{invalid, Session};
use crate::backend::{Backend, Obj};
use crate::sched::Work;

type R<T> = Result<T, CallError>;

/// `CU_STREAM_CAPTURE_MODE_GLOBAL`, every thread's mode until it changes it.
const GLOBAL: u32 = 0;
/// `CU_STREAM_CAPTURE_MODE_RELAXED`, the last of the modes.
const RELAXED: u32 = 2;

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
