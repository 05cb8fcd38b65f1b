//! The lanes alone: what the socket and TCP columns' large copies could
//! reach on this machine if the server, the session and the GPU cost
//! nothing.
//!
//! Those copies travel on a session's lanes (see the server's
//! `session/lanes/mod.rs`). This opens lanes the same way (as many, over
//! the same carrier, with the same chunk size, spliced sends, each lane
//! taking the next chunk no other has taken once its last is answered, and
//! a few chunk slots per lane to receive into) and moves a host buffer
//! through them to the slots, with no server or GPU. On the H100 machine bare TCP loopback is bound by the
//! CPU's copies out of the socket, so this ceiling, not the GPU's, is what
//! a TCP copy's bandwidth is to be read against.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::Instant;

use gpuplex_protocol::lane::{ChunkHeader, Cut, AHEAD};
use gpuplex_server::session::lanes::Shape;
use gpuplex_transport::tcp::{TcpCarrier, TcpListener};
use gpuplex_transport::unix::UnixCarrier;
use gpuplex_transport::{Carrier, Lane, Listener, Pipe, Token};

use super::carrier::{random_token, CarrierKind};

/// One sample: `passes` times `bytes` moved host to host, after one pass
/// to warm the connections; in GB/s.
pub fn measure(kind: CarrierKind, shape: Shape, bytes: usize, passes: usize) -> Result<f64, String> {
    let pairs = connect(kind, shape.lanes)?;
    let source = pattern(bytes);
    let count = cut(shape, bytes).count() as usize;
    let plan: Vec<Pass> = (0..=passes).map(|_| Pass::new(count)).collect();
    // Every sender and receiver, then the timer, once the warm-up is through.
    let warm = Barrier::new(2 * shape.lanes + 1);
    std::thread::scope(|s| {
        let mut receivers = Vec::new();
        for (tx, rx) in pairs {
            let (warm, source, plan) = (&warm, &source, &plan);
            // A side that fails shuts its end at once, so that its peer
            // fails too instead of waiting for it (at the barrier, say).
            s.spawn(move || {
                let mut sent = send(&tx, shape, source, &plan[0], 0);
                stop_if_failed(&tx, &sent);
                warm.wait();
                for (p, pass) in plan.iter().enumerate().skip(1) {
                    sent = sent.and_then(|()| send(&tx, shape, source, pass, p as u64));
                }
                stop_if_failed(&tx, &sent);
            });
            receivers.push(s.spawn(move || {
                let mut slots = vec![0u8; shape.slots * shape.chunk];
                let mut got = receive(&rx, shape, &mut slots, bytes, &plan[0], 0);
                stop_if_failed(&rx, &got);
                warm.wait();
                for (p, pass) in plan.iter().enumerate().skip(1) {
                    got = got.and_then(|n| Ok(n + receive(&rx, shape, &mut slots, bytes, pass, p as u64)?));
                }
                stop_if_failed(&rx, &got);
                got
            }));
        }
        warm.wait();
        let start = Instant::now();
        let mut outcome: Result<usize, String> = Ok(0);
        for r in receivers {
            let got = r.join().unwrap_or_else(|_| Err("a receiving thread panicked".into()));
            outcome = outcome.and_then(|total| Ok(total + got?));
        }
        let seconds = start.elapsed().as_secs_f64();
        match outcome? {
            total if total == (passes + 1) * count => Ok((passes * bytes) as f64 / seconds / 1e9),
            total => Err(format!("{total} of {} chunks came", (passes + 1) * count)),
        }
    })
}

/// What the lanes share in one pass.
struct Pass {
    /// The index of the next chunk no lane has taken.
    next: AtomicU64,
    /// Which chunks have come, on any lane.
    arrived: Vec<AtomicBool>,
}

impl Pass {
    fn new(count: usize) -> Pass {
        Pass { next: AtomicU64::new(0), arrived: (0..count).map(|_| AtomicBool::new(false)).collect() }
    }
}

fn stop_if_failed<T>(lane: &Lane, outcome: &Result<T, String>) {
    if outcome.is_err() {
        lane.shutdown();
    }
}

