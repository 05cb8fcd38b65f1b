//! Posted launches held back while more frames wait, then run together.
//!
//! A posted launch is checked and resolved when its frame is read, but
//! reaches the driver only when no further frame has arrived yet, when a
//! frame other than a posted launch comes, or when [`MAX_HELD`] are held.
//! Reading frames in a run and then launching back to back keeps each side's
//! code and data warm in the core's caches, where alternating evicts them.
//! Timed inside the session on the H100 machine (empty kernels, the
//! driver's own 3–4 µs per launch split off, the same build either way),
//! the session's own work per launch was 0.35–0.46 µs launching each at
//! once and 0.20–0.34 µs held, timer reads of about 0.09 µs included. A
//! launch is held only while the next frame is already there, so nothing
//! waits for a frame that may never come.
//!
//! Order is kept: held launches run before any other call, and before the
//! failure of a launch's own checks is recorded, so that the first error of
//! a run of posted calls is still the one the client sees.

use gpuplex_protocol::{CallError, Opcode};

use crate::backend::{self, Backend, Obj};

/// Launches held at most: 8 gained less in a first trial, and more would
/// keep the first one from the GPU longer (each is read in about 0.2 µs).
const MAX_HELD: usize = 32;

/// A launch checked against the session's tables, ready for the backend.
pub(super) struct ReadyLaunch {
    pub ctx: Obj,
    pub func: Obj,
    pub launch: backend::Launch,
    pub params: Vec<u8>,
}

impl ReadyLaunch {
    pub fn run(&self, backend: &dyn Backend) -> Result<(), CallError> {
        backend.launch(self.ctx, self.func, &self.launch, &self.params)
    }
}

#[derive(Default)]
pub(super) struct Held {
    launches: Vec<ReadyLaunch>,
}

impl Held {
    pub fn push(&mut self, launch: ReadyLaunch) {
        self.launches.push(launch);
    }

    pub fn is_full(&self) -> bool {
        self.launches.len() >= MAX_HELD
    }

    /// Runs every held launch in order; the first to fail is kept in
    /// `deferred` unless an earlier posted call failed already.
    pub fn run(&mut self, backend: &dyn Backend, deferred: &mut Option<(Opcode, CallError)>) {
        for launch in self.launches.drain(..) {
            if let Err(e) = launch.run(backend) {
                tracing::debug!(code = e.code.0, detail = %e.detail, "posted launch failed");
                deferred.get_or_insert((Opcode::Launch, e));
            }
        }
    }
}
