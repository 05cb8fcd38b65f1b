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
//! that writes it here waits for the device first, which brings them.
//!
//! A copy into pinned memory mapped for the device goes to the server's
//! block instead, and comes back as the device's writes to it do
//! (`mapped`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use gpuplex_protocol::{calls, codec, CopiedToHost, CuError, Stream};

use super::mirrors::write_own_runs;
use crate::client::{self, Conn};

/// Bytes owed at most; a copy beyond waits for its bytes, as copies did
/// before. Well under the server's limit of what it keeps for a guest.
pub const OWED_BYTES: usize = 16 << 20;

/// A copy whose bytes have not come yet.
struct Owed {
    dst: u64,
    len: usize,
}

static OWED: Mutex<Vec<Owed>> = Mutex::new(Vec::new());
/// Whether anything is owed: what the calls that read host memory check first.
static ANY: AtomicBool = AtomicBool::new(false);

fn owed() -> MutexGuard<'static, Vec<Owed>> {
    OWED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Posts the copy of `len` bytes from the device's `src` into the program's
/// pinned `dst`, which the caller found in its pinned memory that is not
/// mapped. False where too much is owed already: the caller copies as
/// before, waiting.
pub fn post(conn: &mut Conn, dst: u64, len: usize, src: u64, stream: Stream) -> Result<bool, CuError> {
    {
        let mut owed = owed();
        if owed.iter().map(|o| o.len).sum::<usize>() + len > OWED_BYTES {
            return Ok(false);
        }
        // Owed before it is sent: another thread's waited call may bring
        // the bytes as soon as the server has the copy.
        owed.push(Owed { dst, len });
        ANY.store(true, Ordering::Release);
    }
    let req = calls::MemcpyDtoHLater::Request { dst, src: gpuplex_protocol::DevPtr(src), size: len as u64, stream };
    if let Err(e) = conn.post(req) {
        forget(dst, len);
        return Err(e);
    }
    Ok(true)
}

fn forget(dst: u64, len: usize) {
    let mut owed = owed();
    if let Some(i) = owed.iter().position(|o| o.dst == dst && o.len == len) {
        owed.remove(i);
    }
    ANY.store(!owed.is_empty(), Ordering::Release);
}

/// Before a call reads `[ptr, ptr + len)` here: the bytes copies owe to it.
pub fn settle(ptr: u64, len: usize) -> Result<(), CuError> {
    if !ANY.load(Ordering::Acquire) {
        return Ok(());
    }
    let end = ptr.saturating_add(len as u64);
    let overlaps = owed().iter().any(|o| o.dst < end && ptr < o.dst + o.len as u64);
    if overlaps {
        client::call(calls::DeliverCopies::Request {})?;
    }
    Ok(())
}

/// Before a call reads host memory here whose extent is not worked out:
/// the bytes every copy owes.
pub fn settle_all() -> Result<(), CuError> {
    if owes_any() {
        client::call(calls::DeliverCopies::Request {})?;
    }
    Ok(())
}

/// Whether any copy owes bytes.
pub fn owes_any() -> bool {
    ANY.load(Ordering::Acquire)
}

/// A `CopiedToHost` frame: its bytes into the program's memory, where a
/// copy still owes them. Frames come in the copies' order, so the first
/// copy owed that range is the one it answers.
pub fn arrived(payload: &[u8]) {
    let Ok(copy) = codec::decode::<CopiedToHost>(payload) else {
        return crate::log::warn("undecodable copied bytes from the server");
    };
    let mut owed = owed();
    let Some(i) = owed.iter().position(|o| o.dst == copy.dst && o.len == copy.data.len()) else {
        return crate::log::warn(&format!(
            "the server sent {} bytes for {:#x}, which no copy owed",
            copy.data.len(),
            copy.dst
        ));
    };
    owed.remove(i);
    ANY.store(!owed.is_empty(), Ordering::Release);
    // The program's pinned memory, unless it freed it without waiting for
    // the copy (then nothing is written).
    if !write_own_runs(copy.dst, &copy.data, &[(0, copy.data.len())]) {
        crate::log::debug(&format!("copied bytes for {:#x} found their memory gone", copy.dst));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame writes the bytes a copy owes, once, and nothing it was not owed.
    #[test]
    fn copied_bytes_land_where_owed_and_only_there() {
        let mut buf = vec![0u8; 16];
        let dst = buf.as_mut_ptr() as u64 + 4;
        owed().push(Owed { dst, len: 4 });
        ANY.store(true, Ordering::Release);
        let frame = |data: Vec<u8>| codec::encode(&CopiedToHost { dst, data });
        arrived(&frame(vec![1, 2, 3]));
        assert_eq!(buf, [0; 16], "a length no copy owed is refused");
        arrived(&frame(vec![1, 2, 3, 4]));
        assert_eq!(&buf[..9], &[0, 0, 0, 0, 1, 2, 3, 4, 0]);
        assert!(!owes_any());
        arrived(&frame(vec![9, 9, 9, 9]));
        assert_eq!(&buf[4..8], &[1, 2, 3, 4], "owed once, written once");
    }
}
