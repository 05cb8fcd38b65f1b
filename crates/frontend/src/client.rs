//! The connection to the server, shared by every thread of the process.
//!
//! It is opened by the first `cuInit` (or `cuDriverGetVersion`), after a
//! handshake that brings back the server's driver version and the whole
//! device table, so device queries never travel again. A local server is
//! then asked to share memory: frames move to rings in a shared region and
//! pageable copies are staged through its slots (`GPUPLEX_CARRIER=socket`
//! keeps frames on the socket). A guest in a VM has its rings in the VM's
//! region already and claims its staging area and pinned blocks in that
//! region's heap, naming them to the server. Without shared memory, the
//! first large copy opens bulk lanes instead (`memory/lanes.rs`).
//!
//! Calls go one at a time under one lock, each carrying the calling
//! thread's current context: waited-for calls ([`call`]) read their reply,
//! posted ones ([`post`]) do not, and their errors come back on a later
//! waited-for call. On a socket, posted frames leave together: with the
//! next waited-for call, or from a flusher thread within [`FLUSH_EVERY`].
//! A lost server is sticky: every later call fails with
//! `CUDA_ERROR_DEVICE_UNAVAILABLE`, since the server freed everything the
//! process held when the connection dropped. A server that stops answering
//! counts as lost after `GPUPLEX_TIMEOUT` seconds of silence ([`patience`]);
//! while a call runs long the server sends heartbeats, so only a stopped or
//! hung server trips it. What the program's kernels printed arrives just
//! before the reply to the call that printed it and goes to the program's
//! own `stdout` or `stderr` ([`device_output`]).

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use gpuplex_protocol::{
    calls, codec, Call, CuError, DeviceOutput, ErrorDetail, Header, Hello, InPlace, LaneOffer, Opcode, SharedLayout,
    Welcome,
};
use gpuplex_transport::shm::{Layout, Region, Side};
use gpuplex_transport::vm::Heap;
use gpuplex_transport::{Address, Carrier, Flusher, Token, TransportError};

use crate::memory::lanes::{LaneError, Lanes};
use crate::{context, log, trace};

/// `CUDA_ERROR_DEVICE_UNAVAILABLE`: what a call gets once the server is gone.
pub const SERVER_GONE: CuError = CuError::DEVICE_UNAVAILABLE;

pub struct Client {
    conn: Mutex<Conn>,
    pub welcome: Welcome,
}

pub struct Conn {
    carrier: Box<dyn Carrier>,
    next_id: u64,
    buf: Vec<u8>,
    broken: bool,
    /// The staging slots, when memory is shared with the server.
    pub staging: Option<Staging>,
    /// A VM guest's heap, where its pinned blocks are made, and the chunks
    /// each block holds there (by block).
    pub heap: Option<Heap>,
    placed: HashMap<u64, (usize, usize)>,
    /// Where the server is, and its token: lanes connect there too.
    address: Address,
    token: Option<Token>,
    lanes: LaneState,
    patience: Option<Duration>,
}

/// Bulk lanes are opened by the first copy that wants them.
enum LaneState {
    Untried,
    Open(Lanes),
    Unavailable,
}

/// Slots in the shared region through which pageable copies pass.
pub struct Staging {
    region: Arc<Region>,
    offset: usize,
    pub slot_bytes: usize,
    /// Whether a copy the server has not finished may still use each slot.
    pub busy: Vec<bool>,
    /// The slot the next staged copy starts in.
    pub next: usize,
}

impl Staging {
    /// Slot `i`'s bytes.
    pub fn slot(&mut self, i: usize) -> &mut [u8] {
        // SAFETY: the layout was checked against the region's size; the
        // server touches a slot only between a copy naming it and the
        // StagingWait that frees it, and the caller holds the connection.
        unsafe {
            std::slice::from_raw_parts_mut(self.region.as_ptr().add(self.offset + i * self.slot_bytes), self.slot_bytes)
        }
    }
}

