//! Shared memory between a local guest and the server.
//!
//! A [`Region`] is a sealed memfd mapped by both processes: the server
//! creates it, seals its size (so the guest can never shrink it under the
//! server's feet, which would turn server reads into SIGBUS), and passes the
//! descriptor over the Unix socket with `SCM_RIGHTS`. The same kind of
//! region holds pinned host memory that the GPU reads and writes directly.
//!
//! A connection's region starts with two rings ([`Rings`]), byte pipes carrying the
//! same frames the socket would (guest to server, server to guest), followed
//! by a staging area for pageable copies. Each side keeps its own position
//! privately and only publishes it, so a guest scribbling on the shared
//! counters can make its own session fail, never the server misbehave.
//!
//! Waiting is a short spin (a round trip costs well under a microsecond
//! while both sides are busy) and then a futex sleep, so an idle guest
//! costs no CPU. Sleeps wake every few milliseconds to check, through the
//! socket, that the peer is still alive; on the server's side a thread
//! waits for the socket's hang-up and wakes them at once, so that a
//! guest's exit ends its session, and frees its worker, without delay
//! (`HangupBell`). A guest waiting for a reply
//! spins longer when its recent replies came soon after it fell asleep
//! (`Wait::adapt`): waking a sleeping thread costs tens of microseconds on
//! a virtual machine, and the native driver spins through such waits too.

use std::cell::Cell;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{SpinBudget, TransportError, POLITE_AFTER};

/// A shared mapping of a sealed memfd (or of part of a VM's shared file,
/// [`Region::view`]); unmapped when dropped.
pub struct Region {
    base: *mut u8,
    len: usize,
    /// Shared with the views made of this region.
    fd: Arc<OwnedFd>,
    /// Where `base` lies in the file.
    offset: usize,
}

// SAFETY: the mapping is plain memory owned by this value; what is written
// there is synchronised by the protocols built on it (rings, stream order).
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    /// A new zeroed region of `len` bytes whose size can never change.
    pub fn create(name: &str, len: usize) -> io::Result<Region> {
        Region::create_at(name, len, std::ptr::null_mut())
    }

    /// As [`Region::create`], placed at `at` if that range is free here.
    pub fn create_at(name: &str, len: usize, at: *mut u8) -> io::Result<Region> {
        let cname = std::ffi::CString::new(name).map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: a valid C string; flags are constants.
        let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: memfd_create returned a new descriptor we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain calls on our own descriptor.
        unsafe {
            if libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) != 0 {
                return Err(io::Error::last_os_error());
            }
            let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
            if libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Region::map(fd, len, at)
    }

    /// Maps a region received from the server, whole. Refuses one whose size
    /// could still shrink.
    pub fn open(fd: OwnedFd) -> io::Result<Region> {
        Region::open_at(fd, std::ptr::null_mut())
    }

    /// As [`Region::open`], placed at `at` if that range is free here
    /// (never replacing an existing mapping), else anywhere.
    pub fn open_at(fd: OwnedFd, at: *mut u8) -> io::Result<Region> {
        let len = sealed_len(&fd)?;
        Region::map(fd, len, at)
    }

    /// Maps the first `len` bytes of a file that is no sealed memfd: the
    /// memory a virtual machine shares ([`crate::vm`]), which only the
    /// server and the VM's monitor hold on the host, or that memory as the
    /// guest sees it (a PCI device's BAR).
    pub fn map_file(fd: OwnedFd, len: usize) -> io::Result<Region> {
        Region::map(fd, len, std::ptr::null_mut())
    }

    fn map(fd: OwnedFd, len: usize, at: *mut u8) -> io::Result<Region> {
        Region::map_range(Arc::new(fd), 0, len, at)
    }

    /// Another mapping of `len` bytes at `offset` of this region's file
    /// (page-aligned, inside the region), placed at `at` if that range is
    /// free here: how a VM's pinned blocks are mapped one by one, each where
    /// the peer wants it.
    pub fn view(&self, offset: usize, len: usize, at: *mut u8) -> io::Result<Region> {
        let inside = offset.checked_add(len).is_some_and(|end| end <= self.len);
        if offset % 4096 != 0 || len == 0 || !inside {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a view outside its region"));
        }
        Region::map_range(self.fd.clone(), self.offset + offset, len, at)
    }

    fn map_range(fd: Arc<OwnedFd>, offset: usize, len: usize, at: *mut u8) -> io::Result<Region> {
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let try_map = |flags| {
            // SAFETY: a shared mapping of our own descriptor; with
            // MAP_FIXED_NOREPLACE the kernel refuses to replace anything.
            unsafe { libc::mmap(at.cast(), len, prot, libc::MAP_SHARED | flags, fd.as_raw_fd(), offset as libc::off_t) }
        };
        let mut p = if at.is_null() { libc::MAP_FAILED } else { try_map(libc::MAP_FIXED_NOREPLACE) };
        if p != libc::MAP_FAILED && p != at.cast() {
            // Kernels before 4.17 treat the flag as a hint.
            // SAFETY: the mapping just made, unused.
            unsafe { libc::munmap(p, len) };
            p = libc::MAP_FAILED;
        }
        if p == libc::MAP_FAILED {
            p = try_map(0);
        }
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Region { base: p.cast(), len, fd, offset })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.base
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: trivially a borrow of our own descriptor.
        unsafe { BorrowedFd::borrow_raw(self.fd.as_raw_fd()) }
    }

    /// Where the mapping starts in its file.
    pub fn file_offset(&self) -> usize {
        self.offset
    }
}

