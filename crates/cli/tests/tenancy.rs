//! Tenants end to end, on `gpuplex serve --backend emulated`: every guest in
//! a worker process of its own, what one guest can do to another (its
//! memory, its faults, its output), a worker killed or stopped mid-run,
//! memory limits on every path, status and metrics, configuration checks,
//! reloads and stops. The guests are `tests/cuda/tenancy` in its modes.
//!
//! Needs nvcc as `cuda_programs.rs` does (the checks that run no program
//! run without it).

mod common;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn sessions(status: &Value) -> Vec<Value> {
    status["sessions"].as_array().expect("sessions").clone()
}

/// Waits until the server lists `n` sessions, each placed in its worker,
/// and returns them.
fn wait_for_sessions(server: &Server, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = sessions(&server.status());
        if s.len() == n && s.iter().all(|s| s["worker_pid"].as_u64().is_some_and(|p| p > 0)) {
            return s;
        }
        assert!(Instant::now() < deadline, "want {n} sessions, have {}: {s:?}", s.len());
        thread::sleep(Duration::from_millis(50));
    }
}

/// A configuration file in the test's directory.
fn config(name: &str, text: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}.toml", std::process::id()));
    fs::write(&path, text).expect("write config");
    path
}

fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z ")
}

#[test]
fn each_guest_runs_in_a_worker_of_its_own() {
    let _serial = serial();
    let Some(dir) = programs() else { return };
    let server = Server::start("workers");
    let guests: Vec<Running> = (0..2).map(|_| Running::spawn(server.run(dir, &["tenancy", "sleep", "3000"]))).collect();
    let listed = wait_for_sessions(&server, 2);
    let workers: Vec<u64> = listed.iter().map(|s| s["worker_pid"].as_u64().expect("worker_pid")).collect();
    assert_ne!(workers[0], workers[1], "two guests share a worker: {listed:?}");
    for s in &listed {
        assert!(s["client_pid"].as_u64().is_some_and(|p| p > 0), "no client pid: {s:?}");
        let worker = s["worker_pid"].as_u64().unwrap() as u32;
        assert!(alive(worker), "worker {worker} is not running");
        let parent = fs::read_to_string(format!("/proc/{worker}/stat")).unwrap();
        let ppid: u32 = parent.rsplit(") ").next().unwrap().split_whitespace().nth(1).unwrap().parse().unwrap();
        assert_eq!(ppid, server.pid(), "worker {worker} is not the server's child");
        // Beyond its standard streams, only its link, its guest's socket,
        // the memory it shares and the eventfd that stops its watch for the
        // guest's hang-up: nothing the server had open.
        for fd in fs::read_dir(format!("/proc/{worker}/fd")).unwrap().flatten() {
            let number: u32 = fd.file_name().to_string_lossy().parse().unwrap();
            let target = fs::read_link(fd.path()).map(|t| t.display().to_string()).unwrap_or_default();
            let expected = number <= 2
                || target.starts_with("socket:")
                || target.starts_with("/memfd:gpuplex")
                || target == "anon_inode:[eventfd]";
            assert!(expected, "worker {worker} holds descriptor {number}: {target}");
        }
    }
    for g in guests {
        let done = g.finish(PROGRAM_TIMEOUT).unwrap();
        assert!(done.status.success(), "{}", done.stderr);
        assert_eq!(done.stdout, "slept 3000 ms\n");
    }
    wait_for_sessions(&server, 0);
    for worker in workers {
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(worker as u32) {
            assert!(Instant::now() < deadline, "worker {worker} outlived its guest");
            thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn a_guest_cannot_read_or_write_another_guest_s_memory() {
    let _serial = serial();
    let Some(dir) = programs() else { return };
    let server = Server::start("poke");
    let (mut holder, mut go) = Running::spawn_with_stdin(server.run(dir, &["tenancy", "hold"]));
    let line = holder.wait_for_line("pointer ", PROGRAM_TIMEOUT).unwrap();
    let address = line.trim().strip_prefix("pointer ").unwrap().to_owned();
    let poker = run_to_end(server.run(dir, &["tenancy", "poke", &address]));
    assert_eq!(poker.stdout, "poke: CUDA_ERROR_ILLEGAL_ADDRESS\n", "poking {address}: {}", poker.stderr);
    writeln!(go, "go").unwrap();
    let held = holder.finish(PROGRAM_TIMEOUT).unwrap();
    assert!(held.status.success() && held.stdout.ends_with("intact\n"), "{}\n{}", held.stdout, held.stderr);
}

#[test]
fn a_guest_s_faults_harm_no_other_guest() {
    let _serial = serial();
    let Some(dir) = programs() else { return };
    let server = Server::start("faults");
    let worker = Running::spawn(server.run(dir, &["tenancy", "compute", "400"]));
    for mode in ["fault", "assert"] {
        let faulted = run_to_end(server.run(dir, &["tenancy", mode]));
        let want = if mode == "fault" { "CUDA_ERROR_ILLEGAL_ADDRESS" } else { "CUDA_ERROR_ASSERT" };
        assert_eq!(
            faulted.stdout,
            format!("{mode}: {want}\nthen cuMemAlloc: {want}\nthen cuCtxSynchronize: {want}\n"),
            "{}",
            faulted.stderr
        );
    }
    let done = worker.finish(PROGRAM_TIMEOUT).unwrap();
    assert!(done.status.success(), "{}", done.stderr);
    assert_eq!(done.stdout, "compute: 400 rounds ok\n");
    assert_eq!(run_to_end(server.run(dir, &["tenancy", "compute", "3"])).stdout, "compute: 3 rounds ok\n");
}

#[test]
fn what_kernels_print_reaches_their_own_guest_only() {
    let _serial = serial();
    let Some(dir) = programs() else { return };
    let server = Server::start("output");
    let expected = |rounds: i32| -> String {
        (0..rounds)
            .map(|r| format!("host before round {r}\ndevice round {r} thread 0\ndevice round {r} thread 1\nhost after round {r}\n"))
            .collect()
    };
    // Two guests at once, each with its own rounds: each sees its own lines, in order.
    let guests: Vec<(i32, Running)> = [2, 5]
        .into_iter()
        .map(|n| (n, Running::spawn(server.run(dir, &["tenancy", "printf", &n.to_string()]))))
        .collect();
    for (n, g) in guests {
        let done = g.finish(PROGRAM_TIMEOUT).unwrap();
        assert!(done.status.success(), "{}", done.stderr);
        assert!(done.stdout == expected(n), "printf {n}:\n{}", diff(&expected(n), &done.stdout));
    }
    let asserted = run_to_end(server.run(dir, &["tenancy", "assert"]));
    assert!(asserted.stderr.contains("Assertion `v == 0` failed."), "assert's stderr: {}", asserted.stderr);
    // The embedded server of `gpuplex run` delivers it alike.
    let embedded = run_to_end(run_command(dir, None, &["tenancy", "printf", "3"]));
    assert!(embedded.stdout == expected(3), "embedded:\n{}", diff(&expected(3), &embedded.stdout));
}

#[test]
fn a_killed_worker_ends_only_its_guest_s_session() {
    let _serial = serial();
    let Some(dir) = programs() else { return };
    let server = Server::start("killed");
    let doomed = Running::spawn(server.run(dir, &["tenancy", "sleep", "60000"]));
    let listed = wait_for_sessions(&server, 1);
    let worker = listed[0]["worker_pid"].as_u64().unwrap() as i32;
    let bystander = Running::spawn(server.run(dir, &["tenancy", "compute", "200"]));
    wait_for_sessions(&server, 2);
    // SAFETY: kill(2) takes no pointers; the pid is the doomed guest's worker.
    unsafe { libc::kill(worker, libc::SIGKILL) };
    let killed = Instant::now();
    let done = doomed.finish(PROGRAM_TIMEOUT).unwrap();
    assert!(!done.status.success(), "the guest of a killed worker succeeded");
    assert!(done.stderr.contains("CUDA_ERROR_DEVICE_UNAVAILABLE"), "{}", done.stderr);
    assert!(killed.elapsed() < Duration::from_secs(10), "noticed after {:?}", killed.elapsed());
    let other = bystander.finish(PROGRAM_TIMEOUT).unwrap();
    assert_eq!(other.stdout, "compute: 200 rounds ok\n", "{}", other.stderr);
    wait_for_sessions(&server, 0);
    assert_eq!(run_to_end(server.run(dir, &["tenancy", "compute", "2"])).stdout, "compute: 2 rounds ok\n");
    let log = server.log();
    assert!(log.contains("killed by signal 9"), "the server did not log why: {log}");
}

#[test]
fn a_long_kernel_is_waited_for_and_a_stopped_worker_is_not() {
    let _serial = serial();
    let Some(dir) = programs() else { return };
    let server = Server::start("liveness");
    let mut long = server.run(dir, &["tenancy", "sleep", "6000"]);
    long.env("GPUPLEX_TIMEOUT", "3");
    assert_eq!(run_to_end(long).stdout, "slept 6000 ms\n");
    wait_for_sessions(&server, 0);

    let mut stuck = server.run(dir, &["tenancy", "sleep", "60000"]);
    stuck.env("GPUPLEX_TIMEOUT", "3");
    let stuck = Running::spawn(stuck);
    let worker = wait_for_sessions(&server, 1)[0]["worker_pid"].as_u64().unwrap() as i32;
    // SAFETY: kill(2) takes no pointers; the pid is the guest's worker.
    unsafe { libc::kill(worker, libc::SIGSTOP) };
    let stopped = Instant::now();
    let done = stuck.finish(PROGRAM_TIMEOUT).unwrap();
    let waited = stopped.elapsed();
    // SAFETY: as above.
    unsafe { libc::kill(worker, libc::SIGKILL) };
    assert!(!done.status.success(), "a stopped worker's guest succeeded");
    assert!(done.stderr.contains("CUDA_ERROR_DEVICE_UNAVAILABLE"), "{}", done.stderr);
    assert!(waited < Duration::from_secs(15), "gave up after {waited:?}");
}

/// Two tenants on one server, both over TCP (one local user is one uid
/// here): one with a limit tries every path, the other holds more than
/// that limit meanwhile.
#[test]
fn a_tenant_s_memory_limit_holds_on_every_path() {
    let _serial = serial();
    let Some(dir) = programs() else { return };
    let small = token_file("tenant-small", "tenant small's token, 32 bytes..");
    let other = token_file("tenant-other", "tenant other's token, 32 bytes..");
    let cfg = config(
        "limits",
        &format!(
            "[tenants.small]\ntoken_file = \"{}\"\nmemory_limit = \"256MiB\"\n\n[tenants.other]\ntoken_file = \"{}\"\n",
            small.display(),
            other.display()
        ),
    );
    let tcp = free_tcp_address();
    let server = Server::start_with("limits", &["--config", cfg.to_str().unwrap(), "--listen", &tcp]);
    let remote = |token: &Path, args: &[&str]| {
        let mut cmd = Command::new(gpuplex());
        cmd.args(["run", "--server", &tcp, "--token-file"])
            .arg(token)
            .arg("--")
            .arg(dir.join(args[0]))
            .args(&args[1..]);
        cmd
    };
    let mut holder = Running::spawn(remote(&other, &["hold_memory", "512"]));
    holder.wait_for_line("holding", PROGRAM_TIMEOUT).unwrap();
    let out = run_to_end(remote(&small, &["tenancy", "memory"])).stdout;
    // What `tenancy memory` prints under a limit (the GPU suite checks the same file).
    let want = fs::read_to_string(repo_root().join("tests/cuda/expected/tenancy_memory.txt"))
        .expect("expected/tenancy_memory.txt")
        .replace("LIMIT", "256");
    assert!(out == want, "tenancy memory under 256 MiB:\n{}", diff(&want, &out));
    let tenants = server.status()["tenants"].clone();
    let find = |name: &str| tenants.as_array().unwrap().iter().find(|t| t["name"] == name).cloned().unwrap();
    assert!(find("other")["memory_used"].as_u64().unwrap() >= 512 << 20, "{tenants}");
    assert_eq!(find("other")["memory_limit"], Value::Null);
    assert_eq!(find("small")["memory_limit"].as_u64(), Some(256 << 20));
    let done = holder.finish(Duration::from_secs(1));
    assert!(done.is_err(), "hold_memory holds until killed");
}

/// A loopback TCP address that was free a moment ago.
fn free_tcp_address() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    format!("tcp:127.0.0.1:{port}")
}

#[test]
fn status_and_metrics_show_each_tenant_and_a_guest_sees_its_own() {
    let _serial = serial();
    let Some(dir) = programs() else { return };
    let token = token_file("viewer", "the viewing tenant's token, 32 b");
    let cfg = config(
        "status",
        &format!(
            "[tenants.main]\nuids = [{}]\nmemory_limit = \"1GiB\"\nweight = 3\n\n[tenants.viewer]\ntoken_file = \"{}\"\n",
            uid(),
            token.display()
        ),
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let metrics = format!("127.0.0.1:{port}");
    let tcp = free_tcp_address();
    let server =
        Server::start_with("status", &["--config", cfg.to_str().unwrap(), "--metrics", &metrics, "--listen", &tcp]);
    let mut holder = Running::spawn(server.run(dir, &["hold_memory", "64"]));
    holder.wait_for_line("holding", PROGRAM_TIMEOUT).unwrap();
    let s = server.status();
    assert_eq!(s["view"], "all");
    let main = s["tenants"].as_array().unwrap().iter().find(|t| t["name"] == "main").cloned().expect("tenant main");
    assert_eq!((main["sessions"].as_u64(), main["weight"].as_u64()), (Some(1), Some(3)));
    assert_eq!(main["memory_limit"].as_u64(), Some(1 << 30));
    assert!(main["memory_used"].as_u64().unwrap() >= 64 << 20, "{main}");
    let session = &sessions(&s)[0];
    assert!(session["calls"].as_u64().unwrap() > 0 && session["worker_pid"].as_u64().unwrap() > 0, "{session}");

    let body = http_get(&metrics, "/metrics");
    for line in
        ["gpuplex_tenant_sessions{tenant=\"main\"} 1", "gpuplex_tenant_memory_limit_bytes{tenant=\"main\"} 1073741824"]
    {
        assert!(body.contains(line), "no {line:?} in:\n{body}");
    }
    assert!(body.contains("gpuplex_tenant_memory_bytes{tenant=\"main\"} "), "{body}");
    assert!(http_get(&metrics, "/other").starts_with("HTTP/1.1 404"));

    // Over TCP as tenant viewer: only its own (no) sessions, not main's.
    let mut cmd = Command::new(gpuplex());
    cmd.args(["status", "--json", "--server", &tcp, "--token-file"]).arg(&token);
    let seen: Value = serde_json::from_str(&run_to_end(cmd).stdout).unwrap();
    assert_eq!(seen["view"], "own tenant");
    assert!(seen["tenants"].as_array().unwrap().iter().all(|t| t["name"] == "viewer"), "{seen}");
    drop(holder);
}

fn http_get(address: &str, path: &str) -> String {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(address).expect("metrics endpoint");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).unwrap();
    body
}

#[test]
fn bad_configurations_are_refused_with_file_and_line() {
    let _serial = serial();
    let bad = config("bad", "[tenants.a]\nuids = [1]\nmemory_limit = \"lots\"\n");
    let mut check = Command::new(gpuplex());
    check.args(["serve", "--check-config"]).arg(&bad);
    let done = Running::spawn(check).finish(PROGRAM_TIMEOUT).unwrap();
    assert!(!done.status.success());
    assert!(done.stderr.contains(&format!("{}:3:", bad.display())), "{}", done.stderr);
    let good = config("good", "[tenants.a]\nuids = [1]\nmemory_limit = \"2GiB\"\n");
    let mut check = Command::new(gpuplex());
    check.args(["serve", "--check-config"]).arg(&good);
    assert!(run_to_end(check).stdout.contains("ok, 1 tenant"));
}

#[test]
fn sighup_reloads_limits_and_sigterm_stops_cleanly() {
    let _serial = serial();
    let Some(dir) = programs() else { return };
    let cfg = config("reload", &format!("[tenants.me]\nuids = [{}]\nmemory_limit = \"512MiB\"\n", uid()));
    let server = Server::start_with("reload", &["--config", cfg.to_str().unwrap()]);
    let total = |server: &Server| run_to_end(server.run(dir, &["mem_info"])).stdout;
    assert!(total(&server).ends_with(&format!("total {}\n", 512u64 << 20)), "{}", total(&server));
    fs::write(&cfg, format!("[tenants.me]\nuids = [{}]\nmemory_limit = \"384MiB\"\n", uid())).unwrap();
    server.signal(libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !total(&server).ends_with(&format!("total {}\n", 384u64 << 20)) {
        assert!(Instant::now() < deadline, "the new limit never showed: {}", total(&server));
        thread::sleep(Duration::from_millis(100));
    }
    fs::write(&cfg, "[tenants.me]\nuids = \"not a list\"\n").unwrap();
    server.signal(libc::SIGHUP);
    thread::sleep(Duration::from_millis(300));
    assert!(total(&server).ends_with(&format!("total {}\n", 384u64 << 20)), "a bad reload changed the limit");
    server.signal(libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.socket.exists() || alive(server.pid()) {
        assert!(Instant::now() < deadline, "the server did not stop on SIGTERM");
        thread::sleep(Duration::from_millis(20));
    }
    let log = server.log();
    assert!(log.contains("kept the configuration in use") && log.contains("SIGTERM: stopping"), "{log}");
}
