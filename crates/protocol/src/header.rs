//! The fixed frame header every message starts with.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::{HeaderError, Opcode};

/// `"GPX\x01"` read as a little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"GPX\x01");
/// The protocol version this build speaks. 2: posted requests, shared
/// memory, host blocks. 3: bulk lanes. 4: lane chunks go on whichever lane
/// is ready, each lane ends its share of a copy from the device, and the
/// client returns a receipt for each chunk of it. 5: the server returns a
/// receipt for each chunk to the device too. 6: a copy from the device is
/// cut with small chunks at its ends (`lane::Cut`). 7: a server may send
/// `Heartbeat` and `DeviceOutput` frames before a reply; `Status`.
pub const VERSION: u16 = 7;
/// The oldest version this build still accepts (N-1 policy: a version 6
/// client is sent no heartbeat and no device output, and needs nothing else
/// that changed).
pub const MIN_VERSION: u16 = 6;
/// The first version whose clients take `Heartbeat` and `DeviceOutput`
/// frames while they wait for a reply.
pub const UNSOLICITED_VERSION: u16 = 7;
/// The first version whose clients may open lanes.
pub const LANES_VERSION: u16 = 6;
/// The largest payload either side accepts. Bulk copies larger than this are
/// split into several calls by the client.
pub const MAX_PAYLOAD: usize = 64 << 20;

/// In a request's `status`: the client does not wait for a reply. A posted
/// call that fails leaves its error with the session, which answers the
/// next waited-for request with it instead of running that request, as
/// CUDA reports an asynchronous error at the next synchronizing call.
pub const POSTED: u32 = 1;

/// 40 bytes, little-endian on the wire.
///
/// Requests carry the caller's current context handle in `context` (the
/// context stack lives in the client, per thread), the calling thread's
/// number in `thread` (which per-thread default stream it means) and flags
/// ([`POSTED`]) in `status`; replies carry the CUDA status in `status` and
/// echo `opcode` and `request_id`.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub magic: U32,
    pub version: U16,
    pub opcode: U16,
    pub length: U32,
    pub status: U32,
    pub request_id: U64,
    pub context: U64,
    pub thread: U64,
}

pub const HEADER_SIZE: usize = std::mem::size_of::<Header>();
const _: () = assert!(HEADER_SIZE == 40);

impl Header {
    pub fn request(opcode: Opcode, request_id: u64, context: u64, length: usize) -> Header {
        Header {
            magic: MAGIC.into(),
            version: VERSION.into(),
            opcode: (opcode as u16).into(),
            length: (length as u32).into(),
            status: 0.into(),
            request_id: request_id.into(),
            context: context.into(),
            thread: 0.into(),
        }
    }

    /// The same request, made by client thread `thread`.
    pub fn from_thread(self, thread: u64) -> Header {
        Header { thread: thread.into(), ..self }
    }

    /// The same request, sent without waiting for a reply.
    pub fn posted(self) -> Header {
        Header { status: POSTED.into(), ..self }
    }

    pub fn is_posted(&self) -> bool {
        self.status.get() & POSTED != 0
    }

    pub fn reply(to: &Header, status: u32, length: usize) -> Header {
        Header { status: status.into(), length: (length as u32).into(), context: 0.into(), thread: 0.into(), ..*to }
    }

    /// Parses and validates a header: magic, a version we accept and a
    /// payload length under the maximum. Opcodes are checked by the reader of
    /// the payload (`Opcode::try_from`), so that an unknown opcode can be
    /// answered with an error rather than tearing down the stream.
    pub fn parse(bytes: &[u8; HEADER_SIZE]) -> Result<Header, HeaderError> {
        let h = Header::read_from_bytes(bytes).expect("size checked by the array type");
        if h.magic.get() != MAGIC {
            return Err(HeaderError::BadMagic(h.magic.get()));
        }
        if !(MIN_VERSION..=VERSION).contains(&h.version.get()) {
            return Err(HeaderError::Version(h.version.get()));
        }
        if h.length.get() as usize > MAX_PAYLOAD {
            return Err(HeaderError::TooLong(h.length.get() as usize));
        }
        Ok(h)
    }

    pub fn opcode(&self) -> Result<Opcode, HeaderError> {
        Opcode::try_from(self.opcode.get()).map_err(|_| HeaderError::UnknownOpcode(self.opcode.get()))
    }

    pub fn payload_len(&self) -> usize {
        self.length.get() as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn roundtrip() {
        let h = Header::request(Opcode::Hello, 7, 0x1234, 99);
        let parsed = Header::parse(h.as_bytes().try_into().unwrap()).unwrap();
        assert_eq!(parsed, h);
        assert_eq!(parsed.opcode().unwrap(), Opcode::Hello);
    }

    #[test]
    fn refuses_bad_fields() {
        let good = Header::request(Opcode::Hello, 1, 0, 0);
        let mut h = good;
        h.magic = 0.into();
        assert!(matches!(Header::parse(h.as_bytes().try_into().unwrap()), Err(HeaderError::BadMagic(0))));
        let mut h = good;
        h.version = (VERSION + 1).into();
        assert!(matches!(Header::parse(h.as_bytes().try_into().unwrap()), Err(HeaderError::Version(_))));
        let mut h = good;
        h.length = (MAX_PAYLOAD as u32 + 1).into();
        assert!(matches!(Header::parse(h.as_bytes().try_into().unwrap()), Err(HeaderError::TooLong(_))));
        let mut h = good;
        h.opcode = 0.into();
        assert!(matches!(h.opcode(), Err(HeaderError::UnknownOpcode(0))));
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), HEADER_SIZE)) {
            let bytes: [u8; HEADER_SIZE] = bytes.try_into().unwrap();
            if let Ok(h) = Header::parse(&bytes) {
                prop_assert!(h.payload_len() <= MAX_PAYLOAD);
                let _ = h.opcode();
            }
        }
    }
}
