//! The latency rows, taken in turns.
//!
//! On the H100 machine (a VM) driver calls ran slow in spells that no CPU
//! owned: pinned to each CPU in turn, 1 MiB alloc+free took 62 µs on a CPU
//! in one sweep and 133 on the same CPU in the next, and natively within one
//! process it moved between about 63 and 90 µs every second or so. Samples
//! that columns took with workers of their own, a second or more apart,
//! fell in different spells: over seven benches the shared-memory column's
//! alloc+free came out at x0.87 to x1.25 of native, while the same calls
//! alternated every second within one spell came out even.
//!
//! So each round starts every column's worker at once (`bench-worker
//! --turns`), and the columns take turns at the machine: a turn is one
//! sample of one row (a loop of about 10 ms after its own warm-up), the
//! columns go in alternating order, and a column's sample of a row is the
//! mean of its [`TURNS`] turns. Turns of different columns are then
//! milliseconds apart and see the same spells, and a round's fresh workers
//! still spread where each process's threads land. A worker waiting for its
//! turn is blocked reading its input, and a gpuplex server waiting for its
//! guest sleeps, so neither takes a CPU from the column whose turn it is.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;

use super::report::{Checks, Outcome, Summary, WorkerReport, LATENCY_METRICS, LATENCY_SAMPLES_PER_ROUND};
use super::{carrier, order};

/// Turns per sample.
pub const TURNS: usize = 5;

/// A running `bench-worker --turns`.
pub struct TurnWorker {
    child: Child,
    /// Closed to tell the worker that no more turns come.
    stdin: Option<ChildStdin>,
    /// Its stdout, a line at a time, read by a thread of its own so that
    /// waiting for a line can time out.
    lines: Receiver<String>,
    stderr: PathBuf,
    timeout: Duration,
}

impl TurnWorker {
    /// Starts `cmd` with its stdin and stdout piped to us; its stderr is
    /// meant to go to the file `stderr`, read if it fails. `timeout` bounds
    /// each wait for a line.
    pub fn spawn(mut cmd: Command, stderr: PathBuf, timeout: Duration) -> Result<TurnWorker, String> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("failed: cannot start a worker: {e}"))?;
        let (stdin, stdout) = (child.stdin.take(), child.stdout.take().expect("stdout is piped"));
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(TurnWorker { child, stdin, lines, stderr, timeout })
    }

    /// The next line, parsed as a `T`.
    fn next<T: DeserializeOwned>(&mut self) -> Result<T, String> {
        match self.lines.recv_timeout(self.timeout) {
            Ok(line) => serde_json::from_str(&line).map_err(|e| format!("failed: unreadable worker output: {e}")),
            Err(RecvTimeoutError::Timeout) => Err(format!("failed: no answer within {} s", self.timeout.as_secs())),
            // Its output ended: it exited (or closed stdout), and says why on stderr.
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.wait().map_or_else(|| "no exit status".to_owned(), |s| s.to_string());
                let stderr = carrier::read_lossy(&self.stderr);
                Err(format!("failed: {}", carrier::failure_reason(&stderr, &status)))
            }
        }
    }

    /// One sample of `metric`: the row's outcome, or `failed: <why>` if the
    /// worker itself failed.
    fn turn(&mut self, metric: &str) -> Result<Outcome, String> {
        let stdin = self.stdin.as_mut().expect("open until finished");
        writeln!(stdin, "{metric}").map_err(|e| format!("failed: the worker stopped listening: {e}"))?;
        self.next()
    }

    /// Ends the worker: the checks of its final synchronize.
    fn finish(mut self) -> Result<Checks, String> {
        self.stdin = None;
        let checks = self.next::<Checks>()?;
        match self.wait() {
            Some(status) if status.success() => Ok(checks),
            Some(status) => Err(format!("failed: the worker exited with {status}")),
            None => Err(format!("failed: the worker did not exit within {} s", self.timeout.as_secs())),
        }
    }

    /// Its exit status, waiting at most `timeout`; None if it would not exit.
    fn wait(&mut self) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + self.timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                _ => return None,
            }
        }
    }
}

impl Drop for TurnWorker {
    /// A worker given up on (or never finished) goes with its handle.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One column's part of a round.
struct Taker {
    worker: TurnWorker,
    /// What the worker reached; its rows are filled at the end of the round.
    report: WorkerReport,
    /// Each row's samples this round, or the row's first error.
    samples: Vec<Result<Vec<f64>, String>>,
}

impl Taker {
    fn start(worker: Result<TurnWorker, String>) -> Result<Taker, String> {
        let mut worker = worker?;
        let report = worker.next::<WorkerReport>()?;
        Ok(Taker { worker, report, samples: vec![Ok(Vec::new()); LATENCY_METRICS.len()] })
    }

    /// One turn at row `row`, its value added to `turns`; an error of the
    /// worker itself is returned, one of the row is kept as the row's.
    fn turn(&mut self, row: usize, turns: &mut Vec<f64>) -> Result<(), String> {
        if self.samples[row].is_err() {
            return Ok(());
        }
        match self.worker.turn(LATENCY_METRICS[row])? {
            Outcome::Measured(s) => turns.push(s.median),
            Outcome::Error(e) => self.samples[row] = Err(e),
        }
        Ok(())
    }

