//! The VM carrier: a guest in a virtual machine reaches the server through
//! memory the VM shares with the host, with no network and no NVIDIA driver
//! in the guest.
//!
//! The server makes a file (`vm:PATH`), which the VM's monitor gives the VM
//! as a PCI device (QEMU: `-object memory-backend-file,id=gpuplex,share=on,
//! mem-path=PATH,size=64M -device ivshmem-plain,memdev=gpuplex`); a guest
//! maps the device's memory BAR from user space (sysfs `resource2`), no
//! kernel module needed. A test maps the same file on the host.
//!
//! The file holds a header and [`SLOTS`] connection slots. A guest process
//! claims a free slot (compare-and-swap on its state) and then speaks in
//! the slot's rings exactly as a local guest speaks in its shared-memory
//! rings ([`crate::shm`]); the server's listener finds claimed slots by
//! looking. Across the VM boundary no futex wakes a sleeper and no socket
//! tells that the peer is gone: sleepers poll, each side beats a heartbeat
//! in the slot every [`BEAT`], and says when it leaves. The server frees a
//! slot once both sides have left, by saying so or by falling silent (a
//! killed worker, or a guest process, says nothing).
//!
//! After the slots comes the *heap*, the rest of the region, in chunks a
//! guest process claims for its pinned host memory and its staging area
//! (a word per chunk names the slot that holds it; [`Heap`]). The server
//! maps each block it is told of where the guest has it, when that address
//! is free, and registers it with the driver: the GPU reads and writes the
//! guest's pages directly, and one pointer serves guest and device.
//!
//! Everything in the file is the guest's to write. The server never reads
//! the header back, keeps its own record of which slots it serves, and the
//! rings keep each side's position privately, so a guest scribbling there
//! can fail only its own connections. All slots of a file belong to one
//! VM, which is one tenant: its processes can disturb each other's slots,
//! as they can each other's memory.

use std::fs::OpenOptions;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use gpuplex_protocol::Header;
use zerocopy::IntoBytes;

use crate::shm::{Layout, Region, Rings, Side, PEER_SILENCE};
use crate::{stream, Address, Carrier, Listener, Peer, SocketKind, TransportError};

/// The first bytes of a VM region, so that a guest knows the device it
/// found is gpuplex's.
pub const MAGIC: [u8; 8] = *b"gpuplxvm";
/// The region's layout; a guest refuses any other.
pub const VERSION: u32 = 2;
/// Connections one VM may have open at once.
pub const SLOTS: usize = 16;
/// The bytes of each ring: frames larger than this cross in pieces.
const RING_BYTES: usize = 1 << 20;
/// The header's page, and each slot's control page before its rings.
const PAGE: usize = 4096;
/// How often each side beats its heartbeat.
pub const BEAT: Duration = Duration::from_millis(100);
/// How often the listener looks for claimed slots.
const LOOK: Duration = Duration::from_millis(1);
/// The smallest region: every slot, and no heap.
pub const MIN_REGION: usize = PAGE + SLOTS * slot_bytes();
/// The region a server makes unless told otherwise: the slots and a heap
/// that holds a few hundred MiB of pinned memory, in a power of two (a PCI
/// BAR's size must be one). QEMU's `memory-backend-file` takes `size=1G`.
pub const DEFAULT_REGION: usize = 1 << 30;
/// The heap's unit of allocation.
pub const CHUNK: usize = 64 << 10;
/// The heap starts on a boundary of this, so that the host may back it
/// with huge pages.
const HEAP_ALIGN: usize = 2 << 20;

/// A slot's states: free, claimed by a guest (its first frame may be in
/// the rings), served.
const FREE: u32 = 0;
const CLAIMED: u32 = 1;
const OPEN: u32 = 2;

#[repr(C)]
#[derive(PartialEq, Eq)]
struct RegionHeader {
    magic: [u8; 8],
    version: u32,
    slots: u32,
    slot_bytes: u64,
    ring_bytes: u64,
    chunk_bytes: u64,
    /// Where the chunks' owner words start, and the chunks themselves.
    map_offset: u64,
    heap_offset: u64,
    chunks: u64,
}

