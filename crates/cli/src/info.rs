//! `gpuplex info`, and the probe `run` uses to find a live server.

use std::path::Path;
use std::process::ExitCode;

use gpuplex_protocol::{codec, Header, Opcode, ServerSummary, SessionSummary};
use gpuplex_transport::{Address, Token, TransportError};

use crate::Error;

/// Asks a server for its summary (a one-shot `ServerInfo` connection).
pub fn query(address: &Address, token: Option<&Token>) -> Result<ServerSummary, Error> {
    let mut carrier = gpuplex_transport::connect(address, token)?;
    carrier.send(&Header::request(Opcode::ServerInfo, 1, 0, 0), &[])?;
    let mut buf = Vec::new();
    let header = carrier.recv(&mut buf)?;
    if header.status.get() != 0 {
        return Err(format!("server answered status {}", header.status.get()).into());
    }
    Ok(codec::decode(&buf)?)
}

/// Why `query` failed, for the user: no server, or one that will not have us.
pub fn failure(address: &Address, e: &Error) -> String {
    match e.downcast_ref::<TransportError>() {
        Some(TransportError::Auth(_) | TransportError::Token(_)) => {
            format!("cannot use the gpuplex server at {address}: {}", crate::chain(&**e))
        }
        _ => format!("no gpuplex server at {address}: {}", crate::chain(&**e)),
    }
}

pub fn info(server: Option<Address>, token_file: Option<&Path>) -> Result<ExitCode, Error> {
    let address = match server {
        Some(a) => a,
        None => crate::default_server()?,
    };
    let token = crate::client_token(&address, token_file)?;
    let s = query(&address, token.as_ref()).map_err(|e| failure(&address, &e))?;
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
        // Remote sessions have no pid or uid the kernel vouches for.
        let known = |v: u32, none: u32| if v == none { "-".to_owned() } else { v.to_string() };
        for t in &s.sessions.0 {
            println!(
                "  {:>4} {:>8} {:>6} {:>4} {:>12} {:>10} {:>8}  {}",
                t.id,
                known(t.pid, SessionSummary::NO_PID),
                known(t.uid, SessionSummary::NO_UID),
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
