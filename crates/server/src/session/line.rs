//! The session's end of its connection, lent to its heartbeat while a call runs.
//!
//! A guest waiting for a reply cannot tell a server busy with a long call
//! from one that stopped, so while the session runs a call for longer than
//! [`HEARTBEAT`], a thread of its own sends a `Heartbeat` frame each
//! interval; the guest gives up on a server only after a longer silence
//! (the front-end's `GPUPLEX_TIMEOUT`).
//!
//! The connection belongs to the session's thread, which lends it out
//! while it runs a call and takes it back before it touches it again. One
//! word says who has it; the heartbeat takes it only from a lender and
//! gives it straight back. The session's thread pays one plain store to
//! lend and one compare-and-swap to take it back, so that the shortest
//! calls take no lock.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use gpuplex_protocol::{Header, Opcode};
use gpuplex_transport::{Carrier, TransportError};

/// How long a call runs before its guest hears a heartbeat, and how often
/// it hears one after that.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// Looks per interval: a long call is heard from within 1 + 1/LOOKS
/// intervals.
const LOOKS: u32 = 4;

/// Who has the connection: the session's thread, nobody (lent while a call
/// runs), or the heartbeat (sending one frame).
const HELD: u8 = 0;
const LENT: u8 = 1;
const BEATING: u8 = 2;

struct Shared {
    carrier: UnsafeCell<Box<dyn Carrier>>,
    holder: AtomicU8,
    /// Times lent: the heartbeat tells one long call from several short ones.
    lends: AtomicU64,
    stopped: Mutex<bool>,
    stop: Condvar,
}

// SAFETY: the carrier is `Send`, and only one thread at a time reaches it:
// the session's thread while `holder` is HELD, the heartbeat while it is
// BEATING; each moves `holder` off LENT with a compare-and-swap, so at most
// one of them wins.
unsafe impl Sync for Shared {}

/// The session's handle on its connection.
pub struct Line {
    shared: Arc<Shared>,
    /// Whether a heartbeat runs, and so whether lending means anything.
    beating: bool,
    lent: bool,
}

impl Line {
    /// A line over `carrier`, with a heartbeat if the guest takes them.
    pub fn new(carrier: Box<dyn Carrier>, heartbeats: bool) -> Line {
        Line::beating_every(carrier, heartbeats.then_some(HEARTBEAT))
    }

    /// A line whose heartbeat, if any, speaks after each `interval` of a call.
    fn beating_every(carrier: Box<dyn Carrier>, interval: Option<Duration>) -> Line {
        let shared = Arc::new(Shared {
            carrier: UnsafeCell::new(carrier),
            holder: AtomicU8::new(HELD),
            lends: AtomicU64::new(0),
            stopped: Mutex::new(false),
            stop: Condvar::new(),
        });
        let mut beating = false;
        if let Some(interval) = interval {
            let line = shared.clone();
            match std::thread::Builder::new().name("gpuplex-heartbeat".into()).spawn(move || beat(&line, interval)) {
                Ok(_) => beating = true,
                Err(e) => tracing::warn!("no heartbeat for this session: {e}"),
            }
        }
        Line { shared, beating, lent: false }
    }

    /// The connection, taken back first if it was lent.
    pub fn carrier(&mut self) -> &mut dyn Carrier {
        if self.lent {
            let mut turns = 0u32;
            while self.shared.holder.compare_exchange_weak(LENT, HELD, Acquire, Relaxed).is_err() {
                // The heartbeat is sending one small frame.
                turns += 1;
                if turns % 64 == 0 {
                    std::thread::yield_now();
                }
                std::hint::spin_loop();
            }
            self.lent = false;
        }
        // SAFETY: `holder` is HELD, which only this thread changes (see `Shared`).
        unsafe { &mut **self.shared.carrier.get() }
    }

    /// Lets the heartbeat speak while a call runs.
    pub fn lend(&mut self) {
        if self.beating && !self.lent {
            self.lent = true;
            let lends = &self.shared.lends;
            lends.store(lends.load(Relaxed) + 1, Relaxed);
            self.shared.holder.store(LENT, Release);
        }
    }

    /// Stops the heartbeat, whose thread holds the connection until then:
    /// the session calls this as it ends.
    pub fn stop(&self) {
        *self.shared.stopped.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.shared.stop.notify_all();
    }
}

