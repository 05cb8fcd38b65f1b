//! Chunks from the device whose DMAs are done, for whichever lane is ready
//! first.
//!
//! The session puts each finished chunk here, in copy order, and a lane's
//! writer takes the next one only when its lane has fewer than [`AHEAD`]
//! unanswered: chunks go to the lanes that drain, as they do the other way
//! (`lane::AHEAD`). A chunk's lane fixed when its DMA is issued would leave
//! every lane holding its share at the end of a copy, and the copy waiting
//! for the slowest. Each writer ends its lane's share of the copy once none
//! are left. Figures: `docs/performance.md`.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use gpuplex_protocol::lane::ChunkHeader;

/// Chunks a writer keeps unanswered on its lane: one the client reads while
/// the next waits in its socket.
pub const AHEAD: usize = 2;

/// An out slot, named by the lane it was cut for and its place there; any
/// lane's writer may send from it.
pub type OutSlot = (usize, usize);

/// What a writer takes next.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    Chunk(OutSlot, ChunkHeader),
    /// Every chunk of this copy has been taken: end the lane's share.
    End(u64),
}

#[derive(Default)]
pub struct Outbox {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    chunks: VecDeque<(OutSlot, ChunkHeader)>,
    /// The last copy all of whose chunks have been put here.
    ended: u64,
    closed: bool,
}

impl Outbox {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Offers a chunk whose DMA is done (or whose copy failed).
    pub fn put(&self, slot: OutSlot, header: ChunkHeader) {
        self.lock().chunks.push_back((slot, header));
        self.changed.notify_one();
    }

    /// Says that every chunk of `copy` has been put: each writer ends its
    /// share once none is left.
    pub fn end(&self, copy: u64) {
        self.lock().ended = copy;
        self.changed.notify_all();
    }

    /// Wakes every writer for good: the session is over.
    pub fn close(&self) {
        self.lock().closed = true;
        self.changed.notify_all();
    }

    /// The next chunk, or the end of a copy newer than `ended` (the last
    /// this writer ended), waiting for either; `None` once closed.
    pub fn next(&self, ended: u64) -> Option<Next> {
        let mut state = self.lock();
        loop {
            if state.closed {
                return None;
            }
            if let Some((slot, header)) = state.chunks.pop_front() {
                return Some(Next::Chunk(slot, header));
            }
            if state.ended > ended {
                return Some(Next::End(state.ended));
            }
            state = self.changed.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn every_chunk_goes_once_and_every_writer_ends_each_copy() {
        const WRITERS: usize = 4;
        let outbox = Arc::new(Outbox::default());
        let (ends_tx, ends) = std::sync::mpsc::channel();
        let writers: Vec<_> = (0..WRITERS)
            .map(|_| {
                let (outbox, ends_tx) = (outbox.clone(), ends_tx.clone());
                std::thread::spawn(move || {
                    let (mut taken, mut ended) = (Vec::new(), 0);
                    while let Some(next) = outbox.next(ended) {
                        match next {
                            Next::Chunk(_, header) => taken.push((header.copy.get(), header.offset.get())),
                            Next::End(copy) => {
                                assert_eq!(copy, ended + 1, "each copy ended once, in order");
                                ended = copy;
                                ends_tx.send(copy).unwrap();
                            }
                        }
                    }
                    taken
                })
            })
            .collect();
        for copy in 1..=3 {
            for offset in 0..50 {
                outbox.put((0, 0), ChunkHeader::new(copy, offset, 1));
            }
            outbox.end(copy);
            // As a client does, the next copy waits for every lane's end.
            for _ in 0..WRITERS {
                assert_eq!(ends.recv().unwrap(), copy);
            }
        }
        outbox.close();
        let mut all: Vec<_> = writers.into_iter().flat_map(|w| w.join().unwrap()).collect();
        all.sort();
        let expected: Vec<_> = (1..=3).flat_map(|c| (0..50).map(move |o| (c, o))).collect();
        assert_eq!(all, expected, "every chunk taken exactly once");
    }

    #[test]
    fn chunks_come_before_the_end_and_close_wakes_a_waiting_writer() {
        let outbox = Outbox::default();
        outbox.put((1, 2), ChunkHeader::new(7, 0, 4));
        outbox.end(7);
        assert_eq!(outbox.next(0), Some(Next::Chunk((1, 2), ChunkHeader::new(7, 0, 4))));
        assert_eq!(outbox.next(0), Some(Next::End(7)));
        let outbox = Arc::new(outbox);
        let waiting = {
            let outbox = outbox.clone();
            std::thread::spawn(move || outbox.next(7))
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        outbox.close();
        assert_eq!(waiting.join().unwrap(), None);
    }
}
