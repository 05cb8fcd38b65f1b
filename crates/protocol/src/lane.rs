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

/// Chunks a client keeps unanswered on each lane, to the device. Without a
/// bound, a lane takes chunks as long as its sockets' buffers have room, so
/// a large copy is shared out in its first millisecond and the fast lanes
/// then idle while slow ones drain (`docs/performance.md`). On a network
/// with a long round trip, one chunk per lane per round trip is the limit.
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

    /// Which chunk of `copy` this is, when that copy is cut as `cut` says;
    /// `None` if it is none of them.
    pub fn index_in(&self, copy: u64, cut: &Cut) -> Option<u64> {
        (self.copy.get() == copy).then(|| cut.index_of(self.offset.get(), self.length.get())).flatten()
    }
}

/// No chunk starts here: a copy this large could not be addressed.
const END_OFFSET: u64 = u64::MAX;

/// How a copy is cut into chunks, which both sides agree on: the header of
/// each chunk must name one of them ([`ChunkHeader::index_in`]).
///
/// From the device, a copy's first chunks (as many as there are lanes) and
/// its last (twice as many) are a quarter of the lanes' chunk size. The
/// session DMAs a copy's chunks in order, and a lane takes about a chunk's
/// time to bring one: with every chunk full size, the first bytes reach the
/// client that long after the copy begins, and at its end the lanes that
/// took the last chunks still carry them while the rest idle. To the
/// device small chunks gain nothing (each lane waits for a receipt per
/// chunk, so they cost it more round trips). Figures: `docs/performance.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    size: u64,
    chunk: u64,
    small: u64,
    /// Where the full chunks start, and where the small ones start again.
    body: u64,
    tail: u64,
}

/// From the device, small chunks are the lanes' chunk size over this.
const SMALL_PARTS: u64 = 4;

impl Cut {
    /// `size` bytes cut into `head` chunks of `small` bytes, then chunks of
    /// `chunk` bytes (the last may be shorter), then `tail` small ones. A
    /// copy too short for both ends is small chunks throughout. A `chunk`
    /// of 0 cuts nothing.
    pub fn tapered(size: u64, chunk: u64, small: u64, head: u64, tail: u64) -> Cut {
        let small = small.clamp(1, chunk.max(1));
        let ends = head.saturating_add(tail).saturating_mul(small);
        if chunk == 0 || ends >= size {
            return Cut { size, chunk, small, body: size, tail: size };
        }
        Cut { size, chunk, small, body: head * small, tail: size - tail * small }
    }

    /// A copy to the device: `chunk` bytes each, the last may be shorter.
    pub fn to_device(size: u64, chunk: u64) -> Cut {
        Cut::tapered(size, chunk, chunk, 0, 0)
    }

    /// A copy from the device over `lanes` lanes: one small chunk per lane
    /// first and two per lane last.
    pub fn from_device(size: u64, chunk: u64, lanes: u64) -> Cut {
        Cut::tapered(size, chunk, chunk / SMALL_PARTS, lanes, lanes.saturating_mul(2))
    }

    /// Chunks before the body, in it, and after it.
    fn counts(&self) -> (u64, u64, u64) {
        if self.chunk == 0 {
            return (0, 0, 0);
        }
        let head = self.body.div_ceil(self.small);
        let body = (self.tail - self.body).div_ceil(self.chunk);
        (head, body, (self.size - self.tail).div_ceil(self.small))
    }

    pub fn count(&self) -> u64 {
        let (head, body, tail) = self.counts();
        head + body + tail
    }

    /// Chunk `i`: `(offset, length)`, if there is one.
    pub fn at(&self, i: u64) -> Option<(u64, u64)> {
        let (head, body, tail) = self.counts();
        let (offset, end) = if i < head {
            let offset = i * self.small;
            (offset, self.body.min(offset.saturating_add(self.small)))
        } else if i < head + body {
            let offset = self.body + (i - head) * self.chunk;
            (offset, self.tail.min(offset.saturating_add(self.chunk)))
        } else if i < head + body + tail {
            let offset = self.tail + (i - head - body) * self.small;
            (offset, self.size.min(offset.saturating_add(self.small)))
        } else {
            return None;
        };
        Some((offset, end - offset))
    }

    /// Every chunk, `(index, offset, length)`, in order.
    pub fn chunks(self) -> impl Iterator<Item = (u64, u64, u64)> {
        (0..self.count()).map(move |i| {
            let (offset, len) = self.at(i).expect("below the count");
            (i, offset, len)
        })
    }

