//! `gpuplex bench --tenants N`: how N tenants share one GPU, natively and
//! through gpuplex under each policy.
//!
//! Each tenant is a process of its own, `gpuplex bench-tenant` (`child.rs`),
//! running a closed loop of a kernel whose every thread waits a set time
//! on the GPU's clock. Processes, because that is how tenants meet on a
//! GPU: the driver time-slices between their contexts, and gpuplex serves
//! each in a worker of its own. A column (the machine's driver, the same
//! under MPS, a gpuplex server under one policy) runs one tenant alone,
//! then every tenant together, all given the same wall-clock start so that
//! their windows coincide.
//!
//! Through gpuplex each process must be a tenant of its own in the
//! server's configuration: by uid as root, else by token (`site.rs`). The
//! server's status before and after the run gives each tenant's GPU time.
//! `report.rs` works out the shares, fairness and aggregates and prints them.

mod child;
mod report;
mod site;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use gpuplex_server::sched::Policy;
pub use gpuplex_server::sched::Sharing;
use gpuplex_server::BackendKind;

pub use child::run as child;
use report::{Column, Loop, Report, Row, Shape, ShareOf};
use site::{Config, Mps, Site, TenantServer};

use super::carrier;
use super::{library_path_without, Scratch, CLIENT_VARS, NATIVE};
use crate::Error;

/// The kernel every benched tenant runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kernel {
    /// 528 blocks of 0.5 ms: four blocks on each SM of an H100 (132 SMs),
    /// a load that wants the whole GPU.
    Long,
    /// 8 blocks of 0.1 ms: a few SMs briefly, a latency-bound load.
    Small,
}

impl Kernel {
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Long => "long",
            Kernel::Small => "small",
        }
    }

    /// Blocks, and how many microseconds each waits.
    pub fn shape(self) -> (u32, u64) {
        match self {
            Kernel::Long => (528, 500),
            Kernel::Small => (8, 100),
        }
    }
}

pub struct Options {
    pub backend: BackendKind,
    pub tenants: usize,
    /// One per tenant; empty: all 1.
    pub weights: Vec<u32>,
    pub kernel: Kernel,
    pub policies: Vec<Policy>,
    /// Tenants configured (the last ones) that start no process.
    pub idle: usize,
    /// One more tenant, of priority high, running the small kernel.
    pub high: bool,
    pub seconds: f64,
    pub sharing: Option<Sharing>,
    /// The servers' slice, where not their default.
    pub slice: Option<Duration>,
    pub json: Option<PathBuf>,
}

/// The first uid of the tenants' processes when the bench runs as root.
const FIRST_UID: u32 = 2000;

/// How long before the common start the processes are started: time to
/// load a driver, connect and warm up. A process that is late says so.
fn lead(backend: BackendKind) -> Duration {
    Duration::from_secs(if backend == BackendKind::Cuda { 3 } else { 1 })
}

/// `--weights` checked against the number of tenants (empty: all 1).
fn weights(tenants: usize, given: &[u32]) -> Result<Vec<u32>, String> {
    if given.is_empty() {
        return Ok(vec![1; tenants]);
    }
    if given.len() != tenants {
        return Err(format!("--weights lists {} weight(s) for {tenants} tenant(s): give one per tenant", given.len()));
    }
    match given.iter().find(|w| !(1..=1000).contains(*w)) {
        Some(w) => Err(format!("--weights: {w} is not a weight (1 to 1000)")),
        None => Ok(given.to_vec()),
    }
}

fn check(opts: &Options) -> Result<Vec<u32>, String> {
    if opts.tenants == 0 {
        return Err("--tenants: want at least 1".into());
    }
    if opts.idle >= opts.tenants {
        return Err(format!("--idle {} of {} tenants: at least one must run", opts.idle, opts.tenants));
    }
    if !(opts.seconds.is_finite() && opts.seconds > 0.0) {
        return Err(format!("--seconds {}: want a positive number", opts.seconds));
    }
    if opts.policies.is_empty() {
        return Err("--policy: name at least one".into());
    }
    weights(opts.tenants, &opts.weights)
}

