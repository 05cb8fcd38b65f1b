//! Carriers move frames between a front-end and the server.
//!
//! The API layer sees only [`Carrier`]: send one frame, receive one frame,
//! know who the peer is. Local guests come in over a Unix domain socket
//! ([`unix`]), remote ones over TCP ([`tcp`]), admitted by a shared
//! [`Token`]. A local connection can then move its frames onto rings in
//! memory shared with the server ([`shm`]), behind the same trait, so the
//! client call path and the server session loop do not change. A VM's
//! carrier ([`vm`]) has its rings, and a heap for pinned memory, in memory
//! the VM shares with the host from the start. A session without shared
//! memory may open more connections, [`Lane`]s, and spread large copies
//! over them.

mod address;
mod auth;
pub mod fds;
mod lane;
pub mod shm;
mod stream;
pub mod tcp;
mod token;
pub mod unix;
pub mod vm;

use std::fmt;
use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use gpuplex_protocol::{Header, HeaderError};

pub use address::Address;
pub use auth::AuthError;
pub use lane::{block_sigpipe_on_this_thread, Lane, Pipe};
pub use stream::Flusher;
pub use token::{Keyring, Token, MIN_TOKEN_LEN, TOKEN_FILE_ENV};

/// The longest a reader that adapts spins before it sleeps: a framework's
/// calls often come a GPU step of a few milliseconds apart, and waking a
/// sleeping thread costs tens of microseconds on a virtual machine, which
/// matters little only to longer waits.
pub const SPIN_MAX: Duration = Duration::from_millis(10);

/// How long a long spin runs before each of its turns yields the CPU, so
/// that a spinning thread gives way to any other that is ready to run.
pub(crate) const POLITE_AFTER: Duration = Duration::from_micros(100);

/// How long a reader spins before it sleeps in the kernel. A fixed one
/// spins its short spin; an adaptive one about 1.5 times as long as its
/// last wait that slept, up to [`SPIN_MAX`], so that a peer whose next
/// frame follows the last by a GPU step is met spinning. Two waits in a
/// row too long to spin through send it back to the short spin, so that an
/// idle peer costs nothing noticeable; one alone does not, as a guest whose
/// GPU turn came round waited once for it and goes on with its short calls.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SpinBudget {
    short: Duration,
    now: Duration,
    adaptive: bool,
    /// Whether the last wait was too long to spin through.
    long_before: bool,
}

impl SpinBudget {
    pub(crate) const fn fixed(short: Duration) -> SpinBudget {
        SpinBudget { short, now: short, adaptive: false, long_before: false }
    }

    pub(crate) fn adapt(&mut self) {
        self.adaptive = true;
    }

    pub(crate) fn is_adaptive(&self) -> bool {
        self.adaptive
    }

    /// How long to spin now.
    pub(crate) fn now(&self) -> Duration {
        self.now
    }

    /// A wait met its frame spinning: no row of long waits goes on.
    pub(crate) fn spun(&mut self) {
        self.long_before = false;
    }

    /// A wait that slept and lasted `waited`.
    pub(crate) fn slept(&mut self, waited: Duration) {
        if !self.adaptive {
            return;
        }
        let long = waited > SPIN_MAX;
        if !long {
            self.now = (waited * 3 / 2).clamp(self.short, SPIN_MAX);
        } else if self.long_before {
            self.now = self.short;
        }
        self.long_before = long;
    }
}

/// Who is on the other end, as the operating system reports it (never as
/// the peer claims it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// A process on this machine, from `SO_PEERCRED`.
    Local { pid: u32, uid: u32, gid: u32 },
    /// A remote host: the kernel knows only its address, and the process
    /// and user behind it are that host's business.
    Remote(SocketAddr),
    /// A process in a virtual machine whose region this server serves
    /// (`region`: the region file's inode on this host), in connection slot
    /// `slot`; `pid` is what the guest says (its own kernel's number), for
    /// logs only.
    Vm { region: u64, slot: u32, pid: u32 },
}