/// The length of the memfd `fd`, refused unless it is sealed against
/// shrinking (so that a mapping of it never faults).
fn sealed_len(fd: &OwnedFd) -> io::Result<usize> {
    // SAFETY: plain queries on a live descriptor.
    let (len, seals) = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd.as_raw_fd(), &mut st) != 0 {
            return Err(io::Error::last_os_error());
        }
        (st.st_size as usize, libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS))
    };
    if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "shared region is not sealed against shrinking"));
    }
    Ok(len)
}

impl Region {
    /// Unmaps the region but keeps its addresses taken, by a mapping nobody
    /// may access, so that a pointer to it kept elsewhere (in a captured
    /// graph, say) faults instead of reaching whatever would come next.
    pub fn unmap_leaving_guard(self) {
        let this = std::mem::ManuallyDrop::new(self);
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE;
        // SAFETY: our own mapping, replaced in place; nothing of it is used after.
        let p = unsafe { libc::mmap(this.base.cast(), this.len, libc::PROT_NONE, flags, -1, 0) };
        if p == libc::MAP_FAILED {
            // SAFETY: as in `drop`: without a guard, at least no mapping is left.
            unsafe { libc::munmap(this.base.cast(), this.len) };
        }
        // SAFETY: read once from a value that is never dropped: the descriptor closes here.
        drop(unsafe { std::ptr::read(&this.fd) });
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: our own mapping, made in `map`.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// Addresses taken for a region that is not there yet (nothing may access
/// them), so that the peer can be asked to map its side at the same place
/// first; released when dropped unless filled.
pub struct Reservation {
    base: *mut u8,
    len: usize,
}

impl Reservation {
    pub fn new(len: usize) -> io::Result<Reservation> {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        // SAFETY: a new anonymous mapping that nobody may access.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_NONE, flags, -1, 0) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Reservation { base: p.cast(), len })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.base
    }

    /// Maps the region received as `fd` (sealed, as long as the
    /// reservation) in the reservation's place, in one step: no other
    /// mapping can take the addresses between.
    pub fn fill(self, fd: OwnedFd) -> io::Result<Region> {
        if sealed_len(&fd)? != self.len {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "the region is not as long as its reservation"));
        }
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: MAP_FIXED replaces only this reservation's own mapping.
        let p = unsafe {
            libc::mmap(self.base.cast(), self.len, prot, libc::MAP_SHARED | libc::MAP_FIXED, fd.as_raw_fd(), 0)
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let this = std::mem::ManuallyDrop::new(self);
        Ok(Region { base: this.base, len: this.len, fd: Arc::new(fd), offset: 0 })
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // SAFETY: our own mapping, made in `new`.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

// SAFETY: a range of addresses, touched by no one through this value.
unsafe impl Send for Reservation {}

/// How a connection's region is laid out: a page of counters, the two
/// rings, then the staging area. The server chooses; the guest checks that
/// the region it was given is large enough.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub ring_bytes: usize,
    pub staging_bytes: usize,
}

const CONTROL_BYTES: usize = 4096;

impl Layout {
    pub const fn total(&self) -> usize {
        CONTROL_BYTES + 2 * self.ring_bytes + self.staging_bytes
    }

    pub fn staging_offset(&self) -> usize {
        CONTROL_BYTES + 2 * self.ring_bytes
    }

    /// A sane layout: power-of-two rings of 64 KiB to 64 MiB, page-aligned
    /// staging.
    pub fn check(&self, region_len: usize) -> Result<(), TransportError> {
        let ring_ok = self.ring_bytes.is_power_of_two() && (64 << 10..=64 << 20).contains(&self.ring_bytes);
        if !ring_ok || self.staging_bytes & 4095 != 0 || self.total() > region_len {
            return Err(TransportError::Shared(format!("bad shared layout {self:?} for {region_len} bytes")));
        }
        Ok(())
    }
}

/// One ring's shared counters, each on its own cache line.
#[repr(C)]
struct RingControl {
    head: Line<AtomicU64>,
    tail: Line<AtomicU64>,
    /// Bumped (and futex-woken) when bytes arrive, if the reader sleeps.
    data_bell: Line<AtomicU32>,
    reader_sleeps: Line<AtomicU32>,
    /// Bumped when space frees, if the writer sleeps.
    space_bell: Line<AtomicU32>,
    writer_sleeps: Line<AtomicU32>,
}

#[repr(C, align(64))]
struct Line<T>(T);

const _: () = assert!(2 * std::mem::size_of::<RingControl>() <= CONTROL_BYTES);

/// Which way a ring runs, and so which end of it each side holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Server,
    Client,
}

/// Both ends of the connection's rings for one side: it writes one ring and
/// reads the other.
pub struct Rings {
    pub(crate) writer: Writer,
    pub(crate) reader: Reader,
    side: Side,
    /// The server's wake-up on the guest's hang-up, once watched.
    hangup: Option<HangupBell>,
    /// Keeps the mapping alive as long as the rings.
    region: std::sync::Arc<Region>,
}

impl Rings {
    /// The rings of `region` as seen from `side`.
    pub fn new(region: std::sync::Arc<Region>, layout: Layout, side: Side) -> Result<Rings, TransportError> {
        Rings::at(region, 0, layout, side)
    }

