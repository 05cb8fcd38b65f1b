//! Sessions against a live server on the emulated backend: isolation,
//! cleanup of vanished clients, hostile input on the wire, TCP peers that
//! cannot prove the token, posted calls and their deferred errors, and
//! shared memory (rings, staging slots, pinned host blocks) including a
//! peer that lies on the rings' counters, and bulk lanes, including lanes
//! that join where they may not, carry the wrong chunk or start late.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuplex_protocol::calls::*;
use gpuplex_protocol::lane::{ChunkHeader, Cut};
use gpuplex_protocol::{
    codec, Call, Ctx, CuError, DevPtr, ErrorDetail, Event, Func, Header, Hello, LaneJoin, LaneOffer, Module, Opcode,
    ServerSummary, SessionSummary, SharedLayout, Stream, Welcome,
};
use gpuplex_server::backend::emulated::Emulated;
use gpuplex_server::config::Config;
use gpuplex_server::{Placement, Supervisor};
use gpuplex_transport::shm::{Layout, Region, Side};
use gpuplex_transport::{Address, AuthError, Carrier, Lane, Token, TransportError};
use proptest::prelude::*;

/// A server on its own socket, for the life of one test: the socket's
/// directory goes when this is dropped (the server thread stays, unreachable).
struct TestServer {
    address: Address,
    dir: PathBuf,
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

fn start_server(name: &str) -> TestServer {
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
fn in_process(token: Option<Token>) -> Arc<Supervisor> {
    Supervisor::start(Placement::InProcess(Arc::new(Emulated::new())), Config::none(), token).unwrap()
}

fn token(s: &str) -> Token {
    Token::new(s.as_bytes()).unwrap()
}

/// A server on a free loopback port, admitting peers by `token`.
fn start_tcp_server(token: Token) -> Address {
    let server = in_process(Some(token));
    let listener = gpuplex_transport::listen_with_keys(&"tcp:127.0.0.1:0".parse().unwrap(), server.keys()).unwrap();
    let address = listener.address();
    std::thread::spawn(move || server.serve(listener.as_ref()));
    address
}

/// The smallest client: handshake, then typed calls with a context.
struct Client {
    carrier: Box<dyn Carrier>,
    next: u64,
    ctx: Ctx,
    thread: u64,
}

impl Client {
    fn connect(address: &Address) -> Client {
        Client::connect_with(address, None)
    }

    fn connect_with(address: &Address, token: Option<&Token>) -> Client {
        Client::connect_as(address, token, gpuplex_protocol::VERSION)
    }

    /// A client speaking protocol `version`.
    fn connect_as(address: &Address, token: Option<&Token>, version: u16) -> Client {
        let mut carrier = gpuplex_transport::connect(address, token).unwrap();
        let hello = codec::encode(&Hello { pid: 1, program: "test".into() });
        let mut header = Header::request(Opcode::Hello, 1, 0, hello.len());
        header.version = version.into();
        carrier.send(&header, &hello).unwrap();
        let mut buf = Vec::new();
        carrier.recv(&mut buf).unwrap();
        let welcome: Welcome = codec::decode(&buf).unwrap();
        assert_eq!(welcome.backend, "emulated");
        let mut c = Client { carrier, next: 2, ctx: Ctx(0), thread: 1 };
        c.ctx = c.call(cuDevicePrimaryCtxRetain::Request { dev: 0 }).unwrap().pctx;
        c
    }

    fn call<C: Call>(&mut self, req: C) -> Result<C::Reply, CuError> {
        self.call_detail(req).map_err(|(e, _)| e)
    }

    /// As [`Client::call`], with the error's detail.
    fn call_detail<C: Call>(&mut self, req: C) -> Result<C::Reply, (CuError, String)> {
        self.send(req, false);
        self.reply_detail::<C>()
    }

    /// The reply to the call sent last.
    fn reply<C: Call>(&mut self) -> Result<C::Reply, CuError> {
        self.reply_detail::<C>().map_err(|(e, _)| e)
    }

    fn reply_detail<C: Call>(&mut self) -> Result<C::Reply, (CuError, String)> {
        let mut buf = Vec::new();
        // A call that runs long is preceded by heartbeats.
        let h = loop {
            let h = self.carrier.recv(&mut buf).unwrap();
            if h.opcode.get() != Opcode::Heartbeat as u16 {
                break h;
            }
        };
        assert_eq!(h.request_id.get(), self.next, "a reply to another request");
        if let Err(e) = CuError::check(h.status.get()) {
            return Err((e, codec::decode::<ErrorDetail>(&buf).unwrap().detail));
        }
        Ok(codec::decode(&buf).unwrap())
    }

    /// The next frame that is not a heartbeat, and how many came first.
    fn heartbeats_then_reply(&mut self) -> (Header, u32) {
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
    fn post<C: Call>(&mut self, req: C) {
        self.send(req, true);
    }

    fn send<C: Call>(&mut self, req: C, posted: bool) {
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
    fn session_request<T: codec::Wire>(&mut self, opcode: Opcode) -> T {
        self.next += 1;
        self.carrier.send(&Header::request(opcode, self.next, self.ctx.0, 0), &[]).unwrap();
        let mut buf = Vec::new();
        let h = self.carrier.recv(&mut buf).unwrap();
        assert_eq!((h.request_id.get(), h.status.get()), (self.next, 0));
        codec::decode(&buf).unwrap()
    }

    /// Asks for shared memory and moves this client's frames onto the rings.
    fn share_memory(&mut self) -> (Arc<Region>, SharedLayout) {
        let layout: SharedLayout = self.session_request(Opcode::SharedMemory);
        let region = Arc::new(Region::open(self.carrier.recv_fd().unwrap()).unwrap());
        let rings = gpuplex_transport::rings(region.clone(), ring_layout(&layout), Side::Client).unwrap();
        self.carrier.attach_rings(rings).unwrap();
        (region, layout)
    }

    fn write(&mut self, dst: DevPtr, data: &[u8]) {
        self.call(MemcpyHtoD::Request { dst, data: data.to_vec(), stream: Stream::NULL, sync: true }).unwrap();
    }

    fn read(&mut self, src: DevPtr, size: u64) -> Vec<u8> {
        self.call(MemcpyDtoH::Request { src, size, stream: Stream::NULL, sync: true }).unwrap().data
    }

    fn alloc(&mut self, n: u64) -> DevPtr {
        self.call(cuMemAlloc_v2::Request { bytesize: n }).unwrap().dptr
    }

    fn free_memory(&mut self) -> u64 {
        self.call(cuMemGetInfo_v2::Request {}).unwrap().free
    }

    /// A module loaded from `image`.
    fn module(&mut self, image: Vec<u8>) -> Module {
        self.call(ModuleLoad::Request { digest: gpuplex_protocol::image_digest(&image), image }).unwrap().module
    }

    /// Function `name` of a module loaded from `ptx`.
    fn function(&mut self, ptx: &str, name: &str) -> Func {
        let hmod = self.module(ptx.as_bytes().to_vec());
        self.call(cuModuleGetFunction::Request { hmod, name: name.into() }).unwrap().hfunc
    }
}

fn summary(address: &Address) -> ServerSummary {
    summary_with(address, None)
}

fn summary_with(address: &Address, token: Option<&Token>) -> ServerSummary {
    let mut c = gpuplex_transport::connect(address, token).unwrap();
    c.send(&Header::request(Opcode::ServerInfo, 1, 0, 0), &[]).unwrap();
    let mut buf = Vec::new();
    c.recv(&mut buf).unwrap();
    codec::decode(&buf).unwrap()
}

/// The error a call must have failed with.
fn err<T>(r: Result<T, CuError>) -> CuError {
    r.err().expect("the call should have failed")
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(1), "{what} did not happen within a second");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_vanished_client_leaves_no_memory_behind() {
    let address = start_server("vanish");
    let mut observer = Client::connect(&address);
    let before = observer.free_memory();
    let mut doomed = Client::connect(&address);
    doomed.alloc(1 << 30);
    doomed.alloc(3 << 20);
    assert_eq!(observer.free_memory(), before - (1 << 30) - (3 << 20));
    drop(doomed);
    wait_for("the dead client's memory to be freed", || observer.free_memory() == before);
    wait_for("the session to leave the registry", || summary(&address).sessions.0.len() == 1);
}

#[test]
fn garbage_ends_only_the_sender_s_session() {
    let address = start_server("garbage");
    let mut good = Client::connect(&address);
    let p = good.alloc(64);
    let mut bad = Client::connect(&address);
    let Address::Unix(path) = &address.address else { unreachable!("a Unix server") };
    // Raw garbage from a fresh connection, and garbage after a handshake.
    std::os::unix::net::UnixStream::connect(path).unwrap().write_all(&[0x5a; 4096]).unwrap();
    let mut h = Header::request(Opcode::cuMemAlloc_v2, 99, bad.ctx.0, 4);
    h.magic = 0xdeadbeef.into();
    bad.carrier.send(&h, &[0; 4]).unwrap();
    assert!(bad.carrier.recv(&mut Vec::new()).is_err(), "the sender's connection is closed");
    good.call(MemcpyHtoD::Request { dst: p, data: vec![7; 64], stream: Stream::NULL, sync: true }).unwrap();
    let back = good.call(MemcpyDtoH::Request { src: p, size: 64, stream: Stream::NULL, sync: true }).unwrap();
    assert_eq!(back.data, vec![7; 64]);
}

#[test]
fn an_unknown_opcode_is_answered_then_the_session_ends() {
    let address = start_server("opcode");
    let mut c = Client::connect(&address);
    let mut h = Header::request(Opcode::cuMemAlloc_v2, 5, c.ctx.0, 0);
    h.opcode = 0x7fff.into();
    c.carrier.send(&h, &[]).unwrap();
    let mut buf = Vec::new();
    let reply = c.carrier.recv(&mut buf).unwrap();
    assert_eq!(reply.status.get(), CuError::INVALID_VALUE.0);
    assert!(c.carrier.recv(&mut buf).is_err());
}

#[test]
fn an_undecodable_payload_ends_the_session() {
    let address = start_server("payload");
    let mut c = Client::connect(&address);
    let h = Header::request(Opcode::cuMemAlloc_v2, 5, c.ctx.0, 3);
    c.carrier.send(&h, &[1, 2, 3]).unwrap();
    let mut buf = Vec::new();
    assert_eq!(c.carrier.recv(&mut buf).unwrap().status.get(), CuError::INVALID_VALUE.0);
    assert!(c.carrier.recv(&mut buf).is_err());
}

#[test]
fn short_and_long_reads_survive_contexts_coming_and_going() {
    let address = start_server("reads");
    let mut c = Client::connect(&address);
    // Short reads go through a pinned buffer registered from the copy's
    // context; long ones through the heap. Both must read what was written,
    // in every context, also after the context they were pinned from ends.
    let check = |c: &mut Client, seed: u8| {
        for n in [4usize, 4096, 64 << 10, (64 << 10) + 1, 200 << 10] {
            let p = c.alloc(n as u64);
            let data = pattern(n, seed);
            c.write(p, &data);
            assert_eq!(c.read(p, n as u64), data, "{n} bytes, seed {seed}");
            c.call(cuMemFree_v2::Request { dptr: p }).unwrap();
        }
    };
    check(&mut c, 1);
    let primary = c.ctx;
    c.ctx = c.call(CtxCreate::Request { dev: 0, flags: 0 }).unwrap().ctx;
    check(&mut c, 2);
    c.call(CtxDestroy::Request { ctx: c.ctx }).unwrap();
    c.ctx = primary;
    c.call(PrimaryCtxReset::Request { dev: 0 }).unwrap();
    c.ctx = c.call(cuDevicePrimaryCtxRetain::Request { dev: 0 }).unwrap().pctx;
    check(&mut c, 3);
}

#[test]
fn sessions_cannot_touch_each_other() {
    let address = start_server("isolation");
    let mut a = Client::connect(&address);
    let mut b = Client::connect(&address);
    let pa = a.alloc(256);
    let stream = a.call(cuStreamCreate::Request { flags: 0 }).unwrap().phStream;
    assert_eq!(
        err(b.call(MemcpyDtoH::Request { src: pa, size: 16, stream: Stream::NULL, sync: true })),
        CuError::INVALID_VALUE
    );
    assert_eq!(err(b.call(cuMemFree_v2::Request { dptr: pa })), CuError::INVALID_VALUE);
    assert_eq!(err(b.call(cuStreamSynchronize::Request { hStream: stream })), CuError::INVALID_HANDLE);
    a.call(cuMemFree_v2::Request { dptr: pa }).unwrap();
}

#[test]
fn bogus_arguments_get_clear_errors() {
    let address = start_server("bogus");
    let mut c = Client::connect(&address);
    let p = c.alloc(100);
    let copy = |dst: u64, n: usize| MemcpyHtoD::Request {
        dst: DevPtr(dst),
        data: vec![0; n],
        stream: Stream::NULL,
        sync: true,
    };
    assert_eq!(err(c.call(copy(p.0 + 90, 11))), CuError::INVALID_VALUE, "past the end");
    assert_eq!(err(c.call(copy(0x1234, 1))), CuError::INVALID_VALUE, "not an allocation");
    assert_eq!(
        err(c.call(MemcpyDtoH::Request { src: p, size: 1 << 40, stream: Stream::NULL, sync: true })),
        CuError::INVALID_VALUE
    );
    assert_eq!(err(c.call(cuMemAlloc_v2::Request { bytesize: 1 << 50 })), CuError::OUT_OF_MEMORY);
    assert_eq!(err(c.call(cuStreamQuery::Request { hStream: Stream(0xdead0) })), CuError::INVALID_HANDLE);
    assert_eq!(err(c.call(cuDevicePrimaryCtxRetain::Request { dev: 7 })), CuError::INVALID_DEVICE);
    assert_eq!(
        err(c.call(ModuleLoad::Request {
            digest: gpuplex_protocol::image_digest(b"garbage"),
            image: b"garbage".to_vec()
        })),
        CuError::INVALID_IMAGE
    );
    c.ctx = Ctx(0xbad0);
    assert_eq!(err(c.call(cuMemAlloc_v2::Request { bytesize: 8 })), CuError::INVALID_CONTEXT);
    c.ctx = Ctx(0);
    assert_eq!(err(c.call(cuMemAlloc_v2::Request { bytesize: 8 })), CuError::INVALID_CONTEXT);
}

/// `cuMemsetD2D8(p, 0, 0, 0, 1 << 62)`, from a fuzzing run: a memset of
/// no bytes in 2^62 rows once had the emulated device walk every row with
/// the device locked, and skipped the check of its destination. An empty
/// memset is answered at once, for the session's own memory only, and
/// every other session is answered meanwhile.
#[test]
fn an_empty_memset_returns_at_once_and_only_for_the_session_s_memory() {
    let address = start_server("empty-memset");
    let mut bystander = Client::connect(&address);
    let q = bystander.alloc(64);
    bystander.write(q, &[4; 64]);
    let mut c = Client::connect(&address);
    let p = c.alloc(64);
    c.write(p, &[1; 64]);
    let memset = |dst: DevPtr, pitch: u64, width: u64, height: u64| Memset::Request {
        dst,
        pitch,
        value: 0,
        elementSize: 1,
        width,
        height,
        stream: Stream::NULL,
        sync: true,
    };
    let mut c = within(Duration::from_secs(1), move || {
        c.call(memset(p, 0, 0, 1 << 62)).unwrap();
        c.call(memset(p, 0, 0, u64::MAX)).unwrap();
        c.call(memset(p, 1, 64, 0)).unwrap();
        c.post(memset(p, 0, 0, 1 << 62));
        assert_eq!(c.read(p, 64), vec![1; 64], "empty memsets set nothing");
        c
    });
    assert_eq!(bystander.read(q, 64), vec![4; 64], "the bystander is answered");
    // Not the session's memory (the bystander's, nobody's, one past the end
    // of its own): refused, as a one-byte memset there is.
    for dst in [q, DevPtr(0), DevPtr(0x1234), DevPtr(p.0 + 64)] {
        let (code, detail) = c.call_detail(memset(dst, 0, 0, 1 << 62)).err().unwrap();
        assert_eq!(code, CuError::INVALID_VALUE, "{dst:?}: {detail}");
    }
    // Rows that overlap, 2^62 of them: refused, not run.
    assert_eq!(err(c.call(memset(p, 0, 1, 1 << 62))), CuError::INVALID_VALUE);
    assert_eq!(c.read(p, 64), vec![1; 64]);
    assert_eq!(bystander.read(q, 64), vec![4; 64], "the bystander's memory is untouched");
}

/// Occupancy queries with absurd sizes (an `INT_MAX` block once made the
/// emulated device divide by zero, ending the session) are answered with a
/// CUDA error, or with no blocks where the device could launch the block
/// but the function cannot; the session and the server go on.
#[test]
fn absurd_occupancy_queries_get_clean_answers() {
    let address = start_server("occupancy");
    let mut bystander = Client::connect(&address);
    let mut c = Client::connect(&address);
    // reduce, from sm_90 code with its register count: launch bounds of
    // 256 threads, 1 KiB of static shared memory.
    let hmod = c.module(include_bytes!("../testdata/plain.fatbin").to_vec());
    let func = c.call(cuModuleGetFunction::Request { hmod, name: "reduce".into() }).unwrap().hfunc;
    let invalid = CuError::INVALID_VALUE;

    let active = |c: &mut Client, block: i32, smem: u64, flags: u32| {
        let req = cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags::Request {
            func,
            blockSize: block,
            dynamicSMemSize: smem,
            flags,
        };
        c.call(req).map(|r| r.numBlocks)
    };
    let fuzzed = cuOccupancyMaxActiveBlocksPerMultiprocessor::Request { func, blockSize: i32::MAX, dynamicSMemSize: 0 };
    assert_eq!(err(c.call(fuzzed).map(|r| r.numBlocks)), invalid);
    assert!(active(&mut c, 256, 0, 0).unwrap() > 0);
    for block in [i32::MAX, 1025, 0, -1, i32::MIN] {
        assert_eq!(err(active(&mut c, block, 0, 0)), invalid, "{block} threads");
    }
    assert_eq!(active(&mut c, 512, 0, 0), Ok(0), "past the function's launch bounds");
    assert_eq!(active(&mut c, 256, u64::MAX, 0), Ok(0), "more shared memory than any block has");
    assert_eq!(err(active(&mut c, 256, 0, u32::MAX)), invalid, "unknown flags");

    let available = |c: &mut Client, blocks: i32, block: i32| {
        let req = cuOccupancyAvailableDynamicSMemPerBlock::Request { func, numBlocks: blocks, blockSize: block };
        c.call(req).map(|r| r.dynamicSmemSize)
    };
    assert!(available(&mut c, 1, 256).unwrap() > 0);
    for (blocks, block) in [(i32::MAX, i32::MAX), (1, i32::MAX), (i32::MIN, 256), (1, -256), (1, 512), (1000, 32)] {
        assert_eq!(err(available(&mut c, blocks, block)), invalid, "{blocks} blocks of {block} threads");
    }

    let potential = |c: &mut Client, smem: u64, limit: i32, flags: u32| {
        let req = OccupancyMaxPotentialBlockSize::Request { func, dynamicSMemSize: smem, blockSizeLimit: limit, flags };
        c.call(req).map(|r| (r.minGridSize, r.blockSize))
    };
    assert_eq!(potential(&mut c, u64::MAX, 0, 0), Ok((0, 0)), "no block size fits");
    assert_eq!(potential(&mut c, 0, i32::MIN, 0).unwrap().1, 256);
    assert_eq!(potential(&mut c, 0, i32::MAX, 0).unwrap().1, 256);
    assert_eq!(err(potential(&mut c, 0, 0, u32::MAX)), invalid);

    let clusters = |c: &mut Client, block: u32, dims: [u32; 3]| {
        let mut attrs = 4u32.to_le_bytes().to_vec();
        attrs.extend(dims.iter().flat_map(|d| d.to_le_bytes()));
        attrs.resize(4 + 64, 0);
        let req = OccupancyClusters::Request {
            query: 0,
            func,
            gridX: 8,
            gridY: 1,
            gridZ: 1,
            blockX: block,
            blockY: 1,
            blockZ: 1,
            sharedMem: 0,
            stream: Stream::NULL,
            attrs,
        };
        c.call(req).map(|r| r.value)
    };
    assert!(clusters(&mut c, 256, [2, 1, 1]).unwrap() > 0);
    for dims in [[u32::MAX; 3], [65536, 65536, 1], [0, 1, 1]] {
        assert_eq!(clusters(&mut c, 256, dims), Ok(0), "{dims:?}");
    }
    assert_eq!(err(clusters(&mut c, u32::MAX, [1, 1, 1])), invalid);

    c.alloc(64);
    bystander.alloc(64);
}

#[test]
fn module_functions_are_the_handles_get_function_gives() {
    let address = start_server("modfuncs");
    let mut c = Client::connect(&address);
    let ptx = include_bytes!("../testdata/kernels.ptx").to_vec();
    let hmod = c.module(ptx);
    // One name asked for before the listing, the others after it.
    let scale = c.call(cuModuleGetFunction::Request { hmod, name: "_Z5scaleIfEvPT_S0_j".into() }).unwrap().hfunc;
    let funcs = c.call(ModuleFunctions::Request { hmod }).unwrap().funcs.0;
    assert_eq!(funcs.len(), 3);
    assert_eq!(c.call(cuModuleGetFunctionCount::Request { hmod }).unwrap().count, 3);
    let mut by_name = Vec::new();
    for name in ["mixed", "_Z5scaleIfEvPT_S0_j", "reduce"] {
        by_name.push(c.call(cuModuleGetFunction::Request { hmod, name: name.into() }).unwrap().hfunc.0);
    }
    assert!(by_name.contains(&scale.0));
    let (mut listed, mut named) = (funcs.clone(), by_name);
    listed.sort_unstable();
    named.sort_unstable();
    assert_eq!(listed, named);
    // Asking again issues nothing new; each handle names its module.
    assert_eq!(c.call(ModuleFunctions::Request { hmod }).unwrap().funcs.0, funcs);
    for f in funcs {
        assert_eq!(c.call(cuFuncGetModule::Request { hfunc: Func(f) }).unwrap().hmod, hmod);
    }
    assert_eq!(err(c.call(ModuleFunctions::Request { hmod: Module(0xdead0) })), CuError::INVALID_HANDLE);
    c.call(cuModuleUnload::Request { hmod }).unwrap();
    assert_eq!(err(c.call(ModuleFunctions::Request { hmod })), CuError::INVALID_HANDLE);
}

#[test]
fn each_client_thread_has_its_own_per_thread_stream() {
    let address = start_server("per-thread");
    let mut c = Client::connect(&address);
    let id = |c: &mut Client| c.call(cuStreamGetId::Request { hStream: Stream::PER_THREAD }).unwrap().streamId;
    let first = id(&mut c);
    assert_eq!(id(&mut c), first, "stable for one thread");
    c.thread = 2;
    let second = id(&mut c);
    assert_ne!(second, first);
    let legacy = c.call(cuStreamGetId::Request { hStream: Stream::LEGACY }).unwrap().streamId;
    assert_ne!(legacy, second);
}

#[test]
fn info_lists_live_sessions_with_their_usage() {
    let address = start_server("info");
    let mut c = Client::connect(&address);
    c.alloc(5 << 20);
    let s = summary(&address);
    assert_eq!(s.backend, "emulated");
    assert_eq!(s.sessions.0.len(), 1);
    assert_eq!(s.sessions.0[0].device_bytes, 5 << 20);
    assert_eq!(s.sessions.0[0].contexts, 1);
}

/// Over TCP, only a peer with the token gets a session; strangers are hung
/// up on without a frame being read, and one that stays silent (holding its
/// thread until the timeout) stalls no one else.
#[test]
fn tcp_admits_only_the_token_and_strangers_stall_no_one() {
    let right = token("the server's token, 32 bytes....");
    let address = start_tcp_server(right.clone());
    let Address::Tcp(host_port) = &address else { unreachable!("a TCP server") };

    let _silent = std::net::TcpStream::connect(host_port).unwrap();
    let start = Instant::now();
    let mut good = Client::connect_with(&address, Some(&right));
    good.alloc(1 << 20);
    assert!(start.elapsed() < Duration::from_secs(2), "a silent peer delayed a good one: {:?}", start.elapsed());

    // A well-formed Hello, sent without the opening, is never read as one.
    let mut intruder = std::net::TcpStream::connect(host_port).unwrap();
    let mut greeting = [0u8; 40];
    intruder.read_exact(&mut greeting).unwrap();
    let hello = codec::encode(&Hello { pid: 66, program: "an intruder with a long enough name".into() });
    let h = Header::request(Opcode::Hello, 1, 0, hello.len());
    intruder.write_all(&[zerocopy::IntoBytes::as_bytes(&h), &hello].concat()).unwrap();
    let mut answer = Vec::new();
    let _ = intruder.read_to_end(&mut answer);
    assert!(answer.is_empty(), "the intruder got an answer: {answer:?}");

    let wrong = gpuplex_transport::connect(&address, Some(&token("a wrong token, also 32 bytes....")));
    assert!(matches!(wrong, Err(TransportError::Auth(AuthError::Refused))));

    let s = summary_with(&address, Some(&right));
    assert_eq!(s.sessions.0.len(), 1, "only the good client has a session");
    assert_eq!((s.sessions.0[0].pid, s.sessions.0[0].uid), (SessionSummary::NO_PID, SessionSummary::NO_UID));
    assert_eq!(s.sessions.0[0].device_bytes, 1 << 20);
}

/// Posted calls: no reply; the first failure answers the next waited-for
/// call in its place (which does not run), and the call after that runs.
#[test]
fn a_failed_posted_call_answers_the_next_waited_call_in_its_place() {
    let address = start_server("posted");
    let mut c = Client::connect(&address);
    let p = c.alloc(64);
    let free = c.free_memory();
    c.post(MemcpyHtoD::Request { dst: p, data: vec![5; 64], stream: Stream::NULL, sync: false });
    c.post(cuEventRecord::Request { hEvent: Event(0xdead0), hStream: Stream::NULL });
    // A second failure is dropped: only the first is kept.
    c.post(MemcpyDtoD::Request { dst: DevPtr(0x1234), src: p, size: 8, stream: Stream::NULL, sync: false });
    // `call_detail` checks that this reply answers the waited call, so a
    // reply sent to any posted call above fails here.
    let (code, detail) = c.call_detail(cuMemAlloc_v2::Request { bytesize: 1 << 20 }).err().unwrap();
    assert_eq!(code, CuError::INVALID_HANDLE, "{detail}");
    assert!(detail.contains("cuEventRecord") && detail.contains("posted"), "{detail}");
    assert_eq!(c.free_memory(), free, "the waited call that got the deferred error must not run");
    assert_eq!(c.read(p, 64), vec![5; 64], "a posted call that succeeds runs");
    c.alloc(1 << 20);
    assert!(c.free_memory() < free, "the error was reported once; later calls run");
}

#[test]
fn a_posted_copy_to_nowhere_fails_the_next_call_only() {
    let address = start_server("posted-copy");
    let mut c = Client::connect(&address);
    let p = c.alloc(64);
    let free = c.free_memory();
    c.post(MemcpyDtoD::Request { dst: DevPtr(0x1234), src: p, size: 8, stream: Stream::NULL, sync: false });
    let (code, detail) = c.call_detail(cuMemAlloc_v2::Request { bytesize: 4 << 20 }).err().unwrap();
    assert_eq!(code, CuError::INVALID_VALUE);
    assert!(detail.contains("MemcpyDtoD") && detail.contains("posted"), "{detail}");
    assert_eq!(c.free_memory(), free, "no allocation happened");
    let q = c.alloc(4 << 20);
    assert_ne!(q, p);
    assert_eq!(c.free_memory(), free - (4 << 20));
}

/// Two kernels for launch tests: `spin(u32 *out, u32 seed, u32 iters)` has
/// a reference on the emulated device, `nowhere()` does not, so launching
/// it fails in the backend (as a driver error would), not in the session's
/// checks.
const LAUNCH_PTX: &str = ".version 8.0
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
fn launch(func: Func, threads: u32, params: Vec<u8>) -> Launch::Request {
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

fn spin_params(out: DevPtr, seed: u32) -> Vec<u8> {
    [&out.0.to_le_bytes()[..], &seed.to_le_bytes(), &1u32.to_le_bytes()].concat()
}

/// Posted launches are batched only while further frames have arrived: a
/// posted launch with nothing after it still runs, with no other call to
/// push it, and writes the client's pinned memory.
#[test]
fn a_lone_posted_launch_runs_without_another_call() {
    let address = start_server("lone-launch");
    let mut c = Client::connect(&address);
    let _shared = c.share_memory();
    let host = c.call(HostAlloc::Request { size: 4096, flags: 0, at: 0 }).unwrap();
    let block = Region::open(c.carrier.recv_fd().unwrap()).unwrap();
    let spin = c.function(LAUNCH_PTX, "spin");
    assert_eq!(peek(&block, 0, 16), vec![0; 16]);
    c.post(launch(spin, 4, spin_params(host.devptr, 7)));
    wait_for("the posted launch to write the block", || peek(&block, 0, 16) != vec![0; 16]);
}

/// Posted launches report the first failure among them: launches the
/// backend refuses, then one the session's own checks refuse, must answer
/// with the backend's error. One refused launch runs on the session's
/// thread; forty, more than a batch, arrive while the session is busy and
/// go to its launcher thread.
#[test]
fn posted_launches_report_the_first_failure_of_their_run() {
    for refused in [1, 40] {
        let address = start_server(&format!("first-failure-{refused}"));
        let mut c = Client::connect(&address);
        let _shared = c.share_memory();
        let spin = c.function(LAUNCH_PTX, "spin");
        let nowhere = c.function(LAUNCH_PTX, "nowhere");
        let threads = 1 << 22;
        let out = c.alloc(4 * threads as u64);
        // Keeps the session busy while the frames below arrive together.
        c.post(launch(spin, threads, spin_params(out, 1)));
        std::thread::sleep(Duration::from_millis(1));
        for _ in 0..refused {
            c.post(launch(nowhere, 1, Vec::new()));
        }
        c.post(launch(spin, 1, vec![0; 8]));
        let (code, detail) = c.call_detail(cuCtxSynchronize::Request {}).err().unwrap();
        assert_eq!(code, CuError::NOT_SUPPORTED, "{refused} refused: {detail}");
        assert!(detail.contains("Launch (posted)") && detail.contains("nowhere"), "{detail}");
        c.call(cuCtxSynchronize::Request {}).unwrap();
    }
}

/// A flood of posted launches, many times what the session hands its
/// launcher at once or lets it hold unfinished, all run, in the order
/// sent, before the next waited call: each of the first kind writes its own
/// element, and the second kind all write one buffer, the last one sent
/// last.
#[test]
fn a_flood_of_posted_launches_all_run_in_order() {
    let address = start_server("launch-flood");
    let mut c = Client::connect(&address);
    let _shared = c.share_memory();
    let spin = c.function(LAUNCH_PTX, "spin");
    let n = 2048u32;
    let each = c.alloc(4 * u64::from(n));
    let last = c.alloc(4 * 256);
    for k in 0..n {
        c.post(launch(spin, 1, spin_params(DevPtr(each.0 + 4 * u64::from(k)), k)));
        c.post(launch(spin, 256, spin_params(last, k)));
    }
    let (got_each, got_last) = (c.read(each, 4 * u64::from(n)), c.read(last, 4 * 256));
    // Thread 0 of a launch with seed k writes what thread k of one with seed 0 does.
    let reference = c.alloc(4 * u64::from(n));
    c.call(launch(spin, n, spin_params(reference, 0))).unwrap();
    assert!(got_each == c.read(reference, 4 * u64::from(n)), "every posted launch ran");
    c.call(launch(spin, 256, spin_params(reference, n - 1))).unwrap();
    assert!(got_last == c.read(reference, 4 * 256), "the last launch sent ran last");
}

fn ring_layout(l: &SharedLayout) -> Layout {
    Layout { ring_bytes: l.ring_bytes as usize, staging_bytes: (l.slot_bytes * l.slots as u64) as usize }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Writes `data` into the client's mapping of `region` at `at`.
fn poke(region: &Region, at: usize, data: &[u8]) {
    assert!(at + data.len() <= region.len());
    // SAFETY: inside the mapping (checked above); the server reads it only
    // for a copy asked for after this returns.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), region.as_ptr().add(at), data.len()) }
}

fn peek(region: &Region, at: usize, n: usize) -> Vec<u8> {
    assert!(at + n <= region.len());
    // SAFETY: inside the mapping; the copy that wrote it has completed.
    unsafe { std::slice::from_raw_parts(region.as_ptr().add(at), n) }.to_vec()
}

#[test]
fn calls_and_staged_copies_work_over_shared_memory() {
    let address = start_server("shared");
    let mut c = Client::connect(&address);
    let (region, layout) = c.share_memory();
    let slot_bytes = layout.slot_bytes;
    assert!(layout.slots >= 4 && slot_bytes >= 4096);
    assert!(ring_layout(&layout).total() <= region.len());

    // Plain calls through the rings, larger than one ring for the read.
    let p = c.alloc(8 << 20);
    let inline = pattern(1000, 1);
    c.write(p, &inline);
    assert_eq!(c.read(p, 1000), inline);
    let big = c.read(p, layout.ring_bytes + 4096);
    assert_eq!(big.len() as u64, layout.ring_bytes + 4096);

    // Staged: slot 3, not at its start.
    let (slot, n) = (3u64, 100_000usize);
    let offset = slot * slot_bytes + 16;
    let staged = pattern(n, 7);
    poke(&region, ring_layout(&layout).staging_offset() + offset as usize, &staged);
    let dst = DevPtr(p.0 + 4096);
    let copy = |block: u64, offset: u64, size: u64| MemcpyHtoDShared::Request {
        dst,
        block,
        offset,
        size,
        stream: Stream::NULL,
        sync: false,
    };
    c.call(copy(0, offset, n as u64)).unwrap();
    c.call(StagingWait::Request { slot: slot as u32 }).unwrap();
    assert_eq!(c.read(dst, n as u64), staged);

    // And back out through slot 5.
    let back = 5 * slot_bytes;
    c.call(MemcpyDtoHShared::Request {
        src: dst,
        block: 0,
        offset: back,
        size: n as u64,
        stream: Stream::NULL,
        sync: false,
    })
    .unwrap();
    c.call(StagingWait::Request { slot: 5 }).unwrap();
    assert_eq!(peek(&region, ring_layout(&layout).staging_offset() + back as usize, n), staged);

    // Ranges the client may not name.
    let staging = slot_bytes * layout.slots as u64;
    assert_eq!(err(c.call(copy(0, slot_bytes - 8, 16))), CuError::INVALID_VALUE, "across a slot boundary");
    assert_eq!(err(c.call(copy(0, staging, 1))), CuError::INVALID_VALUE, "past the staging area");
    assert_eq!(err(c.call(copy(0, u64::MAX - 4, 16))), CuError::INVALID_VALUE, "offset + size overflows");
    assert_eq!(err(c.call(copy(0, u64::MAX, 1))), CuError::INVALID_VALUE, "offset + size overflows");
    assert_eq!(err(c.call(copy(77, 0, 16))), CuError::INVALID_VALUE, "an unknown block");
    assert_eq!(err(c.call(StagingWait::Request { slot: layout.slots })), CuError::INVALID_VALUE);
    let twice = Header::request(Opcode::SharedMemory, 1000, c.ctx.0, 0);
    c.carrier.send(&twice, &[]).unwrap();
    let h = c.carrier.recv(&mut Vec::new()).unwrap();
    assert_eq!((h.request_id.get(), h.status.get()), (1000, CuError::INVALID_VALUE.0), "shared twice");

    // Refusals end nothing.
    assert_eq!(c.read(p, 1000), inline);
}

#[test]
fn staging_needs_shared_memory() {
    let address = start_server("no-staging");
    let mut c = Client::connect(&address);
    let p = c.alloc(64);
    let copy = MemcpyHtoDShared::Request { dst: p, block: 0, offset: 0, size: 8, stream: Stream::NULL, sync: true };
    assert_eq!(err(c.call(copy)), CuError::INVALID_VALUE);
    assert_eq!(err(c.call(StagingWait::Request { slot: 0 })), CuError::INVALID_VALUE);
}

/// A staged copy of no bytes where the staging area ends (block 0, offset
/// 16 MiB) once indexed a ninth slot of eight and killed its session. It
/// is an empty range, copied as nothing; a byte there, offsets past it and
/// slots that do not exist are CUDA errors; the session and the server go on.
#[test]
fn staged_copies_at_and_past_the_staging_area_s_end_are_answered_cleanly() {
    let address = start_server("staged-edges");
    let mut bystander = Client::connect(&address);
    let q = bystander.alloc(64);
    let mut c = Client::connect(&address);
    let (_region, layout) = c.share_memory();
    let staging = layout.slot_bytes * layout.slots as u64;
    let p = c.alloc(64);
    let dtoh = |src: DevPtr, offset: u64, size: u64| MemcpyDtoHShared::Request {
        block: 0,
        offset,
        src,
        size,
        stream: Stream::NULL,
        sync: true,
    };
    let htod = |dst: DevPtr, offset: u64, size: u64| MemcpyHtoDShared::Request {
        dst,
        block: 0,
        offset,
        size,
        stream: Stream::NULL,
        sync: true,
    };
    c.call(dtoh(p, staging, 0)).unwrap();
    c.call(htod(p, staging, 0)).unwrap();
    for (offset, size) in [(staging, 1), (staging - 1, 2), (staging + 1, 0), (u64::MAX, 0), (u64::MAX, 1)] {
        assert_eq!(err(c.call(dtoh(p, offset, size))), CuError::INVALID_VALUE, "{size} bytes at {offset}");
        assert_eq!(err(c.call(htod(p, offset, size))), CuError::INVALID_VALUE, "{size} bytes at {offset}");
    }
    for slot in [layout.slots, u32::MAX] {
        assert_eq!(err(c.call(StagingWait::Request { slot })), CuError::INVALID_VALUE, "slot {slot}");
    }
    // No bytes, but to and from memory the session does not hold.
    assert_eq!(err(c.call(dtoh(q, 0, 0))), CuError::INVALID_VALUE);
    assert_eq!(err(c.call(htod(DevPtr(0x1234), 0, 0))), CuError::INVALID_VALUE);
    c.write(p, &[6; 64]);
    assert_eq!(c.read(p, 64), vec![6; 64]);
    bystander.alloc(64);
}

/// Random blocks, offsets, sizes and slots for the shared-memory copies
/// and `StagingWait`, weighted towards the edges of slots, of the staging
/// area and of a host block: each call is answered, with success or
/// INVALID_VALUE, and the session goes on.
#[test]
fn random_shared_copies_never_hurt_the_server() {
    let address = start_server("shared-fuzz");
    let mut c = Client::connect(&address);
    let (_region, layout) = c.share_memory();
    let host = c.call(HostAlloc::Request { size: 1 << 16, flags: 0, at: 0 }).unwrap();
    let _block = Region::open(c.carrier.recv_fd().unwrap()).unwrap();
    let (slot, slots) = (layout.slot_bytes, layout.slots);
    let staging = slot * slots as u64;
    // Room for any staged copy and a host block's, so that the device
    // range passes and the host range is what is checked.
    let p = c.alloc(2 * staging);
    let block = prop_oneof![Just(0), Just(host.block), Just(host.block + 1), any::<u64>()];
    let edge = (0..=slots as u64 + 1, -2i64..=2).prop_map(move |(k, d)| (k * slot).wrapping_add_signed(d));
    let offset = prop_oneof![edge, Just(staging), Just(1 << 16), 0..=staging + 2, any::<u64>()];
    let size = prop_oneof![Just(0), Just(1), Just(slot), 0..=2 * slot, Just(1 << 16), any::<u64>()];
    let wait = prop_oneof![0..=slots + 1, any::<u32>()];
    let cases = (block, offset, size, wait, any::<bool>());
    let c = std::cell::RefCell::new(c);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig { cases: 256, ..ProptestConfig::default() });
    let outcome = runner.run(&cases, |(block, offset, size, slot, to_device)| {
        let mut c = c.borrow_mut();
        let stream = Stream::NULL;
        let copied = if to_device {
            let req = MemcpyHtoDShared::Request { dst: p, block, offset, size, stream, sync: false };
            c.call(req).map(|_| ())
        } else {
            let req = MemcpyDtoHShared::Request { block, offset, src: p, size, stream, sync: false };
            c.call(req).map(|_| ())
        };
        prop_assert!(matches!(copied, Ok(()) | Err(CuError::INVALID_VALUE)), "{copied:?}");
        let waited = c.call(StagingWait::Request { slot }).map(|_| ());
        prop_assert!(matches!(waited, Ok(()) | Err(CuError::INVALID_VALUE)), "{waited:?}");
        prop_assert!(c.free_memory() > 0);
        Ok(())
    });
    if let Err(e) = outcome {
        panic!("{e}");
    }
}

#[test]
fn host_blocks_are_shared_until_freed() {
    let address = start_server("host-blocks");
    let mut c = Client::connect(&address);
    let _shared = c.share_memory();
    let size = 1u64 << 16;
    let host = c.call(HostAlloc::Request { size, flags: 0, at: 0 }).unwrap();
    assert_ne!(host.block, 0, "block 0 is the staging area");
    // The descriptor follows the reply.
    let block = Region::open(c.carrier.recv_fd().unwrap()).unwrap();
    assert_eq!(block.len() as u64, size);

    let p = c.alloc(size);
    let data = pattern(5000, 3);
    poke(&block, 4096, &data);
    let copy = |block: u64, offset: u64, len: u64| MemcpyHtoDShared::Request {
        dst: p,
        block,
        offset,
        size: len,
        stream: Stream::NULL,
        sync: true,
    };
    c.call(copy(host.block, 4096, data.len() as u64)).unwrap();
    assert_eq!(c.read(p, data.len() as u64), data, "the server sees what the client wrote");
    assert_eq!(c.read(DevPtr(host.devptr.0 + 4096), data.len() as u64), data, "through its device address");

    let out = pattern(300, 9);
    c.write(p, &out);
    c.call(MemcpyDtoHShared::Request {
        src: p,
        block: host.block,
        offset: 100,
        size: 300,
        stream: Stream::NULL,
        sync: true,
    })
    .unwrap();
    assert_eq!(peek(&block, 100, 300), out, "the client sees what the server wrote");

    assert_eq!(err(c.call(copy(host.block, size - 8, 16))), CuError::INVALID_VALUE, "past the block's end");
    assert_eq!(err(c.call(copy(host.block, u64::MAX - 4, 16))), CuError::INVALID_VALUE, "overflow");
    assert_eq!(err(c.call(HostAlloc::Request { size: 0, flags: 0, at: 0 })), CuError::INVALID_VALUE);

    c.call(HostFree::Request { block: host.block }).unwrap();
    assert_eq!(err(c.call(copy(host.block, 4096, 16))), CuError::INVALID_VALUE, "freed");
    assert_eq!(err(c.call(HostFree::Request { block: host.block })), CuError::INVALID_VALUE, "freed twice");
    assert_eq!(
        err(c.call(MemcpyDtoH::Request { src: host.devptr, size: 16, stream: Stream::NULL, sync: true })),
        CuError::INVALID_VALUE,
        "its device address died with it"
    );
}

#[test]
fn a_client_vanishing_with_frames_on_the_rings_leaves_nothing_behind() {
    let address = start_server("vanish-rings");
    let mut observer = Client::connect(&address);
    let before = observer.free_memory();
    let mut doomed = Client::connect(&address);
    let _shared = doomed.share_memory();
    doomed.alloc(1 << 30);
    doomed.call(HostAlloc::Request { size: 1 << 16, flags: 0, at: 0 }).unwrap();
    let _block = doomed.carrier.recv_fd().unwrap();
    assert!(observer.free_memory() <= before - (1 << 30));
    // Requests whose replies no one will read.
    for _ in 0..16 {
        doomed.send(cuMemAlloc_v2::Request { bytesize: 1 << 20 }, false);
    }
    drop(doomed);
    wait_for("the dead client's memory to be freed", || observer.free_memory() == before);
    wait_for("the session to leave the registry", || summary(&address).sessions.0.len() == 1);
}

/// Offsets in a connection region of each ring's counters (`RingControl`:
/// six 64-byte lines, head first, then tail); ring 0 runs client to server.
const CONTROL: usize = 6 * 64;

/// A client that lies on a ring's counters ends its own session only.
/// `then_call`: the liar makes a call after lying (for a lie the server
/// sees only when it writes).
fn lying_on_the_rings_ends_only_the_liar(name: &str, then_call: bool, lie: impl FnOnce(&Region, &SharedLayout)) {
    let address = start_server(name);
    let mut good = Client::connect(&address);
    let p = good.alloc(64);
    let before = good.free_memory();
    let mut liar = Client::connect(&address);
    let (region, layout) = liar.share_memory();
    // Larger than a ring, so that answering it makes the server look at the
    // reader's counter again (it trusts the last one seen while it leaves room).
    let big = 2 * layout.ring_bytes;
    let src = liar.alloc(big);
    lie(&region, &layout);
    if then_call {
        liar.send(MemcpyDtoH::Request { src, size: big, stream: Stream::NULL, sync: true }, false);
    }
    let mut buf = Vec::new();
    let start = Instant::now();
    while liar.carrier.recv(&mut buf).is_ok() {
        assert!(start.elapsed() < Duration::from_secs(2), "the liar's session goes on");
    }
    wait_for("the liar's memory to be freed", || good.free_memory() == before);
    wait_for("the liar's session to end", || summary(&address).sessions.0.len() == 1);
    good.write(p, &[9; 64]);
    assert_eq!(good.read(p, 64), vec![9; 64]);
    let mut newcomer = Client::connect(&address);
    newcomer.share_memory();
    newcomer.alloc(1 << 20);
}

/// The counter at `at` in the region's control page.
fn counter(region: &Region, at: usize) -> &AtomicU64 {
    assert!(at % 8 == 0 && at + 8 <= 4096 && region.len() >= 4096);
    // SAFETY: an aligned u64 in the mapped control page, which both sides
    // only ever access atomically.
    unsafe { &*region.as_ptr().add(at).cast::<AtomicU64>() }
}

#[test]
fn a_head_past_capacity_ends_only_the_liar_s_session() {
    // No call after: the liar's own writer would publish its true head.
    lying_on_the_rings_ends_only_the_liar("lying-head", false, |region, layout| {
        let head = counter(region, 0);
        head.store(head.load(SeqCst) + 3 * layout.ring_bytes, SeqCst);
    });
}

#[test]
fn a_tail_past_the_head_ends_only_the_liar_s_session() {
    lying_on_the_rings_ends_only_the_liar("lying-tail", true, |region, layout| {
        let tail = counter(region, CONTROL + 64);
        tail.store(tail.load(SeqCst).wrapping_sub(2 * layout.ring_bytes), SeqCst);
    });
}

/// Any opcode with any payload ends in an answer or a closed session,
/// and the server keeps serving others.
#[test]
fn random_frames_never_hurt_the_server() {
    let address = start_server("fuzz");
    let frames = (0u16..0x700, proptest::collection::vec(any::<u8>(), 0..256));
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig { cases: 64, ..ProptestConfig::default() });
    let outcome = runner.run(&frames, |(op, payload)| {
        let mut c = Client::connect(&address);
        let mut h = Header::request(Opcode::Hello, 9, c.ctx.0, payload.len());
        h.opcode = op.into();
        let _ = c.carrier.send(&h, &payload);
        let _ = c.carrier.recv(&mut Vec::new());
        let mut other = Client::connect(&address);
        prop_assert!(other.free_memory() > 0);
        Ok(())
    });
    if let Err(e) = outcome {
        panic!("{e}");
    }
}

/// A session's lanes, driven by hand: one thread, chunks in order.
struct Lanes {
    lanes: Vec<Lane>,
    chunk: u64,
    key: [u8; 32],
}

impl Client {
    fn open_lanes(&mut self, address: &Address, token: Option<&Token>) -> Lanes {
        let offer: LaneOffer = self.session_request(Opcode::OpenLanes);
        assert!(offer.lanes >= 2 && offer.chunk_bytes >= 4096, "{offer:?}");
        let lanes = (0..offer.lanes).map(|i| join_lane(address, token, offer.key, i).unwrap()).collect();
        Lanes { lanes, chunk: offer.chunk_bytes, key: offer.key }
    }
}

/// Connects a lane and joins it; a refusal gives its status.
fn join_lane(address: &Address, token: Option<&Token>, key: [u8; 32], index: u32) -> Result<Lane, u32> {
    let mut carrier = gpuplex_transport::connect(address, token).unwrap();
    let join = codec::encode(&LaneJoin { key, index });
    carrier.send(&Header::request(Opcode::JoinLane, 1, 0, join.len()), &join).unwrap();
    let h = carrier.recv(&mut Vec::new()).unwrap();
    match h.status.get() {
        0 => Ok(carrier.into_lane().unwrap()),
        status => Err(status),
    }
}

/// Reads the server's receipts for the chunks `sent` on `lane`, in order.
fn answered(lane: &Lane, sent: &[ChunkHeader]) -> Result<(), TransportError> {
    for chunk in sent {
        let receipt = lane.recv_header()?;
        assert!(receipt.acknowledges(chunk), "{receipt:?} should answer {chunk:?}");
    }
    Ok(())
}

impl Lanes {
    /// Sends every chunk of a copy, in turn over the lanes, then reads
    /// their receipts.
    fn send(&self, copy: u64, data: &[u8]) -> Result<(), TransportError> {
        let mut sent = vec![Vec::new(); self.lanes.len()];
        for (i, offset, len) in Cut::to_device(data.len() as u64, self.chunk).chunks() {
            let (l, header) = (i as usize % self.lanes.len(), ChunkHeader::new(copy, offset, len));
            self.lanes[l].send_chunk(&header, &data[offset as usize..(offset + len) as usize])?;
            sent[l].push(header);
        }
        self.lanes.iter().zip(&sent).try_for_each(|(lane, sent)| answered(lane, sent))
    }

    /// Every chunk of a copy, each lane read until it ends its share and
    /// each chunk read answered with its receipt; a failed one gives its
    /// status. Each chunk must come exactly once.
    fn receive(&self, copy: u64, size: u64) -> Result<Vec<u8>, u32> {
        let mut data = vec![0u8; size as usize];
        let cut = Cut::from_device(size, self.chunk, self.lanes.len() as u64);
        let mut arrived = vec![false; cut.count() as usize];
        let mut failed = None;
        for lane in &self.lanes {
            loop {
                let h = lane.recv_header().unwrap();
                if h.is_end() && h.copy.get() == copy {
                    break;
                }
                let i = h.index_in(copy, &cut).unwrap_or_else(|| panic!("{h:?}: no chunk of copy {copy}"));
                assert!(!std::mem::replace(&mut arrived[i as usize], true), "chunk {i} came twice");
                let (offset, len) = (h.offset.get() as usize, h.length.get() as usize);
                match h.status.get() {
                    0 => {
                        lane.recv_exact(&mut data[offset..offset + len]).unwrap();
                        lane.send_chunk(&ChunkHeader::receipt(copy, offset as u64), &[]).unwrap();
                    }
                    status => failed = failed.or(Some(status)),
                }
            }
        }
        assert!(arrived.iter().all(|&a| a), "every chunk of copy {copy} came");
        failed.map_or(Ok(data), Err)
    }
}

fn lanes_htod(c: &mut Client, lanes: &Lanes, dst: DevPtr, copy: u64, data: &[u8]) -> Result<(), CuError> {
    c.send(MemcpyHtoDLanes::Request { dst, size: data.len() as u64, stream: Stream::NULL, copy }, false);
    lanes.send(copy, data).unwrap();
    c.reply::<MemcpyHtoDLanes::Request>().map(|_| ())
}

fn lanes_dtoh(c: &mut Client, lanes: &Lanes, src: DevPtr, copy: u64, size: u64) -> (Result<Vec<u8>, u32>, CuError) {
    c.send(MemcpyDtoHLanes::Request { src, size, stream: Stream::NULL, copy }, false);
    let data = lanes.receive(copy, size);
    (data, c.reply::<MemcpyDtoHLanes::Request>().err().unwrap_or(CuError(0)))
}

/// A client of a TCP server, and its lanes: over TCP, lanes prove the token too.
fn tcp_client_with_lanes() -> (Client, Lanes) {
    let t = token("a token for lanes, 32 bytes long");
    let address = start_tcp_server(t.clone());
    let mut c = Client::connect_with(&address, Some(&t));
    let lanes = c.open_lanes(&address, Some(&t));
    (c, lanes)
}

/// Copies of a few chunks per lane (several batches of DMAs) and a ragged
/// end cross both ways, each chunk to the device answered with a receipt,
/// and a failed copy still moves every chunk, so the next one finds its
/// lanes in step.
#[test]
fn large_copies_cross_the_lanes_and_failures_keep_them_in_step() {
    let (mut c, lanes) = tcp_client_with_lanes();
    let size = lanes.chunk * (2 * lanes.lanes.len() as u64 + 3) + 12345;
    let p = c.alloc(size);
    let data = pattern(size as usize, 3);
    lanes_htod(&mut c, &lanes, p, 1, &data).unwrap();
    assert_eq!(c.read(DevPtr(p.0 + size - 1000), 1000), data[data.len() - 1000..], "written through the lanes");
    assert_eq!(lanes_dtoh(&mut c, &lanes, p, 2, size), (Ok(data.clone()), CuError(0)));

    // Outside the allocation: refused, yet every chunk crossed.
    let beyond = DevPtr(p.0 + 4096);
    assert_eq!(lanes_htod(&mut c, &lanes, beyond, 3, &data), Err(CuError::INVALID_VALUE));
    assert_eq!(lanes_dtoh(&mut c, &lanes, beyond, 4, size), (Err(CuError::INVALID_VALUE.0), CuError::INVALID_VALUE));
    let other = pattern(size as usize, 9);
    lanes_htod(&mut c, &lanes, p, 5, &other).unwrap();
    assert_eq!(lanes_dtoh(&mut c, &lanes, p, 6, size).0, Ok(other));
}

/// Runs `test` on a thread of its own and fails if it takes longer than
/// `limit`: a call the server never answers would hang, not fail.
fn within<T: Send + 'static>(limit: Duration, test: impl FnOnce() -> T + Send + 'static) -> T {
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
fn within_30_s(test: impl FnOnce() + Send + 'static) {
    within(Duration::from_secs(30), test)
}

/// Lanes run by threads of their own, as the client's are, one of them
/// starting late: the copy waits for it and lands whole. (A session that
/// let the punctual lanes' chunks fill its batches could hold all of the
/// late lane's slots while waiting for that lane's next chunk, and hang.)
#[test]
fn a_lane_that_starts_late_delays_a_copy_but_does_not_break_it() {
    let (mut c, lanes) = tcp_client_with_lanes();
    let count = lanes.lanes.len();
    // Several chunks per lane, more than a lane has slots.
    let size = lanes.chunk * (6 * count as u64) + 777;
    let p = c.alloc(size);
    let data = pattern(size as usize, 5);
    within_30_s(move || {
        c.send(MemcpyHtoDLanes::Request { dst: p, size, stream: Stream::NULL, copy: 1 }, false);
        std::thread::scope(|scope| {
            for (l, lane) in lanes.lanes.iter().enumerate() {
                let (data, chunk) = (&data, lanes.chunk);
                scope.spawn(move || {
                    if l == 1 {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    let mut sent = Vec::new();
                    for (_, offset, len) in
                        Cut::to_device(size, chunk).chunks().filter(|&(i, _, _)| i as usize % count == l)
                    {
                        let bytes = &data[offset as usize..(offset + len) as usize];
                        sent.push(ChunkHeader::new(1, offset, len));
                        lane.send_chunk(sent.last().unwrap(), bytes).unwrap();
                    }
                    answered(lane, &sent).unwrap();
                });
            }
        });
        c.reply::<MemcpyHtoDLanes::Request>().unwrap();
        assert_eq!(lanes_dtoh(&mut c, &lanes, p, 2, size), (Ok(data), CuError(0)));
    });
}

/// Chunks may come on any lane in any order: here every chunk of a copy
/// comes on one lane, last chunk first. That lane has no more slots than a
/// batch of DMAs holds, so the session must give its slots back before it
/// waits for more, or wait forever.
#[test]
fn one_lane_may_carry_a_whole_copy_in_any_order() {
    let (mut c, lanes) = tcp_client_with_lanes();
    let size = lanes.chunk * (3 * lanes.lanes.len() as u64) + 99;
    let p = c.alloc(size);
    let data = pattern(size as usize, 6);
    within_30_s(move || {
        c.send(MemcpyHtoDLanes::Request { dst: p, size, stream: Stream::NULL, copy: 1 }, false);
        let mut sent: Vec<_> =
            Cut::to_device(size, lanes.chunk).chunks().map(|(_, o, len)| ChunkHeader::new(1, o, len)).collect();
        sent.reverse();
        for header in &sent {
            let (offset, len) = (header.offset.get() as usize, header.length.get() as usize);
            lanes.lanes[2].send_chunk(header, &data[offset..offset + len]).unwrap();
        }
        answered(&lanes.lanes[2], &sent).unwrap();
        c.reply::<MemcpyHtoDLanes::Request>().unwrap();
        assert_eq!(lanes_dtoh(&mut c, &lanes, p, 2, size), (Ok(data), CuError(0)));
    });
}

/// Chunks from the device go to the lanes that read them: a lane whose
/// client reads nothing until the other lanes have ended their shares
/// carries only the few chunks its writer may keep unanswered, and the
/// copy still lands whole.
#[test]
fn chunks_from_the_device_go_to_the_lanes_that_read() {
    let (mut c, lanes) = tcp_client_with_lanes();
    let count = lanes.lanes.len();
    let size = lanes.chunk * (6 * count as u64) + 4321;
    let p = c.alloc(size);
    let data = pattern(size as usize, 8);
    lanes_htod(&mut c, &lanes, p, 1, &data).unwrap();
    within_30_s(move || {
        c.send(MemcpyDtoHLanes::Request { src: p, size, stream: Stream::NULL, copy: 2 }, false);
        let cut = Cut::from_device(size, lanes.chunk, count as u64);
        let read_share = |lane: &Lane| {
            let mut got = Vec::new();
            loop {
                let h = lane.recv_header().unwrap();
                if h.is_end() && h.copy.get() == 2 {
                    return got;
                }
                let (offset, len) = (h.offset.get() as usize, h.length.get() as usize);
                assert!(h.status.get() == 0 && h.index_in(2, &cut).is_some(), "{h:?}");
                let mut bytes = vec![0u8; len];
                lane.recv_exact(&mut bytes).unwrap();
                lane.send_chunk(&ChunkHeader::receipt(2, offset as u64), &[]).unwrap();
                got.push((offset, bytes));
            }
        };
        let others: Vec<_> = std::thread::scope(|scope| {
            let readers: Vec<_> = lanes.lanes[1..].iter().map(|lane| scope.spawn(move || read_share(lane))).collect();
            readers.into_iter().flat_map(|r| r.join().unwrap()).collect()
        });
        let idle = read_share(&lanes.lanes[0]);
        assert!(idle.len() <= gpuplex_server::session::lanes::OUT_AHEAD, "the idle lane carried {}", idle.len());
        let mut landed = vec![0u8; size as usize];
        for (offset, bytes) in idle.into_iter().chain(others) {
            landed[offset..offset + bytes.len()].copy_from_slice(&bytes);
        }
        assert!(landed == data, "every chunk landed in its place");
        c.reply::<MemcpyDtoHLanes::Request>().unwrap();
    });
}

/// A lane copy after a failed posted call answers with that error, but
/// moves its chunks (and runs): the lanes must stay in step.
#[test]
fn a_deferred_error_answers_a_lane_copy_that_still_runs() {
    let address = start_server("lanes-deferred");
    let mut c = Client::connect(&address);
    let lanes = c.open_lanes(&address, None);
    let size = lanes.chunk * 2 + 7;
    let p = c.alloc(size);
    c.post(cuEventRecord::Request { hEvent: Event(0xdead0), hStream: Stream::NULL });
    let data = pattern(size as usize, 5);
    assert_eq!(lanes_htod(&mut c, &lanes, p, 1, &data), Err(CuError::INVALID_HANDLE));
    assert_eq!(lanes_dtoh(&mut c, &lanes, p, 2, size), (Ok(data), CuError(0)));
}

/// Only the session's own peer joins, once per lane and with the key; a
/// lane carrying a chunk other than the one due ends its session alone.
#[test]
fn lanes_refuse_strangers_and_end_only_a_liar_s_session() {
    let address = start_server("lanes-liar");
    let mut bystander = Client::connect(&address);
    let p = bystander.alloc(64);
    bystander.write(p, &[1; 64]);

    let mut c = Client::connect(&address);
    let lanes = c.open_lanes(&address, None);
    let n = lanes.lanes.len() as u32;
    let invalid = CuError::INVALID_VALUE.0;
    assert_eq!(join_lane(&address, None, [7; 32], 0).err(), Some(invalid), "a wrong key");
    assert_eq!(join_lane(&address, None, lanes.key, n).err(), Some(invalid), "no such lane");
    assert_eq!(join_lane(&address, None, lanes.key, 0).err(), Some(invalid), "joined already");
    let opened = Header::request(Opcode::OpenLanes, 900, c.ctx.0, 0);
    c.carrier.send(&opened, &[]).unwrap();
    let h = c.carrier.recv(&mut Vec::new()).unwrap();
    assert_eq!((h.request_id.get(), h.status.get()), (900, invalid), "lanes opened twice");

    let q = c.alloc(lanes.chunk * 2);
    c.send(MemcpyHtoDLanes::Request { dst: q, size: lanes.chunk * 2, stream: Stream::NULL, copy: 1 }, false);
    // The server may close the lanes before the second chunk is sent.
    let _ = lanes.send(2, &vec![0; lanes.chunk as usize * 2]);
    let h = c.carrier.recv(&mut Vec::new()).unwrap();
    assert_eq!(h.status.get(), CuError::DEVICE_UNAVAILABLE.0, "the copy fails");
    assert!(c.carrier.recv(&mut Vec::new()).is_err(), "then the liar's session ends");
    assert_eq!(bystander.read(p, 64), vec![1; 64], "the bystander carries on");
    wait_for("the liar's session to close", || summary(&address).sessions.0.len() == 1);
}

/// A chunk sent twice (on two lanes), where another was due, ends its
/// session too: the copy would otherwise wait for one that never comes.
#[test]
fn a_chunk_sent_twice_ends_its_session() {
    let address = start_server("lanes-twice");
    let mut c = Client::connect(&address);
    let lanes = c.open_lanes(&address, None);
    let q = c.alloc(lanes.chunk * 2);
    c.send(MemcpyHtoDLanes::Request { dst: q, size: lanes.chunk * 2, stream: Stream::NULL, copy: 1 }, false);
    let first = ChunkHeader::new(1, 0, lanes.chunk);
    let bytes = vec![5; lanes.chunk as usize];
    for lane in &lanes.lanes[..2] {
        // The server may close the lanes before the second is sent.
        let _ = lane.send_chunk(&first, &bytes);
    }
    let h = c.carrier.recv(&mut Vec::new()).unwrap();
    assert_eq!(h.status.get(), CuError::DEVICE_UNAVAILABLE.0, "the copy fails");
    assert!(c.carrier.recv(&mut Vec::new()).is_err(), "then the session ends");
}

/// A copy larger than any device holds ends its session at once, both
/// ways, instead of the server counting its chunks; a bystander carries on.
#[test]
fn a_copy_larger_than_any_device_ends_its_session() {
    let address = start_server("lanes-huge");
    let mut bystander = Client::connect(&address);
    let p = bystander.alloc(64);
    bystander.write(p, &[2; 64]);
    for htod in [true, false] {
        let mut c = Client::connect(&address);
        let _lanes = c.open_lanes(&address, None);
        let (src, dst, size) = (DevPtr(0x1000), DevPtr(0x1000), 1 << 62);
        if htod {
            c.send(MemcpyHtoDLanes::Request { dst, size, stream: Stream::NULL, copy: 1 }, false);
        } else {
            c.send(MemcpyDtoHLanes::Request { src, size, stream: Stream::NULL, copy: 1 }, false);
        }
        let h = c.carrier.recv(&mut Vec::new()).unwrap();
        assert_eq!(h.status.get(), CuError::DEVICE_UNAVAILABLE.0, "the copy fails");
        assert!(c.carrier.recv(&mut Vec::new()).is_err(), "then the session ends");
    }
    assert_eq!(bystander.read(p, 64), vec![2; 64], "the bystander carries on");
}

/// A receipt for a chunk the server did not send, or sent and had answered
/// already, ends its session: the out slot it would free may be in use.
#[test]
fn a_receipt_for_no_chunk_in_flight_ends_its_session() {
    let address = start_server("lanes-receipt");
    let mut c = Client::connect(&address);
    let lanes = c.open_lanes(&address, None);
    let size = lanes.chunk * 3;
    let p = c.alloc(size);
    assert_eq!(lanes_dtoh(&mut c, &lanes, p, 1, size).1, CuError(0));
    lanes.lanes[0].send_chunk(&ChunkHeader::receipt(1, 0), &[]).unwrap();
    // More chunks than the lanes have slots, none read: the copy must wait
    // for receipts, and meets the closed lane instead.
    let more = lanes.chunk * 8 * lanes.lanes.len() as u64;
    let q = c.alloc(more);
    within_30_s(move || {
        c.send(MemcpyDtoHLanes::Request { src: q, size: more, stream: Stream::NULL, copy: 2 }, false);
        let h = c.carrier.recv(&mut Vec::new()).unwrap();
        assert_eq!(h.status.get(), CuError::DEVICE_UNAVAILABLE.0, "the next copy fails");
        assert!(c.carrier.recv(&mut Vec::new()).is_err(), "then the session ends");
        drop(lanes);
    });
}

/// A client of the protocol before `LANES_VERSION` is refused lanes (its
/// lanes would cut copies otherwise), and copies over its one connection
/// instead.
/// A guest of the previous protocol still gets lanes, and no frame it
/// would not understand: a long call it waits for is answered by its reply
/// alone, where a current guest hears heartbeats first.
#[test]
fn a_client_of_the_previous_protocol_gets_lanes_and_no_heartbeats() {
    let address = start_server("previous-protocol");
    for (version, heartbeats) in [(gpuplex_protocol::MIN_VERSION, false), (gpuplex_protocol::VERSION, true)] {
        let mut c = Client::connect_as(&address, None, version);
        let mut open = Header::request(Opcode::OpenLanes, 77, c.ctx.0, 0);
        open.version = version.into();
        c.carrier.send(&open, &[]).unwrap();
        let h = c.carrier.recv(&mut Vec::new()).unwrap();
        assert_eq!((h.request_id.get(), h.status.get()), (77, 0), "version {version} gets lanes");
        let sleep = c.function(LAUNCH_PTX, "sleep_ms");
        let payload = codec::encode(&launch(sleep, 1, 2000u32.to_le_bytes().to_vec()));
        c.next += 1;
        let mut header = Header::request(Opcode::Launch, c.next, c.ctx.0, payload.len()).from_thread(c.thread);
        header.version = version.into();
        c.carrier.send(&header, &payload).unwrap();
        let (reply, beats) = c.heartbeats_then_reply();
        assert_eq!((reply.request_id.get(), reply.status.get()), (c.next, 0));
        assert_eq!(beats > 0, heartbeats, "version {version}: {beats} heartbeats");
    }
}

/// A posted call that runs long holds up the call the guest then waits
/// for as surely as that call itself: the guest hears heartbeats meanwhile.
#[test]
fn a_long_posted_call_ahead_of_a_waited_one_is_covered_by_heartbeats() {
    let address = start_server("long-posted");
    let mut c = Client::connect(&address);
    let sleep = c.function(LAUNCH_PTX, "sleep_ms");
    c.post(launch(sleep, 1, 2500u32.to_le_bytes().to_vec()));
    // Long enough for the session to be running the launch before the
    // synchronize arrives.
    std::thread::sleep(Duration::from_millis(100));
    c.send(cuCtxSynchronize::Request {}, false);
    let (reply, beats) = c.heartbeats_then_reply();
    assert_eq!((reply.request_id.get(), reply.status.get()), (c.next, 0));
    assert!(beats > 0, "no heartbeat over 2.4 s of a posted launch");
}

/// The resident memory of this process (the in-process server's), in bytes.
fn resident() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap().trim().trim_end_matches(" kB").trim();
    kib.parse::<u64>().unwrap() << 10
}

/// A peer that announces a huge frame before saying who it is gets nothing
/// allocated for it: the opening frame may carry 64 KiB at most.
#[test]
fn an_opening_that_announces_a_huge_frame_is_refused_unread() {
    let address = start_server("huge-opening");
    let Address::Unix(path) = &*address else { unreachable!("a Unix server") };
    let before = resident();
    let peers: Vec<std::os::unix::net::UnixStream> = (0..8)
        .map(|_| {
            let mut peer = std::os::unix::net::UnixStream::connect(path).unwrap();
            let h = Header::request(Opcode::Hello, 1, 0, 64 << 20);
            peer.write_all(zerocopy::IntoBytes::as_bytes(&h)).unwrap();
            peer
        })
        .collect();
    for mut peer in peers {
        peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut rest = Vec::new();
        // The server hangs up at once.
        let _ = peer.read_to_end(&mut rest);
        assert!(rest.is_empty(), "a peer that never said hello got {} bytes", rest.len());
    }
    let grown = resident().saturating_sub(before);
    assert!(grown < 64 << 20, "eight huge openings grew the server by {} MiB", grown >> 20);
    Client::connect(&address).alloc(4096);
}

/// Peers that connect and say nothing hold a place in admission only for a
/// while, and only their own origin's places: guests from elsewhere get in
/// at once meanwhile.
#[test]
fn silent_peers_hold_no_one_else_out_and_are_dropped_in_time() {
    let right = token("the server's token, 32 bytes....");
    let server = in_process(Some(right.clone()));
    let tcp = gpuplex_transport::listen_with_keys(&"tcp:127.0.0.1:0".parse().unwrap(), server.keys()).unwrap();
    let tcp_address = tcp.address();
    let dir = std::env::temp_dir().join(format!("gpuplex-sessions-{}-silent", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let unix_address = Address::Unix(dir.join("s.sock"));
    let unix = gpuplex_transport::listen(&unix_address, None).unwrap();
    let both = server.clone();
    std::thread::spawn(move || both.serve(tcp.as_ref()));
    std::thread::spawn(move || server.serve(unix.as_ref()));
    let Address::Tcp(host_port) = &tcp_address else { unreachable!("a TCP listener") };
    // More silent peers from one host than it may have opening at once.
    let silent: Vec<std::net::TcpStream> = (0..300).map(|_| std::net::TcpStream::connect(host_port).unwrap()).collect();
    let start = Instant::now();
    let mut local = Client::connect(&unix_address);
    local.alloc(1 << 20);
    assert!(start.elapsed() < Duration::from_secs(2), "silent peers delayed a local guest: {:?}", start.elapsed());
    // Each silent peer is hung up on: at once past its origin's share,
    // within the opening's deadline otherwise.
    for mut peer in silent {
        peer.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut rest = Vec::new();
        assert!(peer.read_to_end(&mut rest).is_ok(), "a silent peer was not hung up on within 30 s");
    }
    assert!(start.elapsed() < Duration::from_secs(25), "silent peers held on for {:?}", start.elapsed());
    let _ = std::fs::remove_dir_all(&dir);
}
