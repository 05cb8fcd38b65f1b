//! Server addresses as users write them (`unix:PATH`).

use std::fmt;
use std::path::PathBuf;

use crate::TransportError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    Unix(PathBuf),
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

impl std::str::FromStr for Address {
    type Err = TransportError;

    fn from_str(s: &str) -> Result<Address, TransportError> {
        match s.split_once(':') {
            Some(("unix", path)) if !path.is_empty() => Ok(Address::Unix(PathBuf::from(path))),
            _ => Err(TransportError::Address(s.to_owned())),
        }
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Unix(path) => write!(f, "unix:{}", path.display()),
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
        assert!("tcp:1.2.3.4:5".parse::<Address>().is_err());
        assert!("unix:".parse::<Address>().is_err());
        assert!("/run/g.sock".parse::<Address>().is_err());
    }
}
