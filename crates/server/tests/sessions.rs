//! Sessions against a live server on the emulated backend: isolation,
//! cleanup of vanished clients, hostile input on the wire, and TCP peers
//! that cannot prove the token.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuplex_protocol::calls::*;
use gpuplex_protocol::{
    codec, Call, Ctx, CuError, DevPtr, Func, Header, Hello, Module, Opcode, ServerSummary, SessionSummary, Stream,
    Welcome,
};
use gpuplex_server::backend::emulated::Emulated;
use gpuplex_server::Server;
use gpuplex_transport::{Address, AuthError, Carrier, Token, TransportError};
use proptest::prelude::*;

/// A server on its own socket, for the life of one test.
fn start_server(name: &str) -> Address {
    let dir = std::env::temp_dir().join(format!("gpuplex-sessions-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let address = Address::Unix(PathBuf::from(&dir).join("s.sock"));
    let listener = gpuplex_transport::listen(&address, None).unwrap();
    let server = Server::new(Arc::new(Emulated::new()));
    std::thread::spawn(move || server.serve(listener.as_ref()));
    address
}

fn token(s: &str) -> Token {
    Token::new(s.as_bytes()).unwrap()
}

/// A server on a free loopback port, admitting peers by `token`.
fn start_tcp_server(token: Token) -> Address {
    let listener = gpuplex_transport::listen(&"tcp:127.0.0.1:0".parse().unwrap(), Some(token)).unwrap();
    let address = listener.address();
    let server = Server::new(Arc::new(Emulated::new()));
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
        let mut carrier = gpuplex_transport::connect(address, token).unwrap();
        let hello = codec::encode(&Hello { pid: 1, program: "test".into() });
        carrier.send(&Header::request(Opcode::Hello, 1, 0, hello.len()), &hello).unwrap();
        let mut buf = Vec::new();
        carrier.recv(&mut buf).unwrap();
        let welcome: Welcome = codec::decode(&buf).unwrap();
        assert_eq!(welcome.backend, "emulated");
        let mut c = Client { carrier, next: 2, ctx: Ctx(0), thread: 1 };
        c.ctx = c.call(cuDevicePrimaryCtxRetain::Request { dev: 0 }).unwrap().pctx;
        c
    }

    fn call<C: Call>(&mut self, req: C) -> Result<C::Reply, CuError> {
        let payload = codec::encode(&req);
        self.next += 1;
        let header = Header::request(C::OPCODE, self.next, self.ctx.0, payload.len()).from_thread(self.thread);
        self.carrier.send(&header, &payload).unwrap();
        let mut buf = Vec::new();
        let h = self.carrier.recv(&mut buf).unwrap();
        assert_eq!(h.request_id.get(), self.next);
        CuError::check(h.status.get())?;
        Ok(codec::decode(&buf).unwrap())
    }

    fn alloc(&mut self, n: u64) -> DevPtr {
        self.call(cuMemAlloc_v2::Request { bytesize: n }).unwrap().dptr
    }

    fn free_memory(&mut self) -> u64 {
        self.call(cuMemGetInfo_v2::Request {}).unwrap().free
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
    let Address::Unix(path) = &address else { unreachable!("a Unix server") };
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

#[test]
fn module_functions_are_the_handles_get_function_gives() {
    let address = start_server("modfuncs");
    let mut c = Client::connect(&address);
    let ptx = include_bytes!("../src/backend/emulated/testdata/kernels.ptx").to_vec();
    let hmod = c.call(ModuleLoad::Request { digest: gpuplex_protocol::image_digest(&ptx), image: ptx }).unwrap().module;
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    /// Any opcode with any payload ends in an answer or a closed session,
    /// and the server keeps serving others.
    #[test]
    fn random_frames_never_hurt_the_server(op in 0u16..0x700, payload in proptest::collection::vec(any::<u8>(), 0..256)) {
        static SERVER: std::sync::OnceLock<Address> = std::sync::OnceLock::new();
        let address = SERVER.get_or_init(|| start_server("fuzz"));
        let mut c = Client::connect(address);
        let mut h = Header::request(Opcode::Hello, 9, c.ctx.0, payload.len());
        h.opcode = op.into();
        let _ = c.carrier.send(&h, &payload);
        let _ = c.carrier.recv(&mut Vec::new());
        let mut other = Client::connect(address);
        prop_assert!(other.free_memory() > 0);
    }
}
