//! Graphs on the emulated device: a capturing stream's work is recorded as
//! nodes instead of run, or nodes are added by hand; an executable graph
//! runs its nodes one after another in an order that respects every
//! dependency (a child graph's in its own order, in its node's place),
//! since the device runs all work at once in call order anyway.
//!
//! The test device captures one stream at a time, with kernels, memsets and
//! copies between device memory and registered host memory. Work it cannot
//! record (events in a capture, a graph launched into one) is refused with
//! `CUDA_ERROR_NOT_SUPPORTED` and invalidates the capture; what the driver
//! forbids during a capture (a copy from pageable memory, waiting for a
//! capturing stream) fails as the driver's does. Of the calls a capture's
//! mode forbids, registering host memory is refused as the driver refuses
//! it; the device's other calls are not checked.

use std::collections::{HashMap, HashSet};

use gpuplex_protocol::capture_mode::{GLOBAL, RELAXED, THREAD_LOCAL};
use gpuplex_protocol::{CallError, CuError, COPY_3D};

use super::{err, user_objects, Emulated, Owner};
use crate::backend::{
    self, BResult, CaptureInfo, Conditional, Copy3D, CopyEnd, ExecUpdate, GraphAlloc, HostFn, Launch, Memset, NodeWork,
    Obj, Place,
};

/// `CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE`, and the update result that goes
/// with it when the graph is not shaped as the executable one.
const UPDATE_FAILURE: u32 = 910;
const TOPOLOGY_CHANGED: u32 = 2;

/// What one node does.
#[derive(Clone, Debug)]
pub enum Work {
    Kernel {
        func: Obj,
        launch: Launch,
        params: Vec<u8>,
    },
    Memset(Memset),
    /// Between device addresses; registered host memory has one too.
    Copy {
        dst: u64,
        src: u64,
        size: u64,
    },
    /// A memcpy node: host ends in registered host memory.
    Copy3D(Copy3D),
    Empty,
    /// A child graph: a copy of its work in order, made when the node was
    /// added (as the driver copies it), run in the node's place; kept whole
    /// so that an executable graph's copy can be replaced.
    Child(Vec<(u64, Work)>),
    Event {
        event: u64,
        wait: bool,
    },
    Host(HostFn),
    /// Graph memory: placed when the node is made, so running it does nothing.
    MemAlloc(GraphAlloc),
    MemFree(u64),
    Conditional(Box<ConditionalWork>),
}

/// A conditional node: its handle, kind, and body graphs; in an executable
/// graph (or a child graph's copy) also each body's work, in order.
#[derive(Clone, Debug)]
pub struct ConditionalWork {
    pub handle: u64,
    pub kind: u32,
    pub graphs: Vec<u64>,
    pub bodies: Vec<Vec<(u64, Work)>>,
}

/// `CU_GRAPH_COND_TYPE_IF`, `_WHILE`, `_SWITCH`.
pub const IF: u32 = 0;
pub const WHILE: u32 = 1;
pub const SWITCH: u32 = 2;
/// `CU_GRAPH_COND_ASSIGN_DEFAULT`.
const ASSIGN_DEFAULT: u32 = 1;

/// A conditional handle's value, and the default each launch may start with.
#[derive(Clone, Copy, Debug)]
struct Condition {
    value: u32,
    default: u32,
    assign_default: bool,
}

/// The conditional handles the device made: what kernels set with
/// `cudaGraphSetConditional` and conditional nodes read.
#[derive(Default)]
pub struct Conditions(HashMap<u64, Condition>);

impl Conditions {
    pub fn set(&mut self, handle: u64, value: u32) -> Result<(), CuError> {
        // A handle the device never made is a wild address to the kernel.
        self.0.get_mut(&handle).map(|c| c.value = value).ok_or(CuError::ILLEGAL_ADDRESS)
    }

    pub fn value(&self, handle: u64) -> BResult<u32> {
        self.0.get(&handle).map(|c| c.value).ok_or_else(|| err(CuError::INVALID_VALUE, "no such conditional handle"))
    }

    /// Gives the handles of `work`'s conditional nodes (their bodies' too)
    /// their defaults, as a launch does where the handle asks for it.
    pub fn assign_defaults(&mut self, work: &[(u64, Work)]) {
        for (_, w) in work {
            match w {
                Work::Conditional(c) => {
                    if let Some(h) = self.0.get_mut(&c.handle).filter(|h| h.assign_default) {
                        h.value = h.default;
                    }
                    for body in &c.bodies {
                        self.assign_defaults(body);
                    }
                }
                Work::Child(child) => self.assign_defaults(child),
                _ => {}
            }
        }
    }
}

/// The most work one graph may hold, its child graphs' counted in: the test device
/// runs it with the device locked.
const MAX_WORK: usize = 1 << 16;

impl Work {
    /// The work items this node stands for, child graphs' counted in.
    fn size(&self) -> usize {
        match self {
            Work::Child(work) => work.iter().map(|(_, w)| w.size()).sum(),
            Work::Conditional(c) => 1 + c.bodies.iter().flatten().map(|(_, w)| w.size()).sum::<usize>(),
            _ => 1,
        }
    }

