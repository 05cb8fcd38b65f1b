//! The report as a plain text table: what was measured where, then one row
//! per metric with the native value and each carrier's value and ratio.
//! Values are medians; their spread is in the JSON only, to keep rows short.

use std::fmt::{self, Write};

use super::report::{Better, Cell, Column, Report, BASE_SUFFIX, LANES_ALONE, LATENCY_SAMPLES_PER_ROUND, NATIVE};

pub fn render(r: &Report) -> String {
    let mut out = String::new();
    write(&mut out, r).expect("writing to a String cannot fail");
    out
}

fn write(out: &mut String, r: &Report) -> fmt::Result {
    let mode = if r.quick { ", quick" } else { "" };
    writeln!(out, "gpuplex bench {} (backend {}{mode})", r.gpuplex_version, r.backend)?;
    let m = &r.machine;
    writeln!(out, "{:<9} {}, {} x {}, {}", "machine", m.hostname, m.cpus, m.cpu, m.kernel)?;
    match &r.device {
        Some(d) => writeln!(out, "{:<9} {}, driver {}", "device", d.name, d.driver_version)?,
        None => writeln!(out, "{:<9} none reached", "device")?,
    }
    if !r.columns.iter().any(|c| c.name == NATIVE) {
        writeln!(out, "{:<9} n/a: measured with the cuda backend only", NATIVE)?;
    }
    for c in &r.columns {
        writeln!(out, "{:<9} {}", c.name, describe(c))?;
    }
    writeln!(out)?;
    if r.columns.iter().any(|c| c.name == NATIVE) {
        writeln!(out, "Carrier cells: value (xR), R = gpuplex / native, for times and bandwidths alike.")?;
        writeln!(out, "Times (us): lower is better, R > 1 is slower than native.")?;
        writeln!(out, "Bandwidths (GB/s, 1e9 bytes/s): higher is better, R < 1 is slower than native.")?;
    } else {
        writeln!(out, "Times (us): lower is better. Bandwidths (GB/s, 1e9 bytes/s): higher is better.")?;
    }
    let (rounds, latency) = (r.rounds, r.rounds * LATENCY_SAMPLES_PER_ROUND);
    writeln!(
        out,
        "Each value is the median of {latency} samples (latency rows) or {rounds} (bandwidth rows), taken in \
         {rounds} rounds of every column; --json also gives their min and max."
    )?;
    if r.rows.iter().any(|row| row.name == LANES_ALONE) {
        writeln!(out, "Lanes alone: the socket and tcp columns' lanes moving the largest copy host to host, with no")?;
        writeln!(out, "server or GPU: the ceiling of those columns' large copies on this machine.")?;
    }
    writeln!(out)?;

    // Errors shown once each: a whole column's in its line above, others as numbered notes.
    let mut notes: Vec<String> = Vec::new();
    let mut cell_text = |cell: Option<&Cell>, column: Option<&Column>| -> String {
        let Some(cell) = cell else { return "n/a".into() };
        match (&cell.value, &cell.error) {
            (Some(v), _) => match cell.ratio {
                Some(ratio) => format!("{} (x{ratio:.2})", number(*v)),
                None => number(*v),
            },
            (None, Some(e)) if column.is_some_and(|c| c.error.as_ref() == Some(e)) => "-".into(),
            (None, e) => {
                let e = e.clone().unwrap_or_else(|| "no value".into());
                let n = notes.iter().position(|x| *x == e).unwrap_or_else(|| {
                    notes.push(e);
                    notes.len() - 1
                });
                format!("failed [{}]", n + 1)
            }
        }
    };
    let carriers: Vec<&Column> = r.columns.iter().filter(|c| c.name != NATIVE).collect();
    let native = r.columns.iter().find(|c| c.name == NATIVE);
    let mut header = vec!["metric".to_owned(), "unit".into(), "better".into(), NATIVE.into()];
    header.extend(carriers.iter().map(|c| c.name.clone()));
    let mut grid = vec![header];
    for row in &r.rows {
        let better = match row.better {
            Better::Lower => "lower",
            Better::Higher => "higher",
        };
        let mut line = vec![row.label.clone(), row.unit.clone(), better.into(), cell_text(row.native.as_ref(), native)];
        line.extend(carriers.iter().map(|c| cell_text(row.carriers.get(&c.name), Some(c))));
        grid.push(line);
    }
    write_grid(out, &grid)?;
    if !notes.is_empty() {
        writeln!(out)?;
        for (i, n) in notes.iter().enumerate() {
            writeln!(out, "[{}] {n}", i + 1)?;
        }
    }
    write_against_base(out, r)
}

