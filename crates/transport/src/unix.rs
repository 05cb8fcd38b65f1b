//! The Unix-domain-socket carrier: the way in for local guests, and the
//! fallback when no faster carrier is set up.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gpuplex_protocol::Header;
use zerocopy::IntoBytes;

use crate::shm::Rings;
use crate::{fds, stream, Address, Carrier, Flusher, Lane, Listener, Peer, SocketKind, TransportError};

/// Frames go over the socket until shared rings are attached; from then on
/// the socket carries only descriptors, and its closing tells either side
/// that the other is gone.
pub struct UnixCarrier {
    /// Dropped before the socket, which its hang-up watch polls.
    rings: Option<Rings>,
    socket: net::UnixStream,
    peer: Peer,
    out: stream::Outbox,
    spin: stream::Spin,
}

impl UnixCarrier {
    pub fn connect(path: &Path) -> Result<UnixCarrier, TransportError> {
        UnixCarrier::new(net::UnixStream::connect(path)?)
    }

    fn new(socket: net::UnixStream) -> Result<UnixCarrier, TransportError> {
        let peer = peer_credentials(&socket)?;
        Ok(UnixCarrier { socket, peer, rings: None, out: stream::Outbox::default(), spin: stream::Spin::default() })
    }

    /// A connection another process accepted, handed over.
    pub fn adopt(socket: OwnedFd) -> Result<UnixCarrier, TransportError> {
        UnixCarrier::new(net::UnixStream::from(socket))
    }

    /// A connected pair, for tests.
    pub fn pair() -> Result<(UnixCarrier, UnixCarrier), TransportError> {
        let (a, b) = net::UnixStream::pair()?;
        Ok((UnixCarrier::new(a)?, UnixCarrier::new(b)?))
    }

    /// The underlying socket, for tests that must misbehave on the wire.
    pub fn socket(&self) -> &net::UnixStream {
        &self.socket
    }
}

impl Carrier for UnixCarrier {
    fn send(&mut self, header: &Header, payload: &[u8]) -> Result<(), TransportError> {
        match &mut self.rings {
            Some(rings) => rings.writer.write_all(&[header.as_bytes(), payload]),
            None => self.out.send(&self.socket, header, payload),
        }
    }

    fn send_parts(&mut self, header: &Header, parts: &[&[u8]]) -> Result<(), TransportError> {
        match &mut self.rings {
            Some(rings) => rings.writer.write_all(&[&[header.as_bytes()], parts].concat()),
            None => self.out.send(&self.socket, header, &parts.concat()),
        }
    }

    fn hold_posted(&mut self) -> Result<Option<Flusher>, TransportError> {
        match self.rings {
            // Frames on rings cost no system call.
            Some(_) => Ok(None),
            None => self.out.hold_posted(&self.socket).map(Some),
        }
    }

    fn flush(&mut self) -> Result<bool, TransportError> {
        self.out.flush()
    }

    fn recv(&mut self, payload: &mut Vec<u8>) -> Result<Header, TransportError> {
        match &mut self.rings {
            Some(rings) => stream::recv(&mut rings.reader, payload),
            None => {
                self.out.flush()?;
                // Read exactly, never ahead: descriptors ride on the bytes
                // that follow some replies, and a plain read drops them.
                let socket = &mut self.socket;
                self.spin.around(socket.as_raw_fd(), || stream::recv(socket, payload))
            }
        }
    }

    fn recv_opening(&mut self, payload: &mut Vec<u8>, max: usize, timeout: Duration) -> Result<Header, TransportError> {
        match self.rings {
            Some(_) => Err(TransportError::Unsupported("open once frames are in shared memory")),
            None => stream::recv_opening(&self.socket, payload, max, timeout),
        }
    }

    fn into_socket(mut self: Box<Self>) -> Result<(SocketKind, OwnedFd), TransportError> {
        match self.rings {
            Some(_) => Err(TransportError::Unsupported("hand over a connection whose frames are in shared memory")),
            None => {
                self.out.flush()?;
                Ok((SocketKind::Unix, self.socket.into()))
            }
        }
    }

    fn into_lane(mut self: Box<Self>) -> Result<Lane, TransportError> {
        match self.rings {
            Some(_) => Err(TransportError::Unsupported("carry a lane once its frames are in shared memory")),
            None => {
                self.out.flush()?;
                Ok(Lane::new(self.socket.into()))
            }
        }
    }

    fn set_patience(&mut self, patience: Option<Duration>) -> Result<(), TransportError> {
        if let Some(rings) = &mut self.rings {
            rings.set_patience(patience);
        }
        stream::set_recv_timeout(&self.socket, patience)?;
        Ok(())
    }

    fn frame_waiting(&self) -> bool {
        self.rings.as_ref().is_some_and(|rings| rings.reader.has_bytes())
    }

