//! One session per client connection.
//!
//! A session runs on its own thread: it answers the handshake, then reads
//! frames, dispatches each call through the generated [`dispatch`] onto its
//! [`Api`](gpuplex_protocol::Api) implementation (in `api.rs`), and writes
//! the reply. Everything the client holds lives in the session's [`Tables`];
//! when the connection ends, by exit, crash or protocol violation, `Drop`
//! unloads its libraries and destroys its contexts, which frees every
//! allocation, module, stream and event they held. Nothing here is shared
//! with other sessions except the backend, so one client's malformed frames
//! or CUDA errors never reach another.

mod api;
mod images;
pub mod lanes;
mod launcher;
pub mod metrics;
mod scratch;
mod shared;
pub mod tables;

use std::sync::Arc;

use gpuplex_protocol::{
    codec, dispatch, CallError, Ctx, CuError, DecodeError, ErrorDetail, Header, Hello, LaneJoin, Opcode, Welcome,
    LANES_VERSION,
};
use gpuplex_transport::shm::Side;
use gpuplex_transport::{Carrier, TransportError};
use tracing::{debug, info, warn};

use crate::backend::{Backend, Obj};
use crate::registry::Registry;
use metrics::SessionMetrics;
use tables::{HandleMap, Kind, Tables};

pub struct Session {
    backend: Arc<dyn Backend>,
    tables: Tables,
    /// Primary context state per device.
    primaries: Vec<Primary>,
    /// The caller's current context for the call being run (from the header).
    current: Ctx,
    /// The calling client thread (from the header).
    thread: u64,
    /// Whether the call being run was posted (from the header): its
    /// launch may go to the launcher.
    posting: bool,
    launcher: launcher::Launcher,
    /// Each client thread's per-thread default stream in each context,
    /// as a stream handle: `(thread, context) -> stream`.
    per_thread_streams: HandleMap<(u64, u64), u64>,
    /// Bytes of packed parameters each function takes, by client handle
    /// (never reused, so never stale). The driver does not check a short
    /// buffer, so the session does.
    param_bytes: HandleMap<u64, usize>,
    images: images::Images,
    metrics: Arc<SessionMetrics>,
    shared: shared::Shared,
    /// Pinned memory for short device-to-host reads.
    scratch: scratch::Scratch,
    /// Bulk lanes, once the client opened them.
    lanes: Option<lanes::Lanes>,
    /// A host block whose descriptor follows the reply being sent.
    fd_after_reply: Option<u64>,
    /// The first error of a posted call, reported to the next waited-for one.
    deferred: Option<(Opcode, CallError)>,
}

/// A device's primary context as this session sees it. The handle stays the
/// same across release and reset, as the real driver's does.
#[derive(Debug, Clone, Copy)]
struct Primary {
    handle: u64,
    refcount: u32,
    flags: u32,
}