    /// Which chunk starts at `offset` and is `length` bytes long, if any.
    pub fn index_of(&self, offset: u64, length: u64) -> Option<u64> {
        let (head, body, _) = self.counts();
        // The chunk `offset` falls in, if it starts there.
        let i = if offset < self.body {
            offset / self.small
        } else if offset < self.tail {
            head + (offset - self.body) / self.chunk
        } else {
            (head + body).saturating_add((offset - self.tail) / self.small)
        };
        (self.at(i) == Some((offset, length))).then_some(i)
    }
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
        let cut = Cut::to_device(10, 4);
        for (i, offset, len) in cut.chunks() {
            assert_eq!(ChunkHeader::new(3, offset, len).index_in(3, &cut), Some(i));
        }
        for (copy, offset, len) in [(4, 4, 4), (3, 2, 4), (3, 8, 4), (3, 8, 1), (3, 12, 4), (3, 4, 0)] {
            assert_eq!(ChunkHeader::new(copy, offset, len).index_in(3, &cut), None, "{offset} {len}");
        }
        assert_eq!(ChunkHeader::new(3, 0, 4).index_in(3, &Cut::to_device(10, 0)), None);
        let end = ChunkHeader::end(3);
        assert!(end.is_end() && end.payload_len() == 0 && end.copy.get() == 3);
        assert_eq!(end.index_in(3, &Cut::to_device(u64::MAX, 4)), None);
        assert!(!ChunkHeader::new(3, 0, 0).is_end());
    }

    #[test]
    fn a_receipt_names_one_chunk_and_is_no_chunk_or_end() {
        let sent = ChunkHeader::new(3, 8, 2);
        let receipt = ChunkHeader::receipt(3, 8);
        assert!(receipt.is_receipt() && receipt.payload_len() == 0 && receipt.acknowledges(&sent));
        assert_eq!(receipt.index_in(3, &Cut::to_device(10, 4)), None);
        assert!(!ChunkHeader::receipt(3, 4).acknowledges(&sent) && !ChunkHeader::receipt(4, 8).acknowledges(&sent));
        for other in [sent, sent.failed(700), ChunkHeader::end(3)] {
            assert!(!other.is_receipt() && !other.acknowledges(&sent), "{other:?}");
        }
    }

    #[test]
    fn chunks_cover_a_copy_exactly() {
        let all: Vec<_> = Cut::to_device(10, 4).chunks().collect();
        assert_eq!(all, [(0, 0, 4), (1, 4, 4), (2, 8, 2)]);
        assert_eq!(Cut::to_device(8, 4).count(), 2);
        assert_eq!(Cut::to_device(0, 4).count(), 0);
        assert_eq!(Cut::to_device(5, 0).count(), 0);
        let cut = Cut::to_device(10, 4);
        assert_eq!((cut.at(2), cut.at(3), cut.at(u64::MAX)), (Some((8, 2)), None, None));
    }

    /// Small chunks at both ends, full ones between; a copy too short for
    /// both ends is small throughout.
    #[test]
    fn a_tapered_cut_has_small_ends() {
        let lens = |cut: Cut| cut.chunks().map(|(_, _, len)| len).collect::<Vec<_>>();
        assert_eq!(lens(Cut::tapered(30, 8, 2, 2, 3)), [2, 2, 8, 8, 4, 2, 2, 2]);
        assert_eq!(lens(Cut::tapered(19, 8, 2, 2, 3)), [2, 2, 8, 1, 2, 2, 2]);
        assert_eq!(lens(Cut::tapered(9, 8, 2, 2, 3)), [2, 2, 2, 2, 1]);
        let from = lens(Cut::from_device(64 << 20, 512 << 10, 16));
        assert_eq!(
            (&from[..16], from[16], &from[from.len() - 32..]),
            (&[128 << 10; 16][..], 512 << 10, &[128 << 10; 32][..])
        );
        assert_eq!(Cut::from_device(64 << 20, 512 << 10, 16).count(), 16 + 128 - 12 + 32);
    }

    /// Every cut covers its copy in order, each chunk names only its own
    /// index, and nothing overflows, whatever the sizes a peer sends.
    #[test]
    fn every_cut_covers_its_copy_and_names_each_chunk_once() {
        let sizes = [0, 1, 4095, 1 << 20, (1 << 20) + 7, 5 << 20, (64 << 20) + 12345];
        for size in sizes {
            for cut in [
                Cut::to_device(size, 512 << 10),
                Cut::from_device(size, 512 << 10, 16),
                Cut::tapered(size, 64, 1, 7, 3),
            ] {
                let mut at = 0;
                for (i, offset, len) in cut.chunks() {
                    assert!(offset == at && len > 0, "{cut:?} {i}");
                    assert_eq!(cut.index_of(offset, len), Some(i), "{cut:?} {i}");
                    assert_eq!(cut.index_of(offset, len - 1), None);
                    assert_ne!(cut.index_of(offset + 1, len), Some(i));
                    at += len;
                }
                assert_eq!(at, size, "{cut:?}");
            }
        }
        for cut in [Cut::from_device(u64::MAX, 512 << 10, u64::MAX), Cut::tapered(u64::MAX, u64::MAX, 3, 5, 5)] {
            let last = cut.at(cut.count() - 1).unwrap();
            assert_eq!(last.0 + last.1, u64::MAX);
            assert_eq!(cut.index_of(last.0, last.1), Some(cut.count() - 1));
            assert_eq!(cut.index_of(u64::MAX, 1), None);
        }
    }
}
