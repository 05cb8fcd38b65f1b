//! Host functions that stay in the guest: a graph's host nodes, and host
//! functions launched into a capturing stream. The guest registers each
//! function under a number; the driver here calls [`run_host_call`] with
//! that number, which asks the guest to run it over a connection of its own
//! and waits for the answer, as the driver waits for a host function.
//!
//! The connection is opened by the guest (`OpenHostCalls`, then a lane
//! connection joining as [`HOST_CALLS_LANE`]) before its first host
//! function reaches the server, from the session's own peer. Should it
//! fail, the guest is gone: every call after returns at once. The session
//! shuts it down when it ends, so that a guest that never answers holds
//! up nothing past its own session.

use std::ffi::c_void;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use gpuplex_protocol::{codec, CallError, CuError, ErrorDetail, Header, HostCallRun, LaneJoin, MappedRuns, Opcode};
use gpuplex_transport::{Carrier, Peer, TransportError};
use tracing::{debug, warn};

use super::lanes::{same_origin, Hubs};
use super::mapped::Mapped;
use crate::backend::HostFn;

/// A session's connection for host calls.
pub struct HostCalls {
    pub(super) session: u64,
    peer: Peer,
    channel: Mutex<Option<Box<dyn Carrier>>>,
    /// A second descriptor of the connection's socket, to shut it down from
    /// outside a call that waits on it.
    socket: Mutex<Option<OwnedFd>>,
    connected: AtomicBool,
    next: AtomicU64,
    /// The session's mapped blocks: what the device wrote to them goes to
    /// the guest before a host function, what the function wrote comes back
    /// with its answer.
    mapped: Mapped,
}

impl HostCalls {
    pub fn new(session: u64, peer: Peer, mapped: Mapped) -> HostCalls {
        HostCalls {
            session,
            peer,
            channel: Mutex::new(None),
            socket: Mutex::new(None),
            connected: AtomicBool::new(false),
            next: AtomicU64::new(1),
            mapped,
        }
    }

    /// Whether host functions can reach the guest. Asked without waiting
    /// for a host function under way.
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    /// Ends the connection, and any host call waiting on it: when the
    /// session ends, a guest that never answers holds nothing up.
    pub fn close(&self) {
        self.connected.store(false, Ordering::Release);
        if let Some(socket) = self.socket.lock().unwrap_or_else(PoisonError::into_inner).take() {
            // SAFETY: a descriptor this owns; shutting it down wakes the
            // other descriptor's waiting call, which then fails.
            unsafe { libc::shutdown(socket.as_raw_fd(), libc::SHUT_RDWR) };
        }
    }

    /// Has the guest run its function `id`, and waits until it has. Calls
    /// from several driver threads take turns on the connection.
    fn run(&self, id: u64) {
        self.ask(id, true)
    }

    /// Has the guest run its function `id` without waiting for it: for a
    /// destructor, which the driver runs on a thread of its own that must
    /// not block.
    pub(super) fn post(&self, id: u64) {
        self.ask(id, false)
    }

    fn ask(&self, id: u64, wait: bool) {
        let mut channel = self.channel.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(carrier) = channel.as_mut() else { return };
        let payload = codec::encode(&HostCallRun { id });
        let request = self.next.fetch_add(1, Ordering::Relaxed);
        let header = Header::request(Opcode::HostCall, request, 0, payload.len());
        if !wait {
            if let Err(e) = carrier.send(&header.posted(), &payload) {
                debug!(session = self.session, "host calls ended: {}", crate::chain(&e));
                *channel = None;
                self.connected.store(false, Ordering::Release);
            }
            return;
        }
        let mut reply = Vec::new();
        // What the device wrote to the guest's pinned memory goes ahead of the function.
        let mapped = |op, len| Header::request(op, request, 0, len);
        let answered = match self
            .mapped
            .send_changes(&mut **carrier, mapped)
            .and_then(|()| carrier.send(&header, &payload))
            .and_then(|()| self.recv_answer(&mut **carrier, &mut reply))
        {
            Ok(h) if h.request_id.get() == request && h.status.get() == 0 => true,
            Ok(_) => {
                warn!(session = self.session, "the guest answered a host call wrongly; no more host calls");
                false
            }
            Err(e) => {
                debug!(session = self.session, "host calls ended: {}", crate::chain(&e));
                false
            }
        };
        if !answered {
            *channel = None;
            self.connected.store(false, Ordering::Release);
        }
    }

