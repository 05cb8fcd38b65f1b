//! One session per guest connection.
//!
//! The supervisor has read the guest's `Hello` and placed it; the session
//! answers with `Welcome` and runs on its own thread: it reads frames,
//! dispatches each call through the generated [`dispatch`] onto its
//! [`Api`](gpuplex_protocol::Api) implementation (a trait per section of the
//! table, each in the file of what it deals in), and writes
//! the reply. Everything the guest holds lives in the session's [`Tables`];
//! when the connection ends, by exit, crash or protocol violation, `Drop`
//! unloads its libraries and destroys its contexts, which frees every
//! allocation, module, stream and event they held. What the guest holds is
//! charged to its tenant in the ledger ([`Account`]), before the backend
//! allocates and exactly after every call.

mod arrays;
mod contexts;
mod graph_memory;
mod graphs;
mod host_calls;
mod images;
mod ipc;
pub mod lanes;
mod launcher;
mod line;
mod link;
mod managed;
mod mapped;
mod memory;
mod modules;
mod nodes;
mod passthrough;
mod pools;
mod resolve;
mod scratch;
mod shared;
mod streams;
pub mod tables;
mod tensor_maps;
mod user_objects;
mod vmm;

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use gpuplex_protocol::{
    codec, dispatch, CallError, Ctx, CuError, DecodeError, DeviceInfo, DeviceOutput, ErrorDetail, Header, Hello,
    InPlace, Opcode, Seq, Welcome, LANES_VERSION, MAX_PAYLOAD, UNSOLICITED_VERSION,
};
use gpuplex_transport::shm::Side;
use gpuplex_transport::{Carrier, TransportError};
use tracing::{debug, info, warn};

use crate::backend::{Backend, Obj};
use crate::ledger::Account;
use crate::sched::{Place, Seat};
use lanes::{Hubs, LaneKey};
use line::Line;
use tables::{HandleMap, Kind, Tables};

/// What the supervisor tells a session about the guest it serves.
pub struct Guest {
    pub id: u64,
    pub tenant: String,
    /// The guest's slot in its tenant's ledger.
    pub account: Account,
    /// The guest's place in GPU scheduling.
    pub place: Place,
    /// The key the guest's bulk lanes will present.
    pub lane_key: LaneKey,
    /// The guest's `Hello`, as the supervisor read it.
    pub hello_header: Header,
    pub hello: Hello,
    /// The backend's device ordinals the guest may use; the guest numbers
    /// them from 0 in this order.
    pub devices: Vec<i32>,
    /// Whether this process catches what kernels print for this guest alone
    /// (a worker serving one guest; see `worker::output`).
    pub device_output: bool,
}

pub struct Session {
    backend: Arc<dyn Backend>,
    tables: Tables,
    /// The backend ordinal of each device the guest sees.
    devices: Vec<i32>,
    /// Primary context state per device the guest sees.
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
    id: u64,
    account: Account,
    /// The gate of its work on the GPUs, and the meter of its GPU time.
    seat: Arc<Seat>,
    /// The guest's protocol version: whether it takes frames it did not ask for.
    unsolicited: bool,
    device_output: bool,
    lane_key: LaneKey,
    shared: shared::Shared,
    /// A remote guest's pinned memory that its kernels reach.
    mapped: mapped::Mapped,
    /// Pinned memory for short device-to-host reads.
    scratch: scratch::Scratch,
    /// Bulk lanes, once the client opened them.
    lanes: Option<lanes::Lanes>,
    /// Shared memory whose descriptor follows the reply being sent.
    fd_after_reply: Option<OwnedFd>,
    /// `__managed__` variables mirrored in the guest.
    managed: managed::ManagedVars,
    /// The first error of a posted call, reported to the next waited-for one.
    deferred: Option<(Opcode, CallError)>,
    /// Capture modes of client threads other than the default (global),
    /// and the one the session's thread has in the driver now.
    capture_modes: HandleMap<u64, u32>,
    driver_capture_mode: u32,
    /// Whether the session ever made a graph: from then on a freed host
    /// block leaves its addresses guarded, since a graph may still name them.
    made_graphs: bool,
    /// Streams capturing now, as `(context, stream)`; the seat keeps its
    /// hands off the session's streams while there are any.
    capturing: Vec<(Obj, Obj)>,
    /// Streams capturing into a graph of the program's, with its handle.
    capturing_into: Vec<(Obj, u64)>,
    /// The guest's host functions' connection, once opened, and every host
    /// function handed to the driver (which may call them until the
    /// session's contexts are gone: dropped after them).
    host_calls: Option<Arc<host_calls::HostCalls>>,
    /// Keyed by the guest's numbers, hence hashed as any key a client picks.
    host_fns: std::collections::HashMap<u64, Arc<host_calls::HostCall>>,
    /// User objects by the session's handles, kept as host functions are.
    user_objects: std::collections::HashMap<u64, Arc<user_objects::UserObject>>,
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
    fn new(backend: Arc<dyn Backend>, guest: &Guest) -> Session {
        let mut tables = Tables::new();
        let primaries = (0..guest.devices.len() as i32)
            .map(|device| Primary {
                handle: tables.add_ctx(tables::CtxEntry { obj: None, device, primary: true }),
                refcount: 0,
                flags: 0,
            })
            .collect();
        let seat = Arc::new(Seat::start(backend.clone(), guest.place.clone(), guest.account.clone()));
        Session {
            launcher: launcher::Launcher::new(backend.clone(), seat.clone()),
            backend,
            tables,
            devices: guest.devices.clone(),
            primaries,
            current: Ctx(0),
            thread: 0,
            posting: false,
            per_thread_streams: HandleMap::default(),
            param_bytes: HandleMap::default(),
            images: images::Images::default(),
            id: guest.id,
            account: guest.account.clone(),
            seat,
            unsolicited: guest.hello_header.version.get() >= UNSOLICITED_VERSION,
            device_output: guest.device_output,
            lane_key: guest.lane_key,
            shared: shared::Shared::new(),
            mapped: mapped::Mapped::default(),
            scratch: scratch::Scratch::default(),
            lanes: None,
            fd_after_reply: None,
            managed: managed::ManagedVars::default(),
            deferred: None,
            capture_modes: HandleMap::default(),
            driver_capture_mode: 0,
            made_graphs: false,
            capturing: Vec::new(),
            capturing_into: Vec::new(),
            host_calls: None,
            host_fns: std::collections::HashMap::new(),
            user_objects: std::collections::HashMap::new(),
        }
    }