static CLIENT: OnceLock<Result<Client, CuError>> = OnceLock::new();
static INITIALIZED: AtomicBool = AtomicBool::new(false);
/// Set in a child forked after connecting: the connection is the parent's,
/// and a child must not share its stream. A flag set by `pthread_atfork`
/// instead of comparing `getpid()` on every call, which is a system call.
static FORKED: AtomicBool = AtomicBool::new(false);

extern "C" fn forked() {
    FORKED.store(true, Ordering::Relaxed);
}

/// The server address: `GPUPLEX_SERVER`, else the default local socket.
fn address() -> Result<Address, CuError> {
    match std::env::var("GPUPLEX_SERVER") {
        Ok(a) if !a.is_empty() => a.parse().map_err(|e| {
            log::error(&format!("GPUPLEX_SERVER: {e}"));
            CuError::NO_DEVICE
        }),
        _ => Ok(Address::default_local()),
    }
}

/// How long a call waits in silence before the server counts as lost:
/// `GPUPLEX_TIMEOUT` seconds (0: forever), by default [`DEFAULT_TIMEOUT`].
/// Liveness, not call duration: a server running a long call says so every
/// second.
fn patience() -> Option<Duration> {
    let seconds = match std::env::var("GPUPLEX_TIMEOUT") {
        Err(_) => return Some(DEFAULT_TIMEOUT),
        Ok(v) => v.trim().parse::<f64>().ok().filter(|s| s.is_finite() && *s >= 0.0),
    };
    match seconds {
        Some(0.0) => None,
        // Below a few heartbeats a busy server would look lost.
        Some(s) => Some(Duration::from_secs_f64(s.max(MIN_TIMEOUT.as_secs_f64()))),
        None => {
            log::warn("GPUPLEX_TIMEOUT must be a number of seconds (0: wait forever); using the default");
            Some(DEFAULT_TIMEOUT)
        }
    }
}

/// How long a silent server is waited for, unless `GPUPLEX_TIMEOUT` says.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
const MIN_TIMEOUT: Duration = Duration::from_secs(3);

/// Writes what the program's kernels printed to the program's own C
/// `stdout` or `stderr`, where it takes its place among what the program
/// printed itself, as when the driver prints it natively.
fn device_output(payload: &[u8]) {
    let Ok(out) = codec::decode::<DeviceOutput>(payload) else {
        return log::warn("undecodable device output from the server");
    };
    extern "C" {
        static mut stdout: *mut libc::FILE;
        static mut stderr: *mut libc::FILE;
    }
    // SAFETY: the C library's own streams, written with a live buffer and
    // its length; stdio locks the stream itself.
    unsafe {
        let stream = if out.stream == 2 { stderr } else { stdout };
        libc::fwrite(out.bytes.as_ptr().cast(), 1, out.bytes.len(), stream);
        if out.stream == 2 {
            libc::fflush(stream);
        }
    }
}

/// Logs why a call failed. What gpuplex cannot do (`CUDA_ERROR_NOT_SUPPORTED`)
/// is a warning the user should see, once per reason; other errors are the
/// program's own business and go to the debug log.
fn explain(opcode: Opcode, code: CuError, detail: &str) {
    let posted = posted_failure(opcode, code, detail);
    if code != CuError::NOT_SUPPORTED && posted.is_none() {
        return log::debug(&format!("{} failed: {detail}", opcode.name()));
    }
    static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(PoisonError::into_inner);
    // A bound on what a server could make the program remember.
    if seen.len() < 64 && !seen.iter().any(|s| s == detail) {
        seen.push(detail.to_owned());
        log::warn(
            &posted.unwrap_or_else(|| format!("{} failed with CUDA_ERROR_NOT_SUPPORTED: {detail}", opcode.name())),
        );
    }
}

/// A posted call's error answers the next call that waits, which the
/// program then blames: what to log about the call it really was.
fn posted_failure(opcode: Opcode, code: CuError, detail: &str) -> Option<String> {
    let (call, why) = detail.split_once(" (posted): ")?;
    let name = CuError::name_of(code.0).unwrap_or("an unknown error");
    Some(format!("{call} failed after it returned; {} returned its {name}: {why}", opcode.name()))
}

