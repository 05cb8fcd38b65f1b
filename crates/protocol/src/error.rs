//! Errors: CUDA status codes as data, and the protocol's own failures.

use std::fmt;

/// A CUDA driver status other than `CUDA_SUCCESS` (which is `Ok`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CuError(pub u32);

/// Rows `(code, name, description)` exactly as driver 580 reports them,
/// generated from `data/error_strings.tsv`.
pub static CUDA_ERRORS: &[(u32, &str, &str)] = include!(concat!(env!("OUT_DIR"), "/error_strings.rs"));

impl CuError {
    pub const INVALID_VALUE: CuError = CuError(1);
    pub const OUT_OF_MEMORY: CuError = CuError(2);
    pub const NOT_INITIALIZED: CuError = CuError(3);
    pub const DEINITIALIZED: CuError = CuError(4);
    pub const DEVICE_UNAVAILABLE: CuError = CuError(46);
    pub const NO_DEVICE: CuError = CuError(100);
    pub const INVALID_DEVICE: CuError = CuError(101);
    pub const INVALID_IMAGE: CuError = CuError(200);
    pub const INVALID_CONTEXT: CuError = CuError(201);
    pub const NO_BINARY_FOR_GPU: CuError = CuError(209);
    pub const UNSUPPORTED_LIMIT: CuError = CuError(215);
    pub const PEER_ACCESS_UNSUPPORTED: CuError = CuError(217);
    pub const FILE_NOT_FOUND: CuError = CuError(301);
    pub const OPERATING_SYSTEM: CuError = CuError(304);
    pub const INVALID_HANDLE: CuError = CuError(400);
    pub const NOT_FOUND: CuError = CuError(500);
    pub const NOT_READY: CuError = CuError(600);
    pub const ILLEGAL_ADDRESS: CuError = CuError(700);
    pub const ASSERT: CuError = CuError(710);
    pub const LAUNCH_OUT_OF_RESOURCES: CuError = CuError(701);
    pub const LAUNCH_FAILED: CuError = CuError(719);
    pub const STREAM_CAPTURE_UNSUPPORTED: CuError = CuError(900);
    pub const STREAM_CAPTURE_INVALIDATED: CuError = CuError(901);
    pub const ILLEGAL_STATE: CuError = CuError(401);
    pub const PRIMARY_CONTEXT_ACTIVE: CuError = CuError(708);
    pub const CONTEXT_IS_DESTROYED: CuError = CuError(709);
    pub const NOT_PERMITTED: CuError = CuError(800);
    pub const NOT_SUPPORTED: CuError = CuError(801);
    pub const UNKNOWN: CuError = CuError(999);

    /// Maps a raw status to `Ok` for success.
    pub fn check(code: u32) -> Result<(), CuError> {
        if code == 0 {
            Ok(())
        } else {
            Err(CuError(code))
        }
    }

    /// The driver's name for a code (`CUDA_ERROR_INVALID_VALUE`), if it has one.
    pub fn name_of(code: u32) -> Option<&'static str> {
        CUDA_ERRORS.iter().find(|e| e.0 == code).map(|e| e.1)
    }

    /// The driver's description of a code (`invalid argument`), if it has one.
    pub fn description_of(code: u32) -> Option<&'static str> {
        CUDA_ERRORS.iter().find(|e| e.0 == code).map(|e| e.2)
    }
}

impl fmt::Debug for CuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match CuError::name_of(self.0) {
            Some(name) => write!(f, "{name}({})", self.0),
            None => write!(f, "CUresult({})", self.0),
        }
    }
}

impl fmt::Display for CuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match CuError::description_of(self.0) {
            Some(text) => write!(f, "{text} ({:?})", self),
            None => write!(f, "{:?}", self),
        }
    }
}

impl std::error::Error for CuError {}

/// A failed call as it travels back: the CUDA code the caller sees, plus a
/// detail for logs. The detail never changes what the program observes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallError {
    pub code: CuError,
    pub detail: String,
}

/// The longest detail put on the wire; a peer's text must not flood logs.
pub const MAX_DETAIL: usize = 512;

impl CallError {
    pub fn new(code: CuError, detail: impl Into<String>) -> CallError {
        let mut detail = detail.into();
        if detail.len() > MAX_DETAIL {
            let mut cut = MAX_DETAIL;
            while !detail.is_char_boundary(cut) {
                cut -= 1;
            }
            detail.truncate(cut);
        }
        CallError { code, detail }
    }
}

impl From<CuError> for CallError {
    fn from(code: CuError) -> CallError {
        CallError { code, detail: String::new() }
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.detail.is_empty() {
            write!(f, "{}", self.code)
        } else {
            write!(f, "{}: {}", self.code, self.detail)
        }
    }
}

impl std::error::Error for CallError {}

/// A payload that does not decode.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("payload truncated: wanted {wanted} bytes, {left} left")]
    Truncated { wanted: usize, left: usize },
    #[error("{0} unexpected bytes after the payload")]
    Trailing(usize),
    #[error("invalid payload: {0}")]
    Invalid(String),
}

/// A frame header that must not be trusted any further.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HeaderError {
    #[error("bad magic {0:#010x}")]
    BadMagic(u32),
    #[error("unsupported protocol version {0}")]
    Version(u16),
    #[error("payload of {0} bytes exceeds the maximum")]
    TooLong(usize),
    #[error("unknown opcode {0:#06x}")]
    UnknownOpcode(u16),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_the_driver_table() {
        assert_eq!(CuError::name_of(1), Some("CUDA_ERROR_INVALID_VALUE"));
        assert_eq!(CuError::description_of(1), Some("invalid argument"));
        assert_eq!(CuError::name_of(0), Some("CUDA_SUCCESS"));
        assert_eq!(CuError::name_of(12345), None);
        assert_eq!(format!("{:?}", CuError::NOT_SUPPORTED), "CUDA_ERROR_NOT_SUPPORTED(801)");
    }

    #[test]
    fn detail_is_bounded() {
        let e = CallError::new(CuError::UNKNOWN, "é".repeat(1000));
        assert!(e.detail.len() <= MAX_DETAIL);
    }
}