/// The grid's columns padded to their widest cell.
fn write_grid(out: &mut String, grid: &[Vec<String>]) -> fmt::Result {
    let widths: Vec<usize> =
        (0..grid[0].len()).map(|i| grid.iter().map(|l| l[i].chars().count()).max().unwrap_or(0)).collect();
    for line in grid {
        let cells: Vec<String> = line.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        writeln!(out, "{}", cells.join("  ").trim_end())?;
    }
    Ok(())
}

/// With `--baseline`, each carrier against the baseline's column of it.
fn write_against_base(out: &mut String, r: &Report) -> fmt::Result {
    let compared: Vec<&str> = r
        .columns
        .iter()
        .map(|c| c.name.as_str())
        .filter(|&name| r.rows.iter().any(|row| row.carriers.get(name).is_some_and(|c| c.against_base.is_some())))
        .collect();
    if compared.is_empty() {
        return Ok(());
    }
    writeln!(out)?;
    writeln!(out, "Against the baseline, round by round: the median over the rounds of this build's value / the")?;
    writeln!(out, "baseline's in the same round (above 1: larger, so slower for times, faster for bandwidths), and")?;
    writeln!(out, "the range that holds that median with about 95% confidence as far as the rounds' spread tells.")?;
    let mut header = vec!["metric".to_owned()];
    header.extend(compared.iter().map(|c| format!("{c} / {c}{BASE_SUFFIX}")));
    let mut grid = vec![header];
    for row in &r.rows {
        let mut line = vec![row.label.clone()];
        line.extend(compared.iter().map(|c| match row.carriers.get(*c).and_then(|c| c.against_base.as_ref()) {
            Some(a) => format!("{:.3} ({:.3}-{:.3})", a.ratio, a.low, a.high),
            None => "n/a".into(),
        }));
        grid.push(line);
    }
    write_grid(out, &grid)
}

/// Where a column was measured, its data checks, or why it has no values.
fn describe(c: &Column) -> String {
    if let Some(e) = &c.error {
        return e.clone();
    }
    let mut parts = Vec::new();
    parts.extend(c.server.clone());
    parts.extend(c.env.iter().filter(|(k, _)| *k != "GPUPLEX_SERVER").map(|(k, v)| format!("{k}={v}")));
    parts.extend(c.library.clone());
    if let Some(k) = &c.data_checks {
        match k.failed.as_slice() {
            [] => parts.push(format!("data checks: {} passed", k.passed)),
            failed => parts.push(format!("DATA CHECKS FAILED: {}", failed.join("; "))),
        }
    }
    parts.join(", ")
}

