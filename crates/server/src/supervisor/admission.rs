//! Admitting a connection: its peer proves itself, says what it wants in
//! its first frame, and is placed, answered or refused.
//!
//! Until a peer is known to be a guest of some tenant it gets little: its
//! first frame must arrive within [`OPENING_TIMEOUT`] and carry at most
//! [`MAX_OPENING`] bytes, and each origin (a local uid, a remote address)
//! may have at most [`MAX_PENDING_PER_ORIGIN`] connections in admission at
//! once, so silent or slow peers of one user cannot lock others out.

use std::os::fd::AsFd;
use std::time::Duration;

use gpuplex_protocol::{codec, CallError, CuError, Header, Hello, LaneJoin, Opcode, Seq, HEADER_SIZE};
use gpuplex_transport::Carrier;
use tracing::{info, warn};
use zerocopy::IntoBytes;

use super::pool::{self, Pool};
use super::registry::{Route, SessionEntry};
use super::tenancy::Plan;
use super::Supervisor;
use crate::ledger::Account;
use crate::sched::Sharing;
use crate::worker::link::{self, Kind};

/// The most bytes a connection's first frame may carry (a `Hello` names a
/// program; nothing else opening a connection is larger).
pub const MAX_OPENING: usize = 64 << 10;
/// How long a peer has for its first frame, after proving itself.
pub const OPENING_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections in admission at once, from one origin and in all.
pub const MAX_PENDING_PER_ORIGIN: usize = 16;
pub const MAX_PENDING: usize = 256;

/// A guest's opening, as the supervisor read it.
pub struct Opening {
    pub header: Header,
    pub hello: Hello,
    /// What its tenant may use.
    pub plan: Plan,
}

/// Serves one accepted connection to its end (for a guest, the end of its
/// session).
pub fn admit(supervisor: &Supervisor, mut carrier: Box<dyn Carrier>) {
    let peer = carrier.peer();
    let Some(pending) = supervisor.enter_admission(&peer) else {
        return refused(&peer, "too many from the same origin are still opening");
    };
    if let Err(e) = carrier.authenticate() {
        return refused(&peer, &e.to_string());
    }
    let mut buf = Vec::new();
    let header = match carrier.recv_opening(&mut buf, MAX_OPENING, OPENING_TIMEOUT) {
        Ok(h) => h,
        Err(e) => return refused(&peer, &crate::chain(&e)),
    };
    drop(pending);
    match header.opcode() {
        Ok(Opcode::Hello) => match codec::decode::<Hello>(&buf) {
            Ok(hello) => open_session(supervisor, carrier, header, hello),
            Err(e) => refuse(carrier.as_mut(), &header, CuError::INVALID_VALUE, &format!("undecodable Hello: {e}")),
        },
        Ok(Opcode::JoinLane) => match codec::decode::<LaneJoin>(&buf) {
            Ok(join) => route_lane(supervisor, carrier, header, join),
            Err(e) => refuse(carrier.as_mut(), &header, CuError::INVALID_VALUE, &format!("undecodable JoinLane: {e}")),
        },
        Ok(Opcode::ServerInfo) => {
            let summary = super::status::summary(supervisor, &viewer(supervisor, carrier.as_ref()));
            let _ = crate::session::send_reply(carrier.as_mut(), &header, &codec::encode(&summary));
        }
        Ok(Opcode::Status) => {
            let status = super::status::status(supervisor, &viewer(supervisor, carrier.as_ref()));
            let _ = crate::session::send_reply(carrier.as_mut(), &header, &codec::encode(&status));
        }
        other => {
            let what = format!("expected Hello, got {other:?}");
            refuse(carrier.as_mut(), &header, CuError::INVALID_VALUE, &what);
        }
    }
}

/// Answers a refused opening with why, and logs it.
fn refuse(carrier: &mut dyn Carrier, header: &Header, code: CuError, why: &str) {
    refused(&carrier.peer(), why);
    let _ = crate::session::reply_error(carrier, header, CallError::new(code, why));
}

/// Refusals logged per second at most; a flood of bad connections is
/// summed up instead of filling the log.
const REFUSALS_LOGGED: u32 = 10;

