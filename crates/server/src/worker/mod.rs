//! A worker: the process that owns one guest's CUDA contexts.
//!
//! The GPU isolates processes, not contexts: every context of one process
//! shares one GPU address space, and a fault fatal to the process (or a
//! driver that gives up on it) takes all of them. So each guest runs in a
//! worker of its own, which the supervisor started ahead of time with the
//! driver already initialized (`gpuplex worker`, [`run`]). The guest's
//! socket and its tenant's ledger arrive over the [`link`]; from then on
//! the guest talks to the worker directly, and the worker exits when the
//! guest's session ends. Whatever the guest's kernels print is caught here
//! and sent to the guest ([`output`]).
//!
//! [`Host`] is what a worker does with its guest: run its session on a
//! backend, and the session's bulk lanes beside it. The supervisor's
//! in-process placement (for tests) uses the same `Host` for many guests
//! at once, on threads, without the isolation.

pub mod link;
pub mod output;

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

use gpuplex_protocol::{codec, Header, Hello, LaneJoin, Seq};
use gpuplex_transport::{Carrier, SocketKind};
use tracing::{error, info, warn};

use crate::backend::Backend;
use crate::ledger::{Account, Ledger};
use crate::sched::{board, Board, Place, Sharing};
use crate::session::lanes::{run_lane, Hubs};
use crate::session::{Guest, Session};
use crate::BackendKind;
use link::{Kind, Link};

/// The descriptor a worker finds its link on.
pub const LINK_FD: i32 = 3;

/// Runs guests' sessions on one backend.
pub struct Host {
    backend: Arc<dyn Backend>,
    hubs: Hubs,
}

impl Host {
    pub fn new(backend: Arc<dyn Backend>) -> Host {
        Host { backend, hubs: Hubs::default() }
    }

    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Serves a guest until its connection ends.
    pub fn serve(&self, carrier: Box<dyn Carrier>, guest: Guest) {
        Session::serve_guest(carrier, self.backend.clone(), guest, &self.hubs);
    }

    /// Serves one of a session's bulk lanes until it ends.
    pub fn lane(&self, carrier: Box<dyn Carrier>, header: &Header, join: LaneJoin) {
        run_lane(carrier, header, join, &self.hubs);
    }
}

/// `gpuplex worker`: opens the backend, reports ready on the link
/// ([`LINK_FD`]), serves the one guest it is given and returns the
/// process's exit code.
pub fn run(kind: BackendKind) -> i32 {
    // SAFETY: the supervisor started this process with the link on LINK_FD
    // and nothing else owns that descriptor.
    let link = Arc::new(Link::from_fd(unsafe { OwnedFd::from_raw_fd(LINK_FD) }));
    keep_to_itself();
    if let Err(e) = output::capture() {
        warn!("device output stays in the server's log: {e}");
    }
    let backend = match crate::open_backend(kind) {
        Ok(backend) => backend,
        Err(e) => {
            // The supervisor reports why; only if it cannot hear it, say it here.
            let why = crate::chain(&*e);
            if link.send(Kind::Failed, &link::Failed { why: why.clone() }, &[]).is_err() {
                error!("cannot open the {} backend: {why}", kind.name());
            }
            return 1;
        }
    };
    let ready = link::Ready {
        pid: std::process::id(),
        backend: backend.kind().to_owned(),
        driver_version: backend.driver_version(),
        devices: Seq(backend.devices().to_vec()),
    };
    if link.send(Kind::Ready, &ready, &[]).is_err() {
        return 0;
    }
    let message = match link.recv() {
        Ok(Some(m)) if m.kind == Kind::Serve => m,
        // The supervisor stopped before it needed this worker.
        Ok(None) => return 0,
        Ok(Some(m)) => {
            error!("expected a guest, got {:?}", m.kind);
            return 1;
        }
        Err(e) => {
            error!("the link to the supervisor failed: {}", crate::chain(&e));
            return 1;
        }
    };
    let (carrier, guest) = match guest(message) {
        Ok(placed) => placed,
        Err(why) => {
            error!("cannot take the guest: {why}");
            return 1;
        }
    };
    let host = Arc::new(Host::new(backend));
    let lanes = host.clone();
    let listening = std::thread::Builder::new().name("gpuplex-link".into()).spawn(move || follow(&link, &lanes));
    if let Err(e) = listening {
        error!("cannot follow the link: {}", crate::chain(&e));
        return 1;
    }
    host.serve(carrier, guest);
    0
}

