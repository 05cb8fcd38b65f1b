//! Bulk lanes: large copies over several connections at once, when no
//! memory is shared with the server (TCP, or `GPUPLEX_CARRIER=socket`).
//!
//! One socket moves a few GB/s, since one thread on each side copies every
//! byte through the kernel; the server's side of this is described in its
//! `session/lanes.rs`. The first large copy asks for lanes (`OpenLanes`),
//! connects each as any client does (over TCP, proving the token) and
//! joins it to the session by key. Each lane then has a thread here that
//! sends its chunks straight from the caller's buffer, or receives them
//! straight into it: chunk `i` of a copy goes on lane `i % lanes`. The call
//! itself still goes on the main connection, in order with every other.
//!
//! Sending splices the caller's pages into the socket instead of copying
//! them (`vmsplice`): the client spends no CPU copy on an upload, and on a
//! loopback the server's read is the only one. (With the server's
//! pipelined rounds, alternating runs on the H100 machine moved 19.5-22.7
//! GB/s to the device over TCP loopback, against 16.1-19.9 before.) The
//! pages are read after `send` returns, so such a copy waits for the
//! server's reply even when its call could have been posted.

use std::sync::mpsc::{channel, Receiver, Sender};

use gpuplex_protocol::lane::{self, ChunkHeader};
use gpuplex_protocol::{codec, CuError, ErrorDetail, Header, LaneJoin, LaneOffer, Opcode};
use gpuplex_transport::{Address, Lane, Pipe, Token, TransportError};

use crate::log;

pub struct Lanes {
    workers: Vec<Sender<Job>>,
    done: Receiver<Result<(), LaneError>>,
    chunk: u64,
    next_copy: u64,
    /// Whether every lane splices what it sends (see `Lane::send_chunk_spliced`).
    spliced: bool,
}

/// Why a copy over the lanes failed.
pub enum LaneError {
    /// A lane broke or carried something unexpected: the session is over.
    Lost(String),
    /// The server could not read the device (the copy's CUDA error).
    Failed(CuError),
}

/// One lane's share of a copy: every `lanes`-th chunk from `first`, of the
/// buffer at `base` (an address, to cross threads).
struct Job {
    copy: u64,
    base: usize,
    size: u64,
    first: usize,
    lanes: usize,
    chunk: u64,
    direction: Direction,
}

#[derive(Clone, Copy)]
enum Direction {
    Send,
    Receive,
}