    /// The rings laid out from byte `offset` of `region` (a VM's slot).
    pub fn at(
        region: std::sync::Arc<Region>,
        offset: usize,
        layout: Layout,
        side: Side,
    ) -> Result<Rings, TransportError> {
        layout.check(region.len().saturating_sub(offset))?;
        // SAFETY: `offset` is inside the region (the check above leaves room
        // for the whole layout after it).
        let base = unsafe { region.as_ptr().add(offset) };
        let cap = layout.ring_bytes as u64;
        let end = |i: usize, adaptive: bool| RingEnd {
            // SAFETY: both control blocks lie in the first page (checked
            // statically) and the region is at least a page (layout check).
            ctl: unsafe { base.add(i * std::mem::size_of::<RingControl>()) }.cast::<RingControl>(),
            // SAFETY: the layout check keeps both rings inside the region.
            data: unsafe { base.add(CONTROL_BYTES + i * layout.ring_bytes) },
            cap,
            pos: 0,
            wait: Wait {
                spin: Cell::new({
                    let mut spin = SpinBudget::fixed(SPIN);
                    if adaptive {
                        spin.adapt();
                    }
                    spin
                }),
                watch: Watch::None,
                futex: true,
                patience: None,
            },
        };
        let (out, inn) = match side {
            Side::Client => (0, 1),
            Side::Server => (1, 0),
        };
        let replies = side == Side::Client;
        Ok(Rings {
            writer: Writer::new(end(out, false)),
            reader: Reader::new(end(inn, replies)),
            side,
            hangup: None,
            region,
        })
    }

    /// Takes up rings another process of this side used: from the
    /// positions it published, past what it read and wrote.
    pub(crate) fn resume(&mut self) {
        let head = self.writer.end.ctl().head.0.load(SeqCst);
        self.writer.end.pos = head;
        self.writer.seen_tail = self.writer.end.ctl().tail.0.load(SeqCst);
        let tail = self.reader.end.ctl().tail.0.load(SeqCst);
        self.reader.end.pos = tail;
        self.reader.seen_head = tail;
    }

    /// Peer liveness is checked on `socket` while sleeping. The server's
    /// sleepers are also woken the moment the guest hangs up, so that the
    /// session, and with it the guest's worker and GPU memory, ends as soon
    /// as the guest does; a guest notices a vanished server at its next nap.
    ///
    /// `socket` must stay open as long as the rings.
    pub(crate) fn watch(&mut self, socket: RawFd) {
        let said = Arc::new(AtomicBool::new(false));
        self.writer.end.wait.watch = Watch::Socket { socket, said: said.clone() };
        self.reader.end.wait.watch = Watch::Socket { socket, said: said.clone() };
        if self.side == Side::Server && self.hangup.is_none() {
            let controls = [self.writer.end.ctl, self.reader.end.ctl];
            let bells = Bells { controls, hung_up: said, _region: self.region.clone() };
            // Without it a sleeper still notices the hang-up, a nap later.
            self.hangup = HangupBell::start(socket, bells).ok();
        }
    }

    /// A peer in another kernel (a virtual machine and its host): no futex
    /// reaches it, so a sleeper naps and looks again; the peer is gone
    /// once it says so (`closed`) or its heartbeat (`beat`) stops.
    ///
    /// # Safety
    /// Both point into memory that outlives the rings.
    pub(crate) unsafe fn watch_across(&mut self, closed: *const AtomicU32, beat: *const AtomicU64) {
        for wait in [&mut self.writer.end.wait, &mut self.reader.end.wait] {
            wait.watch = Watch::Beat { closed, beat, seen: Cell::new((u64::MAX, Instant::now())) };
            wait.futex = false;
        }
    }

    /// How long the reader waits for a byte before giving up on the peer.
    pub(crate) fn set_patience(&mut self, patience: Option<Duration>) {
        self.reader.end.wait.patience = patience;
    }

    /// The reader's waits adapt from now on, as a guest's wait for replies
    /// does: for a server's session, whose guest's next call often follows
    /// its last by a GPU step's time.
    pub(crate) fn spin_adaptively(&mut self) {
        self.reader.end.wait.learn(SpinBudget::adapt);
    }

    #[cfg(test)]
    pub(crate) fn reader_adapts(&self) -> bool {
        self.reader.end.wait.spin.get().is_adaptive()
    }
}

/// How long a side spins before sleeping. Long enough to cover a round
/// trip of back-to-back calls and a short GPU operation, short enough that
/// an idle peer costs nothing noticeable.
const SPIN: Duration = Duration::from_micros(100);
/// How often a sleeper checks that the peer is alive.
const NAP: Duration = Duration::from_millis(20);
/// Across a VM boundary a sleeper polls, from this nap doubling up to
/// [`POLL_MAX`]: the first looks cost little next to a guest's call, the
/// last bound what an idle connection costs.
const POLL_MIN: Duration = Duration::from_micros(20);
const POLL_MAX: Duration = Duration::from_millis(2);
/// A peer across a VM boundary whose heartbeat stood still this long is
/// gone (its process or its whole VM): many of [`crate::vm::BEAT`], so
/// that a busy guest's late beat is not taken for its end.
pub const PEER_SILENCE: Duration = Duration::from_secs(10);

pub(crate) struct RingEnd {
    ctl: *const RingControl,
    data: *mut u8,
    cap: u64,
    /// This side's own position (head for a writer, tail for a reader),
    /// never read back from shared memory.
    pos: u64,
    wait: Wait,
}

// SAFETY: the pointers are into a region kept alive by `Rings`; one thread
// at a time uses an end (the carrier is `&mut`).
unsafe impl Send for RingEnd {}

impl RingEnd {
    fn ctl(&self) -> &RingControl {
        // SAFETY: points into the live mapping; all fields are atomics.
        unsafe { &*self.ctl }
    }

