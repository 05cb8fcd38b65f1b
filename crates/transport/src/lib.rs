//! Carriers move frames between a front-end and the server.
//!
//! The API layer sees only [`Carrier`]: send one frame, receive one frame,
//! know who the peer is. The first carrier is a Unix domain socket
//! ([`unix`]); the shared-memory ring, TCP and VM carriers of later work
//! implement the same trait (and add their own [`Address`] forms), so the
//! client call path and the server session loop never change.

mod address;
pub mod shm;
mod stream;
pub mod unix;

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

use gpuplex_protocol::{Header, HeaderError};

pub use address::Address;

/// Who is on the other end, as the kernel reports it (never as the peer
/// claims it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Peer {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("peer closed the connection")]
    Closed,
    #[error("malformed frame header")]
    Header(#[from] HeaderError),
    #[error("transport I/O failed")]
    Io(#[from] std::io::Error),
    #[error("unsupported address {0:?}: expected unix:PATH")]
    Address(String),
    #[error("shared memory: {0}")]
    Shared(String),
    #[error("this carrier cannot {0}")]
    Unsupported(&'static str),
}

/// One end of a connection, moving whole frames.
pub trait Carrier: Send {
    /// Sends a header and its payload as one frame.
    fn send(&mut self, header: &Header, payload: &[u8]) -> Result<(), TransportError>;

    /// Receives one frame into `payload` (reusing its allocation). The header
    /// is validated before the payload is read, so a hostile length never
    /// causes an allocation.
    fn recv(&mut self, payload: &mut Vec<u8>) -> Result<Header, TransportError>;

    /// The peer's identity as the operating system reports it.
    fn peer(&self) -> Peer;

    /// Whether the peer is a process on this host that can map memory we
    /// pass it ([`Carrier::send_fd`], [`Carrier::attach_rings`]).
    fn shares_memory(&self) -> bool {
        false
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
}

/// A region shared with the peer and the rings in it, ready to attach.
pub fn rings(region: Arc<shm::Region>, layout: shm::Layout, side: shm::Side) -> Result<shm::Rings, TransportError> {
    shm::Rings::new(region, layout, side)
}

/// Accepts connections for the server.
pub trait Listener: Send {
    fn accept(&self) -> Result<Box<dyn Carrier>, TransportError>;
    /// The address clients should use.
    fn address(&self) -> Address;
}

/// Connects to a server.
pub fn connect(address: &Address) -> Result<Box<dyn Carrier>, TransportError> {
    match address {
        Address::Unix(path) => Ok(Box::new(unix::UnixCarrier::connect(path)?)),
    }
}

/// Listens at an address.
pub fn listen(address: &Address) -> Result<Box<dyn Listener>, TransportError> {
    match address {
        Address::Unix(path) => Ok(Box::new(unix::UnixListener::bind(path)?)),
    }
}
