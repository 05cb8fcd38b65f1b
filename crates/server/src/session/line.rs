//! The session's end of its connection, shared with its heartbeat.
//!
//! A guest waiting for a reply cannot tell a server busy with a long call
//! from one that stopped, so while the session runs a call for longer than
//! [`HEARTBEAT`], a thread of its own sends a `Heartbeat` frame each
//! interval; the guest gives up on a server only after a longer silence
//! (the front-end's `GPUPLEX_TIMEOUT`). Frames from the two threads go
//! through one lock, which the session's thread otherwise takes alone.
//!
//! The session's thread only bumps counters for the heartbeat to look at (a
//! clock read per frame would cost every call): the heartbeat sends when
//! it has seen the same call under way, and nothing sent, for an interval.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use gpuplex_protocol::{Header, Opcode};
use gpuplex_transport::{Carrier, TransportError};

/// How long a call runs before its guest hears a heartbeat, and how often
/// it hears one after that.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// Looks per interval: a long call is heard from within 1 + 1/LOOKS
/// intervals.
const LOOKS: u32 = 4;

pub struct Line {
    carrier: Mutex<Box<dyn Carrier>>,
    /// Frames taken from the guest, and whether one is being run.
    taken: AtomicU64,
    running: AtomicBool,
    /// Frames sent to the guest.
    sent: AtomicU64,
    stopped: Mutex<bool>,
    stop: Condvar,
}

impl Line {
    /// A line over `carrier`, with a heartbeat if the guest takes them.
    pub fn new(carrier: Box<dyn Carrier>, heartbeats: bool) -> Arc<Line> {
        let line = Arc::new(Line {
            carrier: Mutex::new(carrier),
            taken: AtomicU64::new(0),
            running: AtomicBool::new(false),
            sent: AtomicU64::new(0),
            stopped: Mutex::new(!heartbeats),
            stop: Condvar::new(),
        });
        if heartbeats {
            let beating = line.clone();
            let spawned = std::thread::Builder::new().name("gpuplex-heartbeat".into()).spawn(move || beating.beat());
            if let Err(e) = spawned {
                tracing::warn!("no heartbeat for this session: {e}");
            }
        }
        line
    }

    /// The connection, for the session's own thread.
    pub fn carrier(&self) -> MutexGuard<'_, Box<dyn Carrier>> {
        self.carrier.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The guest's next frame; the session is idle until it comes.
    pub fn recv(&self, buf: &mut Vec<u8>) -> Result<Header, TransportError> {
        self.running.store(false, Relaxed);
        let header = self.carrier().recv(buf);
        self.taken.store(self.taken.load(Relaxed) + 1, Relaxed);
        self.running.store(true, Relaxed);
        header
    }

    pub fn send(&self, header: &Header, payload: &[u8]) -> Result<(), TransportError> {
        let sent = self.carrier().send(header, payload);
        self.sent.store(self.sent.load(Relaxed) + 1, Relaxed);
        sent
    }

    /// Stops the heartbeat, whose thread holds the line until then: the
    /// session calls this as it ends.
    pub fn stop(&self) {
        *self.stopped.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.stop.notify_all();
    }

    fn beat(&self) {
        let mut stopped = self.stopped.lock().unwrap_or_else(PoisonError::into_inner);
        // The frame and the count of frames sent last seen, and for how
        // many looks in a row.
        let (mut seen, mut quiet) = ((u64::MAX, u64::MAX), 0);
        loop {
            stopped = self.stop.wait_timeout(stopped, HEARTBEAT / LOOKS).unwrap_or_else(PoisonError::into_inner).0;
            if *stopped {
                return;
            }
            let now = (self.taken.load(Relaxed), self.sent.load(Relaxed));
            quiet = if self.running.load(Relaxed) && now == seen { quiet + 1 } else { 0 };
            seen = now;
            if quiet < LOOKS {
                continue;
            }
            quiet = 0;
            // The session's thread holds the connection only to move a
            // frame; if it does, the guest is hearing from it anyway.
            if let Ok(mut carrier) = self.carrier.try_lock() {
                let beat = Header::request(Opcode::Heartbeat, 0, 0, 0);
                if carrier.send(&beat, &[]).is_err() {
                    return;
                }
            }
        }
    }
}