    /// `CUgraphNodeType`.
    fn node_type(&self) -> u32 {
        match self {
            Work::Kernel { .. } => 0,
            Work::Copy { .. } | Work::Copy3D(_) => 1,
            Work::Memset(_) => 2,
            Work::Child(_) => 4,
            Work::Empty => 5,
            Work::Host(_) => 3,
            Work::Event { wait: true, .. } => 6,
            Work::Event { wait: false, .. } => 7,
            Work::MemAlloc(_) => 10,
            Work::MemFree(_) => 11,
            Work::Conditional(_) => 13,
        }
    }

    fn of(node: &NodeWork<'_>) -> Work {
        match *node {
            NodeWork::Kernel { func, launch, params } => {
                Work::Kernel { func, launch: launch.clone(), params: params.to_vec() }
            }
            NodeWork::Memcpy(c) => Work::Copy3D(*c),
            NodeWork::Memset(m) => Work::Memset(*m),
            NodeWork::Empty => Work::Empty,
            // The caller copies the child's work in.
            NodeWork::Child(_) => Work::Child(Vec::new()),
            NodeWork::Event { event, wait } => Work::Event { event: event.0, wait },
            NodeWork::Host(f) => Work::Host(f),
            NodeWork::MemFree(dptr) => Work::MemFree(dptr),
        }
    }
}

struct Node {
    id: u64,
    work: Work,
    deps: Vec<u64>,
}

struct Capture {
    graph: u64,
    id: u64,
    /// The nodes the next one depends on.
    tail: Vec<u64>,
    /// Why the capture can no longer succeed, once something failed in it.
    invalid: Option<CuError>,
    /// Whether the graph was made for the capture (and goes if it fails),
    /// rather than given by the program.
    owned: bool,
    /// The mode it began in (`CUstreamCaptureMode`), and on which thread.
    mode: u32,
    thread: std::thread::ThreadId,
}

thread_local! {
    /// The calling thread's capture mode (`cuThreadExchangeStreamCaptureMode`).
    static MODE: std::cell::Cell<u32> = const { std::cell::Cell::new(GLOBAL) };
}

/// `CU_STREAM_CAPTURE_STATUS_ACTIVE`, `_INVALIDATED`.
const ACTIVE: u32 = 1;
const INVALIDATED: u32 = 2;

#[derive(Default)]
pub struct Graphs {
    next: u64,
    graphs: HashMap<u64, Vec<Node>>,
    /// Executable graphs: their context and their nodes' work in order.
    execs: HashMap<u64, (u64, Vec<(u64, Work)>)>,
    /// Capturing streams.
    captures: HashMap<u64, Capture>,
    pub conditions: Conditions,
    /// Each clone's copy of a node: `(clone, original node)` to node.
    clones: HashMap<(u64, u64), u64>,
    /// Nodes turned off in an executable graph: `(exec, node)`.
    disabled: HashSet<(u64, u64)>,
    /// The data of edges `(from, to)` other than the default.
    edge_data: HashMap<(u64, u64), u64>,
    /// Each child graph node's own clone of its graph, as the program may
    /// ask for it.
    child_graphs: HashMap<u64, u64>,
}

/// Whether two child graphs' work has the same kinds of node in the same
/// order, their own child graphs' too.
fn same_shape(a: &[(u64, Work)], b: &[(u64, Work)]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|((_, x), (_, y))| match (x, y) {
            (Work::Child(x), Work::Child(y)) => same_shape(x, y),
            (x, y) => x.node_type() == y.node_type(),
        })
}

/// `CUgraphEdgeData` as the driver documents it: a from-port of 0 to 2
/// (default, programmatic, launch order), a to-port of 0, a type of 0 or 1
/// (default, programmatic), the rest zero; programmatic edges join kernels.
fn edge_data_valid(data: u64, kernels: bool) -> bool {
    let [from_port, to_port, kind, ..] = data.to_le_bytes();
    data >> 24 == 0 && from_port <= 2 && to_port == 0 && kind <= 1 && (data == 0 || kernels)
}

impl Graphs {
    fn id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    pub fn create(&mut self) -> Obj {
        let id = self.id();
        self.graphs.insert(id, Vec::new());
        Obj(id)
    }

    pub fn destroy(&mut self, graph: Obj) -> BResult<()> {
        if self.captures.values().any(|c| c.graph == graph.0) {
            return Err(err(CuError::ILLEGAL_STATE, "the graph is being captured"));
        }
        self.graphs.remove(&graph.0).map(drop).ok_or_else(|| CuError::INVALID_VALUE.into())
    }

    pub fn is_capturing(&self, stream: Obj) -> bool {
        self.captures.contains_key(&stream.0)
    }

    pub fn begin(&mut self, stream: Obj, mode: u32) -> BResult<()> {
        self.check_capturable(stream)?;
        let graph = self.create().0;
        let id = self.id();
        let thread = std::thread::current().id();
        let capture = Capture { graph, id, tail: Vec::new(), invalid: None, owned: true, mode, thread };
        self.captures.insert(stream.0, capture);
        Ok(())
    }

    /// Whether the calling thread may not make a call the driver calls
    /// potentially unsafe (registering host memory, say), by the rules of
    /// `cuThreadExchangeStreamCaptureMode`: in the global mode, while a
    /// capture of its own is not relaxed or another thread's is global; in
    /// the thread-local mode, while one of its own is not relaxed.
    pub fn forbids_unsafe_calls(&self) -> bool {
        let here = std::thread::current().id();
        let mine_strict = self.captures.values().any(|c| c.thread == here && c.mode != RELAXED);
        match MODE.get() {
            RELAXED => false,
            THREAD_LOCAL => mine_strict,
            _ => mine_strict || self.captures.values().any(|c| c.thread != here && c.mode == GLOBAL),
        }
    }