/// The connection, opened on first use.
pub fn connection() -> Result<&'static Client, CuError> {
    let client = CLIENT.get_or_init(Client::connect);
    match client {
        Ok(c) if !FORKED.load(Ordering::Relaxed) => Ok(c),
        Ok(_) => {
            log::error("CUDA used in a forked child of an initialized process; gpuplex does not support that");
            Err(CuError::NOT_INITIALIZED)
        }
        Err(e) => Err(*e),
    }
}

/// `cuInit`: connects if needed and marks the driver initialized.
pub fn init() -> Result<(), CuError> {
    connection()?;
    INITIALIZED.store(true, Ordering::Release);
    Ok(())
}

/// The connection, for calls that need `cuInit` first.
pub fn client() -> Result<&'static Client, CuError> {
    if !INITIALIZED.load(Ordering::Acquire) {
        return Err(CuError::NOT_INITIALIZED);
    }
    if crate::host_calls::in_host_function() {
        return Err(CuError::NOT_PERMITTED);
    }
    connection()
}

/// Sends one call with the calling thread's current context and waits for
/// its reply.
pub fn call<C: Call>(req: C) -> Result<C::Reply, CuError> {
    client()?.lock().call(req)
}

/// Sends one call without waiting; its error, if any, comes back later.
pub fn post<C: Call>(req: C) -> Result<(), CuError> {
    client()?.lock().post(req)
}

/// The connection, held for a sequence of calls (a staged copy).
pub fn lock() -> Result<MutexGuard<'static, Conn>, CuError> {
    Ok(client()?.lock())
}

impl Client {
    fn connect() -> Result<Client, CuError> {
        let address = address()?;
        // GPUPLEX_TOKEN_FILE: only a TCP server asks for a token.
        let token = match address {
            Address::Tcp(_) => Token::from_env().map_err(|e| {
                log::error(&e.to_string());
                CuError::NO_DEVICE
            })?,
            _ => None,
        };
        let mut carrier = gpuplex_transport::connect(&address, token.as_ref()).map_err(|e| {
            log::error(&format!("cannot reach the gpuplex server at {address}: {e}"));
            CuError::NO_DEVICE
        })?;
        let patience = patience();
        if let Err(e) = carrier.set_patience(patience) {
            log::warn(&format!("calls will wait for the server without a time limit: {e}"));
        }
        let pid = std::process::id();
        // SAFETY: registers a handler that only stores to an atomic.
        if unsafe { libc::pthread_atfork(None, None, Some(forked)) } != 0 {
            log::error("pthread_atfork failed: out of memory");
            return Err(CuError::OUT_OF_MEMORY);
        }
        let mut conn = Conn {
            carrier,
            next_id: 1,
            buf: Vec::new(),
            broken: false,
            staging: None,
            heap: None,
            placed: HashMap::new(),
            address: address.clone(),
            token,
            lanes: LaneState::Untried,
            patience,
        };
        let program = std::env::args().next().unwrap_or_default();
        let welcome: Welcome =
            conn.exchange(Opcode::Hello, 0, &codec::encode(&Hello { pid, program })).map_err(|e| {
                log::error(&format!("handshake with {address} failed: {e:?}"));
                CuError::NO_DEVICE
            })?;
        let shared = match std::env::var("GPUPLEX_CARRIER").as_deref() {
            Ok("socket") => "no (GPUPLEX_CARRIER=socket)".to_owned(),
            _ => match conn.share_memory() {
                Ok(()) => "yes".to_owned(),
                Err(why) => {
                    log::info(&format!("frames stay on the socket: {why}"));
                    format!("no ({why})")
                }
            },
        };
        if conn.broken {
            return Err(CuError::NO_DEVICE);
        }
        // Replies that wait for the GPU come after about as long as the last.
        conn.carrier.spin_adaptively();
        match conn.carrier.hold_posted() {
            Ok(Some(flusher)) => start_flusher(flusher),
            Ok(None) => {}
            Err(e) => log::warn(&format!("posted calls will leave one at a time: {e}")),
        }
        log::info(&format!(
            "connected to {address}: session {}, {} backend, {} device(s), shared memory: {shared}",
            welcome.session,
            welcome.backend,
            welcome.devices.0.len()
        ));
        Ok(Client { conn: Mutex::new(conn), welcome })
    }

