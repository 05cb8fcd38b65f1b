//! The gpuplex server: owns the GPUs and runs guests' driver calls on them.
//!
//! Two kinds of process make it up. The [`supervisor`] accepts guests,
//! knows their tenants and what each holds, and answers for the server
//! (status, metrics); it never touches a GPU. Each guest runs in a
//! [`worker`] process of its own, which owns that guest's CUDA contexts and
//! runs its [`session`] against a [`backend`]: the GPU isolates processes,
//! so a guest's kernels can reach no other guest's memory and its faults
//! end no other guest's work. The two share each tenant's [`ledger`].

pub mod backend;
pub mod config;
pub mod image;
pub mod ledger;
pub mod sched;
pub mod session;
pub mod supervisor;
pub mod worker;

use std::sync::Arc;

pub use supervisor::{Placement, Supervisor, WorkerCommand};

use backend::Backend;

/// The most sessions a server holds at once (and so a tenant at most).
pub const MAX_SESSIONS: usize = 1024;

/// Which GPU backend a server drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// Real GPUs through the CUDA driver.
    Cuda,
    /// The host-memory test device.
    Emulated,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cuda => "cuda",
            BackendKind::Emulated => "emulated",
        }
    }
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
        #[cfg(feature = "emulated")]
        BackendKind::Emulated => Arc::new(backend::emulated::Emulated::new()),
        #[cfg(not(feature = "emulated"))]
        BackendKind::Emulated => {
            return Err(
                "this gpuplex was built without the emulated test device (build it with --features emulated)".into()
            )
        }
    })
}

/// An error and its sources, as one line.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
