//! The TCP opening: each side proves it holds the shared [`Token`] without
//! sending it.
//!
//! ```text
//! client                                          server (session thread)
//!   | <------------ MAGIC (8) | Ns (32) ------------ |  Ns: fresh random nonce
//!   | ---------------- Nc (32) | C (32) -----------> |  C = HMAC-SHA256(token, "gpuplex client" | Ns | Nc)
//!   |                                                |  C checked in constant time; wrong: hang up
//!   | <------------------- S (32) ------------------ |  S = HMAC-SHA256(token, "gpuplex server" | Nc | Ns)
//!   S checked; wrong: hang up                        |
//!   | ================ frames (Hello, ...) =========> |
//! ```
//!
//! Why this shape: a nonce from each side makes every proof good for one
//! connection only, so a recorded exchange cannot be replayed; the two labels
//! keep one side's proof from being reflected back as the other's; the
//! client checks the server's proof before its first frame, so an impostor
//! learns nothing of the program's calls. Each side reads a fixed number of
//! bytes under one deadline for the whole exchange: nothing is allocated
//! from peer input, and a silent or dribbling peer holds its thread for the
//! timeout at most. The frames that follow are neither encrypted nor
//! integrity-protected (docs/ARCHITECTURE.md, threat model).
//!
//! Versioning: the last byte of `MAGIC` is the version of this exchange; a
//! later one changes it, and a peer that does not know it hangs up.

use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use hmac::{KeyInit, Mac};

use crate::{stream, Token};

/// Opens every TCP connection, from the server.
pub(crate) const MAGIC: [u8; 8] = *b"GPXAUTH\x01";
pub(crate) const NONCE_LEN: usize = 32;
pub(crate) const PROOF_LEN: usize = 32;
pub(crate) const CLIENT_LABEL: &[u8] = b"gpuplex client";
pub(crate) const SERVER_LABEL: &[u8] = b"gpuplex server";

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// Why an opening failed.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("the peer does not speak gpuplex's TCP opening")]
    NotGpuplex,
    #[error("the server refused our token")]
    Refused,
    #[error("the client's proof does not match our token")]
    WrongToken,
    #[error("the server did not prove it holds our token: an impostor, or a server with another token")]
    ServerUnproven,
    #[error("no complete answer within {0:?}")]
    Timeout(Duration),
    #[error("the peer hung up")]
    Closed,
    #[error("no frame moves before authentication")]
    Pending,
    #[error("{0}")]
    Io(std::io::Error),
}

/// The client's side, run by `connect` before it returns.
pub(crate) fn client(socket: &mut TcpStream, token: &Token, timeout: Duration) -> Result<(), AuthError> {
    within(socket, timeout, |socket, deadline| {
        let mut greeting = [0u8; MAGIC.len() + NONCE_LEN];
        deadline.read(socket, &mut greeting)?;
        let (magic, server_nonce) = greeting.split_at(MAGIC.len());
        if magic != MAGIC {
            return Err(AuthError::NotGpuplex);
        }
        let client_nonce = nonce()?;
        let proof = prove(token, CLIENT_LABEL, server_nonce, &client_nonce).finalize().into_bytes();
        deadline.write(socket, &[&client_nonce, &proof])?;
        let mut answer = [0u8; PROOF_LEN];
        match deadline.read(socket, &mut answer) {
            // It checked our proof and hung up.
            Err(AuthError::Closed) => return Err(AuthError::Refused),
            r => r?,
        }
        prove(token, SERVER_LABEL, &client_nonce, server_nonce)
            .verify_slice(&answer)
            .map_err(|_| AuthError::ServerUnproven)
    })
}

/// The server's side, run on the connection's own thread: the peer must
/// prove one of `tokens`; returns which. Every token is tried, so how long
/// the check takes does not tell which one nearly matched.
pub(crate) fn server(socket: &mut TcpStream, tokens: &[Token], timeout: Duration) -> Result<usize, AuthError> {
    within(socket, timeout, |socket, deadline| {
        let server_nonce = nonce()?;
        deadline.write(socket, &[&MAGIC, &server_nonce])?;
        let mut reply = [0u8; NONCE_LEN + PROOF_LEN];
        deadline.read(socket, &mut reply)?;
        let (client_nonce, proof) = reply.split_at(NONCE_LEN);
        let matched = tokens.iter().enumerate().fold(None, |found, (i, token)| {
            let ok = prove(token, CLIENT_LABEL, &server_nonce, client_nonce).verify_slice(proof).is_ok();
            found.or(ok.then_some(i))
        });
        let index = matched.ok_or(AuthError::WrongToken)?;
        let answer = prove(&tokens[index], SERVER_LABEL, client_nonce, &server_nonce).finalize().into_bytes();
        deadline.write(socket, &[&answer])?;
        Ok(index)
    })
}

