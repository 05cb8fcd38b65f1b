//! Frames as a guest sends them: a 40-byte header, then a payload decoded
//! by the header's opcode, as the session does before it runs a call
//! (`decode_request` is `dispatch`'s decoding) or opens a connection
//! (`Hello`, `JoinLane`). Every message of the handshake is decoded from
//! the input as well, those the client reads from the server included
//! (the frames that come before a reply among them).
//! A message that decodes must encode back to exactly its bytes: the codec
//! has one form per value, so anything else is a decoder that skipped or
//! invented bytes.

#![no_main]

use std::fmt::Debug;

use gpuplex_protocol::codec::{self, Wire};
use gpuplex_protocol::{
    decode_request, Attribute, CopiedToHost, DeviceInfo, ErrorDetail, Header, Hello, LaneJoin, LaneOffer, MappedRuns,
    Opcode, ServerSummary, SessionSummary, SharedLayout, Welcome, HEADER_SIZE, MAX_PAYLOAD,
};
use libfuzzer_sys::fuzz_target;

gpuplex_fuzz::cap_allocations!();

fuzz_target!(|data: &[u8]| {
    if let Some((head, payload)) = data.split_first_chunk::<HEADER_SIZE>() {
        if let Ok(header) = Header::parse(head) {
            assert!(header.payload_len() <= MAX_PAYLOAD);
            if let Ok(opcode) = header.opcode() {
                let _ = decode_request(opcode, payload);
                match opcode {
                    Opcode::Hello => round_trip::<Hello>(payload),
                    Opcode::JoinLane => round_trip::<LaneJoin>(payload),
                    _ => {}
                }
            }
        }
    }
    round_trip::<Hello>(data);
    round_trip::<LaneJoin>(data);
    round_trip::<Welcome>(data);
    round_trip::<DeviceInfo>(data);
    round_trip::<Attribute>(data);
    round_trip::<SharedLayout>(data);
    round_trip::<LaneOffer>(data);
    round_trip::<ServerSummary>(data);
    round_trip::<SessionSummary>(data);
    round_trip::<ErrorDetail>(data);
    round_trip::<MappedRuns>(data);
    round_trip::<CopiedToHost>(data);
});

fn round_trip<T: Wire + PartialEq + Debug>(bytes: &[u8]) {
    if let Ok(value) = codec::decode::<T>(bytes) {
        assert_eq!(codec::encode(&value), bytes, "{value:?} does not encode back to its bytes");
    }
}
