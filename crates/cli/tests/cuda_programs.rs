//! End to end on the emulated backend: the driver-API test programs of
//! `tests/cuda`, built with nvcc against our own `libcuda.so`, and the
//! runtime-API programs of `tests/cuda/runtime`, built by nvcc with the
//! static and with the shared CUDA runtime, run through
//! `gpuplex run --backend emulated`, with their stdout compared against
//! `tests/cuda/expected`. Also: a killed client's memory comes back,
//! garbage on the server's socket harms no other client, and programs run
//! over TCP with the server's token, and not without it.
//!
//! Needs nvcc (`GPUPLEX_NVCC_DIR`, else `scripts/install-nvcc.sh`'s install,
//! else PATH); without it the tests say so and pass, unless
//! `GPUPLEX_REQUIRE_NVCC=1`. Needs the front-end built next to the `gpuplex`
//! binary (`cargo build` of the workspace).

mod common;

use common::*;

use std::fs;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

/// Runs one program on an embedded emulated server, checks its stdout
/// against its expected file if it has one, and returns the stdout.
fn check_program(name: &str) -> Option<String> {
    let _serial = serial();
    let dir = programs()?;
    let out = run_to_end(run_command(dir, None, &[name])).stdout;
    assert!(out.ends_with("done\n"), "{name} did not finish its output:\n{out}");
    let expected = repo_root().join(format!("tests/cuda/expected/{name}.txt"));
    if let Ok(want) = fs::read_to_string(&expected) {
        assert!(out == want, "{name}: stdout differs from {}:\n{}", expected.display(), diff(&want, &out));
    }
    Some(out)
}

macro_rules! program_tests {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            check_program(stringify!($name));
        }
    )*};
}

program_tests!(
    vector_add,
    copies,
    memsets,
    streams_events,
    module_globals,
    mixed_params,
    module_formats,
    contexts,
    expected_errors,
    queries,
    vmm,
    attributes,
    graphs,
    pools,
    arrays,
    graph_nodes,
    graph_memory,
    tensor_maps,
    pointers,
);

/// `gpuplex run --trace`'s table, as `(calls, errors, waited, posted)` by function.
fn trace_table(stderr: &str) -> std::collections::HashMap<String, [u64; 4]> {
    let table = stderr.split_once("trace: CUDA driver calls").expect("a trace table on stderr").1;
    let mut rows = std::collections::HashMap::new();
    for line in table.lines().skip(2) {
        let cells: Vec<&str> = line.split_whitespace().collect();
        let Some(counts) = cells.get(1..5).and_then(|c| c.iter().map(|n| n.parse().ok()).collect::<Option<Vec<u64>>>())
        else {
            continue;
        };
        rows.insert(cells[0].to_owned(), [counts[0], counts[1], counts[2], counts[3]]);
    }
    rows
}

/// The questions `queries` asks a thousand times each are answered by the
/// front-end after the first; the same limit set again before each launch
/// goes nowhere; launches within a raised shared memory limit are posted.
/// The trace table shows it, and its stdout that every answer was right.
#[test]
fn repeated_questions_wait_for_the_server_once() {
    let _serial = serial();
    let Some(dir) = programs() else { return };
    let mut cmd = Command::new(gpuplex());
    cmd.args(["run", "--backend", "emulated", "--trace", "--"]).arg(dir.join("queries"));
    let done = run_to_end(cmd);
    let rows = trace_table(&done.stderr);
    let row = |name: &str| *rows.get(name).unwrap_or_else(|| panic!("no {name} in the trace:\n{}", done.stderr));
    for (name, asked, waits) in [
        ("cuCtxGetDevice", 1001, 2),
        ("cuDevicePrimaryCtxGetState", 1002, 3),
        ("cuModuleGetFunction", 1001, 1),
        ("cuOccupancyMaxActiveBlocksPerMultiprocessor", 1001, 1),
        // The launches' own questions about the limit are theirs, not these.
        ("cuFuncGetAttribute", 2004, 4),
        // The first raise, the 100 repeats of it answered here, the lowering.
        ("cuFuncSetAttribute", 102, 2),
        // Before a capture, during it, after it.
        ("cuStreamIsCapturing", 1002, 3),
    ] {
        let [calls, errors, waited, _] = row(name);
        assert_eq!((calls, errors), (asked, 0), "{name}:\n{}", done.stderr);
        assert!(waited <= waits, "{name} waited {waited} times, want at most {waits}:\n{}", done.stderr);
    }
    let [calls, errors, waited, posted] = row("cuLaunchKernel");
    assert_eq!((calls, errors), (104, 3), "the three refused launches fail:\n{}", done.stderr);
    assert!(posted >= 100 && waited <= 6, "launches: {posted} posted, {waited} waited:\n{}", done.stderr);
}

