//! The channel between the supervisor and one worker: a `SOCK_SEQPACKET`
//! socket pair, so that every message arrives whole, with the descriptors
//! it hands over (`SCM_RIGHTS`) attached to it.
//!
//! ```text
//! supervisor                                   worker
//!   |                                           | opens the backend
//!   |  <----------------- Ready {devices} ----- |   (or Failed {why}, then exits)
//!   |  Serve {session, tenant, hello} + [guest socket, ledger]  --->  | serves the guest
//!   |  Lane {join} + [lane socket]  ----------> | (TCP guests: more connections of its session)
//!   |  <------------------------------ (EOF) -- | the session ended: the worker exits
//! ```
//!
//! Both ends are the same build, but the supervisor reads what a worker
//! sends as it would a guest's frames: a worker runs guests' work, so its
//! messages are decoded and checked, never trusted for more than its own
//! session.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use gpuplex_protocol::{codec, wire_struct, DecodeError, DeviceInfo, LaneJoin, Seq, Wire};
use gpuplex_transport::fds;

/// The largest message either side sends or accepts.
const MAX_MESSAGE: usize = 1 << 20;
/// The most descriptors one message carries.
const MAX_FDS: usize = 4;

wire_struct! {
    /// A worker that opened its backend and waits for a guest.
    pub struct Ready {
        pub pid: u32,
        pub backend: String,
        pub driver_version: i32,
        pub devices: Seq<DeviceInfo>,
    }
}

wire_struct! {
    /// A worker that could not open its backend; it exits after sending this.
    pub struct Failed {
        pub why: String,
    }
}

wire_struct! {
    /// A guest for the worker to serve, with its socket, its tenant's
    /// ledger and the scheduling board attached.
    pub struct Serve {
        pub session: u64,
        pub tenant: String,
        /// The session's slot in the ledger.
        pub slot: u32,
        /// The session's seat on the board, and its tenant's row there.
        pub seat: u32,
        pub row: u32,
        /// [`gpuplex_transport::SocketKind`] of the guest's socket.
        pub socket: u32,
        /// The key the session's lanes will present (see `session::lanes`).
        pub lane_key: [u8; 32],
        /// The guest's `Hello` frame as the supervisor read it.
        pub hello_header: [u8; 40],
        pub hello: Vec<u8>,
        /// The backend's device ordinals the tenant may use, in the order
        /// the guest will number them.
        pub devices: Seq<u32>,
        /// The server's ordinal of each device the worker's backend
        /// numbers, by the backend's ordinal.
        pub gpus: Seq<u32>,
        /// Whether the worker is a client of an MPS server (a spatial
        /// tenant's session).
        pub spatial: bool,
    }
}

wire_struct! {
    /// One more connection of the worker's session (a bulk lane), with its
    /// socket attached.
    pub struct Lane {
        pub socket: u32,
        pub header: [u8; 40],
        pub join: LaneJoin,
    }
}

/// Message kinds, the first byte of each message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Ready = 1,
    Failed = 2,
    Serve = 3,
    Lane = 4,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        [Kind::Ready, Kind::Failed, Kind::Serve, Kind::Lane].into_iter().find(|k| *k as u8 == b)
    }
}

/// One message as received: its kind, its body, the descriptors with it.
pub struct Message {
    pub kind: Kind,
    body: Vec<u8>,
    pub fds: Vec<OwnedFd>,
}

impl Message {
    /// The body, decoded as `T`.
    pub fn decode<T: Wire>(&self) -> Result<T, DecodeError> {
        codec::decode(&self.body)
    }
}

/// One end of the channel.
pub struct Link {
    socket: OwnedFd,
}

impl Link {
    /// A connected pair: the supervisor keeps the first end and the worker
    /// inherits the second (created close-on-exec; the spawner moves it).
    pub fn pair() -> io::Result<(Link, OwnedFd)> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: `fds` has room for the two descriptors socketpair writes.
        let rc =
            unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: socketpair returned two new descriptors that we now own.
        let (a, b) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok((Link { socket: a }, b))
    }

    /// The worker's end, inherited from the supervisor.
    pub fn from_fd(socket: OwnedFd) -> Link {
        Link { socket }
    }

    pub fn as_raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }

    /// Sends one message with `fds` attached.
    pub fn send<T: Wire>(&self, kind: Kind, body: &T, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        assert!(fds.len() <= MAX_FDS, "{} descriptors in one message", fds.len());
        let mut bytes = vec![kind as u8];
        body.put(&mut bytes);
        if bytes.len() > MAX_MESSAGE {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "link message too large"));
        }
        fds::send(self.socket.as_fd(), &bytes, fds)
    }

    /// The next message; `None` once the other end has closed.
    pub fn recv(&self) -> io::Result<Option<Message>> {
        let mut body = vec![0u8; MAX_MESSAGE];
        let received = fds::recv(self.socket.as_fd(), &mut body, MAX_FDS)?;
        if received.len == 0 && received.fds.is_empty() {
            return Ok(None);
        }
        if received.truncated {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "link message truncated"));
        }
        let Some(kind) = body.first().copied().and_then(Kind::from_u8) else {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "unknown link message"));
        };
        body.truncate(received.len);
        body.remove(0);
        Ok(Some(Message { kind, body, fds: received.fds }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_cross_whole_with_their_descriptors() {
        let (a, b) = Link::pair().unwrap();
        let b = Link::from_fd(b);
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        let failed = Failed { why: "no driver".into() };
        a.send(Kind::Failed, &failed, &[std::os::fd::AsFd::as_fd(&file)]).unwrap();
        a.send(Kind::Failed, &Failed { why: "second".into() }, &[]).unwrap();
        let m = b.recv().unwrap().unwrap();
        assert_eq!(m.kind, Kind::Failed);
        assert_eq!(m.decode::<Failed>().unwrap(), failed);
        assert_eq!(m.fds.len(), 1);
        let m = b.recv().unwrap().unwrap();
        assert_eq!(m.decode::<Failed>().unwrap().why, "second");
        assert!(m.fds.is_empty());
        drop(a);
        assert!(b.recv().unwrap().is_none(), "the other end closed");
    }

    #[test]
    fn garbage_is_an_error_not_a_message() {
        let (a, b) = Link::pair().unwrap();
        // SAFETY: a plain write of a live buffer to our own socket.
        unsafe { libc::write(a.as_raw_fd(), [0xffu8, 1, 2].as_ptr().cast(), 3) };
        assert!(Link::from_fd(b).recv().is_err());
    }
}
