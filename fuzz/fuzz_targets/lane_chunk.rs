//! Lane chunks as a peer sends them. A copy is cut (`lane::Cut`) from a
//! size, chunk size and lane count of the input's choosing, then chunk
//! headers from the input meet the checks each side makes before it moves
//! a chunk's bytes: the server's lane reader and `htod`
//! (`crates/server/src/session/lanes/mod.rs`), the client's `receive`
//! (`crates/frontend/src/memory/lanes.rs`). Whatever those checks let
//! through must lie inside the copy and inside one slot, come once, and
//! together cover the copy exactly.

#![no_main]

use std::collections::BTreeSet;

use gpuplex_protocol::lane::{ChunkHeader, Cut, CHUNK_HEADER_SIZE, CHUNK_MAGIC};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;

gpuplex_fuzz::cap_allocations!();

/// The server's limit on a lane copy (`MAX_COPY` in its lanes module).
const MAX_COPY: u64 = 1 << 40;
/// The server's lanes and chunk size (`LANES`, `CHUNK_BYTES`).
const LANES: u64 = 16;
const CHUNK_BYTES: u64 = 512 << 10;
/// Cuts with at most this many chunks are walked whole.
const WALK: u64 = 1 << 12;

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});

/// A copy's shape, as the side that cut it knows it.
struct Shape {
    cut: Cut,
    size: u64,
    chunk: u64,
    copy: u64,
}

fn run(u: &mut Unstructured<'_>) -> Result<()> {
    let size = pick(u, &[0, 1, CHUNK_BYTES, MAX_COPY])?;
    let chunk = pick(u, &[0, 1, 4, CHUNK_BYTES])?;
    let cut = match u.int_in_range(0..=2u8)? {
        0 => Cut::to_device(size, chunk),
        1 => Cut::from_device(size, chunk, pick(u, &[0, 1, LANES])?),
        _ => {
            let (small, head, tail) = (pick(u, &[0, 1])?, pick(u, &[0, LANES])?, pick(u, &[0, 2 * LANES])?);
            Cut::tapered(size, chunk, small, head, tail)
        }
    };
    let copy = Shape { cut, size, chunk, copy: u.arbitrary()? };
    check_cut(u, &copy)?;

    let (mut server, mut client) = (Some(Arrived::default()), Some(Arrived::default()));
    while !u.is_empty() && (server.is_some() || client.is_some()) {
        let Some(header) = ChunkHeader::parse(&peer_header(u, &copy)?) else {
            continue;
        };
        check_header(&header);
        server = server.and_then(|a| server_reads(&copy, a, &header));
        client = client.and_then(|a| client_receives(&copy, a, &header));
    }
    Ok(())
}

/// A value from the input: one of `common`, a small number, or any u64.
fn pick(u: &mut Unstructured<'_>, common: &[u64]) -> Result<u64> {
    Ok(match u.int_in_range(0..=3u8)? {
        0 => *u.choose(common)?,
        1 => u.int_in_range(0..=4096)?,
        2 => u.int_in_range(0..=MAX_COPY)?,
        _ => u.arbitrary()?,
    })
}

/// The cut covers `0..size` in order, in chunks of 1 to `chunk` bytes, and
/// names each chunk by its own index only.
fn check_cut(u: &mut Unstructured<'_>, c: &Shape) -> Result<()> {
    let count = c.cut.count();
    assert_eq!(c.cut.at(count), None);
    assert_eq!(c.cut.at(u64::MAX), None);
    if count == 0 {
        assert!(c.size == 0 || c.chunk == 0, "no chunks for {} bytes", c.size);
        return Ok(());
    }
    assert_eq!(c.cut.at(0).map(|(offset, _)| offset), Some(0));
    let (offset, len) = c.cut.at(count - 1).expect("below the count");
    assert_eq!(offset.checked_add(len), Some(c.size), "the last chunk ends elsewhere");
    for _ in 0..8 {
        check_chunk(c, u.int_in_range(0..=count - 1)?);
    }
    check_chunk(c, count - 1);
    if count <= WALK {
        let mut at = 0;
        for (i, offset, len) in c.cut.chunks() {
            assert_eq!(offset, at, "chunk {i} leaves a gap");
            check_chunk(c, i);
            at += len;
        }
        assert_eq!(at, c.size);
    }
    Ok(())
}