/// A tenant as the server's configuration lists it.
struct Tenant {
    name: String,
    /// Its place in the configuration; as root its processes run as uid `FIRST_UID + index`.
    index: u32,
    weight: u32,
    kernel: Kernel,
    high: bool,
}

/// How tenants are told apart through gpuplex.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Identity {
    /// As root: a uid each, on the Unix socket with shared memory.
    Uids,
    /// A token each, over loopback TCP.
    Tokens,
}

pub fn bench(opts: Options) -> Result<ExitCode, Error> {
    let weights = check(&opts)?;
    let exe = std::env::current_exe()?;
    let frontend = crate::run::frontend()?;
    let scratch = Scratch::create()?;
    // SAFETY: geteuid takes nothing and cannot fail.
    let identity = if unsafe { libc::geteuid() } == 0 { Identity::Uids } else { Identity::Tokens };
    if identity == Identity::Uids {
        // The tenants' processes, of other uids, reach the server's socket in it.
        std::fs::set_permissions(&scratch.0, std::fs::Permissions::from_mode(0o755))?;
    }
    let mut tenants: Vec<Tenant> = weights
        .iter()
        .enumerate()
        .map(|(i, &weight)| Tenant { name: format!("t{i}"), index: i as u32, weight, kernel: opts.kernel, high: false })
        .collect();
    if opts.high {
        let index = tenants.len() as u32;
        tenants.push(Tenant { name: "high".into(), index, weight: 1, kernel: Kernel::Small, high: true });
    }
    let bench = Bench {
        exe: &exe,
        library_path: library_path_without(&frontend),
        seconds: opts.seconds,
        lead: lead(opts.backend),
        tenants: &tenants,
        running: opts.tenants - opts.idle,
    };
    let tokens = match identity {
        Identity::Tokens => Some(site::write_tokens(&scratch.subdir("tokens")?, &tenants)?),
        Identity::Uids => None,
    };

    let mut columns = Vec::new();
    if opts.backend == BackendKind::Cuda {
        let native = Site { library: "system".into(), env: Vec::new(), server: None };
        columns.push(bench.column(NATIVE, &native, &scratch.subdir(NATIVE)?)?);
        let name = "native-mps";
        if site::on_path("nvidia-cuda-mps-control") {
            let dir = scratch.subdir(name)?;
            match Mps::start(&dir) {
                Ok(mps) => {
                    let site = Site { library: "system".into(), env: mps.env.clone(), server: None };
                    columns.push(bench.column(name, &site, &dir)?);
                }
                Err(e) => {
                    eprintln!("gpuplex bench: {name}: unavailable: {e}");
                    columns.push(Column::unavailable(name, format!("unavailable: {e}")));
                }
            }
        }
    }
    let backend = match opts.backend {
        BackendKind::Cuda => "cuda",
        BackendKind::Emulated => "emulated",
    };
    for &policy in &opts.policies {
        let name = format!("gpuplex:{}", policy.name());
        let dir = scratch.subdir(&format!("gpuplex-{}", policy.name()))?;
        let config = Config { tenants: &tenants, identity, tokens: tokens.as_deref(), sharing: opts.sharing };
        let server = TenantServer::start(&exe, backend, policy, opts.slice, &config, &dir, &bench.library_path)
            .map_err(|e| format!("{name}: the server did not start: {e}"))?;
        let site = Site { library: frontend.clone().into_os_string(), env: Vec::new(), server: Some(&server) };
        columns.push(bench.column(&name, &site, &dir)?);
    }

    let native_alone = columns.iter().find(|c| c.name == NATIVE).and_then(|c| c.alone.as_ref()).map(|a| a.per_second);
    for c in &mut columns {
        c.compare_with_native(native_alone);
    }
    let report = Report {
        gpuplex_version: env!("CARGO_PKG_VERSION").into(),
        backend: backend.into(),
        unix_time: child::wall() as u64,
        tenants: opts.tenants,
        idle: opts.idle,
        weights,
        kernel: Shape::of(opts.kernel),
        high: opts.high.then(|| Shape::of(Kernel::Small)),
        seconds: opts.seconds,
        identity: match identity {
            Identity::Uids => "uid (the bench runs as root), on a Unix socket with shared memory",
            Identity::Tokens => "token, over loopback TCP (run as root for uids and shared memory)",
        },
        sharing: opts.sharing.map(Sharing::name),
        slice_ms: opts.slice.map(|s| s.as_secs_f64() * 1e3),
        native_alone,
        columns,
    };
    print!("{}", report.render());
    if let Some(path) = &opts.json {
        let json = serde_json::to_vec_pretty(&report)?;
        std::fs::write(path, json).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// What every column shares.
struct Bench<'a> {
    exe: &'a Path,
    /// Without gpuplex's front-end, so that `system` finds the real driver.
    library_path: OsString,
    seconds: f64,
    lead: Duration,
    /// Every tenant configured: the benched ones, then the high one.
    tenants: &'a [Tenant],
    /// The benched tenants that run (the first ones).
    running: usize,
}

impl Bench<'_> {
    /// One tenant alone (and the high one alone), then all that run together.
    fn column(&self, name: &str, site: &Site<'_>, dir: &Path) -> Result<Column, Error> {
        eprint!("gpuplex bench: {name}: one alone");
        let first = &self.tenants[0];
        let alone = self.run(name, site, &[first], dir, "alone")?.remove(0);
        let high = self.tenants.iter().find(|t| t.high);
        let high_alone = match high {
            Some(h) => {
                eprint!(", high alone");
                Some(self.run(name, site, &[h], dir, "high-alone")?.remove(0))
            }
            None => None,
        };
        eprint!(", together");
        let together: Vec<&Tenant> = self.tenants[..self.running].iter().chain(high).collect();
        let before = site.server.map(TenantServer::gpu_seconds).transpose()?;
        let results = self.run(name, site, &together, dir, "together")?;
        let after = site.server.map(TenantServer::gpu_seconds).transpose()?;
        eprintln!();
        let rows = together
            .iter()
            .zip(results)
            .map(|(t, result)| Row {
                name: t.name.clone(),
                kernel: t.kernel.name(),
                priority: if t.high { "high" } else { "normal" },
                weight: t.weight,
                weight_share: None,
                result,
                gpu_seconds: after.as_ref().map(|a| {
                    let took = |m: &BTreeMap<String, f64>| m.get(&t.name).copied().unwrap_or(0.0);
                    took(a) - before.as_ref().map_or(0.0, took)
                }),
                share: None,
            })
            .collect();
        let share_of = if site.server.is_some() { ShareOf::GpuTime } else { ShareOf::Throughput };
        Ok(Column::measured(name, share_of, alone, high_alone, rows, high.is_some()))
    }

    /// Runs `tenants` at once, all windows from the same start; each one's loop.
    fn run(
        &self,
        column: &str,
        site: &Site<'_>,
        tenants: &[&Tenant],
        dir: &Path,
        label: &str,
    ) -> Result<Vec<Loop>, Error> {
        let start = child::wall() + self.lead.as_secs_f64();
        let mut running = Running(Vec::new());
        for t in tenants {
            let (out, err) = (dir.join(format!("{label}-{}.out", t.name)), dir.join(format!("{label}-{}.err", t.name)));
            let files = File::create(&out).and_then(|o| Ok((o, File::create(&err)?)));
            let (o, e) = files.map_err(|e| format!("cannot create files in {}: {e}", dir.display()))?;
            let mut cmd = self.command(site, t, start);
            let process = cmd.stdin(Stdio::null()).stdout(o).stderr(e).spawn();
            let process = process.map_err(|e| format!("{column}: cannot start {}: {e}", self.exe.display()))?;
            running.0.push((t.name.clone(), process, out, err));
        }
        let deadline = Instant::now() + self.lead + Duration::from_secs_f64(self.seconds) + Duration::from_secs(120);
        let mut loops = BTreeMap::new();
        while loops.len() < running.0.len() {
            for (name, process, out, err) in &mut running.0 {
                if loops.contains_key(name) {
                    continue;
                }
                let Some(status) = process.try_wait()? else { continue };
                let tail = || tail(&carrier::read_lossy(err), 8);
                if !status.success() {
                    return Err(format!("{column}: tenant {name} ({label}) failed ({status}):\n{}", tail()).into());
                }
                let line = carrier::read_lossy(out);
                let result: Loop = serde_json::from_str(line.trim())
                    .map_err(|e| format!("{column}: tenant {name} ({label}): unreadable output {line:?}: {e}"))?;
                if result.late_ms > self.seconds * 1e3 / 10.0 {
                    eprint!(" (tenant {name} began {:.0} ms after the others' start)", result.late_ms);
                }
                loops.insert(name.clone(), result);
            }
            if Instant::now() > deadline {
                return Err(format!("{column}: the tenants of {label} did not finish in time").into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(tenants.iter().map(|t| loops.remove(&t.name).expect("every tenant's loop")).collect())
    }

    /// `gpuplex bench-tenant` for `t` in `site`, with only the site's client variables.
    fn command(&self, site: &Site<'_>, t: &Tenant, start: f64) -> Command {
        let mut cmd = Command::new(self.exe);
        cmd.arg("bench-tenant").arg("--library").arg(&site.library);
        cmd.args(["--kernel", t.kernel.name(), "--seconds", &self.seconds.to_string(), "--start"]);
        cmd.arg(format!("{start:.6}"));
        for var in CLIENT_VARS {
            cmd.env_remove(var);
        }
        cmd.env("LD_LIBRARY_PATH", &self.library_path).envs(site.env.iter().map(|(k, v)| (k, v)));
        // Natively every process keeps the bench's own uid: an MPS daemon
        // serves one user at a time.
        if let Some(server) = site.server {
            cmd.envs(server.client_env(t));
            if server.identity == Identity::Uids {
                // Run by root with a uid set, std clears the supplementary groups too.
                let uid = FIRST_UID + t.index;
                cmd.uid(uid).gid(uid);
            }
        }
        cmd
    }
}

/// The tenants' processes of a run, killed if the run ends before they do.
struct Running(Vec<(String, Child, PathBuf, PathBuf)>);

impl Drop for Running {
    fn drop(&mut self) {
        for (_, process, _, _) in &mut self.0 {
            if let Ok(None) = process.try_wait() {
                let _ = process.kill();
                let _ = process.wait();
            }
        }
    }
}

/// The last `n` lines of `text` that say something, indented.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().map(str::trim_end).filter(|l| !l.is_empty()).collect();
    let tail = &lines[lines.len().saturating_sub(n)..];
    if tail.is_empty() {
        "  (nothing on stderr)".to_owned()
    } else {
        tail.iter().map(|l| format!("  {l}")).collect::<Vec<_>>().join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_are_one_per_tenant_and_default_to_one() {
        assert_eq!(weights(3, &[]), Ok(vec![1, 1, 1]));
        assert_eq!(weights(3, &[1, 2, 4]), Ok(vec![1, 2, 4]));
        let e = weights(3, &[1, 2]).unwrap_err();
        assert!(e.contains("2 weight(s) for 3 tenant(s)"), "{e}");
        assert!(weights(2, &[1, 0]).unwrap_err().contains("0 is not a weight"));
        assert!(weights(1, &[1001]).is_err());
    }

    fn options(tenants: usize, idle: usize) -> Options {
        Options {
            backend: BackendKind::Emulated,
            tenants,
            weights: Vec::new(),
            kernel: Kernel::Long,
            policies: vec![Policy::Fair],
            idle,
            high: false,
            seconds: 1.0,
            sharing: None,
            slice: None,
            json: None,
        }
    }

    #[test]
    fn at_least_one_tenant_runs() {
        assert!(check(&options(3, 2)).is_ok());
        assert!(check(&options(3, 3)).unwrap_err().contains("at least one must run"));
        assert!(check(&options(0, 0)).is_err());
        let mut no_time = options(1, 0);
        no_time.seconds = 0.0;
        assert!(check(&no_time).is_err());
    }
}
