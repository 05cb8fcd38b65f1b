//! The TCP carrier: the way in for guests on other hosts.
//!
//! Frames travel as on the Unix socket (`stream.rs`, header validated
//! before any payload is allocated). What TCP changes:
//!
//! - The kernel knows the peer only by address, so every connection opens
//!   with a mutual proof of a shared [`Token`] (`auth.rs`): the client's in
//!   [`TcpCarrier::connect`], the server's in [`Carrier::authenticate`],
//!   which the server runs on the session's thread, not the accept loop.
//!   Until it succeeds, `send` and `recv` refuse to move frames.
//! - Nagle is off on both ends: every call is a small request waiting for
//!   its reply, and delaying it for coalescing only adds latency.
//! - Bulk bytes stream in large frames and chunks, so the socket buffers
//!   are made large where the kernel allows it (see `set_buffers`). A
//!   session's lanes are TCP connections too, with smaller buffers (see
//!   `LANE_BUFFER`).
//!
//! Nothing is encrypted: see the threat model in docs/ARCHITECTURE.md.

use std::net::{self, SocketAddr, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use gpuplex_protocol::Header;

pub use crate::auth::AuthError;
use crate::{
    auth, stream, Address, Carrier, Flusher, Keyring, Lane, Listener, Peer, SocketKind, Token, TransportError,
};

/// How long either side waits for the whole opening exchange.
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client waits for each address of a host to accept.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The socket buffer size asked for, when the kernel allows it.
const SOCKET_BUFFER: usize = 4 << 20;
/// A lane's socket buffers: room for about two of its chunks. Chunks go on
/// whichever lane takes them first, which balances the lanes only if no
/// lane can take many more than its reader has read. With
/// [`SOCKET_BUFFER`] each lane of a 64 MiB copy took an even share at once
/// into its buffers, and the copy then waited for the slowest reader.
/// A lane to the device also waits for the receipt of its last chunk
/// (`lane::AHEAD`), which bounds it more tightly. Figures:
/// `docs/performance.md`.
const LANE_BUFFER: usize = 1 << 20;

pub struct TcpCarrier {
    socket: net::TcpStream,
    peer: SocketAddr,
    /// The server's side of the opening, until it has succeeded.
    pending: Option<PendingAuth>,
    /// The name of the key the peer proved (server side).
    key: Option<String>,
    out: stream::Outbox,
    inbox: stream::Inbox,
    spin: stream::Spin,
}

struct PendingAuth {
    keys: Arc<Keyring>,
    timeout: Duration,
}

impl TcpCarrier {
    /// Connects to `host_port` (`HOST:PORT`, IPv6 hosts in brackets) and
    /// runs the opening: returns only once both sides have proven the token.
    pub fn connect(host_port: &str, token: &Token) -> Result<TcpCarrier, TransportError> {
        TcpCarrier::connect_within(host_port, token, AUTH_TIMEOUT)
    }

    fn connect_within(host_port: &str, token: &Token, timeout: Duration) -> Result<TcpCarrier, TransportError> {
        let mut last = None;
        for addr in host_port.to_socket_addrs()? {
            match net::TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
                Ok(socket) => {
                    let mut carrier = TcpCarrier::new(socket, None)?;
                    auth::client(&mut carrier.socket, token, timeout).map_err(TransportError::Auth)?;
                    return Ok(carrier);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other(format!("{host_port} resolves to no address"))).into())
    }

    fn new(socket: net::TcpStream, pending: Option<PendingAuth>) -> Result<TcpCarrier, TransportError> {
        socket.set_nodelay(true)?;
        set_buffers(&socket, SOCKET_BUFFER);
        TcpCarrier::over(socket, pending)
    }

    /// A connection another process accepted and authenticated, handed over.
    pub fn adopt(socket: OwnedFd) -> Result<TcpCarrier, TransportError> {
        TcpCarrier::over(net::TcpStream::from(socket), None)
    }

    fn over(socket: net::TcpStream, pending: Option<PendingAuth>) -> Result<TcpCarrier, TransportError> {
        let peer = socket.peer_addr()?;
        let (out, inbox) = (stream::Outbox::default(), stream::Inbox::default());
        Ok(TcpCarrier { socket, peer, pending, key: None, out, inbox, spin: stream::Spin::default() })
    }

    /// The underlying socket, for tests that must misbehave on the wire.
    pub fn socket(&self) -> &net::TcpStream {
        &self.socket
    }

    fn ready(&self) -> Result<(), TransportError> {
        match self.pending {
            Some(_) => Err(TransportError::Auth(AuthError::Pending)),
            None => Ok(()),
        }
    }
}

impl Carrier for TcpCarrier {
    fn authenticate(&mut self) -> Result<(), TransportError> {
        let Some(pending) = &self.pending else { return Ok(()) };
        let keys = pending.keys.keys();
        let tokens: Vec<Token> = keys.iter().map(|(_, token)| token.clone()).collect();
        match auth::server(&mut self.socket, &tokens, pending.timeout) {
            Ok(index) => self.key = Some(keys[index].0.clone()),
            Err(e) => {
                // Whatever the caller does next, this peer gets nothing more.
                let _ = self.socket.shutdown(net::Shutdown::Both);
                return Err(TransportError::Auth(e));
            }
        }
        self.pending = None;
        Ok(())
    }

    fn recv_opening(&mut self, payload: &mut Vec<u8>, max: usize, timeout: Duration) -> Result<Header, TransportError> {
        self.ready()?;
        stream::recv_opening(&self.socket, payload, max, timeout)
    }

    fn set_patience(&mut self, patience: Option<Duration>) -> Result<(), TransportError> {
        stream::set_recv_timeout(&self.socket, patience)?;
        Ok(())
    }

    fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    fn into_socket(mut self: Box<Self>) -> Result<(SocketKind, OwnedFd), TransportError> {
        self.ready()?;
        self.out.flush()?;
        if self.inbox.has_bytes() {
            return Err(TransportError::Unsupported("hand over a connection with frames read ahead"));
        }
        Ok((SocketKind::Tcp, self.socket.into()))
    }

    fn send(&mut self, header: &Header, payload: &[u8]) -> Result<(), TransportError> {
        self.ready()?;
        self.out.send(&self.socket, header, payload)
    }

    fn hold_posted(&mut self) -> Result<Option<Flusher>, TransportError> {
        self.out.hold_posted(&self.socket).map(Some)
    }

    fn flush(&mut self) -> Result<bool, TransportError> {
        self.out.flush()
    }

    fn recv(&mut self, payload: &mut Vec<u8>) -> Result<Header, TransportError> {
        self.ready()?;
        self.out.flush()?;
        if self.inbox.has_bytes() {
            return self.inbox.recv(&mut self.socket, payload);
        }
        let (socket, inbox) = (&mut self.socket, &mut self.inbox);
        self.spin.around(socket.as_raw_fd(), || inbox.recv(socket, payload))
    }

    fn spin_adaptively(&mut self) {
        self.spin.adaptive();
    }

    fn frame_waiting(&self) -> bool {
        self.inbox.has_bytes()
    }

    fn poll_frame(&self, budget: Duration) -> bool {
        self.inbox.has_bytes() || stream::poll_readable(&self.socket, budget)
    }

    fn socket_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.socket.as_fd())
    }

    fn into_lane(mut self: Box<Self>) -> Result<Lane, TransportError> {
        self.ready()?;
        self.out.flush()?;
        if self.inbox.has_bytes() {
            return Err(TransportError::Unsupported("carry a lane with frames read ahead"));
        }
        set_buffers(&self.socket, LANE_BUFFER);
        Ok(Lane::new(self.socket.into()))
    }

    fn peer(&self) -> Peer {
        Peer::Remote(self.peer)
    }
}

