//! `gpuplex run`: a program with gpuplex's libcuda.so.1 in front of it.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use gpuplex_server::BackendKind;
use gpuplex_transport::{Address, TransportError, TOKEN_FILE_ENV};
use tracing::info;

use crate::Error;

/// A private directory holding `libcuda.so.1` (a link to the front-end),
/// removed when dropped.
struct LibDir(PathBuf);

impl LibDir {
    fn create(frontend: &Path) -> Result<LibDir, Error> {
        let dir = std::env::temp_dir().join(format!("gpuplex-run-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let dir = LibDir(dir);
        for name in ["libcuda.so.1", "libcuda.so"] {
            std::os::unix::fs::symlink(frontend, dir.0.join(name))?;
        }
        Ok(dir)
    }
}

impl Drop for LibDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Where the front-end is, relative to this binary: beside it, as cargo
/// builds them, or in `../lib/gpuplex/`, as `scripts/install.sh` and the
/// release tarball lay them out.
const FRONTEND_PLACES: [&str; 2] = ["libcuda.so", "../lib/gpuplex/libcuda.so"];

/// gpuplex's front-end library, found beside this binary.
pub fn frontend() -> Result<PathBuf, Error> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().ok_or("the gpuplex binary is in no directory")?;
    let places: Vec<PathBuf> = FRONTEND_PLACES.iter().map(|p| dir.join(p)).collect();
    match places.iter().find(|p| p.exists()) {
        Some(path) => Ok(path.canonicalize()?),
        None => Err(format!(
            "gpuplex's front-end is in neither {} nor {}: build the whole workspace (cargo build --release) or \
             install with scripts/install.sh",
            places[0].display(),
            places[1].display()
        )
        .into()),
    }
}

pub fn run(
    server: Option<Address>,
    token_file: Option<&Path>,
    backend: BackendKind,
    trace: bool,
    command: &[OsString],
) -> Result<ExitCode, Error> {
    let libdir = LibDir::create(&frontend()?)?;
    // Kept alive until the program ends.
    let mut embedded = None;
    let address = match server {
        Some(a) => {
            let token = crate::client_token(&a, token_file)?;
            crate::info::query(&a, token.as_ref()).map_err(|e| crate::info::failure(&a, &e))?;
            a
        }
        None => {
            let a = crate::default_server()?;
            let token = crate::client_token(&a, token_file)?;
            match crate::info::query(&a, token.as_ref()) {
                Ok(s) => {
                    info!(address = %a, backend = %s.backend, "using the running server");
                    a
                }
                // A server is there but will not have us: running elsewhere
                // instead would hide that.
                Err(e)
                    if matches!(
                        e.downcast_ref::<TransportError>(),
                        Some(TransportError::Auth(_) | TransportError::Token(_))
                    ) =>
                {
                    return Err(crate::info::failure(&a, &e).into());
                }
                Err(_) => {
                    let (a, thread) = crate::relay::blocked_in(|| start_embedded(&libdir.0, backend))?;
                    embedded = Some(thread);
                    a
                }
            }
        }
    };

    let mut library_path = OsString::from(&libdir.0);
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
        library_path.push(":");
        library_path.push(old);
    }
    let mut program = Command::new(&command[0]);
    program.args(&command[1..]).env("LD_LIBRARY_PATH", library_path).env("GPUPLEX_SERVER", address.to_string());
    if let Some(path) = token_file {
        program.env(TOKEN_FILE_ENV, std::path::absolute(path)?);
    }
    if trace {
        program.env("GPUPLEX_TRACE", "1");
    }
    crate::relay::install();
    let mut child = match program.spawn() {
        Ok(child) => child,
        // As shells and container runtimes report a program that is not
        // there (127) or cannot be run (126).
        Err(e) => {
            eprintln!("gpuplex: cannot run {}: {e}", command[0].to_string_lossy());
            return Ok(ExitCode::from(if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 }));
        }
    };
    crate::relay::program_started(child.id());
    let status = child.wait();
    crate::relay::program_ended();
    let status = status?;
    drop(embedded);
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => ExitCode::from(code as u8),
        (None, Some(signal)) => ExitCode::from(128 + signal as u8),
        _ => ExitCode::FAILURE,
    })
}

/// Starts a server inside this process, listening in `dir`: a supervisor
/// of its own, whose workers serve the program (and any process it starts)
/// as `gpuplex serve`'s would. It listens at once and starts its first
/// worker on a thread of its own (the worker's driver initialisation takes
/// about as long as a program's own first CUDA call), so that the program
/// starts beside it: a guest that connects first waits in the socket's
/// queue. Further workers start only when another of the program's
/// processes connects, as each native process initialises its own driver:
/// one started ahead would initialise beside the program's own work on
/// the GPU, and slow it and its exit, for a guest that mostly never comes.
fn start_embedded(dir: &Path, kind: BackendKind) -> Result<(Address, Embedded), Error> {
    let command = crate::serve::worker_command(kind)?;
    let address = Address::Unix(dir.join("server.sock"));
    let listener = gpuplex_transport::listen(&address, None)?;
    let (started, start) = std::sync::mpsc::channel();
    let at = address.clone();
    std::thread::Builder::new().name("gpuplex-server".into()).spawn(move || {
        let placement = gpuplex_server::Placement::Workers { command, keep_idle: 0 };
        let supervisor =
            match gpuplex_server::Supervisor::start(placement, gpuplex_server::config::Config::none(), None) {
                Ok(supervisor) => supervisor,
                // The listener goes with this thread: a waiting guest is refused.
                Err(e) => {
                    tracing::error!("cannot start the embedded server: {e}");
                    return;
                }
            };
        info!(address = %at, backend = %supervisor.backend().kind, "started an embedded server");
        let _ = started.send(supervisor.clone());
        if let Err(e) = supervisor.serve(listener.as_ref()) {
            tracing::error!("embedded server stopped: {}", crate::chain(&e));
        }
    })?;
    Ok((address, Embedded(start)))
}

/// An embedded server, kept until the program ends; its supervisor arrives
/// once started (never, if it could not start).
struct Embedded(std::sync::mpsc::Receiver<std::sync::Arc<gpuplex_server::Supervisor>>);

impl Drop for Embedded {
    /// Waits a little for the program's sessions to end, so that its
    /// workers release what it held before this command returns. A server
    /// still starting has served nobody: it is not waited for.
    fn drop(&mut self) {
        let Ok(supervisor) = self.0.try_recv() else { return };
        supervisor.registry().wait_empty(std::time::Duration::from_secs(5));
    }
}
