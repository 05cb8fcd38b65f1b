//! `gpuplex bench`: the same driver-API microbenchmarks natively and through
//! gpuplex on each carrier, in one run, side by side.
//!
//! Each column is measured by a child process, `gpuplex bench-worker`
//! (`worker.rs`), that loads one libcuda by path (`driver.rs`) and runs
//! identical code against it: the machine's driver for the native column,
//! gpuplex's front-end for the others, each against a fresh server started
//! for that carrier alone (`carrier.rs`). A child per column keeps one
//! driver's state, crashes and memory out of the others' numbers and out of
//! this process. `report.rs` names the metrics and holds the report;
//! `table.rs` prints it.
//!
//! Every value is the median of several independent samples, reported with
//! their count, minimum and maximum: with one sample per metric, the same
//! GPU's numbers spread widely from run to run (async launch from x1.02 to
//! x1.49 of native, pinned 64 MiB bandwidth from x0.89 to x0.98). Every
//! column runs the same worker with the same plan, so native and gpuplex
//! are sampled alike and their medians compare.

mod carrier;
mod driver;
mod report;
mod table;
pub mod worker;

use std::ffi::OsString;
use std::fs::File;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use gpuplex_server::BackendKind;

pub use carrier::CarrierKind;
use report::{Column, Device, Machine, Report, WorkerReport, NATIVE};

use crate::Error;

pub struct Options {
    pub backend: BackendKind,
    pub carriers: Vec<CarrierKind>,
    pub json: Option<PathBuf>,
    pub quick: bool,
}

/// Variables that steer the front-end; a worker gets only those of its own column.
const CLIENT_VARS: [&str; 3] = ["GPUPLEX_SERVER", "GPUPLEX_CARRIER", "GPUPLEX_TOKEN_FILE"];