    /// Serves a guest the supervisor placed here until its connection ends.
    /// Never panics on guest input.
    pub fn serve_guest(mut carrier: Box<dyn Carrier>, backend: Arc<dyn Backend>, guest: Guest, hubs: &Hubs) {
        let peer = carrier.peer();
        // A guest's next call often follows its last by a GPU step's time
        // (a graph's, a synchronize's): met asleep, it would wait for the wake.
        carrier.spin_adaptively();
        let span = tracing::info_span!("session", id = guest.id, tenant = %guest.tenant, %peer);
        let _enter = span.enter();
        let mut session = Session::new(backend.clone(), &guest);
        let mut line = Line::new(carrier, session.unsolicited);
        let welcome = Welcome {
            session: guest.id,
            backend: backend.kind().to_owned(),
            driver_version: backend.driver_version(),
            devices: Seq(session.visible_devices()),
            primary_contexts: Seq(session.primaries.iter().map(|p| Ctx(p.handle)).collect()),
        };
        let mut buf = Vec::new();
        let end = match send_reply(line.carrier(), &guest.hello_header, &codec::encode(&welcome)) {
            Ok(()) => {
                // The pid is the client's own claim: the kernel's is in the span where it has one.
                info!(program = %guest.hello.program, client_pid = guest.hello.pid, "session opened");
                session.serve(&mut line, &mut buf, hubs)
            }
            Err(e) => Err(e.into()),
        };
        match end {
            Ok(()) => info!("session closed by the client"),
            Err(e) => warn!("session ended: {}", crate::chain(&e)),
        }
        line.stop();
        drop(session);
        hubs.close(guest.id);
    }

    /// The devices the guest sees, each with its tenant's memory limit as
    /// its total, so that frameworks size themselves to what they may use.
    fn visible_devices(&self) -> Vec<DeviceInfo> {
        let limit = self.account.tenant_usage().0;
        let all = self.backend.devices();
        self.devices
            .iter()
            .map(|&d| {
                let mut info = all[d as usize].clone();
                if limit != 0 {
                    info.total_mem = info.total_mem.min(limit);
                }
                info
            })
            .collect()
    }