    fn finish(self) -> Result<WorkerReport, String> {
        let Taker { worker, mut report, samples } = self;
        let checks = worker.finish()?;
        report.checks.passed += checks.passed;
        report.checks.failed.extend(checks.failed);
        for (metric, samples) in LATENCY_METRICS.iter().zip(samples) {
            let outcome = match samples {
                Ok(values) => Outcome::Measured(Summary::of(&values).expect("every row has samples")),
                Err(e) => Outcome::Error(e),
            };
            report.results.insert((*metric).to_owned(), outcome);
        }
        Ok(report)
    }
}

/// One round of every latency row: `workers[i]` is column i's worker (or
/// why it has none), just spawned; the columns take turns, the first in
/// reverse order if `reversed`. Each column's report for the round, or why
/// it failed.
pub fn round(workers: Vec<Result<TurnWorker, String>>, reversed: bool) -> Vec<Result<WorkerReport, String>> {
    // Every worker was spawned before any is waited for: they start up together.
    let mut takers: Vec<Result<Taker, String>> = workers.into_iter().map(Taker::start).collect();
    let mut reversed = reversed;
    for row in 0..LATENCY_METRICS.len() {
        for _ in 0..LATENCY_SAMPLES_PER_ROUND {
            let mut turns = vec![Vec::with_capacity(TURNS); takers.len()];
            for _ in 0..TURNS {
                for i in order(takers.len(), reversed) {
                    let Ok(taker) = &mut takers[i] else { continue };
                    if let Err(e) = taker.turn(row, &mut turns[i]) {
                        takers[i] = Err(e);
                    }
                }
                reversed = !reversed;
            }
            for (taker, turns) in takers.iter_mut().zip(turns) {
                if let Ok(Taker { samples, .. }) = taker {
                    if let (Ok(values), false) = (&mut samples[row], turns.is_empty()) {
                        values.push(turns.iter().sum::<f64>() / turns.len() as f64);
                    }
                }
            }
        }
    }
    takers.into_iter().map(|t| t.and_then(Taker::finish)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake worker: its header, then `answer` (a shell snippet that may
    /// read `$m`, the row asked for, and `$n`, the turn's number) for each
    /// line read; at the end of input, its checks. Its stderr goes to the
    /// file returned.
    fn fake(name: &str, answer: &str) -> (Result<TurnWorker, String>, PathBuf) {
        let dir = std::env::temp_dir().join(format!("gpuplex-latency-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let stderr = dir.join(format!("{name}.err"));
        let script = format!(
            r#"echo '{{"library":"fake","gpuplex":false,"device":"d","driver_version":13000,"results":{{}},"checks":{{"passed":1,"failed":[]}}}}'
n=0
while read m; do n=$((n+1)); {answer}; done
echo '{{"passed":0,"failed":["final synchronize: late"]}}'"#
        );
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(script).stderr(std::fs::File::create(&stderr).unwrap());
        (TurnWorker::spawn(cmd, stderr.clone(), Duration::from_secs(20)), stderr)
    }

    fn measured(v: &str) -> String {
        format!(r#"printf '{{"measured":{{"median":%s,"min":%s,"max":%s,"values":[%s]}}}}\n' {v} {v} {v} {v}"#)
    }

    #[test]
    fn each_sample_is_the_mean_of_its_turns_and_row_errors_stay_in_their_row() {
        // Turn n answers n²: each sample is the mean (not the median) of its TURNS turns, in order.
        let (counting, _) = fake("counting", &measured("$((n*n))"));
        // alloc+free fails on its first turn and is never asked again; the other rows measure 2.
        let (failing, asked) = fake(
            "failing",
            &format!(
                r#"if [ "$m" = alloc_free_1MiB ]; then echo $m >&2; echo '{{"error":"out of memory"}}'; else {}; fi"#,
                measured("2")
            ),
        );
        let reports = round(vec![counting, failing, Err("unavailable: no server".into())], false);

        let counting = reports[0].as_ref().unwrap();
        let checks = Checks { passed: 1, failed: vec!["final synchronize: late".into()] };
        assert_eq!(counting.checks, checks, "the header's and the final synchronize's");
        let mut turns = (1..).map(|n: u32| f64::from(n * n));
        for metric in LATENCY_METRICS {
            let Outcome::Measured(s) = &counting.results[metric] else { panic!("{metric}: {counting:?}") };
            let expected: Vec<f64> = (0..LATENCY_SAMPLES_PER_ROUND)
                .map(|_| turns.by_ref().take(TURNS).sum::<f64>() / TURNS as f64)
                .collect();
            assert_eq!(s.values, expected, "{metric}");
        }

        let failing = reports[1].as_ref().unwrap();
        assert_eq!(failing.results["alloc_free_1MiB"], Outcome::Error("out of memory".into()));
        let Outcome::Measured(s) = &failing.results["launch_async"] else { panic!("{failing:?}") };
        assert_eq!(s.values, vec![2.0; LATENCY_SAMPLES_PER_ROUND]);
        let asked = std::fs::read_to_string(asked).unwrap();
        assert_eq!(asked, "alloc_free_1MiB\n", "the failed row was asked once");

        assert_eq!(reports[2].as_ref().unwrap_err(), "unavailable: no server");
    }

    #[test]
    fn a_worker_that_dies_or_garbles_fails_its_column_alone() {
        let (dies, _) = fake(
            "dies",
            &format!(r#"if [ $n = 3 ]; then echo "error: the server went away" >&2; exit 3; fi; {}"#, measured("1")),
        );
        let (garbles, _) = fake("garbles", "echo not-json");
        let (fine, _) = fake("fine", &measured("5"));
        let reports = round(vec![dies, garbles, fine], true);
        assert_eq!(reports[0].as_ref().unwrap_err(), "failed: error: the server went away");
        assert!(reports[1].as_ref().unwrap_err().starts_with("failed: unreadable worker output"), "{reports:?}");
        let fine = reports[2].as_ref().unwrap();
        assert_eq!(fine.results.len(), LATENCY_METRICS.len());
        assert!(fine.results.values().all(|o| matches!(o, Outcome::Measured(s) if s.median == 5.0)), "{fine:?}");
    }
}
