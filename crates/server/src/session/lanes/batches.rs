//! A copy's DMAs in small batches, each issued in one driver call and
//! marked by an event, so that every batch's slots go back (to their
//! lane's reader, or out to its writer) as soon as its DMAs are done, while
//! later batches still run: the first lanes send within tens of
//! microseconds instead of waiting for a whole round of chunks.
//!
//! A batch's DMAs wait until it is sealed (full, or the session is about to
//! wait) and then go to the driver together ([`crate::backend::Memory::memcpy_host_batch`]):
//! the copy engine takes DMAs faster in one call than one call each
//! (`docs/performance.md`, *Bulk lanes*).

use std::collections::VecDeque;

use gpuplex_protocol::{CallError, CuError};
use tracing::warn;

use crate::backend::{Backend, HostCopy, Obj, CU_EVENT_DISABLE_TIMING};

/// Chunks per batch: one event per batch, recorded and queried by the
/// session's thread between chunks. Smaller and larger batches moved no
/// more (`docs/performance.md`).
const BATCH: usize = 4;
/// Batches in flight at most (one event each); a session that would issue
/// more waits for the oldest.
const IN_FLIGHT: usize = 8;

/// What a context's lane copies run with: a stream of their own, which
/// waits for `start`, recorded in the copy's stream, and the events that
/// mark batches done. (The driver refuses batches of copies in the legacy
/// default stream, which most copies name.)
pub struct Fences {
    pub ctx: Obj,
    stream: Option<Obj>,
    start: Option<Obj>,
    events: Vec<Obj>,
}

/// `CU_STREAM_NON_BLOCKING`: the lanes' stream keeps no implicit order with
/// the legacy default stream; each copy orders it explicitly.
const NON_BLOCKING: u32 = 0x1;

impl Fences {
    pub fn new(backend: &dyn Backend, ctx: Obj) -> Result<Fences, CallError> {
        let mut fences = Fences { ctx, stream: None, start: None, events: Vec::with_capacity(IN_FLIGHT) };
        let made = (|| {
            fences.stream = Some(backend.stream_create(ctx, NON_BLOCKING, 0)?);
            fences.start = Some(backend.event_create(ctx, CU_EVENT_DISABLE_TIMING)?);
            for _ in 0..IN_FLIGHT {
                fences.events.push(backend.event_create(ctx, CU_EVENT_DISABLE_TIMING)?);
            }
            Ok(())
        })();
        match made {
            Ok(()) => Ok(fences),
            Err(e) => {
                fences.destroy(backend);
                Err(e)
            }
        }
    }

    pub fn destroy(self, backend: &dyn Backend) {
        for event in self.events.into_iter().chain(self.start) {
            if let Err(e) = backend.event_destroy(self.ctx, event) {
                warn!("lane batch event destroy failed: {e}");
            }
        }
        if let Some(stream) = self.stream {
            if let Err(e) = backend.stream_destroy(self.ctx, stream) {
                warn!("lane stream destroy failed: {e}");
            }
        }
    }

    /// The lanes' stream, made to wait for everything issued in `stream`
    /// so far.
    fn join(&self, backend: &dyn Backend, stream: Obj) -> Result<Obj, CallError> {
        let (Some(own), Some(start)) = (self.stream, self.start) else { unreachable!("made whole or not at all") };
        backend.event_record(self.ctx, start, stream, 0)?;
        backend.stream_wait_event(self.ctx, own, start, 0)?;
        Ok(own)
    }
}

/// The slots (`T`) of one copy's DMAs, in one stream, oldest first.
pub struct Batches<'a, T> {
    backend: &'a dyn Backend,
    /// The copy's context and the stream its DMAs go in, if it has them.
    target: Option<(Obj, Obj)>,
    /// The events batches are marked with; none if the target's context has
    /// none (or its stream could not be joined), and then every batch is
    /// waited for with its stream.
    events: Vec<Obj>,
    /// The batch being gathered: its slots, and the DMAs not yet issued.
    filling: Vec<T>,
    copies: Vec<HostCopy>,
    /// Sealed batches, oldest first, each with its event's index.
    in_flight: VecDeque<(usize, Vec<T>)>,
    /// The event the next sealed batch gets.
    next_event: usize,
}

impl<'a, T> Batches<'a, T> {
    /// A copy's batches, in `fences`' stream once it waits for the copy's
    /// own; in the copy's stream, each batch waited for, if that fails.
    pub fn new(backend: &'a dyn Backend, target: &Result<(Obj, Obj), CallError>, fences: Option<&Fences>) -> Self {
        let mut target = target.as_ref().ok().copied();
        let fences = fences.filter(|f| target.is_some_and(|(ctx, _)| ctx == f.ctx));
        let mut events = Vec::new();
        if let (Some(fences), Some((ctx, stream))) = (fences, target) {
            match fences.join(backend, stream) {
                Ok(own) => (target, events) = (Some((ctx, own)), fences.events.clone()),
                Err(e) => warn!("lane DMAs go in the copy's own stream, one batch at a time: {e}"),
            }
        }
        Batches {
            backend,
            target,
            events,
            filling: Vec::new(),
            copies: Vec::new(),
            in_flight: VecDeque::new(),
            next_event: 0,
        }
    }

