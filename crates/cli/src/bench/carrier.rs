//! A server of its own for each carrier: started as a child process
//! (`gpuplex serve`), waited for until it answers, killed when dropped.
//!
//! A fresh server per carrier keeps one carrier's sessions and memory from
//! weighing on another's numbers, and a carrier this build cannot serve
//! shows up as a server that does not start, reported and skipped.

use std::ffi::OsString;
use std::fs::File;
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to open its backend and listen.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How the gpuplex columns reach their server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CarrierKind {
    /// The shared-memory ring, set up over a Unix socket.
    Shm,
    /// Frames over a Unix socket only.
    Socket,
    /// TCP on loopback, with a token.
    Tcp,
}

impl CarrierKind {
    pub fn name(self) -> &'static str {
        match self {
            CarrierKind::Shm => "shm",
            CarrierKind::Socket => "socket",
            CarrierKind::Tcp => "tcp",
        }
    }
}

/// How readiness is seen: an accepted connection. A server listens only
/// once it can serve, and a connection needs no protocol, so a baseline
/// build of another protocol version is seen alike.
enum Probe {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

/// A running `gpuplex serve`, killed on drop.
pub struct Server {
    child: Child,
    log: PathBuf,
    /// What a client passes as `GPUPLEX_SERVER`.
    pub address: String,
    /// The variables a client needs to reach it, `GPUPLEX_SERVER` included.
    pub client_env: Vec<(String, String)>,
}

impl Server {
    /// Starts a server for `kind` with its files in `dir`, and waits until it answers.
    pub fn start(
        exe: &Path,
        backend: &str,
        kind: CarrierKind,
        dir: &Path,
        library_path: &OsString,
    ) -> Result<Server, String> {
        let mut args = Vec::new();
        let mut client_env = Vec::new();
        let (address, probe) = match kind {
            CarrierKind::Shm | CarrierKind::Socket => {
                let path = dir.join("server.sock");
                client_env.push(("GPUPLEX_CARRIER".to_owned(), kind.name().to_owned()));
                (format!("unix:{}", path.display()), Probe::Unix(path))
            }
            CarrierKind::Tcp => {
                let port = free_port().map_err(|e| format!("no free loopback port: {e}"))?;
                let token = dir.join("token");
                write_token(&token).map_err(|e| format!("cannot write {}: {e}", token.display()))?;
                args.push(OsString::from("--token-file"));
                args.push(token.clone().into_os_string());
                client_env.push(("GPUPLEX_TOKEN_FILE".to_owned(), token.display().to_string()));
                (format!("tcp:127.0.0.1:{port}"), Probe::Tcp(SocketAddr::from(([127, 0, 0, 1], port))))
            }
        };
        client_env.push(("GPUPLEX_SERVER".to_owned(), address.clone()));
        let mut all: Vec<OsString> = ["serve", "--backend", backend, "--listen", &address].map(OsString::from).into();
        all.extend(args);
        Server::spawn(exe, &all, &probe, dir, library_path, address, client_env)
    }

    /// `gpuplex ARGS` (a `serve` whose listeners the caller names), with its
    /// log in `dir`, once its Unix socket `socket` accepts a connection.
    /// Its `address` is that socket; its `client_env` is empty.
    pub fn serve_on(
        exe: &Path,
        args: &[OsString],
        socket: &Path,
        dir: &Path,
        library_path: &OsString,
    ) -> Result<Server, String> {
        let address = format!("unix:{}", socket.display());
        Server::spawn(exe, args, &Probe::Unix(socket.to_owned()), dir, library_path, address, Vec::new())
    }

    fn spawn(
        exe: &Path,
        args: &[OsString],
        probe: &Probe,
        dir: &Path,
        library_path: &OsString,
        address: String,
        client_env: Vec<(String, String)>,
    ) -> Result<Server, String> {
        let log = dir.join("server.log");
        let out = File::create(&log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(exe)
            .args(args)
            .env("LD_LIBRARY_PATH", library_path)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
        let mut server = Server { child, log, address, client_env };
        server.wait_ready(probe)?;
        Ok(server)
    }

    fn wait_ready(&mut self, probe: &Probe) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(failure_reason(&read_lossy(&self.log), &status.to_string()));
            }
            let ready = match probe {
                Probe::Unix(path) => std::os::unix::net::UnixStream::connect(path).is_ok(),
                Probe::Tcp(a) => TcpStream::connect_timeout(a, Duration::from_millis(200)).is_ok(),
            };
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("the server did not answer within {} s", READY_TIMEOUT.as_secs()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port nobody listens on now (the server binds it moments later).
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// 32 random bytes, for a token.
pub fn random_token() -> std::io::Result<[u8; 32]> {
    let mut token = [0u8; 32];
    File::open("/dev/urandom")?.read_exact(&mut token)?;
    Ok(token)
}

/// A random token, readable by this user only.
pub fn write_token(path: &Path) -> std::io::Result<()> {
    let token = random_token()?;
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    std::io::Write::write_all(&mut f, &token)
}

pub fn read_lossy(path: &Path) -> String {
    std::fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

/// The lines of a failed child's stderr that say why, without colours:
/// errors first, else the last line, else `status`.
pub fn failure_reason(stderr: &str, status: &str) -> String {
    let lines: Vec<String> =
        stderr.lines().map(strip_ansi).map(|l| l.trim().to_owned()).filter(|l| !l.is_empty()).collect();
    let is_error = |l: &&String| {
        l.starts_with("error:") || l.starts_with("gpuplex: ") || l.contains(" ERROR ") || l.contains("] error: ")
    };
    // The CLI's own prefix says nothing here.
    let mut errors: Vec<&str> =
        lines.iter().filter(is_error).map(|l| l.strip_prefix("gpuplex: ").unwrap_or(l)).collect();
    errors.dedup();
    match (errors.len(), lines.last()) {
        (0, Some(last)) => last.clone(),
        (0, None) => format!("exited with {status}"),
        // The most specific cause last, as the CLI prints it; keep it short.
        (n, _) => errors[n.saturating_sub(2)..].join("; "),
    }
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters, ended by a letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_prefer_error_lines() {
        let clap = "error: invalid value 'tcp:127.0.0.1:9' for '--listen <ADDR>': unsupported address\n\nFor more information, try '--help'.\n";
        assert_eq!(
            failure_reason(clap, "exit status: 2"),
            "error: invalid value 'tcp:127.0.0.1:9' for '--listen <ADDR>': unsupported address"
        );
        let worker = "gpuplex[7] error: cannot reach the gpuplex server at unix:/x: refused\ngpuplex: cuInit failed: CUDA_ERROR_NO_DEVICE (100)\n";
        assert_eq!(
            failure_reason(worker, ""),
            "gpuplex[7] error: cannot reach the gpuplex server at unix:/x: refused; cuInit failed: CUDA_ERROR_NO_DEVICE (100)"
        );
        assert_eq!(failure_reason("\u{1b}[2mnoise\u{1b}[0m\nlast words\n", "x"), "last words");
        assert_eq!(failure_reason("", "signal: 11 (SIGSEGV)"), "exited with signal: 11 (SIGSEGV)");
    }
}
