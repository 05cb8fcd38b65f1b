//! Server addresses as users write them: `unix:PATH` for local guests,
//! `tcp:HOST:PORT` for remote ones (`tcp:[::1]:9000` for IPv6), `vm:PATH`
//! for guests in a virtual machine sharing memory with the host.

use std::fmt;
use std::path::PathBuf;

use crate::TransportError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    Unix(PathBuf),
    /// `HOST:PORT` as written (a name, an IPv4 address or a bracketed IPv6
    /// one), resolved when connecting or binding.
    Tcp(String),
    /// Memory shared with a virtual machine ([`crate::vm`]): the server's
    /// file, or in the guest the PCI device's BAR (`resource2` in sysfs);
    /// in the guest `vm` alone finds the device.
    Vm(PathBuf),
}

impl Address {
    /// The default server socket: `$XDG_RUNTIME_DIR/gpuplex.sock`, or
    /// `/tmp/gpuplex-UID.sock` where there is no runtime directory.
    pub fn default_local() -> Address {
        match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
            Some(dir) => Address::Unix(PathBuf::from(dir).join("gpuplex.sock")),
            // SAFETY: getuid has no preconditions and cannot fail.
            None => Address::Unix(PathBuf::from(format!("/tmp/gpuplex-{}.sock", unsafe { libc::getuid() }))),
        }
    }
}

/// Checks `HOST:PORT` up front, so that a typo is reported where it was
/// written rather than as a failed name lookup later.
fn valid_host_port(s: &str) -> bool {
    let Some((host, port)) = s.rsplit_once(':') else { return false };
    let host_ok = match host.strip_prefix('[') {
        Some(v6) => v6.strip_suffix(']').is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok()),
        None => !host.is_empty() && !host.contains(':'),
    };
    host_ok && port.parse::<u16>().is_ok()
}

impl std::str::FromStr for Address {
    type Err = TransportError;

    fn from_str(s: &str) -> Result<Address, TransportError> {
        match s.split_once(':') {
            Some(("unix", path)) if !path.is_empty() => Ok(Address::Unix(PathBuf::from(path))),
            Some(("tcp", host_port)) if valid_host_port(host_port) => Ok(Address::Tcp(host_port.to_owned())),
            Some(("vm", path)) => Ok(Address::Vm(PathBuf::from(path))),
            None if s == "vm" => Ok(Address::Vm(PathBuf::new())),
            _ => Err(TransportError::Address(s.to_owned())),
        }
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Unix(path) => write!(f, "unix:{}", path.display()),
            Address::Tcp(host_port) => write!(f, "tcp:{host_port}"),
            Address::Vm(path) if path.as_os_str().is_empty() => write!(f, "vm"),
            Address::Vm(path) => write!(f, "vm:{}", path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        let a: Address = "unix:/run/g.sock".parse().unwrap();
        assert_eq!(a, Address::Unix("/run/g.sock".into()));
        assert_eq!(a.to_string(), "unix:/run/g.sock");
        for tcp in ["tcp:1.2.3.4:5", "tcp:gpu-host.example:9000", "tcp:[::1]:9000", "tcp:[fe80::1]:0"] {
            let a: Address = tcp.parse().unwrap();
            assert_eq!(a, Address::Tcp(tcp[4..].to_owned()));
            assert_eq!(a.to_string(), tcp);
        }
        let vm: Address = "vm:/dev/shm/gpuplex-vm0".parse().unwrap();
        assert_eq!(vm, Address::Vm("/dev/shm/gpuplex-vm0".into()));
        assert_eq!(vm.to_string(), "vm:/dev/shm/gpuplex-vm0");
        for found in ["vm", "vm:"] {
            assert_eq!(found.parse::<Address>().unwrap(), Address::Vm(PathBuf::new()));
        }
        assert_eq!(Address::Vm(PathBuf::new()).to_string(), "vm");
        for bad in [
            "unix:",
            "/run/g.sock",
            "tcp:",
            "tcp:host",
            "tcp::9000",
            "tcp:host:",
            "tcp:host:65536",
            "tcp:host:port",
            "tcp:::1:9000",
            "tcp:[::1:9000",
            "tcp:[nonsense]:9000",
            "udp:1.2.3.4:5",
        ] {
            assert!(bad.parse::<Address>().is_err(), "{bad} parsed");
        }
    }
}