impl RegionHeader {
    /// What a region of `len` bytes holds: both sides derive it from the
    /// length alone, and a guest checks that the header says the same.
    fn of(len: usize) -> RegionHeader {
        let map = MIN_REGION;
        let heap = |chunks: usize| (map + 4 * chunks).next_multiple_of(HEAP_ALIGN);
        let mut chunks = len.saturating_sub(map) / (CHUNK + 4);
        while chunks > 0 && heap(chunks) + chunks * CHUNK > len {
            chunks -= 1;
        }
        RegionHeader {
            magic: MAGIC,
            version: VERSION,
            slots: SLOTS as u32,
            slot_bytes: slot_bytes() as u64,
            ring_bytes: RING_BYTES as u64,
            chunk_bytes: CHUNK as u64,
            map_offset: map as u64,
            heap_offset: heap(chunks) as u64,
            chunks: chunks as u64,
        }
    }
}

/// A slot's shared words, each side writing only its own (but the state,
/// which the guest claims and the server frees).
#[repr(C)]
struct SlotControl {
    state: AtomicU32,
    /// The guest's process id, as it says (for the server's logs and status).
    guest_pid: AtomicU32,
    guest_closed: AtomicU32,
    server_closed: AtomicU32,
    guest_beat: AtomicU64,
    server_beat: AtomicU64,
}

const fn slot_bytes() -> usize {
    PAGE + layout().total()
}

const fn layout() -> Layout {
    Layout { ring_bytes: RING_BYTES, staging_bytes: 0 }
}

fn slot_offset(slot: usize) -> usize {
    PAGE + slot * slot_bytes()
}

/// Slot `slot`'s control words.
fn control(region: &Region, slot: usize) -> &SlotControl {
    // SAFETY: the slot lies inside the region (checked when it was mapped);
    // its first page holds only atomics, for which any bytes are valid.
    unsafe { &*region.as_ptr().add(slot_offset(slot)).cast::<SlotControl>() }
}

/// Opens and maps a region file, whole.
fn map(path: &Path, create: Option<usize>) -> Result<Arc<Region>, TransportError> {
    let mut options = OpenOptions::new();
    options.read(true).write(true);
    if create.is_some() {
        // Never through a link someone else placed where the file goes.
        options.create(true).mode(0o600).custom_flags(libc::O_NOFOLLOW);
    }
    let file = options.open(path)?;
    if let Some(len) = create {
        file.set_len(len as u64)?;
    }
    // A sysfs resource file reports its BAR's size.
    let len = file.metadata()?.len() as usize;
    if len < MIN_REGION {
        return Err(TransportError::Shared(format!(
            "{}: {len} bytes, less than the {MIN_REGION} a VM region takes",
            path.display()
        )));
    }
    Ok(Arc::new(Region::map_file(OwnedFd::from(file), len)?))
}

/// QEMU's `ivshmem-plain` device: Red Hat's vendor id, and its device id.
const IVSHMEM: (&str, &str) = ("0x1af4", "0x1110");

/// The memory BAR of the VM's shared-memory device that holds a gpuplex
/// region (a VM may have other such devices).
fn find_device() -> Result<PathBuf, TransportError> {
    let devices = std::fs::read_dir("/sys/bus/pci/devices")?;
    for device in devices.flatten().map(|d| d.path()) {
        let id = |what| std::fs::read_to_string(device.join(what)).map(|s| s.trim().to_owned()).unwrap_or_default();
        if (id("vendor").as_str(), id("device").as_str()) != IVSHMEM {
            continue;
        }
        let bar = device.join("resource2");
        let mut magic = [0u8; 8];
        let mapped = map_magic(&bar, &mut magic);
        if mapped.is_ok() && magic == MAGIC {
            return Ok(bar);
        }
    }
    Err(TransportError::Shared("no gpuplex shared-memory device in this VM (QEMU: -device ivshmem-plain)".into()))
}

/// The first bytes of a device's memory (a BAR is mapped, not read).
fn map_magic(bar: &Path, magic: &mut [u8; 8]) -> Result<(), TransportError> {
    let file = OpenOptions::new().read(true).write(true).open(bar)?;
    let len = file.metadata()?.len() as usize;
    if len < PAGE {
        return Err(TransportError::Shared("a device too small".into()));
    }
    let region = Region::map_file(OwnedFd::from(file), PAGE)?;
    // SAFETY: the mapping holds a page.
    magic.copy_from_slice(unsafe { std::slice::from_raw_parts(region.as_ptr(), 8) });
    Ok(())
}

/// The server's side of a VM region: it hands out slots guests claimed.
pub struct VmListener {
    path: PathBuf,
    region: Arc<Region>,
    /// Which slots the server serves (its own record, never the guest's),
    /// and for each the guest's and the server's side's beats.
    served: Mutex<[Option<[Pulse; 2]>; SLOTS]>,
    /// How long a side's beat may stand still before it counts as gone.
    silence: Duration,
}