    /// Copies between the ring at position `at` and `buf`, across the wrap.
    fn copy(&self, at: u64, len: usize, mut f: impl FnMut(*mut u8, usize, usize)) {
        let start = (at % self.cap) as usize;
        let first = len.min(self.cap as usize - start);
        // SAFETY: `start + first <= cap`, inside this ring's bytes.
        f(unsafe { self.data.add(start) }, 0, first);
        if first < len {
            f(self.data, first, len - first);
        }
    }
}

pub(crate) struct Writer {
    end: RingEnd,
    /// The reader's position as last seen: re-read from shared memory only
    /// when it no longer leaves room, so that the counter's cache line does
    /// not bounce between the two cores on every frame.
    seen_tail: u64,
}

pub(crate) struct Reader {
    end: RingEnd,
    /// The writer's position as last seen (as `seen_tail`).
    seen_head: u64,
    /// Small reads are served from here, filled with whatever the ring
    /// holds, so a frame's header and payload cost one publication.
    local: Box<[u8]>,
    filled: usize,
    taken: usize,
}

/// A large frame is published to the reader in pieces of this many bytes,
/// so that it copies each piece out while the next one is written instead
/// of waiting for a whole ring's worth.
const PUBLISH_BYTES: usize = 256 << 10;

/// Reads this small go through the local buffer.
const LOCAL_READ: usize = 4096;
const LOCAL_BYTES: usize = 256 << 10;

impl Writer {
    fn new(end: RingEnd) -> Writer {
        Writer { end, seen_tail: 0 }
    }

    /// Writes all of `parts` as one stream of bytes, waiting for space as
    /// the reader drains, and tells the reader once everything that fits
    /// is in, or every [`PUBLISH_BYTES`] of a large frame.
    pub(crate) fn write_all(&mut self, parts: &[&[u8]]) -> Result<(), TransportError> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let (mut part, mut offset, mut left) = (0, 0, total);
        while left > 0 {
            let free = self.free(left.min(PUBLISH_BYTES))?;
            let mut n = free.min(left).min(PUBLISH_BYTES);
            left -= n;
            while n > 0 {
                let bytes = &parts[part][offset..];
                let k = bytes.len().min(n);
                self.end.copy(self.end.pos, k, |ring, off, len| {
                    // SAFETY: `ring` has room for `len` bytes (see `copy`);
                    // `bytes` has `off + len`.
                    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr().add(off), ring, len) }
                });
                self.end.pos += k as u64;
                n -= k;
                offset += k;
                if offset == parts[part].len() {
                    part += 1;
                    offset = 0;
                }
            }
            let ctl = self.end.ctl();
            ctl.head.0.store(self.end.pos, SeqCst);
            ring(&ctl.data_bell.0, &ctl.reader_sleeps.0);
        }
        Ok(())
    }

    /// Free bytes, waiting for at least one; the shared tail is read only
    /// when the last one seen leaves less than `want`.
    fn free(&mut self, want: usize) -> Result<usize, TransportError> {
        let e = &self.end;
        let cached = e.cap - e.pos.wrapping_sub(self.seen_tail).min(e.cap);
        if cached as usize >= want {
            return Ok(cached as usize);
        }
        let mut seen = self.seen_tail;
        let free = e.wait.until(&e.ctl().space_bell.0, &e.ctl().writer_sleeps.0, || {
            let tail = e.ctl().tail.0.load(SeqCst);
            let used = e.pos.wrapping_sub(tail);
            if used > e.cap {
                return Err(TransportError::Shared("peer moved the ring's tail past its head".into()));
            }
            seen = tail;
            Ok((e.cap - used) as usize)
        });
        self.seen_tail = seen;
        free
    }
}

impl Reader {
    fn new(end: RingEnd) -> Reader {
        Reader { end, seen_head: 0, local: vec![0; LOCAL_BYTES].into_boxed_slice(), filled: 0, taken: 0 }
    }

    /// Copies what the ring holds (at least one byte, at most `max`) into
    /// `out`, waiting for it.
    fn take(&mut self, out: *mut u8, max: usize) -> Result<usize, TransportError> {
        let e = &self.end;
        let mut avail = self.seen_head.wrapping_sub(e.pos) as usize;
        if avail == 0 {
            let mut seen = self.seen_head;
            avail = e.wait.until(&e.ctl().data_bell.0, &e.ctl().reader_sleeps.0, || {
                let head = e.ctl().head.0.load(SeqCst);
                let avail = head.wrapping_sub(e.pos);
                if avail > e.cap {
                    return Err(TransportError::Shared("peer moved the ring's head past its capacity".into()));
                }
                seen = head;
                Ok(avail as usize)
            })?;
            self.seen_head = seen;
        }
        let n = avail.min(max);
        e.copy(e.pos, n, |ring, off, len| {
            // SAFETY: `ring` holds `len` readable bytes; `out` has room for
            // `off + len <= max`.
            unsafe { std::ptr::copy_nonoverlapping(ring, out.add(off), len) }
        });
        self.end.pos += n as u64;
        let ctl = self.end.ctl();
        ctl.tail.0.store(self.end.pos, SeqCst);
        ring(&ctl.space_bell.0, &ctl.writer_sleeps.0);
        Ok(n)
    }

    /// Whether bytes are waiting, here or in the ring.
    pub(crate) fn has_bytes(&self) -> bool {
        self.taken < self.filled || self.seen_head != self.end.pos || self.end.ctl().head.0.load(SeqCst) != self.end.pos
    }

    fn read_some(&mut self, buf: &mut [u8]) -> Result<usize, TransportError> {
        if self.taken == self.filled && buf.len() >= LOCAL_READ {
            return self.take(buf.as_mut_ptr(), buf.len());
        }
        if self.taken == self.filled {
            let local = self.local.as_mut_ptr();
            self.filled = self.take(local, LOCAL_BYTES)?;
            self.taken = 0;
        }
        let n = buf.len().min(self.filled - self.taken);
        buf[..n].copy_from_slice(&self.local[self.taken..self.taken + n]);
        self.taken += n;
        Ok(n)
    }
}

