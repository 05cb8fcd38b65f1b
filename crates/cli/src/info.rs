//! `gpuplex info`, and the probe `run` uses to find a live server.

use std::process::ExitCode;

use gpuplex_protocol::{codec, Header, Opcode, ServerSummary};
use gpuplex_transport::Address;

use crate::Error;

/// Asks a server for its summary (a one-shot `ServerInfo` connection).
pub fn query(address: &Address) -> Result<ServerSummary, Error> {
    let mut carrier = gpuplex_transport::connect(address)?;
    carrier.send(&Header::request(Opcode::ServerInfo, 1, 0, 0), &[])?;
    let mut buf = Vec::new();
    let header = carrier.recv(&mut buf)?;
    if header.status.get() != 0 {
        return Err(format!("server answered status {}", header.status.get()).into());
    }
    Ok(codec::decode(&buf)?)
}

pub fn info(server: Option<Address>) -> Result<ExitCode, Error> {
    let address = match server {
        Some(a) => a,
        None => crate::default_server()?,
    };
    let s = query(&address).map_err(|e| format!("no gpuplex server at {address}: {e}"))?;
    println!("server   {address}");
    println!("backend  {}", s.backend);
    println!("driver   {}.{}", s.driver_version / 1000, s.driver_version % 1000 / 10);
    for (i, d) in s.devices.0.iter().enumerate() {
        println!("device {i}  {}  {} MiB  {}", d.name, d.total_mem >> 20, d.pci_bus_id);
    }
    println!("sessions {}", s.sessions.0.len());
    if !s.sessions.0.is_empty() {
        println!(
            "  {:>4} {:>8} {:>6} {:>4} {:>12} {:>10} {:>8}  program",
            "id", "pid", "uid", "ctx", "device MiB", "calls", "seconds"
        );
        for t in &s.sessions.0 {
            println!(
                "  {:>4} {:>8} {:>6} {:>4} {:>12} {:>10} {:>8}  {}",
                t.id,
                t.pid,
                t.uid,
                t.contexts,
                t.device_bytes >> 20,
                t.calls,
                t.seconds,
                t.program
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