    fn lock(&self) -> MutexGuard<'_, Conn> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// How long a posted frame may wait in a carrier that holds them
/// ([`Carrier::hold_posted`]) before the flusher sends it: the delay before
/// posted work reaches a GPU when the program waits for nothing after it.
const FLUSH_EVERY: Duration = Duration::from_micros(50);

/// Posted calls that do not wait in the carrier for more to join them: a
/// program usually waits for them by other means than a CUDA call (a host
/// function's own signal; a graph's results, read after its host functions
/// ran), so held they would delay it by up to [`FLUSH_EVERY`].
fn leaves_at_once(opcode: Opcode) -> bool {
    matches!(opcode, Opcode::LaunchHostFunc | Opcode::cuGraphLaunch)
}

/// Starts the thread that sends the posted frames the carrier holds. It
/// sleeps while nothing is held and never takes the connection's lock: a
/// program's thread posting a frame only appends it to what is held.
fn start_flusher(flusher: Flusher) {
    let spawned = std::thread::Builder::new().name("gpuplex-flusher".into()).spawn(move || {
        // This thread's timer slack only: its short sleeps stay short.
        // SAFETY: prctl with integer arguments; no memory is passed.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000, 0, 0, 0) };
        loop {
            flusher.wait_until_held();
            // Frames posted meanwhile leave with these.
            std::thread::sleep(FLUSH_EVERY);
            // On an error the program's next call finds the connection gone.
            if flusher.flush().is_err() {
                return;
            }
        }
    });
    if let Err(e) = spawned {
        log::warn(&format!("posted calls will wait for the next waited one: {e}"));
    }
}

impl Conn {
    /// Sends the posted frames the carrier holds.
    fn flush(&mut self) {
        if !self.broken {
            if let Err(e) = self.carrier.flush() {
                self.lose(&e.to_string());
            }
        }
    }

    /// Waits for the reply, with the calling thread's current context.
    pub fn call<C: Call>(&mut self, req: C) -> Result<C::Reply, CuError> {
        self.before(C::OPCODE);
        let reply = self.exchange(C::OPCODE, context::current(), &codec::encode(&req));
        self.waited(C::OPCODE);
        reply
    }

    /// [`Conn::call`] for a request whose last field, left empty, is to
    /// hold `bytes`, sent from where they lie (see
    /// [`codec::encode_before_bytes`]).
    pub fn call_with_bytes<C: Call>(&mut self, req: C, bytes: &[u8]) -> Result<C::Reply, CuError> {
        self.before(C::OPCODE);
        let head = codec::encode_before_bytes(&req, bytes);
        let header = self.header(C::OPCODE, context::current(), head.len() + bytes.len());
        let id = self.send_parts(&header, &[&head, bytes])?;
        let reply = self.recv(C::OPCODE, id);
        self.waited(C::OPCODE);
        reply
    }

    /// Before a call is sent: the device's work it queues or waits for
    /// sees what the program wrote to memory the device reads through a
    /// copy of it (a graph's ordinary memory, mapped pinned memory); what
    /// is kept of graphs is forgotten where the call may change them.
    fn before(&mut self, opcode: Opcode) {
        crate::graph::before_call(opcode);
        if opcode == Opcode::cuGraphLaunch {
            crate::memory::mirrors::to_device();
        }
        if opcode.reaches_device() {
            crate::memory::mapped::to_device(self, opcode == Opcode::cuGraphLaunch);
        }
    }

    /// After a waited call: the device's work it waited for may have written
    /// ordinary memory a graph copies to. (What it wrote to mapped pinned
    /// memory came before the reply.)
    fn waited(&mut self, opcode: Opcode) {
        if opcode.reaches_device() {
            crate::memory::mirrors::from_device();
        }
    }

    pub fn post<C: Call>(&mut self, req: C) -> Result<(), CuError> {
        // A graph's copies read the program's memory as it is at the launch
        // (`mapped::to_device`): the bytes posted copies owe come first.
        if C::OPCODE == Opcode::cuGraphLaunch && crate::memory::posted_reads::owes_any() {
            self.call(calls::DeliverCopies::Request {})?;
            crate::memory::posted_reads::wait_in_flight(0, usize::MAX);
        }
        self.send_call(req, true)?;
        if leaves_at_once(C::OPCODE) {
            self.flush();
        }
        Ok(())
    }

