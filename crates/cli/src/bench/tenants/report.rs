//! The figures of `gpuplex bench --tenants`: each tenant process's loop,
//! each column's shares, fairness and aggregate, the `--json` format, and
//! the text report.
//!
//! Fairness is Jain's index over each tenant's kernels per second divided
//! by its weight: 1 when every tenant got what its weight asks for, 1/n
//! when one got everything. The aggregate is the tenants' kernels per
//! second together over one tenant's alone on the machine's own driver, the
//! same denominator for every column, so that columns compare with each
//! other; each column's ratio to its own tenant alone is given too.

use std::fmt::Write;

use serde::{Deserialize, Serialize};

use super::Kernel;

/// What one tenant process measured: its line of output.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Loop {
    /// Kernels launched and synchronized in the window.
    pub kernels: u64,
    pub per_second: f64,
    /// Of each iteration's launch-to-synchronized time.
    pub p50_us: f64,
    pub p99_us: f64,
    /// How long after the common start the window began: the process was
    /// not ready in time.
    #[serde(default)]
    pub late_ms: f64,
}

/// The `p` quantile of `sorted`: the value at rank `p * len`, rounded
/// down (as `busy_loop.cu` takes it); 0 for no values.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((p * sorted.len() as f64) as usize).min(sorted.len().saturating_sub(1));
    sorted.get(i).copied().unwrap_or(0.0)
}

/// Jain's fairness index of `xs`: (Σx)² / (n Σx²), from 1/n to 1; None
/// when there is nothing to judge.
pub fn jain(xs: &[f64]) -> Option<f64> {
    let (sum, squares) = xs.iter().fold((0.0, 0.0), |(s, q), x| (s + x, q + x * x));
    (squares > 0.0).then(|| sum * sum / (xs.len() as f64 * squares))
}

/// A kernel as the report names it.
#[derive(Debug, Clone, Serialize)]
pub struct Shape {
    pub name: &'static str,
    pub blocks: u32,
    pub threads: u32,
    pub microseconds: u64,
}

impl Shape {
    pub fn of(kernel: Kernel) -> Shape {
        let (blocks, microseconds) = kernel.shape();
        Shape { name: kernel.name(), blocks, threads: super::child::THREADS, microseconds }
    }
}

/// What a column's shares are of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShareOf {
    /// GPU time, as the server measured it per tenant.
    GpuTime,
    /// Kernels per second: the machine's driver measures no GPU time per process.
    Throughput,
}

/// One tenant of a run together.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub name: String,
    pub kernel: &'static str,
    pub priority: &'static str,
    pub weight: u32,
    /// Its weight over the running tenants' weights (none for the
    /// high-priority tenant, which is not one of them).
    pub weight_share: Option<f64>,
    #[serde(flatten)]
    pub result: Loop,
    /// The GPU time the server measured for it over the run.
    pub gpu_seconds: Option<f64>,
    /// Of the running tenants' total (the high-priority tenant's: of everyone's).
    pub share: Option<f64>,
}

/// One way of running the tenants: natively or through one server.
#[derive(Debug, Clone, Serialize)]
pub struct Column {
    pub name: String,
    /// Why it was not measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub share_of: ShareOf,
    /// One tenant alone.
    pub alone: Option<Loop>,
    pub alone_vs_native: Option<f64>,
    /// The high-priority tenant alone.
    pub high_alone: Option<Loop>,
    /// The running tenants, then the high-priority one.
    pub together: Vec<Row>,
    /// Over the running tenants' kernels per second / weight.
    pub jain: Option<f64>,
    /// The running tenants' kernels per second together.
    pub aggregate_per_second: Option<f64>,
    pub aggregate_vs_native: Option<f64>,
    pub aggregate_vs_alone: Option<f64>,
}

impl Column {
    pub fn unavailable(name: &str, why: String) -> Column {
        Column {
            name: name.to_owned(),
            error: Some(why),
            share_of: ShareOf::Throughput,
            alone: None,
            alone_vs_native: None,
            high_alone: None,
            together: Vec::new(),
            jain: None,
            aggregate_per_second: None,
            aggregate_vs_native: None,
            aggregate_vs_alone: None,
        }
    }

