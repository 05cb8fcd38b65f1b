//! A lane: a carrier's connection given over to bulk bytes.
//!
//! Once a lane connection has joined its session (with an ordinary frame),
//! it carries chunks ([`gpuplex_protocol::lane`]) read straight into and
//! written straight from their final buffers: no frame is built and no
//! payload is copied in user space. Any stream socket works, TCP or Unix.
//! A lane may be used from two threads at once, one reading and one
//! writing ([`Lane::try_clone`]).

use std::io::ErrorKind;
use std::os::fd::{AsRawFd, OwnedFd};

use gpuplex_protocol::lane::{ChunkHeader, CHUNK_HEADER_SIZE};
use gpuplex_protocol::Header;
use zerocopy::IntoBytes;

use crate::{stream, TransportError};

pub struct Lane {
    socket: OwnedFd,
}

impl Lane {
    pub(crate) fn new(socket: OwnedFd) -> Lane {
        Lane { socket }
    }

    /// Another handle on the same connection.
    pub fn try_clone(&self) -> std::io::Result<Lane> {
        Ok(Lane { socket: self.socket.try_clone()? })
    }

    /// Ends the connection both ways, waking whoever blocks on it.
    pub fn shutdown(&self) {
        // SAFETY: shutdown on a descriptor we own; failure (already closed) is harmless.
        unsafe { libc::shutdown(self.socket.as_raw_fd(), libc::SHUT_RDWR) };
    }

    /// Sends an ordinary frame (the answer to `JoinLane`).
    pub fn send_frame(&self, header: &Header, payload: &[u8]) -> Result<(), TransportError> {
        stream::send(&self.socket, header, payload)
    }

    /// Sends one chunk: its header, then `data` (empty for a failed chunk).
    pub fn send_chunk(&self, header: &ChunkHeader, data: &[u8]) -> Result<(), TransportError> {
        debug_assert_eq!(header.payload_len(), data.len() as u64);
        stream::send_parts(&self.socket, &[header.as_bytes(), data]).map_err(stream::io_error)
    }

    /// The next chunk's header. `Closed` if the peer closed between chunks;
    /// a bad magic is an error.
    pub fn recv_header(&self) -> Result<ChunkHeader, TransportError> {
        let mut raw = [0u8; CHUNK_HEADER_SIZE];
        stream::read_exact(&mut Reader(self), &mut raw, true)?;
        ChunkHeader::parse(&raw).ok_or(TransportError::Chunk)
    }

    /// Exactly `buf.len()` bytes: the data of the chunk just announced.
    pub fn recv_exact(&self, buf: &mut [u8]) -> Result<(), TransportError> {
        stream::read_exact(&mut Reader(self), buf, false)
    }
}

struct Reader<'a>(&'a Lane);

impl std::io::Read for Reader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // WAITALL: the kernel fills the whole chunk before returning, instead
        // of one system call and wake-up for every segment that arrives.
        // SAFETY: `buf` is valid for writes of its length.
        let n = unsafe { libc::recv(self.0.socket.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_WAITALL) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return if e.kind() == ErrorKind::Interrupted { self.read(buf) } else { Err(e) };
        }
        Ok(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unix::UnixCarrier;
    use crate::Carrier;

    fn pair() -> (Lane, Lane) {
        let (a, b) = UnixCarrier::pair().unwrap();
        (Box::new(a).into_lane().unwrap(), Box::new(b).into_lane().unwrap())
    }

    #[test]
    fn chunks_cross_whole_and_failed_ones_carry_no_bytes() {
        let (a, b) = pair();
        let data: Vec<u8> = (0..(3 << 20)).map(|i| (i % 251) as u8).collect();
        let sent = data.clone();
        let writer = std::thread::spawn(move || {
            a.send_chunk(&ChunkHeader::new(1, 0, sent.len() as u64), &sent).unwrap();
            a.send_chunk(&ChunkHeader::new(1, 9, 5).failed(700), &[]).unwrap();
        });
        let h = b.recv_header().unwrap();
        assert!(h.is(1, 0, data.len() as u64));
        let mut got = vec![0u8; h.payload_len() as usize];
        b.recv_exact(&mut got).unwrap();
        assert_eq!(got, data);
        let h = b.recv_header().unwrap();
        assert_eq!((h.status.get(), h.payload_len()), (700, 0));
        writer.join().unwrap();
        assert!(matches!(b.recv_header(), Err(TransportError::Closed)));
    }

    #[test]
    fn garbage_is_refused_and_shutdown_wakes_a_reader() {
        let (a, b) = pair();
        stream::send_parts(&a.socket, &[&[0xa5; CHUNK_HEADER_SIZE]]).unwrap();
        assert!(matches!(b.recv_header(), Err(TransportError::Chunk)));
        let reader = std::thread::spawn(move || b.recv_header());
        std::thread::sleep(std::time::Duration::from_millis(50));
        let other = a.try_clone().unwrap();
        drop(a);
        other.shutdown();
        assert!(reader.join().unwrap().is_err());
    }
}
