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

use std::env;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

const PROGRAM_TIMEOUT: Duration = Duration::from_secs(120);
const MIB: u64 = 1 << 20;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn gpuplex() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpuplex"))
}

/// Tests run one at a time: they start servers and measure free memory.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The directory holding nvcc, if there is one.
fn nvcc_dir() -> Option<PathBuf> {
    if let Some(dir) = env::var_os("GPUPLEX_NVCC_DIR") {
        let dir = PathBuf::from(dir);
        assert!(dir.join("nvcc").is_file(), "GPUPLEX_NVCC_DIR={} holds no nvcc", dir.display());
        return Some(dir);
    }
    // scripts/install-nvcc.sh: .cache/nvcc/lib/pythonX.Y/site-packages/nvidia/cu13/bin
    let lib = repo_root().join(".cache/nvcc/lib");
    let installed =
        fs::read_dir(lib).into_iter().flatten().flatten().map(|e| e.path().join("site-packages/nvidia/cu13/bin"));
    let on_path = env::var_os("PATH").into_iter().flat_map(|p| env::split_paths(&p).collect::<Vec<_>>());
    installed.chain(on_path).find(|dir| dir.join("nvcc").is_file())
}

/// The built programs, or None (the test is skipped) without nvcc.
fn programs() -> Option<&'static Path> {
    static BUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let Some(nvcc) = nvcc_dir() else {
            assert!(
                env::var("GPUPLEX_REQUIRE_NVCC").as_deref() != Ok("1"),
                "nvcc not installed and GPUPLEX_REQUIRE_NVCC=1 (run scripts/install-nvcc.sh)"
            );
            return None;
        };
        let libdir = common::frontend_dir();
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cuda-programs");
        let path =
            env::join_paths([nvcc].into_iter().chain(env::split_paths(&env::var_os("PATH").unwrap_or_default())))
                .expect("PATH entries without separators");
        let build = Command::new("bash")
            .arg(repo_root().join("scripts/build-cuda-tests.sh"))
            .arg(&out)
            .arg(&libdir)
            .env("PATH", path)
            .output()
            .expect("bash runs");
        assert!(
            build.status.success(),
            "scripts/build-cuda-tests.sh failed:\n{}{}",
            String::from_utf8_lossy(&build.stdout),
            String::from_utf8_lossy(&build.stderr)
        );
        Some(out)
    });
    if built.is_none() {
        println!("skipped: nvcc not installed (run scripts/install-nvcc.sh)");
    }
    built.as_deref()
}

/// SIGKILL to the process group led by `pid` (every child is started as one).
fn kill_group(pid: u32) {
    // SAFETY: kill(2) takes no pointers; a negative pid names the group we created.
    unsafe {
        libc::kill(-(pid as i32), libc::SIGKILL);
    }
}

/// A child in its own process group whose output is collected as it comes.
struct Running {
    child: Child,
    stdout: Receiver<String>,
    stderr: Receiver<String>,
    seen: String,
}

struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Running {
    fn spawn(mut cmd: Command) -> Running {
        // No server a developer has running may be picked up by accident.
        let runtime = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("xdg-runtime");
        fs::create_dir_all(&runtime).expect("create runtime dir");
        cmd.env_remove("GPUPLEX_SERVER").env_remove("GPUPLEX_TOKEN_FILE").env("XDG_RUNTIME_DIR", runtime);
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let mut out = BufReader::new(child.stdout.take().expect("piped"));
        let mut err = child.stderr.take().expect("piped");
        let (out_tx, stdout) = mpsc::channel();
        let (err_tx, stderr) = mpsc::channel();
        thread::spawn(move || loop {
            let mut line = Vec::new();
            match out.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if out_tx.send(String::from_utf8_lossy(&line).into_owned()).is_err() {
                        break;
                    }
                }
            }
        });
        thread::spawn(move || {
            let mut text = Vec::new();
            let _ = err.read_to_end(&mut text);
            let _ = err_tx.send(String::from_utf8_lossy(&text).into_owned());
        });
        Running { child, stdout, stderr, seen: String::new() }
    }

    /// Waits for a stdout line starting with `prefix`.
    fn wait_for_line(&mut self, prefix: &str, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.stdout.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => {
                    self.seen.push_str(&line);
                    if line.starts_with(prefix) {
                        return Ok(());
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!("no line {prefix:?} within {timeout:?}; stdout: {:?}", self.seen))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(format!("stdout closed before a line {prefix:?}; stdout: {:?}", self.seen))
                }
            }
        }
    }

    /// Waits for the exit, killing the process group after `timeout`.
    fn finish(mut self, timeout: Duration) -> Result<Finished, String> {
        let deadline = Instant::now() + timeout;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(10)),
                _ => {
                    self.kill();
                    return Err(format!("killed after {timeout:?}; stdout: {:?}", self.drain()));
                }
            }
        };
        let stdout = self.drain();
        let stderr = self.stderr.recv_timeout(Duration::from_secs(5)).unwrap_or_default();
        Ok(Finished { status, stdout, stderr })
    }

    /// The rest of stdout, waiting a little for a pipe that another process
    /// of the group may still hold.
    fn drain(&mut self) -> String {
        let until = Instant::now() + Duration::from_secs(5);
        while let Ok(line) = self.stdout.recv_timeout(until.saturating_duration_since(Instant::now())) {
            self.seen.push_str(&line);
        }
        std::mem::take(&mut self.seen)
    }

    fn kill(&mut self) {
        kill_group(self.child.id());
        let _ = self.child.wait();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

/// `gpuplex run [--server ADDR | --backend emulated] -- PROG ARGS`.
fn run_command(dir: &Path, server: Option<&Path>, args: &[&str]) -> Command {
    let mut cmd = Command::new(gpuplex());
    cmd.arg("run");
    match server {
        Some(socket) => cmd.arg("--server").arg(format!("unix:{}", socket.display())),
        None => cmd.args(["--backend", "emulated"]),
    };
    cmd.arg("--").arg(dir.join(args[0])).args(&args[1..]);
    cmd
}

fn run_to_end(cmd: Command) -> Finished {
    let what = format!("{cmd:?}");
    let done = Running::spawn(cmd).finish(PROGRAM_TIMEOUT).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(done.status.success(), "{what}: {}\nstdout:\n{}\nstderr:\n{}", done.status, done.stdout, done.stderr);
    done
}

/// A unified-style diff of two texts, by lines, with three lines of context.
fn diff(expected: &str, actual: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), actual.lines().collect());
    // lcs[i][j]: longest common subsequence of a[i..] and b[j..].
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    let mut ops = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            ops.push((' ', a[i]));
            (i, j) = (i + 1, j + 1);
        } else if j < b.len() && (i == a.len() || lcs[i][j + 1] >= lcs[i + 1][j]) {
            ops.push(('+', b[j]));
            j += 1;
        } else {
            ops.push(('-', a[i]));
            i += 1;
        }
    }
    let near_change = |k: usize| ops[k.saturating_sub(3)..(k + 4).min(ops.len())].iter().any(|op| op.0 != ' ');
    let mut text = String::from("--- expected\n+++ actual\n");
    let mut skipped = false;
    for (k, (mark, line)) in ops.iter().enumerate() {
        if near_change(k) {
            text.push_str(&format!("{mark}{line}\n"));
            skipped = false;
        } else if !skipped {
            text.push_str("@@\n");
            skipped = true;
        }
    }
    text
}

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
);

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
const RUNTIME_UNSUPPORTED: &[(&str, &str)] =
    &[("managed", "managed memory (cudaMallocManaged, __managed__) is not implemented by gpuplex")];

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

/// `gpuplex serve --backend emulated` on a private socket, killed on drop.
struct Server {
    _process: Running,
    socket: PathBuf,
}