pub struct TcpListener {
    listener: net::TcpListener,
    address: Address,
    keys: Arc<Keyring>,
    auth_timeout: Duration,
}

impl TcpListener {
    /// Listens on `host_port`; port 0 picks a free one ([`Listener::address`]
    /// tells which). Peers are admitted by proving any of `keys`.
    pub fn bind(host_port: &str, keys: Arc<Keyring>) -> Result<TcpListener, TransportError> {
        let listener = net::TcpListener::bind(host_port)?;
        let address = Address::Tcp(listener.local_addr()?.to_string());
        Ok(TcpListener { listener, address, keys, auth_timeout: AUTH_TIMEOUT })
    }

    /// How long a new peer has to complete the opening ([`AUTH_TIMEOUT`]
    /// unless set).
    pub fn with_auth_timeout(mut self, timeout: Duration) -> TcpListener {
        self.auth_timeout = timeout;
        self
    }
}

impl Listener for TcpListener {
    /// Returns at once; the opening runs in [`Carrier::authenticate`].
    fn accept(&self) -> Result<Box<dyn Carrier>, TransportError> {
        let (socket, _) = self.listener.accept()?;
        let pending = PendingAuth { keys: self.keys.clone(), timeout: self.auth_timeout };
        Ok(Box::new(TcpCarrier::new(socket, Some(pending))?))
    }