impl VmListener {
    /// Makes (or remakes) the region file at `path`, `len` bytes, every
    /// slot free. Guests of an earlier server's region start over.
    pub fn create(path: &Path, len: usize) -> Result<VmListener, TransportError> {
        let region = map(path, Some(len))?;
        // SAFETY: the header page lies inside the region.
        unsafe { std::ptr::write_bytes(region.as_ptr(), 0, MIN_REGION) };
        let header = RegionHeader::of(region.len());
        // Every chunk free (the heap itself is the guests' business).
        // SAFETY: the owner words lie between the slots and the heap.
        unsafe { std::ptr::write_bytes(region.as_ptr().add(MIN_REGION), 0, 4 * header.chunks as usize) };
        // SAFETY: the header fits the first page; nobody reads it but guests.
        unsafe { region.as_ptr().cast::<RegionHeader>().write_unaligned(header) };
        Ok(VmListener { path: path.to_owned(), region, served: Mutex::new([None; SLOTS]), silence: PEER_SILENCE })
    }

    /// Frees slots both sides have left, each by saying so or by falling
    /// silent (a worker killed says nothing); returns a newly claimed slot.
    fn look(&self) -> Option<usize> {
        let mut served = self.served.lock().unwrap_or_else(PoisonError::into_inner);
        for (slot, record) in served.iter_mut().enumerate() {
            let c = control(&self.region, slot);
            match record {
                None if c.state.load(SeqCst) == CLAIMED => {
                    c.state.store(OPEN, SeqCst);
                    *record = Some([Pulse::new(&c.guest_beat), Pulse::new(&c.server_beat)]);
                    return Some(slot);
                }
                Some([guest, server]) => {
                    let guest_gone = guest.gone(&c.guest_closed, &c.guest_beat, self.silence);
                    let server_gone = server.gone(&c.server_closed, &c.server_beat, self.silence);
                    if guest_gone && server_gone {
                        free(&self.region, slot);
                        *record = None;
                    }
                }
                _ => {}
            }
        }
        None
    }
}

/// One side's heartbeat as the listener last saw it change.
#[derive(Clone, Copy)]
struct Pulse {
    beat: u64,
    since: Instant,
}

impl Pulse {
    fn new(beat: &AtomicU64) -> Pulse {
        Pulse { beat: beat.load(SeqCst), since: Instant::now() }
    }

    /// Whether the side said it left, or its beat has not changed for
    /// `silence`.
    fn gone(&mut self, closed: &AtomicU32, beat: &AtomicU64, silence: Duration) -> bool {
        let now = beat.load(SeqCst);
        if now != self.beat {
            *self = Pulse { beat: now, since: Instant::now() };
        }
        closed.load(SeqCst) != 0 || self.since.elapsed() >= silence
    }
}

/// A region file's inode, and its name: `vm:` and the file's name.
fn identity(region: &Region) -> Result<(u64, String), TransportError> {
    // SAFETY: plain query on a descriptor the region owns.
    let inode = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(region.fd().as_raw_fd(), &mut st) != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        st.st_ino
    };
    let link = std::fs::read_link(format!("/proc/self/fd/{}", region.fd().as_raw_fd()))?;
    let file = link.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    Ok((inode, format!("vm:{file}")))
}

/// Makes a slot free again: its rings empty, its words zero, the chunks
/// its guest held free, the state last.
fn free(region: &Region, slot: usize) {
    // SAFETY: the slot's control page and its rings' control page lie inside
    // the region; zero is every word's start.
    unsafe { std::ptr::write_bytes(region.as_ptr().add(slot_offset(slot) + 4), 0, 2 * PAGE - 4) };
    let owner = slot as u32 + 1;
    for word in owners(region) {
        let _ = word.compare_exchange(owner, 0, SeqCst, SeqCst);
    }
    control(region, slot).state.store(FREE, SeqCst);
}

/// The heap's owner words: 0 for a free chunk, else one more than the slot
/// whose guest holds it.
fn owners(region: &Region) -> &[AtomicU32] {
    let shape = RegionHeader::of(region.len());
    // SAFETY: the words lie between the slots and the heap (the shape says
    // so for this length); any bytes are valid atomics.
    unsafe { std::slice::from_raw_parts(region.as_ptr().add(shape.map_offset as usize).cast(), shape.chunks as usize) }
}

/// The heap of a VM's region as one connection sees it: a guest claims
/// chunks in it for its pinned blocks, the server checks and maps what the
/// guest names. The guests of one VM share the heap (they are one tenant).
#[derive(Clone)]
pub struct Heap {
    region: Arc<Region>,
    slot: usize,
    offset: usize,
    chunks: usize,
}

