//! What a bulk lane carries once joined: chunks of copies.
//!
//! A lane is one more connection of a session (see `LaneOffer`). After its
//! `JoinLane` frame it carries only chunks, each a [`ChunkHeader`] and,
//! unless the chunk failed, `length` bytes. Chunks need no frame header:
//! the lane has no calls. A copy's chunks go on whichever lane is free
//! first, so each header says where its bytes belong ([`ChunkHeader::index_in`]);
//! the receiving side counts them, and where it cannot know how many a
//! lane will bring (device to host), each lane ends its share of a copy
//! with [`ChunkHeader::end`]. Whoever reads a chunk answers it with a
//! [`ChunkHeader::receipt`] on the same lane, once it has read it: the
//! sender lends the kernel the chunk's pages rather than copying them, and
//! keeps only a few chunks unanswered on each lane. Device to host, the
//! server's pinned slot may take another chunk only then; host to device,
//! the client takes the copy's next chunk only then, so chunks go to the
//! lanes that drain, instead of queueing megabytes in slow lanes' sockets.

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Chunks a client keeps unanswered on each lane, to the device. Before
/// receipts, a lane took chunks as long as its sockets' buffers had room,
/// about 8 chunks (Linux doubles the 1 MiB asked for each buffer), so a
/// 64 MiB copy was shared out
/// within its first millisecond and the fast lanes then idled while slow
/// ones drained. Alternating tcp-only benches on the H100 machine, pinned,
/// GB/s, at 64 and 256 MiB: 22.1-23.5 and 25.4-30.1 without receipts,
/// 25.1-26.6 and 30.7-34.3 with 2 ahead, 26.0-27.8 and 31.2-37.2 with 1. On
/// a network with a long round trip, one chunk per lane per round trip
/// would be the limit.
pub const AHEAD: usize = 1;

/// `"GPXC"` read as a little-endian u32.
pub const CHUNK_MAGIC: u32 = u32::from_le_bytes(*b"GPXC");

/// 32 bytes, little-endian. `status` is 0, or the CUDA error that kept the
/// server from reading this chunk from the device (no bytes follow then).
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChunkHeader {
    pub magic: U32,
    pub status: U32,
    /// The copy it belongs to, numbered by the client.
    pub copy: U64,
    /// Where it starts in the copy.
    pub offset: U64,
    pub length: U64,
}

pub const CHUNK_HEADER_SIZE: usize = std::mem::size_of::<ChunkHeader>();
const _: () = assert!(CHUNK_HEADER_SIZE == 32);

impl ChunkHeader {
    pub fn new(copy: u64, offset: u64, length: u64) -> ChunkHeader {
        ChunkHeader {
            magic: CHUNK_MAGIC.into(),
            status: 0.into(),
            copy: copy.into(),
            offset: offset.into(),
            length: length.into(),
        }
    }

    /// The same chunk, failed with `status`: its bytes do not follow.
    pub fn failed(self, status: u32) -> ChunkHeader {
        ChunkHeader { status: status.into(), ..self }
    }

    /// The bytes that follow this header on the lane.
    pub fn payload_len(&self) -> u64 {
        if self.status.get() == 0 {
            self.length.get()
        } else {
            0
        }
    }

    /// Reads a header, checking only its magic: the reader checks the rest
    /// against the chunk it expects.
    pub fn parse(bytes: &[u8; CHUNK_HEADER_SIZE]) -> Option<ChunkHeader> {
        let h = ChunkHeader::read_from_bytes(bytes).expect("size checked by the array type");
        (h.magic.get() == CHUNK_MAGIC).then_some(h)
    }

    /// Whether this is chunk `offset..offset + length` of `copy`.
    pub fn is(&self, copy: u64, offset: u64, length: u64) -> bool {
        (self.copy.get(), self.offset.get(), self.length.get()) == (copy, offset, length)
    }

    /// The marker that ends a lane's share of `copy`: no bytes follow.
    pub fn end(copy: u64) -> ChunkHeader {
        ChunkHeader::new(copy, END_OFFSET, 0)
    }

    pub fn is_end(&self) -> bool {
        self.offset.get() == END_OFFSET && self.length.get() == 0
    }

    /// The reader's word that it has read chunk `offset` of `copy`: no
    /// bytes follow, and no chunk ever has length 0.
    pub fn receipt(copy: u64, offset: u64) -> ChunkHeader {
        ChunkHeader::new(copy, offset, 0)
    }

    pub fn is_receipt(&self) -> bool {
        self.length.get() == 0 && self.offset.get() != END_OFFSET && self.status.get() == 0
    }