fn check_chunk(c: &Shape, i: u64) {
    let (offset, len) = c.cut.at(i).expect("below the count");
    assert!(len > 0 && len <= c.chunk, "chunk {i} is {len} bytes, chunks {}", c.chunk);
    assert!(offset.checked_add(len).is_some_and(|end| end <= c.size), "chunk {i} ends past {}", c.size);
    assert_eq!(c.cut.index_of(offset, len), Some(i));
    assert_eq!(c.cut.index_of(offset, len - 1), None);
    if let Some((next, _)) = c.cut.at(i + 1) {
        assert_eq!(next, offset + len, "chunk {} does not follow chunk {i}", i + 1);
    }
}

/// A header's 32 bytes: raw, or one of the copy's chunks, receipts or end
/// markers with a field or two changed, so that most come close to passing.
fn peer_header(u: &mut Unstructured<'_>, c: &Shape) -> Result<[u8; CHUNK_HEADER_SIZE]> {
    if u.ratio(1, 4)? {
        return u.arbitrary();
    }
    let count = c.cut.count();
    let i = if count == 0 { 0 } else { u.int_in_range(0..=count)? };
    let (mut offset, mut length) = c.cut.at(i).unwrap_or((c.size, 1));
    let (mut copy, mut status) = (c.copy, 0u32);
    match u.int_in_range(0..=7u8)? {
        0 => length = 0,
        1 => offset = u64::MAX,
        2 => offset = offset.wrapping_add(u.int_in_range(0..=8)?).wrapping_sub(4),
        3 => length = length.wrapping_add(u.int_in_range(0..=8)?).wrapping_sub(4),
        4 => copy = u.arbitrary()?,
        5 => status = u.arbitrary()?,
        6 => (offset, length) = (u.arbitrary()?, u.arbitrary()?),
        _ => {}
    }
    let mut bytes = [0; CHUNK_HEADER_SIZE];
    bytes[0..4].copy_from_slice(&CHUNK_MAGIC.to_le_bytes());
    bytes[4..8].copy_from_slice(&status.to_le_bytes());
    bytes[8..16].copy_from_slice(&copy.to_le_bytes());
    bytes[16..24].copy_from_slice(&offset.to_le_bytes());
    bytes[24..32].copy_from_slice(&length.to_le_bytes());
    Ok(bytes)
}

/// What any header says of itself: a chunk, a receipt or an end, never two.
fn check_header(h: &ChunkHeader) {
    assert!(!(h.is_receipt() && h.is_end()), "{h:?}");
    if h.is_receipt() || h.is_end() || h.status.get() != 0 {
        assert_eq!(h.payload_len(), 0, "{h:?}");
    }
    let receipt = ChunkHeader::receipt(h.copy.get(), h.offset.get());
    if h.offset.get() != u64::MAX {
        assert!(receipt.is_receipt() && !receipt.is_end() && receipt.acknowledges(h), "{h:?}");
    }
    let end = ChunkHeader::end(h.copy.get());
    assert!(end.is_end() && !end.is_receipt() && end.payload_len() == 0);
}

/// The chunks one side has taken so far.
#[derive(Default)]
struct Arrived {
    chunks: BTreeSet<u64>,
    bytes: u64,
}

impl Arrived {
    /// Records chunk `i`, which the side's checks let through: it lies in
    /// the copy, and all chunks together are the copy.
    fn take(mut self, c: &Shape, i: u64, h: &ChunkHeader) -> Option<Arrived> {
        if !self.chunks.insert(i) {
            return None;
        }
        let count = c.cut.count();
        assert!(i < count, "chunk {i} of {count}");
        let (offset, len) = (h.offset.get(), h.length.get());
        assert_eq!(c.cut.at(i), Some((offset, len)));
        assert!(len <= c.chunk && offset.checked_add(len).is_some_and(|end| end <= c.size), "{h:?}");
        self.bytes += len;
        if self.chunks.len() as u64 == count {
            assert_eq!(self.bytes, c.size, "every chunk came, but not every byte");
        }
        Some(self)
    }
}

/// The server's lane reader, then `htod`: `None` where it ends the session.
fn server_reads(c: &Shape, arrived: Arrived, h: &ChunkHeader) -> Option<Arrived> {
    if h.is_receipt() {
        // Receipts answer chunks from the device, `read_chunks` checks them
        // against what its writer lent (`check_header` covers the match).
        return Some(arrived);
    }
    if h.status.get() != 0 || h.payload_len() > c.chunk {
        return None;
    }
    let i = h.index_in(c.copy, &c.cut)?;
    arrived.take(c, i, h)
}

/// The client's `receive`: `None` where it loses the lanes.
fn client_receives(c: &Shape, arrived: Arrived, h: &ChunkHeader) -> Option<Arrived> {
    if h.is_end() && h.copy.get() == c.copy {
        return None;
    }
    let i = h.index_in(c.copy, &c.cut)?;
    arrived.take(c, i, h)
}
