//! Sessions against a live server on the emulated backend: isolation,
//! cleanup of vanished clients, hostile input on the wire, TCP peers that
//! cannot prove the token, posted calls and their deferred errors, older
//! protocol versions, heartbeats, and openings that announce too much or
//! say nothing.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use gpuplex_protocol::calls::*;
use gpuplex_protocol::{
    codec, Ctx, CuError, DevPtr, Event, Func, Header, Hello, Module, Opcode, Seq, SessionSummary, Stream,
};
use gpuplex_transport::{Address, AuthError, TransportError};

mod common;

use common::*;

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

/// A link is checked as a whole before the driver sees it: every option
/// one that is passed on, with its value; every input of a known type, with
/// its size inside the data and the data used up.
#[test]
fn a_link_s_options_and_inputs_are_checked() {
    let address = start_server("link");
    let mut c = Client::connect(&address);
    let ptx = include_bytes!("../testdata/kernels.ptx").to_vec();
    let link = |options: Vec<u32>, values: Vec<u64>, kinds: Vec<u32>, sizes: Vec<u64>, data: &[u8]| Link::Request {
        options: Seq(options),
        values: Seq(values),
        kinds: Seq(kinds),
        sizes: Seq(sizes),
        data: data.to_vec(),
    };
    let n = ptx.len() as u64;
    let linked = c.call(link(vec![7], vec![3], vec![1], vec![n], &ptx)).unwrap();
    assert_eq!(linked.status, 0);
    let hmod = c.module(linked.cubin);
    assert_eq!(c.call(cuModuleGetFunctionCount::Request { hmod }).unwrap().count, 3);

    let refused = c.call(link(vec![], vec![], vec![1], vec![4], b"junk")).unwrap();
    assert_eq!((refused.status, refused.errorLog.is_empty()), (CuError::INVALID_IMAGE.0, false));
    let invalid = CuError::INVALID_VALUE;
    assert_eq!(err(c.call(link(vec![3], vec![0], vec![1], vec![n], &ptx))), invalid, "a log buffer is the server's");
    assert_eq!(err(c.call(link(vec![7], vec![], vec![1], vec![n], &ptx))), invalid, "an option without its value");
    assert_eq!(err(c.call(link(vec![], vec![], vec![9], vec![n], &ptx))), invalid, "no such input type");
    assert_eq!(err(c.call(link(vec![], vec![], vec![1], vec![n + 1], &ptx))), invalid, "a size past the data");
    assert_eq!(err(c.call(link(vec![], vec![], vec![1, 1], vec![n, 0], &ptx))), invalid, "an empty input");
    assert_eq!(err(c.call(link(vec![], vec![], vec![1], vec![n - 1], &ptx))), invalid, "data left over");
    assert_eq!(err(c.call(link(vec![], vec![], vec![], vec![], &[]))), invalid, "nothing to link");
    let many = vec![1; 5000];
    assert_eq!(err(c.call(link(vec![], vec![], many.clone(), vec![1; 5000], &[b'x'; 5000]))), invalid);
    assert_eq!(
        c.call(link(vec![], vec![], vec![1, 1], vec![n, n], &[ptx.clone(), ptx].concat())).unwrap().status,
        CuError::NOT_SUPPORTED.0,
        "the test device links one input"
    );
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
