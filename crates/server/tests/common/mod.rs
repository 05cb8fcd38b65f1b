//! What the session tests share: a server of their own on the emulated
//! backend, a client that speaks the protocol by hand, and the kernels and
//! memory patterns they launch and copy.

// Each test binary takes the part it needs.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuplex_protocol::calls::*;
use gpuplex_protocol::{
    codec, Call, Ctx, CuError, DevPtr, ErrorDetail, Func, Header, Hello, Module, Opcode, ServerSummary, SharedLayout,
    Stream, Welcome,
};
use gpuplex_server::backend::emulated::Emulated;
use gpuplex_server::config::Config;
use gpuplex_server::{Placement, Supervisor};
use gpuplex_transport::shm::{Layout, Region, Side};
use gpuplex_transport::{Address, Carrier, Token};

/// A server on its own socket, for the life of one test: the socket's
/// directory goes when this is dropped (the server thread stays, unreachable).
pub struct TestServer {
    pub address: Address,
    pub dir: PathBuf,
}

impl std::ops::Deref for TestServer {
    type Target = Address;
    fn deref(&self) -> &Address {
        &self.address
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn start_server(name: &str) -> TestServer {
    let dir = std::env::temp_dir().join(format!("gpuplex-sessions-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let address = Address::Unix(dir.join("s.sock"));
    let listener = gpuplex_transport::listen(&address, None).unwrap();
    let server = in_process(None);
    std::thread::spawn(move || server.serve(listener.as_ref()));
    TestServer { address, dir }
}

/// A supervisor whose guests run on its own threads, on one emulated device.
pub fn in_process(token: Option<Token>) -> Arc<Supervisor> {
    Supervisor::start(Placement::InProcess(Arc::new(Emulated::new())), Config::none(), token).unwrap()
}

pub fn token(s: &str) -> Token {
    Token::new(s.as_bytes()).unwrap()
}

/// A server on a free loopback port, admitting peers by `token`.
pub fn start_tcp_server(token: Token) -> Address {
    let server = in_process(Some(token));
    let listener = gpuplex_transport::listen_with_keys(&"tcp:127.0.0.1:0".parse().unwrap(), server.keys()).unwrap();
    let address = listener.address();
    std::thread::spawn(move || server.serve(listener.as_ref()));
    address
}

/// The smallest client: handshake, then typed calls with a context.
pub struct Client {
    pub carrier: Box<dyn Carrier>,
    pub next: u64,
    pub ctx: Ctx,
    pub thread: u64,
    /// What `MappedRuns` frames before replies brought.
    pub mapped: Vec<gpuplex_protocol::MappedRun>,
    /// What `CopiedToHost` frames before replies brought.
    pub copied: Vec<gpuplex_protocol::CopiedToHost>,
}

impl Client {
    pub fn connect(address: &Address) -> Client {
        Client::connect_with(address, None)
    }

    pub fn connect_with(address: &Address, token: Option<&Token>) -> Client {
        Client::connect_as(address, token, gpuplex_protocol::VERSION)
    }

    /// A client speaking protocol `version`.
    pub fn connect_as(address: &Address, token: Option<&Token>, version: u16) -> Client {
        let mut carrier = gpuplex_transport::connect(address, token).unwrap();
        let hello = codec::encode(&Hello { pid: 1, program: "test".into() });
        let mut header = Header::request(Opcode::Hello, 1, 0, hello.len());
        header.version = version.into();
        carrier.send(&header, &hello).unwrap();
        let mut buf = Vec::new();
        carrier.recv(&mut buf).unwrap();
        let welcome: Welcome = codec::decode(&buf).unwrap();
        assert_eq!(welcome.backend, "emulated");
        let mut c = Client { carrier, next: 2, ctx: Ctx(0), thread: 1, mapped: Vec::new(), copied: Vec::new() };
        c.ctx = c.call(cuDevicePrimaryCtxRetain::Request { dev: 0 }).unwrap().pctx;
        c
    }

    pub fn call<C: Call>(&mut self, req: C) -> Result<C::Reply, CuError> {
        self.call_detail(req).map_err(|(e, _)| e)
    }

    /// As [`Client::call`], with the error's detail.
    pub fn call_detail<C: Call>(&mut self, req: C) -> Result<C::Reply, (CuError, String)> {
        self.send(req, false);
        self.reply_detail::<C>()
    }

    /// The reply to the call sent last.
    pub fn reply<C: Call>(&mut self) -> Result<C::Reply, CuError> {
        self.reply_detail::<C>().map_err(|(e, _)| e)
    }

    pub fn reply_detail<C: Call>(&mut self) -> Result<C::Reply, (CuError, String)> {
        let mut buf = Vec::new();
        // A call that runs long is preceded by heartbeats; one that reached
        // the device, by what it wrote to mapped host blocks.
        let h = loop {
            let h = self.carrier.recv(&mut buf).unwrap();
            match h.opcode.get() {
                op if op == Opcode::Heartbeat as u16 => {}
                op if op == Opcode::MappedRuns as u16 => {
                    self.mapped.extend(codec::decode::<gpuplex_protocol::MappedRuns>(&buf).unwrap().runs.0)
                }
                op if op == Opcode::CopiedToHost as u16 => self.copied.push(codec::decode(&buf).unwrap()),
                _ => break h,
            }
        };
        assert_eq!(h.request_id.get(), self.next, "a reply to another request");
        if let Err(e) = CuError::check(h.status.get()) {
            return Err((e, codec::decode::<ErrorDetail>(&buf).unwrap().detail));
        }
        Ok(codec::decode(&buf).unwrap())
    }

    /// The next frame that is not a heartbeat, and how many came first.
    pub fn heartbeats_then_reply(&mut self) -> (Header, u32) {
        let mut beats = 0;
        loop {
            let h = self.carrier.recv(&mut Vec::new()).unwrap();
            if h.opcode.get() != Opcode::Heartbeat as u16 {
                return (h, beats);
            }
            beats += 1;
        }
    }

    /// Sends a call flagged posted: no reply comes.
    pub fn post<C: Call>(&mut self, req: C) {
        self.send(req, true);
    }

    pub fn send<C: Call>(&mut self, req: C, posted: bool) {
        let payload = codec::encode(&req);
        self.next += 1;
        let mut header = Header::request(C::OPCODE, self.next, self.ctx.0, payload.len()).from_thread(self.thread);
        if posted {
            header = header.posted();
        }
        self.carrier.send(&header, &payload).unwrap();
    }

    /// A request about the session itself (no payload, not a CUDA call),
    /// which must succeed: its answer.
    pub fn session_request<T: codec::Wire>(&mut self, opcode: Opcode) -> T {
        self.next += 1;
        self.carrier.send(&Header::request(opcode, self.next, self.ctx.0, 0), &[]).unwrap();
        let mut buf = Vec::new();
        let h = self.carrier.recv(&mut buf).unwrap();
        assert_eq!((h.request_id.get(), h.status.get()), (self.next, 0));
        codec::decode(&buf).unwrap()
    }

    /// Asks for shared memory and moves this client's frames onto the rings.
    pub fn share_memory(&mut self) -> (Arc<Region>, SharedLayout) {
        let layout: SharedLayout = self.session_request(Opcode::SharedMemory);
        let region = Arc::new(Region::open(self.carrier.recv_fd().unwrap()).unwrap());
        let rings = gpuplex_transport::rings(region.clone(), ring_layout(&layout), Side::Client).unwrap();
        self.carrier.attach_rings(rings).unwrap();
        (region, layout)
    }

    pub fn write(&mut self, dst: DevPtr, data: &[u8]) {
        self.call(MemcpyHtoD::Request { dst, data: data.to_vec(), stream: Stream::NULL, sync: true }).unwrap();
    }

    pub fn read(&mut self, src: DevPtr, size: u64) -> Vec<u8> {
        self.call(MemcpyDtoH::Request { src, size, stream: Stream::NULL, sync: true }).unwrap().data
    }

    pub fn alloc(&mut self, n: u64) -> DevPtr {
        self.call(cuMemAlloc_v2::Request { bytesize: n }).unwrap().dptr
    }

    pub fn free_memory(&mut self) -> u64 {
        self.call(cuMemGetInfo_v2::Request {}).unwrap().free
    }

    /// A module loaded from `image`.
    pub fn module(&mut self, image: Vec<u8>) -> Module {
        self.call(ModuleLoad::Request { digest: gpuplex_protocol::image_digest(&image), image }).unwrap().module
    }

    /// Function `name` of a module loaded from `ptx`.
    pub fn function(&mut self, ptx: &str, name: &str) -> Func {
        let hmod = self.module(ptx.as_bytes().to_vec());
        self.call(cuModuleGetFunction::Request { hmod, name: name.into() }).unwrap().hfunc
    }
}

pub fn summary(address: &Address) -> ServerSummary {
    summary_with(address, None)
}

pub fn summary_with(address: &Address, token: Option<&Token>) -> ServerSummary {
    let mut c = gpuplex_transport::connect(address, token).unwrap();
    c.send(&Header::request(Opcode::ServerInfo, 1, 0, 0), &[]).unwrap();
    let mut buf = Vec::new();
    c.recv(&mut buf).unwrap();
    codec::decode(&buf).unwrap()
}

/// The error a call must have failed with.
pub fn err<T>(r: Result<T, CuError>) -> CuError {
    r.err().expect("the call should have failed")
}

pub fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(1), "{what} did not happen within a second");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Two kernels for launch tests: `spin(u32 *out, u32 seed, u32 iters)` has
/// a reference on the emulated device, `nowhere()` does not, so launching
/// it fails in the backend (as a driver error would), not in the session's
/// checks.
pub const LAUNCH_PTX: &str = ".version 8.0
.target sm_75
.address_size 64
.visible .entry spin(.param .u64 out, .param .u32 seed, .param .u32 iters)
{
ret;
}
.visible .entry nowhere()
{
ret;
}
.visible .entry sleep_ms(.param .u32 ms)
{
ret;
}
";

/// A one-dimensional launch on the null stream.
pub fn launch(func: Func, threads: u32, params: Vec<u8>) -> Launch::Request {
    let block = threads.min(1024);
    Launch::Request {
        func,
        gridX: threads / block,
        gridY: 1,
        gridZ: 1,
        blockX: block,
        blockY: 1,
        blockZ: 1,
        sharedMem: 0,
        stream: Stream::NULL,
        params,
        attrs: Vec::new(),
    }
}

pub fn spin_params(out: DevPtr, seed: u32) -> Vec<u8> {
    [&out.0.to_le_bytes()[..], &seed.to_le_bytes(), &1u32.to_le_bytes()].concat()
}

pub fn ring_layout(l: &SharedLayout) -> Layout {
    Layout { ring_bytes: l.ring_bytes as usize, staging_bytes: (l.slot_bytes * l.slots as u64) as usize }
}

pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Writes `data` into the client's mapping of `region` at `at`.
pub fn poke(region: &Region, at: usize, data: &[u8]) {
    assert!(at + data.len() <= region.len());
    // SAFETY: inside the mapping (checked above); the server reads it only
    // for a copy asked for after this returns.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), region.as_ptr().add(at), data.len()) }
}

pub fn peek(region: &Region, at: usize, n: usize) -> Vec<u8> {
    assert!(at + n <= region.len());
    // SAFETY: inside the mapping; the copy that wrote it has completed.
    unsafe { std::slice::from_raw_parts(region.as_ptr().add(at), n) }.to_vec()
}

/// Runs `test` on a thread of its own and fails if it takes longer than
/// `limit`: a call the server never answers would hang, not fail.
pub fn within<T: Send + 'static>(limit: Duration, test: impl FnOnce() -> T + Send + 'static) -> T {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(test()).unwrap());
    match finished.recv_timeout(limit) {
        Ok(value) => value,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("the test did not finish within {limit:?}"),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("the test failed"),
    }
}

/// As [`within`], for copies a session waiting for a chunk that cannot
/// come would hang.
pub fn within_30_s(test: impl FnOnce() + Send + 'static) {
    within(Duration::from_secs(30), test)
}
