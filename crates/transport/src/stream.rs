//! Frames over any byte stream: shared by the stream-socket carriers.

use std::io::{ErrorKind, IoSlice, Read, Write};

use gpuplex_protocol::{Header, HEADER_SIZE};
use zerocopy::IntoBytes;

use crate::TransportError;

pub(crate) fn send<W: Write>(w: &mut W, header: &Header, payload: &[u8]) -> Result<(), TransportError> {
    debug_assert_eq!(header.payload_len(), payload.len());
    let mut bufs = [IoSlice::new(header.as_bytes()), IoSlice::new(payload)];
    let mut bufs = &mut bufs[..];
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => return Err(TransportError::Closed),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if is_disconnect(&e) => return Err(TransportError::Closed),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

pub(crate) fn recv<R: Read>(r: &mut R, payload: &mut Vec<u8>) -> Result<Header, TransportError> {
    let mut raw = [0u8; HEADER_SIZE];
    read_exact(r, &mut raw, true)?;
    let header = Header::parse(&raw)?;
    payload.clear();
    payload.resize(header.payload_len(), 0);
    read_exact(r, payload, false)?;
    Ok(header)
}

/// `read_exact` that reports a clean close before the first byte as `Closed`.
fn read_exact<R: Read>(r: &mut R, buf: &mut [u8], at_frame_start: bool) -> Result<(), TransportError> {
    let mut done = 0;
    while done < buf.len() {
        match r.read(&mut buf[done..]) {
            Ok(0) if done == 0 && at_frame_start => return Err(TransportError::Closed),
            Ok(0) => return Err(std::io::Error::from(ErrorKind::UnexpectedEof).into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if is_disconnect(&e) => return Err(TransportError::Closed),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn is_disconnect(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted)
}