/// Why a session ended other than by the client closing it.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("transport failed")]
    Transport(#[from] TransportError),
    #[error("protocol violation: {0}")]
    Protocol(String),
    #[error("undecodable payload")]
    Decode(#[from] DecodeError),
}

impl Session {
    fn new(backend: Arc<dyn Backend>, metrics: Arc<SessionMetrics>) -> Session {
        let mut tables = Tables::new();
        let primaries = (0..backend.devices().len() as i32)
            .map(|device| Primary {
                handle: tables.add_ctx(tables::CtxEntry { obj: None, device, primary: true }),
                refcount: 0,
                flags: 0,
            })
            .collect();
        Session {
            launcher: launcher::Launcher::new(backend.clone()),
            backend,
            tables,
            primaries,
            current: Ctx(0),
            thread: 0,
            posting: false,
            per_thread_streams: HandleMap::default(),
            param_bytes: HandleMap::default(),
            images: images::Images::default(),
            metrics,
            shared: shared::Shared::new(),
            scratch: scratch::Scratch::default(),
            lanes: None,
            fd_after_reply: None,
            deferred: None,
        }
    }

    /// Serves one connection until it ends. Never panics on peer input.
    /// The peer proves itself first (on this thread, so a slow one stalls
    /// no one else); until it has, none of its bytes are read as a frame.
    pub fn run(mut carrier: Box<dyn Carrier>, backend: Arc<dyn Backend>, registry: Arc<Registry>) {
        let peer = carrier.peer();
        if let Err(e) = carrier.authenticate() {
            warn!(%peer, "refused a connection: {e}");
            return;
        }
        let mut buf = Vec::new();
        let (header, hello) = match handshake(carrier.as_mut(), &mut buf, &backend, &registry) {
            Ok(Opening::Session(header, hello)) => (header, hello),
            Ok(Opening::Lane(header, join)) => return lanes::run_lane(carrier, &header, join, &registry.lanes),
            Ok(Opening::Answered) => return,
            Err(e) => {
                warn!(%peer, "handshake failed: {e}");
                return;
            }
        };
        let metrics = registry.open(peer, hello.program.clone());
        let id = metrics.id;
        let span = tracing::info_span!("session", id, %peer);
        let _enter = span.enter();
        let mut session = Session::new(backend.clone(), metrics);
        let welcome = Welcome {
            session: id,
            backend: backend.kind().to_owned(),
            driver_version: backend.driver_version(),
            devices: gpuplex_protocol::Seq(backend.devices().to_vec()),
            primary_contexts: gpuplex_protocol::Seq(session.primaries.iter().map(|p| Ctx(p.handle)).collect()),
        };
        let end = match send_reply(carrier.as_mut(), &header, &codec::encode(&welcome)) {
            Ok(()) => {
                // The pid is the client's own claim: the kernel's is in the span where it has one.
                info!(program = %hello.program, client_pid = hello.pid, "session opened");
                session.serve(carrier.as_mut(), &mut buf, &registry)
            }
            Err(e) => Err(e.into()),
        };
        match end {
            Ok(()) => info!("session closed by the client"),
            Err(e) => warn!("session ended: {e}"),
        }
        drop(session);
        registry.close(id);
    }

    fn serve(&mut self, carrier: &mut dyn Carrier, buf: &mut Vec<u8>, registry: &Registry) -> Result<(), SessionError> {
        loop {
            let header = match carrier.recv(buf) {
                Ok(h) => h,
                Err(TransportError::Closed) => return Ok(()),
                Err(e) => return Err(e.into()),
            };
            let opcode = match header.opcode() {
                Ok(op) => op,
                Err(e) => {
                    reply_error(carrier, &header, CallError::new(CuError::INVALID_VALUE, e.to_string()))?;
                    return Err(SessionError::Protocol(e.to_string()));
                }
            };
            self.metrics.count_call();
            // Whatever is not another posted launch comes after the launches before it.
            if !(header.is_posted() && opcode == Opcode::Launch) {
                self.drain_launches();
            }
            match opcode {
                Opcode::Hello | Opcode::JoinLane => {
                    return Err(SessionError::Protocol(format!("{} inside a session", opcode.name())))
                }
                Opcode::ServerInfo => {
                    let summary = registry.summary(&*self.backend);
                    send_reply(carrier, &header, &codec::encode(&summary))?;
                }
                Opcode::SharedMemory => self.share_memory(carrier, &header)?,
                Opcode::OpenLanes => self.open_lanes(carrier, &header, registry)?,
                call if header.is_posted() => {
                    if let Err(e) = self.run_call(call, &header, buf)? {
                        // A launch read before this one may have failed first.
                        self.drain_launches();
                        debug!(call = call.name(), code = e.code.0, detail = %e.detail, "posted call failed");
                        self.deferred.get_or_insert((call, e));
                    }
                    self.launcher.posted(carrier.frame_waiting(), &mut self.deferred);
                }
                call => {
                    // A call after a failed posted one answers with that
                    // error instead of running, except a lane copy: its
                    // chunks must cross, or the lanes fall out of step.
                    let lane_copy = matches!(call, Opcode::MemcpyHtoDLanes | Opcode::MemcpyDtoHLanes);
                    let ran = if self.deferred.is_none() || lane_copy {
                        match self.run_call(call, &header, buf) {
                            Ok(outcome) => Some(outcome),
                            Err(e) => {
                                reply_error(carrier, &header, CallError::new(CuError::INVALID_VALUE, e.to_string()))?;
                                return Err(e.into());
                            }
                        }
                    } else {
                        None
                    };
                    let outcome = match self.deferred.take() {
                        Some((posted, e)) => {
                            Err(CallError::new(e.code, format!("{} (posted): {}", posted.name(), e.detail)))
                        }
                        None => ran.expect("run when nothing was deferred"),
                    };
                    match outcome {
                        Ok(reply) => {
                            send_reply(carrier, &header, &reply)?;
                            if let Some(block) = self.fd_after_reply.take() {
                                let block = self.shared.block(block).expect("allocated by this call");
                                carrier.send_fd(block.region.fd())?;
                            }
                        }
                        Err(e) => {
                            debug!(call = call.name(), code = e.code.0, detail = %e.detail, "call failed");
                            reply_error(carrier, &header, e)?;
                        }
                    }
                }
            }
            if let Some(why) = self.lanes.as_ref().and_then(|l| l.lost()) {
                return Err(SessionError::Protocol(why.to_owned()));
            }
        }
    }

    /// Runs one call. The outer error is a payload that does not decode,
    /// which ends the session.
    fn run_call(
        &mut self,
        call: Opcode,
        header: &Header,
        payload: &[u8],
    ) -> Result<Result<Vec<u8>, CallError>, DecodeError> {
        self.current = Ctx(header.context.get());
        self.thread = header.thread.get();
        self.posting = header.is_posted();
        self.fd_after_reply = None;
        let outcome = dispatch(self, call, payload);
        // Before the reply, so that what the client sees next is counted.
        self.metrics.set_usage(self.live_contexts(), self.tables.allocated_bytes());
        outcome
    }

    /// Waits until every launch read so far has run (see [`launcher`]).
    fn drain_launches(&mut self) {
        self.launcher.drain(&mut self.deferred);
    }

    /// Answers `SharedMemory`: the layout on the socket, then the region's
    /// descriptor, then frames move to the rings. A carrier that cannot
    /// pass descriptors gets NOT_SUPPORTED and stays as it is.
    fn share_memory(&mut self, carrier: &mut dyn Carrier, header: &Header) -> Result<(), SessionError> {
        let unsupported = CallError::new(CuError::NOT_SUPPORTED, "this carrier cannot share memory");
        if !carrier.shares_memory() {
            return Ok(reply_error(carrier, header, unsupported)?);
        }
        let (region, layout, reply) = match self.shared.connect() {
            Ok(shared) => shared,
            Err(e) => return Ok(reply_error(carrier, header, e)?),
        };
        send_reply(carrier, header, &codec::encode(&reply))?;
        carrier.send_fd(region.fd())?;
        carrier.attach_rings(gpuplex_transport::rings(region, layout, Side::Server)?)?;
        debug!("frames now travel through shared memory");
        Ok(())
    }

    /// Answers `OpenLanes` with the key and shape of the session's lanes.
    fn open_lanes(
        &mut self,
        carrier: &mut dyn Carrier,
        header: &Header,
        registry: &Registry,
    ) -> Result<(), SessionError> {
        if self.lanes.is_some() {
            let again = CallError::new(CuError::INVALID_VALUE, "lanes are open already");
            return Ok(reply_error(carrier, header, again)?);
        }
        if header.version.get() < LANES_VERSION {
            let why = format!("lanes need protocol {LANES_VERSION}; this client speaks {}", header.version.get());
            return Ok(reply_error(carrier, header, CallError::new(CuError::NOT_SUPPORTED, why))?);
        }
        match lanes::Lanes::open(self.metrics.id, carrier.peer(), &registry.lanes) {
            Ok((lanes, offer)) => {
                self.lanes = Some(lanes);
                debug!(lanes = offer.lanes, chunk = offer.chunk_bytes, "lanes offered");
                Ok(send_reply(carrier, header, &codec::encode(&offer))?)
            }
            Err(e) => Ok(reply_error(carrier, header, e)?),
        }
    }

    /// Forgets what died with a backend context.
    fn context_gone(&mut self, ctx: Obj) {
        self.shared.context_gone(ctx);
        self.scratch.context_gone(ctx);
        if let Some(lanes) = &mut self.lanes {
            lanes.context_gone(ctx);
        }
    }

    fn live_contexts(&self) -> u32 {
        self.tables.contexts.values().filter(|c| c.obj.is_some()).count() as u32
    }
}

impl Drop for Session {
    /// Frees everything the client held: shared host memory's
    /// registrations, libraries (they span contexts), then every live context, which takes its memory, modules,
    /// streams and events with it.
    fn drop(&mut self) {
        // No launch may still run while its context goes.
        self.launcher.stop();
        self.shared.teardown(&*self.backend);
        self.scratch.teardown(&*self.backend);
        if let Some(lanes) = &mut self.lanes {
            lanes.teardown(&*self.backend);
        }
        for (_, lib) in self.tables.all(Kind::Library) {
            if let Err(e) = self.backend.library_unload(lib.obj) {
                warn!("teardown: library unload failed: {e}");
            }
        }
        let contexts: Vec<Obj> = self.tables.contexts.values().filter_map(|c| c.obj).collect();
        for ctx in contexts {
            if let Err(e) = self.backend.ctx_destroy(ctx) {
                warn!("teardown: context destroy failed: {e}");
            }
        }
    }
}

/// What a connection's first frame opened.
enum Opening {
    /// `Hello`: a session (the caller answers it once it is registered).
    Session(Header, Hello),
    /// `JoinLane`: one more lane of a session.
    Lane(Header, LaneJoin),
    /// `ServerInfo`, a one-shot query (`gpuplex info`), answered already.
    Answered,
}

/// Reads the first frame.
fn handshake(
    carrier: &mut dyn Carrier,
    buf: &mut Vec<u8>,
    backend: &Arc<dyn Backend>,
    registry: &Registry,
) -> Result<Opening, SessionError> {
    let header = carrier.recv(buf)?;
    match header.opcode() {
        Ok(Opcode::Hello) => Ok(Opening::Session(header, codec::decode(buf)?)),
        Ok(Opcode::JoinLane) => Ok(Opening::Lane(header, codec::decode(buf)?)),
        Ok(Opcode::ServerInfo) => {
            send_reply(carrier, &header, &codec::encode(&registry.summary(&**backend)))?;
            Ok(Opening::Answered)
        }
        other => {
            let what = format!("expected Hello, got {other:?}");
            reply_error(carrier, &header, CallError::new(CuError::INVALID_VALUE, what.clone()))?;
            Err(SessionError::Protocol(what))
        }
    }
}

fn send_reply(carrier: &mut dyn Carrier, to: &Header, payload: &[u8]) -> Result<(), TransportError> {
    carrier.send(&Header::reply(to, 0, payload.len()), payload)
}

fn reply_error(carrier: &mut dyn Carrier, to: &Header, e: CallError) -> Result<(), TransportError> {
    let payload = codec::encode(&ErrorDetail { detail: e.detail });
    carrier.send(&Header::reply(to, e.code.0, payload.len()), &payload)
}
