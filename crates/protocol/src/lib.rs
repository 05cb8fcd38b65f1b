//! The gpuplex wire protocol, shared by the front-end and the server.
//!
//! # Frames
//!
//! Every message is a 40-byte [`Header`] followed by `length` payload bytes.
//! The header is validated (magic, version, length under [`MAX_PAYLOAD`])
//! before a payload buffer is allocated; the payload is then decoded with
//! [`codec`], which checks every inner length against the bytes present.
//!
//! ```text
//! client (front-end)                          server (session thread)
//!   | Hello {pid, program}             ---->    |  checks version, opens session
//!   |                                  <----    | Welcome {session, driver version, devices}
//!   | call: header{opcode, id, context, thread} + Request
//!   |                                  ---->    | look up handles, run on backend
//!   |                                  <----    | header{status, id} + Reply | ErrorDetail
//!   | ...                                       |
//!   | (close / crash)                           | frees everything the session held
//! ```
//!
//! A reply with `status == 0` carries the call's `Reply`; any other status
//! is the CUDA error the caller sees, with an [`ErrorDetail`] for logs.
//! Before a reply the server may send frames the client did not ask for:
//! `DeviceOutput` (what the guest's kernels printed while the call ran,
//! [`DeviceOutput`]), `MappedRuns` (what the device wrote to the guest's
//! mapped host blocks, [`MappedRuns`]), `CopiedToHost` (the bytes of the
//! guest's posted copies into its pinned memory, [`CopiedToHost`]) and,
//! while a call runs long,
//! `Heartbeat` (no payload), which tells a waiting client that the server
//! is alive. They carry the request id of the call they precede (a
//! heartbeat may carry 0).
//! A request flagged [`POSTED`] gets no reply; its error, if any, answers
//! the next request that does wait.
//!
//! A local client may then ask for `SharedMemory`: the reply (on the
//! socket) gives a [`SharedLayout`], the region's descriptor follows it,
//! and from then on frames travel through the region's rings. A guest in
//! a VM has its rings in the VM's region from the start and asks for
//! `ShareInPlace` instead, naming its staging area there ([`InPlace`]).
//! A client without shared memory may instead ask for `OpenLanes`: the
//! reply ([`LaneOffer`]) names a key, and the client opens that many more
//! connections, each starting with `JoinLane`; large copies then travel
//! over them in chunks ([`lane`]), several connections at once.
//! A frame that fails validation, an unknown opcode, or a payload that does
//! not decode ends that session only.
//!
//! A connection whose first frame is `ServerInfo` or `Status` gets one
//! answer ([`ServerSummary`], [`ServerStatus`]): what that peer may see of
//! the server, and no session.
//!
//! # Versioning
//!
//! [`VERSION`] is bumped whenever a message's layout or meaning changes. A
//! server accepts versions `MIN_VERSION..=VERSION` (the current and the
//! previous one once there is a previous one); the handshake reply tells the
//! client which it speaks. Opcodes are never reused: a retired call keeps its
//! number reserved in `calls.api`.
//!
//! # The call table
//!
//! `calls.api` lists every remoted CUDA call once. `build.rs` turns it into
//! [`Opcode`], the [`calls`] messages, the server's [`Api`] trait,
//! [`dispatch`] and [`decode_request`]; the front-end's build script turns the same rows into C
//! exports.

mod arrays;
pub mod codec;
mod digest;
mod error;
mod handles;
mod handshake;
mod header;
pub mod lane;

/// `CUstreamCaptureMode`: which calls a stream's capture forbids, and on
/// which threads (`cuThreadExchangeStreamCaptureMode` has the rules).
pub mod capture_mode {
    /// Every thread's mode until it changes it.
    pub const GLOBAL: u32 = 0;
    pub const THREAD_LOCAL: u32 = 1;
    /// The last of the modes.
    pub const RELAXED: u32 = 2;
}
mod vmm;

pub use arrays::*;
pub use codec::{Seq, Wire};
pub use digest::image_digest;
pub use error::{CallError, CuError, DecodeError, HeaderError, CUDA_ERRORS, MAX_DETAIL};
pub use handles::*;
pub use handshake::*;
pub use header::{
    Header, HEADER_SIZE, LANES_VERSION, MAGIC, MAX_PAYLOAD, MIN_VERSION, POSTED, UNSOLICITED_VERSION, VERSION,
};
pub use vmm::*;

/// A request message and the reply it expects.
pub trait Call: Wire {
    const OPCODE: Opcode;
    type Reply: Wire;
}

/// `CU_DEVICE_ATTRIBUTE_MAX` in CUDA 13.0: attributes are `0..DEVICE_ATTRIBUTE_COUNT`.
pub const DEVICE_ATTRIBUTE_COUNT: u32 = 148;

/// The `CUjit_option`s a link (`calls::Link`) carries, each an unsigned
/// value: register and thread limits, optimization level, target and
/// fallback, debug and line information, verbose logs, cache mode,
/// position-independent code, the directives' overrides, split compilation.
/// Log buffers are the server's own, and options that name the guest's
/// memory (symbol lists) do not travel.
pub const LINK_OPTIONS: [u32; 15] = [0, 1, 7, 8, 9, 10, 11, 12, 13, 14, 30, 31, 32, 33, 34];

/// `CU_JIT_INPUT_CUBIN`, `_PTX` and `_FATBINARY`, the inputs that are
/// images of their own; `CU_JIT_NUM_INPUT_TYPES`, one past the last type.
pub const LINK_INPUT_CUBIN: u32 = 0;
pub const LINK_INPUT_PTX: u32 = 1;
pub const LINK_INPUT_FATBIN: u32 = 2;
pub const LINK_INPUT_TYPES: u32 = 6;

include!(concat!(env!("OUT_DIR"), "/calls.rs"));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcodes_round_trip_and_zero_is_invalid() {
        assert_eq!(Opcode::try_from(Opcode::cuMemAlloc_v2 as u16), Ok(Opcode::cuMemAlloc_v2));
        assert_eq!(Opcode::try_from(0), Err(0));
        assert_eq!(Opcode::cuMemAlloc_v2.name(), "cuMemAlloc_v2");
    }

    #[test]
    fn requests_decode_by_opcode_without_an_api() {
        let payload = codec::encode(&calls::cuMemAlloc_v2::Request { bytesize: 4096 });
        assert_eq!(decode_request(Opcode::cuMemAlloc_v2, &payload), Ok(()));
        assert!(matches!(decode_request(Opcode::cuMemAlloc_v2, &payload[1..]), Err(DecodeError::Truncated { .. })));
        assert!(matches!(decode_request(Opcode::cuCtxSynchronize, &payload), Err(DecodeError::Trailing(8))));
        assert!(matches!(decode_request(Opcode::Hello, &[]), Err(DecodeError::Invalid(_))));
    }
}
