//! Spatial sharing: an NVIDIA MPS control daemon per GPU, owned by the
//! server, whose clients are the workers of spatial tenants' sessions.
//!
//! Time-slicing runs one process's kernels at a time, so tenants whose
//! kernels fill a few SMs leave the rest of the GPU idle. Under MPS, the
//! kernels of every client of one MPS server run side by side. The price is
//! the fault domain: a fatal fault in one client ends the work of every
//! client of that server. So only tenants that ask for it
//! (`sharing = "spatial"`) become clients, each GPU gets a daemon of its
//! own (a fault on one GPU leaves the spatial sessions on others alone),
//! and isolated workers are kept away from every MPS server, the system's
//! included ([`ISOLATED_ENV`]).
//!
//! A daemon is started the first time a spatial session needs its GPU, in
//! a directory private to this server, and sees only that GPU (by UUID):
//! its clients number it 0. Each client gets its tenant's share of the
//! GPU's threads and its memory limit as MPS's own per-client limits.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use std::os::unix::fs::DirBuilderExt;

use gpuplex_protocol::DeviceInfo;
use tracing::{info, warn};

use super::tenancy::Plan;

/// The MPS control program, looked for on `PATH`.
const CONTROL: &str = "nvidia-cuda-mps-control";
/// How long a new daemon may take to open its control socket.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// What every isolated worker gets: a pipe directory that cannot exist, so
/// its driver finds no MPS daemon and runs the process on its own, even on
/// a machine where one listens at the default `/tmp/nvidia-mps`.
pub const ISOLATED_ENV: (&str, &str) = ("CUDA_MPS_PIPE_DIRECTORY", "/dev/null/gpuplex-isolated");

/// The server's MPS daemons.
pub struct Mps {
    /// Where the daemons' pipes and logs go; removed when the server stops.
    root: PathBuf,
    /// Each GPU's UUID as `CUDA_VISIBLE_DEVICES` takes it, by ordinal.
    uuids: Vec<String>,
    daemons: Mutex<Vec<Option<Daemon>>>,
    /// The thread that starts daemons: a daemon dies with the thread that
    /// started it (`PR_SET_PDEATHSIG`), so it must be one that lives as
    /// long as the server.
    starter: Mutex<mpsc::Sender<Start>>,
}

struct Daemon {
    child: Child,
    pipe: PathBuf,
}

type Start = (usize, mpsc::Sender<Result<Daemon, String>>);