impl Heap {
    fn of(region: Arc<Region>, slot: usize) -> Option<Heap> {
        let shape = RegionHeader::of(region.len());
        let (offset, chunks) = (shape.heap_offset as usize, shape.chunks as usize);
        (chunks > 0).then_some(Heap { region, slot, offset, chunks })
    }

    /// The whole region, mapped.
    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }

    /// Claims `len` bytes of free chunks for this connection; returns their
    /// offset in the region.
    pub fn alloc(&self, len: usize) -> Option<usize> {
        let n = len.div_ceil(CHUNK).max(1);
        let words = owners(&self.region);
        let owner = self.slot as u32 + 1;
        let mut start = 0;
        while start + n <= self.chunks {
            // Skip past the last taken chunk of the window, then try to claim
            // it whole; another process may claim one first, and we move on.
            if let Some(taken) = (start..start + n).rev().find(|&i| words[i].load(SeqCst) != 0) {
                start = taken + 1;
                continue;
            }
            let claimed =
                (start..start + n).take_while(|&i| words[i].compare_exchange(0, owner, SeqCst, SeqCst).is_ok()).count();
            if claimed == n {
                return Some(self.offset + start * CHUNK);
            }
            for word in &words[start..start + claimed] {
                word.store(0, SeqCst);
            }
            start += claimed + 1;
        }
        None
    }

    /// Gives back chunks [`Heap::alloc`] claimed.
    pub fn free(&self, offset: usize, len: usize) {
        let Some(first) = offset.checked_sub(self.offset).map(|o| o / CHUNK) else { return };
        let owner = self.slot as u32 + 1;
        for word in owners(&self.region).iter().skip(first).take(len.div_ceil(CHUNK).max(1)) {
            let _ = word.compare_exchange(owner, 0, SeqCst, SeqCst);
        }
    }

    /// Claims `len` bytes of free chunks for this connection and maps them
    /// (at `at` if that is free here): their offset in the region, and the
    /// mapping. Chunks that cannot be mapped go back.
    pub fn claim(&self, len: usize, at: *mut u8) -> Result<(usize, Region), TransportError> {
        let offset =
            self.alloc(len).ok_or_else(|| TransportError::Shared(format!("no {len} bytes free in the heap")))?;
        self.view(offset, len, at).map(|view| (offset, view)).inspect_err(|_| self.free(offset, len))
    }

    /// A mapping of `len` bytes at `offset`, which must lie in the heap, at
    /// `at` if that is free here.
    pub fn view(&self, offset: usize, len: usize, at: *mut u8) -> Result<Region, TransportError> {
        let end = offset.checked_add(len);
        if offset < self.offset || offset % PAGE != 0 || end.is_none_or(|e| e > self.offset + self.chunks * CHUNK) {
            return Err(TransportError::Shared(format!("{len} bytes at offset {offset:#x} are outside the heap")));
        }
        Ok(self.region.view(offset, len, at)?)
    }
}

impl Listener for VmListener {
    fn accept(&self) -> Result<Box<dyn Carrier>, TransportError> {
        loop {
            if let Some(slot) = self.look() {
                return Ok(Box::new(VmCarrier::attach(self.region.clone(), slot, Side::Server)?));
            }
            std::thread::sleep(LOOK);
        }
    }

    fn address(&self) -> Address {
        Address::Vm(self.path.clone())
    }
}

/// The "guest left" words of the slots this process holds as a guest, set
/// when it exits: a program seldom drops its connection, and without them
/// the server would hold its session until the heartbeat fell silent.
static HELD: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// Run as this library is finalized at exit, after the program's exit
/// handlers: the CUDA runtime's among them still make calls (an `atexit`
/// handler registered at connect would run before them, and end the
/// session under their feet).
#[used]
#[link_section = ".fini_array"]
static LEAVE_AT_EXIT: extern "C" fn() = leave_held;

extern "C" fn leave_held() {
    leave(&HELD.lock().unwrap_or_else(PoisonError::into_inner));
}

/// Sets "left" words.
fn leave(words: &[usize]) {
    for &left in words {
        // SAFETY: a word of a region its carrier keeps mapped while listed.
        unsafe { (*(left as *const AtomicU32)).store(1, SeqCst) };
    }
}

