//! memcpy on several cores, for staged copies.
//!
//! One core cannot move bytes between ordinary memory and the staging
//! slots as fast as the DMA engine drains them, nor as fast as the driver's
//! own pageable path, so large chunks are split over a few helper threads,
//! started on first use and parked between copies.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Mutex, OnceLock, PoisonError};

/// Helper threads besides the caller.
const HELPERS: usize = 3;
/// Below this, splitting costs more than it saves.
const SPLIT_MIN: usize = 512 << 10;

/// One piece of a copy: source, destination and length, as addresses so
/// they can cross threads.
struct Piece {
    src: usize,
    dst: usize,
    len: usize,
    done: Sender<()>,
}

struct Pool {
    workers: Mutex<Vec<Sender<Piece>>>,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let workers = (0..HELPERS)
            .filter_map(|i| {
                let (tx, rx) = channel::<Piece>();
                let spawned = std::thread::Builder::new().name(format!("gpuplex-copy-{i}")).spawn(move || work(rx));
                spawned.ok().map(|_| tx)
            })
            .collect();
        Pool { workers: Mutex::new(workers) }
    })
}

fn work(rx: Receiver<Piece>) {
    for p in rx {
        // SAFETY: the sender keeps both ranges alive and unaliased until it
        // has received `done` for this piece (see `copy`).
        unsafe { std::ptr::copy_nonoverlapping(p.src as *const u8, p.dst as *mut u8, p.len) };
        let _ = p.done.send(());
    }
}

/// `dst.copy_from_slice(src)`, split over the helper threads when large.
pub fn copy(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len());
    if src.len() < SPLIT_MIN {
        dst.copy_from_slice(src);
        return;
    }
    let workers = pool().workers.lock().unwrap_or_else(PoisonError::into_inner);
    let parts = workers.len() + 1;
    // Cache-line aligned pieces.
    let piece = src.len().div_ceil(parts).next_multiple_of(64);
    let (done_tx, done_rx) = channel();
    let mut sent = 0;
    for (i, w) in workers.iter().enumerate() {
        let at = (i + 1) * piece;
        if at >= src.len() {
            break;
        }
        let len = piece.min(src.len() - at);
        let p = Piece {
            src: src[at..].as_ptr() as usize,
            dst: dst[at..].as_mut_ptr() as usize,
            len,
            done: done_tx.clone(),
        };
        if w.send(p).is_ok() {
            sent += 1;
        } else {
            dst[at..at + len].copy_from_slice(&src[at..at + len]);
        }
    }
    let first = piece.min(src.len());
    dst[..first].copy_from_slice(&src[..first]);
    // The borrows of `dst` and `src` must outlive every helper's piece.
    for _ in 0..sent {
        done_rx.recv().expect("a copy helper died mid-copy");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn large_and_small_copies_are_exact() {
        for n in [0, 1, 100, (512 << 10) - 1, 512 << 10, (3 << 20) + 17] {
            let src: Vec<u8> = (0..n).map(|i| (i * 31 % 253) as u8).collect();
            let mut dst = vec![0u8; n];
            super::copy(&mut dst, &src);
            assert_eq!(dst, src, "{n} bytes");
        }
    }
}
