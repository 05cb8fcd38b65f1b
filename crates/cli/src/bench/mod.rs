//! `gpuplex bench`: the same driver-API microbenchmarks natively and through
//! gpuplex on each carrier, in one run, side by side.
//!
//! Each sample is taken by a child process, `gpuplex bench-worker`
//! (`worker.rs`), that loads one libcuda by path (`driver.rs`) and runs
//! identical code against it: the machine's driver for the native column,
//! gpuplex's front-end for the others, each against a server of its
//! carrier's own (`carrier.rs`), started once and kept for the whole run.
//! A child per sample keeps one driver's state, crashes and memory out of
//! the others' numbers and out of this process. `report.rs` names the
//! metrics and holds the report; `table.rs` prints it.
//!
//! Every value is the median of several independent samples, reported with
//! their count, minimum and maximum: with one sample per metric, the same
//! GPU's numbers spread widely from run to run (async launch from x1.02 to
//! x1.49 of native, pinned 64 MiB bandwidth from x0.89 to x0.98). Samples
//! are taken in rounds of one per column, in alternating order, each by a
//! fresh worker: within one process the samples agreed closely while whole
//! runs differed (a 4-byte read through shared memory took 7.9 µs in one
//! run and 9.0 in the next), so that where a process's threads land and
//! how the machine drifts fall on every column alike.
//!
//! A round takes the latency rows of every column first, in turns
//! (`latency.rs`): one worker per column, all started at once, and the
//! columns take turns of about 10 ms at the machine, so that the spells in
//! which this VM's driver calls ran slow fall on every column alike. Then
//! each column's bandwidth rows, a worker each, in the round's order.
//!
//! `gpuplex bench --tenants N` measures something else, how tenants share a
//! GPU, with processes of its own: see `tenants/`.

mod carrier;
mod driver;
mod lanes_alone;
mod latency;
mod report;
mod table;
pub mod tenants;
pub mod worker;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::File;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use gpuplex_server::BackendKind;

pub use carrier::CarrierKind;
use gpuplex_server::session::lanes::Shape;
pub use report::SAMPLES as ROUNDS;
use report::{Cell, Column, Device, Machine, Report, Summary, WorkerReport, NATIVE};
use worker::Part;

use crate::Error;

pub struct Options {
    pub backend: BackendKind,
    pub carriers: Vec<CarrierKind>,
    pub json: Option<PathBuf>,
    pub quick: bool,
    /// Rounds of every column (odd): each adds a sample to every row.
    pub rounds: usize,
    /// Another build's folder (its `gpuplex` and `libcuda.so`): each
    /// carrier is measured through it too, as `CARRIER@base`, in the same
    /// rounds, so that a change is judged against what it replaces.
    pub baseline: Option<PathBuf>,
    /// No round is started that would end later than this after the first
    /// began; the report covers the rounds taken.
    pub time_limit: Option<Duration>,
    /// Only the latency rows, or only the bandwidth rows.
    pub only: Option<Part>,
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

    // Every column first, each carrier with its server (kept for every round).
    let mut lineup = Vec::new();
    if opts.backend == BackendKind::Cuda {
        let column = Column { library: Some("libcuda.so.1".into()), ..Column::new(NATIVE) };
        lineup.push(Entry::new(column, "system".into(), None, None, scratch.subdir(NATIVE)?));
    }
    let mut carriers = Vec::new();
    for &c in &opts.carriers {
        if !carriers.contains(&c) {
            carriers.push(c);
        }
    }
    let mut builds = vec![(String::new(), exe.clone(), frontend.clone())];
    if let Some(base) = &opts.baseline {
        let (base_exe, base_frontend) = (base.join("gpuplex"), base.join("libcuda.so"));
        if !base_exe.is_file() || !base_frontend.is_file() {
            return Err(format!("--baseline {}: want gpuplex and libcuda.so there", base.display()).into());
        }
        builds.push((report::BASE_SUFFIX.to_owned(), base_exe, base_frontend));
    }
    for kind in carriers {
        for (suffix, exe, frontend) in &builds {
            let name = format!("{}{suffix}", kind.name());
            let dir = scratch.subdir(&name)?;
            let mut column = Column { library: Some(frontend.display().to_string()), ..Column::new(&name) };
            let (server, error) = match carrier::Server::start(exe, backend, kind, &dir, &library_path) {
                Ok(server) => {
                    column.server = Some(server.address.clone());
                    column.env = server.client_env.iter().cloned().collect();
                    (Some(server), None)
                }
                Err(e) => {
                    eprintln!("gpuplex bench: {name}: unavailable: {e}");
                    (None, Some(format!("unavailable: {e}")))
                }
            };
            let mut entry = Entry::new(column, frontend.clone().into_os_string(), Some(kind), server, dir);
            entry.error = error;
            lineup.push(entry);
        }
    }

