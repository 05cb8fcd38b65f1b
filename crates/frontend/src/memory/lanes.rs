//! Bulk lanes: large copies over several connections at once, when no
//! memory is shared with the server (TCP, or `GPUPLEX_CARRIER=socket`).
//!
//! One socket moves a few GB/s, since one thread on each side copies every
//! byte through the kernel; the server's side of this is described in its
//! `session/lanes/mod.rs`. The first large copy asks for lanes (`OpenLanes`),
//! connects each as any client does (over TCP, proving the token) and
//! joins it to the session by key. Each lane then has a thread here that
//! sends chunks straight from the caller's buffer, or receives them
//! straight into it. Chunks go on whichever lane is ready first (lanes are
//! far from equal; see the server's side): to the device, each lane thread
//! takes the next chunk no other has taken, once fewer than [`AHEAD`] of
//! its chunks are unanswered by the server's receipts; from it, each
//! receives what the server sent on its lane until the marker that ends
//! its share, answering each chunk with a receipt once it has read it (the
//! server splices its slots too, and reuses one only after its receipt).
//! It reads a chunk in pieces into a small buffer that stays in its
//! core's cache, and writes each out with streaming stores ([`streaming`]).
//! Both sides cut a copy into chunks alike ([`Cut`]: from the device,
//! small ones at its ends). The call itself still goes on the main
//! connection, in order with every other.
//!
//! Sending splices the caller's pages into the socket instead of copying
//! them (`vmsplice`): the client spends no CPU copy on an upload, and on a
//! loopback the server's read is the only one. The kernel reads those pages until the server has read the chunk, so `send`
//! returns only once every chunk is answered; then the caller's buffer is
//! free, and a copy that may be posted needs no reply.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;

use gpuplex_protocol::lane::{ChunkHeader, Cut, AHEAD};
use gpuplex_protocol::{codec, CuError, ErrorDetail, Header, LaneJoin, LaneOffer, Opcode};
use gpuplex_transport::{Address, Carrier, Lane, Pipe, Token, TransportError};

use super::streaming;
use crate::log;

/// Bytes a lane receives at a time before it writes them to the caller's
/// buffer (see [`streaming`]): small enough to stay in the core's cache.
/// Larger ones measured within the noise (`docs/performance.md`).
const BOUNCE: usize = 64 << 10;

pub struct Lanes {
    workers: Vec<Sender<Job>>,
    /// Per job, the chunks the lane moved.
    done: Receiver<Result<u64, LaneError>>,
    chunk: u64,
    lanes: u64,
    next_copy: u64,
}

/// Why a copy over the lanes failed.
pub enum LaneError {
    /// A lane broke or carried something unexpected: the session is over.
    Lost(String),
    /// The server could not read the device (the copy's CUDA error).
    Failed(CuError),
}

/// A copy, for one lane to take its part in: of the buffer at `base` (an
/// address, to cross threads), as long as `cut` says.
struct Job {
    copy: u64,
    base: usize,
    cut: Cut,
    direction: Direction,
}

/// What the lanes of one copy share.
#[derive(Clone)]
enum Direction {
    /// The index of the next chunk no lane has taken.
    Send { next: Arc<AtomicU64> },
    /// Which chunks have come, on any lane.
    Receive { arrived: Arc<[AtomicBool]> },
}

impl Lanes {
    /// Connects and joins every lane the server offered.
    pub fn open(offer: &LaneOffer, address: &Address, token: Option<&Token>) -> Result<Lanes, String> {
        if offer.lanes == 0 || offer.chunk_bytes == 0 {
            return Err("the server offered no lanes".into());
        }
        let (done_tx, done) = channel();
        let (mut workers, mut copying) = (Vec::new(), false);
        for index in 0..offer.lanes {
            let lane = join(offer, index, address, token).map_err(|e| format!("lane {index}: {e}"))?;
            let pipe = match Pipe::new(offer.chunk_bytes as usize) {
                Ok(pipe) => Some(pipe),
                Err(e) => {
                    if !std::mem::replace(&mut copying, true) {
                        log::info(&format!("lanes copy what they send: no vmsplice on lane {index} ({e})"));
                    }
                    None
                }
            };
            let (jobs, inbox) = channel();
            let done = done_tx.clone();
            std::thread::Builder::new()
                .name(format!("gpuplex-lane-{index}"))
                .spawn(move || work(lane, pipe, inbox, done))
                .map_err(|e| format!("cannot start a lane thread: {e}"))?;
            workers.push(jobs);
        }
        Ok(Lanes { workers, done, chunk: offer.chunk_bytes, lanes: offer.lanes.into(), next_copy: 1 })
    }

