//! What the end-to-end tests share: the front-end they run programs with,
//! the CUDA test programs built with nvcc, processes whose output is
//! collected as it comes, and servers of their own.
#![allow(dead_code)]
//!
//! `cargo test` rebuilds the `gpuplex` binary but not the front-end, a
//! `cdylib` of another package, so a `libcuda.so` left from an older build
//! would make these tests fail for changes they do not contain.

use std::env;
use std::fs;
use std::io::{BufRead, BufReader, Read};
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

/// The front-end's folder: the one beside the `gpuplex` binary, once it
/// holds a `libcuda.so` at least as new as every input cargo recorded for
/// it (`libcuda.d`).
pub fn frontend_dir() -> PathBuf {
    let gpuplex = PathBuf::from(env!("CARGO_BIN_EXE_gpuplex"));
    let dir = gpuplex.parent().expect("binary in a directory").to_path_buf();
    let library = dir.join("libcuda.so");
    let built = std::fs::metadata(&library).and_then(|m| m.modified());
    let built = built.unwrap_or_else(|_| panic!("{} has no libcuda.so: run cargo build first", dir.display()));
    let inputs = std::fs::read_to_string(dir.join("libcuda.d")).unwrap_or_default();
    let (_, inputs) = inputs.split_once(": ").unwrap_or_default();
    for input in inputs.split_whitespace() {
        if std::fs::metadata(input).and_then(|m| m.modified()).is_ok_and(|m| m > built) {
            panic!("{} is older than {input}: run cargo build first", library.display());
        }
    }
    dir
}

pub const PROGRAM_TIMEOUT: Duration = Duration::from_secs(120);
pub const MIB: u64 = 1 << 20;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn gpuplex() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpuplex"))
}

