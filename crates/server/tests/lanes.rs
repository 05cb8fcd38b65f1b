//! Bulk lanes against a live server on the emulated backend: large copies
//! across them in any order, lanes that start late, join where they may
//! not, carry a chunk twice or a receipt for nothing.

use std::time::Duration;

use gpuplex_protocol::calls::*;
use gpuplex_protocol::lane::{ChunkHeader, Cut};
use gpuplex_protocol::{codec, CuError, DevPtr, Event, Header, LaneJoin, LaneOffer, Opcode, ServerStatus, Stream};
use gpuplex_transport::{Address, Lane, Token, TransportError};

mod common;

use common::*;

/// A session's lanes, driven by hand: one thread, chunks in order.
struct Lanes {
    lanes: Vec<Lane>,
    chunk: u64,
    key: [u8; 32],
}

impl Client {
    fn open_lanes(&mut self, address: &Address, token: Option<&Token>) -> Lanes {
        let offer: LaneOffer = self.session_request(Opcode::OpenLanes);
        assert!(offer.lanes >= 2 && offer.chunk_bytes >= 4096, "{offer:?}");
        let lanes = (0..offer.lanes).map(|i| join_lane(address, token, offer.key, i).unwrap()).collect();
        Lanes { lanes, chunk: offer.chunk_bytes, key: offer.key }
    }
}

/// Connects a lane and joins it; a refusal gives its status.
fn join_lane(address: &Address, token: Option<&Token>, key: [u8; 32], index: u32) -> Result<Lane, u32> {
    let mut carrier = gpuplex_transport::connect(address, token).unwrap();
    let join = codec::encode(&LaneJoin { key, index });
    carrier.send(&Header::request(Opcode::JoinLane, 1, 0, join.len()), &join).unwrap();
    let h = carrier.recv(&mut Vec::new()).unwrap();
    match h.status.get() {
        0 => Ok(carrier.into_lane().unwrap()),
        status => Err(status),
    }
}

/// Reads the server's receipts for the chunks `sent` on `lane`, in order.
fn answered(lane: &Lane, sent: &[ChunkHeader]) -> Result<(), TransportError> {
    for chunk in sent {
        let receipt = lane.recv_header()?;
        assert!(receipt.acknowledges(chunk), "{receipt:?} should answer {chunk:?}");
    }
    Ok(())
}

impl Lanes {
    /// Sends every chunk of a copy, in turn over the lanes, then reads
    /// their receipts.
    fn send(&self, copy: u64, data: &[u8]) -> Result<(), TransportError> {
        let mut sent = vec![Vec::new(); self.lanes.len()];
        for (i, offset, len) in Cut::to_device(data.len() as u64, self.chunk).chunks() {
            let (l, header) = (i as usize % self.lanes.len(), ChunkHeader::new(copy, offset, len));
            self.lanes[l].send_chunk(&header, &data[offset as usize..(offset + len) as usize])?;
            sent[l].push(header);
        }
        self.lanes.iter().zip(&sent).try_for_each(|(lane, sent)| answered(lane, sent))
    }

    /// Every chunk of a copy, each lane read until it ends its share and
    /// each chunk read answered with its receipt; a failed one gives its
    /// status. Each chunk must come exactly once.
    fn receive(&self, copy: u64, size: u64) -> Result<Vec<u8>, u32> {
        let mut data = vec![0u8; size as usize];
        let cut = Cut::from_device(size, self.chunk, self.lanes.len() as u64);
        let mut arrived = vec![false; cut.count() as usize];
        let mut failed = None;
        for lane in &self.lanes {
            loop {
                let h = lane.recv_header().unwrap();
                if h.is_end() && h.copy.get() == copy {
                    break;
                }
                let i = h.index_in(copy, &cut).unwrap_or_else(|| panic!("{h:?}: no chunk of copy {copy}"));
                assert!(!std::mem::replace(&mut arrived[i as usize], true), "chunk {i} came twice");
                let (offset, len) = (h.offset.get() as usize, h.length.get() as usize);
                match h.status.get() {
                    0 => {
                        lane.recv_exact(&mut data[offset..offset + len]).unwrap();
                        lane.send_chunk(&ChunkHeader::receipt(copy, offset as u64), &[]).unwrap();
                    }
                    status => failed = failed.or(Some(status)),
                }
            }
        }
        assert!(arrived.iter().all(|&a| a), "every chunk of copy {copy} came");
        failed.map_or(Ok(data), Err)
    }
}