    /// A new copy's number, for its call and its chunks.
    pub fn next_copy(&mut self) -> u64 {
        let copy = self.next_copy;
        self.next_copy += 1;
        copy
    }

    /// Sends all of `src` as chunks of `copy`; returns once the server has
    /// read every byte (answered every chunk), so `src` may change then.
    pub fn send(&mut self, copy: u64, src: &[u8]) -> Result<(), LaneError> {
        let cut = Cut::to_device(src.len() as u64, self.chunk);
        self.run(copy, src.as_ptr() as usize, cut, Direction::Send { next: Arc::default() })
    }

    /// Receives every chunk of `copy` into `dst`.
    pub fn receive(&mut self, copy: u64, dst: &mut [u8]) -> Result<(), LaneError> {
        let cut = Cut::from_device(dst.len() as u64, self.chunk, self.lanes);
        let arrived = (0..cut.count()).map(|_| AtomicBool::new(false)).collect();
        self.run(copy, dst.as_mut_ptr() as usize, cut, Direction::Receive { arrived })
    }

    /// Gives every lane the copy and waits for all of them, so that no lane
    /// touches the buffer after this returns.
    fn run(&mut self, copy: u64, base: usize, cut: Cut, direction: Direction) -> Result<(), LaneError> {
        let mut started = 0;
        let mut outcome = Ok(());
        for (index, worker) in self.workers.iter().enumerate() {
            let job = Job { copy, base, cut, direction: direction.clone() };
            match worker.send(job) {
                Ok(()) => started += 1,
                Err(_) => outcome = Err(LaneError::Lost(format!("lane {index}'s thread is gone"))),
            }
        }
        let mut moved = 0;
        for _ in 0..started {
            let result = self.done.recv().unwrap_or_else(|_| Err(LaneError::Lost("lane threads are gone".into())));
            // A lost lane outranks a CUDA error: the session is over.
            match (&outcome, result) {
                (_, Ok(chunks)) => moved += chunks,
                (_, Err(e @ LaneError::Lost(_))) | (Ok(()), Err(e)) => outcome = Err(e),
                _ => {}
            }
        }
        let count = cut.count();
        if outcome.is_ok() && started == self.workers.len() && moved != count {
            return Err(LaneError::Lost(format!("the lanes moved {moved} of copy {copy}'s {count} chunks")));
        }
        outcome
    }
}

/// Connects one lane and joins it to the session.
fn join(offer: &LaneOffer, index: u32, address: &Address, token: Option<&Token>) -> Result<Lane, String> {
    connect_joined(address, token, offer.key, index)?.into_lane().map_err(|e| e.to_string())
}

/// A new connection to the server, joined to the session as its lane `index`.
pub fn connect_joined(
    address: &Address,
    token: Option<&Token>,
    key: [u8; 32],
    index: u32,
) -> Result<Box<dyn Carrier>, String> {
    let mut carrier = gpuplex_transport::connect(address, token).map_err(|e| e.to_string())?;
    let payload = codec::encode(&LaneJoin { key, index });
    let request = Header::request(Opcode::JoinLane, 1, 0, payload.len());
    let mut reply = Vec::new();
    let header = carrier.send(&request, &payload).and_then(|()| carrier.recv(&mut reply)).map_err(|e| e.to_string())?;
    if header.status.get() != 0 {
        let detail = codec::decode::<ErrorDetail>(&reply).map(|d| d.detail).unwrap_or_default();
        return Err(format!("refused ({}): {detail}", header.status.get()));
    }
    Ok(carrier)
}