    /// Adds a slot and the DMA to make with it (none if there is nothing to
    /// copy; none is made once the copy has failed), and seals the batch
    /// once it is full. Returns the slots of batches that finished
    /// meanwhile. A failed DMA or event fails the copy's `outcome`.
    ///
    /// # Safety
    /// The copy's host memory is registered, valid for its length, and left
    /// alone until its slot comes back from these batches.
    pub unsafe fn push(&mut self, slot: T, copy: Option<HostCopy>, outcome: &mut Result<(), CallError>) -> Vec<T> {
        self.filling.push(slot);
        self.copies.extend(copy.filter(|_| outcome.is_ok()));
        let mut done = if self.filling.len() == BATCH { self.seal(outcome) } else { Vec::new() };
        done.append(&mut self.done(outcome));
        done
    }

    /// Issues the gathered DMAs in one call, unless the copy has failed.
    fn issue(&mut self, outcome: &mut Result<(), CallError>) {
        let copies = std::mem::take(&mut self.copies);
        let (Some((ctx, stream)), false, Ok(())) = (self.target, copies.is_empty(), &outcome) else { return };
        // SAFETY: what `push`'s callers promise of each copy.
        if let Err(e) = unsafe { self.backend.memcpy_host_batch(ctx, &copies, stream) } {
            *outcome = Err(e);
        }
    }

    /// Issues the batch being gathered and records an event after it, so
    /// that it can be seen to finish; waits for the oldest batch first if
    /// every event is taken. Returns the slots of any batch it waited for.
    pub fn seal(&mut self, outcome: &mut Result<(), CallError>) -> Vec<T> {
        let Some((ctx, stream)) = self.target else { return self.finish(outcome) };
        if self.filling.is_empty() {
            return Vec::new();
        }
        self.issue(outcome);
        if outcome.is_err() || self.events.is_empty() {
            return self.finish(outcome);
        }
        let mut done = Vec::new();
        if self.in_flight.len() == self.events.len() {
            let (event, oldest) = self.in_flight.pop_front().expect("every event is in flight");
            done = oldest;
            if let Err(e) = self.backend.event_synchronize(ctx, self.events[event]) {
                *outcome = Err(e);
                done.append(&mut self.finish(outcome));
                return done;
            }
        }
        let event = self.next_event;
        if let Err(e) = self.backend.event_record(ctx, self.events[event], stream, 0) {
            *outcome = Err(e);
            done.append(&mut self.finish(outcome));
            return done;
        }
        self.next_event = (event + 1) % self.events.len();
        self.in_flight.push_back((event, std::mem::take(&mut self.filling)));
        done
    }

    /// The slots of the sealed batches that have finished, without waiting.
    pub fn done(&mut self, outcome: &mut Result<(), CallError>) -> Vec<T> {
        let mut done = Vec::new();
        let Some((ctx, _)) = self.target else { return done };
        while let Some(&(event, _)) = self.in_flight.front() {
            match self.backend.event_query(ctx, self.events[event]) {
                Ok(()) => done.append(&mut self.in_flight.pop_front().expect("looked at").1),
                Err(e) if e.code == CuError::NOT_READY => break,
                Err(e) => {
                    *outcome = Err(e);
                    done.append(&mut self.finish(outcome));
                    break;
                }
            }
        }
        done
    }

    /// Waits for the oldest batch, sealing the one being issued if none is
    /// sealed, and returns its slots.
    pub fn wait_oldest(&mut self, outcome: &mut Result<(), CallError>) -> Vec<T> {
        if self.in_flight.is_empty() {
            let done = self.seal(outcome);
            if !done.is_empty() || self.in_flight.is_empty() {
                return done;
            }
        }
        let (Some((ctx, _)), Some((event, mut batch))) = (self.target, self.in_flight.pop_front()) else {
            return self.finish(outcome);
        };
        if let Err(e) = self.backend.event_synchronize(ctx, self.events[event]) {
            *outcome = Err(e);
            batch.append(&mut self.finish(outcome));
        }
        batch
    }

    /// Whether every slot pushed has been returned.
    pub fn is_empty(&self) -> bool {
        self.filling.is_empty() && self.in_flight.is_empty()
    }

