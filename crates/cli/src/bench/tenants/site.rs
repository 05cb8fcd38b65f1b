//! Where a column's tenant processes run: the machine's driver, the same
//! under an MPS daemon of the bench's own, or gpuplex's front-end against a
//! server whose configuration makes each process a tenant of its own.
//!
//! As root the processes run as uids of their own (from 2000) and reach the
//! server on a Unix socket with the shared-memory carrier, as guests on one
//! machine do; otherwise, with one uid for all, each proves a token of its
//! own over loopback TCP. Either way the bench reads the server's status on
//! its Unix socket, as the server's owner, who sees every tenant.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use gpuplex_server::sched::Policy;
use gpuplex_transport::Address;

use super::{tail, Identity, Sharing, Tenant, FIRST_UID};
use crate::bench::carrier::{self, Server};
use crate::Error;

/// Where a column's processes run: a libcuda, and the server behind it.
pub struct Site<'a> {
    /// `system`, or gpuplex's front-end.
    pub library: OsString,
    /// Variables every process of the column gets.
    pub env: Vec<(String, String)>,
    pub server: Option<&'a TenantServer>,
}

/// A token file per tenant in `dir`, readable by this user only, as the
/// server requires; returns `dir`.
pub fn write_tokens(dir: &Path, tenants: &[Tenant]) -> Result<PathBuf, Error> {
    for t in tenants {
        carrier::write_token(&token_path(dir, t))?;
    }
    Ok(dir.to_owned())
}

fn token_path(dir: &Path, t: &Tenant) -> PathBuf {
    dir.join(format!("{}.token", t.name))
}

/// What the server's configuration says of the tenants.
pub struct Config<'a> {
    pub tenants: &'a [Tenant],
    pub identity: Identity,
    /// Where the token files are, with tokens.
    pub tokens: Option<&'a Path>,
    pub sharing: Option<Sharing>,
}

impl Config<'_> {
    fn text(&self) -> String {
        let mut text = String::new();
        for t in self.tenants {
            text.push_str(&format!("[tenants.{}]\n", t.name));
            match (self.identity, self.tokens) {
                (Identity::Tokens, Some(dir)) => {
                    text.push_str(&format!(
                        "token_file = {}\n",
                        toml_string(&token_path(dir, t).display().to_string())
                    ));
                }
                _ => text.push_str(&format!("uids = [{}]\n", FIRST_UID + t.index)),
            }
            let priority = if t.high { "high" } else { "normal" };
            text.push_str(&format!("weight = {}\npriority = \"{priority}\"\n", t.weight));
            if let Some(s) = self.sharing {
                text.push_str(&format!("sharing = \"{}\"\n", s.name()));
            }
            text.push('\n');
        }
        text
    }
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// A `gpuplex serve` of one column's policy, with the tenants configured.
pub struct TenantServer {
    server: Server,
    pub identity: Identity,
    /// The Unix socket: the tenants' with uids, the bench's own for status.
    socket: PathBuf,
    /// The TCP address the tenants use with tokens.
    tcp: Option<String>,
    tokens: Option<PathBuf>,
}