    /// Sends a call; unless it is `posted`, its reply is then due
    /// ([`Conn::await_reply`]) with the id returned.
    pub fn send_call<C: Call>(&mut self, req: C, posted: bool) -> Result<u64, CuError> {
        self.before(C::OPCODE);
        let payload = codec::encode(&req);
        let header = self.header(C::OPCODE, context::current(), payload.len());
        let header = if posted { header.posted() } else { header };
        self.send(&header, &payload)
    }

    /// The reply to call `id`, sent by [`Conn::send_call`].
    pub fn await_reply<C: Call>(&mut self, id: u64) -> Result<C::Reply, CuError> {
        let reply = self.recv(C::OPCODE, id);
        self.waited(C::OPCODE);
        reply
    }

    /// The connection's bulk lanes, opened on first use; `None` where memory
    /// is shared or the server offers none.
    pub fn lanes(&mut self) -> Option<&mut Lanes> {
        // The server reads a copy's chunks once it has the frames before.
        self.flush();
        if matches!(self.lanes, LaneState::Untried) && self.staging.is_none() && !self.broken {
            self.lanes = match self.open_lanes() {
                Ok(lanes) => LaneState::Open(lanes),
                Err(why) => {
                    log::info(&format!("large copies stay on one connection: {why}"));
                    LaneState::Unavailable
                }
            };
        }
        match &mut self.lanes {
            LaneState::Open(lanes) => Some(lanes),
            _ => None,
        }
    }

    fn open_lanes(&mut self) -> Result<Lanes, String> {
        let offer: LaneOffer = self.exchange(Opcode::OpenLanes, 0, &[]).map_err(|e| format!("server: {e:?}"))?;
        let lanes = Lanes::open(&offer, &self.address, self.token.as_ref())?;
        log::info(&format!("{} lanes of {} KiB chunks for large copies", offer.lanes, offer.chunk_bytes >> 10));
        Ok(lanes)
    }

    /// A connection of its own on which the server asks for host functions
    /// to be run (see [`crate::host_calls`]).
    pub fn open_host_calls(&mut self) -> Result<Box<dyn Carrier>, CuError> {
        let offer: gpuplex_protocol::HostCallsOffer = self.exchange(Opcode::OpenHostCalls, 0, &[])?;
        let index = gpuplex_protocol::HOST_CALLS_LANE;
        crate::memory::lanes::connect_joined(&self.address, self.token.as_ref(), offer.key, index).map_err(|why| {
            log::warn(&format!("host functions cannot reach this process: {why}"));
            CuError::NOT_SUPPORTED
        })
    }

    /// A lane failed mid-copy: the session is over.
    pub fn lose_lanes(&mut self, e: LaneError) -> CuError {
        match e {
            LaneError::Lost(why) => self.lose(&format!("a lane failed: {why}")),
            LaneError::Failed(e) => e,
        }
    }

    /// The descriptor the server passed after its last reply.
    pub fn recv_fd(&mut self) -> Result<OwnedFd, CuError> {
        self.carrier.recv_fd().map_err(|e| self.lose(&format!("expected a descriptor: {e}")))
    }