    // SAMPLES rounds. A round takes every column's latency rows, the
    // columns taking turns (see `latency.rs`), then their bandwidth rows,
    // each from a fresh worker. The columns' order alternates from round to
    // round (and from turn to turn): whatever drifts on the machine (clocks,
    // neighbours) and wherever a process's threads land then fall on every
    // column alike, instead of on whichever ran at a bad moment.
    let (began, mut slowest, mut rounds) = (Instant::now(), Duration::ZERO, 0);
    for round in 0..opts.rounds {
        if !another_round_fits(began.elapsed(), slowest, opts.time_limit) {
            eprintln!("gpuplex bench: round {} would end past the time limit; reporting the {round} taken", round + 1);
            break;
        }
        let started = Instant::now();
        eprint!("gpuplex bench: round {}/{}:", round + 1, opts.rounds);
        if opts.only != Some(Part::Bandwidth) {
            eprint!(" latency");
            let workers = lineup.iter().map(|e| e.turn_worker(&worker)).collect();
            for (entry, report) in lineup.iter_mut().zip(latency::round(workers, round % 2 == 1)) {
                entry.took(report);
            }
        }
        if opts.only != Some(Part::Latency) {
            eprint!("{} bandwidth", if opts.only.is_none() { ";" } else { "" });
            for i in order(lineup.len(), round % 2 == 1) {
                let entry = &mut lineup[i];
                entry.take(&worker, Part::Bandwidth);
                // A column that has failed takes no more samples of either.
                if entry.error.is_none() {
                    entry.lanes_alone(opts.quick);
                }
            }
        }
        eprintln!(" ({:.1} s)", started.elapsed().as_secs_f64());
        slowest = slowest.max(started.elapsed());
        rounds += 1;
    }
    let lanes_alone: BTreeMap<String, Cell> = lineup.iter().filter_map(Entry::lanes_alone_cell).collect();
    let columns: Vec<(Column, Result<WorkerReport, String>)> = lineup.into_iter().map(Entry::finish).collect();

