//! The shared secret that admits a TCP peer.
//!
//! A Unix socket has the kernel vouch for its peer (`SO_PEERCRED`) and
//! filesystem permissions to keep strangers out; a TCP port has neither, so
//! the server and its remote guests share a token, proven on each
//! connection without sending it ([`crate::tcp`]). The token is read from a
//! file that only its owner may read, as ssh treats private keys: a token
//! the whole machine can read admits the whole machine.

use std::fmt;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, PoisonError, RwLock};

use crate::TransportError;

/// Where the front-end and the CLI look for the token file when none is
/// given on the command line.
pub const TOKEN_FILE_ENV: &str = "GPUPLEX_TOKEN_FILE";

/// Shorter secrets are refused: the challenge-response exposes a MAC an
/// eavesdropper can test guesses against offline.
pub const MIN_TOKEN_LEN: usize = 16;
/// A token file is a secret, not a document; a longer one is a mistake.
const MAX_TOKEN_LEN: usize = 4096;

/// A shared secret. Cheap to clone; never printed.
#[derive(Clone)]
pub struct Token(Arc<[u8]>);

impl Token {
    /// A token from its bytes, refused if shorter than [`MIN_TOKEN_LEN`].
    pub fn new(bytes: &[u8]) -> Result<Token, TransportError> {
        if bytes.len() < MIN_TOKEN_LEN {
            return Err(TransportError::Token(format!(
                "the token has {} bytes; at least {MIN_TOKEN_LEN} are needed (e.g. head -c 32 /dev/urandom | base64)",
                bytes.len()
            )));
        }
        Ok(Token(bytes.into()))
    }

    /// Reads a token file: its contents without surrounding whitespace (so
    /// that `base64 > file`'s newline is not part of the secret). Refused if
    /// group or others may read or write it, or if too short.
    pub fn from_file(path: &Path) -> Result<Token, TransportError> {
        let bad = |why: String| TransportError::Token(format!("token file {}: {why}", path.display()));
        let file = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
        let mode = file.metadata().map_err(|e| bad(e.to_string()))?.mode();
        if mode & 0o077 != 0 {
            return Err(bad(format!("group or others may access it (mode {:o}); chmod 600 it", mode & 0o777)));
        }
        let mut bytes = Vec::new();
        file.take(MAX_TOKEN_LEN as u64 + 1).read_to_end(&mut bytes).map_err(|e| bad(e.to_string()))?;
        if bytes.len() > MAX_TOKEN_LEN {
            return Err(bad(format!("longer than {MAX_TOKEN_LEN} bytes; is this the right file?")));
        }
        Token::new(bytes.trim_ascii()).map_err(|e| bad(e.to_string()))
    }

    /// The token named by `GPUPLEX_TOKEN_FILE`, if that is set.
    pub fn from_env() -> Result<Option<Token>, TransportError> {
        match std::env::var_os(TOKEN_FILE_ENV).filter(|p| !p.is_empty()) {
            Some(path) => Token::from_file(Path::new(&path)).map(Some),
            None => Ok(None),
        }
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Every byte is compared whatever the first difference, so that the time
/// taken never shows how much of a secret matched.
impl PartialEq for Token {
    fn eq(&self, other: &Token) -> bool {
        let (a, b) = (self.bytes(), other.bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

impl Eq for Token {}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(..)")
    }
}

/// The keys a TCP listener admits peers by, each named by whom it admits.
/// Replaced as a whole when the server's configuration is reloaded.
#[derive(Default)]
pub struct Keyring(RwLock<Vec<(String, Token)>>);

impl Keyring {
    pub fn replace(&self, keys: Vec<(String, Token)>) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = keys;
    }

    pub fn keys(&self) -> Vec<(String, Token)> {
        self.0.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    pub fn is_empty(&self) -> bool {
        self.0.read().unwrap_or_else(PoisonError::into_inner).is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A token file, removed when dropped.
    struct TempFile(std::path::PathBuf);

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn write(name: &str, contents: &[u8], mode: u32) -> TempFile {
        let path = std::env::temp_dir().join(format!("gpuplex-token-test-{}-{name}", std::process::id()));
        std::fs::write(&path, contents).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        TempFile(path)
    }

    #[test]
    fn reads_a_private_file_without_its_newline() {
        let path = write("good", b"  0123456789abcdefXYZ\n", 0o600);
        assert_eq!(Token::from_file(&path.0).unwrap().bytes(), b"0123456789abcdefXYZ");
        assert_eq!(format!("{:?}", Token::from_file(&path.0).unwrap()), "Token(..)");
    }

    #[test]
    fn refuses_short_open_missing_and_huge_files() {
        let short = write("short", b"0123456789abcde\n", 0o600);
        assert!(Token::from_file(&short.0).unwrap_err().to_string().contains("at least 16"));
        let open = write("open", b"0123456789abcdef", 0o644);
        assert!(Token::from_file(&open.0).unwrap_err().to_string().contains("chmod 600"));
        let group = write("group", b"0123456789abcdef", 0o620);
        assert!(Token::from_file(&group.0).is_err());
        let huge = write("huge", &[b'x'; MAX_TOKEN_LEN + 1], 0o400);
        assert!(Token::from_file(&huge.0).is_err());
        assert!(Token::from_file(Path::new("/nonexistent/gpuplex-token")).is_err());
        assert!(Token::new(b"").is_err());
    }

    #[test]
    fn equal_when_the_secrets_are() {
        let a = Token::new(b"0123456789abcdef").unwrap();
        assert_eq!(a, Token::new(b"0123456789abcdef").unwrap());
        assert_ne!(a, Token::new(b"0123456789abcdeF").unwrap());
        assert_ne!(a, Token::new(b"0123456789abcdef0").unwrap());
    }
}
