//! Asynchronous device-to-host copies into pinned memory where no memory is
//! shared with the server (TCP, the socket carrier), posted.
//!
//! Natively such a copy returns at once and the DMA writes the program's
//! memory later; the program may look only once it knows the copy finished:
//! after a call that waits for the device, or in a host function the device
//! runs after it. So the copy is posted (`MemcpyDtoHLater`): the server
//! makes it and keeps the bytes, which come ahead of the reply to the next
//! waited call that reaches the device, or ahead of the next host function
//! (`CopiedToHost` frames). Until then the range is owed bytes, and a call
//! of ours that reads it here first asks for them (`DeliverCopies`); one
//! that writes it here waits for the device first, which brings them, and
//! then for any the host-call connection carries.
//!
//! A copy into pinned memory mapped for the device goes to the server's
//! block instead, and comes back as the device's writes to it do
//! (`mapped`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use gpuplex_protocol::{calls, codec, CopiedToHost, CuError, Stream};

use super::mirrors::write_own_runs;
use crate::client::{self, Conn};

/// Bytes owed at most; a copy beyond waits for its bytes, as copies did
/// before. Well under the server's limit of what it keeps for a guest.
pub const OWED_BYTES: usize = 16 << 20;
/// And copies owed at most, however small: the server keeps 65536.
pub const OWED_COPIES: usize = 4096;

/// How long a call waits for bytes the server already sent on the host-call
/// connection, which that connection's thread has yet to write: as long as
/// a host function before them runs, at most.
const IN_FLIGHT: Duration = Duration::from_secs(5);

struct State {
    /// Copies whose bytes have not come yet, in their order.
    owed: Vec<Owed>,
    /// Copies whose bytes came while an earlier copy was still owed: that
    /// one's bytes must not overwrite theirs where the two overlap. Frames
    /// come on two connections, so a later copy's may come first.
    landed: Vec<Owed>,
    /// The next copy's number: the server numbers them alike, in the order
    /// it gets them, which is the order they are posted.
    next: u64,
}

#[derive(Clone, Copy)]
struct Owed {
    seq: u64,
    dst: u64,
    len: usize,
}

impl Owed {
    fn overlaps(&self, ptr: u64, len: usize) -> bool {
        self.dst < ptr.saturating_add(len as u64) && ptr < self.dst + self.len as u64
    }
}

static STATE: Mutex<State> = Mutex::new(State { owed: Vec::new(), landed: Vec::new(), next: 0 });
/// Whether anything is owed: what the calls that read host memory check first.
static ANY: AtomicBool = AtomicBool::new(false);

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Posts the copy of `len` bytes from the device's `src` into the program's
/// pinned `dst`, which the caller found in its pinned memory that is not
/// mapped. False where too much is owed already: the caller copies as
/// before, waiting.
pub fn post(conn: &mut Conn, dst: u64, len: usize, src: u64, stream: Stream) -> Result<bool, CuError> {
    {
        let mut state = state();
        if !admits(&state.owed, len) {
            return Ok(false);
        }
        // Owed before it is sent: another thread's waited call may bring
        // the bytes as soon as the server has the copy. Numbered while the
        // connection is held, so in the order the server gets them.
        let seq = state.next;
        state.next += 1;
        state.owed.push(Owed { seq, dst, len });
        ANY.store(true, Ordering::Release);
    }
    let req = calls::MemcpyDtoHLater::Request { dst, src: gpuplex_protocol::DevPtr(src), size: len as u64, stream };
    // Lost, the connection fails every call after: what is owed no longer matters.
    conn.post(req)?;
    Ok(true)
}

/// Whether one more copy of `len` bytes may be owed beside `owed`.
fn admits(owed: &[Owed], len: usize) -> bool {
    owed.len() < OWED_COPIES && owed.iter().map(|o| o.len).sum::<usize>() + len <= OWED_BYTES
}

/// Whether a copy owes bytes to `[ptr, ptr + len)`.
fn owes(ptr: u64, len: usize) -> bool {
    ANY.load(Ordering::Acquire) && state().owed.iter().any(|o| o.overlaps(ptr, len))
}

/// Before a call reads `[ptr, ptr + len)` here, or frees it: the bytes
/// copies owe to it.
pub fn settle(ptr: u64, len: usize) -> Result<(), CuError> {
    if !owes(ptr, len) {
        return Ok(());
    }
    client::call(calls::DeliverCopies::Request {})?;
    wait_in_flight(ptr, len);
    Ok(())
}

/// After a waited call that reached the device: until the bytes owed to
/// `[ptr, ptr + len)` that the host-call connection took have come too.
pub fn wait_in_flight(ptr: u64, len: usize) {
    let deadline = Instant::now() + IN_FLIGHT;
    while owes(ptr, len) {
        if Instant::now() > deadline {
            crate::log::warn("bytes of a posted copy to pinned memory did not come; going on without them");
            let mut state = state();
            state.owed.retain(|o| !o.overlaps(ptr, len));
            ANY.store(!state.owed.is_empty(), Ordering::Release);
            break;
        }
        std::thread::yield_now();
    }
}

/// Before a call reads host memory here whose extent is not worked out:
/// the bytes every copy owes.
pub fn settle_all() -> Result<(), CuError> {
    settle(0, usize::MAX)
}

/// Whether any copy owes bytes.
pub fn owes_any() -> bool {
    ANY.load(Ordering::Acquire)
}