/// HMAC-SHA256(token, label | first | second), before finalizing.
pub(crate) fn prove(token: &Token, label: &[u8], first: &[u8], second: &[u8]) -> HmacSha256 {
    // HMAC hashes long keys and pads short ones: every length is valid.
    let mut mac = HmacSha256::new_from_slice(token.bytes()).expect("HMAC accepts keys of any length");
    mac.update(label);
    mac.update(first);
    mac.update(second);
    mac
}

/// Runs an exchange under one deadline, then clears the socket's timeouts
/// for the frames that follow.
fn within<T>(
    socket: &mut TcpStream,
    timeout: Duration,
    exchange: impl FnOnce(&mut TcpStream, &Deadline) -> Result<T, AuthError>,
) -> Result<T, AuthError> {
    let result = exchange(socket, &Deadline { at: Instant::now() + timeout, timeout });
    let cleared = socket.set_read_timeout(None).and_then(|()| socket.set_write_timeout(None));
    result.and_then(|value| cleared.map(|()| value).map_err(AuthError::Io))
}

struct Deadline {
    at: Instant,
    timeout: Duration,
}

impl Deadline {
    /// What is left, as a socket timeout (which must not be zero).
    fn left(&self) -> Result<Duration, AuthError> {
        match self.at.saturating_duration_since(Instant::now()) {
            d if d.is_zero() => Err(AuthError::Timeout(self.timeout)),
            d => Ok(d),
        }
    }

    fn read(&self, socket: &mut TcpStream, buf: &mut [u8]) -> Result<(), AuthError> {
        let mut done = 0;
        while done < buf.len() {
            socket.set_read_timeout(Some(self.left()?)).map_err(AuthError::Io)?;
            match socket.read(&mut buf[done..]) {
                Ok(0) => return Err(AuthError::Closed),
                Ok(n) => done += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.error(e)),
            }
        }
        Ok(())
    }

    fn write(&self, socket: &TcpStream, parts: &[&[u8]]) -> Result<(), AuthError> {
        socket.set_write_timeout(Some(self.left()?)).map_err(AuthError::Io)?;
        stream::send_parts(socket, parts).map_err(|e| self.error(e))
    }

    fn error(&self, e: std::io::Error) -> AuthError {
        match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => AuthError::Timeout(self.timeout),
            _ if stream::is_disconnect(&e) => AuthError::Closed,
            _ => AuthError::Io(e),
        }
    }
}

/// A fresh nonce from the kernel's random source.
fn nonce() -> Result<[u8; NONCE_LEN], AuthError> {
    let mut n = [0u8; NONCE_LEN];
    let mut done = 0;
    while done < n.len() {
        let rest = &mut n[done..];
        // SAFETY: the pointer and length describe `rest`, writable for the call.
        let got = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if got < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != ErrorKind::Interrupted {
                return Err(AuthError::Io(e));
            }
        } else {
            done += got as usize;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_differ() {
        assert_ne!(nonce().unwrap(), nonce().unwrap());
    }

    #[test]
    fn proofs_depend_on_token_label_and_order() {
        let (a, b) = (Token::new(b"0123456789abcdef").unwrap(), Token::new(b"0123456789abcdeF").unwrap());
        let (x, y) = ([1u8; 32], [2u8; 32]);
        let p = |t: &Token, label, f: &[u8], s: &[u8]| prove(t, label, f, s).finalize().into_bytes();
        let base = p(&a, CLIENT_LABEL, &x, &y);
        assert_eq!(base, p(&a, CLIENT_LABEL, &x, &y));
        assert_ne!(base, p(&b, CLIENT_LABEL, &x, &y));
        assert_ne!(base, p(&a, SERVER_LABEL, &x, &y));
        assert_ne!(base, p(&a, CLIENT_LABEL, &y, &x));
    }

    /// RFC 4231 test case 2, so the construction is HMAC-SHA256 itself.
    #[test]
    fn hmac_sha256_matches_rfc_4231() {
        let mut mac = HmacSha256::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        let want = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
        let got: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(got, want);
    }
}
