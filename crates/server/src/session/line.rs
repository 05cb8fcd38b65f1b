//! The session's end of its connection, shared with its heartbeat.
//!
//! A guest waiting for a reply cannot tell a server busy with a long call
//! from one that stopped, so while the session runs a call for longer than
//! [`HEARTBEAT`], a thread of its own sends a `Heartbeat` frame each
//! interval; the guest gives up on a server only after a longer silence
//! (the front-end's `GPUPLEX_TIMEOUT`). Frames from the two threads go
//! through one lock, which the session's thread otherwise takes alone.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use gpuplex_protocol::{Header, Opcode};
use gpuplex_transport::{Carrier, TransportError};

/// How long a call runs before its guest hears a heartbeat, and how often
/// it hears one after that.
pub const HEARTBEAT: Duration = Duration::from_secs(1);

pub struct Line {
    carrier: Mutex<Box<dyn Carrier>>,
    clock: Instant,
    /// Microseconds since `clock` when the session took the frame it is
    /// running; 0 while it waits for the next one.
    busy_since: AtomicU64,
    last_sent: AtomicU64,
    stop: (Mutex<bool>, Condvar),
    stopped: AtomicBool,
}

impl Line {
    /// A line over `carrier`, with a heartbeat if the guest takes them.
    pub fn new(carrier: Box<dyn Carrier>, heartbeats: bool) -> Arc<Line> {
        let line = Arc::new(Line {
            carrier: Mutex::new(carrier),
            clock: Instant::now(),
            busy_since: AtomicU64::new(0),
            last_sent: AtomicU64::new(0),
            stop: (Mutex::new(false), Condvar::new()),
            stopped: AtomicBool::new(!heartbeats),
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

    fn now(&self) -> u64 {
        self.clock.elapsed().as_micros() as u64 + 1
    }

    /// The connection, for the session's own thread.
    pub fn carrier(&self) -> MutexGuard<'_, Box<dyn Carrier>> {
        self.carrier.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The guest's next frame; the session is idle until it comes.
    pub fn recv(&self, buf: &mut Vec<u8>) -> Result<Header, TransportError> {
        self.busy_since.store(0, Ordering::Relaxed);
        let header = self.carrier().recv(buf);
        self.busy_since.store(self.now(), Ordering::Relaxed);
        header
    }

    pub fn send(&self, header: &Header, payload: &[u8]) -> Result<(), TransportError> {
        let sent = self.carrier().send(header, payload);
        self.last_sent.store(self.now(), Ordering::Relaxed);
        sent
    }

    /// Stops the heartbeat, whose thread holds the line until then: the
    /// session calls this as it ends.
    pub fn stop(&self) {
        if self.stopped.swap(true, Ordering::Relaxed) {
            return;
        }
        *self.stop.0.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.stop.1.notify_all();
    }

    fn beat(&self) {
        let interval = HEARTBEAT.as_micros() as u64;
        let mut stopped = self.stop.0.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            // Checks a few times an interval, so that a call is heard from
            // soon after it has run for one.
            stopped = self.stop.1.wait_timeout(stopped, HEARTBEAT / 4).unwrap_or_else(PoisonError::into_inner).0;
            if *stopped {
                return;
            }
            let now = self.now();
            let busy_since = self.busy_since.load(Ordering::Relaxed);
            let quiet = now.saturating_sub(self.last_sent.load(Ordering::Relaxed)) >= interval;
            if busy_since == 0 || now.saturating_sub(busy_since) < interval || !quiet {
                continue;
            }
            // The session's thread holds the connection only to move a
            // frame; if it does, the guest is hearing from it anyway.
            if let Ok(mut carrier) = self.carrier.try_lock() {
                let beat = Header::request(Opcode::Heartbeat, 0, 0, 0);
                if carrier.send(&beat, &[]).is_err() {
                    return;
                }
                self.last_sent.store(now, Ordering::Relaxed);
            }
        }
    }
}
