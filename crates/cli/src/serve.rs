//! `gpuplex serve`: the supervisor, its worker pool, its listener, its
//! metrics endpoint, and what it does on signals.
//!
//! SIGHUP reloads the configuration (a file that does not load is logged
//! and the old one kept); SIGTERM and SIGINT stop the server: it logs why,
//! removes its socket and exits, and its workers, seeing it gone, end their
//! sessions.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use gpuplex_server::config::Config;
use gpuplex_server::sched::Policy;
use gpuplex_server::supervisor::status;
use gpuplex_server::{BackendKind, Placement, Supervisor, WorkerCommand};
use gpuplex_transport::{Address, Listener, Token};
use tracing::{error, info, warn};

use crate::Error;

/// `gpuplex serve`'s arguments. `policy` and `slice` override the
/// configuration's `[server]` settings, at start and at every reload.
#[derive(clap::Args)]
pub struct Options {
    /// Where to listen: unix:PATH, tcp:HOST:PORT, or vm:PATH (a file
    /// of memory to share with a virtual machine, made there, which
    /// QEMU gives the VM as an ivshmem-plain device); give it again to
    /// listen in several places. Default:
    /// $XDG_RUNTIME_DIR/gpuplex.sock, or /tmp/gpuplex-UID.sock.
    #[arg(long, value_name = "ADDR")]
    pub listen: Vec<Address>,
    /// The secret TCP clients must prove they hold (required with tcp:;
    /// at least 16 bytes, readable by its owner only). TCP traffic is
    /// not encrypted: use a trusted network, a VPN or an SSH tunnel.
    #[arg(long, value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// cuda drives the machine's GPUs; emulated is a host-memory test
    /// device for machines without one (it runs only registered test
    /// kernels; in builds with --features emulated).
    #[arg(long, default_value = "cuda", value_name = "cuda|emulated")]
    pub backend: BackendKind,
    /// Tenants and server settings (TOML; see docs/configuration.md).
    /// Without one, every local user is a tenant of its own with no
    /// limit. SIGHUP reloads it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Check a configuration file and exit.
    #[arg(long, value_name = "FILE", conflicts_with = "config")]
    pub check_config: Option<PathBuf>,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics (every
    /// tenant's figures: bind it where only the operator can reach it).
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics: Option<String>,
    /// Worker processes kept started and ready for the next guest
    /// (default 2).
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,
    /// How GPU time is divided among tenants that want it: fair
    /// (weighted shares of kernel time, the default), band (of kernel
    /// and copy time), fifo (turns in arrival order), or none (the
    /// driver's own time-slicing).
    #[arg(long, value_name = "fair|band|fifo|none")]
    pub policy: Option<Policy>,
    /// How long a tenant keeps a GPU that others wait for, such as
    /// 10ms (the default): longer wastes less GPU time on hand-overs,
    /// shorter makes waiters wait less.
    #[arg(long, value_name = "TIME", value_parser = gpuplex_server::config::parse_slice)]
    pub slice: Option<Duration>,
    /// The size of the file a vm: address makes, a power of two such as
    /// 1GiB (the default) or 4GiB: give QEMU's memory-backend-file the
    /// same size. What the connections' rings leave of it holds the
    /// VM's pinned host memory and staging.
    #[arg(long, value_name = "SIZE", value_parser = vm_memory)]
    pub vm_memory: Option<usize>,
}

pub fn serve(opts: Options) -> Result<ExitCode, Error> {
    if let Some(path) = &opts.check_config {
        let config = Config::load(path)?;
        println!(
            "{}: ok, {} tenant(s){}",
            path.display(),
            config.tenants.len(),
            match config.default {
                Some(_) => ", unlisted local users admitted with [default]'s settings",
                None => ", unlisted local users refused",
            }
        );
        return Ok(ExitCode::SUCCESS);
    }
    let mut config = match &opts.config {
        Some(path) => Config::load(path)?,
        None => Config::none(),
    };
    let scheduling = Scheduling { policy: opts.policy, slice: opts.slice };
    scheduling.apply(&mut config);
    let mut addresses = opts.listen.clone();
    if addresses.is_empty() {
        addresses.push(config.server.listen.clone().unwrap_or_else(Address::default_local));
    }
    let metrics = opts.metrics.clone().or_else(|| config.server.metrics.clone());
    let keep_idle = opts.workers.or(config.server.workers).unwrap_or(gpuplex_server::supervisor::DEFAULT_IDLE);
    let token = opts.token_file.as_deref().map(Token::from_file).transpose()?;
    // Before anything starts threads: only the signal thread takes them.
    let signals = Signals::block();
    let mut command = worker_command(opts.backend)?;
    // Workers log what the server logs: sessions opening and closing.
    if std::env::var_os("GPUPLEX_LOG").is_none() {
        command.env.push(("GPUPLEX_LOG".into(), "info".into()));
    }
    let supervisor = Supervisor::start(Placement::Workers { command, keep_idle }, config, token)?;
    let mut listeners = Vec::new();
    for address in &addresses {
        let listener = match address {
            Address::Tcp(_) => {
                tracing::warn!("frames over TCP are not encrypted: use a trusted network, a VPN or an SSH tunnel");
                gpuplex_transport::listen_with_keys(address, supervisor.keys())
            }
            Address::Vm(path) => {
                let size = opts.vm_memory.unwrap_or(gpuplex_transport::vm::DEFAULT_REGION);
                gpuplex_transport::vm::VmListener::create(path, size).map(|l| Box::new(l) as Box<dyn Listener>)
            }
            Address::Unix(_) => gpuplex_transport::listen(address, None),
        };
        listeners.push(listener.map_err(|e| format!("cannot listen on {address}: {}", crate::chain(&e)))?);
    }
    if let Some(at) = metrics {
        let bound = status::serve_metrics(Arc::downgrade(&supervisor), &at)
            .map_err(|e| format!("cannot serve metrics on {at}: {e}"))?;
        info!("metrics at http://{bound}/metrics");
    }
    signals.handle(supervisor.clone(), opts.config.clone(), scheduling, addresses)?;
    let last = listeners.pop().expect("at least one address");
    for listener in listeners {
        let supervisor = supervisor.clone();
        std::thread::Builder::new().name("gpuplex-accept".into()).spawn(move || {
            if let Err(e) = supervisor.serve(listener.as_ref()) {
                error!("stopped listening on {}: {}", listener.address(), crate::chain(&e));
            }
        })?;
    }
    supervisor.serve(last.as_ref())?;
    Ok(ExitCode::SUCCESS)
}

/// How the server starts a worker: this same executable.
pub fn worker_command(backend: BackendKind) -> Result<WorkerCommand, Error> {
    let program = std::env::current_exe().map_err(|e| format!("cannot find this executable to start workers: {e}"))?;
    let args = vec!["worker".into(), "--backend".into(), backend.name().into()];
    Ok(WorkerCommand { program, args, env: Vec::new() })
}

/// The signals the server handles, blocked in every thread and taken by
/// one that waits for them.
struct Signals(libc::sigset_t);

impl Signals {
    fn block() -> Signals {
        // SAFETY: a local set, filled before use; changes this thread's mask,
        // which the threads it starts inherit.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for signal in [libc::SIGHUP, libc::SIGTERM, libc::SIGINT] {
                libc::sigaddset(&mut set, signal);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            Signals(set)
        }
    }