    /// A capture into the program's `graph`, after its nodes `deps`.
    pub fn begin_into(&mut self, stream: Obj, graph: Obj, deps: &[Obj], mode: u32) -> BResult<()> {
        self.check_capturable(stream)?;
        let nodes = self.graphs.get(&graph.0).ok_or(CuError::INVALID_VALUE)?;
        if !deps.iter().all(|d| nodes.iter().any(|n| n.id == d.0)) {
            return Err(err(CuError::INVALID_VALUE, "a dependency is not a node of the graph"));
        }
        if self.captures.values().any(|c| c.graph == graph.0) {
            return Err(err(CuError::ILLEGAL_STATE, "the graph is being captured into already"));
        }
        let id = self.id();
        let tail = deps.iter().map(|d| d.0).collect();
        let thread = std::thread::current().id();
        let capture = Capture { graph: graph.0, id, tail, invalid: None, owned: false, mode, thread };
        self.captures.insert(stream.0, capture);
        Ok(())
    }

    fn check_capturable(&self, stream: Obj) -> BResult<()> {
        if stream.0 <= 2 {
            return Err(err(CuError::STREAM_CAPTURE_UNSUPPORTED, "a default stream cannot be captured"));
        }
        if self.is_capturing(stream) {
            return Err(err(CuError::ILLEGAL_STATE, "the stream is already capturing"));
        }
        Ok(())
    }

    pub fn end(&mut self, stream: Obj) -> BResult<Obj> {
        let c = self
            .captures
            .remove(&stream.0)
            .ok_or_else(|| err(CuError::ILLEGAL_STATE, "the stream is not capturing"))?;
        match c.invalid {
            None => Ok(Obj(c.graph)),
            Some(why) => {
                if c.owned {
                    self.graphs.remove(&c.graph);
                }
                Err(err(CuError::STREAM_CAPTURE_INVALIDATED, format!("the capture failed earlier with {why:?}")))
            }
        }
    }

    pub fn info(&self, stream: Obj) -> CaptureInfo {
        match self.captures.get(&stream.0) {
            None => CaptureInfo::default(),
            Some(c) => CaptureInfo {
                status: if c.invalid.is_some() { INVALIDATED } else { ACTIVE },
                id: c.id,
                graph: Obj(c.graph),
                deps: c.tail.iter().copied().map(Obj).collect(),
                edges: vec![0; c.tail.len()],
            },
        }
    }

    /// Records `work` if `stream` is capturing: `Some` of the outcome, else
    /// `None` and the caller runs it.
    pub fn record(&mut self, stream: Obj, work: Work) -> Option<BResult<()>> {
        let id = self.next + 1;
        let c = self.captures.get_mut(&stream.0)?;
        if let Some(why) = c.invalid {
            return Some(Err(err(
                CuError::STREAM_CAPTURE_INVALIDATED,
                format!("the capture failed earlier with {why:?}"),
            )));
        }
        let deps = std::mem::replace(&mut c.tail, vec![id]);
        let graph = c.graph;
        self.next = id;
        self.graphs.get_mut(&graph).expect("a capture's graph").push(Node { id, work, deps });
        Some(Ok(()))
    }

    /// Adds to (`flags` 0) or replaces (1) what a capture's next node
    /// depends on; the nodes must be the capture's graph's.
    pub fn update_capture_deps(&mut self, stream: Obj, deps: &[Obj], flags: u32) -> BResult<()> {
        let c = self.captures.get_mut(&stream.0).ok_or_else(|| err(CuError::ILLEGAL_STATE, "not capturing"))?;
        let nodes = self.graphs.get(&c.graph).expect("a capture's graph");
        if flags > 1 || !deps.iter().all(|d| nodes.iter().any(|n| n.id == d.0)) {
            return Err(CuError::INVALID_VALUE.into());
        }
        if flags == 1 {
            c.tail.clear();
        }
        for d in deps {
            if !c.tail.contains(&d.0) {
                c.tail.push(d.0);
            }
        }
        Ok(())
    }

    /// Fails what `stream`'s capture cannot take, and the capture with it.
    pub fn refuse(&mut self, stream: Obj, code: CuError, why: &str) -> BResult<()> {
        match self.captures.get_mut(&stream.0) {
            Some(c) => {
                c.invalid.get_or_insert(code);
                Err(err(code, format!("{why} while the stream is capturing")))
            }
            None => Ok(()),
        }
    }

    /// Fails a wait for everything while any stream captures, and every capture.
    pub fn refuse_any(&mut self, why: &str) -> BResult<()> {
        if self.captures.is_empty() {
            return Ok(());
        }
        for c in self.captures.values_mut() {
            c.invalid.get_or_insert(CuError::STREAM_CAPTURE_UNSUPPORTED);
        }
        Err(err(CuError::STREAM_CAPTURE_UNSUPPORTED, format!("{why} while a stream is capturing")))
    }

