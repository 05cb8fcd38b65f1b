//! The gpuplex server: owns the GPUs and runs guests' driver calls on them.
//!
//! A [`Server`] accepts connections on a [`Listener`] and runs each one as a
//! [`session::Session`] on its own thread; sessions share only the
//! [`Backend`] and the [`Registry`] of live sessions. The accept loop does no
//! I/O with a peer: authentication (TCP) and the handshake run on the
//! session's thread, so a slow or silent peer delays no one else.

pub mod backend;
pub mod config;
pub mod image;
mod registry;
pub mod session;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use gpuplex_transport::{Listener, TransportError};
use tracing::{error, info, warn};

pub use registry::Registry;

use backend::Backend;

/// Which GPU backend a server drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// Real GPUs through the CUDA driver.
    Cuda,
    /// The host-memory test device.
    Emulated,
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> Result<BackendKind, String> {
        match s {
            "cuda" => Ok(BackendKind::Cuda),
            "emulated" => Ok(BackendKind::Emulated),
            _ => Err(format!("unknown backend {s:?}: expected cuda or emulated")),
        }
    }
}

/// Opens the backend of the given kind.
pub fn open_backend(kind: BackendKind) -> Result<Arc<dyn Backend>, Box<dyn std::error::Error + Send + Sync>> {
    Ok(match kind {
        BackendKind::Cuda => Arc::new(backend::cuda::Cuda::open()?),
        BackendKind::Emulated => Arc::new(backend::emulated::Emulated::new()),
    })
}

/// The most connections served at once, sessions and peers still proving
/// themselves alike; more are refused.
pub const MAX_SESSIONS: usize = 1024;
/// Consecutive accept failures after which the listener is given up.
const MAX_ACCEPT_FAILURES: u32 = 100;

pub struct Server {
    backend: Arc<dyn Backend>,
    registry: Arc<Registry>,
    /// Connection threads alive, counted from accept: unlike the registry,
    /// this includes peers that have not authenticated yet, which must not
    /// be able to start threads without bound.
    connections: Arc<AtomicUsize>,
}

/// One connection thread, counted for as long as it lives.
struct ConnectionSlot(Arc<AtomicUsize>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Server {
    pub fn new(backend: Arc<dyn Backend>) -> Server {
        Server { backend, registry: Arc::new(Registry::default()), connections: Arc::new(AtomicUsize::new(0)) }
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Accepts connections until the listener fails.
    pub fn serve(&self, listener: &dyn Listener) -> Result<(), TransportError> {
        info!(address = %listener.address(), backend = self.backend.kind(), "serving");
        let mut failures = 0;
        loop {
            let carrier = match listener.accept() {
                Ok(c) => {
                    failures = 0;
                    c
                }
                // A peer that vanished mid-accept, or a passing shortage of
                // descriptors, concerns nobody else; a listener that keeps
                // failing is broken.
                Err(e) if failures < MAX_ACCEPT_FAILURES => {
                    failures += 1;
                    warn!("accept failed: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                }
                Err(e) => return Err(e),
            };
            if self.connections.load(Ordering::Relaxed) >= MAX_SESSIONS {
                warn!(peer = %carrier.peer(), "refusing a connection: {MAX_SESSIONS} connections already");
                continue;
            }
            self.connections.fetch_add(1, Ordering::Relaxed);
            let slot = ConnectionSlot(self.connections.clone());
            let (backend, registry) = (self.backend.clone(), self.registry.clone());
            let spawned = std::thread::Builder::new().name("gpuplex-session".into()).spawn(move || {
                let _slot = slot;
                session::Session::run(carrier, backend, registry)
            });
            if let Err(e) = spawned {
                error!("cannot start a session thread: {e}");
            }
        }
    }
}