    fn handle(
        self,
        supervisor: Arc<Supervisor>,
        config: Option<PathBuf>,
        scheduling: Scheduling,
        addresses: Vec<Address>,
    ) -> Result<(), Error> {
        std::thread::Builder::new().name("gpuplex-signals".into()).spawn(move || loop {
            let mut signal = 0;
            // SAFETY: a set of blocked signals and an out-pointer to a local.
            if unsafe { libc::sigwait(&self.0, &mut signal) } != 0 {
                continue;
            }
            match signal {
                libc::SIGHUP => reload(&supervisor, config.as_deref(), scheduling),
                _ => {
                    let name = if signal == libc::SIGTERM { "SIGTERM" } else { "SIGINT" };
                    info!(sessions = supervisor.registry().len(), "{name}: stopping");
                    supervisor.shutdown();
                    for address in &addresses {
                        if let Address::Unix(path) = address {
                            let _ = std::fs::remove_file(path);
                        }
                    }
                    std::process::exit(0);
                }
            }
        })?;
        Ok(())
    }
}

/// Scheduling settings from the command line, which win over the file's.
#[derive(Clone, Copy)]
struct Scheduling {
    policy: Option<Policy>,
    slice: Option<Duration>,
}

impl Scheduling {
    fn apply(self, config: &mut Config) {
        config.server.policy = self.policy.or(config.server.policy);
        config.server.slice = self.slice.or(config.server.slice);
    }
}

fn reload(supervisor: &Supervisor, path: Option<&std::path::Path>, scheduling: Scheduling) {
    let Some(path) = path else {
        return warn!("SIGHUP: no configuration file to reload (serve --config FILE)");
    };
    let loaded = Config::load(path).map(|mut c| {
        scheduling.apply(&mut c);
        c
    });
    match loaded.map_err(|e| e.to_string()).and_then(|c| supervisor.reload(c).map_err(|e| e.to_string())) {
        Ok(()) => info!("SIGHUP: reloaded {}", path.display()),
        Err(e) => error!("SIGHUP: kept the configuration in use: {e}"),
    }
}

/// A VM region's size: a power of two (a PCI BAR's must be), with room for
/// every connection's rings.
fn vm_memory(s: &str) -> Result<usize, String> {
    let bytes = gpuplex_server::config::parse_size(s)?;
    let min = gpuplex_transport::vm::MIN_REGION.next_power_of_two();
    match usize::try_from(bytes) {
        Ok(b) if b.is_power_of_two() && b >= min => Ok(b),
        _ => Err(format!("{s}: a power of two of at least {} MiB", min >> 20)),
    }
}