/// What frameworks repeat at every step waits for nothing: a child graph
/// set again into an executable graph (XLA's nested command buffers), a
/// tensor map encoded again, copies, a memset and a pointer question inside
/// a virtual-memory mapping (XLA's allocator), pointer questions about
/// memory the process knows or mapped itself. Each program's stdout is
/// checked by its own test.
#[test]
fn what_frameworks_repeat_does_not_wait() {
    let _serial = serial();
    let Some(dir) = programs() else { return };
    for (program, name, calls, waits) in [
        // The first set, the set after the child's memset changed, the one
        // refused once the child has a node more; three repeats posted.
        ("graph_nodes", "cuGraphExecChildGraphNodeSetParams", 6, 3),
        // Two maps, one of them again; four refused, one checked here.
        ("tensor_maps", "cuTensorMapEncodeTiled", 7, 5),
        ("vmm", "cuMemcpyHtoDAsync_v2", 1, 0),
        ("vmm", "cuMemsetD32Async", 1, 0),
        ("vmm", "cuPointerGetAttribute", 1, 0),
        // Of the frequent questions only the context's device is asked of
        // the server, once; of the rare ones each device allocation's pool
        // and mapping, once a call (six calls).
        ("pointers", "cuPointerGetAttributes", 14, 7),
    ] {
        let mut cmd = Command::new(gpuplex());
        cmd.args(["run", "--backend", "emulated", "--trace", "--"]).arg(dir.join(program));
        let done = run_to_end(cmd);
        let rows = trace_table(&done.stderr);
        let [n, _, waited, _] = *rows.get(name).unwrap_or_else(|| panic!("no {name} in the trace:\n{}", done.stderr));
        assert_eq!(n, calls, "{program}: {name}:\n{}", done.stderr);
        assert_eq!(waited, waits, "{program}: {name} waited {waited} times:\n{}", done.stderr);
    }
}

/// Device-dependent: checked for shape only.
#[test]
fn device_query() {
    let Some(out) = check_program("device_query") else {
        return;
    };
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.contains(&"devices: 1"), "want one device:\n{out}");
    let attrs: Vec<&str> = lines.iter().copied().filter(|l| l.starts_with("attr ")).collect();
    assert_eq!(attrs.len(), 148, "want attribute ids 0..=147:\n{out}");
    for (id, line) in attrs.iter().enumerate() {
        let rest = line.strip_prefix(&format!("attr {id}: rc=")).unwrap_or_else(|| panic!("attribute {id}: {line}"));
        let (rc, value) = rest.split_once(" value=").unwrap_or_else(|| panic!("attribute {id}: {line}"));
        assert!(rc.parse::<u32>().is_ok() && value.parse::<i32>().is_ok(), "attribute {id}: {line}");
    }
    assert!(lines.contains(&"bad device 99: CUDA_ERROR_INVALID_DEVICE"), "{out}");
    assert!(lines.contains(&"bad attribute 9999: CUDA_ERROR_INVALID_VALUE"), "{out}");
}