/// Frames are parsed from the ring exactly as from a socket.
impl Read for Reader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.read_some(buf).map_err(|e| match e {
            TransportError::Closed => io::ErrorKind::ConnectionReset.into(),
            TransportError::TimedOut(_) => io::ErrorKind::TimedOut.into(),
            TransportError::Io(e) => e,
            other => io::Error::new(io::ErrorKind::InvalidData, other.to_string()),
        })
    }
}

/// Wakes the other side if it sleeps on `bell`.
fn ring(bell: &AtomicU32, sleeps: &AtomicU32) {
    if sleeps.load(SeqCst) != 0 {
        bell.fetch_add(1, SeqCst);
        futex(bell, libc::FUTEX_WAKE, 1, None);
    }
}

/// Both rings' bells of one side, rung together.
struct Bells {
    controls: [*const RingControl; 2],
    /// Raised before the bells ring, for a side that was spinning then.
    hung_up: Arc<AtomicBool>,
    /// Keeps the controls mapped.
    _region: Arc<Region>,
}

// SAFETY: the controls are atomics in a mapping this value keeps alive.
unsafe impl Send for Bells {}

impl Bells {
    /// Wakes every sleeper of either ring: each then looks at its ring and
    /// at its peer.
    fn ring_all(&self) {
        self.hung_up.store(true, SeqCst);
        for ctl in self.controls {
            // SAFETY: points into the mapping `_region` keeps alive.
            let ctl = unsafe { &*ctl };
            for bell in [&ctl.data_bell.0, &ctl.space_bell.0] {
                bell.fetch_add(1, SeqCst);
                futex(bell, libc::FUTEX_WAKE, i32::MAX as u32, None);
            }
        }
    }
}

/// A thread that waits in `poll` for the peer to hang up and then rings
/// the bells; stopped through an eventfd when the rings go first.
struct HangupBell {
    stop: OwnedFd,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HangupBell {
    fn start(socket: RawFd, bells: Bells) -> io::Result<HangupBell> {
        // SAFETY: creates a new descriptor, owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: just created and owned by nobody else.
        let stop = unsafe { OwnedFd::from_raw_fd(fd) };
        let stopped = stop.as_raw_fd();
        let thread = std::thread::Builder::new().name("gpuplex-hangup".into()).spawn(move || {
            let mut fds = [
                libc::pollfd { fd: socket, events: libc::POLLRDHUP, revents: 0 },
                libc::pollfd { fd: stopped, events: libc::POLLIN, revents: 0 },
            ];
            // SAFETY: two valid pollfds; both descriptors outlive this thread
            // (the socket by `watch`'s contract, `stop` by `Drop` joining first).
            while unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
                if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                    return;
                }
            }
            if fds[1].revents == 0 {
                bells.ring_all();
            }
        })?;
        Ok(HangupBell { stop, thread: Some(thread) })
    }
}