impl Mps {
    /// Prepares daemons for `devices`; starts none yet.
    pub fn new(devices: &[DeviceInfo]) -> Result<Mps, String> {
        let root = std::env::temp_dir().join(format!("gpuplex-mps.{}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&root)
            .map_err(|e| format!("cannot create {}: {e}", root.display()))?;
        let (send, receive) = mpsc::channel::<Start>();
        let uuids: Vec<String> = devices.iter().map(|d| uuid_name(&d.uuid)).collect();
        let (for_thread, dir) = (uuids.clone(), root.clone());
        std::thread::Builder::new()
            .name("gpuplex-mps".into())
            .spawn(move || {
                for (gpu, reply) in receive {
                    let _ = reply.send(start(&dir, gpu, &for_thread[gpu]));
                }
            })
            .map_err(|e| format!("cannot start the MPS thread: {e}"))?;
        Ok(Mps {
            root,
            daemons: Mutex::new((0..uuids.len()).map(|_| None).collect()),
            uuids,
            starter: Mutex::new(send),
        })
    }

    /// The variables that make a new worker a client of `gpu`'s daemon,
    /// with `plan`'s limits; starts the daemon if it is not running.
    pub fn client_env(&self, gpu: usize, plan: &Plan) -> Result<Vec<(OsString, OsString)>, String> {
        let pipe = self.pipe(gpu)?;
        let mut env = vec![
            ("CUDA_VISIBLE_DEVICES".into(), self.uuids[gpu].clone().into()),
            ("CUDA_MPS_PIPE_DIRECTORY".into(), pipe.into_os_string()),
        ];
        if let Some(percent) = plan.active_threads {
            env.push(("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), percent.to_string().into()));
        }
        if plan.memory_limit > 0 {
            // MPS takes whole mebibytes; rounding down keeps the limit a limit.
            let mib = (plan.memory_limit >> 20).max(1);
            env.push(("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), format!("0={mib}M").into()));
        }
        Ok(env)
    }

    /// `gpu`'s pipe directory, its daemon started if need be.
    fn pipe(&self, gpu: usize) -> Result<PathBuf, String> {
        let mut daemons = self.daemons.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = daemons.get_mut(gpu).ok_or_else(|| format!("no GPU {gpu}"))?;
        if let Some(d) = slot {
            if matches!(d.child.try_wait(), Ok(None)) {
                return Ok(d.pipe.clone());
            }
            warn!(gpu, "the MPS control daemon exited; starting another");
        }
        let (reply, answer) = mpsc::channel();
        let sent = self.starter.lock().unwrap_or_else(PoisonError::into_inner).send((gpu, reply));
        sent.map_err(|_| "the MPS thread is gone".to_owned())?;
        let daemon = answer.recv().map_err(|_| "the MPS thread is gone".to_owned())??;
        info!(gpu, pid = daemon.child.id(), "MPS control daemon started for spatial tenants");
        let pipe = daemon.pipe.clone();
        *slot = Some(daemon);
        Ok(pipe)
    }

    /// Stops every daemon, and the MPS servers they started.
    pub fn stop(&self) {
        let mut daemons = self.daemons.lock().unwrap_or_else(PoisonError::into_inner);
        for mut d in daemons.iter_mut().filter_map(Option::take) {
            if quit(&d.pipe).is_err() || !exited_within(&mut d.child, Duration::from_secs(5)) {
                let _ = d.child.kill();
                let _ = d.child.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

impl Drop for Mps {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Asks the MPS control daemon listening in `pipe` to stop its servers and
/// exit, and waits until it has taken the request.
pub fn quit(pipe: &Path) -> std::io::Result<()> {
    let mut control = Command::new(CONTROL)
        .env("CUDA_MPS_PIPE_DIRECTORY", pipe)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    if let Some(mut stdin) = control.stdin.take() {
        std::io::Write::write_all(&mut stdin, b"quit\n")?;
    }
    control.wait().map(drop)
}

/// Starts `gpu`'s daemon in `root` and waits for its control socket.
fn start(root: &Path, gpu: usize, uuid: &str) -> Result<Daemon, String> {
    let dir = root.join(format!("gpu{gpu}"));
    let (pipe, log) = (dir.join("pipe"), dir.join("log"));
    for d in [&dir, &pipe, &log] {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .recursive(true)
            .create(d)
            .map_err(|e| format!("cannot create {}: {e}", d.display()))?;
    }
    let mut command = Command::new(CONTROL);
    command
        .arg("-f")
        .env("CUDA_VISIBLE_DEVICES", uuid)
        .env("CUDA_MPS_PIPE_DIRECTORY", &pipe)
        .env("CUDA_MPS_LOG_DIRECTORY", &log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: prctl is async-signal-safe; it asks for SIGTERM when the
    // starting thread (the server's MPS thread) ends, so that a server
    // killed outright leaves no daemon behind.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    let mut child = command.spawn().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            format!("spatial sharing needs NVIDIA MPS, and {CONTROL} is not on the server's PATH")
        }
        _ => format!("cannot start {CONTROL}: {e}"),
    })?;
    let deadline = Instant::now() + START_TIMEOUT;
    while !pipe.join("control").exists() {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("{CONTROL} exited as it started ({status}); see {}", log.display()));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{CONTROL} did not open its control socket within {START_TIMEOUT:?}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(Daemon { child, pipe })
}

fn exited_within(child: &mut Child, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if !matches!(child.try_wait(), Ok(None)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// A UUID as the driver prints it: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
fn uuid_name(uuid: &[u8; 16]) -> String {
    let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!("GPU-{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uuid_is_named_as_the_driver_names_it() {
        let uuid = [0x15, 0x1b, 0xe9, 0x1e, 0x29, 0xc7, 0xfe, 0x9b, 0xd5, 0x50, 0x2d, 0xd5, 0x20, 0x3c, 0xaa, 0x5c];
        assert_eq!(uuid_name(&uuid), "GPU-151be91e-29c7-fe9b-d550-2dd5203caa5c");
    }
}