/// One connection in a slot of a VM region, from either side.
pub struct VmCarrier {
    rings: Rings,
    region: Arc<Region>,
    slot: usize,
    side: Side,
    /// Stops the heartbeat when the carrier goes.
    beating: Arc<AtomicBool>,
    /// Whether the slot is handed to another process (`into_socket`), which
    /// says for itself when it leaves.
    handed_over: bool,
    /// The region file's inode and name on the server's side (the guest's
    /// device file's on the guest's).
    inode: u64,
    name: String,
}

impl VmCarrier {
    /// A guest's connection: claims a free slot of the region at `path`
    /// (the device's BAR, or the server's file; empty: the VM's device,
    /// found in sysfs).
    pub fn connect(path: &Path) -> Result<VmCarrier, TransportError> {
        let found;
        let path = if path.as_os_str().is_empty() {
            found = find_device()?;
            &found
        } else {
            path
        };
        let region = map(path, None)?;
        // SAFETY: the region is at least a page; any bytes are a header.
        let header = unsafe { region.as_ptr().cast::<RegionHeader>().read_unaligned() };
        if header != RegionHeader::of(region.len()) {
            return Err(TransportError::Shared(format!("{}: not a gpuplex VM region of this version", path.display())));
        }
        let slot = (0..SLOTS)
            .find(|&s| control(&region, s).state.compare_exchange(FREE, CLAIMED, SeqCst, SeqCst).is_ok())
            .ok_or_else(|| TransportError::Shared(format!("all {SLOTS} connections of the VM are in use")))?;
        control(&region, slot).guest_pid.store(std::process::id(), SeqCst);
        let carrier = VmCarrier::attach(region, slot, Side::Client)?;
        HELD.lock().unwrap_or_else(PoisonError::into_inner).push(carrier.left_word());
        Ok(carrier)
    }

    /// This side's "left" word, as an address.
    fn left_word(&self) -> usize {
        let c = self.control();
        match self.side {
            Side::Client => &c.guest_closed as *const AtomicU32 as usize,
            Side::Server => &c.server_closed as *const AtomicU32 as usize,
        }
    }

    /// A server's connection in a slot another process accepted, handed
    /// over with the region's descriptor ([`Carrier::into_socket`]).
    pub fn adopt(region: OwnedFd, slot: usize) -> Result<VmCarrier, TransportError> {
        if slot >= SLOTS {
            return Err(TransportError::Shared(format!("no slot {slot}")));
        }
        // SAFETY: plain query on our own descriptor.
        let len = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(region.as_raw_fd(), &mut st) != 0 {
                return Err(std::io::Error::last_os_error().into());
            }
            st.st_size as usize
        };
        if len < MIN_REGION {
            return Err(TransportError::Shared(format!("a VM region of {len} bytes")));
        }
        let mut carrier = VmCarrier::attach(Arc::new(Region::map_file(region, len)?), slot, Side::Server)?;
        // The acceptor read the guest's opening frame: go on after it.
        carrier.rings.resume();
        Ok(carrier)
    }

    fn attach(region: Arc<Region>, slot: usize, side: Side) -> Result<VmCarrier, TransportError> {
        let (inode, name) = identity(&region)?;
        let mut rings = Rings::at(region.clone(), slot_offset(slot) + PAGE, layout(), side)?;
        let c = control(&region, slot);
        let (mine, theirs, their_close) = match side {
            Side::Client => (&c.guest_beat, &c.server_beat, &c.server_closed),
            Side::Server => (&c.server_beat, &c.guest_beat, &c.guest_closed),
        };
        // SAFETY: the words live in the region, which the rings keep mapped.
        unsafe { rings.watch_across(their_close, theirs) };
        let beating = Arc::new(AtomicBool::new(true));
        let (beat, on) = (mine as *const AtomicU64 as usize, beating.clone());
        let keep = region.clone();
        std::thread::Builder::new().name("gpuplex-vm-beat".into()).spawn(move || {
            let _mapped = keep;
            // SAFETY: `beat` points into the region `_mapped` keeps mapped.
            let beat = unsafe { &*(beat as *const AtomicU64) };
            while on.load(SeqCst) {
                beat.fetch_add(1, SeqCst);
                std::thread::sleep(BEAT);
            }
        })?;
        Ok(VmCarrier { rings, region, slot, side, beating, handed_over: false, inode, name })
    }

    fn control(&self) -> &SlotControl {
        control(&self.region, self.slot)
    }
}

impl Drop for VmCarrier {
    fn drop(&mut self) {
        self.beating.store(false, SeqCst);
        let left = self.left_word();
        HELD.lock().unwrap_or_else(PoisonError::into_inner).retain(|&w| w != left);
        if !self.handed_over {
            // SAFETY: a word of the region this carrier still maps.
            unsafe { (*(left as *const AtomicU32)).store(1, SeqCst) };
        }
    }
}

