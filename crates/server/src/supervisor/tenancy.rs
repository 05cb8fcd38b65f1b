//! Which tenant a peer belongs to, and what that tenant may use, from the
//! server's configuration.
//!
//! Local peers are matched by the uid the kernel reports for them, then by
//! their groups; remote peers by the token they proved. A local peer no
//! tenant lists becomes a tenant of its own, `uid:N`, with the
//! configuration's defaults, or is refused if it has none; a remote peer
//! that proved the server's own token (`--token-file`) is tenant `remote`.

use gpuplex_transport::{Peer, Token};

use crate::config::{Config, ConfigError, TenantSettings};
use crate::sched::{Class, Sharing};

/// The tenant that peers proving the server's own token belong to.
pub const REMOTE: &str = "remote";
/// The key name the server's own token is listed under.
const SERVER_KEY: &str = "";

/// What a tenant may use, as a session of it is opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub tenant: String,
    /// Bytes of device memory for all its sessions together; 0: no limit.
    pub memory_limit: u64,
    pub weight: u32,
    pub class: Class,
    /// The backend's device ordinals it may use, in the order its guests
    /// number them.
    pub devices: Vec<i32>,
    pub sharing: Sharing,
    /// Percent of a GPU's threads a spatial session may occupy.
    pub active_threads: Option<u8>,
}

pub struct Tenancy {
    config: Config,
    devices: usize,
    /// The server's own token, admitting remote peers as [`REMOTE`].
    server_token: Option<Token>,
}

impl Tenancy {
    /// Checks `config` against the machine's `devices` and keeps it.
    pub fn new(config: Config, devices: usize, server_token: Option<Token>) -> Result<Tenancy, ConfigError> {
        config.check_devices(devices)?;
        Ok(Tenancy { config, devices, server_token })
    }

    pub fn server_token(&self) -> Option<Token> {
        self.server_token.clone()
    }

    /// The tenant a peer belongs to, or why it has none. `key` is the name
    /// of the key a remote peer proved.
    pub fn plan_for(&self, peer: &Peer, key: Option<&str>) -> Result<Plan, String> {
        match (peer, key) {
            (Peer::Local { uid, gid, pid }, _) => {
                if let Some(t) = self.config.local_tenant(*uid, &groups(*pid, *gid)) {
                    return Ok(self.plan(&t.name, &t.settings));
                }
                match &self.config.default {
                    Some(settings) => Ok(self.plan(&format!("uid:{uid}"), settings)),
                    None => Err(format!("no tenant of {} lists uid {uid} or its groups", self.config.path.display())),
                }
            }
            (Peer::Remote(_), Some(SERVER_KEY)) => {
                Ok(self.plan_named(REMOTE).expect("tenant remote always has a plan"))
            }
            (Peer::Remote(_), Some(name)) => match self.config.tenants.iter().find(|t| t.name == name) {
                Some(t) => Ok(self.plan(&t.name, &t.settings)),
                None => Err(format!("tenant {name} is no longer configured")),
            },
            (Peer::Remote(addr), None) => Err(format!("{addr} proved no key")),
            // A virtual machine is a tenant, named for its region (`vm:FILE`),
            // with the default settings.
            (Peer::Vm { .. }, Some(name)) => match &self.config.default {
                Some(settings) => Ok(self.plan(name, settings)),
                None => Err(format!("{} has no [default] for VM guests ({name})", self.config.path.display())),
            },
            (Peer::Vm { .. }, None) => Err("a VM guest whose region has no name".into()),
        }
    }

    /// The plan for a tenant by name, as it would be made for a new session.
    pub fn plan_named(&self, name: &str) -> Option<Plan> {
        if let Some(t) = self.config.tenants.iter().find(|t| t.name == name) {
            return Some(self.plan(&t.name, &t.settings));
        }
        let default = self.config.default.as_ref();
        if name == REMOTE {
            return Some(self.plan(name, &default.cloned().unwrap_or_default()));
        }
        name.strip_prefix("uid:").or(name.strip_prefix("vm:")).and(default).map(|d| self.plan(name, d))
    }

    /// The keys TCP peers may prove, each named by its tenant (the
    /// server's own token by the empty name).
    pub fn keys(&self) -> Vec<(String, Token)> {
        let own = self.server_token.iter().map(|t| (SERVER_KEY.to_owned(), t.clone()));
        let tenants = self.config.tenants.iter().filter_map(|t| t.token.clone().map(|token| (t.name.clone(), token)));
        own.chain(tenants).collect()
    }

    fn plan(&self, tenant: &str, settings: &TenantSettings) -> Plan {
        let devices = match &settings.gpus {
            Some(gpus) => gpus.iter().map(|&g| g as i32).collect(),
            None => (0..self.devices as i32).collect(),
        };
        Plan {
            tenant: tenant.to_owned(),
            memory_limit: settings.memory_limit.unwrap_or(0),
            weight: settings.weight,
            class: settings.priority,
            devices,
            sharing: settings.sharing,
            active_threads: settings.active_threads,
        }
    }
}

/// A local peer's groups: its primary group as the kernel reported it at
/// connect, and its supplementary ones as its process shows them now.
fn groups(pid: u32, gid: u32) -> Vec<u32> {
    let mut groups = vec![gid];
    if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
        if let Some(line) = status.lines().find_map(|l| l.strip_prefix("Groups:")) {
            groups.extend(line.split_whitespace().filter_map(|g| g.parse::<u32>().ok()));
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_virtual_machine_is_a_tenant_named_for_its_region() {
        let tenancy = Tenancy::new(Config::none(), 1, None).unwrap();
        let peer = Peer::Vm { region: 7, slot: 3, pid: 1 };
        let plan = tenancy.plan_for(&peer, Some("vm:gpuplex-vm0")).unwrap();
        assert_eq!((plan.tenant.as_str(), plan.memory_limit), ("vm:gpuplex-vm0", 0));
        assert!(tenancy.plan_named("vm:gpuplex-vm0").is_some(), "a reload finds it again");
        assert!(tenancy.plan_for(&peer, None).is_err());
    }
}
