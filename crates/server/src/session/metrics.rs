//! Per-session counters, read by `gpuplex info` while the session runs.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use gpuplex_transport::Peer;

pub struct SessionMetrics {
    pub id: u64,
    pub peer: Peer,
    pub program: String,
    pub started: Instant,
    calls: AtomicU64,
    contexts: AtomicU32,
    device_bytes: AtomicU64,
}

impl SessionMetrics {
    pub fn new(id: u64, peer: Peer, program: String) -> SessionMetrics {
        SessionMetrics {
            id,
            peer,
            program,
            started: Instant::now(),
            calls: AtomicU64::new(0),
            contexts: AtomicU32::new(0),
            device_bytes: AtomicU64::new(0),
        }
    }

    /// Only the session's own thread counts, so a plain load and store do:
    /// a locked add took about 2% of the session thread's time per launch
    /// (emulated device).
    pub fn count_call(&self) {
        self.calls.store(self.calls.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    pub fn set_usage(&self, contexts: u32, device_bytes: u64) {
        self.contexts.store(contexts, Ordering::Relaxed);
        self.device_bytes.store(device_bytes, Ordering::Relaxed);
    }

    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    pub fn contexts(&self) -> u32 {
        self.contexts.load(Ordering::Relaxed)
    }

    pub fn device_bytes(&self) -> u64 {
        self.device_bytes.load(Ordering::Relaxed)
    }
}
