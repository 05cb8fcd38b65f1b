//! What the bench measures and what it reports: the metric catalog that the
//! worker and the parent share (so a row can never be measured under one name
//! and printed under another), the worker's answer, and the report that is
//! printed as a table or written as JSON.
//!
//! Every value is the median of independent samples (one per round for a
//! bandwidth row, [`LATENCY_SAMPLES_PER_ROUND`] for a latency row), reported with their
//! count, minimum and maximum (see [`Summary`]); each sample of a column
//! comes from a worker process of its own (see `mod.rs`).

use std::collections::BTreeMap;

use gpuplex_server::session::lanes::Shape;
use serde::{Deserialize, Serialize};

use super::worker::Part;

pub const KIB: usize = 1 << 10;
pub const MIB: usize = 1 << 20;

/// Rounds unless `--rounds` says, and so independent samples per
/// bandwidth metric, for every column and with `--quick` alike. Odd, so
/// that the median is a measured sample.
pub const SAMPLES: usize = 5;

/// Samples per latency metric per round, each the mean of a few turns
/// (see `latency.rs`). The latency rows take a fraction of a second, and on
/// the H100 machine (a VM) they moved most from spell to spell, so they get
/// more samples. Odd, as [`SAMPLES`] is.
pub const LATENCY_SAMPLES_PER_ROUND: usize = 3;

/// The transfer sizes of the bandwidth rows.
const BANDWIDTH_SIZES: [usize; 4] = [4 * KIB, MIB, 64 * MIB, 256 * MIB];

/// The sizes measured: `--quick` leaves out the largest, whose copies alone
/// would take most of its time (seconds each in a debug build).
pub fn bandwidth_sizes(quick: bool) -> &'static [usize] {
    if quick {
        &BANDWIDTH_SIZES[..3]
    } else {
        &BANDWIDTH_SIZES
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    Lower,
    Higher,
}

/// One row of the report.
pub struct Metric {
    pub name: String,
    pub label: String,
    pub unit: &'static str,
    pub better: Better,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    HostToDevice,
    DeviceToHost,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostMemory {
    /// Ordinary `malloc`'d memory.
    Pageable,
    /// `cuMemAllocHost`.
    Pinned,
}

pub const LAUNCH_ASYNC: &str = "launch_async";
pub const LAUNCH_SYNC: &str = "launch_sync";
pub const GRAPH_100: &str = "graph_100_kernels";
pub const COPY_HTOD_4B: &str = "memcpy_htod_4B";
pub const COPY_DTOH_4B: &str = "memcpy_dtoh_4B";
pub const ALLOC_FREE_1MIB: &str = "alloc_free_1MiB";
pub const ALLOC_FREE_1MIB_BESIDE: &str = "alloc_free_1MiB_beside";

/// The latency rows, in the order measured and printed.
pub const LATENCY_METRICS: [&str; 7] =
    [LAUNCH_ASYNC, LAUNCH_SYNC, GRAPH_100, COPY_HTOD_4B, COPY_DTOH_4B, ALLOC_FREE_1MIB, ALLOC_FREE_1MIB_BESIDE];

/// Which part of a round measures row `name`.
pub fn part_of(name: &str) -> Part {
    if LATENCY_METRICS.contains(&name) {
        Part::Latency
    } else {
        Part::Bandwidth
    }
}

/// `4 KiB`, `64 MiB`.
pub fn size_label(bytes: usize) -> String {
    if bytes >= MIB {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{} KiB", bytes / KIB)
    }
}

impl Direction {
    pub fn name(self) -> &'static str {
        match self {
            Direction::HostToDevice => "h2d",
            Direction::DeviceToHost => "d2h",
        }
    }
}

impl HostMemory {
    pub fn name(self) -> &'static str {
        match self {
            HostMemory::Pageable => "pageable",
            HostMemory::Pinned => "pinned",
        }
    }
}