    /// Whether this is the receipt for chunk `sent`.
    pub fn acknowledges(&self, sent: &ChunkHeader) -> bool {
        self.is_receipt() && (self.copy, self.offset) == (sent.copy, sent.offset)
    }

    /// Which chunk of `copy` this is, when that copy is `size` bytes cut in
    /// `chunk`-byte pieces ([`chunks`]); `None` if it is none of them.
    pub fn index_in(&self, copy: u64, size: u64, chunk: u64) -> Option<u64> {
        let (offset, length) = (self.offset.get(), self.length.get());
        let whole = self.copy.get() == copy && chunk > 0 && offset < size && offset % chunk == 0;
        (whole && length == chunk.min(size - offset)).then(|| offset / chunk)
    }
}

/// No chunk starts here: a copy this large could not be addressed.
const END_OFFSET: u64 = u64::MAX;

/// The chunks of a `size`-byte copy cut in `chunk`-byte pieces: `(index,
/// offset, length)` in order.
pub fn chunks(size: u64, chunk: u64) -> impl Iterator<Item = (u64, u64, u64)> {
    (0..).map_while(move |i| chunk_at(size, chunk, i).map(|(offset, len)| (i, offset, len)))
}

/// Chunk `i` of those [`chunks`] yields: `(offset, length)`, if there is one.
pub fn chunk_at(size: u64, chunk: u64, i: u64) -> Option<(u64, u64)> {
    let offset = i.checked_mul(chunk).filter(|&offset| chunk > 0 && offset < size)?;
    Some((offset, chunk.min(size - offset)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_bad_magic_is_refused() {
        let h = ChunkHeader::new(7, 1 << 20, 4096);
        let bytes: [u8; CHUNK_HEADER_SIZE] = h.as_bytes().try_into().unwrap();
        assert_eq!(ChunkHeader::parse(&bytes), Some(h));
        assert!(h.is(7, 1 << 20, 4096) && !h.is(8, 1 << 20, 4096));
        assert_eq!(h.payload_len(), 4096);
        assert_eq!(h.failed(700).payload_len(), 0);
        let mut bad = bytes;
        bad[0] ^= 1;
        assert_eq!(ChunkHeader::parse(&bad), None);
    }

    #[test]
    fn chunks_name_their_place_and_ends_are_no_chunk() {
        let (size, chunk) = (10, 4);
        for (i, offset, len) in chunks(size, chunk) {
            assert_eq!(ChunkHeader::new(3, offset, len).index_in(3, size, chunk), Some(i));
        }
        for (copy, offset, len) in [(4, 4, 4), (3, 2, 4), (3, 8, 4), (3, 8, 1), (3, 12, 4), (3, 4, 0)] {
            assert_eq!(ChunkHeader::new(copy, offset, len).index_in(3, size, chunk), None, "{offset} {len}");
        }
        assert_eq!(ChunkHeader::new(3, 0, 4).index_in(3, size, 0), None);
        let end = ChunkHeader::end(3);
        assert!(end.is_end() && end.payload_len() == 0 && end.copy.get() == 3);
        assert_eq!(end.index_in(3, u64::MAX, chunk), None);
        assert!(!ChunkHeader::new(3, 0, 0).is_end());
    }

    #[test]
    fn a_receipt_names_one_chunk_and_is_no_chunk_or_end() {
        let sent = ChunkHeader::new(3, 8, 2);
        let receipt = ChunkHeader::receipt(3, 8);
        assert!(receipt.is_receipt() && receipt.payload_len() == 0 && receipt.acknowledges(&sent));
        assert_eq!(receipt.index_in(3, 10, 4), None);
        assert!(!ChunkHeader::receipt(3, 4).acknowledges(&sent) && !ChunkHeader::receipt(4, 8).acknowledges(&sent));
        for other in [sent, sent.failed(700), ChunkHeader::end(3)] {
            assert!(!other.is_receipt() && !other.acknowledges(&sent), "{other:?}");
        }
    }

    #[test]
    fn chunks_cover_a_copy_exactly() {
        let all: Vec<_> = chunks(10, 4).collect();
        assert_eq!(all, [(0, 0, 4), (1, 4, 4), (2, 8, 2)]);
        assert_eq!(chunks(8, 4).count(), 2);
        assert_eq!(chunks(0, 4).count(), 0);
        assert_eq!(chunks(5, 0).count(), 0);
        assert_eq!((chunk_at(10, 4, 2), chunk_at(10, 4, 3), chunk_at(10, 4, u64::MAX)), (Some((8, 2)), None, None));
    }
}
