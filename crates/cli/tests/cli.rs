//! The command line as users meet it: usage errors, the exit status of a
//! program that cannot run, what the emulated device says of a kernel it
//! cannot run, and logs fit for a file or a collector.

mod common;

use common::*;

use std::process::{Command, Stdio};
use std::time::Duration;

/// `gpuplex ARGS` to its end, with an unreachable default server so that
/// `run` embeds an emulated one.
fn gpuplex_to_end(args: &[&str]) -> Finished {
    let nowhere = std::env::temp_dir().join(format!("gpuplex-cli-no-server-{}.sock", std::process::id()));
    let mut cmd = Command::new(gpuplex());
    cmd.args(args).env("GPUPLEX_SERVER", format!("unix:{}", nowhere.display()));
    Running::spawn(cmd).finish(PROGRAM_TIMEOUT).expect("gpuplex ends")
}

#[test]
fn unknown_flags_are_usage_errors_not_programs() {
    for args in [&["run", "--backend", "emulated", "--frob", "--", "true"][..], &["run", "--sever", "x", "--", "true"]]
    {
        let done = gpuplex_to_end(args);
        assert_eq!(done.status.code(), Some(2), "{args:?}: {}", done.stderr);
        assert!(done.stderr.contains("unexpected argument"), "{args:?}: {}", done.stderr);
    }
    let done = gpuplex_to_end(&["run", "--sever", "x", "--", "true"]);
    assert!(done.stderr.contains("--server"), "a close flag is suggested: {}", done.stderr);
}

#[test]
fn a_program_that_is_missing_or_not_executable_exits_as_a_shell_says() {
    let dir = std::env::temp_dir().join(format!("gpuplex-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plain = dir.join("not-executable");
    std::fs::write(&plain, "#!/bin/sh\n").unwrap();
    for (program, code) in [(dir.join("missing"), 127), (plain, 126)] {
        let done = gpuplex_to_end(&["run", "--backend", "emulated", "--", program.to_str().unwrap()]);
        assert_eq!(done.status.code(), Some(code), "{}: {}", program.display(), done.stderr);
        assert!(done.stderr.contains("cannot run"), "{}", done.stderr);
    }
    // A program's own status passes through, and arguments that look like flags after it are its own.
    let done = gpuplex_to_end(&["run", "--backend", "emulated", "sh", "-c", "exit 3"]);
    assert_eq!(done.status.code(), Some(3), "{}", done.stderr);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The embedded server starts beside the program: one that cannot start
/// (the CUDA backend on a machine without a GPU) says why, and the
/// program's CUDA calls fail with CUDA_ERROR_NO_DEVICE.
#[test]
fn an_embedded_server_that_cannot_start_says_why_beside_the_program() {
    let Some(dir) = programs() else { return };
    if std::path::Path::new("/dev/nvidiactl").exists() {
        return; // here the CUDA backend would start
    }
    let program = dir.join("device_query");
    let done = gpuplex_to_end(&["run", "--backend", "cuda", "--", program.to_str().unwrap()]);
    assert!(done.stderr.contains("cannot start the embedded server"), "{}", done.stderr);
    assert!(done.stderr.contains("cuInit(0) failed: CUDA_ERROR_NO_DEVICE"), "{}", done.stderr);
    assert_ne!(done.status.code(), Some(0));
}

#[test]
fn the_emulated_device_says_which_kernel_it_cannot_run_and_why() {
    let _serial = serial();
    let Some(dir) = programs() else { return };
    let done = run_to_end(run_command(dir, None, &["unregistered"]));
    assert_eq!(done.stdout, "launch: CUDA_SUCCESS, then synchronize: CUDA_ERROR_NOT_SUPPORTED\n");
    let warning = done.stderr.lines().find(|l| l.contains("warning")).unwrap_or_else(|| panic!("{}", done.stderr));
    for says in ["not_a_test_kernel", "emulated", "not a GPU", "--backend cuda"] {
        assert!(warning.contains(says), "the warning should say {says:?}: {warning}");
    }
}

/// A server whose stderr is a file (not a terminal), asked for `format`,
/// until it has served one program and been stopped: what it logged.
fn server_log(format: Option<&str>) -> String {
    let _serial = serial();
    let dir = std::env::temp_dir().join(format!("gpuplex-cli-log-{}-{}", std::process::id(), format.unwrap_or("text")));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("s.sock");
    let log = dir.join("serve.log");
    let mut serve = Command::new(gpuplex());
    if let Some(f) = format {
        serve.args(["--log-format", f]);
    }
    serve
        .args(["serve", "--backend", "emulated", "--listen"])
        .arg(format!("unix:{}", socket.display()))
        .stderr(std::fs::File::create(&log).unwrap())
        .stdout(Stdio::null());
    let mut server = serve.spawn().unwrap();
    let started = std::time::Instant::now();
    while !socket.exists() {
        assert!(started.elapsed() < Duration::from_secs(30), "the server made no socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut run = Command::new(gpuplex());
    run.args(["run", "--server"]).arg(format!("unix:{}", socket.display())).args(["--", "true"]);
    run_to_end(run);
    // SAFETY: kill(2) takes no pointers; the child has not been reaped.
    unsafe { libc::kill(server.id() as libc::pid_t, libc::SIGTERM) };
    assert!(server.wait().unwrap().success());
    assert!(!socket.exists(), "the socket is removed on SIGTERM");
    let text = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    text
}

#[test]
fn a_log_written_to_a_file_has_no_escape_codes_and_says_it_stopped() {
    let log = server_log(None);
    assert!(!log.contains('\u{1b}'), "escape codes in a file:\n{log}");
    assert!(log.contains("serving") && log.contains("SIGTERM: stopping"), "{log}");
}

#[test]
fn json_logs_are_one_object_a_line() {
    let log = server_log(Some("json"));
    let lines: Vec<serde_json::Value> =
        log.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect();
    assert!(lines.iter().any(|l| l["fields"]["message"] == "serving"), "{log}");
    assert!(lines.iter().all(|l| l["level"].is_string() && l["timestamp"].is_string()), "{log}");
}
