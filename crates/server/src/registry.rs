//! The live sessions of a server, for `gpuplex info` and admission, and
//! their lanes' keys, for lane connections to find them by.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use gpuplex_protocol::{Seq, ServerSummary, SessionSummary};
use gpuplex_transport::Peer;

use crate::backend::Backend;
use crate::session::lanes::Hubs;
use crate::session::metrics::SessionMetrics;

#[derive(Default)]
pub struct Registry {
    next_id: AtomicU64,
    sessions: Mutex<BTreeMap<u64, Arc<SessionMetrics>>>,
    /// Sessions' bulk lanes, for lane connections to join.
    pub lanes: Hubs,
}

impl Registry {
    pub fn open(&self, peer: Peer, program: String) -> Arc<SessionMetrics> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let metrics = Arc::new(SessionMetrics::new(id, peer, program));
        self.lock().insert(id, metrics.clone());
        metrics
    }

    pub fn close(&self, id: u64) {
        self.lock().remove(&id);
        self.lanes.close(id);
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn summary(&self, backend: &dyn Backend) -> ServerSummary {
        let sessions = self
            .lock()
            .values()
            .map(|m| SessionSummary {
                id: m.id,
                pid: m.peer.pid().unwrap_or(SessionSummary::NO_PID),
                uid: m.peer.uid().unwrap_or(SessionSummary::NO_UID),
                program: m.program.clone(),
                contexts: m.contexts(),
                device_bytes: m.device_bytes(),
                calls: m.calls(),
                seconds: m.started.elapsed().as_secs(),
            })
            .collect();
        ServerSummary {
            backend: backend.kind().to_owned(),
            driver_version: backend.driver_version(),
            devices: Seq(backend.devices().to_vec()),
            sessions: Seq(sessions),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<SessionMetrics>>> {
        // A panicking session thread must not take `info` down with it.
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
