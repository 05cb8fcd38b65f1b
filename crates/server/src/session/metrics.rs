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

    pub fn count_call(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
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