/// The runtime-API programs (`tests/cuda/runtime`) that cannot work on the
/// emulated device yet, and why. They are built and run all the same, and
/// must fail cleanly: a CHECK line on stderr and exit status 1, no hang, no
/// crash. Everything else there runs in `rt` below, static and shared.
const RUNTIME_UNSUPPORTED: &[(&str, &str)] = &[
    ("managed_kernels", "its kernels reach __managed__ variables by name; the emulated device runs reference kernels"),
    ("ipc", "its child process maps the parent's memory, which one worker's emulated device cannot reach in another's"),
    ("host_flag", "its kernel waits for the host while the program runs on; the emulated device runs a kernel to its end at launch"),
];

/// Runs `runtime/NAME.LINKAGE` (LINKAGE: `static` or `shared` cudart) on an
/// embedded emulated server and checks its stdout against
/// `expected/runtime/NAME.txt`.
fn check_runtime_program(name: &str, linkage: &str) {
    let _serial = serial();
    let Some(dir) = programs() else { return };
    let program = format!("{name}.{linkage}");
    let out = run_to_end(run_command(&dir.join("runtime"), None, &[&program])).stdout;
    let expected = repo_root().join(format!("tests/cuda/expected/runtime/{name}.txt"));
    let want = fs::read_to_string(&expected).unwrap_or_else(|e| panic!("{}: {e}", expected.display()));
    assert!(out == want, "{program}: stdout differs from {}:\n{}", expected.display(), diff(&want, &out));
}

/// The runtime-API programs, each as `rt::NAME::static_cudart` and
/// `rt::NAME::shared_cudart`.
macro_rules! runtime_tests {
    ($($name:ident),* $(,)?) => {
        mod rt {
            /// Every program of tests/cuda/runtime.
            pub const TESTED: &[&str] = &[$(stringify!($name)),*];
            $(
                mod $name {
                    #[test]
                    fn static_cudart() {
                        super::super::check_runtime_program(stringify!($name), "static");
                    }

                    #[test]
                    fn shared_cudart() {
                        super::super::check_runtime_program(stringify!($name), "shared");
                    }
                }
            )*
        }
    };
}

runtime_tests!(
    vector_add,
    matrix_mul,
    streams_overlap,
    async_events,
    templates,
    atomics,
    occupancy,
    callbacks,
    multithreaded,
    runtime_api,
    zero_copy,
    managed_alloc,
    managed,
    graph_pageable,
    graph_conditional,
    stream_ordered,
    textures,
    batch_copies,
    user_objects,
    pinned_readback,
);

/// No program of tests/cuda/runtime is forgotten: each is tested, or listed
/// in RUNTIME_UNSUPPORTED; and each tested one has its expected output.
#[test]
fn runtime_programs_are_all_covered() {
    let dir = repo_root().join("tests/cuda/runtime");
    let mut found: Vec<String> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_suffix(".cu").map(str::to_owned))
        .collect();
    found.sort();
    let mut listed: Vec<String> =
        rt::TESTED.iter().chain(RUNTIME_UNSUPPORTED.iter().map(|(n, _)| n)).map(|n| n.to_string()).collect();
    listed.sort();
    assert_eq!(found, listed, "tests/cuda/runtime against rt::TESTED + RUNTIME_UNSUPPORTED");
    for name in rt::TESTED {
        let expected = repo_root().join(format!("tests/cuda/expected/runtime/{name}.txt"));
        assert!(expected.is_file(), "{name} has no {}", expected.display());
    }
}

/// The programs of RUNTIME_UNSUPPORTED fail, cleanly; one that passes
/// belongs in `runtime_tests!` now.
#[test]
fn runtime_unsupported_programs_fail_cleanly() {
    let _serial = serial();
    let Some(dir) = programs() else { return };
    for (name, why) in RUNTIME_UNSUPPORTED {
        for linkage in ["static", "shared"] {
            let program = format!("{name}.{linkage}");
            let cmd = run_command(&dir.join("runtime"), None, &[&program]);
            let done = Running::spawn(cmd).finish(PROGRAM_TIMEOUT).unwrap_or_else(|e| panic!("{program}: {e}"));
            assert!(
                !done.status.success(),
                "{program} now passes on the emulated device ({why}): move it from RUNTIME_UNSUPPORTED to \
                 runtime_tests! and give it tests/cuda/expected/runtime/{name}.txt\nstdout:\n{}",
                done.stdout
            );
            assert!(
                done.status.code() == Some(1) && done.stderr.contains(" failed: "),
                "{program} should fail at a CHECK with exit status 1 ({why}), got {}\nstderr:\n{}",
                done.status,
                done.stderr
            );
        }
    }
}