fn beat(line: &Shared, interval: Duration) {
    let mut stopped = line.stopped.lock().unwrap_or_else(PoisonError::into_inner);
    // The lend last seen, and for how many looks in a row.
    let (mut seen, mut quiet) = (u64::MAX, 0);
    loop {
        stopped = line.stop.wait_timeout(stopped, interval / LOOKS).unwrap_or_else(PoisonError::into_inner).0;
        if *stopped {
            return;
        }
        let now = line.lends.load(Relaxed);
        quiet = if line.holder.load(Relaxed) == LENT && now == seen { quiet + 1 } else { 0 };
        seen = now;
        if quiet < LOOKS {
            continue;
        }
        quiet = 0;
        if line.holder.compare_exchange(LENT, BEATING, Acquire, Relaxed).is_err() {
            continue;
        }
        let beat = Header::request(Opcode::Heartbeat, 0, 0, 0);
        // SAFETY: `holder` is BEATING, which only this thread changes (see `Shared`).
        let sent: Result<(), TransportError> = unsafe { (**line.carrier.get()).send(&beat, &[]) };
        line.holder.store(LENT, Release);
        if sent.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuplex_transport::{Peer, SocketKind};
    use std::os::fd::OwnedFd;
    use std::sync::atomic::{AtomicBool, AtomicU32};
    use std::time::Instant;

    /// Counts the frames sent by kind, and fails the test if two threads
    /// are ever inside it at once.
    #[derive(Default)]
    struct Watch {
        inside: AtomicBool,
        overlaps: AtomicU32,
        beats: AtomicU32,
        replies: AtomicU32,
    }

    struct Fake(Arc<Watch>);

    impl Carrier for Fake {
        fn send(&mut self, header: &Header, _: &[u8]) -> Result<(), TransportError> {
            if self.0.inside.swap(true, SeqCst) {
                self.0.overlaps.fetch_add(1, SeqCst);
            }
            // A heartbeat takes long to send, so that calls often end
            // while one is on its way.
            let heartbeat = header.opcode.get() == Opcode::Heartbeat as u16;
            std::thread::sleep(Duration::from_micros(if heartbeat { 2000 } else { 50 }));
            (if heartbeat { &self.0.beats } else { &self.0.replies }).fetch_add(1, SeqCst);
            self.0.inside.store(false, SeqCst);
            Ok(())
        }
        fn recv(&mut self, _: &mut Vec<u8>) -> Result<Header, TransportError> {
            Err(TransportError::Closed)
        }
        fn recv_opening(&mut self, _: &mut Vec<u8>, _: usize, _: Duration) -> Result<Header, TransportError> {
            Err(TransportError::Closed)
        }
        fn peer(&self) -> Peer {
            Peer::Local { pid: 1, uid: 0, gid: 0 }
        }
        fn into_socket(self: Box<Self>) -> Result<(SocketKind, OwnedFd), TransportError> {
            Err(TransportError::Unsupported("give up a socket"))
        }
    }

    /// Calls of every length, answered as soon as each ends: the heartbeat
    /// speaks only during the long ones, never while the session sends.
    #[test]
    fn the_heartbeat_speaks_only_while_a_call_runs_long_and_never_over_the_session() {
        let watch = Arc::new(Watch::default());
        let mut line = Line::beating_every(Box::new(Fake(watch.clone())), Some(Duration::from_millis(8)));
        let reply = Header::request(Opcode::cuCtxSynchronize, 1, 0, 0);
        let start = Instant::now();
        let mut calls = 0;
        let mut long = 0u32;
        while start.elapsed() < Duration::from_millis(400) {
            line.lend();
            // Mostly short calls; every tenth long enough for heartbeats,
            // ending at different points of a heartbeat's interval.
            let runs = if calls % 10 == 9 {
                long += 1;
                Duration::from_micros(9_000 + 1_300 * u64::from(long % 10))
            } else {
                Duration::from_micros(20)
            };
            let until = Instant::now() + runs;
            while Instant::now() < until {
                std::hint::spin_loop();
            }
            line.carrier().send(&reply, &[]).unwrap();
            calls += 1;
        }
        line.stop();
        assert_eq!(watch.overlaps.load(SeqCst), 0);
        assert_eq!(watch.replies.load(SeqCst), calls);
        let beats = watch.beats.load(SeqCst);
        assert!(beats > 0, "no heartbeat over {calls} calls");
        // At most two per long call (each shorter than three intervals), none
        // for short ones.
        assert!(beats <= 2 * long, "{beats} heartbeats over {long} long calls");
    }

    #[test]
    fn a_guest_that_takes_no_heartbeats_hears_none() {
        let watch = Arc::new(Watch::default());
        let mut line = Line::new(Box::new(Fake(watch.clone())), false);
        line.lend();
        std::thread::sleep(Duration::from_millis(20));
        line.carrier().send(&Header::request(Opcode::cuCtxSynchronize, 1, 0, 0), &[]).unwrap();
        line.stop();
        assert_eq!((watch.beats.load(SeqCst), watch.replies.load(SeqCst)), (0, 1));
    }
}
