//! `gpuplex status`, and the probe `run` uses to find a live server.

use std::path::Path;
use std::process::ExitCode;

use gpuplex_protocol::{codec, Header, Opcode, ServerStatus, ServerSummary, SessionStatus, SessionSummary};
use gpuplex_server::config::format_size;
use gpuplex_transport::{Address, Token, TransportError};
use serde_json::json;

use crate::Error;

/// Asks a server for its summary (a one-shot `ServerInfo` connection).
pub fn query(address: &Address, token: Option<&Token>) -> Result<ServerSummary, Error> {
    ask(address, token, Opcode::ServerInfo)
}

/// Asks a server for its status (a one-shot `Status` connection).
pub fn query_status(address: &Address, token: Option<&Token>) -> Result<ServerStatus, Error> {
    ask(address, token, Opcode::Status)
}

/// One request with no payload on a connection of its own, and its answer.
fn ask<T: gpuplex_protocol::Wire>(address: &Address, token: Option<&Token>, opcode: Opcode) -> Result<T, Error> {
    let mut carrier = gpuplex_transport::connect(address, token)?;
    carrier.send(&Header::request(opcode, 1, 0, 0), &[])?;
    let mut buf = Vec::new();
    let header = carrier.recv(&mut buf)?;
    if header.status.get() != 0 {
        let detail = codec::decode::<gpuplex_protocol::ErrorDetail>(&buf).map(|d| d.detail).unwrap_or_default();
        return Err(format!("server answered status {}: {detail}", header.status.get()).into());
    }
    Ok(codec::decode(&buf)?)
}

/// Why `query` failed, for the user: no server, or one that will not have us.
pub fn failure(address: &Address, e: &Error) -> String {
    match e.downcast_ref::<TransportError>() {
        Some(TransportError::Auth(_) | TransportError::Token(_)) => {
            format!("cannot use the gpuplex server at {address}: {}", crate::chain(&**e))
        }
        _ => format!(
            "no gpuplex server at {address}: {} (start one with `gpuplex serve`, or give --server)",
            crate::chain(&**e)
        ),
    }
}

pub fn status(server: Option<Address>, token_file: Option<&Path>, json: bool) -> Result<ExitCode, Error> {
    let address = match server {
        Some(a) => a,
        None => crate::default_server()?,
    };
    let token = crate::client_token(&address, token_file)?;
    let s = query_status(&address, token.as_ref()).map_err(|e| failure(&address, &e))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&to_json(&address, &s))?);
    } else {
        print_tables(&address, &s);
    }
    Ok(ExitCode::SUCCESS)
}

/// Remote sessions have no pid or uid the kernel vouches for.
fn known(v: u32, none: u32) -> Option<u32> {
    (v != none).then_some(v)
}