/// Tests run one at a time: they start servers and measure free memory.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The directory holding nvcc, if there is one.
pub fn nvcc_dir() -> Option<PathBuf> {
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
pub fn programs() -> Option<&'static Path> {
    static BUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let Some(nvcc) = nvcc_dir() else {
            assert!(
                env::var("GPUPLEX_REQUIRE_NVCC").as_deref() != Ok("1"),
                "nvcc not installed and GPUPLEX_REQUIRE_NVCC=1 (run scripts/install-nvcc.sh)"
            );
            return None;
        };
        let libdir = frontend_dir();
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
pub fn kill_group(pid: u32) {
    // SAFETY: kill(2) takes no pointers; a negative pid names the group we created.
    unsafe {
        libc::kill(-(pid as i32), libc::SIGKILL);
    }
}

/// A child in its own process group whose output is collected as it comes.
pub struct Running {
    pub child: Child,
    pub stdout: Receiver<String>,
    pub stderr: Receiver<String>,
    pub seen: String,
}

pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Running {
    pub fn spawn(cmd: Command) -> Running {
        Running::spawn_with_stdin(cmd).0
    }

    /// As [`Running::spawn`], with a pipe to the process's stdin.
    pub fn spawn_with_stdin(mut cmd: Command) -> (Running, std::process::ChildStdin) {
        // No server a developer has running may be picked up by accident.
        let runtime = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("xdg-runtime");
        fs::create_dir_all(&runtime).expect("create runtime dir");
        cmd.env_remove("GPUPLEX_SERVER").env_remove("GPUPLEX_TOKEN_FILE").env("XDG_RUNTIME_DIR", runtime);
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let stdin = child.stdin.take().expect("piped");
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
        (Running { child, stdout, stderr, seen: String::new() }, stdin)
    }

    /// Waits for a stdout line starting with `prefix`.
    pub fn wait_for_line(&mut self, prefix: &str, timeout: Duration) -> Result<String, String> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.stdout.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => {
                    self.seen.push_str(&line);
                    if line.starts_with(prefix) {
                        return Ok(line);
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
    pub fn finish(mut self, timeout: Duration) -> Result<Finished, String> {
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
    pub fn drain(&mut self) -> String {
        let until = Instant::now() + Duration::from_secs(5);
        while let Ok(line) = self.stdout.recv_timeout(until.saturating_duration_since(Instant::now())) {
            self.seen.push_str(&line);
        }
        std::mem::take(&mut self.seen)
    }

    pub fn kill(&mut self) {
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
pub fn run_command(dir: &Path, server: Option<&Path>, args: &[&str]) -> Command {
    let mut cmd = Command::new(gpuplex());
    cmd.arg("run");
    match server {
        Some(socket) => cmd.arg("--server").arg(format!("unix:{}", socket.display())),
        None => cmd.args(["--backend", "emulated"]),
    };
    cmd.arg("--").arg(dir.join(args[0])).args(&args[1..]);
    cmd
}

pub fn run_to_end(cmd: Command) -> Finished {
    let what = format!("{cmd:?}");
    let done = Running::spawn(cmd).finish(PROGRAM_TIMEOUT).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(done.status.success(), "{what}: {}\nstdout:\n{}\nstderr:\n{}", done.status, done.stdout, done.stderr);
    done
}

/// A unified-style diff of two texts, by lines, with three lines of context.
pub fn diff(expected: &str, actual: &str) -> String {
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

/// `gpuplex serve --backend emulated` on a private socket, killed on drop.
pub struct Server {
    child: Child,
    pub socket: PathBuf,
    log: PathBuf,
}

impl Server {
    pub fn start(tag: &str) -> Server {
        Server::start_with(tag, &[])
    }

    /// A server on a socket of its own, with more arguments to `gpuplex
    /// serve` (another `--listen`, say); its log goes to a file.
    pub fn start_with(tag: &str, args: &[&str]) -> Server {
        // Socket paths are short (108 bytes): keep it in /tmp, not in target/.
        let socket = env::temp_dir().join(format!("gpuplex-test-{}-{tag}.sock", std::process::id()));
        let _ = fs::remove_file(&socket);
        let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("serve-{}-{tag}.log", std::process::id()));
        let out = fs::File::create(&log).expect("server log");
        let mut cmd = Command::new(gpuplex());
        cmd.args(["serve", "--backend", "emulated", "--listen"]).arg(format!("unix:{}", socket.display())).args(args);
        cmd.env_remove("GPUPLEX_SERVER").env_remove("GPUPLEX_TOKEN_FILE").env_remove("GPUPLEX_LOG");
        cmd.stdin(Stdio::null()).stdout(out.try_clone().expect("log")).stderr(out).process_group(0);
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let deadline = Instant::now() + Duration::from_secs(20);
        while UnixStream::connect(&socket).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("gpuplex serve exited with {status}:\n{}", fs::read_to_string(&log).unwrap_or_default());
            }
            assert!(Instant::now() < deadline, "server did not listen on {} within 20 s", socket.display());
            thread::sleep(Duration::from_millis(20));
        }
        Server { child, socket, log }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the server has logged so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) takes no pointers; the pid is our own child's.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }

    pub fn address(&self) -> String {
        format!("unix:{}", self.socket.display())
    }

    pub fn run(&self, dir: &Path, args: &[&str]) -> Command {
        run_command(dir, Some(&self.socket), args)
    }

    /// `gpuplex status --json` of this server, as its owner sees it.
    pub fn status(&self) -> serde_json::Value {
        let mut cmd = Command::new(gpuplex());
        cmd.args(["status", "--json", "--server", &self.address()]);
        serde_json::from_str(&run_to_end(cmd).stdout).expect("status --json is JSON")
    }

    /// `(free, total)` as mem_info reports them through this server.
    pub fn mem_info(&self, dir: &Path) -> (u64, u64) {
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
        // The server and, through their links, its workers.
        kill_group(self.child.id());
        let _ = self.child.wait();
        let _ = fs::remove_file(&self.socket);
    }
}

/// A private token file in the test's directory.
pub fn token_file(name: &str, secret: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}.token", std::process::id()));
    fs::write(&path, format!("{secret}\n")).expect("write token");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod token");
    path
}

/// `gpuplex serve --backend emulated --listen tcp:127.0.0.1:PORT --token-file F`,
/// killed on drop.
pub struct TcpServer {
    pub _process: Running,
    pub address: String,
    pub token: PathBuf,
}

impl TcpServer {
    pub fn start() -> TcpServer {
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
    pub fn run(&self, token: Option<&Path>, program: &Path) -> Command {
        let mut cmd = Command::new(gpuplex());
        cmd.args(["run", "--server", &self.address]);
        if let Some(token) = token {
            cmd.arg("--token-file").arg(token);
        }
        cmd.arg("--").arg(program);
        cmd
    }
}