    /// Issues what is gathered, waits for every DMA and returns every slot.
    pub fn finish(&mut self, outcome: &mut Result<(), CallError>) -> Vec<T> {
        self.issue(outcome);
        let mut all: Vec<T> = self.in_flight.drain(..).flat_map(|(_, batch)| batch).collect();
        all.append(&mut self.filling);
        if let (false, Some((ctx, stream))) = (all.is_empty(), self.target) {
            // No DMA may still touch a slot about to be released.
            let synced = self.backend.stream_synchronize(ctx, stream);
            if outcome.is_ok() {
                *outcome = synced;
            }
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::emulated::Emulated;
    use crate::backend::prelude::*;

    /// An emulated device with a context, a stream and the lanes' fences.
    fn device() -> (Emulated, Obj, Obj, Fences) {
        let e = Emulated::new();
        let ctx = e.ctx_create(0, 0).unwrap();
        let stream = e.stream_create(ctx, 0, 0).unwrap();
        let fences = Fences::new(&e, ctx).unwrap();
        (e, ctx, stream, fences)
    }

    /// The emulated device finishes each DMA as it is issued, so a batch is
    /// done as soon as it is sealed: what comes back, and when, is the
    /// bookkeeping alone.
    #[test]
    fn slots_come_back_a_batch_at_a_time_and_all_at_the_end() {
        let (e, ctx, stream, fences) = device();
        let target = Ok((ctx, stream));
        let mut outcome = Ok(());
        let mut batches = Batches::new(&e, &target, Some(&fences));
        let mut back = Vec::new();
        for slot in 0..BATCH * (IN_FLIGHT + 2) + 3 {
            // SAFETY: no copies.
            let done = unsafe { batches.push(slot, None, &mut outcome) };
            // A full batch comes back whole, the moment it is sealed.
            assert!(done.is_empty() || done.len() == BATCH, "{done:?}");
            back.extend(done);
        }
        assert_eq!(back, (0..BATCH * (IN_FLIGHT + 2)).collect::<Vec<_>>(), "in order, none twice");
        assert_eq!(batches.wait_oldest(&mut outcome), (back.len()..back.len() + 3).collect::<Vec<_>>());
        assert!(batches.is_empty() && batches.finish(&mut outcome).is_empty());
        // SAFETY: no copies.
        unsafe { batches.push(100, None, &mut outcome) };
        assert_eq!(batches.finish(&mut outcome), vec![100]);
        assert!(outcome.is_ok());
        fences.destroy(&e);
    }

    /// Without a target there is nothing to wait for: slots come back at
    /// once, and the copy's own error stands.
    #[test]
    fn a_copy_without_a_target_gets_its_slots_back_untouched() {
        let e = Emulated::new();
        let target = Err(CallError::new(CuError::INVALID_CONTEXT, "no context"));
        let mut outcome = Err(CallError::new(CuError::INVALID_CONTEXT, "no context"));
        let mut batches = Batches::new(&e, &target, None);
        let dma = HostCopy { way: crate::backend::Way::ToDevice, device: 0x1000, host: std::ptr::null_mut(), len: 8 };
        // SAFETY: the copy has failed already, so no DMA is made.
        let back: Vec<_> = (0..BATCH).flat_map(|slot| unsafe { batches.push(slot, Some(dma), &mut outcome) }).collect();
        assert_eq!(back, (0..BATCH).collect::<Vec<_>>());
        assert_eq!(outcome.unwrap_err().code, CuError::INVALID_CONTEXT);
    }

    /// A batch's DMAs wait until it is sealed, then go together; `finish`
    /// makes those of a batch not yet full, both ways.
    #[test]
    fn dmas_wait_for_their_batch_and_finish_makes_the_rest() {
        use crate::backend::Way;
        let (e, ctx, stream, fences) = device();
        let n = BATCH + 2;
        let device = e.mem_alloc(ctx, 8 * n as u64).unwrap();
        let mut host: Vec<[u8; 8]> = (0..n).map(|i| [i as u8 + 1; 8]).collect();
        let (target, mut outcome) = (Ok((ctx, stream)), Ok(()));
        let mut batches = Batches::new(&e, &target, Some(&fences));
        let read = || {
            let mut all = vec![0u8; 8 * n];
            e.memcpy_dtoh(ctx, &mut all, device, stream).unwrap();
            all
        };
        for (i, bytes) in host.iter_mut().enumerate() {
            let at = device + 8 * i as u64;
            let dma = HostCopy { way: Way::ToDevice, device: at, host: bytes.as_mut_ptr(), len: 8 };
            // SAFETY: `host` outlives the batches and is left alone.
            unsafe { batches.push(i, Some(dma), &mut outcome) };
            let landed = read().chunks(8).filter(|c| c[0] != 0).count();
            assert_eq!(landed, if i + 1 < BATCH { 0 } else { BATCH }, "after {} pushed", i + 1);
        }
        batches.finish(&mut outcome);
        let expected: Vec<u8> = (0..n).flat_map(|i| [i as u8 + 1; 8]).collect();
        assert_eq!(read(), expected);

        let mut back = vec![[0u8; 8]; n];
        let mut batches = Batches::new(&e, &target, Some(&fences));
        let mut returned = 0;
        for (i, bytes) in back.iter_mut().enumerate() {
            let dma =
                HostCopy { way: Way::FromDevice, device: device + 8 * i as u64, host: bytes.as_mut_ptr(), len: 8 };
            // SAFETY: as above; `back` is read only after `finish`.
            returned += unsafe { batches.push(i, Some(dma), &mut outcome) }.len();
        }
        assert_eq!(returned + batches.finish(&mut outcome).len(), n);
        assert_eq!(back.concat(), expected);
        assert!(outcome.is_ok());
        fences.destroy(&e);
    }
}