    /// A graph's work in an order that respects its dependencies (the order
    /// the nodes were added where none decides): Kahn's order, in time
    /// linear in the nodes and edges.
    fn ordered(&self, graph: u64) -> BResult<Vec<(u64, Work)>> {
        let nodes = self.graphs.get(&graph).ok_or(CuError::INVALID_VALUE)?;
        let index: HashMap<u64, usize> = nodes.iter().enumerate().map(|(i, n)| (n.id, i)).collect();
        let mut waiting = vec![0usize; nodes.len()];
        let mut after: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
        for (i, n) in nodes.iter().enumerate() {
            for d in n.deps.iter().filter_map(|d| index.get(d)) {
                waiting[i] += 1;
                after[*d].push(i);
            }
        }
        let mut ready: std::collections::BTreeSet<usize> = (0..nodes.len()).filter(|&i| waiting[i] == 0).collect();
        let mut out = Vec::with_capacity(nodes.len());
        while let Some(i) = ready.pop_first() {
            let work = match &nodes[i].work {
                // Each body's work as it is now, as an instantiation or a
                // child graph's copy takes it.
                Work::Conditional(c) => {
                    let bodies = c.graphs.iter().map(|&g| self.ordered(g)).collect::<BResult<_>>()?;
                    Work::Conditional(Box::new(ConditionalWork { bodies, ..(**c).clone() }))
                }
                work => work.clone(),
            };
            out.push((nodes[i].id, work));
            for &j in &after[i] {
                waiting[j] -= 1;
                if waiting[j] == 0 {
                    ready.insert(j);
                }
            }
        }
        if waiting.iter().any(|&w| w > 0) {
            return Err(err(CuError::INVALID_VALUE, "the graph has a cycle"));
        }
        Ok(out)
    }

    /// The work a graph runs, its child graphs' counted in: what a node
    /// holding it would count.
    fn size(&self, graph: u64) -> usize {
        self.graphs.get(&graph).map_or(0, |nodes| nodes.iter().map(|n| n.work.size()).sum())
    }

    pub fn instantiate(&mut self, ctx: Obj, graph: Obj) -> BResult<Obj> {
        let work = self.ordered(graph.0)?;
        if work.iter().map(|(_, w)| w.size()).sum::<usize>() > MAX_WORK {
            return Err(err(
                CuError::OUT_OF_MEMORY,
                format!("more than {MAX_WORK} nodes, conditional bodies counted in"),
            ));
        }
        let id = self.id();
        self.execs.insert(id, (ctx.0, work));
        Ok(Obj(id))
    }

    /// The graph holding `node`, and its place there.
    fn locate(&self, node: u64) -> BResult<(u64, usize)> {
        self.graphs
            .iter()
            .find_map(|(&g, nodes)| nodes.iter().position(|n| n.id == node).map(|i| (g, i)))
            .ok_or_else(|| err(CuError::INVALID_VALUE, "no such node"))
    }

    pub fn add_node(&mut self, graph: Obj, deps: &[Obj], node: &NodeWork<'_>) -> BResult<Obj> {
        let (work, child) = match *node {
            NodeWork::Child(child) if child != graph => (Work::Child(self.ordered(child.0)?), Some(child)),
            NodeWork::Child(_) => return Err(CuError::INVALID_VALUE.into()),
            ref node => (Work::of(node), None),
        };
        let made = self.add_work(graph, deps, work)?;
        if let Some(child) = child {
            // The node's own graph, a clone as the driver makes it.
            let clone = self.clone_graph(child)?;
            self.child_graphs.insert(made.0, clone.0);
        }
        Ok(made)
    }

    /// A child graph node's own graph.
    pub fn child_graph(&self, node: Obj) -> BResult<Obj> {
        self.child_graphs
            .get(&node.0)
            .map(|&g| Obj(g))
            .ok_or_else(|| err(CuError::INVALID_VALUE, "not a child graph node"))
    }

    pub fn add_work(&mut self, graph: Obj, deps: &[Obj], work: Work) -> BResult<Obj> {
        if self.size(graph.0) + work.size() > MAX_WORK {
            return Err(err(
                CuError::OUT_OF_MEMORY,
                format!("more than {MAX_WORK} nodes in one graph, child graphs counted in"),
            ));
        }
        let id = self.id();
        let nodes = self.graphs.get_mut(&graph.0).ok_or(CuError::INVALID_VALUE)?;
        let deps: Vec<u64> = deps.iter().map(|d| d.0).collect();
        if !deps.iter().all(|d| nodes.iter().any(|n| n.id == *d)) {
            return Err(err(CuError::INVALID_VALUE, "a dependency outside the graph"));
        }
        nodes.push(Node { id, work, deps });
        Ok(Obj(id))
    }

    /// `cuGraphConditionalHandleCreate` for `graph`.
    pub fn conditional_handle(&mut self, graph: Obj, default: u32, flags: u32) -> BResult<u64> {
        if !self.graphs.contains_key(&graph.0) || flags & !ASSIGN_DEFAULT != 0 {
            return Err(CuError::INVALID_VALUE.into());
        }
        let handle = self.id();
        let assign_default = flags & ASSIGN_DEFAULT != 0;
        self.conditions.0.insert(handle, Condition { value: default, default, assign_default });
        Ok(handle)
    }