/// Logs a refused connection, at most [`REFUSALS_LOGGED`] a second.
fn refused(peer: &gpuplex_transport::Peer, why: &str) {
    use std::sync::{Mutex, PoisonError};
    static WINDOW: Mutex<Option<(std::time::Instant, u32)>> = Mutex::new(None);
    let mut window = WINDOW.lock().unwrap_or_else(PoisonError::into_inner);
    let now = std::time::Instant::now();
    let (start, count) = window.get_or_insert((now, 0));
    if now.duration_since(*start) >= Duration::from_secs(1) {
        if *count > REFUSALS_LOGGED {
            warn!("{} more connections refused in the last second", *count - REFUSALS_LOGGED);
        }
        (*start, *count) = (now, 0);
    }
    *count += 1;
    if *count <= REFUSALS_LOGGED {
        warn!(%peer, "refused a connection: {why}");
    }
}

/// Who is asking for the status: the whole server for its owner, else the
/// asker's own tenant (or nothing, for a peer of no tenant).
fn viewer(supervisor: &Supervisor, carrier: &dyn Carrier) -> super::status::Viewer {
    let peer = carrier.peer();
    if supervisor.is_owner(&peer) {
        return super::status::Viewer::Owner;
    }
    match supervisor.tenancy().plan_for(&peer, carrier.key()) {
        Ok(plan) => super::status::Viewer::Tenant(plan.tenant),
        Err(_) => super::status::Viewer::Nobody,
    }
}

/// The most bytes of a program's name kept for status and logs.
const MAX_PROGRAM: usize = 256;

fn open_session(supervisor: &Supervisor, mut carrier: Box<dyn Carrier>, header: Header, mut hello: Hello) {
    // The guest names its program: shown, never trusted, kept short.
    if hello.program.len() > MAX_PROGRAM {
        let cut = (0..=MAX_PROGRAM).rev().find(|&i| hello.program.is_char_boundary(i)).unwrap_or(0);
        hello.program.truncate(cut);
    }
    let peer = carrier.peer();
    let plan = match supervisor.tenancy().plan_for(&peer, carrier.key()) {
        Ok(plan) => plan,
        Err(why) => return refuse(carrier.as_mut(), &header, CuError::NOT_PERMITTED, &why),
    };
    let session = match supervisor.registry.open(&plan, peer, hello.program.clone()) {
        Ok(s) => s,
        Err(e) => return refuse(carrier.as_mut(), &header, CuError::OUT_OF_MEMORY, &e.to_string()),
    };
    // However placing ends, a panic included, the session is closed.
    let _open = super::registry::Closing(&supervisor.registry, session.id);
    let opening = Opening { header, hello, plan };
    supervisor.place(carrier, &session, opening);
}