impl Server {
    fn start(tag: &str) -> Server {
        // Socket paths are short (108 bytes): keep it in /tmp, not in target/.
        let socket = env::temp_dir().join(format!("gpuplex-test-{}-{tag}.sock", std::process::id()));
        let _ = fs::remove_file(&socket);
        let mut cmd = Command::new(gpuplex());
        cmd.args(["serve", "--backend", "emulated", "--listen"]).arg(format!("unix:{}", socket.display()));
        let process = Running::spawn(cmd);
        let deadline = Instant::now() + Duration::from_secs(10);
        while UnixStream::connect(&socket).is_err() {
            assert!(Instant::now() < deadline, "server did not listen on {} within 10 s", socket.display());
            thread::sleep(Duration::from_millis(20));
        }
        Server { _process: process, socket }
    }

    fn run(&self, dir: &Path, args: &[&str]) -> Command {
        run_command(dir, Some(&self.socket), args)
    }

    /// `(free, total)` as mem_info reports them through this server.
    fn mem_info(&self, dir: &Path) -> (u64, u64) {
        let out = run_to_end(self.run(dir, &["mem_info"])).stdout;
        let words: Vec<&str> = out.split_whitespace().collect();
        match words[..] {
            ["free", free, "total", total] => (free.parse().expect("free"), total.parse().expect("total")),
            _ => panic!("unexpected mem_info output: {out:?}"),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.socket);
    }
}

#[test]
fn killed_client_memory_comes_back() {
    let _serial = serial();
    let Some(dir) = programs() else { return };
    let server = Server::start("cleanup");
    let before = server.mem_info(dir);

    let mut holder = Running::spawn(server.run(dir, &["hold_memory", "512"]));
    holder.wait_for_line("holding", Duration::from_secs(30)).unwrap();
    let during = server.mem_info(dir);
    assert!(during.0 + 512 * MIB <= before.0, "holding 512 MiB: free {} -> {}", before.0, during.0);

    holder.kill();
    let killed = Instant::now();
    loop {
        let now = server.mem_info(dir);
        if now == before {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(1),
            "1 s after SIGKILL: free {} total {}, want {before:?}",
            now.0,
            now.1
        );
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

/// A private token file in the test's directory.
fn token_file(name: &str, secret: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}.token", std::process::id()));
    fs::write(&path, format!("{secret}\n")).expect("write token");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod token");
    path
}

/// `gpuplex serve --backend emulated --listen tcp:127.0.0.1:PORT --token-file F`,
/// killed on drop.
struct TcpServer {
    _process: Running,
    address: String,
    token: PathBuf,
}

impl TcpServer {
    fn start() -> TcpServer {
        let token = token_file("server", "a test token of thirty-two bytes");
        // A port that was free a moment ago.
        let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
        let address = format!("tcp:127.0.0.1:{port}");
        let mut cmd = Command::new(gpuplex());
        cmd.args(["serve", "--backend", "emulated", "--listen", &address, "--token-file"]).arg(&token);
        let process = Running::spawn(cmd);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "server did not listen on {address} within 10 s");
            thread::sleep(Duration::from_millis(20));
        }
        TcpServer { _process: process, address, token }
    }

    /// `gpuplex run --server tcp:... [--token-file F] -- PROGRAM`.
    fn run(&self, token: Option<&Path>, program: &Path) -> Command {
        let mut cmd = Command::new(gpuplex());
        cmd.args(["run", "--server", &self.address]);
        if let Some(token) = token {
            cmd.arg("--token-file").arg(token);
        }
        cmd.arg("--").arg(program);
        cmd
    }
}

#[test]
fn programs_run_over_tcp_with_the_token() {
    let _serial = serial();
    let Some(dir) = programs() else { return };
    let server = TcpServer::start();
    for (program, expected) in [("copies", "copies.txt"), ("runtime/vector_add.shared", "runtime/vector_add.txt")] {
        let out = run_to_end(server.run(Some(&server.token), &dir.join(program))).stdout;
        let want = fs::read_to_string(repo_root().join("tests/cuda/expected").join(expected)).expect("expected");
        assert!(out == want, "{program} over TCP:\n{}", diff(&want, &out));
    }
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