fn lanes_htod(c: &mut Client, lanes: &Lanes, dst: DevPtr, copy: u64, data: &[u8]) -> Result<(), CuError> {
    c.send(MemcpyHtoDLanes::Request { dst, size: data.len() as u64, stream: Stream::NULL, copy }, false);
    lanes.send(copy, data).unwrap();
    c.reply::<MemcpyHtoDLanes::Request>().map(|_| ())
}

fn lanes_dtoh(c: &mut Client, lanes: &Lanes, src: DevPtr, copy: u64, size: u64) -> (Result<Vec<u8>, u32>, CuError) {
    c.send(MemcpyDtoHLanes::Request { src, size, stream: Stream::NULL, copy }, false);
    let data = lanes.receive(copy, size);
    (data, c.reply::<MemcpyDtoHLanes::Request>().err().unwrap_or(CuError(0)))
}

/// A client of a TCP server, and its lanes: over TCP, lanes prove the token too.
fn tcp_client_with_lanes() -> (Client, Lanes) {
    let t = token("a token for lanes, 32 bytes long");
    let address = start_tcp_server(t.clone());
    let mut c = Client::connect_with(&address, Some(&t));
    let lanes = c.open_lanes(&address, Some(&t));
    (c, lanes)
}

/// Copies of a few chunks per lane (several batches of DMAs) and a ragged
/// end cross both ways, each chunk to the device answered with a receipt,
/// and a failed copy still moves every chunk, so the next one finds its
/// lanes in step.
#[test]
fn large_copies_cross_the_lanes_and_failures_keep_them_in_step() {
    let (mut c, lanes) = tcp_client_with_lanes();
    let size = lanes.chunk * (2 * lanes.lanes.len() as u64 + 3) + 12345;
    let p = c.alloc(size);
    let data = pattern(size as usize, 3);
    lanes_htod(&mut c, &lanes, p, 1, &data).unwrap();
    assert_eq!(c.read(DevPtr(p.0 + size - 1000), 1000), data[data.len() - 1000..], "written through the lanes");
    assert_eq!(lanes_dtoh(&mut c, &lanes, p, 2, size), (Ok(data.clone()), CuError(0)));

    // Outside the allocation: refused, yet every chunk crossed.
    let beyond = DevPtr(p.0 + 4096);
    assert_eq!(lanes_htod(&mut c, &lanes, beyond, 3, &data), Err(CuError::INVALID_VALUE));
    assert_eq!(lanes_dtoh(&mut c, &lanes, beyond, 4, size), (Err(CuError::INVALID_VALUE.0), CuError::INVALID_VALUE));
    let other = pattern(size as usize, 9);
    lanes_htod(&mut c, &lanes, p, 5, &other).unwrap();
    assert_eq!(lanes_dtoh(&mut c, &lanes, p, 6, size).0, Ok(other));
}

/// The GPU time the server counted to every session's copies.
fn copy_seconds(address: &Address, token: &Token) -> f64 {
    let mut c = gpuplex_transport::connect(address, Some(token)).unwrap();
    c.send(&Header::request(Opcode::Status, 1, 0, 0), &[]).unwrap();
    let mut buf = Vec::new();
    c.recv(&mut buf).unwrap();
    let status: ServerStatus = codec::decode(&buf).unwrap();
    status.sessions.0.iter().map(|s| s.copy_seconds).sum()
}

