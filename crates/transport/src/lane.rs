//! A lane: a carrier's connection given over to bulk bytes.
//!
//! Once a lane connection has joined its session (with an ordinary frame),
//! it carries chunks ([`gpuplex_protocol::lane`]) read straight into and
//! written straight from their final buffers: no frame is built and no
//! payload is copied in user space. Any stream socket works, TCP or Unix.
//! A lane may be used from two threads at once, one reading and one
//! writing ([`Lane::try_clone`]).

use std::io::ErrorKind;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

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

    #[cfg(test)]
    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        self.socket.as_raw_fd()
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

    /// Sends one chunk without copying its bytes: the kernel takes
    /// references to the pages of `data` through `pipe` (`vmsplice`, then
    /// `splice` into the socket), and the receiver copies straight out of
    /// them. The caller must leave `data` unchanged until the receiver has
    /// read it, not merely until this returns. See
    /// [`block_sigpipe_on_this_thread`].
    pub fn send_chunk_spliced(&self, header: &ChunkHeader, data: &[u8], pipe: &Pipe) -> Result<(), TransportError> {
        debug_assert_eq!(header.payload_len(), data.len() as u64);
        let more = if data.is_empty() { 0 } else { libc::MSG_MORE };
        stream::send_parts_with(&self.socket, &[header.as_bytes()], more).map_err(stream::io_error)?;
        let spliced = pipe.splice_into(&self.socket, data).map_err(stream::io_error)?;
        if spliced == data.len() {
            return Ok(());
        }
        // Pages the kernel would not lend (an I/O mapping, say) are copied.
        stream::send_parts(&self.socket, &[&data[spliced..]]).map_err(stream::io_error)
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

/// Makes a peer that went away an error for this thread's `splice`s, not a
/// SIGPIPE that kills the process (`splice` has no `MSG_NOSIGNAL`, and a
/// host program may not ignore the signal). Call it on every thread that
/// sends spliced chunks.
pub fn block_sigpipe_on_this_thread() {
    // SAFETY: changes this thread's signal mask only.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// A pipe for [`Lane::send_chunk_spliced`], one per sending thread.
pub struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    /// A pipe holding up to `bytes` (or the system's most, if less).
    pub fn new(bytes: usize) -> std::io::Result<Pipe> {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: pipe2 just returned these descriptors, owned by no one else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // A larger pipe means fewer calls per chunk; the default still works.
        // SAFETY: fcntl on a descriptor we own.
        unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, bytes.min(i32::MAX as usize) as libc::c_int) };
        let pipe = Pipe { read, write };
        pipe.probe()?;
        Ok(pipe)
    }

    /// One byte in by `vmsplice` and out again: sandboxes may refuse it.
    fn probe(&self) -> std::io::Result<()> {
        let byte = 0x5au8;
        let iov = libc::iovec { iov_base: &byte as *const u8 as *mut libc::c_void, iov_len: 1 };
        let mut back = 0u8;
        // SAFETY: one live byte in, one live byte out, on descriptors we own.
        let (n, m) = unsafe {
            let n = libc::vmsplice(self.write.as_raw_fd(), &iov, 1, libc::SPLICE_F_NONBLOCK);
            (n, if n == 1 { libc::read(self.read.as_raw_fd(), (&mut back as *mut u8).cast(), 1) } else { 0 })
        };
        match (n, m, back) {
            (1, 1, 0x5a) => Ok(()),
            (n, _, _) if n < 0 => Err(std::io::Error::last_os_error()),
            _ => Err(std::io::Error::other("vmsplice did not pass a byte through")),
        }
    }

    /// Moves `data`'s pages, by reference, through the pipe into `socket`;
    /// returns how many bytes went, all of them unless the kernel would not
    /// lend some page.
    fn splice_into(&self, socket: &OwnedFd, data: &[u8]) -> std::io::Result<usize> {
        let mut done = 0;
        while done < data.len() {
            let rest = &data[done..];
            let iov = libc::iovec { iov_base: rest.as_ptr() as *mut libc::c_void, iov_len: rest.len() };
            // SAFETY: the iovec covers live memory, which the kernel only reads.
            let n = unsafe { libc::vmsplice(self.write.as_raw_fd(), &iov, 1, 0) };
            if n <= 0 {
                let e = std::io::Error::last_os_error();
                if n < 0 && e.kind() == ErrorKind::Interrupted {
                    continue;
                }
                return Ok(done);
            }
            done += n as usize;
            let more = if done < data.len() { libc::SPLICE_F_MORE } else { 0 };
            let mut left = n as usize;
            while left > 0 {
                // SAFETY: moves bytes between two descriptors we own.
                let m = unsafe {
                    libc::splice(
                        self.read.as_raw_fd(),
                        std::ptr::null_mut(),
                        socket.as_raw_fd(),
                        std::ptr::null_mut(),
                        left,
                        libc::SPLICE_F_MOVE | more,
                    )
                };
                if m <= 0 {
                    let e = if m == 0 { ErrorKind::WriteZero.into() } else { std::io::Error::last_os_error() };
                    if e.kind() == ErrorKind::Interrupted {
                        continue;
                    }
                    return Err(e);
                }
                left -= m as usize;
            }
        }
        Ok(done)
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
    fn spliced_chunks_cross_whole_over_unix_and_tcp() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let tcp_a = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let tcp_b = listener.accept().unwrap().0;
        let tcp = (Lane::new(OwnedFd::from(tcp_a)), Lane::new(OwnedFd::from(tcp_b)));
        for (a, b) in [pair(), tcp] {
            // Larger than the pipe, so a chunk takes several rounds through it.
            let data: Vec<u8> = (0..(3 << 20) + 7).map(|i| (i * 7 + i / 4096) as u8).collect();
            let sent = data.clone();
            let writer = std::thread::spawn(move || {
                let pipe = Pipe::new(256 << 10).unwrap();
                a.send_chunk_spliced(&ChunkHeader::new(4, 0, sent.len() as u64), &sent, &pipe).unwrap();
                a.send_chunk_spliced(&ChunkHeader::new(4, 1, 0).failed(700), &[], &pipe).unwrap();
                sent
            });
            let h = b.recv_header().unwrap();
            assert!(h.is(4, 0, data.len() as u64));
            let mut got = vec![0u8; data.len()];
            b.recv_exact(&mut got).unwrap();
            assert!(got == data, "spliced bytes arrive unchanged");
            assert_eq!(b.recv_header().unwrap().status.get(), 700);
            writer.join().unwrap();
        }
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