/// The row name of one bandwidth measurement, e.g. `h2d_pinned_64MiB`.
pub fn bandwidth_metric(dir: Direction, mem: HostMemory, bytes: usize) -> String {
    format!("{}_{}_{}", dir.name(), mem.name(), size_label(bytes).replace(' ', ""))
}

/// Every row, in the order printed.
pub fn catalog(quick: bool) -> Vec<Metric> {
    let time =
        |name: &str, label: &str| Metric { name: name.into(), label: label.into(), unit: "us", better: Better::Lower };
    let mut rows = vec![
        time(LAUNCH_ASYNC, "empty-kernel launch, async, per launch"),
        time(LAUNCH_SYNC, "empty-kernel launch + stream sync"),
        time(GRAPH_100, "graph of 100 empty kernels: launch + sync"),
        time(COPY_HTOD_4B, "4 B copy host->device"),
        time(COPY_DTOH_4B, "4 B copy device->host"),
        time(ALLOC_FREE_1MIB, "1 MiB cuMemAlloc + cuMemFree"),
        time(ALLOC_FREE_1MIB_BESIDE, "the same, 4 B held meanwhile"),
    ];
    for mem in [HostMemory::Pageable, HostMemory::Pinned] {
        for dir in [Direction::HostToDevice, Direction::DeviceToHost] {
            for &bytes in bandwidth_sizes(quick) {
                rows.push(Metric {
                    name: bandwidth_metric(dir, mem, bytes),
                    label: format!("{} {} {}", dir.name().to_uppercase(), mem.name(), size_label(bytes)),
                    unit: "GB/s",
                    better: Better::Higher,
                });
            }
        }
    }
    rows
}

/// One measurement: its samples summarised, or why there is none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Measured(Summary),
    Error(String),
}

/// A metric's samples, in the row's unit. The median is the value reported:
/// one sample per metric varied widely from run to run on a real GPU, and a
/// median, unlike a mean, is not moved by one slow or fast sample. The
/// extremes show how far the samples spread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// Every sample, in the order taken.
    pub values: Vec<f64>,
}

impl Summary {
    /// The summary of `samples`, in any order; `None` if there are none.
    pub fn of(samples: &[f64]) -> Option<Summary> {
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let (&min, &max) = (sorted.first()?, sorted.last()?);
        let mid = sorted.len() / 2;
        // An even count has no middle sample: the mean of the two beside the middle.
        let median = if sorted.len() % 2 == 1 { sorted[mid] } else { (sorted[mid - 1] + sorted[mid]) / 2.0 };
        Some(Summary { median, min, max, values: samples.to_vec() })
    }
}

impl WorkerReport {
    /// One column's reports (every worker's, in the order taken) as one:
    /// each metric's samples from every report that measured it, or the
    /// first error of one that failed it; the data checks of them all. None
    /// without reports.
    pub fn merge(reports: Vec<WorkerReport>) -> Option<WorkerReport> {
        let mut reports = reports.into_iter();
        let mut merged = reports.next()?;
        for report in reports {
            for (metric, outcome) in report.results {
                let Some(mine) = merged.results.get_mut(&metric) else {
                    merged.results.insert(metric, outcome);
                    continue;
                };
                if let (Outcome::Measured(a), Outcome::Measured(b)) = (&*mine, &outcome) {
                    let values: Vec<f64> = a.values.iter().chain(&b.values).copied().collect();
                    *mine = Outcome::Measured(Summary::of(&values).expect("samples on both sides"));
                } else if matches!(mine, Outcome::Measured(_)) {
                    *mine = outcome;
                }
            }
            merged.checks.passed += report.checks.passed;
            merged.checks.failed.extend(report.checks.failed);
        }
        Some(merged)
    }
}

/// The data checks one worker ran: each copy path round-trips a pattern.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Checks {
    pub passed: u32,
    /// What failed, one entry per check.
    pub failed: Vec<String>,
}