    fn address(&self) -> Address {
        self.address.clone()
    }
}

/// Asks for send and receive buffers of `size` bytes, best effort. Linux
/// grows a socket's buffers by itself (up to `tcp_wmem`/`tcp_rmem`'s
/// maximum) until `SO_SNDBUF`/`SO_RCVBUF` is set, and caps a set size at
/// `wmem_max`/`rmem_max`, often 208 KiB: asking where the cap is lower
/// would shrink the window, so ask only where it allows the full size.
fn set_buffers(socket: &net::TcpStream, size: usize) {
    for (option, cap) in
        [(libc::SO_SNDBUF, "/proc/sys/net/core/wmem_max"), (libc::SO_RCVBUF, "/proc/sys/net/core/rmem_max")]
    {
        let cap: usize = std::fs::read_to_string(cap).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
        if cap < size {
            continue;
        }
        let size = size as libc::c_int;
        // SAFETY: `size` is a live c_int and the length passed is its size,
        // as setsockopt for these options requires.
        unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                option,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuplex_protocol::Opcode;
    use hmac::Mac;
    use std::io::{Read, Write};
    use std::time::Instant;
    use zerocopy::IntoBytes;

    fn token(s: &str) -> Token {
        Token::new(s.as_bytes()).unwrap()
    }

    fn right() -> Token {
        token("the right token, 32 bytes long..")
    }

    fn listener(t: Token) -> (TcpListener, String) {
        let keys = Arc::new(Keyring::default());
        keys.replace(vec![("t".into(), t)]);
        let l = TcpListener::bind("127.0.0.1:0", keys).unwrap();
        let Address::Tcp(host_port) = l.address() else { unreachable!("a TCP listener") };
        (l, host_port)
    }

    fn auth_error(r: Result<impl Sized, TransportError>) -> AuthError {
        match r {
            Err(TransportError::Auth(e)) => e,
            Err(e) => panic!("want an authentication error, got {e:?}"),
            Ok(_) => panic!("want an authentication error, got success"),
        }
    }

    fn rmem_max() -> usize {
        std::fs::read_to_string("/proc/sys/net/core/rmem_max").unwrap().trim().parse().unwrap()
    }

    /// The receive buffer as the kernel reports it: twice the size asked.
    fn receive_buffer(socket: std::os::fd::RawFd) -> usize {
        let mut size: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `size` and `len` are valid for writes and `len` holds the size of `size`.
        let rc = unsafe {
            libc::getsockopt(
                socket,
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&mut size as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0);
        size as usize
    }

    fn nodelay_and_buffers_hold(socket: &net::TcpStream) {
        assert!(socket.nodelay().unwrap());
        if rmem_max() >= SOCKET_BUFFER {
            assert_eq!(receive_buffer(socket.as_raw_fd()), 2 * SOCKET_BUFFER);
        }
    }

    #[test]
    fn the_right_token_connects_and_frames_flow() {
        let (l, host_port) = listener(right());
        let server = std::thread::spawn(move || {
            let mut s = l.accept().unwrap();
            s.authenticate().unwrap();
            let mut buf = Vec::new();
            let h = s.recv(&mut buf).unwrap();
            s.send(&Header::reply(&h, 0, buf.len()), &buf).unwrap();
            s.peer()
        });
        let mut c = TcpCarrier::connect(&host_port, &right()).unwrap();
        nodelay_and_buffers_hold(c.socket());
        let big: Vec<u8> = (0..(8 << 20)).map(|i| (i * 7) as u8).collect();
        c.send(&Header::request(Opcode::Hello, 9, 0, big.len()), &big).unwrap();
        let mut buf = Vec::new();
        assert_eq!(c.recv(&mut buf).unwrap().request_id.get(), 9);
        assert_eq!(buf, big);
        let seen_by_server = server.join().unwrap();
        assert_eq!(seen_by_server, Peer::Remote(c.socket().local_addr().unwrap()));
        assert_eq!(seen_by_server.pid(), None);
        assert!(matches!(c.peer(), Peer::Remote(a) if a.to_string() == host_port));
    }

    #[test]
    fn frames_that_arrive_together_are_read_ahead_in_order() {
        let (l, host_port) = listener(right());
        let big: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let sent = big.clone();
        let server = std::thread::spawn(move || {
            let mut s = l.accept().unwrap();
            s.authenticate().unwrap();
            let (_, fd) = s.into_socket().unwrap();
            let mut socket = net::TcpStream::from(fd);
            let mut wire = Vec::new();
            for (id, payload) in [(1u64, &b"one"[..]), (2, &sent[..]), (3, b"three")] {
                wire.extend_from_slice(Header::request(Opcode::Hello, id, 0, payload.len()).as_bytes());
                wire.extend_from_slice(payload);
            }
            // Then half a header and the end: not a clean close.
            wire.extend_from_slice(&Header::request(Opcode::Hello, 4, 0, 0).as_bytes()[..10]);
            socket.write_all(&wire).unwrap();
        });
        let mut c = TcpCarrier::connect(&host_port, &right()).unwrap();
        let mut buf = Vec::new();
        assert_eq!(c.recv(&mut buf).unwrap().request_id.get(), 1);
        assert_eq!(buf, b"one");
        assert!(c.frame_waiting(), "the next frame was read ahead");
        assert_eq!(c.recv(&mut buf).unwrap().request_id.get(), 2);
        assert_eq!(buf, big, "a payload larger than the read-ahead arrives whole");
        assert_eq!(c.recv(&mut buf).unwrap().request_id.get(), 3);
        assert_eq!(buf, b"three");
        server.join().unwrap();
        assert!(matches!(c.recv(&mut buf), Err(TransportError::Io(_))));
        assert!(Box::new(c).into_lane().is_err(), "a connection with bytes read ahead is not handed over");
    }

    #[test]
    fn lanes_hold_about_two_chunks_in_their_buffers() {
        let (l, host_port) = listener(right());
        let server = std::thread::spawn(move || {
            let mut s = l.accept().unwrap();
            s.authenticate().unwrap();
            Box::new(s).into_lane().unwrap()
        });
        let client = Box::new(TcpCarrier::connect(&host_port, &right()).unwrap()).into_lane().unwrap();
        let server = server.join().unwrap();
        if rmem_max() >= LANE_BUFFER {
            for lane in [client, server] {
                assert_eq!(receive_buffer(lane.raw_fd()), 2 * LANE_BUFFER);
            }
        }
    }

    #[test]
    fn a_wrong_token_is_refused_on_both_sides() {
        let (l, host_port) = listener(right());
        let server = std::thread::spawn(move || {
            let mut s = l.accept().unwrap();
            let e = auth_error(s.authenticate());
            // Nothing moves afterwards either.
            assert!(s.recv(&mut Vec::new()).is_err());
            e
        });
        let e = auth_error(TcpCarrier::connect(&host_port, &token("a wrong token, also 32 bytes....")));
        assert!(matches!(e, AuthError::Refused), "client: {e:?}");
        let e = server.join().unwrap();
        assert!(matches!(e, AuthError::WrongToken), "server: {e:?}");
    }

    #[test]
    fn no_frame_moves_before_authentication() {
        let (l, host_port) = listener(right());
        let client = std::thread::spawn(move || TcpCarrier::connect(&host_port, &right()));
        let mut s = l.accept().unwrap();
        assert!(matches!(auth_error(s.recv(&mut Vec::new())), AuthError::Pending));
        assert!(matches!(auth_error(s.send(&Header::request(Opcode::Hello, 1, 0, 0), &[])), AuthError::Pending));
        s.authenticate().unwrap();
        client.join().unwrap().unwrap();
    }

    /// A raw peer: frames, garbage, part of an answer, or nothing at all.
    /// The server refuses each within its short timeout, and reads none of
    /// it as a frame.
    #[test]
    fn garbage_and_silence_are_refused_in_time() {
        let timeout = Duration::from_millis(300);
        let (l, host_port) = listener(right());
        let l = l.with_auth_timeout(timeout);
        let hello = Header::request(Opcode::Hello, 1, 0, 64);
        let mut frame = zerocopy::IntoBytes::as_bytes(&hello).to_vec();
        frame.extend_from_slice(&[0u8; 64]);
        let cases: [(&str, Vec<u8>, bool); 4] = [
            ("a frame without the opening", frame, false),
            ("random garbage", vec![0xa5; 4096], false),
            ("half an answer", vec![0; 40], false),
            ("a byte at a time", vec![0; 64], true),
        ];
        for (what, bytes, dribble) in cases {
            let mut raw = net::TcpStream::connect(&host_port).unwrap();
            let mut s = l.accept().unwrap();
            let start = Instant::now();
            let writer = std::thread::spawn(move || {
                let mut greeting = [0u8; 40];
                raw.read_exact(&mut greeting).unwrap();
                assert_eq!(greeting[..8], auth::MAGIC);
                if dribble {
                    for b in bytes {
                        if raw.write_all(&[b]).is_err() {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                } else {
                    let _ = raw.write_all(&bytes);
                }
                // The server's answer: only a hang-up.
                let mut rest = Vec::new();
                let _ = raw.read_to_end(&mut rest);
                rest
            });
            let e = auth_error(s.authenticate());
            let want_timeout = what == "half an answer" || dribble;
            assert!(
                if want_timeout { matches!(e, AuthError::Timeout(_)) } else { matches!(e, AuthError::WrongToken) },
                "{what}: {e:?}"
            );
            assert!(start.elapsed() < timeout + Duration::from_secs(1), "{what}: took {:?}", start.elapsed());
            assert!(matches!(auth_error(s.recv(&mut Vec::new())), AuthError::Pending), "{what}");
            drop(s);
            assert_eq!(writer.join().unwrap(), b"", "{what}: the server answered");
        }
        // Silence from the first byte.
        let _silent = net::TcpStream::connect(&host_port).unwrap();
        let mut s = l.accept().unwrap();
        assert!(matches!(auth_error(s.authenticate()), AuthError::Timeout(_)));
    }

    /// An impostor server that skips the check and answers with a proof
    /// under its own token, or reflects the client's proof: the client
    /// refuses it and sends it no frame.
    #[test]
    fn a_server_that_cannot_prove_the_token_is_refused() {
        for reflect in [false, true] {
            let l = net::TcpListener::bind("127.0.0.1:0").unwrap();
            let host_port = l.local_addr().unwrap().to_string();
            let impostor = std::thread::spawn(move || {
                let (mut s, _) = l.accept().unwrap();
                let nonce = [3u8; auth::NONCE_LEN];
                s.write_all(&[&auth::MAGIC[..], &nonce].concat()).unwrap();
                let mut reply = [0u8; 64];
                s.read_exact(&mut reply).unwrap();
                let answer = if reflect {
                    reply[32..].to_vec()
                } else {
                    let own = token("the impostor's own token........");
                    auth::prove(&own, auth::SERVER_LABEL, &reply[..32], &nonce).finalize().into_bytes().to_vec()
                };
                s.write_all(&answer).unwrap();
                let mut rest = Vec::new();
                let _ = s.read_to_end(&mut rest);
                rest
            });
            let e = auth_error(TcpCarrier::connect(&host_port, &right()));
            assert!(matches!(e, AuthError::ServerUnproven), "reflect={reflect}: {e:?}");
            assert_eq!(impostor.join().unwrap(), b"", "reflect={reflect}: the client sent more");
        }
    }

    #[test]
    fn a_server_that_is_not_gpuplex_or_silent_is_refused() {
        let l = net::TcpListener::bind("127.0.0.1:0").unwrap();
        let host_port = l.local_addr().unwrap().to_string();
        let other = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.write_all(b"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13.5\r\n").unwrap();
            drop(s);
            let (_silent, _) = l.accept().unwrap();
            std::thread::sleep(Duration::from_secs(2));
        });
        assert!(matches!(auth_error(TcpCarrier::connect(&host_port, &right())), AuthError::NotGpuplex));
        let e = auth_error(TcpCarrier::connect_within(&host_port, &right(), Duration::from_millis(200)));
        assert!(matches!(e, AuthError::Timeout(_)), "{e:?}");
        other.join().unwrap();
    }

    #[test]
    fn tcp_needs_a_token_and_unix_listening_refuses_one() {
        let tcp: Address = "tcp:127.0.0.1:1".parse().unwrap();
        assert!(matches!(crate::connect(&tcp, None), Err(TransportError::Token(_))));
        assert!(matches!(crate::listen(&tcp, None), Err(TransportError::Token(_))));
        let unix = Address::Unix(std::env::temp_dir().join("gpuplex-never-bound.sock"));
        assert!(matches!(crate::listen(&unix, Some(right())), Err(TransportError::Token(_))));
    }

    #[test]
    fn listen_and_connect_by_address() {
        let l = crate::listen(&"tcp:[::1]:0".parse().unwrap(), Some(right()))
            .or_else(|_| crate::listen(&"tcp:127.0.0.1:0".parse().unwrap(), Some(right())))
            .unwrap();
        let address = l.address();
        let client = std::thread::spawn(move || crate::connect(&address, Some(&right())));
        let mut s = l.accept().unwrap();
        s.authenticate().unwrap();
        let mut c = client.join().unwrap().unwrap();
        c.send(&Header::request(Opcode::Hello, 4, 0, 0), &[]).unwrap();
        assert_eq!(s.recv(&mut Vec::new()).unwrap().request_id.get(), 4);
    }
}
