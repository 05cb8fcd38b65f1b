//! Host functions the server's driver runs in this process: a graph's host
//! nodes, and host functions launched into a stream. Each is registered
//! here under a number, which is all the server holds; a thread of its own
//! answers the server's `HostCall`s, on a connection opened for them at the
//! first registration, by running the function numbered. The driver holds
//! the stream until the answer comes, and the program's thread goes on
//! meanwhile, as natively.
//!
//! A graph's functions keep their numbers, since the graph may run them
//! again. One launched into a stream runs once: its number is given back
//! as it runs, for the next such launch, so that the server's records stay
//! as many as run at once. A host function must make no CUDA call (CUDA's
//! rule): one that does gets `CUDA_ERROR_NOT_PERMITTED` instead of waiting
//! for a connection its program's thread may hold.
//!
//! The stream waits for each answer, so the thread answering must not be
//! asleep when a call comes: while a function launched into a stream is
//! due, it polls the connection (up to [`DUE_SPIN`] at a time), and a
//! launch wakes it from sleep to do so ([`Alarm`]).

use std::collections::HashMap;
use std::ffi::c_void;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use gpuplex_protocol::{codec, CuError, Header, HostCallRun, MappedRuns, Opcode, Seq};
use gpuplex_transport::Carrier;

use crate::{client, log};

pub type HostFn = unsafe extern "C" fn(*mut c_void);

/// Registered functions and their data (an address, kept as a number).
static FNS: Mutex<Option<HashMap<u64, (HostFn, usize)>>> = Mutex::new(None);
static NEXT: AtomicU64 = AtomicU64::new(1);
/// Each function and data's number.
static NUMBERS: Mutex<Option<HashMap<(usize, usize), u64>>> = Mutex::new(None);
static OPENED: OnceLock<Result<(), CuError>> = OnceLock::new();
/// Functions launched into a stream, each to run once, and the numbers
/// free for them.
static ONCE: Mutex<Once> = Mutex::new(Once { pending: Vec::new(), free: Vec::new() });

struct Once {
    pending: Vec<(u64, HostFn, usize)>,
    free: Vec<u64>,
}

thread_local! {
    /// Whether this thread runs a host function now.
    static IN_HOST_FN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the calling thread runs a host function, where CUDA calls are
/// not permitted.
pub fn in_host_function() -> bool {
    IN_HOST_FN.with(|f| f.get())
}

fn fns<T>(f: impl FnOnce(&mut HashMap<u64, (HostFn, usize)>) -> T) -> T {
    f(FNS.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert_with(HashMap::new))
}

/// The number the server knows `f(data)` by: the same each time the same
/// function and data come, so that the server keeps one record for them.
pub fn register(f: HostFn, data: *mut c_void) -> Result<u64, CuError> {
    (*OPENED.get_or_init(open))?;
    let mut numbers = NUMBERS.lock().unwrap_or_else(PoisonError::into_inner);
    let id = *numbers.get_or_insert_with(HashMap::new).entry((f as usize, data as usize)).or_insert_with(|| {
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        fns(|m| m.insert(id, (f, data as usize)));
        id
    });
    Ok(id)
}

/// A number for `f(data)`, launched into a stream to run once.
pub fn register_once(f: HostFn, data: *mut c_void) -> Result<u64, CuError> {
    (*OPENED.get_or_init(open))?;
    let mut once = ONCE.lock().unwrap_or_else(PoisonError::into_inner);
    let id = once.free.pop().unwrap_or_else(|| NEXT.fetch_add(1, Ordering::Relaxed));
    once.pending.push((id, f, data as usize));
    drop(once);
    if let Some(alarm) = alarm() {
        alarm.ring();
    }
    Ok(id)
}

/// Whether a function launched into a stream has yet to run.
fn due() -> bool {
    !ONCE.lock().unwrap_or_else(PoisonError::into_inner).pending.is_empty()
}

/// How long the answering thread polls for a call while a function is due,
/// before it sleeps until the call or the next launch: the GPU work a
/// training step puts before its host functions, since the stream's work
/// after a function waits out the thread's wake (the carriers' longest
/// spin, past which a wake costs little).
const DUE_SPIN: Duration = gpuplex_transport::SPIN_MAX;

/// How long it polls after an answer when nothing is due: a graph's host
/// nodes often come one after another.
const AFTER_ANSWER_SPIN: Duration = Duration::from_micros(50);

/// Wakes the answering thread from its sleep when a function is launched.
struct Alarm {
    /// An eventfd the sleeping thread also waits on.
    event: OwnedFd,
    sleeping: AtomicBool,
    /// Launches so far: a launch the thread has not seen keeps it awake.
    launches: AtomicU64,
}

/// The process's alarm; `None` where no eventfd could be made, and the
/// answering thread then waits in `recv` as for a graph's functions.
fn alarm() -> Option<&'static Alarm> {
    static ALARM: OnceLock<Option<Alarm>> = OnceLock::new();
    ALARM.get_or_init(Alarm::new).as_ref()
}