fn work(lane: Lane, pipe: Option<Pipe>, jobs: Receiver<Job>, done: Sender<Result<u64, LaneError>>) {
    gpuplex_transport::block_sigpipe_on_this_thread();
    let mut bounce = vec![0; BOUNCE];
    for job in jobs {
        let result = match &job.direction {
            Direction::Send { next } => send(&lane, &job, next, pipe.as_ref()),
            Direction::Receive { arrived } => receive(&lane, &job, arrived, &mut bounce),
        };
        let lost = matches!(result, Err(LaneError::Lost(_)));
        if done.send(result).is_err() || lost {
            lane.shutdown();
            return;
        }
    }
}

fn lost(e: TransportError) -> LaneError {
    LaneError::Lost(e.to_string())
}

/// Sends chunks of the job until none is left to take, each once fewer
/// than [`AHEAD`] are unanswered; returns how many, once all are answered.
fn send(lane: &Lane, job: &Job, next: &AtomicU64, pipe: Option<&Pipe>) -> Result<u64, LaneError> {
    let (mut sent, mut unanswered) = (0, VecDeque::with_capacity(AHEAD));
    loop {
        if unanswered.len() == AHEAD {
            await_receipt(lane, &mut unanswered)?;
        }
        let Some((offset, len)) = job.cut.at(next.fetch_add(1, Ordering::Relaxed)) else {
            break;
        };
        // SAFETY: the caller of `Lanes::run` keeps the buffer alive and
        // unchanged until every lane has reported this job done.
        let data = unsafe { std::slice::from_raw_parts((job.base + offset as usize) as *const u8, len as usize) };
        let header = ChunkHeader::new(job.copy, offset, len);
        match pipe {
            Some(pipe) => lane.send_chunk_spliced(&header, data, pipe),
            None => lane.send_chunk(&header, data),
        }
        .map_err(lost)?;
        unanswered.push_back(header);
        sent += 1;
    }
    while !unanswered.is_empty() {
        await_receipt(lane, &mut unanswered)?;
    }
    Ok(sent)
}

/// Reads the receipt for the oldest unanswered chunk.
fn await_receipt(lane: &Lane, unanswered: &mut VecDeque<ChunkHeader>) -> Result<(), LaneError> {
    let header = lane.recv_header().map_err(lost)?;
    let oldest = unanswered.pop_front().expect("awaited only for a chunk sent");
    if !header.acknowledges(&oldest) {
        return Err(LaneError::Lost(format!("got {header:?}, not the receipt for {oldest:?}")));
    }
    Ok(())
}

/// Receives chunks of the job until the server ends this lane's share,
/// returning a receipt for each (its slot on the server is lent until
/// then); returns how many came.
fn receive(lane: &Lane, job: &Job, arrived: &[AtomicBool], bounce: &mut [u8]) -> Result<u64, LaneError> {
    let (mut received, mut failed) = (0, None);
    loop {
        let header = lane.recv_header().map_err(lost)?;
        if header.is_end() && header.copy.get() == job.copy {
            return failed.map_or(Ok(received), |e| Err(LaneError::Failed(e)));
        }
        let Some(i) = header.index_in(job.copy, &job.cut) else {
            return Err(LaneError::Lost(format!("got {header:?}, no chunk of copy {}", job.copy)));
        };
        if arrived[i as usize].swap(true, Ordering::Relaxed) {
            return Err(LaneError::Lost(format!("got chunk {i} of copy {} twice", job.copy)));
        }
        received += 1;
        match header.status.get() {
            0 => {
                let (offset, len) = (header.offset.get() as usize, header.length.get() as usize);
                // SAFETY: as in `send`; each chunk is written once, by the
                // lane that took it first, inside the buffer (`index_in`).
                let dst = unsafe { std::slice::from_raw_parts_mut((job.base + offset) as *mut u8, len) };
                let receipt = ChunkHeader::receipt(job.copy, offset as u64);
                let mut done = 0;
                for piece in dst.chunks_mut(BOUNCE) {
                    let cached = &mut bounce[..piece.len()];
                    lane.recv_exact(cached).map_err(lost)?;
                    done += piece.len();
                    if done == len {
                        // The server's slot is free once its bytes are read.
                        lane.send_chunk(&receipt, &[]).map_err(lost)?;
                    }
                    streaming::copy(piece, cached);
                }
            }
            status => failed = failed.or(Some(CuError(status))),
        }
    }
}
