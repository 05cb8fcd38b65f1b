//! Frames over any byte stream: shared by the stream-socket carriers.

use std::io::{ErrorKind, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use gpuplex_protocol::{Header, HEADER_SIZE};
use zerocopy::IntoBytes;

use crate::TransportError;

/// Sends one frame on a socket. `MSG_NOSIGNAL`: a peer that went away must
/// be an error for this caller, not a SIGPIPE that kills the process the
/// front-end lives in.
pub(crate) fn send(socket: &impl AsRawFd, header: &Header, payload: &[u8]) -> Result<(), TransportError> {
    debug_assert_eq!(header.payload_len(), payload.len());
    send_parts(socket, &[header.as_bytes(), payload]).map_err(io_error)
}

/// Posted frames held back to leave together ([`crate::Carrier::hold_posted`]).
///
/// On a socket each frame is a system call at both ends, and over TCP a
/// trip through the network stack too: a framework posting hundreds of
/// launches a step spent more time sending them than the driver takes to
/// queue them natively. Held frames leave with the next frame that is not
/// posted, when [`HOLD_BYTES`] are held, or when a [`Flusher`] sends them
/// from another thread.
#[derive(Default)]
pub(crate) struct Outbox {
    held: Option<Arc<Held>>,
}

/// Frames held at most, in bytes: a posted frame that would go past it
/// leaves at once, with those held before it.
pub(crate) const HOLD_BYTES: usize = 64 << 10;

/// What an outbox holds, shared with its flusher.
pub(crate) struct Held {
    /// The carrier's socket, duplicated for the flusher's thread.
    socket: OwnedFd,
    frames: Mutex<Vec<u8>>,
    /// Held by whoever writes frames to the socket, while it takes what is
    /// held (swapping in this buffer, which it then empties): frames leave
    /// in the order they were given, and a frame is only ever appended
    /// under `frames`, never behind a write.
    wire: Mutex<Vec<u8>>,
}

impl Held {
    /// Sends what is held, then `parts`; returns whether anything went.
    fn send_with(&self, parts: &[&[u8]]) -> Result<bool, TransportError> {
        let mut batch = self.wire.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::swap(&mut *batch, &mut *self.frames.lock().unwrap_or_else(PoisonError::into_inner));
        if batch.is_empty() && parts.iter().all(|p| p.is_empty()) {
            return Ok(false);
        }
        let all: Vec<&[u8]> = std::iter::once(&batch[..]).chain(parts.iter().copied()).collect();
        let sent = send_parts(&self.socket, &all).map_err(io_error);
        batch.clear();
        sent.map(|()| true)
    }
}

/// Sends the frames a carrier holds back, from any thread.
pub struct Flusher(Arc<Held>);

impl Flusher {
    /// Sends what is held; returns whether anything was.
    pub fn flush(&self) -> Result<bool, TransportError> {
        self.0.send_with(&[])
    }
}

impl Outbox {
    pub fn hold_posted(&mut self, socket: &impl AsFd) -> Result<Flusher, TransportError> {
        let held = Arc::new(Held {
            socket: socket.as_fd().try_clone_to_owned()?,
            frames: Mutex::default(),
            wire: Mutex::default(),
        });
        self.held = Some(held.clone());
        Ok(Flusher(held))
    }

    pub fn send(&mut self, socket: &impl AsRawFd, header: &Header, payload: &[u8]) -> Result<(), TransportError> {
        debug_assert_eq!(header.payload_len(), payload.len());
        let Some(held) = &self.held else { return send(socket, header, payload) };
        if header.is_posted() {
            let mut frames = held.frames.lock().unwrap_or_else(PoisonError::into_inner);
            if frames.len() + HEADER_SIZE + payload.len() <= HOLD_BYTES {
                frames.extend_from_slice(header.as_bytes());
                frames.extend_from_slice(payload);
                return Ok(());
            }
        }
        held.send_with(&[header.as_bytes(), payload]).map(|_| ())
    }

    /// Sends what is held; returns whether anything was.
    pub fn flush(&mut self) -> Result<bool, TransportError> {
        self.held.as_ref().map_or(Ok(false), |held| held.send_with(&[]))
    }
}

/// A failed send or receive: a vanished peer is `Closed`.
pub(crate) fn io_error(e: std::io::Error) -> TransportError {
    if is_disconnect(&e) {
        TransportError::Closed
    } else {
        e.into()
    }
}

/// Writes `parts` back to back, with `MSG_NOSIGNAL`.
pub(crate) fn send_parts(socket: &impl AsRawFd, parts: &[&[u8]]) -> std::io::Result<()> {
    send_parts_with(socket, parts, 0)
}

/// [`send_parts`] with more `flags` (`MSG_MORE`, say).
pub(crate) fn send_parts_with(socket: &impl AsRawFd, parts: &[&[u8]], flags: i32) -> std::io::Result<()> {
    let (mut part, mut offset) = (0, 0);
    while part < parts.len() {
        let iov: Vec<libc::iovec> = parts[part..]
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let p = if i == 0 { &p[offset..] } else { p };
                libc::iovec { iov_base: p.as_ptr() as *mut libc::c_void, iov_len: p.len() }
            })
            .collect();
        // SAFETY: zeroed msghdr is a valid empty message; we set only the iovec.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = iov.len() as _;
        // SAFETY: `msg` points at iovecs over live buffers for the call.
        let n = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL | flags) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.kind() {
                ErrorKind::Interrupted => continue,
                _ => return Err(e),
            }
        }
        let mut n = n as usize;
        while part < parts.len() && n >= parts[part].len() - offset {
            n -= parts[part].len() - offset;
            part += 1;
            offset = 0;
        }
        offset += n;
    }
    Ok(())
}