pub fn bench(opts: Options) -> Result<ExitCode, Error> {
    let exe = std::env::current_exe()?;
    let frontend = crate::run::frontend()?;
    let backend = match opts.backend {
        BackendKind::Cuda => "cuda",
        BackendKind::Emulated => "emulated",
    };
    let scratch = Scratch::create()?;
    let library_path = library_path_without(&frontend);
    let worker = Worker { exe: &exe, quick: opts.quick, library_path: &library_path };

    let mut columns = Vec::new();
    if opts.backend == BackendKind::Cuda {
        let dir = scratch.subdir(NATIVE)?;
        let started = Instant::now();
        eprint!("gpuplex bench: native ... ");
        let outcome = worker.run("system".as_ref(), &[], &dir).and_then(|w| {
            if w.gpuplex {
                return Err(format!("failed: {} is gpuplex's front-end, not the machine's driver", w.library));
            }
            Ok(w)
        });
        eprintln!("{}", progress(&outcome, started));
        let column = Column { library: Some(library_of(&outcome, "libcuda.so.1")), ..Column::new(NATIVE) };
        columns.push((column, outcome));
    }
    let mut carriers = Vec::new();
    for &c in &opts.carriers {
        if !carriers.contains(&c) {
            carriers.push(c);
        }
    }
    for kind in carriers {
        let dir = scratch.subdir(kind.name())?;
        let started = Instant::now();
        eprint!("gpuplex bench: {} ... ", kind.name());
        let mut column = Column::new(kind.name());
        let outcome = match carrier::Server::start(&exe, backend, kind, &dir, &library_path) {
            Err(e) => Err(format!("unavailable: {e}")),
            Ok(server) => {
                column.server = Some(server.address.clone());
                column.env = server.client_env.iter().cloned().collect();
                let outcome = worker.run(frontend.as_os_str(), &server.client_env, &dir);
                drop(server);
                outcome.and_then(|w| {
                    if !w.gpuplex {
                        return Err(format!("failed: {} is not gpuplex's front-end", w.library));
                    }
                    Ok(w)
                })
            }
        };
        eprintln!("{}", progress(&outcome, started));
        column.library = Some(library_of(&outcome, &frontend.display().to_string()));
        columns.push((column, outcome));
    }

    let report = assemble(backend, opts.quick, columns);
    print!("{}", table::render(&report));
    if let Some(path) = &opts.json {
        let json = serde_json::to_vec_pretty(&report)?;
        std::fs::write(path, json).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(if report.passed() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn library_of(outcome: &Result<WorkerReport, String>, asked: &str) -> String {
    outcome.as_ref().map(|w| w.library.clone()).unwrap_or_else(|_| asked.to_owned())
}

fn progress(outcome: &Result<WorkerReport, String>, started: Instant) -> String {
    match outcome {
        Ok(_) => format!("done in {:.1} s", started.elapsed().as_secs_f64()),
        Err(e) => e.clone(),
    }
}

fn assemble(backend: &str, quick: bool, mut columns: Vec<(Column, Result<WorkerReport, String>)>) -> Report {
    for (column, outcome) in &mut columns {
        match outcome {
            Ok(w) => column.data_checks = Some(w.checks.clone()),
            Err(e) => column.error = Some(e.clone()),
        }
    }
    let device = columns.iter().find_map(|(_, o)| o.as_ref().ok()).map(|w| Device {
        name: w.device.clone(),
        driver_version: format!("{}.{}", w.driver_version / 1000, w.driver_version % 1000 / 10),
    });
    let rows = Report::rows(&columns, quick);
    Report {
        gpuplex_version: env!("CARGO_PKG_VERSION").into(),
        backend: backend.into(),
        quick,
        unix_time: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        machine: machine(),
        device,
        columns: columns.into_iter().map(|(c, _)| c).collect(),
        rows,
    }
}

/// Runs `gpuplex bench-worker` for one column.
struct Worker<'a> {
    exe: &'a Path,
    quick: bool,
    /// `LD_LIBRARY_PATH` without gpuplex's front-end, so that `system` finds the real driver.
    library_path: &'a OsString,
}

impl Worker<'_> {
    fn timeout(&self) -> Duration {
        Duration::from_secs(if self.quick { 300 } else { 900 })
    }

    /// The worker's report, or `failed: <why>`. Output goes to files in `dir`
    /// so that a chatty child can never block on a full pipe.
    fn run(&self, library: &std::ffi::OsStr, env: &[(String, String)], dir: &Path) -> Result<WorkerReport, String> {
        let (out_path, err_path) = (dir.join("worker.out"), dir.join("worker.err"));
        let files = File::create(&out_path).and_then(|o| Ok((o, File::create(&err_path)?)));
        let (out, err) = files.map_err(|e| format!("failed: cannot create files in {}: {e}", dir.display()))?;
        let mut cmd = Command::new(self.exe);
        cmd.arg("bench-worker").arg("--library").arg(library);
        if self.quick {
            cmd.arg("--quick");
        }
        for var in CLIENT_VARS {
            cmd.env_remove(var);
        }
        cmd.env("LD_LIBRARY_PATH", self.library_path).envs(env.iter().map(|(k, v)| (k, v)));
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("failed: cannot start {}: {e}", self.exe.display()))?;
        let deadline = Instant::now() + self.timeout();
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("failed: no answer within {} s", self.timeout().as_secs()));
                }
                Err(e) => return Err(format!("failed: {e}")),
            }
        };
        if !status.success() {
            let stderr = carrier::read_lossy(&err_path);
            return Err(format!("failed: {}", carrier::failure_reason(&stderr, &status.to_string())));
        }
        let stdout = std::fs::read(&out_path).unwrap_or_default();
        serde_json::from_slice(&stdout).map_err(|e| format!("failed: unreadable worker output: {e}"))
    }
}

/// `LD_LIBRARY_PATH` less the directories whose `libcuda.so.1` is `frontend`.
fn library_path_without(frontend: &Path) -> OsString {
    let ours = std::fs::canonicalize(frontend).ok();
    let path = std::env::var_os("LD_LIBRARY_PATH").unwrap_or_default();
    let kept = std::env::split_paths(&path).filter(|dir| std::fs::canonicalize(dir.join("libcuda.so.1")).ok() != ours);
    std::env::join_paths(kept.collect::<Vec<_>>()).unwrap_or_default()
}

/// A private directory for sockets, tokens and logs, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn create() -> Result<Scratch, Error> {
        let dir = std::env::temp_dir().join(format!("gpuplex-bench-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        Ok(Scratch(dir))
    }

    fn subdir(&self, name: &str) -> Result<PathBuf, Error> {
        let dir = self.0.join(name);
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        Ok(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu =
        cpuinfo.lines().find_map(|l| l.strip_prefix("model name")).map(|l| l.trim_start_matches([' ', '\t', ':']));
    let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_owned()).unwrap_or_default();
    Machine {
        hostname: read("/proc/sys/kernel/hostname"),
        cpu: cpu.unwrap_or_default().to_owned(),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        kernel: format!("{} {}", read("/proc/sys/kernel/ostype"), read("/proc/sys/kernel/osrelease")),
    }
}