    /// Asks the server for a shared region and moves frames onto its rings.
    /// An error leaves the connection on the socket, usable.
    fn share_memory(&mut self) -> Result<(), String> {
        if let Some(heap) = self.carrier.heap() {
            return self.share_in_place(heap);
        }
        // A remote server cannot map this process's memory: asking would
        // only earn a refusal (and a warning on the program's stderr).
        if !self.carrier.shares_memory() {
            return Err("the carrier reaches no memory of this host".into());
        }
        let reply: SharedLayout = self.exchange(Opcode::SharedMemory, 0, &[]).map_err(|e| format!("server: {e:?}"))?;
        let fd = self.carrier.recv_fd().map_err(|e| {
            self.lose("the shared region never came");
            e.to_string()
        })?;
        let region = Arc::new(Region::open(fd).map_err(|e| self.lose_with(format!("cannot map the region: {e}")))?);
        if reply.slots == 0 || reply.slot_bytes == 0 {
            return Err(self.lose_with("the server offered no staging slots".into()));
        }
        let staging_bytes = reply.slot_bytes.saturating_mul(reply.slots as u64);
        let layout = Layout { ring_bytes: reply.ring_bytes as usize, staging_bytes: staging_bytes as usize };
        let rings = gpuplex_transport::rings(region.clone(), layout, Side::Client)
            .map_err(|e| self.lose_with(e.to_string()))?;
        self.carrier.attach_rings(rings).map_err(|e| self.lose_with(e.to_string()))?;
        self.carrier.set_patience(self.patience).map_err(|e| self.lose_with(e.to_string()))?;
        self.staging = Some(Staging {
            region,
            offset: layout.staging_offset(),
            slot_bytes: reply.slot_bytes as usize,
            busy: vec![false; reply.slots as usize],
            next: 0,
        });
        Ok(())
    }

    /// A VM guest's memory is shared already: it claims its staging area in
    /// the heap and tells the server where. An error leaves copies inline.
    fn share_in_place(&mut self, heap: Heap) -> Result<(), String> {
        /// As much as a local guest's server gives it.
        const STAGING_BYTES: usize = 16 << 20;
        let offset = heap.alloc(STAGING_BYTES).ok_or("the VM's shared memory has no room for staging")?;
        let request = InPlace { offset: offset as u64, bytes: STAGING_BYTES as u64 };
        let reply = self.exchange::<SharedLayout>(Opcode::ShareInPlace, 0, &codec::encode(&request));
        let layout = match reply {
            Ok(l) if l.slots > 0 && l.slot_bytes.saturating_mul(l.slots as u64) <= STAGING_BYTES as u64 => l,
            other => {
                heap.free(offset, STAGING_BYTES);
                return Err(format!("server: {:?}", other.map(|l| (l.slots, l.slot_bytes))));
            }
        };
        self.staging = Some(Staging {
            region: heap.region().clone(),
            offset,
            slot_bytes: layout.slot_bytes as usize,
            busy: vec![false; layout.slots as usize],
            next: 0,
        });
        self.heap = Some(heap);
        Ok(())
    }

    /// A VM guest's new pinned block: `len` bytes of the heap, which the
    /// server maps at `at` if it is free there (else where this process
    /// has the view returned).
    pub fn place_block(
        &mut self,
        len: usize,
        flags: u32,
        at: u64,
        mirror: bool,
    ) -> Result<(u64, u64, Region), CuError> {
        let heap = self.heap.clone().ok_or(CuError::NOT_SUPPORTED)?;
        let (offset, view) = heap.claim(len, std::ptr::null_mut()).map_err(|e| {
            log::warn(&format!("pinned memory in the VM's shared memory: {e} (the server's --vm-memory sizes it)"));
            CuError::OUT_OF_MEMORY
        })?;
        let at = if at != 0 { at } else { view.as_ptr() as u64 };
        let request = calls::HostPlace::Request { offset: offset as u64, size: len as u64, flags, at, mirror };
        match self.call(request) {
            Ok(reply) => {
                self.placed.insert(reply.block, (offset, len));
                Ok((reply.block, reply.devptr.0, view))
            }
            Err(e) => {
                heap.free(offset, len);
                log::warn(&format!("a pinned block in the VM's shared memory: {e:?}"));
                Err(CuError::OUT_OF_MEMORY)
            }
        }
    }

    /// Gives the server's block `id` back, and its chunks of the heap.
    pub fn free_block(&mut self, id: u64) -> Result<(), CuError> {
        self.call(calls::HostFree::Request { block: id })?;
        if let (Some(heap), Some((offset, len))) = (&self.heap, self.placed.remove(&id)) {
            heap.free(offset, len);
        }
        Ok(())
    }

    /// After the server agreed to share memory, failing to is fatal.
    fn lose_with(&mut self, why: String) -> String {
        self.lose(&why);
        why
    }