/// `lanes` connected pairs (sending end, receiving end).
fn connect(kind: CarrierKind, lanes: usize) -> Result<Vec<(Lane, Lane)>, String> {
    let lane = |c: Box<dyn Carrier>| c.into_lane().map_err(|e| format!("no lane: {e}"));
    match kind {
        CarrierKind::Tcp => {
            let token = random_token().map_err(|e| format!("no token: {e}"))?;
            let token = Token::new(&token).map_err(|e| e.to_string())?;
            let keys = std::sync::Arc::new(gpuplex_transport::Keyring::default());
            keys.replace(vec![(String::new(), token.clone())]);
            let listener = TcpListener::bind("127.0.0.1:0", keys).map_err(|e| format!("cannot listen: {e}"))?;
            let gpuplex_transport::Address::Tcp(host_port) = listener.address() else {
                unreachable!("a TCP listener has a TCP address")
            };
            (0..lanes)
                .map(|_| {
                    let accepting = std::thread::scope(|s| {
                        let accepting = s.spawn(|| {
                            let mut c = listener.accept()?;
                            c.authenticate()?;
                            Ok::<_, gpuplex_transport::TransportError>(c)
                        });
                        let connected = TcpCarrier::connect(&host_port, &token);
                        if connected.is_err() {
                            // Wakes the accepting thread, whose opening then fails.
                            let _ = std::net::TcpStream::connect(&host_port);
                        }
                        (connected, accepting.join())
                    });
                    match accepting {
                        (Ok(tx), Ok(Ok(rx))) => Ok((lane(Box::new(tx))?, lane(rx)?)),
                        (Err(e), _) | (_, Ok(Err(e))) => Err(format!("cannot connect: {e}")),
                        (_, Err(_)) => Err("the accepting thread panicked".into()),
                    }
                })
                .collect()
        }
        CarrierKind::Shm => Err("shared-memory copies use no lanes".into()),
        CarrierKind::Socket => (0..lanes)
            .map(|_| {
                let (tx, rx) = UnixCarrier::pair().map_err(|e| format!("no socket pair: {e}"))?;
                Ok((lane(Box::new(tx))?, lane(Box::new(rx))?))
            })
            .collect(),
    }
}

/// The buffer to send: each 8-byte word holds its own index, so a chunk's
/// first and last word say whether it landed whole and in its place.
fn pattern(bytes: usize) -> Vec<u8> {
    let mut buffer = vec![0u8; bytes];
    for (w, word) in buffer.chunks_exact_mut(8).enumerate() {
        word.copy_from_slice(&(w as u64).to_le_bytes());
    }
    buffer
}

fn word(data: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(data[at..at + 8].try_into().expect("8 bytes"))
}

/// One pass: chunks taken until none is left, spliced and answered as the
/// client's lanes send them, then the marker that ends this lane's share.
fn send(tx: &Lane, shape: Shape, source: &[u8], pass: &Pass, p: u64) -> Result<(), String> {
    // The source never changes, so spliced pages may be read at any time.
    let pipe = Pipe::new(shape.chunk).ok();
    let cut = cut(shape, source.len());
    let mut unanswered = VecDeque::with_capacity(AHEAD);
    let await_receipt = |unanswered: &mut VecDeque<ChunkHeader>| {
        let receipt = tx.recv_header().map_err(|e| format!("receipt: {e}"))?;
        let sent = unanswered.pop_front().expect("a chunk is unanswered");
        receipt.acknowledges(&sent).then_some(()).ok_or_else(|| format!("got {receipt:?} for {sent:?}"))
    };
    loop {
        if unanswered.len() == AHEAD {
            await_receipt(&mut unanswered)?;
        }
        let Some((offset, len)) = cut.at(pass.next.fetch_add(1, Ordering::Relaxed)) else {
            break;
        };
        let header = ChunkHeader::new(p, offset, len);
        let data = &source[offset as usize..(offset + len) as usize];
        match &pipe {
            Some(pipe) => tx.send_chunk_spliced(&header, data, pipe),
            None => tx.send_chunk(&header, data),
        }
        .map_err(|e| format!("send: {e}"))?;
        unanswered.push_back(header);
    }
    while !unanswered.is_empty() {
        await_receipt(&mut unanswered)?;
    }
    tx.send_chunk(&ChunkHeader::end(p), &[]).map_err(|e| format!("send: {e}"))
}

/// How a pass of `bytes` is cut: as a copy to the device is, since its
/// lanes take chunks the same way.
fn cut(shape: Shape, bytes: usize) -> Cut {
    Cut::to_device(bytes as u64, shape.chunk as u64)
}