impl Alarm {
    fn new() -> Option<Alarm> {
        // SAFETY: eventfd with flags only; a descriptor or -1 comes back.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        (fd >= 0).then(|| Alarm {
            // SAFETY: a new descriptor, owned from here on.
            event: unsafe { OwnedFd::from_raw_fd(fd) },
            sleeping: AtomicBool::new(false),
            launches: AtomicU64::new(0),
        })
    }

    /// Called after a launch: wakes the thread if it sleeps. Sequentially
    /// consistent with [`Alarm::sleep`]: either the thread sees the launch
    /// before it sleeps, or this sees it asleep.
    fn ring(&self) {
        self.launches.fetch_add(1, Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) {
            let one = 1u64;
            // SAFETY: an 8-byte write from a live u64 to the eventfd this owns.
            unsafe { libc::write(self.event.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
    }

    /// Sleeps until `socket` is readable (true) or a launch after `seen`
    /// (false).
    fn sleep(&self, socket: BorrowedFd<'_>, seen: u64) -> bool {
        self.sleeping.store(true, Ordering::SeqCst);
        let mut fds = [
            libc::pollfd { fd: socket.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: self.event.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        ];
        if self.launches.load(Ordering::SeqCst) == seen {
            // SAFETY: two live pollfds; an error or EINTR only ends the sleep.
            unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        }
        self.sleeping.store(false, Ordering::SeqCst);
        let mut count = 0u64;
        // SAFETY: an 8-byte read into a live u64 from the nonblocking eventfd.
        unsafe { libc::read(self.event.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
        fds[0].revents != 0
    }
}

/// Returns when the server's next frame has arrived, or where the carrier
/// cannot say, at once (its `recv` then waits as before).
fn await_call(carrier: &dyn Carrier) {
    let Some(alarm) = alarm() else { return };
    let mut seen = alarm.launches.load(Ordering::SeqCst);
    let mut spin = if due() { DUE_SPIN } else { AFTER_ANSWER_SPIN };
    loop {
        if carrier.poll_frame(spin) {
            return;
        }
        let Some(socket) = carrier.socket_fd() else { return };
        if alarm.sleep(socket, seen) {
            return;
        }
        seen = alarm.launches.load(Ordering::SeqCst);
        spin = DUE_SPIN;
    }
}

/// What number `id` runs, if registered: a graph's function, or the
/// stream's function waiting under it, whose number is free from now.
pub fn registered(id: u64) -> Option<(HostFn, *mut c_void)> {
    if let Some(found) = fns(|m| m.get(&id).map(|&(f, data)| (f, data as *mut c_void))) {
        return Some(found);
    }
    let mut once = ONCE.lock().unwrap_or_else(PoisonError::into_inner);
    let i = once.pending.iter().position(|&(n, _, _)| n == id)?;
    let (_, f, data) = once.pending.swap_remove(i);
    once.free.push(id);
    Some((f, data as *mut c_void))
}

fn open() -> Result<(), CuError> {
    let carrier = client::lock()?.open_host_calls()?;
    std::thread::Builder::new().name("gpuplex-host-calls".into()).spawn(move || serve(carrier)).map(drop).map_err(|e| {
        log::warn(&format!("no thread for host functions: {e}"));
        CuError::OUT_OF_MEMORY
    })
}

/// Runs what the server asks for until the connection ends (with the session).
fn serve(mut carrier: Box<dyn Carrier>) {
    gpuplex_transport::block_sigpipe_on_this_thread();
    let mut buf = Vec::new();
    loop {
        await_call(&*carrier);
        let Ok(header) = carrier.recv(&mut buf) else { return };
        let arrived = crate::trace::on().then(std::time::Instant::now);
        // What the device wrote to mapped pinned memory, before the function.
        if header.opcode.get() == Opcode::MappedRuns as u16 {
            crate::memory::mapped::from_device(&buf);
            continue;
        }
        // And the bytes of posted copies into pinned memory.
        if header.opcode.get() == Opcode::CopiedToHost as u16 {
            crate::memory::posted_reads::arrived(&buf);
            continue;
        }
        if header.opcode.get() != Opcode::HostCall as u16 {
            return log::warn("the server sent something other than a host call; host functions end");
        }
        let Ok(call) = codec::decode::<HostCallRun>(&buf) else {
            return log::warn("an undecodable host call; host functions end");
        };
        let posted = header.is_posted();
        if !posted {
            crate::memory::mapped::host_function_runs();
        }
        if let Some((f, data)) = registered(call.id) {
            // A user object's destructor (posted) has no stream's work before
            // or after it. Another function sees what the graph's copies wrote
            // to ordinary memory, and the graph's copies after it see what it wrote.
            if !posted {
                crate::memory::mirrors::from_device();
            }
            IN_HOST_FN.with(|flag| flag.set(true));
            // SAFETY: the program's function and data, run as CUDA runs a host
            // function: after the work before it, before the work after.
            unsafe { f(data) };
            IN_HOST_FN.with(|flag| flag.set(false));
            if !posted {
                crate::memory::mirrors::to_device();
            }
        }
        if !posted && answer(&mut *carrier, &header).is_err() {
            return;
        }
        if let Some(arrived) = arrived {
            crate::trace::host_function(arrived.elapsed());
        }
    }
}

/// Answers a host call, after what the function wrote to mapped pinned
/// memory, which the device's work after it reads.
fn answer(carrier: &mut dyn Carrier, call: &Header) -> Result<(), gpuplex_transport::TransportError> {
    for runs in crate::memory::mapped::host_function_done() {
        let payload = codec::encode(&MappedRuns { runs: Seq(runs) });
        carrier.send(&Header::request(Opcode::MappedRuns, call.request_id.get(), 0, payload.len()), &payload)?;
    }
    carrier.send(&Header::reply(call, 0, 0), &[])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    /// The sleeping thread wakes for a launch and for the server's frame,
    /// and does not sleep through a launch it has not seen.
    #[test]
    fn the_alarm_wakes_the_answering_thread() {
        let alarm = std::sync::Arc::new(Alarm::new().unwrap());
        let (ours, theirs) = UnixStream::pair().unwrap();
        let seen = alarm.launches.load(Ordering::SeqCst);
        let ringer = {
            let alarm = alarm.clone();
            std::thread::spawn(move || {
                while !alarm.sleeping.load(Ordering::SeqCst) {
                    std::thread::yield_now();
                }
                alarm.ring();
            })
        };
        assert!(!alarm.sleep(ours.as_fd(), seen), "woken by the launch");
        ringer.join().unwrap();
        // A launch after `seen`, already counted: no sleep at all.
        assert!(!alarm.sleep(ours.as_fd(), seen));
        (&theirs).write_all(b"x").unwrap();
        let seen = alarm.launches.load(Ordering::SeqCst);
        assert!(alarm.sleep(ours.as_fd(), seen), "woken by the frame");
    }
}
