//! The supervisor: the server's process that guests connect to.
//!
//! It accepts connections, has each peer prove itself and say what it wants
//! (the first frame, read under a deadline and a size bound), finds the
//! peer's tenant ([`tenancy`]), and hands the guest to a worker process of
//! its own (`pool.rs`) together with its socket and the tenant's ledger;
//! from then on the guest and its worker talk directly and the supervisor
//! only watches the worker, reaping it and freeing what its guest held when
//! it exits, however it exits. It answers `gpuplex status` and the metrics
//! from the registry (`registry.rs`) and the ledgers, and routes a TCP guest's bulk
//! lanes to its worker.
//!
//! It never opens a GPU itself: what a guest's kernels can do to a process
//! they do to their worker only.

mod admission;
pub mod mps;
mod pool;
mod registry;
pub mod status;
pub mod tenancy;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Instant;

use gpuplex_protocol::DeviceInfo;
use gpuplex_transport::{Keyring, Listener, Peer, TransportError};
use tracing::{error, info, warn};

use crate::config::{Config, ConfigError};
use crate::sched::{Board, DEFAULT_SLICE};
use crate::worker::Host;
pub use pool::{WorkerCommand, DEFAULT_IDLE};
pub use registry::Registry;
use registry::Route;
use tenancy::Tenancy;

/// The most connections served at once, sessions and peers still proving
/// themselves alike; more are refused.
pub const MAX_CONNECTIONS: usize = crate::MAX_SESSIONS;
/// Consecutive accept failures after which the listener is given up.
const MAX_ACCEPT_FAILURES: u32 = 100;

/// Where guests run.
pub enum Placement {
    /// Each guest in a worker process of its own, started with this command.
    Workers { command: WorkerCommand, keep_idle: usize },
    /// Every guest on a thread of the supervisor's own process, all sharing
    /// one backend and one fault domain: for tests only.
    InProcess(Arc<dyn crate::backend::Backend>),
}

enum Placer {
    Workers(Arc<pool::Pool>),
    InProcess(Host),
}

/// What the backend reported at start: the same for every worker.
pub struct BackendInfo {
    pub kind: String,
    pub driver_version: i32,
    pub devices: Vec<DeviceInfo>,
}

pub struct Supervisor {
    placer: Placer,
    backend: BackendInfo,
    registry: Registry,
    tenancy: RwLock<Tenancy>,
    keys: Arc<Keyring>,
    /// Connection threads alive, counted from accept: unlike the registry,
    /// this includes peers that have not said who they are yet.
    connections: AtomicUsize,
    /// Connections still in admission, by where they come from (a uid, or
    /// a remote address), so that one origin cannot hold every slot.
    pending: Mutex<HashMap<Origin, usize>>,
    started: Instant,
    /// The user the server runs as: its peers see the whole server.
    owner: u32,
    rates: status::Rates,
    /// The MPS daemons of spatial tenants, set up when the first needs one.
    mps: std::sync::OnceLock<Result<mps::Mps, String>>,
}

/// Where a connection comes from, for the admission limits.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Origin {
    Uid(u32),
    Host(std::net::IpAddr),
    /// A virtual machine, by its region file.
    Vm(u64),
}

impl Supervisor {
    /// Starts placing guests: for workers, starts the pool and waits until
    /// the first worker has opened the backend (or failed to, which is the
    /// error). `config` says who the tenants are; `server_token` admits
    /// TCP peers as tenant `remote`.
    pub fn start(
        placement: Placement,
        config: Config,
        server_token: Option<gpuplex_transport::Token>,
    ) -> Result<Arc<Supervisor>, String> {
        let (placer, backend) = match placement {
            Placement::Workers { mut command, keep_idle } => {
                let (key, value) = mps::ISOLATED_ENV;
                command.env.push((key.into(), value.into()));
                let (pool, ready) = pool::Pool::start(command, keep_idle)?;
                let info =
                    BackendInfo { kind: ready.backend, driver_version: ready.driver_version, devices: ready.devices.0 };
                (Placer::Workers(pool), info)
            }
            Placement::InProcess(backend) => {
                let info = BackendInfo {
                    kind: backend.kind().to_owned(),
                    driver_version: backend.driver_version(),
                    devices: backend.devices().to_vec(),
                };
                (Placer::InProcess(Host::new(backend)), info)
            }
        };
        let policy = config.server.policy.unwrap_or_default();
        let slice = config.server.slice.unwrap_or(DEFAULT_SLICE);
        let board = Board::create(policy, slice).map_err(|e| format!("cannot create the scheduling board: {e}"))?;
        let tenancy = Tenancy::new(config, backend.devices.len(), server_token).map_err(|e| e.to_string())?;
        let keys = Arc::new(Keyring::default());
        keys.replace(tenancy.keys());
        // SAFETY: geteuid has no preconditions and cannot fail.
        let owner = unsafe { libc::geteuid() };
        let supervisor = Arc::new(Supervisor {
            placer,
            backend,
            registry: Registry::new(Arc::new(board)),
            tenancy: RwLock::new(tenancy),
            keys,
            connections: AtomicUsize::new(0),
            pending: Mutex::default(),
            started: Instant::now(),
            owner,
            rates: status::Rates::default(),
            mps: std::sync::OnceLock::new(),
        });
        status::start_sampling(Arc::downgrade(&supervisor));
        Ok(supervisor)
    }

    /// The MPS daemons for spatial sessions, or why there can be none.
    fn mps(&self) -> Result<&mps::Mps, String> {
        if self.backend.kind != "cuda" {
            return Err(format!("spatial sharing needs the cuda backend, not {}", self.backend.kind));
        }
        let mps = self.mps.get_or_init(|| mps::Mps::new(&self.backend.devices));
        mps.as_ref().map_err(Clone::clone)
    }