/// How long a receiver polls its socket before it sleeps in the kernel.
/// Waking a sleeping thread costs tens of microseconds on a virtual
/// machine, and the reply to a call usually comes sooner than this.
pub(crate) const SPIN: Duration = Duration::from_micros(50);

/// Polls `socket` for up to [`SPIN`] until it has bytes to read or is
/// closed, so that the read that follows need not sleep.
pub(crate) fn await_readable(socket: &impl AsRawFd) {
    let start = Instant::now();
    let mut byte = 0u8;
    loop {
        // SAFETY: a one-byte peek into a live byte; nothing is consumed.
        let n = unsafe {
            libc::recv(socket.as_raw_fd(), (&mut byte as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT)
        };
        if n >= 0 || std::io::Error::last_os_error().kind() != ErrorKind::WouldBlock || start.elapsed() >= SPIN {
            return;
        }
        std::hint::spin_loop();
    }
}

pub(crate) fn recv<R: Read>(r: &mut R, payload: &mut Vec<u8>) -> Result<Header, TransportError> {
    recv_at_most(r, payload, gpuplex_protocol::MAX_PAYLOAD)
}

/// [`recv`] refusing a payload over `max` bytes before reading or
/// allocating any of it.
pub(crate) fn recv_at_most<R: Read>(r: &mut R, payload: &mut Vec<u8>, max: usize) -> Result<Header, TransportError> {
    let mut raw = [0u8; HEADER_SIZE];
    read_exact(r, &mut raw, true)?;
    let header = Header::parse(&raw)?;
    if header.payload_len() > max {
        return Err(gpuplex_protocol::HeaderError::TooLong(header.payload_len()).into());
    }
    payload.clear();
    payload.resize(header.payload_len(), 0);
    read_exact(r, payload, false)?;
    Ok(header)
}

/// Receives a connection's opening frame: at most `max` payload bytes, the
/// whole frame within `timeout`, so that a peer that has not yet said who it
/// is can neither hold a thread for long nor make the server allocate.
pub(crate) fn recv_opening<S: AsRawFd>(
    socket: &S,
    payload: &mut Vec<u8>,
    max: usize,
    timeout: Duration,
) -> Result<Header, TransportError>
where
    for<'s> &'s S: Read,
{
    let mut reader = Deadline { socket, at: Instant::now() + timeout };
    let header = recv_at_most(&mut reader, payload, max).map_err(|e| match e {
        TransportError::TimedOut(_) => TransportError::TimedOut(Some(timeout)),
        e => e,
    });
    set_recv_timeout(socket, None)?;
    header
}

/// Reads from a socket until a deadline: each read may wait only for what
/// is left of it, so a peer dribbling a byte at a time cannot stretch it.
struct Deadline<'a, S> {
    socket: &'a S,
    at: Instant,
}

impl<S: AsRawFd> Read for Deadline<'_, S>
where
    for<'s> &'s S: Read,
{
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ErrorKind::TimedOut.into());
        }
        set_recv_timeout(self.socket, Some(left))?;
        let mut socket = self.socket;
        socket.read(buf)
    }
}

/// Sets (or clears, with `None`) how long a blocking receive on `socket` waits.
pub(crate) fn set_recv_timeout(socket: &impl AsRawFd, timeout: Option<Duration>) -> std::io::Result<()> {
    let t = timeout.unwrap_or_default();
    // A zero timeval means "no timeout", so a set timeout never rounds down to zero.
    let tv =
        libc::timeval { tv_sec: t.as_secs() as _, tv_usec: t.subsec_micros().max(u32::from(timeout.is_some())) as _ };
    // SAFETY: `tv` is a live timeval and the length passed is its size, as
    // setsockopt(SO_RCVTIMEO) requires.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `read_exact` that reports a clean close before the first byte as `Closed`.
pub(crate) fn read_exact<R: Read>(r: &mut R, buf: &mut [u8], at_frame_start: bool) -> Result<(), TransportError> {
    let mut done = 0;
    while done < buf.len() {
        match r.read(&mut buf[done..]) {
            Ok(0) if done == 0 && at_frame_start => return Err(TransportError::Closed),
            Ok(0) => return Err(std::io::Error::from(ErrorKind::UnexpectedEof).into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if is_disconnect(&e) => return Err(TransportError::Closed),
            // A receive timeout (a client's patience) ran out.
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(TransportError::TimedOut(None))
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

pub(crate) fn is_disconnect(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted)
}