    fn serve(&mut self, line: &mut Line, buf: &mut Vec<u8>, hubs: &Hubs) -> Result<(), SessionError> {
        loop {
            let header = match line.carrier().recv(buf) {
                Ok(h) => h,
                Err(TransportError::Closed) => return Ok(()),
                Err(e) => return Err(e.into()),
            };
            // Whether more frames are here already, for a posted launch:
            // one that is not the last of a run goes to the launcher.
            let waiting = header.is_posted() && line.carrier().frame_waiting();
            // Until the session next needs the connection the heartbeat may
            // speak for it: a posted call that runs long holds up the next
            // call the guest waits for as much as a waited one.
            line.lend();
            let opcode = match header.opcode() {
                Ok(op) => op,
                Err(e) => {
                    reply_error(line.carrier(), &header, CallError::new(CuError::INVALID_VALUE, e.to_string()))?;
                    return Err(SessionError::Protocol(e.to_string()));
                }
            };
            self.account.count_call();
            // Whatever is not another posted launch comes after the launches before it.
            if !(header.is_posted() && opcode == Opcode::Launch) {
                self.drain_launches();
            }
            match opcode {
                Opcode::Hello
                | Opcode::JoinLane
                | Opcode::Heartbeat
                | Opcode::DeviceOutput
                | Opcode::MappedRuns
                | Opcode::HostCall => {
                    return Err(SessionError::Protocol(format!("{} inside a session", opcode.name())))
                }
                Opcode::ServerInfo | Opcode::Status => {
                    let why = "the server's status is answered on a connection of its own (gpuplex status)";
                    reply_error(line.carrier(), &header, CallError::new(CuError::NOT_SUPPORTED, why))?;
                }
                Opcode::SharedMemory => self.share_memory(line.carrier(), &header)?,
                Opcode::ShareInPlace => self.share_in_place(line.carrier(), &header, buf)?,
                Opcode::OpenLanes => self.open_lanes(line.carrier(), &header, hubs)?,
                Opcode::OpenHostCalls => self.open_host_calls(line.carrier(), &header, hubs)?,
                call if header.is_posted() => {
                    if let Err(e) = self.run_call(call, &header, buf)? {
                        // A launch read before this one may have failed first.
                        self.drain_launches();
                        debug!(call = call.name(), code = e.code.0, detail = %e.detail, "posted call failed");
                        self.deferred.get_or_insert((call, e));
                    }
                    self.launcher.posted(waiting, &mut self.deferred);
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
                                reply_error(
                                    line.carrier(),
                                    &header,
                                    CallError::new(CuError::INVALID_VALUE, e.to_string()),
                                )?;
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
                    let carrier = line.carrier();
                    self.send_device_output(carrier, &header)?;
                    if call.reaches_device() {
                        // What the device wrote to the guest's pinned memory (see [`mapped`]).
                        let frame =
                            |op: Opcode, len| Header { opcode: (op as u16).into(), ..Header::reply(&header, 0, len) };
                        self.mapped.send_changes(carrier, frame)?;
                    }
                    match outcome {
                        Ok(reply) => {
                            send_reply(carrier, &header, &reply)?;
                            if let Some(fd) = self.fd_after_reply.take() {
                                carrier.send_fd(fd.as_fd())?;
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
        if !self.capture_modes.is_empty() || self.driver_capture_mode != 0 {
            self.apply_capture_mode();
        }
        // Managed variables: the program's writes before the device's work,
        // the device's writes before the reply to a call waited for.
        let managed = call.reaches_device() && self.managed.any();
        if managed {
            self.managed.write_variables(&*self.backend);
        }
        let outcome = dispatch(self, call, payload);
        if managed && !self.posting {
            self.managed.read_variables(&*self.backend);
        }
        // Before the reply, so that what the client sees next is counted:
        // what the tables hold is exactly what the session holds, whatever
        // the call charged beforehand or freed on the way.
        self.account.settle(self.tables.charged_bytes());
        self.account.set_contexts(self.live_contexts());
        outcome
    }

    /// Sends what the guest's kernels printed during the call being
    /// answered, ahead of its reply (see `worker::output`).
    fn send_device_output(&mut self, carrier: &mut dyn Carrier, to: &Header) -> Result<(), TransportError> {
        if !self.device_output {
            return Ok(());
        }
        for (stream, bytes) in crate::worker::output::take() {
            if !self.unsolicited {
                debug!(bytes = bytes.len(), "device output dropped: the client predates it");
                continue;
            }
            for piece in bytes.chunks(MAX_PAYLOAD - 64) {
                let payload = codec::encode(&DeviceOutput { stream, bytes: piece.to_vec() });
                let header =
                    Header { opcode: (Opcode::DeviceOutput as u16).into(), ..Header::reply(to, 0, payload.len()) };
                carrier.send(&header, &payload)?;
            }
        }
        Ok(())
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

    /// Answers `ShareInPlace`: a VM guest's staging area, in its region's
    /// heap. A carrier with no heap gets NOT_SUPPORTED.
    fn share_in_place(
        &mut self,
        carrier: &mut dyn Carrier,
        header: &Header,
        payload: &[u8],
    ) -> Result<(), SessionError> {
        let request: InPlace = codec::decode(payload)?;
        let Some(heap) = carrier.heap() else {
            let why = "this carrier shares no memory in place";
            return Ok(reply_error(carrier, header, CallError::new(CuError::NOT_SUPPORTED, why))?);
        };
        match self.shared.connect_in_place(heap, &request) {
            Ok(layout) => send_reply(carrier, header, &codec::encode(&layout))?,
            Err(e) => reply_error(carrier, header, e)?,
        }
        Ok(())
    }

    /// Answers `OpenLanes` with the key and shape of the session's lanes.
    fn open_lanes(&mut self, carrier: &mut dyn Carrier, header: &Header, hubs: &Hubs) -> Result<(), SessionError> {
        if self.lanes.is_some() {
            let again = CallError::new(CuError::INVALID_VALUE, "lanes are open already");
            return Ok(reply_error(carrier, header, again)?);
        }
        if header.version.get() < LANES_VERSION {
            let why = format!("lanes need protocol {LANES_VERSION}; this client speaks {}", header.version.get());
            return Ok(reply_error(carrier, header, CallError::new(CuError::NOT_SUPPORTED, why))?);
        }
        let peer = carrier.peer();
        match lanes::Lanes::open(self.id, peer, self.lane_key, hubs) {
            Ok((lanes, offer)) => {
                self.lanes = Some(lanes);
                debug!(lanes = offer.lanes, chunk = offer.chunk_bytes, "lanes offered");
                Ok(send_reply(carrier, header, &codec::encode(&offer))?)
            }
            Err(e) => Ok(reply_error(carrier, header, e)?),
        }
    }

    /// Answers `OpenHostCalls` with the key its connection joins under.
    fn open_host_calls(&mut self, carrier: &mut dyn Carrier, header: &Header, hubs: &Hubs) -> Result<(), SessionError> {
        if self.host_calls.is_some() {
            let again = CallError::new(CuError::INVALID_VALUE, "host calls are open already");
            return Ok(reply_error(carrier, header, again)?);
        }
        let calls = Arc::new(host_calls::HostCalls::new(self.id, carrier.peer(), self.mapped.clone()));
        hubs.host_calls().insert(self.lane_key, calls.clone());
        self.host_calls = Some(calls);
        Ok(send_reply(carrier, header, &codec::encode(&gpuplex_protocol::HostCallsOffer { key: self.lane_key }))?)
    }

    /// Forgets what died with a backend context.
    fn context_gone(&mut self, ctx: Obj) {
        self.capture_gone(|(c, _)| c == ctx);
        self.seat.context_gone(ctx);
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
        // A host function waiting on the guest returns now: nothing below
        // waits for one that is never answered.
        if let Some(calls) = &self.host_calls {
            calls.close();
        }
        // Nothing reads the mapped blocks once they go below.
        self.mapped.clear();
        // No launch may still run, and no stream be timed, while its context goes.
        self.launcher.stop();
        self.seat.stop();
        self.end_captures();
        self.close_ipc();
        self.shared.teardown(&*self.backend);
        self.scratch.teardown(&*self.backend);
        if let Some(lanes) = &mut self.lanes {
            lanes.teardown(&*self.backend);
        }
        self.release_graphs();
        self.release_pools();
        self.release_virtual_memory();
        for (_, lib) in self.tables.all(Kind::Library) {
            if let Err(e) = self.backend.library_unload(lib.obj) {
                warn!("teardown: library unload failed: {e}");
            }
        }
        let contexts: Vec<Obj> = self.tables.contexts.values().filter_map(|c| c.obj).collect();
        let mut all_gone = true;
        for ctx in contexts {
            if let Err(e) = self.backend.ctx_destroy(ctx) {
                warn!("teardown: context destroy failed: {e}");
                all_gone = false;
            }
        }
        if !all_gone {
            // A graph left in the driver may still call its host functions.
            std::mem::forget(std::mem::take(&mut self.host_fns));
        }
        // Graphs of other contexts, or none, may hold user objects past the
        // session: the driver may call their destructors at any time.
        std::mem::forget(std::mem::take(&mut self.user_objects));
    }
}

/// `CUDA_ERROR_INVALID_VALUE` with its detail: what most checks of a guest's arguments answer.
fn invalid(detail: impl Into<String>) -> CallError {
    CallError::new(CuError::INVALID_VALUE, detail)
}

/// A successful reply.
pub fn send_reply(carrier: &mut dyn Carrier, to: &Header, payload: &[u8]) -> Result<(), TransportError> {
    carrier.send(&Header::reply(to, 0, payload.len()), payload)
}

/// A failed reply with its detail.
pub fn reply_error(carrier: &mut dyn Carrier, to: &Header, e: CallError) -> Result<(), TransportError> {
    let payload = codec::encode(&ErrorDetail { detail: e.detail });
    carrier.send(&Header::reply(to, e.code.0, payload.len()), &payload)
}
