//! Graphs on the emulated device: a capturing stream's work is recorded as
//! nodes instead of run, and an executable graph runs its nodes in the
//! order they were captured, which respects every dependency, since the
//! device runs all work at once in call order anyway.
//!
//! The test device captures one stream at a time, with kernels, memsets and
//! copies between device memory and registered host memory. Work it cannot
//! record (events in a capture, a graph launched into one) is refused with
//! `CUDA_ERROR_NOT_SUPPORTED` and invalidates the capture; what the driver
//! forbids during a capture (a copy from pageable memory, waiting for a
//! capturing stream) fails as the driver's does. Capture modes are kept
//! but not enforced.

use std::collections::HashMap;

use gpuplex_protocol::CuError;

use super::err;
use crate::backend::{BResult, CaptureInfo, Launch, Memset, Obj};

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
}

impl Work {
    /// `CUgraphNodeType`.
    fn node_type(&self) -> u32 {
        match self {
            Work::Kernel { .. } => 0,
            Work::Copy { .. } => 1,
            Work::Memset(_) => 2,
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
}

/// `CU_STREAM_CAPTURE_STATUS_ACTIVE`, `_INVALIDATED`.
const ACTIVE: u32 = 1;
const INVALIDATED: u32 = 2;

#[derive(Default)]
pub struct Graphs {
    next: u64,
    graphs: HashMap<u64, Vec<Node>>,
    /// Executable graphs: their context and their work in order.
    execs: HashMap<u64, (u64, Vec<Work>)>,
    /// Capturing streams.
    captures: HashMap<u64, Capture>,
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

    pub fn begin(&mut self, stream: Obj) -> BResult<()> {
        if stream.0 <= 2 {
            return Err(err(CuError::STREAM_CAPTURE_UNSUPPORTED, "a default stream cannot be captured"));
        }
        if self.is_capturing(stream) {
            return Err(err(CuError::ILLEGAL_STATE, "the stream is already capturing"));
        }
        let graph = self.create().0;
        let id = self.id();
        self.captures.insert(stream.0, Capture { graph, id, tail: Vec::new(), invalid: None });
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
                self.graphs.remove(&c.graph);
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

    pub fn instantiate(&mut self, ctx: Obj, graph: Obj) -> BResult<Obj> {
        let nodes = self.graphs.get(&graph.0).ok_or(CuError::INVALID_VALUE)?;
        let work = nodes.iter().map(|n| n.work.clone()).collect();
        let id = self.id();
        self.execs.insert(id, (ctx.0, work));
        Ok(Obj(id))
    }

    pub fn exec_destroy(&mut self, exec: Obj) -> BResult<()> {
        self.execs.remove(&exec.0).map(drop).ok_or_else(|| CuError::INVALID_VALUE.into())
    }

    /// What an executable graph runs, for a launch in `ctx`.
    pub fn exec(&self, ctx: Obj, exec: Obj) -> BResult<Vec<Work>> {
        match self.execs.get(&exec.0) {
            Some((c, work)) if *c == ctx.0 => Ok(work.clone()),
            Some(_) => Err(err(CuError::INVALID_CONTEXT, "the graph was instantiated in another context")),
            None => Err(CuError::INVALID_VALUE.into()),
        }
    }

    pub fn nodes(&self, graph: Obj, roots: bool) -> BResult<Vec<Obj>> {
        let nodes = self.graphs.get(&graph.0).ok_or(CuError::INVALID_VALUE)?;
        Ok(nodes.iter().filter(|n| !roots || n.deps.is_empty()).map(|n| Obj(n.id)).collect())
    }

    pub fn node_type(&self, node: Obj) -> BResult<u32> {
        self.graphs
            .values()
            .flatten()
            .find(|n| n.id == node.0)
            .map(|n| n.work.node_type())
            .ok_or_else(|| CuError::INVALID_VALUE.into())
    }

    /// Forgets what belonged to a context that was destroyed.
    pub fn context_gone(&mut self, ctx: u64) {
        self.execs.retain(|_, (c, _)| *c != ctx);
    }
}