    /// A measured column: `together` holds the running tenants' rows, the
    /// high-priority tenant's last (`high`), with their GPU time if known;
    /// shares, fairness and the aggregate against its own alone are
    /// worked out here, against native in [`Column::compare_with_native`].
    pub fn measured(
        name: &str,
        share_of: ShareOf,
        alone: Loop,
        high_alone: Option<Loop>,
        mut together: Vec<Row>,
        high: bool,
    ) -> Column {
        let running = together.len() - usize::from(high);
        let gpu = |rows: &[Row]| rows.iter().map(|r| r.gpu_seconds.unwrap_or(0.0)).sum::<f64>();
        let (gpu_running, gpu_all) = (gpu(&together[..running]), gpu(&together));
        let per_second_running: f64 = together[..running].iter().map(|r| r.result.per_second).sum();
        let weights: u32 = together[..running].iter().map(|r| r.weight).sum();
        for (i, row) in together.iter_mut().enumerate() {
            let is_high = i >= running;
            let ratio = |part: f64, whole: f64| (whole > 0.0).then(|| part / whole);
            row.weight_share = if is_high { None } else { ratio(row.weight.into(), weights.into()) };
            row.share = match (share_of, is_high) {
                (ShareOf::GpuTime, false) => ratio(row.gpu_seconds.unwrap_or(0.0), gpu_running),
                (ShareOf::GpuTime, true) => ratio(row.gpu_seconds.unwrap_or(0.0), gpu_all),
                (ShareOf::Throughput, false) => ratio(row.result.per_second, per_second_running),
                // Another kernel's rate: not a share of the same thing.
                (ShareOf::Throughput, true) => None,
            };
        }
        let per_weight: Vec<f64> =
            together[..running].iter().map(|r| r.result.per_second / f64::from(r.weight)).collect();
        let aggregate_vs_alone = (alone.per_second > 0.0).then(|| per_second_running / alone.per_second);
        Column {
            name: name.to_owned(),
            error: None,
            share_of,
            alone: Some(alone),
            alone_vs_native: None,
            high_alone,
            jain: jain(&per_weight),
            together,
            aggregate_per_second: Some(per_second_running),
            aggregate_vs_native: None,
            aggregate_vs_alone,
        }
    }

    /// Fills the ratios to one tenant alone on the machine's own driver.
    pub fn compare_with_native(&mut self, native_alone: Option<f64>) {
        let Some(native) = native_alone.filter(|&n| n > 0.0) else { return };
        self.alone_vs_native = self.alone.as_ref().map(|a| a.per_second / native);
        self.aggregate_vs_native = self.aggregate_per_second.map(|a| a / native);
    }

    fn render(&self, out: &mut String) {
        let _ = writeln!(out, "\n{}", self.name);
        if let Some(e) = &self.error {
            let _ = writeln!(out, "  {e}");
            return;
        }
        let _ = writeln!(
            out,
            "  {:<9} {:<8} {:>11} {:>10} {:>10} {:>7} {:>7} {:>7}",
            "run", "tenant", "kernels/s", "p50 us", "p99 us", "share", "weight", "wanted"
        );
        let line = |out: &mut String, run: &str, name: &str, l: &Loop, rest: &str| {
            let (rate, p50, p99) = (l.per_second, l.p50_us, l.p99_us);
            let _ = writeln!(out, "  {run:<9} {name:<8} {rate:>11.1} {p50:>10.1} {p99:>10.1}{rest}");
        };
        if let Some(alone) = &self.alone {
            let vs = self.alone_vs_native.map(|r| format!("{:>27}x{r:.3} of native", "")).unwrap_or_default();
            line(out, "alone", "t0", alone, &vs);
        }
        if let Some(high) = &self.high_alone {
            line(out, "alone", "high", high, "");
        }
        let fraction = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
        for (i, r) in self.together.iter().enumerate() {
            let weight = if r.weight_share.is_some() { r.weight.to_string() } else { r.priority.to_owned() };
            let rest = format!(" {:>7} {weight:>7} {:>7}", fraction(r.share), fraction(r.weight_share));
            line(out, if i == 0 { "together" } else { "" }, &r.name, &r.result, &rest);
        }
        let _ = writeln!(
            out,
            "  share: {}",
            match self.share_of {
                ShareOf::GpuTime => "of the GPU time the server measured for the tenants over the run",
                ShareOf::Throughput =>
                    "of the tenants' kernels per second (the driver measures no GPU time per process)",
            }
        );
        let jain = self.jain.map_or_else(|| "-".to_owned(), |j| format!("{j:.4}"));
        let _ = writeln!(out, "  Jain's index {jain} (of kernels per second / weight)");
        let mut aggregate = Vec::new();
        if let Some(a) = self.aggregate_vs_native {
            aggregate.push(format!("{a:.3} of one alone natively"));
        }
        if let Some(a) = self.aggregate_vs_alone {
            aggregate.push(format!("{a:.3} of one alone here"));
        }
        let _ =
            writeln!(out, "  aggregate {}", if aggregate.is_empty() { "-".to_owned() } else { aggregate.join(", ") });
    }
}

/// The whole run, as `--json` writes it.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub gpuplex_version: String,
    pub backend: String,
    pub unix_time: u64,
    /// Tenants configured; `idle` of them (the last) start no process.
    pub tenants: usize,
    pub idle: usize,
    pub weights: Vec<u32>,
    pub kernel: Shape,
    /// The high-priority tenant's kernel, if there is one.
    pub high: Option<Shape>,
    pub seconds: f64,
    /// How the tenants are told apart through gpuplex.
    pub identity: &'static str,
    pub sharing: Option<&'static str>,
    /// The servers' slice in milliseconds, where not their default.
    pub slice_ms: Option<f64>,
    /// One tenant alone natively, kernels per second.
    pub native_alone: Option<f64>,
    pub columns: Vec<Column>,
}