/// What `gpuplex bench-worker` prints: one column's measurements.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerReport {
    /// The libcuda file measured.
    pub library: String,
    /// Whether that is gpuplex's front-end.
    pub gpuplex: bool,
    pub device: String,
    pub driver_version: i32,
    /// By metric name.
    pub results: BTreeMap<String, Outcome>,
    pub checks: Checks,
}

/// The whole run, as `--json` writes it.
#[derive(Debug, Serialize, Deserialize)]
pub struct Report {
    pub gpuplex_version: String,
    pub backend: String,
    pub quick: bool,
    /// Rounds taken: the samples of a bandwidth row, a third of a latency row's.
    pub rounds: usize,
    pub unix_time: u64,
    pub machine: Machine,
    /// From the first column that reached a device.
    pub device: Option<Device>,
    /// The native column (cuda backend only), then one per carrier.
    pub columns: Vec<Column>,
    pub rows: Vec<Row>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Machine {
    pub hostname: String,
    pub cpu: String,
    pub cpus: usize,
    pub kernel: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Device {
    pub name: String,
    /// As `major.minor`.
    pub driver_version: String,
}

/// How one column was measured, and whether it could be.
#[derive(Debug, Serialize, Deserialize)]
pub struct Column {
    /// `native`, or the carrier's name.
    pub name: String,
    pub library: Option<String>,
    pub server: Option<String>,
    /// The variables the worker got beyond the inherited environment.
    pub env: BTreeMap<String, String>,
    /// Why the column has no values (`unavailable: ...` when its server did
    /// not start, `failed: ...` when the worker did not finish).
    pub error: Option<String>,
    pub data_checks: Option<Checks>,
}

impl Column {
    pub fn new(name: &str) -> Column {
        Column { name: name.into(), library: None, server: None, env: BTreeMap::new(), error: None, data_checks: None }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Row {
    pub name: String,
    pub label: String,
    pub unit: String,
    pub better: Better,
    /// Absent with the emulated backend, which has no native driver, and
    /// from the lanes-alone row, which has nothing native to compare.
    pub native: Option<Cell>,
    /// By carrier name.
    pub carriers: BTreeMap<String, Cell>,
}

/// One value, the median of its samples; `ratio` is gpuplex / native (of
/// the medians), for times and bandwidths alike.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Cell {
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub value: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub ratio: Option<f64>,
    /// The smallest and largest sample: how far they spread around `value`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub min: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub max: Option<f64>,
    /// How many samples `value` is the median of.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub samples: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
    /// Every sample, in the order taken: round by round, as the other
    /// columns' samples of the row.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub values: Vec<f64>,
    /// This build against the baseline's column of the same carrier, where
    /// `--baseline` measured one.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub against_base: Option<AgainstBase>,
}

impl Cell {
    pub fn of(s: &Summary) -> Cell {
        Cell {
            value: Some(s.median),
            min: Some(s.min),
            max: Some(s.max),
            samples: Some(s.values.len()),
            values: s.values.clone(),
            ..Cell::default()
        }
    }

    pub fn failed(why: &str) -> Cell {
        Cell { error: Some(why.into()), ..Cell::default() }
    }
}

/// A build against the baseline measured beside it, judged round by
/// round: each round gives one ratio, this build's samples of the row over
/// the baseline's from the same round (means of each). A round is the
/// independent unit: its fresh workers decide where threads land, and both
/// builds' samples in it are taken turn about, so that the machine's slow
/// spells fall on both and cancel in the ratio, as they do not in a ratio
/// of two medians taken over the whole run. What differs between columns
/// for the whole run, whatever the build, is not in the interval: a
/// comparison of a build with an identical copy shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgainstBase {
    /// The median of the rounds' ratios: > 1 is larger than the baseline's
    /// (slower for times, faster for bandwidths).
    pub ratio: f64,
    /// About 95% confidence that the median ratio lies within `low..=high`.
    pub low: f64,
    pub high: f64,
    pub rounds: usize,
}

impl AgainstBase {
    /// From two columns' samples of one row, in the order taken over
    /// `rounds` rounds. None unless both have the same whole number of
    /// samples in every round.
    pub fn of(new: &[f64], base: &[f64], rounds: usize) -> Option<AgainstBase> {
        if rounds == 0 || new.is_empty() || new.len() != base.len() || !new.len().is_multiple_of(rounds) {
            return None;
        }
        let per_round = new.len() / rounds;
        let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
        let mut ratios: Vec<f64> =
            new.chunks(per_round).zip(base.chunks(per_round)).map(|(n, b)| mean(n) / mean(b)).collect();
        if !ratios.iter().all(|r| r.is_finite()) {
            return None;
        }
        ratios.sort_by(f64::total_cmp);
        let n = ratios.len();
        // The median's distribution-free interval: the order statistics k
        // places in from either end, k from the binomial's normal
        // approximation.
        let k = ((n as f64 - 1.96 * (n as f64).sqrt()) / 2.0).floor().max(0.0) as usize;
        let ratio = Summary::of(&ratios)?.median;
        Some(AgainstBase { ratio, low: ratios[k], high: ratios[n - 1 - k], rounds: n })
    }
}

/// Suffix of a column measured through the baseline (`--baseline`).
pub const BASE_SUFFIX: &str = "@base";

/// Compares every carrier's cells with its baseline column's, where there
/// is one (see [`AgainstBase`]).
pub fn compare_with_base(rows: &mut [Row], rounds: usize) {
    for row in rows {
        let bases: BTreeMap<String, Vec<f64>> = row
            .carriers
            .iter()
            .filter_map(|(name, cell)| Some((name.strip_suffix(BASE_SUFFIX)?.to_owned(), cell.values.clone())))
            .collect();
        for (name, cell) in &mut row.carriers {
            if let Some(base) = bases.get(name) {
                cell.against_base = AgainstBase::of(&cell.values, base, rounds);
            }
        }
    }
}

/// The native column's name.
pub const NATIVE: &str = "native";

/// The row of the lanes alone (see `lanes_alone.rs`): only columns whose
/// copies take lanes have a cell.
pub const LANES_ALONE: &str = "lanes_alone";

/// That row, from its cells by carrier name.
pub fn lanes_alone_row(shape: Shape, carriers: BTreeMap<String, Cell>) -> Row {
    Row {
        name: LANES_ALONE.into(),
        label: format!("lanes alone ({} x {}), no GPU", shape.lanes, size_label(shape.chunk)),
        unit: "GB/s".into(),
        better: Better::Higher,
        native: None,
        carriers,
    }
}

impl Report {
    /// Builds the rows from each column's worker answer (or the reason it has none).
    pub fn rows(columns: &[(Column, Result<WorkerReport, String>)], quick: bool) -> Vec<Row> {
        let cell = |outcome: &Result<WorkerReport, String>, name: &str| match outcome {
            Err(e) => Cell::failed(e),
            Ok(w) => match w.results.get(name) {
                Some(Outcome::Measured(s)) => Cell::of(s),
                Some(Outcome::Error(e)) => Cell::failed(e),
                None => Cell::failed("not measured"),
            },
        };
        catalog(quick)
            .into_iter()
            .map(|m| {
                let native = columns.iter().find(|(c, _)| c.name == NATIVE).map(|(_, o)| cell(o, &m.name));
                let base = native.as_ref().and_then(|n| n.value).filter(|&v| v > 0.0);
                let carriers = columns
                    .iter()
                    .filter(|(c, _)| c.name != NATIVE)
                    .map(|(c, o)| {
                        let mut cell = cell(o, &m.name);
                        cell.ratio = cell.value.zip(base).map(|(v, b)| v / b);
                        (c.name.clone(), cell)
                    })
                    .collect();
                Row { name: m.name, label: m.label, unit: m.unit.into(), better: m.better, native, carriers }
            })
            .collect()
    }

    /// Whether every column that could be started measured every row and passed its data checks.
    pub fn passed(&self) -> bool {
        let started = |c: &&Column| !c.error.as_deref().is_some_and(|e| e.starts_with("unavailable"));
        let columns_ok =
            self.columns.iter().filter(started).all(|c| {
                c.error.is_none() && c.data_checks.as_ref().is_some_and(|k| k.failed.is_empty() && k.passed > 0)
            });
        let cells_ok = self.rows.iter().all(|r| {
            let cells = r.native.iter().chain(r.carriers.values());
            cells
                .filter(|c| !c.error.as_deref().is_some_and(|e| e.starts_with("unavailable")))
                .all(|c| c.value.is_some())
        });
        columns_ok && cells_ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_names_are_unique() {
        let rows = catalog(false);
        let names: std::collections::BTreeSet<_> = rows.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names.len(), rows.len());
        assert_eq!(rows.len(), LATENCY_METRICS.len() + 4 * 4);
        assert!(names.contains("h2d_pageable_4KiB") && names.contains("d2h_pinned_256MiB"));
        assert!(!catalog(true).iter().any(|m| m.name == "d2h_pinned_256MiB"));
        let latency = rows.iter().filter(|m| part_of(&m.name) == Part::Latency).count();
        assert_eq!(latency, LATENCY_METRICS.len());
        assert!(rows.iter().all(|m| (part_of(&m.name) == Part::Latency) == (m.unit == "us")));
    }

    fn column(name: &str) -> Column {
        Column { data_checks: Some(Checks { passed: 1, failed: vec![] }), ..Column::new(name) }
    }

    /// A worker that measured each named metric as the given samples.
    fn worker(measured: &[(&str, &[f64])]) -> WorkerReport {
        WorkerReport {
            library: "x".into(),
            gpuplex: false,
            device: "d".into(),
            driver_version: 13000,
            results: measured
                .iter()
                .map(|&(n, samples)| (n.to_owned(), Outcome::Measured(Summary::of(samples).unwrap())))
                .collect(),
            checks: Checks::default(),
        }
    }

    #[test]
    fn summaries_take_the_middle_sample_whatever_the_order() {
        let s = Summary::of(&[9.0, 1.0, 4.0, 7.0, 3.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.values.len()), (4.0, 1.0, 9.0, 5));
        assert_eq!(s.values, [9.0, 1.0, 4.0, 7.0, 3.0]);
        // One wild sample moves a mean, not the median.
        assert_eq!(Summary::of(&[4.0, 1000.0, 3.9, 4.1, 4.0]).unwrap().median, 4.0);
        assert_eq!(Summary::of(&[2.0, 8.0, 4.0, 6.0]).unwrap().median, 5.0);
        let one = Summary::of(&[2.5]).unwrap();
        assert_eq!((one.median, one.min, one.max, one.values.len()), (2.5, 2.5, 2.5, 1));
        assert_eq!(Summary::of(&[]), None);
    }

    #[test]
    fn rounds_merge_their_samples_keep_errors_and_add_up_checks() {
        let mut first = worker(&[(LAUNCH_ASYNC, &[4.0]), (LAUNCH_SYNC, &[10.0]), ("h2d_pinned_1MiB", &[50.0])]);
        first.checks = Checks { passed: 2, failed: vec![] };
        let mut second = worker(&[(LAUNCH_ASYNC, &[9.0]), (LAUNCH_SYNC, &[11.0])]);
        second.results.insert("h2d_pinned_1MiB".into(), Outcome::Error("broke".into()));
        second.checks = Checks { passed: 1, failed: vec!["4 KiB round trip".into()] };
        let third = worker(&[(LAUNCH_ASYNC, &[3.0, 5.0]), (LAUNCH_SYNC, &[12.0]), ("h2d_pinned_1MiB", &[60.0])]);
        let merged = WorkerReport::merge(vec![first, second, third]).unwrap();
        let Outcome::Measured(launch) = &merged.results[LAUNCH_ASYNC] else { panic!("{merged:?}") };
        assert_eq!((launch.median, launch.values.clone()), (4.5, vec![4.0, 9.0, 3.0, 5.0]));
        assert!(matches!(&merged.results[LAUNCH_SYNC], Outcome::Measured(s) if s.median == 11.0));
        assert_eq!(merged.results["h2d_pinned_1MiB"], Outcome::Error("broke".into()));
        assert_eq!(merged.checks, Checks { passed: 3, failed: vec!["4 KiB round trip".into()] });
        assert!(WorkerReport::merge(vec![]).is_none());
    }

    #[test]
    fn a_columns_reports_merge_rows_each_measured_by_some() {
        let mut latency = worker(&[(LAUNCH_ASYNC, &[4.0])]);
        latency.checks = Checks { passed: 1, failed: vec![] };
        let mut bandwidth = worker(&[("h2d_pinned_1MiB", &[50.0])]);
        bandwidth.checks = Checks { passed: 2, failed: vec!["64 MiB round trip".into()] };
        let mut broken = worker(&[(LAUNCH_ASYNC, &[2.0])]);
        broken.results.insert(LAUNCH_SYNC.into(), Outcome::Error("it broke".into()));
        let later = worker(&[(LAUNCH_ASYNC, &[3.0]), (LAUNCH_SYNC, &[9.0])]);
        let merged = WorkerReport::merge(vec![latency, bandwidth, broken, later]).unwrap();
        let names: Vec<&str> = merged.results.keys().map(String::as_str).collect();
        assert_eq!(names, ["h2d_pinned_1MiB", LAUNCH_ASYNC, LAUNCH_SYNC]);
        let Outcome::Measured(launches) = &merged.results[LAUNCH_ASYNC] else { panic!("{merged:?}") };
        assert_eq!((launches.values.as_slice(), launches.median), (&[4.0, 2.0, 3.0][..], 3.0));
        // A row that failed once stays failed: its later samples are not a measurement.
        assert_eq!(merged.results[LAUNCH_SYNC], Outcome::Error("it broke".into()));
        assert_eq!(merged.checks, Checks { passed: 3, failed: vec!["64 MiB round trip".into()] });
        assert!(WorkerReport::merge(vec![]).is_none());
    }

    #[test]
    fn cells_are_medians_with_their_spread_and_ratios_are_of_medians() {
        let columns = vec![
            (column(NATIVE), Ok(worker(&[(LAUNCH_ASYNC, &[4.0, 9.0, 3.0]), ("h2d_pinned_1MiB", &[50.0])]))),
            (column("socket"), Ok(worker(&[(LAUNCH_ASYNC, &[7.0, 1.0, 5.0]), ("h2d_pinned_1MiB", &[25.0])]))),
            (column("tcp"), Err("unavailable: no".into())),
        ];
        let rows = Report::rows(&columns, false);
        let row = |n: &str| rows.iter().find(|r| r.name == n).unwrap();
        let native = row(LAUNCH_ASYNC).native.clone().unwrap();
        assert_eq!((native.value, native.min, native.max, native.samples), (Some(4.0), Some(3.0), Some(9.0), Some(3)));
        let socket = &row(LAUNCH_ASYNC).carriers["socket"];
        assert_eq!((socket.value, socket.min, socket.max, socket.samples), (Some(5.0), Some(1.0), Some(7.0), Some(3)));
        // 5 / 4 (medians), not 13/3 / 16/3 (means).
        assert_eq!(socket.ratio, Some(1.25));
        assert_eq!(row("h2d_pinned_1MiB").carriers["socket"].ratio, Some(0.5));
        assert_eq!(row("h2d_pinned_1MiB").better, Better::Higher);
        let tcp = &row(LAUNCH_ASYNC).carriers["tcp"];
        assert_eq!(tcp.error.as_deref(), Some("unavailable: no"));
        assert!(tcp.value.is_none() && tcp.samples.is_none() && tcp.min.is_none());
        assert_eq!(row(LAUNCH_SYNC).carriers["socket"].error.as_deref(), Some("not measured"));
        // Without a native column there are no ratios.
        let rows = Report::rows(&columns[1..], false);
        assert!(rows[0].native.is_none() && rows[0].carriers["socket"].ratio.is_none());
    }

    #[test]
    fn cell_json_keeps_value_and_adds_the_spread_only_when_measured() {
        let measured = Cell::of(&Summary::of(&[3.0, 1.0, 2.0]).unwrap());
        let json = serde_json::to_value(&measured).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"value": 2.0, "min": 1.0, "max": 3.0, "samples": 3, "values": [3.0, 1.0, 2.0]})
        );
        let failed = Cell { error: Some("no".into()), ..Cell::default() };
        assert_eq!(serde_json::to_value(&failed).unwrap(), serde_json::json!({"error": "no"}));
    }

    #[test]
    fn against_base_takes_one_ratio_per_round_and_brackets_their_median() {
        // Three samples a round: each round's means compared, 12/3 over 3/3, then 15/3 over 15/3.
        let a = AgainstBase::of(&[1.0, 5.0, 6.0, 4.0, 5.0, 6.0], &[1.0, 1.0, 1.0, 5.0, 5.0, 5.0], 2).unwrap();
        assert_eq!((a.ratio, a.low, a.high, a.rounds), (2.5, 1.0, 4.0, 2));
        // 25 rounds whose ratios are 1..=25: the median 13, the interval
        // the 8th to the 18th.
        let new: Vec<f64> = (1..=25).rev().map(f64::from).collect();
        let a = AgainstBase::of(&new, &[1.0; 25], 25).unwrap();
        assert_eq!((a.ratio, a.low, a.high, a.rounds), (13.0, 8.0, 18.0, 25));
        // A slow spell that falls on both builds of a round cancels.
        let a = AgainstBase::of(&[1.1, 22.0, 1.1], &[1.0, 20.0, 1.0], 3).unwrap();
        assert!((a.ratio - 1.1).abs() < 1e-12 && (a.high - 1.1).abs() < 1e-12);
        // Samples that cannot be paired round by round give nothing.
        assert_eq!(AgainstBase::of(&[1.0, 2.0], &[1.0], 1), None);
        assert_eq!(AgainstBase::of(&[1.0, 2.0, 3.0], &[1.0, 2.0, 3.0], 2), None);
        assert_eq!(AgainstBase::of(&[1.0], &[0.0], 1), None);
        assert_eq!(AgainstBase::of(&[], &[], 0), None);
    }

    #[test]
    fn each_carrier_is_compared_with_its_own_baseline_column() {
        let columns = vec![
            (column("shm"), Ok(worker(&[(LAUNCH_ASYNC, &[4.0, 6.0, 9.0])]))),
            (column("shm@base"), Ok(worker(&[(LAUNCH_ASYNC, &[2.0, 3.0, 9.0])]))),
            (column("socket"), Ok(worker(&[(LAUNCH_ASYNC, &[1.0, 1.0, 1.0])]))),
        ];
        let mut rows = Report::rows(&columns, false);
        compare_with_base(&mut rows, 3);
        let launch = &rows.iter().find(|r| r.name == LAUNCH_ASYNC).unwrap().carriers;
        let shm = launch["shm"].against_base.clone().unwrap();
        assert_eq!((shm.ratio, shm.low, shm.high, shm.rounds), (2.0, 1.0, 2.0, 3));
        assert!(launch["shm@base"].against_base.is_none() && launch["socket"].against_base.is_none());
        // Rows a column did not measure compare nothing.
        let sync = &rows.iter().find(|r| r.name == LAUNCH_SYNC).unwrap().carriers;
        assert!(sync["shm"].against_base.is_none());
    }
}