    /// A conditional node of `graph` and its new, empty body graphs. The
    /// bodies stay until the device goes: a clone of the graph shares them.
    pub fn add_conditional(
        &mut self,
        graph: Obj,
        deps: &[Obj],
        handle: u64,
        kind: u32,
        size: u32,
    ) -> BResult<(Obj, Vec<Obj>)> {
        let sizes = match kind {
            IF => 1..=2,
            WHILE => 1..=1,
            SWITCH => 1..=MAX_WORK as u32,
            _ => return Err(err(CuError::INVALID_VALUE, format!("conditional node type {kind}"))),
        };
        if !sizes.contains(&size) {
            return Err(err(CuError::INVALID_VALUE, format!("{size} bodies for a conditional node of type {kind}")));
        }
        self.conditions.value(handle)?;
        let graphs: Vec<u64> = (0..size).map(|_| self.create().0).collect();
        let work = ConditionalWork { handle, kind, graphs: graphs.clone(), bodies: Vec::new() };
        match self.add_work(graph, deps, Work::Conditional(Box::new(work))) {
            Ok(node) => Ok((node, graphs.into_iter().map(Obj).collect())),
            Err(e) => {
                for g in graphs {
                    self.graphs.remove(&g);
                }
                Err(e)
            }
        }
    }

    pub fn dependencies(&mut self, graph: Obj, from: &[Obj], to: &[Obj], data: &[u64], remove: bool) -> BResult<()> {
        let nodes = self.graphs.get_mut(&graph.0).ok_or(CuError::INVALID_VALUE)?;
        let kind = |id: u64| nodes.iter().find(|n| n.id == id).map(|n| n.work.node_type());
        if from.len() != to.len() || !(data.is_empty() || data.len() == from.len()) {
            return Err(CuError::INVALID_VALUE.into());
        }
        for (i, (f, t)) in from.iter().zip(to).enumerate() {
            let (from_kind, to_kind) = (kind(f.0), kind(t.0));
            let kernels = from_kind == Some(0) && to_kind == Some(0);
            if from_kind.is_none() || to_kind.is_none() || !edge_data_valid(data.get(i).copied().unwrap_or(0), kernels)
            {
                return Err(CuError::INVALID_VALUE.into());
            }
        }
        for (i, (f, t)) in from.iter().zip(to).enumerate() {
            let node = nodes.iter_mut().find(|n| n.id == t.0).expect("checked above");
            match (remove, node.deps.iter().position(|d| *d == f.0)) {
                (false, None) => node.deps.push(f.0),
                (true, Some(at)) => drop(node.deps.remove(at)),
                _ => return Err(CuError::INVALID_VALUE.into()),
            }
            match data.get(i).copied().unwrap_or(0) {
                d if d != 0 && !remove => drop(self.edge_data.insert((f.0, t.0), d)),
                _ => drop(self.edge_data.remove(&(f.0, t.0))),
            }
        }
        Ok(())
    }

    fn data_of(&self, from: u64, to: u64) -> u64 {
        self.edge_data.get(&(from, to)).copied().unwrap_or(0)
    }

    pub fn edges(&self, graph: Obj) -> BResult<Vec<(Obj, Obj, u64)>> {
        let nodes = self.graphs.get(&graph.0).ok_or(CuError::INVALID_VALUE)?;
        Ok(nodes.iter().flat_map(|n| n.deps.iter().map(move |&d| (Obj(d), Obj(n.id), self.data_of(d, n.id)))).collect())
    }

    pub fn node_edges(&self, node: Obj, dependents: bool) -> BResult<Vec<(Obj, u64)>> {
        let (graph, i) = self.locate(node.0)?;
        let nodes = &self.graphs[&graph];
        Ok(if dependents {
            nodes.iter().filter(|n| n.deps.contains(&node.0)).map(|n| (Obj(n.id), self.data_of(node.0, n.id))).collect()
        } else {
            nodes[i].deps.iter().map(|&d| (Obj(d), self.data_of(d, node.0))).collect()
        })
    }

    /// New work for a kernel or host node, of the same kind.
    pub fn node_set(&mut self, node: Obj, exec: Option<Obj>, work: &NodeWork<'_>) -> BResult<()> {
        let new = match *work {
            // A child graph is set only in an executable graph, from a graph
            // of the same shape.
            NodeWork::Child(child) if exec.is_some() => Work::Child(self.ordered(child.0)?),
            NodeWork::Child(_) => {
                return Err(err(CuError::INVALID_VALUE, "a child graph is set in an executable graph"))
            }
            _ => Work::of(work),
        };
        let slot = match exec {
            Some(exec) => {
                let (_, work) = self.execs.get_mut(&exec.0).ok_or(CuError::INVALID_VALUE)?;
                work.iter_mut().find(|(id, _)| *id == node.0).map(|(_, w)| w)
            }
            None => {
                let (graph, i) = self.locate(node.0)?;
                self.graphs.get_mut(&graph).map(|nodes| &mut nodes[i].work)
            }
        };
        match slot {
            Some(
                w @ (Work::Kernel { .. } | Work::Host(_) | Work::Copy3D(_) | Work::Memset(_) | Work::Event { .. }),
            ) if w.node_type() == new.node_type() => {
                *w = new;
                Ok(())
            }
            Some(Work::Child(old)) if matches!(&new, Work::Child(w) if same_shape(old, w)) => {
                *old = match new {
                    Work::Child(w) => w,
                    _ => unreachable!("matched above"),
                };
                Ok(())
            }
            _ => Err(err(CuError::INVALID_VALUE, "not a node of that kind")),
        }
    }