impl Report {
    pub fn render(&self) -> String {
        let mut out = String::new();
        let k = &self.kernel;
        let _ = write!(
            out,
            "gpuplex bench --tenants {}: each a process running {} kernels ({} blocks x {} us, {} threads each)",
            self.tenants, k.name, k.blocks, k.microseconds, k.threads
        );
        if let Some(h) = &self.high {
            let _ = write!(
                out,
                ", and one high-priority tenant running {} kernels ({} x {} us)",
                h.name, h.blocks, h.microseconds
            );
        }
        let _ = writeln!(out);
        let weights: Vec<String> = self.weights.iter().map(u32::to_string).collect();
        let _ = write!(out, "{} s windows; weights {}", self.seconds, weights.join(","));
        if self.idle > 0 {
            let _ = write!(
                out,
                ", the last {} configured but idle (shares and weights are the running tenants')",
                self.idle
            );
        }
        if let Some(s) = self.sharing {
            let _ = write!(out, "; sharing = \"{s}\"");
        }
        if let Some(ms) = self.slice_ms {
            let _ = write!(out, "; slice {ms} ms");
        }
        let _ = writeln!(out, "; through gpuplex, tenants by {}", self.identity);
        if self.backend == "emulated" {
            let _ = writeln!(
                out,
                "emulated backend: its kernels take no time, so these figures check the paths, not how a GPU is shared"
            );
        }
        for c in &self.columns {
            c.render(&mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(per_second: f64) -> Loop {
        Loop { kernels: 1, per_second, p50_us: 1.0, p99_us: 2.0, late_ms: 0.0 }
    }

    fn row(name: &str, weight: u32, per_second: f64, gpu_seconds: Option<f64>) -> Row {
        Row {
            name: name.into(),
            kernel: "long",
            priority: "normal",
            weight,
            weight_share: None,
            result: run(per_second),
            gpu_seconds,
            share: None,
        }
    }

    #[test]
    fn jain_is_one_when_even_and_one_over_n_when_one_takes_all() {
        assert_eq!(jain(&[3.0, 3.0, 3.0]), Some(1.0));
        assert_eq!(jain(&[5.0, 0.0, 0.0, 0.0]), Some(0.25));
        let j = jain(&[1.0, 2.0]).unwrap();
        assert!((j - 0.9).abs() < 1e-12, "{j}");
        assert_eq!(jain(&[]), None);
        assert_eq!(jain(&[0.0, 0.0]), None);
    }

    #[test]
    fn percentiles_take_the_rank_rounded_down() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!((percentile(&v, 0.5), percentile(&v, 0.99)), (51.0, 100.0));
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    #[test]
    fn shares_fairness_and_aggregates_follow_the_weights() {
        // Weights 1:2, each getting what its weight asks for; a high tenant beside them.
        let mut high = row("high", 1, 50.0, Some(1.0));
        high.priority = "high";
        let together = vec![row("t0", 1, 100.0, Some(1.0)), row("t1", 2, 200.0, Some(2.0)), high];
        let mut c = Column::measured("gpuplex:fair", ShareOf::GpuTime, run(400.0), Some(run(60.0)), together, true);
        c.compare_with_native(Some(500.0));
        assert_eq!(c.jain, Some(1.0));
        let shares: Vec<Option<f64>> = c.together.iter().map(|r| r.share).collect();
        assert_eq!(shares, [Some(1.0 / 3.0), Some(2.0 / 3.0), Some(0.25)]);
        let wanted: Vec<Option<f64>> = c.together.iter().map(|r| r.weight_share).collect();
        assert_eq!(wanted, [Some(1.0 / 3.0), Some(2.0 / 3.0), None]);
        assert_eq!(
            (c.aggregate_vs_alone, c.aggregate_vs_native, c.alone_vs_native),
            (Some(0.75), Some(0.6), Some(0.8))
        );

        // Natively: shares of throughput, none for the other kernel's tenant.
        let together = vec![row("t0", 1, 300.0, None), row("t1", 1, 100.0, None), row("high", 1, 9.0, None)];
        let c = Column::measured("native", ShareOf::Throughput, run(400.0), None, together, true);
        let shares: Vec<Option<f64>> = c.together.iter().map(|r| r.share).collect();
        assert_eq!(shares, [Some(0.75), Some(0.25), None]);
        assert_eq!(c.jain, Some(0.8));
        assert_eq!(c.aggregate_vs_native, None, "not compared yet");

        // No GPU time measured (the emulated device): no shares, still a fairness figure.
        let c = Column::measured(
            "gpuplex:none",
            ShareOf::GpuTime,
            run(1.0),
            None,
            vec![row("t0", 1, 5.0, Some(0.0))],
            false,
        );
        assert_eq!((c.together[0].share, c.jain), (None, Some(1.0)));
    }
}
