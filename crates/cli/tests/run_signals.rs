//! `gpuplex run` under signals: it outlives its program and cleans up
//! after it (see `src/relay.rs`). No GPU needed: an emulated server is
//! embedded and the program is a shell.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// `gpuplex run` with an embedded emulated server, its stdout piped, once
/// the program has said it is up.
fn run_shell(script: &str) -> (Child, BufReader<std::process::ChildStdout>) {
    run_shell_with(script, Command::new(env!("CARGO_BIN_EXE_gpuplex")))
}

fn run_shell_with(script: &str, mut gpuplex: Command) -> (Child, BufReader<std::process::ChildStdout>) {
    let nowhere = std::env::temp_dir().join(format!("gpuplex-no-server-{}.sock", std::process::id()));
    let mut child = gpuplex
        .args(["run", "--backend", "emulated", "sh", "-c", script])
        .env("GPUPLEX_SERVER", format!("unix:{}", nowhere.display()))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "up\n");
    (child, out)
}

fn signal(child: &Child, signal: libc::c_int) {
    // SAFETY: kill(2) takes no pointers; the child has not been reaped.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, signal) }, 0);
}

fn wait_within(child: &mut Child, limit: Duration) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("gpuplex run still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A program that outlasts the signal sent to `gpuplex run` a moment in.
const SLEEPER: &str = "echo up; sleep 0.5; echo done";

/// The program ran to its end and `gpuplex run` with it.
fn finishes_normally(child: &mut Child, mut out: BufReader<std::process::ChildStdout>) {
    let status = wait_within(child, Duration::from_secs(10));
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(status.success(), "{status:?}");
    assert_eq!(rest, "done\n");
}

fn library_dir(child: &Child) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("gpuplex-run-{}", child.id()))
}

#[test]
fn sigterm_reaches_the_program_and_run_cleans_up() {
    let (mut child, _out) = run_shell("echo up; exec sleep 30");
    let dir = library_dir(&child);
    assert!(dir.exists(), "the library directory while the program runs");
    signal(&child, libc::SIGTERM);
    let status = wait_within(&mut child, Duration::from_secs(10));
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status:?}");
    assert!(!dir.exists(), "{} left behind", dir.display());
}

#[test]
fn sigint_to_run_alone_leaves_the_program_running() {
    let (mut child, out) = run_shell(SLEEPER);
    signal(&child, libc::SIGINT);
    finishes_normally(&mut child, out);
    assert!(!library_dir(&child).exists());
}

/// As under `nohup`: SIGHUP ignored on entry stays ignored, by the program too.
#[test]
fn an_ignored_sighup_stays_ignored() {
    use std::os::unix::process::CommandExt;
    let mut gpuplex = Command::new(env!("CARGO_BIN_EXE_gpuplex"));
    // SAFETY: signal(2) is async-signal-safe; it runs in the child before exec.
    unsafe {
        gpuplex.pre_exec(|| {
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            Ok(())
        });
    }
    let (mut child, out) = run_shell_with(SLEEPER, gpuplex);
    signal(&child, libc::SIGHUP);
    finishes_normally(&mut child, out);
}