/// A `CopiedToHost` frame: its bytes into the program's memory, except
/// where a later copy's came first.
pub fn arrived(payload: &[u8]) {
    let Ok(copy) = codec::decode::<CopiedToHost>(payload) else {
        return crate::log::warn("undecodable copied bytes from the server");
    };
    let mut state = state();
    let Some(i) = state.owed.iter().position(|o| o.seq == copy.seq) else {
        return crate::log::warn(&format!("the server sent bytes for copy {}, which owes none", copy.seq));
    };
    let owed = state.owed.remove(i);
    if !copy.data.is_empty() {
        if copy.dst != owed.dst || copy.data.len() != owed.len {
            crate::log::warn(&format!("the server sent copy {} for another range; dropped", copy.seq));
        } else {
            let runs = uncovered(owed, state.landed.iter().filter(|l| l.seq > owed.seq));
            // The program's pinned memory; written while the lock is held,
            // so that no later copy's bytes land in between.
            if !write_own_runs(copy.dst, &copy.data, &runs) {
                crate::log::debug(&format!("copied bytes for {:#x} found their memory gone", copy.dst));
            }
            state.landed.push(owed);
        }
    }
    // A landed copy matters only to older ones still owed.
    let oldest = state.owed.iter().map(|o| o.seq).min().unwrap_or(u64::MAX);
    state.landed.retain(|l| l.seq > oldest);
    ANY.store(!state.owed.is_empty(), Ordering::Release);
}

/// The runs `(start, length)` of `copy`'s range, from its start, that none
/// of `later` covers.
fn uncovered<'a>(copy: Owed, later: impl Iterator<Item = &'a Owed>) -> Vec<(usize, usize)> {
    let mut runs = vec![(0usize, copy.len)];
    for l in later {
        let lo = l.dst.saturating_sub(copy.dst).min(copy.len as u64) as usize;
        let hi = (l.dst + l.len as u64).saturating_sub(copy.dst).min(copy.len as u64) as usize;
        if lo >= hi {
            continue;
        }
        runs = runs
            .into_iter()
            .flat_map(|(s, n)| {
                let e = s + n;
                [(s, lo.min(e).max(s)), (hi.max(s).min(e), e)]
            })
            .filter(|&(s, e)| s < e)
            .map(|(s, e)| (s, e - s))
            .collect();
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owe(dst: u64, len: usize) -> u64 {
        let mut state = state();
        let seq = state.next;
        state.next += 1;
        state.owed.push(Owed { seq, dst, len });
        ANY.store(true, Ordering::Release);
        seq
    }

    fn frame(seq: u64, dst: u64, data: &[u8]) -> Vec<u8> {
        codec::encode(&CopiedToHost { seq, dst, data: data.to_vec() })
    }

    /// Bytes land where a copy owes them, once; a failed copy owes nothing
    /// more; a later copy's bytes that came first are not overwritten by an
    /// earlier one's. One test: the copies owed are the process's.
    #[test]
    fn copied_bytes_land_in_the_copies_order() {
        let mut buf = vec![0u8; 16];
        let dst = buf.as_mut_ptr() as u64;
        let first = owe(dst + 4, 4);
        arrived(&frame(first, dst + 4, &[1, 2, 3]));
        assert_eq!(buf, [0; 16], "a length the copy did not owe is dropped");
        assert!(!owes_any(), "and the copy owes nothing more");
        let (a, b, failed) = (owe(dst, 8), owe(dst + 4, 8), owe(dst, 16));
        arrived(&frame(b, dst + 4, &[7; 8]));
        arrived(&frame(b, dst + 4, &[8; 8]));
        assert_eq!(&buf[4..12], &[7; 8], "a copy lands once");
        assert!(owes_any());
        arrived(&frame(a, dst, &[5; 8]));
        assert_eq!(&buf[..12], &[5, 5, 5, 5, 7, 7, 7, 7, 7, 7, 7, 7], "the later copy's bytes stay");
        arrived(&frame(failed, dst, &[]));
        assert!(!owes_any(), "a failed copy owes nothing");
        assert!(state().landed.is_empty(), "nothing older is owed, so nothing landed is kept");
    }

    /// What is owed stays under both bounds, bytes and copies.
    #[test]
    fn owed_copies_are_bounded_in_bytes_and_number() {
        let small = vec![Owed { seq: 0, dst: 0, len: 1 }; OWED_COPIES - 1];
        assert!(admits(&small, 1));
        assert!(!admits(&[small.as_slice(), &[small[0]]].concat(), 1), "one copy too many");
        let big = [Owed { seq: 0, dst: 0, len: OWED_BYTES - 8 }];
        assert!(admits(&big, 8));
        assert!(!admits(&big, 9), "one byte too many");
    }

    #[test]
    fn runs_not_covered_by_later_copies() {
        let copy = Owed { seq: 0, dst: 100, len: 10 };
        let later = [Owed { seq: 1, dst: 102, len: 2 }, Owed { seq: 2, dst: 108, len: 5 }];
        assert_eq!(uncovered(copy, later.iter()), [(0, 2), (4, 4)]);
        assert_eq!(uncovered(copy, [Owed { seq: 1, dst: 90, len: 30 }].iter()), []);
        assert_eq!(uncovered(copy, [Owed { seq: 1, dst: 200, len: 3 }].iter()), [(0, 10)]);
    }
}