impl Lanes {
    /// Connects and joins every lane the server offered.
    pub fn open(offer: &LaneOffer, address: &Address, token: Option<&Token>) -> Result<Lanes, String> {
        if offer.lanes == 0 || offer.chunk_bytes == 0 {
            return Err("the server offered no lanes".into());
        }
        let (done_tx, done) = channel();
        let mut workers = Vec::new();
        let mut spliced = true;
        for index in 0..offer.lanes {
            let lane = join(offer, index, address, token).map_err(|e| format!("lane {index}: {e}"))?;
            let pipe = match Pipe::new(offer.chunk_bytes as usize) {
                Ok(pipe) => Some(pipe),
                Err(e) => {
                    if spliced {
                        log::info(&format!("lanes copy what they send: no vmsplice ({e})"));
                    }
                    spliced = false;
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
        Ok(Lanes { workers, done, chunk: offer.chunk_bytes, next_copy: 1, spliced })
    }

    /// Whether the bytes sent stay in the caller's buffer until the server
    /// has read them (they are spliced, not copied): the caller must then
    /// wait for the server's reply before the buffer may change.
    pub fn borrow_what_they_send(&self) -> bool {
        self.spliced
    }

    /// A new copy's number, for its call and its chunks.
    pub fn next_copy(&mut self) -> u64 {
        let copy = self.next_copy;
        self.next_copy += 1;
        copy
    }

    /// Sends all of `src` as chunks of `copy`; returns once every byte is
    /// on its way (in the kernel's buffers, or read by the server).
    pub fn send(&mut self, copy: u64, src: &[u8]) -> Result<(), LaneError> {
        self.run(copy, src.as_ptr() as usize, src.len(), Direction::Send)
    }

    /// Receives every chunk of `copy` into `dst`.
    pub fn receive(&mut self, copy: u64, dst: &mut [u8]) -> Result<(), LaneError> {
        self.run(copy, dst.as_mut_ptr() as usize, dst.len(), Direction::Receive)
    }

    /// Gives each lane its share and waits for all of them, so that no lane
    /// touches the buffer after this returns.
    fn run(&mut self, copy: u64, base: usize, size: usize, direction: Direction) -> Result<(), LaneError> {
        let lanes = self.workers.len();
        let mut started = 0;
        let mut outcome = Ok(());
        for (first, worker) in self.workers.iter().enumerate() {
            let job = Job { copy, base, size: size as u64, first, lanes, chunk: self.chunk, direction };
            match worker.send(job) {
                Ok(()) => started += 1,
                Err(_) => outcome = Err(LaneError::Lost(format!("lane {first}'s thread is gone"))),
            }
        }
        for _ in 0..started {
            let result = self.done.recv().unwrap_or_else(|_| Err(LaneError::Lost("lane threads are gone".into())));
            // A lost lane outranks a CUDA error: the session is over.
            match (&outcome, result) {
                (_, Err(e @ LaneError::Lost(_))) | (Ok(()), Err(e)) => outcome = Err(e),
                _ => {}
            }
        }
        outcome
    }
}

/// Connects one lane and joins it to the session.
fn join(offer: &LaneOffer, index: u32, address: &Address, token: Option<&Token>) -> Result<Lane, String> {
    let mut carrier = gpuplex_transport::connect(address, token).map_err(|e| e.to_string())?;
    let payload = codec::encode(&LaneJoin { key: offer.key, index });
    let request = Header::request(Opcode::JoinLane, 1, 0, payload.len());
    let mut reply = Vec::new();
    let header = carrier.send(&request, &payload).and_then(|()| carrier.recv(&mut reply)).map_err(|e| e.to_string())?;
    if header.status.get() != 0 {
        let detail = codec::decode::<ErrorDetail>(&reply).map(|d| d.detail).unwrap_or_default();
        return Err(format!("refused ({}): {detail}", header.status.get()));
    }
    carrier.into_lane().map_err(|e| e.to_string())
}

fn work(lane: Lane, pipe: Option<Pipe>, jobs: Receiver<Job>, done: Sender<Result<(), LaneError>>) {
    // splice has no MSG_NOSIGNAL: a peer that went away must be an error
    // here, not a SIGPIPE that kills the process.
    // SAFETY: blocks one signal for this thread only.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    for job in jobs {
        let result = match job.direction {
            Direction::Send => send(&lane, &job, pipe.as_ref()),
            Direction::Receive => receive(&lane, &job),
        };
        let lost = matches!(result, Err(LaneError::Lost(_)));
        if done.send(result).is_err() || lost {
            lane.shutdown();
            return;
        }
    }
}

/// This lane's chunks of a job: `(offset, length)`.
fn my_chunks(job: &Job) -> impl Iterator<Item = (u64, u64)> {
    lane::chunks(job.size, job.chunk).skip(job.first).step_by(job.lanes).map(|(_, offset, len)| (offset, len))
}

fn lost(e: TransportError) -> LaneError {
    LaneError::Lost(e.to_string())
}

fn send(lane: &Lane, job: &Job, pipe: Option<&Pipe>) -> Result<(), LaneError> {
    for (offset, len) in my_chunks(job) {
        // SAFETY: the caller of `Lanes::run` keeps the buffer alive and
        // unchanged until every lane has reported this job done.
        let data = unsafe { std::slice::from_raw_parts((job.base + offset as usize) as *const u8, len as usize) };
        let header = ChunkHeader::new(job.copy, offset, len);
        match pipe {
            Some(pipe) => lane.send_chunk_spliced(&header, data, pipe),
            None => lane.send_chunk(&header, data),
        }
        .map_err(lost)?;
    }
    Ok(())
}

fn receive(lane: &Lane, job: &Job) -> Result<(), LaneError> {
    let mut failed = None;
    for (offset, len) in my_chunks(job) {
        let header = lane.recv_header().map_err(lost)?;
        if !header.is(job.copy, offset, len) {
            return Err(LaneError::Lost(format!("got {header:?} where chunk {offset} of copy {} was due", job.copy)));
        }
        match header.status.get() {
            0 => {
                // SAFETY: as in `send`; each lane writes only its own chunks.
                let dst =
                    unsafe { std::slice::from_raw_parts_mut((job.base + offset as usize) as *mut u8, len as usize) };
                lane.recv_exact(dst).map_err(lost)?;
            }
            status => failed = failed.or(Some(CuError(status))),
        }
    }
    failed.map_or(Ok(()), |e| Err(LaneError::Failed(e)))
}