    /// The guest's answer, after what its function wrote to mapped memory.
    fn recv_answer(&self, carrier: &mut dyn Carrier, buf: &mut Vec<u8>) -> Result<Header, TransportError> {
        loop {
            let h = carrier.recv(buf)?;
            if h.opcode.get() != Opcode::MappedRuns as u16 {
                return Ok(h);
            }
            let written = codec::decode::<MappedRuns>(buf)
                .map_err(|e| e.to_string())
                .and_then(|m| self.mapped.write(m.runs.0).map_err(|e| e.detail));
            if let Err(why) = written {
                warn!(session = self.session, "mapped memory from a host function refused: {why}");
            }
        }
    }
}

/// What the driver calls a guest's host function with.
pub struct HostCall {
    calls: Arc<HostCalls>,
    id: u64,
}

impl HostCall {
    /// The function as the driver takes it. The call must stay where it is
    /// (shared, on the heap) and outlive every graph and stream that may run it.
    pub fn host_fn(&self) -> HostFn {
        HostFn { run: run_host_call, data: (self as *const HostCall).cast_mut().cast() }
    }

    pub fn new(calls: Arc<HostCalls>, id: u64) -> Arc<HostCall> {
        Arc::new(HostCall { calls, id })
    }
}

/// The host function the driver runs for a guest's.
///
/// # Safety
/// `data` is a [`HostCall`] that outlives the call.
unsafe extern "C" fn run_host_call(data: *mut c_void) {
    // SAFETY: per this function's contract.
    let call = unsafe { &*data.cast::<HostCall>() };
    call.calls.run(call.id);
}

/// Serves a connection whose `JoinLane` named the host-call lane: hands it
/// to its session's host calls, answering the join.
pub fn join(mut carrier: Box<dyn Carrier>, header: &Header, join: &LaneJoin, hubs: &Hubs) {
    let peer = carrier.peer();
    let calls = hubs.host_calls().get(&join.key).cloned();
    let refuse = |carrier: &mut dyn Carrier, why: &str| {
        warn!(%peer, "refused a host-call connection: {why}");
        let payload = codec::encode(&ErrorDetail { detail: why.into() });
        let _ = carrier.send(&Header::reply(header, CuError::INVALID_VALUE.0, payload.len()), &payload);
    };
    let refusal = match &calls {
        None => Some("no session has that key"),
        Some(c) if !same_origin(c.peer, peer) => Some("host calls must come from the session's own peer"),
        Some(_) => None,
    };
    if let Some(why) = refusal {
        return refuse(&mut *carrier, why);
    }
    let calls = calls.expect("refused above when missing");
    // A second descriptor of the socket, to shut it down with the session.
    let carrier = carrier.into_socket().and_then(|(kind, socket)| {
        let spare = socket.try_clone().map_err(TransportError::Io)?;
        Ok((gpuplex_transport::adopt(kind, socket)?, spare))
    });
    let (mut carrier, spare) = match carrier {
        Ok(c) => c,
        Err(e) => return warn!(%peer, "cannot keep a host-call connection: {}", crate::chain(&e)),
    };
    // Held across the answer, and the connection marked before it: once
    // the guest has the answer, the session sees the connection, whichever
    // of its calls comes next (its thread reads the mark without this lock).
    // A second join waits for the lock and is refused.
    let mut channel = calls.channel.lock().unwrap_or_else(PoisonError::into_inner);
    if channel.is_some() {
        return refuse(&mut *carrier, "the session's host calls are connected already");
    }
    *calls.socket.lock().unwrap_or_else(PoisonError::into_inner) = Some(spare);
    calls.connected.store(true, Ordering::Release);
    match carrier.send(&Header::reply(header, 0, 0), &[]) {
        Ok(()) => *channel = Some(carrier),
        Err(_) => calls.connected.store(false, Ordering::Release),
    }
}

/// The error for a host function before the guest opened its host calls.
pub fn not_connected() -> CallError {
    CallError::new(CuError::INVALID_VALUE, "host calls are not connected (OpenHostCalls, then join)")
}