    /// Turns a kernel, memcpy or memset node of an executable graph off or
    /// on, as the driver allows for those kinds only.
    pub fn set_enabled(&mut self, exec: Obj, node: Obj, enabled: bool) -> BResult<()> {
        match self.exec_work(exec)?.iter().find(|(id, _)| *id == node.0) {
            Some((_, Work::Kernel { .. } | Work::Memset(_) | Work::Copy { .. } | Work::Copy3D(_))) => {}
            _ => return Err(err(CuError::INVALID_VALUE, "only kernel, memcpy and memset nodes can be turned off")),
        }
        if enabled {
            self.disabled.remove(&(exec.0, node.0));
        } else {
            self.disabled.insert((exec.0, node.0));
        }
        Ok(())
    }

    /// An executable graph's nodes and their work.
    pub fn exec_work(&self, exec: Obj) -> BResult<&[(u64, Work)]> {
        self.execs.get(&exec.0).map(|(_, work)| work.as_slice()).ok_or_else(|| CuError::INVALID_VALUE.into())
    }

    pub fn enabled(&self, exec: Obj, node: Obj) -> BResult<bool> {
        if !self.exec_work(exec)?.iter().any(|(id, _)| *id == node.0) {
            return Err(err(CuError::INVALID_VALUE, "not a node of the executable graph"));
        }
        Ok(!self.disabled.contains(&(exec.0, node.0)))
    }

    /// A node's work, as made.
    pub fn node_work(&self, node: Obj) -> BResult<&Work> {
        let (graph, i) = self.locate(node.0)?;
        Ok(&self.graphs[&graph][i].work)
    }

    /// A kernel node's launch attributes, to read or change.
    pub fn kernel_attributes(&mut self, node: Obj) -> BResult<&mut Vec<(u32, [u8; 64])>> {
        let (graph, i) = self.locate(node.0)?;
        match &mut self.graphs.get_mut(&graph).expect("located").get_mut(i).expect("located").work {
            Work::Kernel { launch, .. } => Ok(&mut launch.attrs),
            _ => Err(err(CuError::INVALID_VALUE, "not a kernel node")),
        }
    }

    /// The bytes every allocation node holds, which the emulated device
    /// places once and keeps (its graph memory, used and reserved alike).
    pub fn memory(&self) -> u64 {
        let held = |w: &Work| if let Work::MemAlloc(a) = w { a.bytes } else { 0 };
        self.graphs.values().flatten().map(|n| held(&n.work)).sum()
    }

    pub fn clone_graph(&mut self, graph: Obj) -> BResult<Obj> {
        let nodes = self.graphs.get(&graph.0).ok_or(CuError::INVALID_VALUE)?;
        let originals: Vec<(u64, Work, Vec<u64>)> =
            nodes.iter().map(|n| (n.id, n.work.clone(), n.deps.clone())).collect();
        let clone = self.id();
        let mut renamed = HashMap::new();
        for (id, _, _) in &originals {
            let new = self.id();
            renamed.insert(*id, new);
            self.clones.insert((clone, *id), new);
        }
        let copies = originals
            .into_iter()
            .map(|(id, work, deps)| Node {
                id: renamed[&id],
                work,
                deps: deps.iter().filter_map(|d| renamed.get(d).copied()).collect(),
            })
            .collect();
        let data: Vec<_> = self
            .edge_data
            .iter()
            .filter_map(|(&(f, t), &d)| Some(((*renamed.get(&f)?, *renamed.get(&t)?), d)))
            .collect();
        self.edge_data.extend(data);
        self.graphs.insert(clone, copies);
        Ok(Obj(clone))
    }

    pub fn find_in_clone(&self, node: Obj, clone: Obj) -> BResult<Obj> {
        self.clones.get(&(clone.0, node.0)).map(|&n| Obj(n)).ok_or_else(|| CuError::INVALID_VALUE.into())
    }

    pub fn destroy_node(&mut self, node: Obj) -> BResult<()> {
        let (graph, i) = self.locate(node.0)?;
        let nodes = self.graphs.get_mut(&graph).expect("located");
        nodes.remove(i);
        for n in nodes {
            n.deps.retain(|d| *d != node.0);
        }
        self.edge_data.retain(|&(from, to), _| from != node.0 && to != node.0);
        if let Some(child) = self.child_graphs.remove(&node.0) {
            self.graphs.remove(&child);
        }
        for c in self.captures.values_mut() {
            c.tail.retain(|d| *d != node.0);
        }
        Ok(())
    }

    /// Takes a graph shaped as the executable one (the same kinds of node in
    /// the same order) as its new work.
    pub fn exec_update(&mut self, exec: Obj, graph: Obj) -> BResult<ExecUpdate> {
        let work = self.ordered(graph.0)?;
        let (_, old) = self.execs.get_mut(&exec.0).ok_or(CuError::INVALID_VALUE)?;
        let same = old.len() == work.len() && old.iter().zip(&work).all(|(a, b)| a.1.node_type() == b.1.node_type());
        if !same {
            return Ok(ExecUpdate { status: UPDATE_FAILURE, result: TOPOLOGY_CHANGED, ..ExecUpdate::default() });
        }
        // The executable graph keeps its own nodes' names.
        for ((_, w), (_, new)) in old.iter_mut().zip(work) {
            *w = new;
        }
        Ok(ExecUpdate::default())
    }

    /// Starts a launch of `exec`: its conditional handles take their defaults.
    pub fn launching(&mut self, exec: Obj) {
        if let Some((_, work)) = self.execs.get(&exec.0) {
            self.conditions.assign_defaults(work);
        }
    }