/// The guest a `Serve` message hands over.
fn guest(mut message: link::Message) -> Result<(Box<dyn Carrier>, Guest), String> {
    let serve: link::Serve = message.decode().map_err(|e| format!("undecodable: {e}"))?;
    if message.fds.len() != 3 {
        return Err(format!("{} descriptors, want the socket, the ledger and the board", message.fds.len()));
    }
    let board = message.fds.pop().expect("three descriptors");
    let ledger = message.fds.pop().expect("three descriptors");
    let socket = message.fds.pop().expect("three descriptors");
    let carrier = adopt(serve.socket, socket)?;
    let ledger = Ledger::open(ledger).map_err(|e| format!("ledger: {e}"))?;
    let board = Board::open(board).map_err(|e| format!("board: {e}"))?;
    let slot = serve.slot as usize;
    if slot >= crate::ledger::SLOTS {
        return Err(format!("ledger slot {slot}"));
    }
    let (seat, row) = (serve.seat as usize, serve.row as usize);
    if seat >= board::SEATS || row >= board::TENANTS {
        return Err(format!("board seat {seat}, row {row}"));
    }
    let header = Header::parse(&serve.hello_header).map_err(|e| format!("hello header: {e}"))?;
    let hello: Hello = codec::decode(&serve.hello).map_err(|e| format!("hello: {e}"))?;
    let sharing = if serve.spatial { Sharing::Spatial } else { Sharing::Isolated };
    let gpus = serve.gpus.0.iter().map(|&g| g as usize).collect();
    let guest = Guest {
        id: serve.session,
        tenant: serve.tenant,
        account: Account::new(Arc::new(ledger), slot),
        place: Place { board: Arc::new(board), seat, row, gpus, sharing },
        lane_key: serve.lane_key,
        hello_header: header,
        hello,
        devices: serve.devices.0.iter().map(|&d| d as i32).collect(),
        device_output: true,
    };
    Ok((carrier, guest))
}

/// A socket the supervisor passed, as a carrier of the kind it names.
fn adopt(kind: u32, socket: OwnedFd) -> Result<Box<dyn Carrier>, String> {
    let kind = SocketKind::from_u32(kind).ok_or("unknown socket kind")?;
    gpuplex_transport::adopt(kind, socket).map_err(|e| e.to_string())
}

/// Takes the session's lanes from the link as they come, each on a thread
/// of its own; ends the process if the supervisor goes away, since no one
/// would account for the guest any more.
fn follow(link: &Link, host: &Arc<Host>) {
    loop {
        let mut message = match link.recv() {
            Ok(Some(m)) => m,
            Ok(None) => {
                info!("the supervisor is gone; ending the session");
                std::process::exit(2);
            }
            Err(e) => {
                error!("the link to the supervisor failed ({}); ending the session", crate::chain(&e));
                std::process::exit(2);
            }
        };
        if message.kind != Kind::Lane || message.fds.len() != 1 {
            warn!(kind = ?message.kind, "unexpected message from the supervisor");
            continue;
        }
        let lane: link::Lane = match message.decode() {
            Ok(lane) => lane,
            Err(e) => {
                warn!("undecodable lane from the supervisor: {}", crate::chain(&e));
                continue;
            }
        };
        let socket = message.fds.pop().expect("one descriptor");
        let carrier = adopt(lane.socket, socket);
        let header = Header::parse(&lane.header).ok();
        let (Ok(carrier), Some(header)) = (carrier, header) else {
            warn!("a lane the supervisor passed could not be taken");
            continue;
        };
        let host = host.clone();
        let spawned = std::thread::Builder::new()
            .name("gpuplex-lane".into())
            .spawn(move || host.lane(carrier, &header, lane.join));
        if let Err(e) = spawned {
            warn!("cannot start a lane thread: {}", crate::chain(&e));
        }
    }
}

/// Keeps other processes of the same user, guests included, out of this
/// one: no debugger may attach and no core dump holds its memory, and no
/// program it might start gains privileges.
fn keep_to_itself() {
    // SAFETY: prctl with these options only changes this process's flags.
    unsafe {
        if libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 {
            warn!("cannot make the worker undumpable: {}", std::io::Error::last_os_error());
        }
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            warn!("cannot set no_new_privs: {}", std::io::Error::last_os_error());
        }
    }
}