impl Carrier for VmCarrier {
    fn send(&mut self, header: &Header, payload: &[u8]) -> Result<(), TransportError> {
        self.rings.writer.write_all(&[header.as_bytes(), payload])
    }

    fn send_parts(&mut self, header: &Header, parts: &[&[u8]]) -> Result<(), TransportError> {
        self.rings.writer.write_all(&[&[header.as_bytes()], parts].concat())
    }

    fn spin_adaptively(&mut self) {
        self.rings.spin_adaptively();
    }

    fn recv(&mut self, payload: &mut Vec<u8>) -> Result<Header, TransportError> {
        stream::recv(&mut self.rings.reader, payload)
    }

    fn set_patience(&mut self, patience: Option<Duration>) -> Result<(), TransportError> {
        self.rings.set_patience(patience);
        Ok(())
    }

    fn frame_waiting(&self) -> bool {
        self.rings.reader.has_bytes()
    }

    /// Each wait for the peer's bytes ends within `timeout`: a guest that
    /// says nothing is let go that soon.
    fn recv_opening(&mut self, payload: &mut Vec<u8>, max: usize, timeout: Duration) -> Result<Header, TransportError> {
        self.rings.set_patience(Some(timeout));
        let opening = stream::recv_at_most(&mut self.rings.reader, payload, max);
        self.rings.set_patience(None);
        opening
    }

    fn peer(&self) -> Peer {
        Peer::Vm { region: self.inode, slot: self.slot as u32, pid: self.control().guest_pid.load(SeqCst) }
    }

    /// The VM's name (its region file's): the tenant it is served as.
    fn key(&self) -> Option<&str> {
        Some(&self.name)
    }

    fn heap(&self) -> Option<Heap> {
        Heap::of(self.region.clone(), self.slot)
    }