    pub fn exec_destroy(&mut self, exec: Obj) -> BResult<()> {
        self.disabled.retain(|&(e, _)| e != exec.0);
        self.execs.remove(&exec.0).map(drop).ok_or_else(|| CuError::INVALID_VALUE.into())
    }

    /// What an executable graph runs, for a launch in `ctx`.
    /// An executable graph's work to run, its disabled nodes left out.
    pub fn exec(&self, ctx: Obj, exec: Obj) -> BResult<Vec<Work>> {
        let enabled = |node: &u64| !self.disabled.contains(&(exec.0, *node));
        match self.execs.get(&exec.0) {
            Some((c, work)) if *c == ctx.0 => {
                Ok(work.iter().filter(|(n, _)| enabled(n)).map(|(_, w)| w.clone()).collect())
            }
            Some(_) => Err(err(CuError::INVALID_CONTEXT, "the graph was instantiated in another context")),
            None => Err(CuError::INVALID_VALUE.into()),
        }
    }

    pub fn nodes(&self, graph: Obj, roots: bool) -> BResult<Vec<Obj>> {
        let nodes = self.graphs.get(&graph.0).ok_or(CuError::INVALID_VALUE)?;
        Ok(nodes.iter().filter(|n| !roots || n.deps.is_empty()).map(|n| Obj(n.id)).collect())
    }

    pub fn node_type(&self, node: Obj) -> BResult<u32> {
        self.node_work(node).map(Work::node_type)
    }

    /// Forgets what belonged to a context that was destroyed.
    pub fn context_gone(&mut self, ctx: u64) {
        self.execs.retain(|_, (c, _)| *c != ctx);
    }
}