fn to_json(address: &Address, s: &ServerStatus) -> serde_json::Value {
    let devices: Vec<_> = s
        .devices
        .0
        .iter()
        .map(|d| json!({ "name": d.name, "total_memory": d.total_mem, "pci_bus_id": d.pci_bus_id }))
        .collect();
    let tenants: Vec<_> = s
        .tenants
        .0
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "sessions": t.sessions,
                "memory_used": t.memory_used,
                "memory_limit": (t.memory_limit != 0).then_some(t.memory_limit),
                "weight": t.weight,
                "calls": t.calls,
                "calls_per_second": t.calls_per_second,
                "gpu_busy": t.gpu_busy,
                "priority": t.priority,
                "sharing": t.sharing,
                "gpu_time": t.gpu_time.0.iter().map(|g| json!({
                    "gpu": g.gpu,
                    "compute_seconds": g.compute_seconds,
                    "copy_seconds": g.copy_seconds,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let sessions: Vec<_> = s
        .sessions
        .0
        .iter()
        .map(|t| {
            json!({
                "id": t.id,
                "tenant": t.tenant,
                "client_pid": known(t.client_pid, SessionSummary::NO_PID),
                "uid": known(t.uid, SessionSummary::NO_UID),
                "peer": t.peer,
                "program": t.program,
                "worker_pid": t.worker_pid,
                "contexts": t.contexts,
                "memory_used": t.memory_used,
                "calls": t.calls,
                "calls_per_second": t.calls_per_second,
                "gpu_busy": t.gpu_busy,
                "compute_seconds": t.compute_seconds,
                "copy_seconds": t.copy_seconds,
                "seconds": t.seconds,
                "faults": faults(t),
            })
        })
        .collect();
    json!({
        "server": address.to_string(),
        "backend": s.backend,
        "driver_version": s.driver_version,
        "devices": devices,
        "view": if s.full { "all" } else { "own tenant" },
        "uptime_seconds": s.uptime_seconds,
        "idle_workers": s.idle_workers,
        "interval_seconds": s.interval_seconds,
        "policy": s.policy,
        "tenants": tenants,
        "sessions": sessions,
    })
}

fn print_tables(address: &Address, s: &ServerStatus) {
    println!("server   {address}");
    println!("backend  {}", s.backend);
    println!("driver   {}.{}", s.driver_version / 1000, s.driver_version % 1000 / 10);
    for (i, d) in s.devices.0.iter().enumerate() {
        println!("device {i}  {}  {}  {}", d.name, format_size(d.total_mem), d.pci_bus_id);
    }
    println!("up       {} s, {} idle worker(s)", s.uptime_seconds, s.idle_workers);
    println!("policy   {}", s.policy);
    if !s.full {
        println!("view     your own tenant only");
    }
    let rate = |r: f32| format!("{r:.1}");
    let busy = |b: f32| format!("{:.0}%", b * 100.0);
    println!();
    println!(
        "{:<16} {:>8} {:>12} {:>12} {:>6} {:>8} {:>8} {:>12} {:>9} {:>6} {:>10} {:>10}",
        "tenant",
        "sessions",
        "memory",
        "limit",
        "weight",
        "priority",
        "sharing",
        "calls",
        "calls/s",
        "busy",
        "gpu s",
        "copy s"
    );
    for t in &s.tenants.0 {
        let limit = if t.memory_limit == 0 { "-".to_owned() } else { format_size(t.memory_limit) };
        let (compute, copy) =
            t.gpu_time.0.iter().fold((0.0, 0.0), |(a, b), g| (a + g.compute_seconds, b + g.copy_seconds));
        println!(
            "{:<16} {:>8} {:>12} {:>12} {:>6} {:>8} {:>8} {:>12} {:>9} {:>6} {:>10.3} {:>10.3}",
            t.name,
            t.sessions,
            format_size(t.memory_used),
            limit,
            t.weight,
            t.priority,
            t.sharing,
            t.calls,
            rate(t.calls_per_second),
            busy(t.gpu_busy),
            compute,
            copy
        );
    }
    println!();
    println!(
        "{:>5} {:<16} {:>8} {:>6} {:>8} {:>4} {:>12} {:>10} {:>9} {:>6} {:>7} {:<14}  program",
        "id", "tenant", "pid", "uid", "worker", "ctx", "memory", "calls", "calls/s", "busy", "seconds", "faults"
    );
    let opt = |v: Option<u32>| v.map_or("-".to_owned(), |v| v.to_string());
    for t in &s.sessions.0 {
        println!(
            "{:>5} {:<16} {:>8} {:>6} {:>8} {:>4} {:>12} {:>10} {:>9} {:>6} {:>7} {:<14}  {}",
            t.id,
            t.tenant,
            opt(known(t.client_pid, SessionSummary::NO_PID)),
            opt(known(t.uid, SessionSummary::NO_UID)),
            t.worker_pid,
            t.contexts,
            format_size(t.memory_used),
            t.calls,
            rate(t.calls_per_second),
            busy(t.gpu_busy),
            t.seconds,
            faults(t),
            t.program
        );
    }
}

/// Whose fatal GPU faults reach the session: its own only, or every
/// spatial session's on one GPU (their shared MPS server).
fn faults(s: &SessionStatus) -> String {
    match s.mps_gpu {
        SessionStatus::OWN_FAULT_DOMAIN => "own".to_owned(),
        gpu => format!("shared (MPS, GPU {gpu})"),
    }
}