impl Drop for HangupBell {
    fn drop(&mut self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a local to our own eventfd.
        unsafe { libc::write(self.stop.as_raw_fd(), (&one as *const u64).cast(), 8) };
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// How a sleeping side tells that its peer is gone.
enum Watch {
    None,
    /// The connection's socket, polled for hang-up, and whether a
    /// [`HangupBell`] said the peer hung up.
    Socket {
        socket: RawFd,
        said: Arc<AtomicBool>,
    },
    /// A peer in another kernel: its closed flag and its heartbeat, with the
    /// beat last seen and when it was seen to change.
    Beat {
        closed: *const AtomicU32,
        beat: *const AtomicU64,
        seen: Cell<(u64, Instant)>,
    },
}

impl Watch {
    /// Whether the peer is known to be gone without asking the kernel. A
    /// side that was spinning when the hang-up bell rang would otherwise
    /// sleep a whole nap: it reads the bell after the ring.
    fn said_gone(&self) -> bool {
        matches!(self, Watch::Socket { said, .. } if said.load(SeqCst))
    }

    fn peer_gone(&self) -> bool {
        match self {
            Watch::None => false,
            Watch::Socket { socket, said } => said.load(SeqCst) || hung_up(*socket),
            Watch::Beat { closed, beat, seen } => {
                // SAFETY: `watch_across`'s contract keeps both alive.
                let (closed, beat) = unsafe { ((**closed).load(SeqCst), (**beat).load(SeqCst)) };
                let (last, since) = seen.get();
                if beat != last {
                    seen.set((beat, Instant::now()));
                }
                closed != 0 || (beat == last && since.elapsed() >= PEER_SILENCE)
            }
        }
    }
}

struct Wait {
    /// How long to spin before sleeping: adaptive for the guest's wait for
    /// replies and a session's reader once asked, else [`SPIN`].
    spin: Cell<SpinBudget>,
    /// How a sleeper tells that the peer is gone.
    watch: Watch,
    /// Whether the peer's ring wakes a sleeper (a futex); across a VM
    /// boundary it cannot, and a sleeper polls.
    futex: bool,
    /// How long to wait at most (`None`: as long as the peer lives).
    patience: Option<Duration>,
}

impl Wait {
    fn learn(&self, learn: impl FnOnce(&mut SpinBudget)) {
        let mut spin = self.spin.get();
        learn(&mut spin);
        self.spin.set(spin);
    }

    /// Waits until `ready` returns a non-zero amount: spinning first, then
    /// sleeping on `bell` with `sleeps` raised so the other side rings it.
    fn until(
        &self,
        bell: &AtomicU32,
        sleeps: &AtomicU32,
        mut ready: impl FnMut() -> Result<usize, TransportError>,
    ) -> Result<usize, TransportError> {
        let start = Instant::now();
        let mut turns = 0u32;
        loop {
            let n = ready()?;
            if n > 0 {
                self.learn(SpinBudget::spun);
                return Ok(n);
            }
            turns = turns.wrapping_add(1);
            if turns & 63 == 0 {
                let spun = start.elapsed();
                if spun >= self.spin.get().now() {
                    break;
                }
                if spun >= POLITE_AFTER {
                    std::thread::yield_now();
                }
            }
            std::hint::spin_loop();
        }
        let mut poll = POLL_MIN;
        loop {
            sleeps.store(1, SeqCst);
            let seen = bell.load(SeqCst);
            let n = ready()?;
            if n == 0 && !self.watch.said_gone() {
                if self.futex {
                    futex(bell, libc::FUTEX_WAIT, seen, Some(NAP));
                } else {
                    std::thread::sleep(poll);
                    poll = (poll * 2).min(POLL_MAX);
                }
            }
            sleeps.store(0, SeqCst);
            let n = if n == 0 { ready()? } else { n };
            if n > 0 {
                self.learn(|spin| spin.slept(start.elapsed()));
                return Ok(n);
            }
            if self.watch.peer_gone() {
                return Err(TransportError::Closed);
            }
            if let Some(patience) = self.patience.filter(|&p| start.elapsed() >= p) {
                return Err(TransportError::TimedOut(Some(patience)));
            }
        }
    }
}

/// Sleeps while `word` holds `expected`, at most `timeout`, where `word` may
/// be in memory another process maps (a spurious return is possible).
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    futex(word, libc::FUTEX_WAIT, expected, Some(timeout));
}

/// Wakes every thread, of any process, sleeping in [`futex_wait`] on `word`.
pub fn futex_wake_all(word: &AtomicU32) {
    futex(word, libc::FUTEX_WAKE, i32::MAX as u32, None);
}

/// The runs `(start, length)` where `a` and `b` differ: what one side of a
/// mirror kept in shared memory changed since both sides last agreed.
pub fn differing_runs(a: &[u8], b: &[u8]) -> Vec<(usize, usize)> {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut runs = Vec::new();
    if a == b {
        return runs;
    }
    // Equal words are passed a word at a time: this runs on every call that
    // reaches the device, and mirrors mostly differ in a few bytes.
    let words = n / 8 * 8;
    let pairs = a[..words].chunks_exact(8).zip(b[..words].chunks_exact(8));
    let word = |x: &[u8]| u64::from_ne_bytes(x.try_into().expect("chunks of 8"));
    for (w, (x, y)) in pairs.enumerate() {
        if word(x) != word(y) {
            (w * 8..w * 8 + 8).filter(|&i| a[i] != b[i]).for_each(|i| extend_runs(&mut runs, i));
        }
    }
    (words..n).filter(|&i| a[i] != b[i]).for_each(|i| extend_runs(&mut runs, i));
    runs
}

/// Adds byte `i`, the next differing one, to `runs`.
fn extend_runs(runs: &mut Vec<(usize, usize)>, i: usize) {
    match runs.last_mut() {
        Some((start, len)) if *start + *len == i => *len += 1,
        _ => runs.push((i, 1)),
    }
}

/// `runs` (in order, as [`differing_runs`] gives them) with those at most
/// `gap` bytes apart joined into one, equal bytes and all.
pub fn joined(runs: Vec<(usize, usize)>, gap: usize) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(runs.len());
    for (start, n) in runs {
        match out.last_mut() {
            Some((first, len)) if start - (*first + *len) <= gap => *len = start + n - *first,
            _ => out.push((start, n)),
        }
    }
    out
}

/// Takes into `ours` what the other side of a mirror changed (`theirs`
/// against `agreed`, what both last agreed on), byte by byte, wherever
/// `ours` has not changed that byte too; `agreed` becomes `theirs`. Returns
/// the runs `(start, length)` of `ours` that took something.
pub fn take_changes(agreed: &mut [u8], theirs: &[u8], ours: &mut [u8]) -> Vec<(usize, usize)> {
    let mut taken = Vec::new();
    for (start, n) in differing_runs(agreed, theirs) {
        let mut took = false;
        for i in start..start + n {
            if ours[i] == agreed[i] {
                ours[i] = theirs[i];
                took = true;
            }
            agreed[i] = theirs[i];
        }
        if took {
            taken.push((start, n));
        }
    }
    taken
}

fn futex(word: &AtomicU32, op: libc::c_int, value: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|t| libc::timespec { tv_sec: t.as_secs() as _, tv_nsec: t.subsec_nanos() as _ });
    let ts_ptr = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a live, aligned u32 in memory shared between the
    // processes (hence no FUTEX_PRIVATE_FLAG); the timeout outlives the call.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), op, value, ts_ptr, 0usize, 0u32) };
}