/// A copy across the lanes is the session's copy work like any other: the
/// meter times it (and under `band` it waits for the session's turn).
#[test]
fn lane_copies_are_timed_as_the_sessions_copies() {
    let t = token("a token for lanes, 32 bytes long");
    let address = start_tcp_server(t.clone());
    let mut c = Client::connect_with(&address, Some(&t));
    let lanes = c.open_lanes(&address, Some(&t));
    let size = lanes.chunk * (2 * lanes.lanes.len() as u64) + 99;
    let p = c.alloc(size);
    assert_eq!(copy_seconds(&address, &t), 0.0, "no copy yet");
    lanes_htod(&mut c, &lanes, p, 1, &pattern(size as usize, 7)).unwrap();
    wait_for("the lane copy's time to be counted", || copy_seconds(&address, &t) > 0.0);
}

/// Lanes run by threads of their own, as the client's are, one of them
/// starting late: the copy waits for it and lands whole. (A session that
/// let the punctual lanes' chunks fill its batches could hold all of the
/// late lane's slots while waiting for that lane's next chunk, and hang.)
#[test]
fn a_lane_that_starts_late_delays_a_copy_but_does_not_break_it() {
    let (mut c, lanes) = tcp_client_with_lanes();
    let count = lanes.lanes.len();
    // Several chunks per lane, more than a lane has slots.
    let size = lanes.chunk * (6 * count as u64) + 777;
    let p = c.alloc(size);
    let data = pattern(size as usize, 5);
    within_30_s(move || {
        c.send(MemcpyHtoDLanes::Request { dst: p, size, stream: Stream::NULL, copy: 1 }, false);
        std::thread::scope(|scope| {
            for (l, lane) in lanes.lanes.iter().enumerate() {
                let (data, chunk) = (&data, lanes.chunk);
                scope.spawn(move || {
                    if l == 1 {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    let mut sent = Vec::new();
                    for (_, offset, len) in
                        Cut::to_device(size, chunk).chunks().filter(|&(i, _, _)| i as usize % count == l)
                    {
                        let bytes = &data[offset as usize..(offset + len) as usize];
                        sent.push(ChunkHeader::new(1, offset, len));
                        lane.send_chunk(sent.last().unwrap(), bytes).unwrap();
                    }
                    answered(lane, &sent).unwrap();
                });
            }
        });
        c.reply::<MemcpyHtoDLanes::Request>().unwrap();
        assert_eq!(lanes_dtoh(&mut c, &lanes, p, 2, size), (Ok(data), CuError(0)));
    });
}

/// Chunks may come on any lane in any order: here every chunk of a copy
/// comes on one lane, last chunk first. That lane has no more slots than a
/// batch of DMAs holds, so the session must give its slots back before it
/// waits for more, or wait forever.
#[test]
fn one_lane_may_carry_a_whole_copy_in_any_order() {
    let (mut c, lanes) = tcp_client_with_lanes();
    let size = lanes.chunk * (3 * lanes.lanes.len() as u64) + 99;
    let p = c.alloc(size);
    let data = pattern(size as usize, 6);
    within_30_s(move || {
        c.send(MemcpyHtoDLanes::Request { dst: p, size, stream: Stream::NULL, copy: 1 }, false);
        let mut sent: Vec<_> =
            Cut::to_device(size, lanes.chunk).chunks().map(|(_, o, len)| ChunkHeader::new(1, o, len)).collect();
        sent.reverse();
        for header in &sent {
            let (offset, len) = (header.offset.get() as usize, header.length.get() as usize);
            lanes.lanes[2].send_chunk(header, &data[offset..offset + len]).unwrap();
        }
        answered(&lanes.lanes[2], &sent).unwrap();
        c.reply::<MemcpyHtoDLanes::Request>().unwrap();
        assert_eq!(lanes_dtoh(&mut c, &lanes, p, 2, size), (Ok(data), CuError(0)));
    });
}

/// Chunks from the device go to the lanes that read them: a lane whose
/// client reads nothing until the other lanes have ended their shares
/// carries only the few chunks its writer may keep unanswered, and the
/// copy still lands whole.
#[test]
fn chunks_from_the_device_go_to_the_lanes_that_read() {
    let (mut c, lanes) = tcp_client_with_lanes();
    let count = lanes.lanes.len();
    let size = lanes.chunk * (6 * count as u64) + 4321;
    let p = c.alloc(size);
    let data = pattern(size as usize, 8);
    lanes_htod(&mut c, &lanes, p, 1, &data).unwrap();
    within_30_s(move || {
        c.send(MemcpyDtoHLanes::Request { src: p, size, stream: Stream::NULL, copy: 2 }, false);
        let cut = Cut::from_device(size, lanes.chunk, count as u64);
        let read_share = |lane: &Lane| {
            let mut got = Vec::new();
            loop {
                let h = lane.recv_header().unwrap();
                if h.is_end() && h.copy.get() == 2 {
                    return got;
                }
                let (offset, len) = (h.offset.get() as usize, h.length.get() as usize);
                assert!(h.status.get() == 0 && h.index_in(2, &cut).is_some(), "{h:?}");
                let mut bytes = vec![0u8; len];
                lane.recv_exact(&mut bytes).unwrap();
                lane.send_chunk(&ChunkHeader::receipt(2, offset as u64), &[]).unwrap();
                got.push((offset, bytes));
            }
        };
        let others: Vec<_> = std::thread::scope(|scope| {
            let readers: Vec<_> = lanes.lanes[1..].iter().map(|lane| scope.spawn(move || read_share(lane))).collect();
            readers.into_iter().flat_map(|r| r.join().unwrap()).collect()
        });
        let idle = read_share(&lanes.lanes[0]);
        assert!(idle.len() <= gpuplex_server::session::lanes::OUT_AHEAD, "the idle lane carried {}", idle.len());
        let mut landed = vec![0u8; size as usize];
        for (offset, bytes) in idle.into_iter().chain(others) {
            landed[offset..offset + bytes.len()].copy_from_slice(&bytes);
        }
        assert!(landed == data, "every chunk landed in its place");
        c.reply::<MemcpyDtoHLanes::Request>().unwrap();
    });
}

/// A lane copy after a failed posted call answers with that error, but
/// moves its chunks (and runs): the lanes must stay in step.
#[test]
fn a_deferred_error_answers_a_lane_copy_that_still_runs() {
    let address = start_server("lanes-deferred");
    let mut c = Client::connect(&address);
    let lanes = c.open_lanes(&address, None);
    let size = lanes.chunk * 2 + 7;
    let p = c.alloc(size);
    c.post(cuEventRecord::Request { hEvent: Event(0xdead0), hStream: Stream::NULL });
    let data = pattern(size as usize, 5);
    assert_eq!(lanes_htod(&mut c, &lanes, p, 1, &data), Err(CuError::INVALID_HANDLE));
    assert_eq!(lanes_dtoh(&mut c, &lanes, p, 2, size), (Ok(data), CuError(0)));
}

/// Only the session's own peer joins, once per lane and with the key; a
/// lane carrying a chunk other than the one due ends its session alone.
#[test]
fn lanes_refuse_strangers_and_end_only_a_liar_s_session() {
    let address = start_server("lanes-liar");
    let mut bystander = Client::connect(&address);
    let p = bystander.alloc(64);
    bystander.write(p, &[1; 64]);

    let mut c = Client::connect(&address);
    let lanes = c.open_lanes(&address, None);
    let n = lanes.lanes.len() as u32;
    let invalid = CuError::INVALID_VALUE.0;
    assert_eq!(join_lane(&address, None, [7; 32], 0).err(), Some(invalid), "a wrong key");
    assert_eq!(join_lane(&address, None, lanes.key, n).err(), Some(invalid), "no such lane");
    assert_eq!(join_lane(&address, None, lanes.key, 0).err(), Some(invalid), "joined already");
    let opened = Header::request(Opcode::OpenLanes, 900, c.ctx.0, 0);
    c.carrier.send(&opened, &[]).unwrap();
    let h = c.carrier.recv(&mut Vec::new()).unwrap();
    assert_eq!((h.request_id.get(), h.status.get()), (900, invalid), "lanes opened twice");

    let q = c.alloc(lanes.chunk * 2);
    c.send(MemcpyHtoDLanes::Request { dst: q, size: lanes.chunk * 2, stream: Stream::NULL, copy: 1 }, false);
    // The server may close the lanes before the second chunk is sent.
    let _ = lanes.send(2, &vec![0; lanes.chunk as usize * 2]);
    let h = c.carrier.recv(&mut Vec::new()).unwrap();
    assert_eq!(h.status.get(), CuError::DEVICE_UNAVAILABLE.0, "the copy fails");
    assert!(c.carrier.recv(&mut Vec::new()).is_err(), "then the liar's session ends");
    assert_eq!(bystander.read(p, 64), vec![1; 64], "the bystander carries on");
    wait_for("the liar's session to close", || summary(&address).sessions.0.len() == 1);
}

/// A chunk sent twice (on two lanes), where another was due, ends its
/// session too: the copy would otherwise wait for one that never comes.
#[test]
fn a_chunk_sent_twice_ends_its_session() {
    let address = start_server("lanes-twice");
    let mut c = Client::connect(&address);
    let lanes = c.open_lanes(&address, None);
    let q = c.alloc(lanes.chunk * 2);
    c.send(MemcpyHtoDLanes::Request { dst: q, size: lanes.chunk * 2, stream: Stream::NULL, copy: 1 }, false);
    let first = ChunkHeader::new(1, 0, lanes.chunk);
    let bytes = vec![5; lanes.chunk as usize];
    for lane in &lanes.lanes[..2] {
        // The server may close the lanes before the second is sent.
        let _ = lane.send_chunk(&first, &bytes);
    }
    let h = c.carrier.recv(&mut Vec::new()).unwrap();
    assert_eq!(h.status.get(), CuError::DEVICE_UNAVAILABLE.0, "the copy fails");
    assert!(c.carrier.recv(&mut Vec::new()).is_err(), "then the session ends");
}

/// A copy larger than any device holds ends its session at once, both
/// ways, instead of the server counting its chunks; a bystander carries on.
#[test]
fn a_copy_larger_than_any_device_ends_its_session() {
    let address = start_server("lanes-huge");
    let mut bystander = Client::connect(&address);
    let p = bystander.alloc(64);
    bystander.write(p, &[2; 64]);
    for htod in [true, false] {
        let mut c = Client::connect(&address);
        let _lanes = c.open_lanes(&address, None);
        let (src, dst, size) = (DevPtr(0x1000), DevPtr(0x1000), 1 << 62);
        if htod {
            c.send(MemcpyHtoDLanes::Request { dst, size, stream: Stream::NULL, copy: 1 }, false);
        } else {
            c.send(MemcpyDtoHLanes::Request { src, size, stream: Stream::NULL, copy: 1 }, false);
        }
        let h = c.carrier.recv(&mut Vec::new()).unwrap();
        assert_eq!(h.status.get(), CuError::DEVICE_UNAVAILABLE.0, "the copy fails");
        assert!(c.carrier.recv(&mut Vec::new()).is_err(), "then the session ends");
    }
    assert_eq!(bystander.read(p, 64), vec![2; 64], "the bystander carries on");
}

/// A receipt for a chunk the server did not send, or sent and had answered
/// already, ends its session: the out slot it would free may be in use.
#[test]
fn a_receipt_for_no_chunk_in_flight_ends_its_session() {
    let address = start_server("lanes-receipt");
    let mut c = Client::connect(&address);
    let lanes = c.open_lanes(&address, None);
    let size = lanes.chunk * 3;
    let p = c.alloc(size);
    assert_eq!(lanes_dtoh(&mut c, &lanes, p, 1, size).1, CuError(0));
    lanes.lanes[0].send_chunk(&ChunkHeader::receipt(1, 0), &[]).unwrap();
    // More chunks than the lanes have slots, none read: the copy must wait
    // for receipts, and meets the closed lane instead.
    let more = lanes.chunk * 8 * lanes.lanes.len() as u64;
    let q = c.alloc(more);
    within_30_s(move || {
        c.send(MemcpyDtoHLanes::Request { src: q, size: more, stream: Stream::NULL, copy: 2 }, false);
        let h = c.carrier.recv(&mut Vec::new()).unwrap();
        assert_eq!(h.status.get(), CuError::DEVICE_UNAVAILABLE.0, "the next copy fails");
        assert!(c.carrier.recv(&mut Vec::new()).is_err(), "then the session ends");
        drop(lanes);
    });
}
