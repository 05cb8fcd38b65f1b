//! `gpuplex bench --quick` on the emulated backend: every path the bench
//! drives works end to end, its data checks pass, and its JSON holds a
//! positive value for every row, the median of as many samples in every
//! column, with their spread, and the lanes alone where copies take lanes.
//! The numbers themselves mean nothing here (a debug build, no GPU). Needs
//! the front-end built next to the `gpuplex` binary (`cargo build` of the
//! workspace).

mod common;

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

#[test]
fn quick_bench_on_the_emulated_backend() {
    let gpuplex = PathBuf::from(env!("CARGO_BIN_EXE_gpuplex"));
    common::frontend_dir();
    let json = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench.json");
    let _ = std::fs::remove_file(&json);
    let out = Command::new(&gpuplex)
        .args(["bench", "--backend", "emulated", "--quick", "--carriers", "socket,shm,tcp", "--json"])
        .arg(&json)
        .output()
        .expect("gpuplex runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "gpuplex bench failed: {}\n{stdout}\n{stderr}", out.status);
    assert!(stdout.contains("empty-kernel launch, async") && stdout.contains("n/a"), "{stdout}");
    assert!(stdout.contains("median of 15 samples (latency rows) or 5 (bandwidth rows)"), "{stdout}");

    let report: Value = serde_json::from_slice(&std::fs::read(&json).expect("JSON written")).expect("JSON parses");
    assert_eq!(report["backend"], "emulated");
    assert_eq!(report["device"]["name"], "gpuplex emulated device (not a GPU)");
    let columns = report["columns"].as_array().expect("columns");
    let column = |name: &str| columns.iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no {name} column"));
    assert!(columns.iter().all(|c| c["name"] != "native"), "no native column on the emulated backend");

    // Socket and TCP move their large copies over lanes: the checks cover them.
    for name in ["socket", "tcp"] {
        let c = column(name);
        assert!(c["error"].is_null(), "{c}");
        assert!(c["data_checks"]["passed"].as_u64() > Some(0), "{c}");
        assert_eq!(c["data_checks"]["failed"], Value::Array(vec![]), "{c}");
    }

    let rows = report["rows"].as_array().expect("rows");
    assert!(rows.len() >= 6 + 4 * 3, "{} rows", rows.len());
    assert_eq!(rows.last().map(|r| &r["name"]), Some(&Value::from("lanes_alone")), "the lanes alone come last");
    let mut spread_somewhere = false;
    for row in rows {
        assert!(row["native"].is_null(), "{row}");
        assert!(["lower", "higher"].contains(&row["better"].as_str().unwrap_or_default()), "{row}");
        let cell = &row["carriers"]["socket"];
        let value = cell["value"].as_f64().unwrap_or(0.0);
        assert!(value > 0.0 && value.is_finite(), "{row}");
        assert!(cell.get("ratio").is_none(), "no ratio without native: {row}");
        let shm = &row["carriers"]["shm"];
        if row["name"] == "lanes_alone" {
            // Measured where copies take lanes, which shared memory's do not.
            assert!(shm.is_null() && row["carriers"]["tcp"]["value"].as_f64() > Some(0.0), "{row}");
        } else {
            // shm (which may still fall back to the socket) has a value or says why not.
            assert!(shm["value"].as_f64().is_some_and(|v| v > 0.0) || shm["error"].is_string(), "{row}");
        }
        // Every measured cell: the median of 15 samples (times: 3 a round,
        // each of 5 turns) or 5 (bandwidths: one a round), within their range.
        let samples = if row["unit"] == "us" { 15 } else { 5 };
        for (carrier, cell) in row["carriers"].as_object().expect("carriers") {
            if cell["value"].is_null() {
                assert!(cell.get("samples").is_none() && cell.get("min").is_none(), "{carrier}: {row}");
                continue;
            }
            assert_eq!(cell["samples"], samples, "{carrier}: {row}");
            let (min, value, max) = (cell["min"].as_f64(), cell["value"].as_f64(), cell["max"].as_f64());
            assert!(
                min > Some(0.0) && min <= value && value <= max && max.is_some_and(f64::is_finite),
                "{carrier}: {row}"
            );
            spread_somewhere |= min < max;
        }
    }
    // Timings never come out all alike: identical extremes everywhere would mean one sample reported as many.
    assert!(spread_somewhere, "no cell's samples differ");
}

/// With `--baseline` every carrier is measured through the other build too
/// and compared with it round by round; a time limit ends the run after the
/// rounds that fit (always one), and the report covers those.
#[test]
fn a_baseline_within_a_time_limit_is_compared_round_by_round() {
    let gpuplex = PathBuf::from(env!("CARGO_BIN_EXE_gpuplex"));
    common::frontend_dir();
    // This same build, as the baseline: its folder holds gpuplex and libcuda.so.
    let base = gpuplex.parent().expect("the binary's folder");
    let json = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-baseline.json");
    let _ = std::fs::remove_file(&json);
    let out = Command::new(&gpuplex)
        .args(["bench", "--backend", "emulated", "--quick", "--carriers", "shm", "--rounds", "3", "--time-limit", "0"])
        .arg("--baseline")
        .arg(base)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("gpuplex runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "gpuplex bench failed: {}\n{stdout}\n{stderr}", out.status);
    assert!(stderr.contains("round 2 would end past the time limit; reporting the 1 taken"), "{stderr}");
    assert!(stdout.contains("Against the baseline") && stdout.contains("shm / shm@base"), "{stdout}");

    let report: Value = serde_json::from_slice(&std::fs::read(&json).expect("JSON written")).expect("JSON parses");
    assert_eq!(report["rounds"], 1);
    for row in report["rows"].as_array().expect("rows") {
        let (new, base) = (&row["carriers"]["shm"], &row["carriers"]["shm@base"]);
        let per_round = if row["unit"] == "us" { 3 } else { 1 };
        for cell in [new, base] {
            assert_eq!(cell["values"].as_array().map(Vec::len), Some(per_round), "{row}");
        }
        // One round: the ratio of the two columns' means, its own interval.
        let mean = |c: &Value| {
            let v: Vec<f64> = c["values"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
            v.iter().sum::<f64>() / v.len() as f64
        };
        let against = &new["against_base"];
        assert_eq!(against["rounds"], 1, "{row}");
        let ratio = against["ratio"].as_f64().expect("a ratio");
        assert!((ratio - mean(new) / mean(base)).abs() < 1e-9, "{row}");
        assert_eq!((against["low"].as_f64(), against["high"].as_f64()), (Some(ratio), Some(ratio)), "{row}");
        assert!(base.get("against_base").is_none(), "{row}");
    }
}

#[test]
fn only_one_kind_of_row_is_measured_and_reported() {
    let gpuplex = PathBuf::from(env!("CARGO_BIN_EXE_gpuplex"));
    common::frontend_dir();
    for (only, unit) in [("latency", "us"), ("bandwidth", "GB/s")] {
        let json = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("bench-only-{only}.json"));
        let _ = std::fs::remove_file(&json);
        let out = Command::new(&gpuplex)
            .args(["bench", "--backend", "emulated", "--quick", "--carriers", "shm", "--rounds", "1", "--only", only])
            .arg("--json")
            .arg(&json)
            .output()
            .expect("gpuplex runs");
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "--only {only} failed: {}\n{stdout}\n{stderr}", out.status);
        assert!(stderr.contains(&format!("round 1/1: {only} ")), "{stderr}");
        let report: Value = serde_json::from_slice(&std::fs::read(&json).expect("JSON written")).expect("JSON parses");
        let rows = report["rows"].as_array().expect("rows");
        assert!(!rows.is_empty(), "--only {only}: no rows");
        for row in rows {
            assert_eq!(row["unit"], unit, "--only {only}: {row}");
            assert!(row["carriers"]["shm"]["value"].as_f64().is_some_and(|v| v > 0.0), "{row}");
        }
    }
}

/// `--tenants` on the emulated backend: every tenant runs alone and
/// together through a server under each policy, with a GPU-time share per
/// tenant read from the server, Jain's index and the aggregate; no native
/// column without a GPU. The numbers mean nothing here.
#[test]
fn tenants_on_the_emulated_backend() {
    let gpuplex = PathBuf::from(env!("CARGO_BIN_EXE_gpuplex"));
    common::frontend_dir();
    let json = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-tenants.json");
    let _ = std::fs::remove_file(&json);
    let out = Command::new(&gpuplex)
        .args(["bench", "--backend", "emulated", "--tenants", "3", "--weights", "1,2,4", "--idle", "1", "--high"])
        .args(["--seconds", "0.5", "--policy", "fair,none", "--slice", "20ms", "--json"])
        .arg(&json)
        .output()
        .expect("gpuplex runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "gpuplex bench failed: {}\n{stdout}\n{stderr}", out.status);
    for text in ["gpuplex:fair", "gpuplex:none", "Jain's index", "aggregate", "emulated backend", "together  t0"] {
        assert!(stdout.contains(text), "no {text:?} in:\n{stdout}");
    }
    assert!(!stdout.contains("\nnative"), "no native column on the emulated backend:\n{stdout}");

    let report: Value = serde_json::from_slice(&std::fs::read(&json).expect("JSON written")).expect("JSON parses");
    assert_eq!((report["tenants"].as_u64(), report["idle"].as_u64()), (Some(3), Some(1)));
    // The servers started with it (one that refused it would have ended the run).
    assert_eq!(report["slice_ms"].as_f64(), Some(20.0));
    assert!(report["native_alone"].is_null());
    let columns = report["columns"].as_array().expect("columns");
    let names: Vec<&str> = columns.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["gpuplex:fair", "gpuplex:none"]);
    for c in columns {
        assert_eq!(c["share_of"], "gpu_time", "{c}");
        assert!(c["alone"]["per_second"].as_f64() > Some(0.0) && c["high_alone"]["kernels"].as_u64() > Some(0), "{c}");
        assert!(c["jain"].as_f64().is_some_and(|j| j > 0.0 && j <= 1.0 + 1e-9), "{c}");
        assert!(c["aggregate_vs_alone"].as_f64() > Some(0.0) && c["aggregate_vs_native"].is_null(), "{c}");
        // The two running tenants (the weight-4 one idles), then the high one.
        let rows = c["together"].as_array().expect("together");
        let rows: Vec<(&str, &str, f64)> = rows
            .iter()
            .map(|r| {
                (
                    r["name"].as_str().unwrap(),
                    r["priority"].as_str().unwrap(),
                    r["weight_share"].as_f64().unwrap_or(-1.0),
                )
            })
            .collect();
        assert_eq!(rows, [("t0", "normal", 1.0 / 3.0), ("t1", "normal", 2.0 / 3.0), ("high", "high", -1.0)], "{c}");
        for r in c["together"].as_array().unwrap() {
            assert!(r["kernels"].as_u64() > Some(0) && r["p99_us"].as_f64() >= r["p50_us"].as_f64(), "{r}");
            assert!(r["gpu_seconds"].as_f64().is_some(), "the server's GPU time: {r}");
        }
    }
}

/// Weights are one per tenant, slices are the server's, and the tenants'
/// options need `--tenants`.
#[test]
fn tenants_options_are_checked() {
    let gpuplex = PathBuf::from(env!("CARGO_BIN_EXE_gpuplex"));
    let run = |args: &[&str]| Command::new(&gpuplex).arg("bench").args(args).output().expect("gpuplex runs");
    let out = run(&["--backend", "emulated", "--tenants", "2", "--weights", "1,2,4"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--weights lists 3 weight(s) for 2 tenant(s)"));
    let out = run(&["--backend", "emulated", "--weights", "1,2"]);
    assert_eq!(out.status.code(), Some(2), "--weights without --tenants is a usage error");
    let out = run(&["--backend", "emulated", "--tenants", "2", "--quick"]);
    assert_eq!(out.status.code(), Some(2), "--quick is the microbenchmarks'");
    let out = run(&["--backend", "emulated", "--tenants", "2", "--slice", "2s"]);
    assert_eq!(out.status.code(), Some(2), "a slice over 1 s is refused");
}