    fn into_socket(mut self: Box<Self>) -> Result<(SocketKind, OwnedFd), TransportError> {
        let fd = self.region.fd().try_clone_to_owned()?;
        self.handed_over = true;
        Ok((SocketKind::Vm { slot: self.slot as u32 }, fd))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuplex_protocol::Opcode;

    fn region() -> (tempfile_path::Dir, PathBuf) {
        let dir = tempfile_path::Dir::new();
        let path = dir.0.join("vm0");
        (dir, path)
    }

    /// A directory removed at the end of a test.
    mod tempfile_path {
        pub struct Dir(pub std::path::PathBuf);

        impl Dir {
            pub fn new() -> Dir {
                let n = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
                let p = std::env::temp_dir().join(format!("gpuplex-vm-test-{}-{n}", std::process::id()));
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
        }

        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn frames_cross_a_slot_both_ways() {
        let (_dir, path) = region();
        let listener = VmListener::create(&path, MIN_REGION).unwrap();
        let mut guest = VmCarrier::connect(&path).unwrap();
        let mut server = listener.accept().unwrap();
        assert!(matches!(server.peer(), Peer::Vm { slot: 0, pid, .. } if pid == std::process::id()));
        assert_eq!(server.key(), Some("vm:vm0"));
        let big = vec![7u8; 3 * RING_BYTES + 5];
        let sender = std::thread::spawn(move || {
            guest.send(&Header::request(Opcode::Hello, 1, 0, 4), b"ping").unwrap();
            guest.send(&Header::request(Opcode::Hello, 2, 0, big.len()), &big).unwrap();
            let mut reply = Vec::new();
            let h = guest.recv(&mut reply).unwrap();
            (h.request_id.get(), reply)
        });
        let mut got = Vec::new();
        let h = server.recv_opening(&mut got, 64, Duration::from_secs(5)).unwrap();
        assert_eq!((h.request_id.get(), got.as_slice()), (1, &b"ping"[..]));
        server.recv(&mut got).unwrap();
        assert_eq!(got.len(), 3 * RING_BYTES + 5);
        assert!(got.iter().all(|&b| b == 7));
        server.send(&Header::reply(&h, 0, 4), b"pong").unwrap();
        assert_eq!(sender.join().unwrap(), (1, b"pong".to_vec()));
    }

    #[test]
    fn a_guest_takes_a_free_slot_and_a_left_one_is_freed() {
        let (_dir, path) = region();
        let listener = VmListener::create(&path, MIN_REGION).unwrap();
        let guests: Vec<VmCarrier> = (0..SLOTS).map(|_| VmCarrier::connect(&path).unwrap()).collect();
        assert!(VmCarrier::connect(&path).is_err(), "every slot is taken");
        let servers: Vec<Box<dyn Carrier>> = (0..SLOTS).map(|_| listener.accept().unwrap()).collect();
        drop(guests);
        drop(servers);
        assert_eq!(listener.look(), None, "both sides left: the slots are freed");
        let mut again = VmCarrier::connect(&path).expect("a freed slot is taken again");
        let mut server = listener.accept().unwrap();
        again.send(&Header::request(Opcode::Hello, 9, 0, 0), &[]).unwrap();
        assert_eq!(server.recv(&mut Vec::new()).unwrap().request_id.get(), 9, "the freed slot's rings start empty");
    }

    #[test]
    fn a_side_that_leaves_ends_the_other_s_wait() {
        let (_dir, path) = region();
        let listener = VmListener::create(&path, MIN_REGION).unwrap();
        let guest = VmCarrier::connect(&path).unwrap();
        let mut server = listener.accept().unwrap();
        let waiter = std::thread::spawn(move || server.recv(&mut Vec::new()).map(drop));
        std::thread::sleep(Duration::from_millis(50));
        drop(guest);
        assert!(matches!(waiter.join().unwrap(), Err(TransportError::Closed)));
    }

    #[test]
    fn a_guest_process_that_exits_leaves_its_slots() {
        let (_dir, path) = region();
        let listener = VmListener::create(&path, MIN_REGION).unwrap();
        let guest = VmCarrier::connect(&path).unwrap();
        let mut server = listener.accept().unwrap();
        // What the exit handler does for this guest, its connection never
        // dropped (for all, it would end the other tests' guests too).
        assert!(HELD.lock().unwrap().contains(&guest.left_word()));
        leave(&[guest.left_word()]);
        assert!(matches!(server.recv(&mut Vec::new()), Err(TransportError::Closed)));
        drop(server);
        assert_eq!(listener.look(), None);
        let again = VmCarrier::connect(&path).unwrap();
        assert_eq!(again.slot, 0, "the slot was freed at once, not after the heartbeat fell silent");
        drop(guest);
    }

    #[test]
    fn a_slot_whose_worker_was_killed_is_freed_once_its_guest_leaves() {
        let (_dir, path) = region();
        let mut listener = VmListener::create(&path, MIN_REGION).unwrap();
        listener.silence = Duration::from_millis(300);
        let guest = VmCarrier::connect(&path).unwrap();
        let server = listener.accept().unwrap();
        // A killed worker: its beat stops, and it never says it left.
        let (kind, fd) = server.into_socket().unwrap();
        let worker = match kind {
            SocketKind::Vm { slot } => VmCarrier::adopt(fd, slot as usize).unwrap(),
            _ => unreachable!(),
        };
        worker.beating.store(false, SeqCst);
        std::mem::forget(worker);
        drop(guest);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(listener.look(), None);
        let other = VmCarrier::connect(&path).unwrap();
        assert_eq!(other.slot, 1, "the worker's beat has not been silent long enough");
        let _served = listener.accept().unwrap();
        std::thread::sleep(Duration::from_millis(400));
        assert_eq!(listener.look(), None);
        assert_eq!(VmCarrier::connect(&path).unwrap().slot, 0, "freed once the worker fell silent");
    }

    #[test]
    fn a_silent_guest_is_let_go_at_its_opening() {
        let (_dir, path) = region();
        let listener = VmListener::create(&path, MIN_REGION).unwrap();
        let _guest = VmCarrier::connect(&path).unwrap();
        let mut server = listener.accept().unwrap();
        let started = Instant::now();
        let r = server.recv_opening(&mut Vec::new(), 64, Duration::from_millis(200));
        assert!(matches!(r, Err(TransportError::TimedOut(_))), "{r:?}");
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn a_region_not_gpuplex_s_or_of_another_shape_is_refused() {
        let (_dir, path) = region();
        std::fs::write(&path, vec![0u8; MIN_REGION]).unwrap();
        assert!(VmCarrier::connect(&path).is_err(), "no magic");
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        assert!(VmCarrier::connect(&path).is_err(), "too small");
    }

    #[test]
    fn heap_chunks_are_claimed_once_and_freed_with_their_slot() {
        let (_dir, path) = region();
        let len = MIN_REGION + 64 * CHUNK + HEAP_ALIGN;
        let listener = VmListener::create(&path, len).unwrap();
        let (a, b) = (VmCarrier::connect(&path).unwrap(), VmCarrier::connect(&path).unwrap());
        let (heap_a, heap_b) = (a.heap().unwrap(), b.heap().unwrap());
        let chunks = heap_a.chunks;
        assert!(chunks >= 64, "{chunks} chunks");
        let x = heap_a.alloc(CHUNK + 1).unwrap();
        let y = heap_b.alloc(1).unwrap();
        assert!(y >= x + 2 * CHUNK || y + CHUNK <= x, "two chunks for A, one for B, apart");
        assert_eq!(heap_a.alloc((chunks - 2) * CHUNK), None, "only chunks-3 are left, together or not");
        let rest = heap_b.alloc((chunks - 3) * CHUNK).expect("the rest, in one run after y");
        heap_b.free(rest, (chunks - 3) * CHUNK);
        // B frees nothing of A's.
        heap_b.free(x, 2 * CHUNK);
        assert_eq!(heap_b.alloc((chunks - 1) * CHUNK), None);
        let _servers = [listener.accept().unwrap(), listener.accept().unwrap()];
        drop(_servers);
        drop(a);
        assert_eq!(listener.look(), None);
        let again = heap_b.alloc(2 * CHUNK).expect("A's chunks went with its slot");
        assert_eq!(again, x);
        drop(b);
    }

    #[test]
    fn views_of_the_heap_share_bytes_and_stay_inside_it() {
        let (_dir, path) = region();
        let listener = VmListener::create(&path, MIN_REGION + 8 * CHUNK + HEAP_ALIGN).unwrap();
        let guest = VmCarrier::connect(&path).unwrap();
        let server = listener.accept().unwrap();
        let (mine, theirs) = (guest.heap().unwrap(), server.heap().unwrap());
        let at = mine.alloc(CHUNK).unwrap();
        let view = mine.view(at, CHUNK, std::ptr::null_mut()).unwrap();
        // SAFETY: a fresh view of CHUNK bytes.
        unsafe { view.as_ptr().add(100).write(42) };
        let other = theirs.view(at, CHUNK, std::ptr::null_mut()).unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { other.as_ptr().add(100).read() }, 42);
        let end = theirs.offset + theirs.chunks * CHUNK;
        for (offset, len) in [(0, PAGE), (theirs.offset - PAGE, 2 * PAGE), (end - PAGE, 2 * PAGE), (at + 1, PAGE)] {
            assert!(theirs.view(offset, len, std::ptr::null_mut()).is_err(), "{len} bytes at {offset:#x}");
        }
        assert!(theirs.view(usize::MAX - 10, 20, std::ptr::null_mut()).is_err());
        // Claiming is taking chunks and mapping them at once.
        assert!(mine.claim((mine.chunks + 1) * CHUNK, std::ptr::null_mut()).is_err(), "more than the heap");
        let (offset, claimed) = mine.claim(2 * CHUNK, std::ptr::null_mut()).unwrap();
        assert_ne!(offset, at, "a chunk of its own");
        // SAFETY: the claimed mapping is 2 * CHUNK bytes.
        unsafe { claimed.as_ptr().write(5) };
        let seen = theirs.view(offset, CHUNK, std::ptr::null_mut()).unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { seen.as_ptr().read() }, 5);
    }

    #[test]
    fn a_region_without_room_for_a_heap_has_none() {
        let (_dir, path) = region();
        let _listener = VmListener::create(&path, MIN_REGION).unwrap();
        assert!(VmCarrier::connect(&path).unwrap().heap().is_none());
    }

    #[test]
    fn a_handed_over_slot_is_served_by_its_adopter() {
        let (_dir, path) = region();
        let listener = VmListener::create(&path, MIN_REGION).unwrap();
        let mut guest = VmCarrier::connect(&path).unwrap();
        let accepted = listener.accept().unwrap();
        guest.send(&Header::request(Opcode::Hello, 3, 0, 2), b"hi").unwrap();
        let mut accepted = accepted;
        let mut got = Vec::new();
        assert_eq!(accepted.recv_opening(&mut got, 64, Duration::from_secs(5)).unwrap().request_id.get(), 3);
        let (kind, fd) = accepted.into_socket().unwrap();
        let mut adopted = crate::adopt(kind, fd).unwrap();
        guest.send(&Header::request(Opcode::Hello, 4, 0, 3), b"bye").unwrap();
        assert_eq!(adopted.recv(&mut got).unwrap().request_id.get(), 4, "after the opening the acceptor read");
        assert_eq!(got, b"bye");
        adopted.send(&Header::request(Opcode::Hello, 5, 0, 0), &[]).unwrap();
        assert_eq!(guest.recv(&mut got).unwrap().request_id.get(), 5);
    }
}