/// Hands a guest to a worker and watches the worker until it exits.
pub fn run_in_worker(
    supervisor: &Supervisor,
    pool: &Pool,
    mut carrier: Box<dyn Carrier>,
    session: &SessionEntry,
    opening: Opening,
    account: &Account,
) {
    let placed = match opening.plan.sharing {
        Sharing::Isolated => pool.take().map(|w| Placed {
            worker: w,
            devices: opening.plan.devices.clone(),
            gpus: (0..supervisor.backend.devices.len()).collect(),
            mps_gpu: None,
        }),
        Sharing::Spatial => spatial_worker(supervisor, pool, &opening.plan),
    };
    let Placed { mut worker, devices, gpus, mps_gpu } = match placed {
        Ok(p) => p,
        Err(why) => return refuse(carrier.as_mut(), &opening.header, CuError::DEVICE_UNAVAILABLE, &why),
    };
    let pid = worker.child.id();
    let (kind, socket) = match carrier.into_socket() {
        Ok(s) => s,
        Err(e) => {
            warn!(session = session.id, "cannot hand the guest over: {}", crate::chain(&e));
            return pool::reap(worker);
        }
    };
    let serve = link::Serve {
        session: session.id,
        tenant: session.tenant.clone(),
        slot: session.slot as u32,
        seat: session.seat as u32,
        row: session.row as u32,
        socket: kind.as_u32(),
        lane_key: session.lane_key,
        hello_header: header_bytes(&opening.header),
        hello: codec::encode(&opening.hello),
        devices: Seq(devices.iter().map(|&d| d as u32).collect()),
        gpus: Seq(gpus.iter().map(|&g| g as u32).collect()),
        spatial: mps_gpu.is_some(),
    };
    let board = supervisor.registry.board().fd();
    if let Err(e) = pool::serve(&worker, &serve, &socket, account.ledger().fd(), board) {
        warn!(session = session.id, "cannot hand the guest to worker {pid}: {}", crate::chain(&e));
        return pool::reap(worker);
    }
    // The worker holds the guest's socket now: when it exits, the guest
    // must see the connection close.
    drop(socket);
    supervisor.registry.placed(session.id, Route::Worker(worker.link.clone()), pid, mps_gpu);
    info!(session = session.id, tenant = %session.tenant, peer = %session.peer, worker = pid, "guest placed");
    while let Ok(Some(message)) = worker.link.recv() {
        warn!(worker = pid, kind = ?message.kind, "unexpected message from a serving worker");
    }
    let status = worker.child.wait();
    let clean = status.as_ref().is_ok_and(|s| s.success());
    let how = match status {
        Ok(s) if s.success() => "its session ended".to_owned(),
        Ok(s) => match std::os::unix::process::ExitStatusExt::signal(&s) {
            Some(sig) => format!("it was killed by signal {sig}"),
            None => format!("it exited with status {}", s.code().unwrap_or(-1)),
        },
        Err(e) => format!("cannot wait for it: {e}"),
    };
    let held = account.held();
    if clean {
        info!(session = session.id, worker = pid, "worker done: {how}");
    } else {
        warn!(session = session.id, worker = pid, held, "worker ended its guest's session: {how}");
    }
}

/// A worker for a guest, and how its devices are numbered.
struct Placed {
    worker: pool::Worker,
    /// The worker's device ordinals the guest may use.
    devices: Vec<i32>,
    /// The server's ordinal of each of the worker's devices.
    gpus: Vec<usize>,
    /// For a spatial session, the GPU whose MPS server the worker uses.
    mps_gpu: Option<usize>,
}

/// A new worker that is an MPS client on the tenant's GPU with the fewest
/// spatial sessions: it sees that one GPU, as its device 0.
fn spatial_worker(supervisor: &Supervisor, pool: &Pool, plan: &Plan) -> Result<Placed, String> {
    let gpu = supervisor.registry.least_spatial(&plan.devices).ok_or("the tenant has no GPU")?;
    let env = supervisor.mps()?.client_env(gpu, plan)?;
    let worker = pool.start_one(&env).map_err(|why| format!("no MPS client could start on GPU {gpu}: {why}"))?;
    Ok(Placed { worker, devices: vec![0], gpus: vec![gpu], mps_gpu: Some(gpu) })
}

/// Sends a lane connection to the worker of the session it names.
fn route_lane(supervisor: &Supervisor, mut carrier: Box<dyn Carrier>, header: Header, join: LaneJoin) {
    let Some(session) = supervisor.registry.by_lane_key(&join.key) else {
        return refuse(carrier.as_mut(), &header, CuError::INVALID_VALUE, "no session has that lane key");
    };
    match session.route {
        Route::Worker(link) => {
            let (kind, socket) = match carrier.into_socket() {
                Ok(s) => s,
                Err(e) => return warn!(session = session.id, "cannot hand a lane over: {}", crate::chain(&e)),
            };
            let lane = link::Lane { socket: kind.as_u32(), header: header_bytes(&header), join };
            if let Err(e) = link.send(Kind::Lane, &lane, &[socket.as_fd()]) {
                warn!(session = session.id, "cannot hand a lane to its worker: {}", crate::chain(&e));
            }
        }
        Route::InProcess => match &supervisor.placer {
            super::Placer::InProcess(host) => host.lane(carrier, &header, join),
            super::Placer::Workers(_) => unreachable!("in-process sessions only under in-process placement"),
        },
        Route::Pending => refuse(carrier.as_mut(), &header, CuError::INVALID_VALUE, "the session is not placed yet"),
    }
}

fn header_bytes(header: &Header) -> [u8; HEADER_SIZE] {
    let mut bytes = [0u8; HEADER_SIZE];
    bytes.copy_from_slice(header.as_bytes());
    bytes
}