/// Three significant digits or so.
fn number(v: f64) -> String {
    match v.abs() {
        a if a >= 100.0 => format!("{v:.0}"),
        a if a >= 10.0 => format!("{v:.1}"),
        _ => format!("{v:.2}"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::report::{Checks, Machine, Outcome, Summary, WorkerReport, LAUNCH_ASYNC, LAUNCH_SYNC};
    use super::*;

    fn column(name: &str, error: Option<&str>) -> Column {
        Column {
            library: Some("/lib/libcuda.so.1".into()),
            error: error.map(Into::into),
            data_checks: error.is_none().then(|| Checks { passed: 7, failed: vec![] }),
            ..Column::new(name)
        }
    }

    fn worker(results: &[(&str, Outcome)]) -> Result<WorkerReport, String> {
        Ok(WorkerReport {
            library: "/lib/libcuda.so.1".into(),
            gpuplex: false,
            device: "GPU".into(),
            driver_version: 13000,
            results: results.iter().map(|(n, o)| (n.to_string(), o.clone())).collect(),
            checks: Checks::default(),
        })
    }

    /// Samples whose median is `v`, spread far around it.
    fn median(v: f64) -> Outcome {
        Outcome::Measured(Summary::of(&[v * 3.0, v, v / 3.0]).unwrap())
    }

    /// A quick run's report of `rounds` rounds of these columns.
    fn quick_report(rounds: usize, columns: Vec<(Column, Result<WorkerReport, String>)>) -> Report {
        Report {
            gpuplex_version: "0".into(),
            backend: "cuda".into(),
            quick: true,
            rounds,
            unix_time: 0,
            machine: Machine { hostname: "h".into(), cpu: "c".into(), cpus: 1, kernel: "k".into() },
            device: None,
            rows: Report::rows(&columns, true),
            columns: columns.into_iter().map(|(c, _)| c).collect(),
        }
    }

    #[test]
    fn cells_show_medians_ratios_and_each_error_once() {
        let columns = vec![
            (column(NATIVE, None), worker(&[(LAUNCH_ASYNC, median(4.0)), (LAUNCH_SYNC, median(9.0))])),
            (
                column("socket", None),
                worker(&[(LAUNCH_ASYNC, median(5.0)), (LAUNCH_SYNC, Outcome::Error("it broke".into()))]),
            ),
            (column("tcp", Some("unavailable: no tcp")), Err("unavailable: no tcp".into())),
        ];
        let report = quick_report(7, columns);
        let text = render(&report);
        let line = |label: &str| text.lines().find(|l| l.starts_with(label)).unwrap_or_default().to_owned();
        let words = |l: String| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>().join(" ");
        assert!(words(line("empty-kernel launch, async")).ends_with("us lower 4.00 5.00 (x1.25) -"), "{text}");
        assert!(words(line("empty-kernel launch + stream")).ends_with("us lower 9.00 failed [1] -"), "{text}");
        assert!(line("tcp").contains("unavailable: no tcp"), "{text}");
        assert!(text.contains("\n[1] it broke\n") && text.matches("it broke").count() == 1, "{text}");
        assert!(
            text.contains("median of 21 samples (latency rows) or 7 (bandwidth rows), taken in 7 rounds"),
            "{text}"
        );
    }

    #[test]
    fn a_baseline_gets_a_table_of_its_own() {
        let columns = vec![
            (column(NATIVE, None), worker(&[(LAUNCH_ASYNC, median(4.0))])),
            (column("shm", None), worker(&[(LAUNCH_ASYNC, median(6.0))])),
            (column("shm@base", None), worker(&[(LAUNCH_ASYNC, median(3.0))])),
        ];
        let mut report = quick_report(1, columns);
        assert!(!render(&report).contains("Against the baseline"));
        super::super::report::compare_with_base(&mut report.rows, 1);
        let text = render(&report);
        let (_, against) = text.split_once("Against the baseline").expect("the baseline's table");
        let words = |l: &str| l.split_whitespace().collect::<Vec<_>>().join(" ");
        let lines: Vec<String> = against.lines().map(words).collect();
        assert!(lines.contains(&"metric shm / shm@base".to_owned()), "{text}");
        assert!(lines.contains(&"empty-kernel launch, async, per launch 2.000 (2.000-2.000)".to_owned()), "{text}");
        assert!(lines.iter().any(|l| l.starts_with("empty-kernel launch + stream sync n/a")), "{text}");
    }

    #[test]
    fn numbers_keep_about_three_digits() {
        assert_eq!(number(3.714), "3.71");
        assert_eq!(number(21.34), "21.3");
        assert_eq!(number(512.6), "513");
    }
}