    fn header(&mut self, opcode: Opcode, ctx: u64, len: usize) -> Header {
        let id = self.next_id;
        self.next_id += 1;
        Header::request(opcode, id, ctx, len).from_thread(context::thread_id())
    }

    fn exchange<T: gpuplex_protocol::Wire>(&mut self, opcode: Opcode, ctx: u64, payload: &[u8]) -> Result<T, CuError> {
        let header = self.header(opcode, ctx, payload.len());
        let id = self.send(&header, payload)?;
        self.recv(opcode, id)
    }

    /// Sends one frame; returns its request id.
    fn send(&mut self, header: &Header, payload: &[u8]) -> Result<u64, CuError> {
        self.send_with(header, |carrier| carrier.send(header, payload))
    }

    /// Sends one frame whose payload is `parts`; returns its request id.
    fn send_parts(&mut self, header: &Header, parts: &[&[u8]]) -> Result<u64, CuError> {
        self.send_with(header, |carrier| carrier.send_parts(header, parts))
    }

    fn send_with(
        &mut self,
        header: &Header,
        send: impl FnOnce(&mut dyn Carrier) -> Result<(), TransportError>,
    ) -> Result<u64, CuError> {
        if self.broken {
            return Err(SERVER_GONE);
        }
        let sent = if trace::on() {
            trace::sent(header.is_posted());
            let start = Instant::now();
            let sent = send(&mut *self.carrier);
            trace::blocked(start.elapsed());
            sent
        } else {
            send(&mut *self.carrier)
        };
        sent.map_err(|e| self.lose(&e.to_string()))?;
        Ok(header.request_id.get())
    }

    /// Receives the reply to request `id`.
    fn recv<T: gpuplex_protocol::Wire>(&mut self, opcode: Opcode, id: u64) -> Result<T, CuError> {
        if self.broken {
            return Err(SERVER_GONE);
        }
        const HEARTBEAT: u16 = Opcode::Heartbeat as u16;
        const DEVICE_OUTPUT: u16 = Opcode::DeviceOutput as u16;
        const MAPPED_RUNS: u16 = Opcode::MappedRuns as u16;
        const COPIED_TO_HOST: u16 = Opcode::CopiedToHost as u16;
        let start = trace::on().then(Instant::now);
        let header = loop {
            let header = self.carrier.recv(&mut self.buf).map_err(|e| self.lose(&e.to_string()))?;
            match header.opcode.get() {
                HEARTBEAT => continue,
                DEVICE_OUTPUT => device_output(&self.buf),
                MAPPED_RUNS => crate::memory::mapped::from_device(&self.buf),
                COPIED_TO_HOST => crate::memory::posted_reads::arrived(&self.buf),
                _ => break header,
            }
        };
        if let Some(start) = start {
            trace::blocked(start.elapsed());
        }
        if header.request_id.get() != id || header.opcode.get() != opcode as u16 {
            return Err(self.lose("reply does not match the request"));
        }
        match header.status.get() {
            0 => {
                codec::decode(&self.buf).map_err(|e| self.lose(&format!("undecodable reply to {}: {e}", opcode.name())))
            }
            code => {
                if let Ok(ErrorDetail { detail }) = codec::decode(&self.buf) {
                    if !detail.is_empty() {
                        explain(opcode, CuError(code), &detail);
                    }
                }
                Err(CuError(code))
            }
        }
    }

    fn lose(&mut self, why: &str) -> CuError {
        if !self.broken {
            log::error(&format!("lost the gpuplex server ({why}); CUDA calls will now fail"));
        }
        self.broken = true;
        SERVER_GONE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A posted call's failure names that call; anything else is not one.
    #[test]
    fn a_posted_calls_failure_names_it() {
        let said =
            posted_failure(Opcode::cuStreamSynchronize, CuError::INVALID_VALUE, "Launch (posted): no such function");
        let want = "Launch failed after it returned; cuStreamSynchronize returned its CUDA_ERROR_INVALID_VALUE: no such function";
        assert_eq!(said.as_deref(), Some(want));
        assert_eq!(posted_failure(Opcode::cuStreamSynchronize, CuError::INVALID_VALUE, "no such function"), None);
    }
}