impl TenantServer {
    pub fn start(
        exe: &Path,
        backend: &str,
        policy: Policy,
        slice: Option<Duration>,
        config: &Config<'_>,
        dir: &Path,
        library_path: &OsString,
    ) -> Result<TenantServer, String> {
        let file = dir.join("tenants.toml");
        std::fs::write(&file, config.text()).map_err(|e| format!("cannot write {}: {e}", file.display()))?;
        let socket = dir.join("server.sock");
        let mut args: Vec<OsString> = vec!["serve".into(), "--backend".into(), backend.into(), "--config".into()];
        args.push(file.into_os_string());
        let workers = config.tenants.len().to_string();
        args.extend(["--policy", policy.name(), "--workers", &workers].map(OsString::from));
        if let Some(slice) = slice {
            args.extend(["--slice".into(), format!("{}us", slice.as_micros()).into()]);
        }
        args.push("--listen".into());
        args.push(format!("unix:{}", socket.display()).into());
        let tcp = match config.identity {
            Identity::Tokens => {
                let port = carrier::free_port().map_err(|e| format!("no free loopback port: {e}"))?;
                let address = format!("tcp:127.0.0.1:{port}");
                args.extend(["--listen".into(), address.clone().into()]);
                Some(address)
            }
            Identity::Uids => None,
        };
        let server = Server::serve_on(exe, &args, &socket, dir, library_path)?;
        if config.identity == Identity::Uids {
            // The tenants' uids connect to it; the directory is theirs to pass.
            let open = |p: &Path, mode| std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode));
            open(dir, 0o755)
                .and_then(|()| open(&socket, 0o777))
                .map_err(|e| format!("cannot open the socket to the tenants: {e}"))?;
        }
        let tokens = config.tokens.map(Path::to_owned);
        Ok(TenantServer { server, identity: config.identity, socket, tcp, tokens })
    }

    /// The variables that make a process tenant `t` of this server.
    pub fn client_env(&self, t: &Tenant) -> Vec<(String, String)> {
        match (&self.tcp, &self.tokens) {
            (Some(tcp), Some(dir)) => vec![
                ("GPUPLEX_SERVER".into(), tcp.clone()),
                ("GPUPLEX_TOKEN_FILE".into(), token_path(dir, t).display().to_string()),
            ],
            _ => vec![("GPUPLEX_SERVER".into(), self.server.address.clone()), ("GPUPLEX_CARRIER".into(), "shm".into())],
        }
    }

    /// Each tenant's kernel time so far, on every GPU, in seconds: asked of
    /// the server on its Unix socket, where the bench is its owner and sees
    /// every tenant.
    pub fn gpu_seconds(&self) -> Result<BTreeMap<String, f64>, Error> {
        let status = crate::info::query_status(&Address::Unix(self.socket.clone()), None)
            .map_err(|e| format!("cannot read the server's status: {}", crate::chain(&*e)))?;
        Ok(status
            .tenants
            .0
            .iter()
            .map(|t| (t.name.clone(), t.gpu_time.0.iter().map(|g| g.compute_seconds).sum()))
            .collect())
    }
}

pub fn on_path(program: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|dir| {
        std::fs::metadata(dir.join(program)).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// An MPS control daemon of the bench's own (its pipe and log directories
/// private to it), stopped when dropped.
pub struct Mps {
    /// What its clients and its control need to find it.
    pub env: Vec<(String, String)>,
    pipe: PathBuf,
}

impl Mps {
    pub fn start(dir: &Path) -> Result<Mps, String> {
        let mut env = Vec::new();
        for (var, sub) in [("CUDA_MPS_PIPE_DIRECTORY", "pipe"), ("CUDA_MPS_LOG_DIRECTORY", "log")] {
            let path = dir.join(sub);
            std::fs::create_dir_all(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
            env.push((var.to_owned(), path.display().to_string()));
        }
        let out = Command::new("nvidia-cuda-mps-control")
            .arg("-d")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run nvidia-cuda-mps-control: {e}"))?;
        if !out.status.success() {
            let why = tail(&String::from_utf8_lossy(&out.stderr), 3);
            return Err(format!("nvidia-cuda-mps-control -d failed ({}):\n{why}", out.status));
        }
        Ok(Mps { env, pipe: dir.join("pipe") })
    }
}

impl Drop for Mps {
    fn drop(&mut self) {
        let _ = gpuplex_server::supervisor::mps::quit(&self.pipe);
    }
}

#[cfg(test)]
mod tests {
    use super::super::Kernel;
    use super::*;

    #[test]
    fn the_configuration_lists_every_tenant_with_its_weight_priority_and_identity() {
        let tenants = [
            Tenant { name: "t0".into(), index: 0, weight: 4, kernel: Kernel::Long, high: false },
            Tenant { name: "high".into(), index: 1, weight: 1, kernel: Kernel::Small, high: true },
        ];
        let uids =
            Config { tenants: &tenants, identity: Identity::Uids, tokens: None, sharing: Some(Sharing::Spatial) };
        assert_eq!(
            uids.text(),
            "[tenants.t0]\nuids = [2000]\nweight = 4\npriority = \"normal\"\nsharing = \"spatial\"\n\n\
             [tenants.high]\nuids = [2001]\nweight = 1\npriority = \"high\"\nsharing = \"spatial\"\n\n"
        );
        let dir = Path::new("/tmp/a \"b\"");
        let tokens = Config { tenants: &tenants[..1], identity: Identity::Tokens, tokens: Some(dir), sharing: None };
        assert_eq!(
            tokens.text(),
            "[tenants.t0]\ntoken_file = \"/tmp/a \\\"b\\\"/t0.token\"\nweight = 4\npriority = \"normal\"\n\n"
        );
    }
}
