//! A small pinned buffer for a session's short device-to-host reads.
//!
//! The bytes of a short read travel in the reply frame either way, but the
//! driver copies into pinned memory faster than into the heap
//! (`docs/performance.md`). Registered as the session's other memory is (see
//! `shared.rs`): from the copy's context, again after that context ends.
//! Where it cannot be registered, reads go through the heap as before.

use gpuplex_transport::shm::Region;
use tracing::debug;

use super::shared::register_once;
use crate::backend::{Backend, Obj};

/// Reads up to this size use the buffer.
pub const SCRATCH_BYTES: usize = 64 << 10;

#[derive(Default)]
pub struct Scratch {
    region: Option<Region>,
    /// The context the buffer is registered from, if any.
    registered: Option<Obj>,
    /// Registration failed once: the heap it is, for this session.
    unavailable: bool,
}

impl Scratch {
    /// `len` bytes of pinned memory usable from `ctx`, or None (too long, or
    /// no pinned memory to be had).
    pub fn pinned(&mut self, backend: &dyn Backend, ctx: Obj, len: usize) -> Option<&mut [u8]> {
        if len > SCRATCH_BYTES || self.unavailable {
            return None;
        }
        if self.region.is_none() {
            match Region::create("gpuplex-scratch", SCRATCH_BYTES) {
                Ok(region) => self.region = Some(region),
                Err(e) => return self.give_up(&e.to_string()),
            }
        }
        let region = self.region.as_ref()?;
        // SAFETY: the region lives in `self` until `teardown` unregisters it.
        let registered = unsafe { register_once(backend, ctx, &mut self.registered, region.as_ptr(), region.len()) };
        if let Err(e) = registered {
            return self.give_up(&e.detail);
        }
        // SAFETY: the region is `SCRATCH_BYTES` long and only this session's
        // thread uses it, one read at a time.
        Some(unsafe { std::slice::from_raw_parts_mut(region.as_ptr(), len) })
    }

    fn give_up(&mut self, why: &str) -> Option<&mut [u8]> {
        debug!("short reads go through the heap: no pinned buffer for them: {why}");
        self.unavailable = true;
        None
    }

    /// Forgets a registration that died with its context.
    pub fn context_gone(&mut self, ctx: Obj) {
        if self.registered == Some(ctx) {
            self.registered = None;
        }
    }

    pub fn teardown(&mut self, backend: &dyn Backend) {
        if let (Some(ctx), Some(region)) = (self.registered.take(), &self.region) {
            if let Err(e) = backend.host_unregister(ctx, region.as_ptr()) {
                tracing::warn!("teardown: scratch unregister failed: {e}");
            }
        }
    }
}
