//! A copy's DMAs in small batches, each marked by an event, so that every
//! batch's slots go back (to their lane's reader, or out to its writer) as
//! soon as its DMAs are done, while later batches still run.
//!
//! Before, DMAs went in rounds of one chunk per lane with two rounds in
//! flight, and a round's slots came back only once the next round had been
//! issued: from the device, the first chunk of a copy reached its lane
//! after about 32 chunks' worth of DMA, and the lanes started one after the
//! other. Checking batches of a few chunks with `cuEventQuery` after every
//! chunk lets the first lanes send within tens of microseconds.

use std::collections::VecDeque;

use gpuplex_protocol::{CallError, CuError};
use tracing::warn;

use crate::backend::{Backend, Obj, CU_EVENT_DISABLE_TIMING};

/// Chunks per batch: one event per batch, recorded and queried by the
/// session's thread between chunks. (Device to host, a batch of one, so
/// that each chunk went out as soon as its DMA was done, moved no more.)
const BATCH: usize = 4;
/// Batches in flight at most (one event each); a session that would issue
/// more waits for the oldest.
const IN_FLIGHT: usize = 8;

/// The events that mark batches done, made in one context.
pub struct Fences {
    pub ctx: Obj,
    events: Vec<Obj>,
}

impl Fences {
    pub fn new(backend: &dyn Backend, ctx: Obj) -> Result<Fences, CallError> {
        let mut fences = Fences { ctx, events: Vec::with_capacity(IN_FLIGHT) };
        for _ in 0..IN_FLIGHT {
            match backend.event_create(ctx, CU_EVENT_DISABLE_TIMING) {
                Ok(event) => fences.events.push(event),
                Err(e) => {
                    fences.destroy(backend);
                    return Err(e);
                }
            }
        }
        Ok(fences)
    }

    pub fn destroy(self, backend: &dyn Backend) {
        for event in self.events {
            if let Err(e) = backend.event_destroy(self.ctx, event) {
                warn!("lane batch event destroy failed: {e}");
            }
        }
    }
}

/// The slots (`T`) of one copy's DMAs, issued in one stream, oldest first.
pub struct Batches<'a, T> {
    backend: &'a dyn Backend,
    /// The copy's context and stream, if it has them.
    target: Option<(Obj, Obj)>,
    /// The events batches are marked with; none if the target's context has
    /// none, and then every batch is waited for with its stream.
    events: Vec<Obj>,
    /// The batch being issued, no event recorded after it yet.
    filling: Vec<T>,
    /// Sealed batches, oldest first, each with its event's index.
    in_flight: VecDeque<(usize, Vec<T>)>,
    /// The event the next sealed batch gets.
    next_event: usize,
}

impl<'a, T> Batches<'a, T> {
    pub fn new(backend: &'a dyn Backend, target: &Result<(Obj, Obj), CallError>, fences: Option<&Fences>) -> Self {
        let target = target.as_ref().ok().copied();
        let events = fences.filter(|f| target.is_some_and(|(ctx, _)| ctx == f.ctx)).map(|f| f.events.clone());
        Batches {
            backend,
            target,
            events: events.unwrap_or_default(),
            filling: Vec::new(),
            in_flight: VecDeque::new(),
            next_event: 0,
        }
    }

    /// Adds the slot of a DMA just issued, and seals the batch once it is
    /// full. Returns the slots of batches that finished meanwhile. A failed
    /// event fails the copy's `outcome`.
    pub fn push(&mut self, slot: T, outcome: &mut Result<(), CallError>) -> Vec<T> {
        self.filling.push(slot);
        let mut done = if self.filling.len() == BATCH { self.seal(outcome) } else { Vec::new() };
        done.append(&mut self.done(outcome));
        done
    }

    /// Records an event after the batch being issued, so that it can be
    /// seen to finish; waits for the oldest batch first if every event is
    /// taken. Returns the slots of any batch it waited for.
    pub fn seal(&mut self, outcome: &mut Result<(), CallError>) -> Vec<T> {
        let Some((ctx, stream)) = self.target else { return self.finish(outcome) };
        if self.filling.is_empty() {
            return Vec::new();
        }
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

    /// Whether every DMA issued has been returned.
    pub fn is_empty(&self) -> bool {
        self.filling.is_empty() && self.in_flight.is_empty()
    }

    /// Waits for every DMA issued and returns every slot.
    pub fn finish(&mut self, outcome: &mut Result<(), CallError>) -> Vec<T> {
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

    /// The emulated device finishes each DMA as it is issued, so a batch is
    /// done as soon as it is sealed: what comes back, and when, is the
    /// bookkeeping alone.
    #[test]
    fn slots_come_back_a_batch_at_a_time_and_all_at_the_end() {
        let e = Emulated::new();
        let ctx = e.ctx_create(0, 0).unwrap();
        let stream = e.stream_create(ctx, 0, 0).unwrap();
        let fences = Fences::new(&e, ctx).unwrap();
        let target = Ok((ctx, stream));
        let mut outcome = Ok(());
        let mut batches = Batches::new(&e, &target, Some(&fences));
        let mut back = Vec::new();
        for slot in 0..BATCH * (IN_FLIGHT + 2) + 3 {
            let done = batches.push(slot, &mut outcome);
            // A full batch comes back whole, the moment it is sealed.
            assert!(done.is_empty() || done.len() == BATCH, "{done:?}");
            back.extend(done);
        }
        assert_eq!(back, (0..BATCH * (IN_FLIGHT + 2)).collect::<Vec<_>>(), "in order, none twice");
        assert_eq!(batches.wait_oldest(&mut outcome), (back.len()..back.len() + 3).collect::<Vec<_>>());
        assert!(batches.is_empty() && batches.finish(&mut outcome).is_empty());
        batches.push(100, &mut outcome);
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
        let back: Vec<_> = (0..BATCH).flat_map(|slot| batches.push(slot, &mut outcome)).collect();
        assert_eq!(back, (0..BATCH).collect::<Vec<_>>());
        assert_eq!(outcome.unwrap_err().code, CuError::INVALID_CONTEXT);
    }
}