/// Each guest's memory is its worker's (the emulated device of one worker
/// is not another's), so what the server counts for the tenant tells.
#[test]
fn killed_client_memory_comes_back() {
    let _serial = serial();
    let Some(dir) = programs() else { return };
    let server = Server::start("cleanup");
    let held = || -> u64 {
        let status = server.status();
        status["tenants"].as_array().unwrap().iter().map(|t| t["memory_used"].as_u64().unwrap()).sum()
    };
    let mut holder = Running::spawn(server.run(dir, &["hold_memory", "512"]));
    holder.wait_for_line("holding", Duration::from_secs(30)).unwrap();
    assert!(held() >= 512 * MIB, "holding 512 MiB: the server counts {}", held());

    holder.kill();
    let killed = Instant::now();
    while held() != 0 {
        assert!(killed.elapsed() < Duration::from_secs(1), "1 s after SIGKILL the server counts {} held", held());
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn garbage_on_the_socket_harms_no_one() {
    let _serial = serial();
    let Some(dir) = programs() else { return };
    let server = Server::start("garbage");
    let mut long = Running::spawn(server.run(dir, &["copies"]));
    long.wait_for_line("size=", PROGRAM_TIMEOUT).unwrap();

    let mut garbage = vec![0u8; 4096];
    fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut garbage)).expect("random bytes");
    let mut intruder = UnixStream::connect(&server.socket).expect("connect");
    // The server may hang up at any point: that is fine, as is silence.
    let _ = intruder.write_all(&garbage);
    let _ = intruder.set_read_timeout(Some(Duration::from_secs(1)));
    let _ = intruder.read(&mut [0u8; 4096]);
    drop(intruder);

    let done = long.finish(PROGRAM_TIMEOUT).expect("copies finishes");
    assert!(done.status.success(), "copies: {}\n{}", done.status, done.stderr);
    let want = fs::read_to_string(repo_root().join("tests/cuda/expected/copies.txt")).expect("expected/copies.txt");
    assert!(done.stdout == want, "copies beside garbage:\n{}", diff(&want, &done.stdout));
    server.mem_info(dir);
}

#[test]
fn programs_run_over_tcp_with_the_token() {
    let _serial = serial();
    let Some(dir) = programs() else { return };
    let server = TcpServer::start();
    // memsets: those of pinned memory, which the server cannot reach, are
    // done by the front-end in their stream's order. zero_copy: kernels
    // read and write pinned memory through its device address, a block of
    // the server's kept in step with it. graphs, graph_nodes and
    // graph_pageable: a graph's copies of the program's memory, captured
    // or as nodes, go through such blocks too. pinned_readback and
    // callbacks: asynchronous copies into pinned memory are posted, and
    // their bytes reach the program before it can look.
    for (program, expected) in [
        ("copies", "copies.txt"),
        ("memsets", "memsets.txt"),
        ("graphs", "graphs.txt"),
        ("graph_nodes", "graph_nodes.txt"),
        ("runtime/vector_add.shared", "runtime/vector_add.txt"),
        ("runtime/zero_copy.static", "runtime/zero_copy.txt"),
        ("runtime/graph_pageable.static", "runtime/graph_pageable.txt"),
        ("runtime/pinned_readback.static", "runtime/pinned_readback.txt"),
        ("runtime/callbacks.shared", "runtime/callbacks.txt"),
    ] {
        let out = run_to_end(server.run(Some(&server.token), &dir.join(program))).stdout;
        let want = fs::read_to_string(repo_root().join("tests/cuda/expected").join(expected)).expect("expected");
        assert!(out == want, "{program} over TCP:\n{}", diff(&want, &out));
    }
}