/// Whether the peer closed `socket` (pending data is not a hang-up).
fn hung_up(socket: RawFd) -> bool {
    let mut p = libc::pollfd { fd: socket, events: libc::POLLRDHUP, revents: 0 };
    // SAFETY: one valid pollfd; zero timeout.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}

#[cfg(test)]
mod tests {
    /// A reserved place takes the region where it was reserved, sharing
    /// its bytes; a region of another length is refused.
    #[test]
    fn a_reservation_is_filled_in_place() {
        let region = super::Region::create("test", 8192).unwrap();
        let place = super::Reservation::new(8192).unwrap();
        let at = place.as_ptr();
        let filled = place.fill(region.fd().try_clone_to_owned().unwrap()).unwrap();
        assert_eq!(filled.as_ptr(), at);
        // SAFETY: both mappings are 8192 bytes of the same file.
        unsafe {
            region.as_ptr().add(4100).write(7);
            assert_eq!(filled.as_ptr().add(4100).read(), 7);
        }
        let short = super::Reservation::new(4096).unwrap();
        assert!(short.fill(region.fd().try_clone_to_owned().unwrap()).is_err());
    }

    #[test]
    fn near_runs_join() {
        assert_eq!(joined(vec![(0, 3), (4, 3), (8, 3), (40, 1)], 1), vec![(0, 11), (40, 1)]);
        assert_eq!(joined(vec![(0, 3), (4, 3)], 0), vec![(0, 3), (4, 3)]);
        assert!(joined(Vec::new(), 8).is_empty());
    }

    /// A joined run's equal bytes change nothing where it is taken: only
    /// bytes that differ from what both sides agreed on are.
    #[test]
    fn equal_bytes_taken_change_nothing() {
        let mut agreed = *b"aaaaaa";
        let mut ours = *b"aaXaaa";
        // The other side changed bytes 0 and 4; sent as one run 0..5.
        let taken = take_changes(&mut agreed[..5], b"baaab", &mut ours[..5]);
        assert_eq!(&ours, b"baXaba", "byte 2 stays ours: theirs there is what both agreed");
        assert_eq!(taken, vec![(0, 1), (4, 1)]);
    }

    #[test]
    fn take_changes_keeps_both_sides_writes() {
        let mut agreed = *b"aaaaaa";
        let mut ours = *b"aXaaaa";
        let taken = take_changes(&mut agreed, b"bbaaab", &mut ours);
        assert_eq!(&ours, b"bXaaab", "our own write stays, theirs elsewhere is taken");
        assert_eq!(&agreed, b"bbaaab");
        assert_eq!(taken, vec![(0, 2), (5, 1)]);
        assert!(take_changes(&mut agreed, b"bbaaab", &mut ours).is_empty());
    }

    #[test]
    fn differing_runs_find_each_difference() {
        assert!(differing_runs(b"abc", b"abc").is_empty());
        assert_eq!(differing_runs(b"abcdef", b"xbcyzf"), vec![(0, 1), (3, 2)]);
    }

    /// Runs across word boundaries and in the bytes after the last whole
    /// word come out as a byte-by-byte scan finds them.
    #[test]
    fn differing_runs_agree_with_a_scan_of_every_byte() {
        let scan = |a: &[u8], b: &[u8]| {
            let mut runs: Vec<(usize, usize)> = Vec::new();
            for i in (0..a.len().min(b.len())).filter(|&i| a[i] != b[i]) {
                match runs.last_mut() {
                    Some((s, n)) if *s + *n == i => *n += 1,
                    _ => runs.push((i, 1)),
                }
            }
            runs
        };
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for len in [0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 200, 4096 + 3] {
            for _ in 0..50 {
                let a: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                let mut b = a.clone();
                // A few runs of changed bytes, some of them long.
                for _ in 0..next() % 4 {
                    let start = (next() % (len as u64 + 1)) as usize;
                    let end = (start + (next() % 20) as usize).min(len);
                    b[start..end].iter_mut().for_each(|x| *x = !*x);
                }
                let cut = len - (next() % 3) as usize % (len + 1);
                assert_eq!(differing_runs(&a, &b[..cut]), scan(&a, &b[..cut]), "{len} bytes");
            }
        }
    }

    use super::*;
    use std::os::fd::AsFd;
    use std::sync::Arc;

    const LAYOUT: Layout = Layout { ring_bytes: 64 << 10, staging_bytes: 4096 };

    fn pair() -> (Rings, Rings) {
        let region = Arc::new(Region::create("test", LAYOUT.total()).unwrap());
        let client = Rings::new(region.clone(), LAYOUT, Side::Client).unwrap();
        let server = Rings::new(region, LAYOUT, Side::Server).unwrap();
        (client, server)
    }

    #[test]
    fn bytes_cross_in_order_through_wraps() {
        let (mut client, mut server) = pair();
        let data: Vec<u8> = (0..1_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let expect = data.clone();
        let t = std::thread::spawn(move || client.writer.write_all(&[&data[..10], &data[10..]]).unwrap());
        let mut got = vec![0u8; expect.len()];
        server.reader.read_exact(&mut got).unwrap();
        t.join().unwrap();
        assert_eq!(got, expect);
    }

    #[test]
    fn a_reader_tells_whether_bytes_wait_without_taking_them() {
        let (mut client, mut server) = pair();
        assert!(!server.reader.has_bytes());
        client.writer.write_all(&[b"two frames"]).unwrap();
        assert!(server.reader.has_bytes(), "bytes in the ring");
        let mut four = [0u8; 4];
        server.reader.read_exact(&mut four).unwrap();
        assert!(server.reader.has_bytes(), "bytes taken into the local buffer, not yet read");
        let mut rest = [0u8; 6];
        server.reader.read_exact(&mut rest).unwrap();
        assert_eq!((&four, &rest), (b"two ", b"frames"));
        assert!(!server.reader.has_bytes());
    }

    #[test]
    fn a_lying_peer_is_an_error_not_a_wild_read() {
        let (client, mut server) = pair();
        // The guest claims the server's ring (guest to server) has more
        // bytes than it can hold.
        let guest_to_server = client.writer.end.ctl();
        guest_to_server.head.0.store(10 * LAYOUT.ring_bytes as u64, SeqCst);
        let mut buf = [0u8; 16];
        assert!(matches!(server.reader.read_some(&mut buf), Err(TransportError::Shared(_))));
    }

    #[test]
    fn sealed_regions_cannot_shrink_and_descriptors_travel() {
        let region = Region::create("seal", 8192).unwrap();
        // SAFETY: plain call on a live descriptor.
        let rc = unsafe { libc::ftruncate(region.fd().as_raw_fd(), 0) };
        assert_ne!(rc, 0, "a sealed region must refuse to shrink");
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        crate::fds::send_fd(a.as_fd(), region.fd()).unwrap();
        let other = Region::open(crate::fds::recv_fd(b.as_fd()).unwrap()).unwrap();
        // SAFETY: both map the same 8 KiB.
        unsafe {
            *region.as_ptr().add(100) = 42;
            assert_eq!(*other.as_ptr().add(100), 42);
        }
    }

    #[test]
    fn unsealed_memory_is_refused() {
        let name = std::ffi::CString::new("plain").unwrap();
        // SAFETY: a valid C string.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        // SAFETY: a new descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain call on our descriptor.
        unsafe { libc::ftruncate(fd.as_raw_fd(), 4096) };
        assert!(Region::open(fd).is_err());
    }

    #[test]
    fn a_guest_spins_longer_for_replies_that_came_soon_after_it_slept() {
        use crate::SPIN_MAX;
        let (mut client, mut server) = pair();
        let t = std::thread::spawn(move || {
            let mut got = [0u8; 4];
            server.reader.read_exact(&mut got).unwrap();
            std::thread::sleep(Duration::from_millis(2));
            server.writer.write_all(&[b"late"]).unwrap();
            server
        });
        // The reply comes 2 ms late, so the guest's wait for it sleeps.
        let start = Instant::now();
        client.writer.write_all(&[b"call"]).unwrap();
        let mut got = [0u8; 4];
        client.reader.read_exact(&mut got).unwrap();
        let waited = start.elapsed();
        let server = t.join().unwrap();
        let spin = client.reader.end.wait.spin.get().now();
        // (A machine so loaded that 2 ms took over 10 ms rightly resets it.)
        if waited <= SPIN_MAX {
            assert!(spin >= Duration::from_millis(3) && spin <= SPIN_MAX, "{spin:?} after {waited:?}");
        }
        // The server's ends adapt only once asked to (a session's reader),
        // and writers never do.
        assert_eq!(server.reader.end.wait.spin.get().now(), SPIN);
        assert_eq!(client.writer.end.wait.spin.get().now(), SPIN);
        let mut server = server;
        server.spin_adaptively();
        server.reader.end.wait.learn(|s| s.slept(Duration::from_millis(2)));
        assert_eq!(server.reader.end.wait.spin.get().now(), Duration::from_millis(3));
        // One wait too long to spin through keeps the spin; two in a row
        // go back to the short spin.
        let wait = &client.reader.end.wait;
        wait.learn(|s| s.slept(Duration::from_millis(2)));
        wait.learn(|s| s.slept(SPIN_MAX * 2));
        assert_eq!(wait.spin.get().now(), Duration::from_millis(3));
        wait.learn(|s| s.slept(SPIN_MAX * 2));
        assert_eq!(wait.spin.get().now(), SPIN);
        wait.learn(|s| s.slept(Duration::from_millis(1)));
        assert_eq!(wait.spin.get().now(), Duration::from_micros(1500));
    }

    /// The server's sleepers are woken by the guest's hang-up itself, not
    /// at their next nap: the bells move though no one wrote a byte. Rings
    /// dropped while the peer is still there stop their watch.
    #[test]
    fn a_hang_up_rings_the_servers_bells() {
        let (_client, mut server) = pair();
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        server.watch(a.as_raw_fd());
        let bell = |rings: &Rings| rings.reader.end.ctl().data_bell.0.load(SeqCst);
        let before = bell(&server);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(bell(&server), before, "rung with the peer still there");
        let reader = std::thread::spawn(move || {
            let got = server.reader.read_some(&mut [0u8; 4]);
            (got, server)
        });
        drop(b);
        let (got, server) = reader.join().unwrap();
        assert!(matches!(got, Err(TransportError::Closed)), "{got:?}");
        assert!(bell(&server) != before, "the hang-up did not ring the reader's bell");
        drop(server);

        // A side that was busy when the bell rang does not then sleep a nap.
        let (_client, mut server) = pair();
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        server.watch(a.as_raw_fd());
        let before = bell(&server);
        drop(b);
        let rung = Instant::now();
        while bell(&server) == before {
            assert!(rung.elapsed() < Duration::from_secs(10), "the hang-up never rang the bell");
            std::thread::sleep(Duration::from_millis(1));
        }
        let start = Instant::now();
        let got = server.reader.read_some(&mut [0u8; 4]);
        assert!(matches!(got, Err(TransportError::Closed)), "{got:?}");
        assert!(start.elapsed() < NAP, "slept {:?} after the bell rang", start.elapsed());

        let (_client, mut server) = pair();
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        server.watch(a.as_raw_fd());
        drop(server);
    }

    #[test]
    fn sleeping_reader_wakes_and_sees_hang_up() {
        let (mut client, mut server) = pair();
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        server.watch(a.as_raw_fd());
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            client.writer.write_all(&[b"late"]).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            drop(b);
        });
        let mut got = [0u8; 4];
        server.reader.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"late");
        assert!(matches!(server.reader.read_some(&mut got), Err(TransportError::Closed)));
        t.join().unwrap();
    }
}