    fn spin_adaptively(&mut self) {
        self.spin.adaptive();
        if let Some(rings) = &mut self.rings {
            rings.spin_adaptively();
        }
    }

    fn poll_frame(&self, budget: Duration) -> bool {
        match &self.rings {
            Some(rings) => rings.reader.has_bytes(),
            None => stream::poll_readable(&self.socket, budget),
        }
    }

    fn socket_fd(&self) -> Option<BorrowedFd<'_>> {
        self.rings.is_none().then(|| self.socket.as_fd())
    }

    fn peer(&self) -> Peer {
        self.peer
    }

    fn shares_memory(&self) -> bool {
        true
    }

    fn attach_rings(&mut self, mut rings: Rings) -> Result<(), TransportError> {
        rings.watch(self.socket.as_raw_fd());
        if self.spin.is_adaptive() {
            rings.spin_adaptively();
        }
        self.rings = Some(rings);
        Ok(())
    }

    fn send_fd(&mut self, fd: BorrowedFd<'_>) -> Result<(), TransportError> {
        self.out.flush()?;
        fds::send_fd(self.socket.as_fd(), fd)
    }

    fn recv_fd(&mut self) -> Result<OwnedFd, TransportError> {
        self.out.flush()?;
        fds::recv_fd(self.socket.as_fd())
    }
}

/// SO_PEERCRED: the identity the kernel recorded when the peer connected.
fn peer_credentials(socket: &net::UnixStream) -> Result<Peer, TransportError> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes and `len` holds the size
    // of `cred`, as getsockopt(SO_PEERCRED) requires.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(Peer::Local { pid: cred.pid as u32, uid: cred.uid, gid: cred.gid })
}

pub struct UnixListener {
    listener: net::UnixListener,
    path: PathBuf,
}

impl UnixListener {
    /// Binds `path`, replacing a stale socket file left by a server that
    /// died, but never one a live server still answers on.
    pub fn bind(path: &Path) -> Result<UnixListener, TransportError> {
        if path.exists() {
            if net::UnixStream::connect(path).is_ok() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    format!("a server is already listening on {}", path.display()),
                )
                .into());
            }
            std::fs::remove_file(path)?;
        }
        Ok(UnixListener { listener: net::UnixListener::bind(path)?, path: path.to_owned() })
    }
}

impl Listener for UnixListener {
    fn accept(&self) -> Result<Box<dyn Carrier>, TransportError> {
        let (socket, _) = self.listener.accept()?;
        Ok(Box::new(UnixCarrier::new(socket)?))
    }

    fn address(&self) -> Address {
        Address::Unix(self.path.clone())
    }
}

