//! The connection to the server, shared by every thread of the process.
//!
//! It is opened by the first `cuInit` (or `cuDriverGetVersion`), after a
//! handshake that brings back the server's driver version and the whole
//! device table, so device queries never travel again. Calls are
//! synchronous request/reply pairs under one lock; each carries the calling
//! thread's current context. A lost server is sticky: every later call fails
//! with `CUDA_ERROR_DEVICE_UNAVAILABLE`, since the server freed everything
//! the process held when the connection dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use gpuplex_protocol::{codec, Call, CuError, ErrorDetail, Header, Hello, Opcode, Welcome};
use gpuplex_transport::{Address, Carrier, Token};

use crate::{context, log};

/// `CUDA_ERROR_DEVICE_UNAVAILABLE`: what a call gets once the server is gone.
pub const SERVER_GONE: CuError = CuError(46);

pub struct Client {
    conn: Mutex<Conn>,
    pub welcome: Welcome,
    /// The process that connected; a forked child must not share the stream.
    pid: u32,
}

struct Conn {
    carrier: Box<dyn Carrier>,
    next_id: u64,
    buf: Vec<u8>,
    broken: bool,
}

static CLIENT: OnceLock<Result<Client, CuError>> = OnceLock::new();
static INITIALIZED: AtomicBool = AtomicBool::new(false);

/// The server address: `GPUPLEX_SERVER`, else the default local socket.
fn address() -> Result<Address, CuError> {
    match std::env::var("GPUPLEX_SERVER") {
        Ok(a) if !a.is_empty() => a.parse().map_err(|e| {
            log::error(&format!("GPUPLEX_SERVER: {e}"));
            CuError::NO_DEVICE
        }),
        _ => Ok(Address::default_local()),
    }
}

/// The connection, opened on first use.
pub fn connection() -> Result<&'static Client, CuError> {
    let client = CLIENT.get_or_init(Client::connect);
    match client {
        Ok(c) if c.pid == std::process::id() => Ok(c),
        Ok(_) => {
            log::error("CUDA used in a forked child of an initialized process; gpuplex does not support that");
            Err(CuError::NOT_INITIALIZED)
        }
        Err(e) => Err(*e),
    }
}

/// `cuInit`: connects if needed and marks the driver initialized.
pub fn init() -> Result<(), CuError> {
    connection()?;
    INITIALIZED.store(true, Ordering::Release);
    Ok(())
}

/// The connection, for calls that need `cuInit` first.
pub fn client() -> Result<&'static Client, CuError> {
    if !INITIALIZED.load(Ordering::Acquire) {
        return Err(CuError::NOT_INITIALIZED);
    }
    connection()
}

/// Sends one call with the calling thread's current context.
pub fn call<C: Call>(req: C) -> Result<C::Reply, CuError> {
    client()?.call(req, context::current())
}

impl Client {
    fn connect() -> Result<Client, CuError> {
        let address = address()?;
        // GPUPLEX_TOKEN_FILE: only a TCP server asks for a token.
        let token = match address {
            Address::Tcp(_) => Token::from_env().map_err(|e| {
                log::error(&e.to_string());
                CuError::NO_DEVICE
            })?,
            _ => None,
        };
        let carrier = gpuplex_transport::connect(&address, token.as_ref()).map_err(|e| {
            log::error(&format!("cannot reach the gpuplex server at {address}: {e}"));
            CuError::NO_DEVICE
        })?;
        let pid = std::process::id();
        let mut conn = Conn { carrier, next_id: 1, buf: Vec::new(), broken: false };
        let program = std::env::args().next().unwrap_or_default();
        let welcome: Welcome =
            conn.exchange(Opcode::Hello, 0, &codec::encode(&Hello { pid, program })).map_err(|e| {
                log::error(&format!("handshake with {address} failed: {e:?}"));
                CuError::NO_DEVICE
            })?;
        log::info(&format!(
            "connected to {address}: session {}, {} backend, {} device(s)",
            welcome.session,
            welcome.backend,
            welcome.devices.0.len()
        ));
        Ok(Client { conn: Mutex::new(conn), welcome, pid })
    }

    pub fn call<C: Call>(&self, req: C, ctx: u64) -> Result<C::Reply, CuError> {
        let payload = codec::encode(&req);
        let mut conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        conn.exchange(C::OPCODE, ctx, &payload)
    }
}

impl Conn {
    fn exchange<T: gpuplex_protocol::Wire>(&mut self, opcode: Opcode, ctx: u64, payload: &[u8]) -> Result<T, CuError> {
        if self.broken {
            return Err(SERVER_GONE);
        }
        let id = self.next_id;
        self.next_id += 1;
        let header = Header::request(opcode, id, ctx, payload.len()).from_thread(context::thread_id());
        let result = self.carrier.send(&header, payload);
        let header = result.and_then(|()| self.carrier.recv(&mut self.buf)).map_err(|e| self.lose(&e.to_string()))?;
        if header.request_id.get() != id || header.opcode.get() != opcode as u16 {
            return Err(self.lose("reply does not match the request"));
        }
        match header.status.get() {
            0 => {
                codec::decode(&self.buf).map_err(|e| self.lose(&format!("undecodable reply to {}: {e}", opcode.name())))
            }
            code => {
                if let Ok(ErrorDetail { detail }) = codec::decode(&self.buf) {
                    if !detail.is_empty() {
                        log::debug(&format!("{} failed: {detail}", opcode.name()));
                    }
                }
                Err(CuError(code))
            }
        }
    }

    fn lose(&mut self, why: &str) -> CuError {
        if !self.broken {
            log::error(&format!("lost the gpuplex server ({why}); CUDA calls will now fail"));
        }
        self.broken = true;
        SERVER_GONE
    }
}