/// One pass: chunks into the lane's slots in turn, each checked and
/// answered, until the marker that ends the lane's share; how many came.
fn receive(rx: &Lane, shape: Shape, slots: &mut [u8], bytes: usize, pass: &Pass, p: u64) -> Result<usize, String> {
    let cut = cut(shape, bytes);
    for n in 0.. {
        let header = rx.recv_header().map_err(|e| format!("receive: {e}"))?;
        if header.is_end() && header.copy.get() == p {
            return Ok(n);
        }
        let Some(i) = header.index_in(p, &cut) else {
            return Err(format!("received {header:?}, no chunk of pass {p}"));
        };
        if pass.arrived[i as usize].swap(true, Ordering::Relaxed) {
            return Err(format!("received chunk {i} of pass {p} twice"));
        }
        let (offset, len) = (header.offset.get() as usize, header.length.get() as usize);
        let slot = &mut slots[n % shape.slots * shape.chunk..][..len];
        rx.recv_exact(slot).map_err(|e| format!("receive: {e}"))?;
        if word(slot, 0) != (offset / 8) as u64 || word(slot, len - 8) != ((offset + len) / 8 - 1) as u64 {
            return Err(format!("chunk {i} of pass {p} arrived corrupted"));
        }
        let receipt = ChunkHeader::receipt(p, offset as u64);
        rx.send_chunk(&receipt, &[]).map_err(|e| format!("receipt: {e}"))?;
    }
    unreachable!("the loop returns")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lanes whose shares differ in length and end on a short chunk.
    const SHAPE: Shape = Shape { lanes: 3, chunk: 64 << 10, slots: 2 };
    const BYTES: usize = (1 << 20) + (8 << 10);

    #[test]
    fn lanes_alone_move_every_chunk_over_both_carriers() {
        for kind in [CarrierKind::Socket, CarrierKind::Tcp] {
            let gbps = measure(kind, SHAPE, BYTES, 2).unwrap_or_else(|e| panic!("{}: {e}", kind.name()));
            assert!(gbps > 0.0 && gbps.is_finite(), "{}: {gbps}", kind.name());
        }
        assert!(measure(CarrierKind::Shm, SHAPE, BYTES, 1).is_err());
    }

    /// Sends `data` as chunk `offset` of pass 0, then the end of the share,
    /// on a fresh pair; what the receiver made of it.
    fn receive_one(header: ChunkHeader, data: &[u8]) -> Result<usize, String> {
        let mut pairs = connect(CarrierKind::Socket, 1).unwrap();
        let (tx, rx) = pairs.pop().unwrap();
        tx.send_chunk(&header, data).unwrap();
        tx.send_chunk(&ChunkHeader::end(0), &[]).unwrap();
        let mut slots = vec![0u8; SHAPE.slots * SHAPE.chunk];
        receive(&rx, SHAPE, &mut slots, 4 * SHAPE.chunk, &Pass::new(4), 0)
    }

    #[test]
    fn a_chunk_out_of_place_twice_or_corrupted_is_an_error() {
        let source = pattern(4 * SHAPE.chunk);
        let (offset, len) = (SHAPE.chunk as u64, SHAPE.chunk as u64);
        let chunk = &source[SHAPE.chunk..2 * SHAPE.chunk];
        assert_eq!(receive_one(ChunkHeader::new(0, offset, len), chunk), Ok(1));
        // Not a chunk of this pass: a stray offset, another pass.
        let stray = receive_one(ChunkHeader::new(0, offset + 8, len), chunk).unwrap_err();
        assert!(stray.contains("no chunk"), "{stray}");
        assert!(receive_one(ChunkHeader::new(1, offset, len), chunk).is_err());
        // The header right, the bytes those of another chunk.
        let wrong = &source[..SHAPE.chunk];
        let corrupted = receive_one(ChunkHeader::new(0, offset, len), wrong).unwrap_err();
        assert!(corrupted.contains("corrupted"), "{corrupted}");
        // The same chunk twice.
        let (tx, rx) = connect(CarrierKind::Socket, 1).unwrap().pop().unwrap();
        for _ in 0..2 {
            tx.send_chunk(&ChunkHeader::new(0, offset, len), chunk).unwrap();
        }
        let mut slots = vec![0u8; SHAPE.slots * SHAPE.chunk];
        let twice = receive(&rx, SHAPE, &mut slots, 4 * SHAPE.chunk, &Pass::new(4), 0).unwrap_err();
        assert!(twice.contains("twice"), "{twice}");
    }
}