impl Drop for UnixListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuplex_protocol::{Opcode, MAX_PAYLOAD};
    use std::io::Write;
    use zerocopy::IntoBytes;

    #[test]
    fn frames_cross_and_peer_is_us() {
        let (mut a, mut b) = UnixCarrier::pair().unwrap();
        let h = Header::request(Opcode::Hello, 3, 0, 5);
        a.send(&h, b"hello").unwrap();
        let mut buf = Vec::new();
        assert_eq!(b.recv(&mut buf).unwrap(), h);
        assert_eq!(buf, b"hello");
        assert_eq!(b.peer().pid(), Some(std::process::id()));
    }

    /// Whether the socket has bytes to read now.
    fn readable(c: &UnixCarrier) -> bool {
        let mut byte = 0u8;
        // SAFETY: a one-byte peek into a live byte; nothing is consumed.
        let n = unsafe {
            libc::recv(c.socket().as_raw_fd(), (&mut byte as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT)
        };
        n > 0
    }

    #[test]
    fn held_posted_frames_leave_in_order_with_the_next_waited_one_or_a_flush() {
        let (mut a, mut b) = UnixCarrier::pair().unwrap();
        let flusher = a.hold_posted().unwrap().expect("a socket holds posted frames");
        for id in 1..=3u64 {
            a.send(&Header::request(Opcode::Hello, id, 0, 1).posted(), &[id as u8]).unwrap();
        }
        assert!(!readable(&b), "posted frames are held");
        a.send(&Header::request(Opcode::Hello, 4, 0, 1), &[4]).unwrap();
        let mut buf = Vec::new();
        for id in 1..=4u64 {
            assert_eq!(b.recv(&mut buf).unwrap().request_id.get(), id);
            assert_eq!(buf, [id as u8]);
        }
        // The first posted frame after a waited one leaves at once, the next is held.
        a.send(&Header::request(Opcode::Hello, 5, 0, 1).posted(), &[5]).unwrap();
        assert_eq!(b.recv(&mut buf).unwrap().request_id.get(), 5);
        a.send(&Header::request(Opcode::Hello, 6, 0, 1).posted(), &[6]).unwrap();
        assert!(!readable(&b));
        assert!(flusher.flush().unwrap(), "a flush sends what is held");
        assert!(!a.flush().unwrap(), "and then nothing is");
        assert_eq!(b.recv(&mut buf).unwrap().request_id.get(), 6);
        // A posted frame past what may be held leaves at once, after those held.
        a.send(&Header::request(Opcode::Hello, 7, 0, 1).posted(), &[7]).unwrap();
        let big = vec![8u8; stream::HOLD_BYTES];
        a.send(&Header::request(Opcode::Hello, 8, 0, big.len()).posted(), &big).unwrap();
        assert_eq!(b.recv(&mut buf).unwrap().request_id.get(), 7);
        assert_eq!(b.recv(&mut buf).unwrap().request_id.get(), 8);
        assert_eq!(buf, big);
    }

    #[test]
    fn the_flusher_sleeps_until_a_frame_is_held() {
        let (mut a, mut b) = UnixCarrier::pair().unwrap();
        let flusher = a.hold_posted().unwrap().expect("a socket holds posted frames");
        let waiter = std::thread::spawn(move || {
            flusher.wait_until_held();
            flusher.flush().unwrap()
        });
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!waiter.is_finished(), "nothing is held yet");
        a.send(&Header::request(Opcode::Hello, 1, 0, 1).posted(), &[1]).unwrap();
        assert!(waiter.join().unwrap(), "the held frame woke the flusher, which sent it");
        let mut buf = Vec::new();
        assert_eq!(b.recv(&mut buf).unwrap().request_id.get(), 1);
    }

    /// A session asks before its guest moves onto shared memory; the rings
    /// attached later adapt all the same.
    #[test]
    fn rings_attached_after_the_ask_adapt() {
        use crate::shm::{Layout, Region, Side};
        let (mut a, _b) = UnixCarrier::pair().unwrap();
        a.spin_adaptively();
        let layout = Layout { ring_bytes: 64 << 10, staging_bytes: 4096 };
        let region = std::sync::Arc::new(Region::create("test", layout.total()).unwrap());
        a.attach_rings(Rings::new(region, layout, Side::Server).unwrap()).unwrap();
        assert!(a.rings.as_ref().unwrap().reader_adapts());
    }

    #[test]
    fn close_is_reported_as_closed() {
        let (a, mut b) = UnixCarrier::pair().unwrap();
        drop(a);
        assert!(matches!(b.recv(&mut Vec::new()), Err(TransportError::Closed)));
    }

    #[test]
    fn sending_to_a_vanished_peer_is_an_error_not_a_signal() {
        let (mut a, b) = UnixCarrier::pair().unwrap();
        drop(b);
        let big = vec![0u8; 1 << 20];
        let h = Header::request(Opcode::Hello, 1, 0, big.len());
        assert!(matches!(a.send(&h, &big), Err(TransportError::Closed)));
    }

    #[test]
    fn large_frames_arrive_whole() {
        let (mut a, mut b) = UnixCarrier::pair().unwrap();
        let big: Vec<u8> = (0..(8 << 20)).map(|i| i as u8).collect();
        let sent = big.clone();
        let t = std::thread::spawn(move || a.send(&Header::request(Opcode::Hello, 1, 0, sent.len()), &sent).unwrap());
        let mut buf = Vec::new();
        b.recv(&mut buf).unwrap();
        t.join().unwrap();
        assert_eq!(buf, big);
    }

    #[test]
    fn oversized_length_is_refused_before_reading() {
        let (a, mut b) = UnixCarrier::pair().unwrap();
        let mut h = Header::request(Opcode::Hello, 1, 0, 0);
        h.length = (MAX_PAYLOAD as u32 + 1).into();
        a.socket().write_all(h.as_bytes()).unwrap();
        let mut buf = Vec::new();
        assert!(matches!(b.recv(&mut buf), Err(TransportError::Header(_))));
        assert_eq!(buf.capacity(), 0);
    }

    #[test]
    fn garbage_is_a_header_error() {
        let (a, mut b) = UnixCarrier::pair().unwrap();
        a.socket().write_all(&[0xAB; 64]).unwrap();
        assert!(matches!(b.recv(&mut Vec::new()), Err(TransportError::Header(_))));
    }

    #[test]
    fn listener_refuses_a_live_socket_and_replaces_a_stale_one() {
        let dir = std::env::temp_dir().join(format!("gpuplex-transport-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let live = UnixListener::bind(&path).unwrap();
        assert!(UnixListener::bind(&path).is_err());
        drop(live);
        // A leftover file with nobody listening is replaced.
        let stale = net::UnixListener::bind(&path).unwrap();
        drop(stale);
        assert!(path.exists());
        let l = UnixListener::bind(&path).unwrap();
        let mut c = crate::connect(&l.address(), None).unwrap();
        let mut s = l.accept().unwrap();
        c.send(&Header::request(Opcode::Hello, 1, 0, 0), &[]).unwrap();
        assert_eq!(s.recv(&mut Vec::new()).unwrap().request_id.get(), 1);
        drop(l);
        assert!(!path.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