impl backend::Graphs for Emulated {
    fn stream_begin_capture(&self, ctx: Obj, stream: Obj, mode: u32) -> BResult<()> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        s.graphs.begin(stream, mode)
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
        let mut s = self.state();
        s.stream(ctx, stream)?;
        if data.iter().any(|&d| d != 0) {
            return Err(CallError::new(CuError::NOT_SUPPORTED, "edge data into a capture on the emulated device"));
        }
        s.graphs.begin_into(stream, graph, deps, mode)
    }

    fn stream_end_capture(&self, ctx: Obj, stream: Obj) -> BResult<Obj> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        s.graphs.end(stream)
    }

    fn stream_capture_info(&self, ctx: Obj, stream: Obj, _edges: bool) -> BResult<CaptureInfo> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        Ok(s.graphs.info(stream))
    }

    fn exchange_capture_mode(&self, mode: u32) -> BResult<u32> {
        if mode > RELAXED {
            return Err(CuError::INVALID_VALUE.into());
        }
        Ok(MODE.replace(mode))
    }

    fn stream_update_capture_deps(&self, ctx: Obj, stream: Obj, deps: &[Obj], flags: u32) -> BResult<()> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        s.graphs.update_capture_deps(stream, deps, flags)
    }

    fn graph_create(&self, flags: u32) -> BResult<Obj> {
        if flags != 0 {
            return Err(CuError::INVALID_VALUE.into());
        }
        Ok(self.state().graphs.create())
    }

    fn graph_destroy(&self, graph: Obj) -> BResult<()> {
        let destroy = {
            let mut s = self.state();
            s.graphs.destroy(graph)?;
            s.user_objects.owner_gone(graph.0)
        };
        user_objects::run(destroy);
        Ok(())
    }

    fn graph_instantiate(&self, ctx: Obj, graph: Obj, flags: u64) -> BResult<Obj> {
        let mut s = self.state();
        s.ctx(ctx)?;
        if flags != 0 {
            return Err(err(CuError::NOT_SUPPORTED, "the emulated device instantiates graphs with no flags"));
        }
        let exec = s.graphs.instantiate(ctx, graph)?;
        s.user_objects.copy_owned(graph.0, exec.0);
        Ok(exec)
    }

    fn graph_exec_destroy(&self, exec: Obj) -> BResult<()> {
        let destroy = {
            let mut s = self.state();
            s.graphs.exec_destroy(exec)?;
            s.user_objects.owner_gone(exec.0)
        };
        user_objects::run(destroy);
        Ok(())
    }

    fn graph_launch(&self, ctx: Obj, exec: Obj, stream: Obj) -> BResult<()> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        s.graphs.refuse(stream, CuError::NOT_SUPPORTED, "the emulated device captures no graph launches")?;
        let work = s.graphs.exec(ctx, exec)?;
        s.graphs.launching(exec);
        s.run_graph(ctx, work)
    }

    fn graph_upload(&self, ctx: Obj, exec: Obj, stream: Obj) -> BResult<()> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        s.graphs.exec(ctx, exec).map(drop)
    }

    fn graph_nodes(&self, graph: Obj, roots: bool) -> BResult<Vec<Obj>> {
        self.state().graphs.nodes(graph, roots)
    }

    unsafe fn graph_add_node(&self, ctx: Obj, graph: Obj, deps: &[Obj], node: &NodeWork<'_>) -> BResult<Obj> {
        let mut s = self.state();
        s.ctx(ctx)?;
        match *node {
            NodeWork::Kernel { func, .. } => drop(s.function(func)?),
            NodeWork::Event { event, .. } => drop(s.event(event)?),
            _ => {}
        }
        s.graphs.add_node(graph, deps, node)
    }

    fn graph_dependencies(&self, graph: Obj, from: &[Obj], to: &[Obj], data: &[u64], remove: bool) -> BResult<()> {
        self.state().graphs.dependencies(graph, from, to, data, remove)
    }

    fn graph_child_graph(&self, node: Obj) -> BResult<Obj> {
        self.state().graphs.child_graph(node)
    }

    fn graph_memset_node_params(&self, node: Obj) -> BResult<Memset> {
        match self.state().graphs.node_work(node)? {
            Work::Memset(m) => Ok(*m),
            _ => Err(err(CuError::INVALID_VALUE, "not a memset node")),
        }
    }

    /// A captured linear copy is one row of its bytes.
    fn user_object_create(&self, destroy: HostFn, refs: u32, flags: u32) -> BResult<Obj> {
        let mut s = self.state();
        let id = s.id();
        s.user_objects.create(id, destroy, refs, flags)?;
        Ok(Obj(id))
    }

    fn graph_memcpy_node_params(&self, node: Obj) -> BResult<Copy3D> {
        match *self.state().graphs.node_work(node)? {
            Work::Copy3D(c) => Ok(c),
            Work::Copy { dst, src, size } => {
                let end = |at| CopyEnd { place: Place::Device(at), x: 0, y: 0, z: 0, pitch: size, height: 1 };
                Ok(Copy3D { shape: COPY_3D, src: end(src), dst: end(dst), width: size, height: 1, depth: 1 })
            }
            _ => Err(err(CuError::INVALID_VALUE, "not a memcpy node")),
        }
    }

    fn graph_add_conditional_node(
        &self,
        ctx: Obj,
        graph: Obj,
        deps: &[Obj],
        cond: &Conditional,
    ) -> BResult<(Obj, Vec<Obj>)> {
        let mut s = self.state();
        s.ctx(ctx)?;
        s.graphs.add_conditional(graph, deps, cond.handle, cond.kind, cond.size)
    }

    /// The memory is placed at once, in the context, and kept until the
    /// context ends: the test device reserves graph memory for good.
    fn graph_add_mem_alloc_node(&self, ctx: Obj, graph: Obj, deps: &[Obj], alloc: &GraphAlloc) -> BResult<(Obj, u64)> {
        let mut s = self.state();
        s.ctx(ctx)?;
        let dptr = s.memory.alloc(alloc.bytes.max(1), Owner::Alloc { ctx: ctx.0 }, &[])?;
        let node = s.graphs.add_work(graph, deps, Work::MemAlloc(GraphAlloc { dptr, ..alloc.clone() }));
        if node.is_err() {
            let _ = s.memory.free(dptr);
        }
        Ok((node?, dptr))
    }

    fn graph_mem_alloc_node_params(&self, node: Obj) -> BResult<GraphAlloc> {
        match self.state().graphs.node_work(node)? {
            Work::MemAlloc(a) => Ok(a.clone()),
            _ => Err(err(CuError::INVALID_VALUE, "not an allocation node")),
        }
    }

    /// Only the high watermarks may be set, and only to 0.
    fn graph_mem_set_attribute(&self, _dev: i32, attr: i32, value: u64) -> BResult<()> {
        match (attr, value) {
            (1 | 3, 0) => Ok(()),
            _ => Err(err(CuError::INVALID_VALUE, format!("graph memory attribute {attr} set to {value}"))),
        }
    }

    fn graph_edges(&self, graph: Obj) -> BResult<Vec<(Obj, Obj, u64)>> {
        self.state().graphs.edges(graph)
    }

    /// Each node by its id and type, and each edge: no attributes.
    fn graph_debug_dot(&self, graph: Obj, _flags: u32) -> BResult<Vec<u8>> {
        let s = self.state();
        let mut dot = String::from("digraph dot {\n");
        for node in s.graphs.nodes(graph, false)? {
            let kind = s.graphs.node_type(node)?;
            dot += &format!("  node_{} [label=\"node {} (type {kind})\"];\n", node.0, node.0);
        }
        for (from, to, _) in s.graphs.edges(graph)? {
            dot += &format!("  node_{} -> node_{};\n", from.0, to.0);
        }
        dot += "}\n";
        Ok(dot.into_bytes())
    }

    fn graph_node_edges(&self, node: Obj, dependents: bool) -> BResult<Vec<(Obj, u64)>> {
        self.state().graphs.node_edges(node, dependents)
    }

    unsafe fn graph_node_set(&self, ctx: Obj, node: Obj, exec: Option<Obj>, work: &NodeWork<'_>) -> BResult<()> {
        let mut s = self.state();
        s.ctx(ctx)?;
        s.graphs.node_set(node, exec, work)
    }

    fn graph_clone(&self, graph: Obj) -> BResult<Obj> {
        let mut s = self.state();
        let clone = s.graphs.clone_graph(graph)?;
        s.user_objects.copy_owned(graph.0, clone.0);
        Ok(clone)
    }

    fn graph_node_find_in_clone(&self, node: Obj, clone: Obj) -> BResult<Obj> {
        self.state().graphs.find_in_clone(node, clone)
    }

    fn graph_destroy_node(&self, node: Obj) -> BResult<()> {
        self.state().graphs.destroy_node(node)
    }

    fn graph_exec_update(&self, ctx: Obj, exec: Obj, graph: Obj) -> BResult<ExecUpdate> {
        let mut s = self.state();
        s.ctx(ctx)?;
        s.graphs.exec_update(exec, graph)
    }
}