impl Peer {
    pub fn pid(&self) -> Option<u32> {
        match self {
            Peer::Local { pid, .. } => Some(*pid),
            Peer::Remote(_) | Peer::Vm { .. } => None,
        }
    }

    pub fn uid(&self) -> Option<u32> {
        match self {
            Peer::Local { uid, .. } => Some(*uid),
            Peer::Remote(_) | Peer::Vm { .. } => None,
        }
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::Local { pid, uid, .. } => write!(f, "pid {pid} uid {uid}"),
            Peer::Remote(addr) => write!(f, "{addr}"),
            Peer::Vm { slot, pid, .. } => write!(f, "VM slot {slot} (guest pid {pid})"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("peer closed the connection")]
    Closed,
    #[error("malformed frame header")]
    Header(#[from] HeaderError),
    #[error("transport I/O failed")]
    Io(#[from] std::io::Error),
    #[error("unsupported address {0:?}: expected unix:PATH, tcp:HOST:PORT or vm:PATH")]
    Address(String),
    #[error("a lane carried something other than a chunk")]
    Chunk,
    #[error("shared memory: {0}")]
    Shared(String),
    #[error("this carrier cannot {0}")]
    Unsupported(&'static str),
    #[error("the peer sent nothing in time{}", .0.map(|d| format!(" ({} s)", d.as_secs_f32())).unwrap_or_default())]
    TimedOut(Option<std::time::Duration>),
    /// A missing, unreadable or unfit token; the text says which and why.
    #[error("{0}")]
    Token(String),
    // The reason is part of the message, not a source: it is the whole
    // story, and logs print only the top error.
    #[error("authentication failed: {0}")]
    Auth(AuthError),
}

/// One end of a connection, moving whole frames.
pub trait Carrier: Send {
    /// Proves each side to the other where the carrier needs it (TCP: the
    /// shared token); until it succeeds no frame moves. The server calls it
    /// first on the session's own thread, so a slow or silent peer holds
    /// only that thread; connecting clients have done it by the time
    /// `connect` returns.
    fn authenticate(&mut self) -> Result<(), TransportError> {
        Ok(())
    }

    /// Sends a header and its payload as one frame.
    fn send(&mut self, header: &Header, payload: &[u8]) -> Result<(), TransportError>;

    /// Sends a frame whose payload is `parts`, one after another. Carriers
    /// on shared rings copy a large part (an image) straight from where it
    /// lies; others join the parts first.
    fn send_parts(&mut self, header: &Header, parts: &[&[u8]]) -> Result<(), TransportError> {
        self.send(header, &parts.concat())
    }

    /// From now on, lets posted frames wait in the carrier and leave
    /// together, with the next frame that is not posted or at a flush;
    /// returns the flusher where this carrier does so (those whose every
    /// frame is a system call). Its owner then flushes, from any thread,
    /// within the delay it accepts for posted work.
    fn hold_posted(&mut self) -> Result<Option<Flusher>, TransportError> {
        Ok(None)
    }

    /// Sends the frames held back; returns whether there were any.
    fn flush(&mut self) -> Result<bool, TransportError> {
        Ok(false)
    }

    /// Receives one frame into `payload` (reusing its allocation). The header
    /// is validated before the payload is read, so a hostile length never
    /// causes an allocation.
    fn recv(&mut self, payload: &mut Vec<u8>) -> Result<Header, TransportError>;

    /// How long `recv` waits for the peer's next byte before it fails with
    /// [`TransportError::TimedOut`] (`None`: as long as the peer is
    /// connected). A client sets it so that a server that stopped answering
    /// is noticed; the server's heartbeat keeps a long call from tripping it.
    fn set_patience(&mut self, _patience: Option<Duration>) -> Result<(), TransportError> {
        Ok(())
    }

    /// Whether bytes of another frame have arrived already, so that `recv`
    /// would not wait for the peer. A carrier that cannot tell cheaply
    /// says no.
    fn frame_waiting(&self) -> bool {
        false
    }

    /// Polls for up to `budget` until bytes of a frame have arrived, so that
    /// the `recv` that follows need not sleep; returns whether they have. For
    /// a thread that expects a frame soon, where waking from sleep would
    /// delay the peer. A carrier that cannot poll answers at once.
    fn poll_frame(&self, _budget: Duration) -> bool {
        self.frame_waiting()
    }

    /// From now on, `recv` spins about as long as the recent waits for the
    /// peer lasted (up to [`SPIN_MAX`]) before it sleeps, instead of a fixed
    /// short spin: for a reader whose peer's latency matters, at the cost of
    /// a core while the peer is busy, given up to any other thread ready to
    /// run. Carriers whose waits already adapt ignore it.
    fn spin_adaptively(&mut self) {}

    /// The descriptor that becomes readable when the peer's bytes arrive,
    /// for a thread that sleeps on it beside other events (`None` where
    /// frames arrive otherwise, or bytes already wait: see
    /// [`Carrier::frame_waiting`]).
    fn socket_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    /// Receives the connection's first frame, before the peer is known to
    /// be a guest: a payload over `max` bytes is refused unread, and the
    /// whole frame must arrive within `timeout`.
    fn recv_opening(&mut self, payload: &mut Vec<u8>, max: usize, timeout: Duration) -> Result<Header, TransportError>;

    /// The peer's identity as the operating system reports it.
    fn peer(&self) -> Peer;

    /// The name of the key a peer proved when it authenticated (TCP: its
    /// tenant's token), if the carrier has keys.
    fn key(&self) -> Option<&str> {
        None
    }

    /// Gives up the connection's socket so that another process can serve
    /// it ([`adopt`]). Only while frames still travel on the socket.
    fn into_socket(self: Box<Self>) -> Result<(SocketKind, OwnedFd), TransportError>;

    /// Whether the peer is a process on this host that can map memory we
    /// pass it ([`Carrier::send_fd`], [`Carrier::attach_rings`]).
    fn shares_memory(&self) -> bool {
        false
    }

    /// The heap of the memory this connection shares with its peer in
    /// place (a VM's region), where pinned blocks and staging are made.
    fn heap(&self) -> Option<vm::Heap> {
        None
    }

    /// Moves frames onto the rings of a shared region (see [`shm`]); the
    /// connection itself stays open, for descriptors and to tell when the
    /// peer is gone. Only carriers between processes of one host can.
    fn attach_rings(&mut self, _rings: shm::Rings) -> Result<(), TransportError> {
        Err(TransportError::Unsupported("share memory"))
    }

    /// Passes a descriptor to the peer, beside the frames.
    fn send_fd(&mut self, _fd: BorrowedFd<'_>) -> Result<(), TransportError> {
        Err(TransportError::Unsupported("pass descriptors"))
    }

    /// Receives a descriptor the peer passed with `send_fd`.
    fn recv_fd(&mut self) -> Result<OwnedFd, TransportError> {
        Err(TransportError::Unsupported("pass descriptors"))
    }

    /// Gives the connection over to bulk chunks ([`Lane`]), once it has
    /// joined a session as one of its lanes.
    fn into_lane(self: Box<Self>) -> Result<Lane, TransportError> {
        Err(TransportError::Unsupported("carry a lane"))
    }
}

/// What kind of connection a handed-over socket is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketKind {
    Unix,
    /// Authenticated already, by the process that accepted it.
    Tcp,
    /// A slot of a VM region; the descriptor is the region's file.
    Vm {
        slot: u32,
    },
}

impl SocketKind {
    /// The kind in one word: the low byte says which, a VM's slot is above it.
    pub fn as_u32(self) -> u32 {
        match self {
            SocketKind::Unix => 1,
            SocketKind::Tcp => 2,
            SocketKind::Vm { slot } => 3 | slot << 8,
        }
    }

    pub fn from_u32(v: u32) -> Option<SocketKind> {
        match v & 0xff {
            1 if v == 1 => Some(SocketKind::Unix),
            2 if v == 2 => Some(SocketKind::Tcp),
            3 => Some(SocketKind::Vm { slot: v >> 8 }),
            _ => None,
        }
    }
}

/// Serves a connection another process accepted and handed over
/// ([`Carrier::into_socket`]). The peer is read from the socket itself, so
/// it is the same one the acceptor saw.
pub fn adopt(kind: SocketKind, socket: OwnedFd) -> Result<Box<dyn Carrier>, TransportError> {
    Ok(match kind {
        SocketKind::Unix => Box::new(unix::UnixCarrier::adopt(socket)?),
        SocketKind::Tcp => Box::new(tcp::TcpCarrier::adopt(socket)?),
        SocketKind::Vm { slot } => Box::new(vm::VmCarrier::adopt(socket, slot as usize)?),
    })
}

/// A region shared with the peer and the rings in it, ready to attach.
pub fn rings(region: Arc<shm::Region>, layout: shm::Layout, side: shm::Side) -> Result<shm::Rings, TransportError> {
    shm::Rings::new(region, layout, side)
}

/// Accepts connections for the server.
pub trait Listener: Send {
    /// The next connection. It may still need [`Carrier::authenticate`].
    fn accept(&self) -> Result<Box<dyn Carrier>, TransportError>;
    /// The address clients should use.
    fn address(&self) -> Address;
}

/// Connects to a server. A TCP server needs its token; a Unix socket
/// ignores one (so one environment can serve both).
pub fn connect(address: &Address, token: Option<&Token>) -> Result<Box<dyn Carrier>, TransportError> {
    match (address, token) {
        (Address::Unix(path), _) => Ok(Box::new(unix::UnixCarrier::connect(path)?)),
        (Address::Tcp(host_port), Some(token)) => Ok(Box::new(tcp::TcpCarrier::connect(host_port, token)?)),
        (Address::Tcp(_), None) => Err(TransportError::Token(format!(
            "a TCP server needs its token: give --token-file or set {TOKEN_FILE_ENV}"
        ))),
        (Address::Vm(path), _) => Ok(Box::new(vm::VmCarrier::connect(path)?)),
    }
}

/// Listens at an address. TCP needs a token to admit peers by; a Unix
/// socket refuses one, since it would not be checked (filesystem
/// permissions guard it instead).
pub fn listen(address: &Address, token: Option<Token>) -> Result<Box<dyn Listener>, TransportError> {
    let keys = Arc::new(Keyring::default());
    if let Some(token) = token {
        keys.replace(vec![(String::new(), token)]);
    }
    listen_with_keys(address, keys)
}

/// As [`listen`], admitting TCP peers that prove any key of `keys`, each
/// key named (by its tenant) so that the server knows who connected. The
/// keys may change while listening (a reloaded configuration).
pub fn listen_with_keys(address: &Address, keys: Arc<Keyring>) -> Result<Box<dyn Listener>, TransportError> {
    match address {
        Address::Unix(path) if keys.is_empty() => Ok(Box::new(unix::UnixListener::bind(path)?)),
        Address::Unix(_) => Err(TransportError::Token(
            "a token admits TCP peers only; a Unix socket is guarded by its file permissions".into(),
        )),
        Address::Tcp(host_port) if !keys.is_empty() => Ok(Box::new(tcp::TcpListener::bind(host_port, keys)?)),
        Address::Tcp(_) => {
            Err(TransportError::Token("listening on TCP needs a token (--token-file) to admit peers by".into()))
        }
        // The VM's memory is its credential: no token is proved there.
        Address::Vm(path) => Ok(Box::new(vm::VmListener::create(path, vm::DEFAULT_REGION)?)),
    }
}