    let mut report = assemble(backend, opts.quick, rounds, columns);
    if let Some(part) = opts.only {
        report.rows.retain(|row| report::part_of(&row.name) == part);
    }
    if !lanes_alone.is_empty() {
        report.rows.push(report::lanes_alone_row(Shape::configured(), lanes_alone));
    }
    report::compare_with_base(&mut report.rows, report.rounds);
    print!("{}", table::render(&report));
    if let Some(path) = &opts.json {
        let json = serde_json::to_vec_pretty(&report)?;
        std::fs::write(path, json).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(if report.passed() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Indices `0..n`, backwards if `reversed`: the order the columns go in.
fn order(n: usize, reversed: bool) -> Vec<usize> {
    if reversed {
        (0..n).rev().collect()
    } else {
        (0..n).collect()
    }
}

/// One column through the rounds.
struct Entry {
    column: Column,
    /// The libcuda its worker loads (`system` for the machine's).
    library: OsString,
    /// None for the native column.
    carrier: Option<CarrierKind>,
    server: Option<carrier::Server>,
    dir: PathBuf,
    /// Every worker's, in the order taken.
    reports: Vec<WorkerReport>,
    /// Set by the first failure: the column takes no more samples.
    error: Option<String>,
    /// The lanes alone, a sample a round, where the column's copies take lanes.
    lanes_alone: Result<Vec<f64>, String>,
}

impl Entry {
    fn new(
        column: Column,
        library: OsString,
        carrier: Option<CarrierKind>,
        server: Option<carrier::Server>,
        dir: PathBuf,
    ) -> Entry {
        Entry { column, library, carrier, server, dir, reports: Vec::new(), error: None, lanes_alone: Ok(Vec::new()) }
    }

    fn takes_lanes(&self) -> bool {
        matches!(self.carrier, Some(CarrierKind::Socket | CarrierKind::Tcp))
    }

    /// Takes a sample of the `part` of the column's rows from a fresh
    /// worker. The first failure ends the column's sampling.
    fn take(&mut self, worker: &Worker<'_>, part: Part) {
        if self.error.is_none() {
            eprint!(" {}", self.column.name);
            let env = self.server.as_ref().map_or(&[][..], |s| &s.client_env[..]);
            self.took(worker.run(&self.library, env, &self.dir, part));
        }
    }

    /// A worker for this round's latency turns, or why the column has none.
    fn turn_worker(&self, worker: &Worker<'_>) -> Result<latency::TurnWorker, String> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        let env = self.server.as_ref().map_or(&[][..], |s| &s.client_env[..]);
        worker.turns(&self.library, env, &self.dir)
    }

    /// Keeps a worker's report, or the column's first failure.
    fn took(&mut self, report: Result<WorkerReport, String>) {
        if self.error.is_some() {
            return;
        }
        match report.and_then(|w| self.check(w)) {
            Ok(w) => self.reports.push(w),
            Err(e) => {
                eprint!(" ({}: {e})", self.column.name);
                self.error = Some(e);
            }
        }
    }

    /// Takes this round's sample of the lanes alone, right after the
    /// column's own, so that both see the machine alike.
    fn lanes_alone(&mut self, quick: bool) {
        if !self.takes_lanes() {
            return;
        }
        let (Some(kind), Ok(samples)) = (self.carrier, &mut self.lanes_alone) else { return };
        let bytes = *report::bandwidth_sizes(quick).last().expect("bandwidth sizes");
        let passes = if quick { 2 } else { 8 };
        match lanes_alone::measure(kind, Shape::configured(), bytes, passes) {
            Ok(gbps) => samples.push(gbps),
            Err(e) => {
                eprint!(" (lanes alone: {e})");
                self.lanes_alone = Err(format!("failed: {e}"));
            }
        }
    }

    fn lanes_alone_cell(&self) -> Option<(String, Cell)> {
        let cell = match (&self.error, &self.lanes_alone) {
            _ if !self.takes_lanes() => return None,
            // The column's own failure (or absence) says why.
            (Some(e), _) => Cell::failed(e),
            (None, Ok(samples)) => Summary::of(samples).map_or_else(|| Cell::failed("not measured"), |s| Cell::of(&s)),
            (None, Err(e)) => Cell::failed(e),
        };
        Some((self.column.name.clone(), cell))
    }

    /// A worker's report, if it loaded the kind of libcuda the column is for.
    fn check(&self, w: WorkerReport) -> Result<WorkerReport, String> {
        match (self.carrier.is_some(), w.gpuplex) {
            (false, true) => Err(format!("failed: {} is gpuplex's front-end, not the machine's driver", w.library)),
            (true, false) => Err(format!("failed: {} is not gpuplex's front-end", w.library)),
            _ => Ok(w),
        }
    }

    /// The column and its reports merged (its server stops here).
    fn finish(self) -> (Column, Result<WorkerReport, String>) {
        let mut column = self.column;
        let outcome = match self.error {
            Some(e) => Err(e),
            None => WorkerReport::merge(self.reports).ok_or_else(|| "failed: no samples".to_owned()),
        };
        if let Ok(w) = &outcome {
            column.library = Some(w.library.clone());
        }
        (column, outcome)
    }
}

/// Whether a round as slow as the slowest so far would end within the
/// time limit, if there is one; the first round always runs.
fn another_round_fits(elapsed: Duration, slowest: Duration, limit: Option<Duration>) -> bool {
    limit.is_none_or(|limit| slowest.is_zero() || elapsed + slowest <= limit)
}

fn assemble(
    backend: &str,
    quick: bool,
    rounds: usize,
    mut columns: Vec<(Column, Result<WorkerReport, String>)>,
) -> Report {
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
        rounds,
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

    /// `gpuplex bench-worker` for `library`, with only the column's own
    /// client variables.
    fn command(&self, library: &std::ffi::OsStr, env: &[(String, String)]) -> Command {
        let mut cmd = Command::new(self.exe);
        cmd.arg("bench-worker").arg("--library").arg(library);
        if self.quick {
            cmd.arg("--quick");
        }
        for var in CLIENT_VARS {
            cmd.env_remove(var);
        }
        cmd.env("LD_LIBRARY_PATH", self.library_path).envs(env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// A worker answering latency turns; its stderr goes to a file in `dir`.
    fn turns(
        &self,
        library: &std::ffi::OsStr,
        env: &[(String, String)],
        dir: &Path,
    ) -> Result<latency::TurnWorker, String> {
        let err_path = dir.join("turns.err");
        let err = File::create(&err_path).map_err(|e| format!("failed: cannot create {}: {e}", err_path.display()))?;
        let mut cmd = self.command(library, env);
        cmd.arg("--turns").stderr(err);
        latency::TurnWorker::spawn(cmd, err_path, self.timeout())
    }

    /// The worker's report, or `failed: <why>`. Output goes to files in `dir`
    /// so that a chatty child can never block on a full pipe.
    fn run(
        &self,
        library: &std::ffi::OsStr,
        env: &[(String, String)],
        dir: &Path,
        part: Part,
    ) -> Result<WorkerReport, String> {
        let (out_path, err_path) = (dir.join("worker.out"), dir.join("worker.err"));
        let files = File::create(&out_path).and_then(|o| Ok((o, File::create(&err_path)?)));
        let (out, err) = files.map_err(|e| format!("failed: cannot create files in {}: {e}", dir.display()))?;
        let mut cmd = self.command(library, env);
        cmd.arg("--samples").arg("1").arg("--part").arg(part.name());
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

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(carrier: Option<CarrierKind>, error: Option<&str>) -> Entry {
        let name = carrier.map_or(NATIVE, CarrierKind::name);
        let mut e = Entry::new(Column::new(name), "x".into(), carrier, None, PathBuf::new());
        e.error = error.map(str::to_owned);
        e
    }

    #[test]
    fn a_round_starts_only_if_one_as_slow_as_the_slowest_ends_in_time() {
        let s = Duration::from_secs;
        assert!(another_round_fits(s(100), s(50), None));
        assert!(another_round_fits(s(0), Duration::ZERO, Some(Duration::ZERO)), "the first always runs");
        assert!(another_round_fits(s(20), s(10), Some(s(30))));
        assert!(!another_round_fits(s(21), s(10), Some(s(30))));
    }

    #[test]
    fn lanes_alone_cells_are_for_lane_columns_and_carry_their_failures() {
        assert!(entry(None, None).lanes_alone_cell().is_none());
        assert!(entry(Some(CarrierKind::Shm), None).lanes_alone_cell().is_none());
        let mut tcp = entry(Some(CarrierKind::Tcp), None);
        tcp.lanes_alone = Ok(vec![3.0, 1.0, 2.0]);
        let (name, cell) = tcp.lanes_alone_cell().unwrap();
        assert_eq!((name.as_str(), cell.value, cell.samples), ("tcp", Some(2.0), Some(3)));
        // A column that never ran says why, as its other cells do.
        let (_, cell) = entry(Some(CarrierKind::Socket), Some("unavailable: no")).lanes_alone_cell().unwrap();
        assert_eq!((cell.value, cell.error.as_deref()), (None, Some("unavailable: no")));
        let mut broken = entry(Some(CarrierKind::Tcp), None);
        broken.lanes_alone = Err("failed: send".into());
        assert_eq!(broken.lanes_alone_cell().unwrap().1.error.as_deref(), Some("failed: send"));
    }
}