    /// Stops what the server started beside its workers (MPS daemons),
    /// before the process exits.
    pub fn shutdown(&self) {
        if let Some(Ok(mps)) = self.mps.get() {
            mps.stop();
        }
    }

    /// The keys TCP peers prove; a TCP listener admits by these.
    pub fn keys(&self) -> Arc<Keyring> {
        self.keys.clone()
    }

    pub fn backend(&self) -> &BackendInfo {
        &self.backend
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Takes a reloaded configuration: new peers are matched by it, and
    /// tenants with live sessions get its limits, weights and priorities,
    /// and the server its policy, at once.
    pub fn reload(&self, config: Config) -> Result<(), ConfigError> {
        let server_token = self.tenancy().server_token();
        let policy = config.server.policy.unwrap_or_default();
        let slice = config.server.slice.unwrap_or(DEFAULT_SLICE);
        let tenancy = Tenancy::new(config, self.backend.devices.len(), server_token)?;
        for tenant in self.registry.tenants() {
            if let Some(plan) = tenancy.plan_named(&tenant.name) {
                self.registry.update_tenant(&plan);
            }
        }
        let board = self.registry.board();
        if (board.policy(), board.slice()) != (policy, slice) {
            info!(policy = policy.name(), slice = ?slice, "scheduling changed");
            board.set_policy(policy, slice);
        }
        self.keys.replace(tenancy.keys());
        *self.tenancy.write().unwrap_or_else(PoisonError::into_inner) = tenancy;
        Ok(())
    }

    fn tenancy(&self) -> std::sync::RwLockReadGuard<'_, Tenancy> {
        self.tenancy.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Accepts connections on `listener` until it fails, each admitted on a
    /// thread of its own.
    pub fn serve(self: &Arc<Self>, listener: &dyn Listener) -> Result<(), TransportError> {
        info!(address = %listener.address(), backend = %self.backend.kind, "serving");
        let mut failures = 0;
        loop {
            let carrier = match listener.accept() {
                Ok(c) => {
                    failures = 0;
                    c
                }
                // A peer that vanished mid-accept, or a passing shortage of
                // descriptors, concerns nobody else; a listener that keeps
                // failing is broken.
                Err(e) if failures < MAX_ACCEPT_FAILURES => {
                    failures += 1;
                    warn!("accept failed: {}", crate::chain(&e));
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                }
                Err(e) => return Err(e),
            };
            if self.connections.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
                warn!(peer = %carrier.peer(), "refusing a connection: {MAX_CONNECTIONS} connections already");
                continue;
            }
            self.connections.fetch_add(1, Ordering::Relaxed);
            let supervisor = self.clone();
            let spawned = std::thread::Builder::new().name("gpuplex-conn".into()).spawn(move || {
                admission::admit(&supervisor, carrier);
                supervisor.connections.fetch_sub(1, Ordering::Relaxed);
            });
            if let Err(e) = spawned {
                self.connections.fetch_sub(1, Ordering::Relaxed);
                error!("cannot start a connection thread: {}", crate::chain(&e));
            }
        }
    }

    /// Whether `peer` sees the whole server: the server's own user and root.
    fn is_owner(&self, peer: &Peer) -> bool {
        matches!(peer, Peer::Local { uid, .. } if *uid == self.owner || *uid == 0)
    }

    /// Idle workers ready for a guest.
    fn idle_workers(&self) -> u32 {
        match &self.placer {
            Placer::Workers(pool) => pool.idle() as u32,
            Placer::InProcess(_) => 0,
        }
    }

    /// Counts a connection from `peer` into admission; `None` if its origin
    /// holds too many there already.
    fn enter_admission(&self, peer: &Peer) -> Option<PendingGuard<'_>> {
        let origin = match peer {
            Peer::Local { uid, .. } => Origin::Uid(*uid),
            Peer::Remote(addr) => Origin::Host(addr.ip()),
            Peer::Vm { region, .. } => Origin::Vm(*region),
        };
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let total: usize = pending.values().sum();
        let mine = pending.entry(origin.clone()).or_insert(0);
        if *mine >= admission::MAX_PENDING_PER_ORIGIN || total >= admission::MAX_PENDING {
            return None;
        }
        *mine += 1;
        Some(PendingGuard { supervisor: self, origin })
    }

    /// Places a guest whose session is open, and waits until it has gone.
    fn place(
        &self,
        carrier: Box<dyn gpuplex_transport::Carrier>,
        session: &registry::SessionEntry,
        guest: admission::Opening,
    ) {
        let account = self.registry.account(session);
        match &self.placer {
            Placer::InProcess(host) => {
                self.registry.placed(session.id, Route::InProcess, std::process::id(), None);
                let guest = crate::session::Guest {
                    id: session.id,
                    tenant: session.tenant.clone(),
                    account,
                    place: crate::sched::Place {
                        board: self.registry.board().clone(),
                        seat: session.seat,
                        row: session.row,
                        gpus: (0..self.backend.devices.len()).collect(),
                        sharing: crate::sched::Sharing::Isolated,
                    },
                    lane_key: session.lane_key,
                    hello_header: guest.header,
                    hello: guest.hello,
                    devices: guest.plan.devices,
                    device_output: false,
                };
                host.serve(carrier, guest);
            }
            Placer::Workers(pool) => admission::run_in_worker(self, pool, carrier, session, guest, &account),
        }
    }
}

/// A connection's place in admission, given back when dropped.
struct PendingGuard<'a> {
    supervisor: &'a Supervisor,
    origin: Origin,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        let mut pending = self.supervisor.pending.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = pending.get_mut(&self.origin) {
            *n -= 1;
            if *n == 0 {
                pending.remove(&self.origin);
            }
        }
    }
}