/// A guest in a virtual machine, played by a process here that maps the
/// server's region file as a guest maps its device: each program in a slot
/// of its own, the host functions of `user_objects` in another.
#[test]
fn programs_run_over_the_vm_carrier() {
    let _serial = serial();
    let Some(dir) = programs() else { return };
    // Where QEMU's would be: memory, not a disk, backs the region.
    let shm = Path::new("/dev/shm");
    let at = if shm.is_dir() { shm.to_owned() } else { std::env::temp_dir() };
    let region = at.join(format!("gpuplex-test-vm-{}", std::process::id()));
    let address = format!("vm:{}", region.display());
    let server = Server::start_with("vm", &["--listen", &address]);
    // The region is made beside the socket: wait for its header.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !fs::read(&region).is_ok_and(|b| b.starts_with(b"gpuplxvm")) {
        assert!(Instant::now() < deadline, "no VM region at {}", region.display());
        thread::sleep(Duration::from_millis(20));
    }
    // Pinned memory lies in the region's heap: copies from it and kernels
    // reading it through its device pointer (zero_copy), a graph capturing
    // a copy from it (graphs); pageable copies pass its staging slots;
    // managed memory and `__managed__` variables are mirrored there too.
    for (program, expected) in [
        ("streams_events", "streams_events.txt"),
        ("copies", "copies.txt"),
        ("graphs", "graphs.txt"),
        ("runtime/vector_add.static", "runtime/vector_add.txt"),
        ("runtime/zero_copy.static", "runtime/zero_copy.txt"),
        ("runtime/managed_alloc.shared", "runtime/managed_alloc.txt"),
        ("runtime/managed.static", "runtime/managed.txt"),
        ("runtime/user_objects.shared", "runtime/user_objects.txt"),
    ] {
        let mut run = Command::new(gpuplex());
        run.args(["run", "--server", &address, "--"]).arg(dir.join(program));
        let done = run_to_end(run);
        let want = fs::read_to_string(repo_root().join("tests/cuda/expected").join(expected)).expect("expected");
        assert!(done.stdout == want, "{program} over the VM carrier:\n{}", diff(&want, &done.stdout));
        // The runtime's calls at exit still reach the server.
        assert!(!done.stderr.contains("lost the gpuplex server"), "{program}:\n{}", done.stderr);
    }
    assert!(server.log().contains("tenant=vm:gpuplex-test-vm-"), "a VM's sessions are its tenant's:\n{}", server.log());
    drop(server);
    let _ = fs::remove_file(&region);
}

/// Needs no nvcc: every refusal comes before the program would start.
#[test]
fn tcp_without_the_right_token_is_refused_clearly() {
    let _serial = serial();
    let server = TcpServer::start();
    let never_run = Path::new("/bin/false");
    let wrong = token_file("wrong", "not the token the server holds..");
    for (token, says) in
        [(None, "a TCP server needs its token"), (Some(wrong.as_path()), "the server refused our token")]
    {
        let done = Running::spawn(server.run(token, never_run)).finish(PROGRAM_TIMEOUT).expect("run ends");
        assert!(!done.status.success(), "run with token {token:?} succeeded");
        assert!(done.stderr.contains(says), "run with token {token:?}: want {says:?} in:\n{}", done.stderr);
    }

    let mut info = Command::new(gpuplex());
    info.args(["info", "--server", &server.address, "--token-file"]).arg(&server.token);
    let out = run_to_end(info).stdout;
    assert!(out.contains("backend  emulated"), "info over TCP:\n{out}");

    let mut open = Command::new(gpuplex());
    open.args(["serve", "--backend", "emulated", "--listen", "tcp:127.0.0.1:0"]);
    let done = Running::spawn(open).finish(PROGRAM_TIMEOUT).expect("serve ends");
    assert!(!done.status.success() && done.stderr.contains("needs a token"), "serve without a token:\n{}", done.stderr);
}
