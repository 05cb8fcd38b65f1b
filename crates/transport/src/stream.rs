//! Frames over any byte stream: shared by the stream-socket carriers.

use std::io::{ErrorKind, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::thread::Thread;
use std::time::{Duration, Instant};

use gpuplex_protocol::{Header, HEADER_SIZE};
use zerocopy::IntoBytes;

use crate::{SpinBudget, TransportError, POLITE_AFTER};

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
/// from another thread. The first posted frame after a waited one leaves at
/// once: the peer has answered and is idle, and a launch followed by a
/// synchronize then overlaps the peer's work with the sending of the next.
#[derive(Default)]
pub(crate) struct Outbox {
    held: Option<Arc<Held>>,
    /// Whether the last frame sent was waited for, so the next posted one
    /// goes at once.
    after_waited: bool,
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
    /// The flusher's thread, and whether it sleeps until a frame is held.
    flusher: OnceLock<Thread>,
    sleeping: AtomicBool,
}

impl Held {
    /// Sends what is held, then `frame` (a header and payload, or nothing);
    /// returns whether anything went.
    fn send_with(&self, frame: [&[u8]; 2]) -> Result<bool, TransportError> {
        let mut batch = self.wire.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::swap(&mut *batch, &mut *self.frames.lock().unwrap_or_else(PoisonError::into_inner));
        if batch.is_empty() && frame[0].is_empty() {
            return Ok(false);
        }
        let sent = send_parts(&self.socket, &[&batch[..], frame[0], frame[1]]).map_err(io_error);
        batch.clear();
        sent.map(|()| true)
    }
}

/// Sends the frames a carrier holds back, from a thread of its own.
pub struct Flusher(Arc<Held>);

impl Flusher {
    /// Sends what is held; returns whether anything was.
    pub fn flush(&self) -> Result<bool, TransportError> {
        self.0.send_with([&[], &[]])
    }

    /// Returns once a frame is held, sleeping until then: the first frame
    /// held wakes the thread that waits here, which must be one thread.
    pub fn wait_until_held(&self) {
        let held = &self.0;
        held.flusher.get_or_init(std::thread::current);
        loop {
            held.sleeping.store(true, SeqCst);
            // A frame held before the flag was seen is found here; one held
            // after it unparks this thread (`Outbox::send`).
            if !held.frames.lock().unwrap_or_else(PoisonError::into_inner).is_empty() {
                held.sleeping.store(false, SeqCst);
                return;
            }
            std::thread::park();
        }
    }
}

impl Outbox {
    pub fn hold_posted(&mut self, socket: &impl AsFd) -> Result<Flusher, TransportError> {
        let held = Arc::new(Held {
            socket: socket.as_fd().try_clone_to_owned()?,
            frames: Mutex::default(),
            wire: Mutex::default(),
            flusher: OnceLock::new(),
            sleeping: AtomicBool::new(false),
        });
        self.held = Some(held.clone());
        Ok(Flusher(held))
    }

    pub fn send(&mut self, socket: &impl AsRawFd, header: &Header, payload: &[u8]) -> Result<(), TransportError> {
        debug_assert_eq!(header.payload_len(), payload.len());
        let Some(held) = &self.held else { return send(socket, header, payload) };
        let eager = std::mem::replace(&mut self.after_waited, !header.is_posted());
        if header.is_posted() && !eager {
            let mut frames = held.frames.lock().unwrap_or_else(PoisonError::into_inner);
            if frames.len() + HEADER_SIZE + payload.len() <= HOLD_BYTES {
                let first = frames.is_empty();
                frames.extend_from_slice(header.as_bytes());
                frames.extend_from_slice(payload);
                drop(frames);
                if first && held.sleeping.swap(false, SeqCst) {
                    if let Some(flusher) = held.flusher.get() {
                        flusher.unpark();
                    }
                }
                return Ok(());
            }
        }
        held.send_with([header.as_bytes(), payload]).map(|_| ())
    }

    /// Sends what is held; returns whether anything was.
    pub fn flush(&mut self) -> Result<bool, TransportError> {
        self.held.as_ref().map_or(Ok(false), |held| held.send_with([&[], &[]]))
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

/// How long a socket's reader polls before it sleeps in the kernel: [`SPIN`],
/// or, once adaptive ([`crate::Carrier::spin_adaptively`]), as a
/// [`SpinBudget`] has it.
pub(crate) struct Spin {
    budget: SpinBudget,
}

impl Default for Spin {
    fn default() -> Spin {
        Spin { budget: SpinBudget::fixed(SPIN) }
    }
}

impl Spin {
    pub fn adaptive(&mut self) {
        self.budget.adapt();
    }

    pub fn is_adaptive(&self) -> bool {
        self.budget.is_adaptive()
    }

    /// Polls `socket` until it has bytes or is closed, or the budget is
    /// spent; then learns from how long the wait lasted once `read` (the
    /// read that follows, which may sleep) returns.
    pub fn around<T>(&mut self, socket: RawFd, read: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let spun = poll_readable(&socket, self.budget.now());
        let out = read();
        if spun {
            self.budget.spun();
        } else {
            self.budget.slept(start.elapsed());
        }
        out
    }
}

/// Polls `socket` for up to `budget`, yielding the CPU between looks once
/// past [`POLITE_AFTER`]; returns whether it has bytes to read or is closed.
pub(crate) fn poll_readable(socket: &impl AsRawFd, budget: Duration) -> bool {
    let start = Instant::now();
    let mut byte = 0u8;
    loop {
        // SAFETY: a one-byte peek into a live byte; nothing is consumed.
        let n = unsafe {
            libc::recv(socket.as_raw_fd(), (&mut byte as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT)
        };
        if n >= 0 || std::io::Error::last_os_error().kind() != ErrorKind::WouldBlock {
            return true;
        }
        let spun = start.elapsed();
        if spun >= budget {
            return false;
        }
        if spun >= POLITE_AFTER {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
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
    sized_for(payload, header.payload_len());
    read_exact(r, payload, false)?;
    Ok(header)
}

/// Makes a reused receive buffer `len` bytes long, keeping what it holds
/// for the payload to overwrite: zeroing it first would write a payload of
/// megabytes (an image) twice.
fn sized_for(payload: &mut Vec<u8>, len: usize) {
    payload.truncate(len);
    payload.resize(len, 0);
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
        done += read_some(r, &mut buf[done..], done == 0 && at_frame_start)?;
    }
    Ok(())
}

/// One read of at least a byte; a clean close is `Closed` where nothing of
/// a frame has been read yet (`nothing_yet`), else an unexpected end.
fn read_some<R: Read>(r: &mut R, buf: &mut [u8], nothing_yet: bool) -> Result<usize, TransportError> {
    loop {
        match r.read(buf) {
            Ok(0) if nothing_yet => return Err(TransportError::Closed),
            Ok(0) => return Err(std::io::Error::from(ErrorKind::UnexpectedEof).into()),
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if is_disconnect(&e) => return Err(TransportError::Closed),
            // A receive timeout (a client's patience) ran out.
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(TransportError::TimedOut(None))
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Frames read from a socket through a buffer, so that frames that arrived
/// together (posted ones sent as one batch) cost one read, not two each.
/// Only a connection's frames after its opening go through it: the
/// opening is read exactly, so that a socket handed to another process
/// leaves nothing behind here.
#[derive(Default)]
pub(crate) struct Inbox {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

/// Bytes read ahead at most; a larger payload's rest is read straight
/// into it.
const INBOX_BYTES: usize = 64 << 10;

impl Inbox {
    /// Whether bytes of a frame not yet received are here.
    pub fn has_bytes(&self) -> bool {
        self.end > self.start
    }

    /// [`recv`], reading ahead whatever has arrived.
    pub fn recv<R: Read>(&mut self, r: &mut R, payload: &mut Vec<u8>) -> Result<Header, TransportError> {
        self.fill(r, HEADER_SIZE)?;
        let raw: &[u8; HEADER_SIZE] =
            self.buf[self.start..self.start + HEADER_SIZE].try_into().expect("a header's bytes");
        let header = Header::parse(raw)?;
        let len = header.payload_len();
        if len > gpuplex_protocol::MAX_PAYLOAD {
            return Err(gpuplex_protocol::HeaderError::TooLong(len).into());
        }
        self.start += HEADER_SIZE;
        let here = len.min(self.end - self.start);
        sized_for(payload, len);
        payload[..here].copy_from_slice(&self.buf[self.start..self.start + here]);
        self.start += here;
        if here < len {
            read_exact(r, &mut payload[here..], false)?;
        }
        Ok(header)
    }

    /// Reads until at least `n` bytes (at most [`INBOX_BYTES`]) are here.
    fn fill<R: Read>(&mut self, r: &mut R, n: usize) -> Result<(), TransportError> {
        if self.end - self.start >= n {
            return Ok(());
        }
        if self.buf.is_empty() {
            self.buf = vec![0; INBOX_BYTES];
        }
        self.buf.copy_within(self.start..self.end, 0);
        self.end -= self.start;
        self.start = 0;
        while self.end < n {
            self.end += read_some(r, &mut self.buf[self.end..], self.end == 0)?;
        }
        Ok(())
    }
}

pub(crate) fn is_disconnect(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SPIN_MAX;

    /// A buffer reused for frames of every length holds exactly each one's
    /// payload, the bytes of a longer one before never showing through.
    #[test]
    fn a_reused_buffer_holds_exactly_each_payload() {
        let payloads = [vec![7u8; 300], vec![1, 2, 3], Vec::new(), vec![9; 50], vec![4; 400]];
        let mut wire = Vec::new();
        for (i, p) in payloads.iter().enumerate() {
            wire.extend_from_slice(Header::request(gpuplex_protocol::Opcode::Hello, i as u64, 0, p.len()).as_bytes());
            wire.extend_from_slice(p);
        }
        let (mut r, mut buf) = (&wire[..], vec![0xee; 1000]);
        for (i, p) in payloads.iter().enumerate() {
            let header = recv(&mut r, &mut buf).unwrap();
            assert_eq!((header.request_id.get(), &buf), (i as u64, p));
        }
        assert!(recv(&mut r, &mut buf).is_err(), "nothing after the last");
        // The same through an inbox that reads ahead.
        let (mut r, mut buf, mut inbox) = (&wire[..], vec![0xee; 1000], Inbox::default());
        for (i, p) in payloads.iter().enumerate() {
            let header = inbox.recv(&mut r, &mut buf).unwrap();
            assert_eq!((header.request_id.get(), &buf), (i as u64, p));
        }
        assert!(inbox.recv(&mut r, &mut buf).is_err(), "nothing after the last");
    }

    /// A wait that slept teaches the next budget, never below the short
    /// spin; two waits in a row past the longest spin send it back to the
    /// short one, unless a frame met spinning came between; a fixed reader
    /// never changes.
    #[test]
    fn an_adaptive_spin_follows_the_waits_that_slept() {
        let mut spin = SpinBudget::fixed(SPIN);
        spin.slept(Duration::from_micros(400));
        assert_eq!(spin.now(), SPIN, "not adaptive yet");
        spin.adapt();
        spin.slept(Duration::from_micros(400));
        assert_eq!(spin.now(), Duration::from_micros(600));
        spin.slept(Duration::from_micros(10));
        assert_eq!(spin.now(), SPIN, "never below the fixed spin");
        spin.slept(SPIN_MAX * 9 / 10);
        assert_eq!(spin.now(), SPIN_MAX);
        spin.slept(SPIN_MAX * 5);
        assert_eq!(spin.now(), SPIN_MAX, "one long wait keeps it");
        spin.spun();
        spin.slept(SPIN_MAX * 5);
        assert_eq!(spin.now(), SPIN_MAX, "a frame met spinning breaks the row");
        spin.slept(SPIN_MAX * 5);
        assert_eq!(spin.now(), SPIN, "two in a row end it");
    }

    /// `around` learns from a wait that outlasted its spin, and not from a
    /// frame that was already there.
    #[test]
    fn around_learns_only_from_a_wait_past_its_spin() {
        use std::io::Write;
        let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut spin = Spin::default();
        spin.adaptive();
        spin.budget.slept(Duration::from_micros(400));
        let mut byte = [0u8];
        (&b).write_all(b"x").unwrap();
        spin.around(a.as_raw_fd(), || a.read_exact(&mut byte).unwrap());
        assert_eq!(spin.budget.now(), Duration::from_micros(600), "a byte already there teaches nothing");
        for _ in 0..2 {
            let b = b.try_clone().unwrap();
            let late = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                (&b).write_all(b"y").unwrap();
            });
            spin.around(a.as_raw_fd(), || a.read_exact(&mut byte).unwrap());
            late.join().unwrap();
        }
        assert_eq!(spin.budget.now(), SPIN, "two waits of 20 ms end the long spin");
    }
}
