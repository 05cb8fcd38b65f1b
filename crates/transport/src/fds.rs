//! Passing descriptors over a Unix socket: one message of bytes with
//! descriptors attached (`SCM_RIGHTS`). The shared-memory carrier hands a
//! guest its regions this way, and the server hands a worker its guest.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use crate::TransportError;

/// One message as received.
pub struct Received {
    /// Bytes of the message; 0 with no descriptors: the peer closed.
    pub len: usize,
    pub fds: Vec<OwnedFd>,
    /// The message or its descriptors did not fit what the receiver offered.
    pub truncated: bool,
}

/// Room in a control buffer for `n` descriptors.
fn control_space(n: usize) -> usize {
    // SAFETY: CMSG_SPACE is a pure size computation.
    unsafe { libc::CMSG_SPACE((n * std::mem::size_of::<RawFd>()) as u32) as usize }
}

/// Sends `bytes` with `fds` attached, as one message. On a stream socket,
/// where a send may be cut short, send one byte (none carries no
/// descriptors); a `SOCK_SEQPACKET` message goes whole.
pub fn send(socket: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    debug_assert!(!bytes.is_empty());
    let mut iov = libc::iovec { iov_base: bytes.as_ptr().cast_mut().cast(), iov_len: bytes.len() };
    let space = if fds.is_empty() { 0 } else { control_space(fds.len()) };
    let mut control = vec![0u8; space];
    // SAFETY: a zeroed msghdr is an empty message; we point it at live buffers.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: `control` has room for one header with `fds.len()` descriptors.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN((fds.len() * std::mem::size_of::<RawFd>()) as u32) as _;
            let data = libc::CMSG_DATA(c).cast::<RawFd>();
            for (i, fd) in fds.iter().enumerate() {
                std::ptr::write_unaligned(data.add(i), fd.as_raw_fd());
            }
        }
    }
    loop {
        // SAFETY: `msg` points at live buffers for the call; sendmsg only
        // reads the data `iov` points at.
        let n = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives one message into `buf` with up to `max_fds` descriptors,
/// which arrive close-on-exec.
pub fn recv(socket: BorrowedFd<'_>, buf: &mut [u8], max_fds: usize) -> io::Result<Received> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let space = control_space(max_fds);
    let mut control = vec![0u8; space];
    // SAFETY: a zeroed msghdr is an empty message; we point it at live buffers.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    let len = loop {
        // SAFETY: `msg` points at live buffers for the call.
        let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `control` up to msg_controllen; each
    // SCM_RIGHTS header holds descriptors now ours.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    let truncated = msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0;
    Ok(Received { len, fds, truncated })
}

/// Sends one descriptor over a Unix socket (one byte of data with it).
pub(crate) fn send_fd(socket: BorrowedFd<'_>, fd: BorrowedFd<'_>) -> Result<(), TransportError> {
    Ok(send(socket, &[0], &[fd])?)
}

/// Receives one descriptor sent with [`send_fd`].
pub(crate) fn recv_fd(socket: BorrowedFd<'_>) -> Result<OwnedFd, TransportError> {
    let received = recv(socket, &mut [0u8; 1], 1)?;
    if received.len == 0 && received.fds.is_empty() {
        return Err(TransportError::Closed);
    }
    received.fds.into_iter().next().ok_or_else(|| TransportError::Shared("expected a descriptor on the socket".into()))
}
