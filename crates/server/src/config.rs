//! The server's configuration file: who the tenants are and what each may
//! use (`docs/configuration.md` is the user's guide to it).
//!
//! A tenant is the unit that limits and GPU-time shares apply to: every
//! guest a peer opens is charged to the peer's tenant. The file is read
//! whole and checked whole before the server uses any of it, so that a
//! reload with a mistake keeps the old configuration instead of half of a
//! new one; every error names the file and line, since the operator fixing
//! it has the file open, not the server's internals. Unknown keys are
//! errors: a misspelt limit silently ignored is a limit not enforced.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gpuplex_transport::{Address, Token};

use crate::sched::{Class, Policy, Sharing};
use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use toml::Spanned;

/// The most prestarted workers `[server] workers` may ask for.
pub const MAX_WORKERS: usize = 64;
/// The largest GPU-time share; weights are relative, so this is range
/// enough and keeps their sums far from overflow.
pub const MAX_WEIGHT: u32 = 1000;
/// Tenant names appear in logs and Prometheus labels, so they are short
/// and need no quoting.
pub const MAX_NAME_LEN: usize = 64;
/// Names of this form belong to the tenants `[default]` makes of local
/// users no tenant lists.
pub const RESERVED_PREFIX: &str = "uid:";

/// A configuration file that cannot be used, and where the trouble is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {reason}", Location(.path, *.line))]
pub struct ConfigError {
    pub path: PathBuf,
    /// 1-based; `None` when the trouble is not on a line (an unreadable file).
    pub line: Option<usize>,
    pub reason: String,
}

/// `PATH:LINE`, or `PATH` alone.
struct Location<'a>(&'a Path, Option<usize>);

impl fmt::Display for Location<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.1 {
            Some(line) => write!(f, "{}:{line}", self.0.display()),
            None => write!(f, "{}", self.0.display()),
        }
    }
}

/// The whole configuration, checked.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from (empty for [`Config::none`]).
    pub path: PathBuf,
    pub server: ServerSettings,
    /// The settings of the tenant each unlisted local user becomes; `None`
    /// refuses such users.
    pub default: Option<TenantSettings>,
    /// In the order the file lists them.
    pub tenants: Vec<Tenant>,
    /// The line of `[default]`, for errors found once the devices are known.
    default_line: Option<usize>,
}

/// `[server]`: settings the command line may override.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerSettings {
    pub listen: Option<Address>,
    /// `HOST:PORT` of the Prometheus endpoint.
    pub metrics: Option<String>,
    /// Worker processes kept started and ready.
    pub workers: Option<usize>,
    /// How GPU time is divided among tenants.
    pub policy: Option<Policy>,
    /// How long a tenant keeps a GPU that others wait for.
    pub slice: Option<Duration>,
}

/// What a tenant may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantSettings {
    /// Device memory in bytes for all the tenant's guests together; `None`
    /// for no limit.
    pub memory_limit: Option<u64>,
    /// Device ordinals it may use; `None` for all of them.
    pub gpus: Option<Vec<u32>>,
    /// Its share of GPU time, relative to other tenants' (1..=[`MAX_WEIGHT`]).
    pub weight: u32,
    /// Its priority class: who gets a GPU first when several wait.
    pub priority: Class,
    /// Whether its sessions run alone or beside other spatial sessions.
    pub sharing: Sharing,
    /// For a spatial tenant, the percentage of a GPU's threads each of its
    /// sessions may occupy (1..=100); `None` for all of them.
    pub active_threads: Option<u8>,
}

impl Default for TenantSettings {
    fn default() -> TenantSettings {
        TenantSettings {
            memory_limit: None,
            gpus: None,
            weight: 1,
            priority: Class::Normal,
            sharing: Sharing::Isolated,
            active_threads: None,
        }
    }
}

/// A `[tenants.NAME]` table.
#[derive(Debug, Clone)]
pub struct Tenant {
    pub name: String,
    /// Unix peers with these uids belong to it.
    pub uids: Vec<u32>,
    /// Unix peers in these groups belong to it (when their uid is listed nowhere).
    pub gids: Vec<u32>,
    /// TCP peers that prove this token belong to it.
    pub token: Option<Token>,
    pub settings: TenantSettings,
    /// The line of its table header, for errors found later.
    pub line: usize,
}

/// The name of the tenant `[default]` makes of an unlisted local user.
pub fn default_tenant_name(uid: u32) -> String {
    format!("{RESERVED_PREFIX}{uid}")
}

impl Config {
    /// The configuration without a file: every local user is a tenant of
    /// their own, with no limit.
    pub fn none() -> Config {
        Config {
            path: PathBuf::new(),
            server: ServerSettings::default(),
            default: Some(TenantSettings::default()),
            tenants: Vec::new(),
            default_line: None,
        }
    }

    /// Reads, parses and checks a configuration file, and reads its tenants' tokens.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            path: path.to_owned(),
            line: None,
            reason: format!("cannot read the file: {e}"),
        })?;
        Config::parse(&text, path)
    }

    /// Parses and checks a configuration read from `path`; token files are
    /// read, relative ones from `path`'s directory.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let src = Source { text, path };
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            // toml's messages may run over several lines; ours are one.
            let reason = e.message().trim().lines().map(str::trim).collect::<Vec<_>>().join("; ");
            ConfigError { path: path.to_owned(), line: e.span().map(|s| src.line(s.start)), reason }
        })?;
        let server = raw.server.check(&src)?;
        let default_line = raw.default.as_ref().map(|d| src.line(d.span().start));
        let default = raw.default.map(|d| d.into_inner().check(&src)).transpose()?;

        let mut raw_tenants: Vec<_> = raw.tenants.into_iter().collect();
        raw_tenants.sort_by_key(|(name, _)| name.span().start);
        let mut tenants = Vec::with_capacity(raw_tenants.len());
        let mut claims = Claims::default();
        for (name, raw) in raw_tenants {
            tenants.push(raw.check(name, &mut claims, &src)?);
        }

        if tenants.is_empty() && default.is_none() {
            return Err(src.error(
                None,
                "no tenants and no [default]: every peer would be refused; add [default] for each user to be a tenant",
            ));
        }
        Ok(Config { path: path.to_owned(), server, default, tenants, default_line })
    }

    /// The tenant a local peer belongs to: the one listing its uid, else
    /// the one listing the first of `gids` that any lists (callers pass the
    /// primary group first). `None` leaves it to `[default]`.
    pub fn local_tenant(&self, uid: u32, gids: &[u32]) -> Option<&Tenant> {
        self.tenants
            .iter()
            .find(|t| t.uids.contains(&uid))
            .or_else(|| gids.iter().find_map(|gid| self.tenants.iter().find(|t| t.gids.contains(gid))))
    }

    /// The tenant of that name, if the file lists it.
    pub fn tenant(&self, name: &str) -> Option<&Tenant> {
        self.tenants.iter().find(|t| t.name == name)
    }

    /// Checks every `gpus` list against the devices the server found, which
    /// the file cannot know in advance.
    pub fn check_devices(&self, count: usize) -> Result<(), ConfigError> {
        let have = match count {
            0 => "none".to_owned(),
            1 => "1 (GPU 0)".to_owned(),
            n => format!("{n} (GPUs 0-{})", n - 1),
        };
        let named = self.default.iter().map(|d| ("[default]".to_owned(), d, self.default_line));
        let tenants = self.tenants.iter().map(|t| (format!("tenant {:?}", t.name), &t.settings, Some(t.line)));
        for (who, settings, line) in named.chain(tenants) {
            if let Some(gpu) = settings.gpus.iter().flatten().find(|&&g| g as usize >= count) {
                return Err(ConfigError {
                    path: self.path.clone(),
                    line,
                    reason: format!("{who} lists GPU {gpu}, but this machine has {have}"),
                });
            }
        }
        Ok(())
    }
}

/// The text being parsed, to turn byte offsets into lines.
struct Source<'a> {
    text: &'a str,
    path: &'a Path,
}

impl Source<'_> {
    fn line(&self, offset: usize) -> usize {
        let end = offset.min(self.text.len());
        self.text.as_bytes()[..end].iter().filter(|&&b| b == b'\n').count() + 1
    }

    fn error(&self, line: Option<usize>, reason: impl Into<String>) -> ConfigError {
        ConfigError { path: self.path.to_owned(), line, reason: reason.into() }
    }

    fn at<T>(&self, value: &Spanned<T>, reason: impl Into<String>) -> ConfigError {
        self.error(Some(self.line(value.span().start)), reason)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    server: RawServer,
    default: Option<Spanned<RawSettings>>,
    #[serde(default)]
    tenants: BTreeMap<Spanned<String>, RawTenant>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    listen: Option<Spanned<String>>,
    metrics: Option<Spanned<String>>,
    workers: Option<Spanned<i64>>,
    policy: Option<Spanned<String>>,
    slice: Option<Spanned<String>>,
}

impl RawServer {
    fn check(self, src: &Source) -> Result<ServerSettings, ConfigError> {
        let listen =
            self.listen.map(|s| s.get_ref().parse::<Address>().map_err(|e| src.at(&s, e.to_string()))).transpose()?;
        // HOST:PORT as a TCP address would have it, checked the same way.
        if let Some(m) = &self.metrics {
            if format!("tcp:{}", m.get_ref()).parse::<Address>().is_err() {
                return Err(
                    src.at(m, format!("metrics must be HOST:PORT, such as 127.0.0.1:9400, not {:?}", m.get_ref()))
                );
            }
        }
        let workers = self.workers.map(|w| {
            let n = *w.get_ref();
            let fits = usize::try_from(n).ok().filter(|&n| n <= MAX_WORKERS);
            fits.ok_or_else(|| src.at(&w, format!("workers must be from 0 to {MAX_WORKERS}, not {n}")))
        });
        let policy = self.policy.map(|p| p.get_ref().parse::<Policy>().map_err(|e| src.at(&p, e))).transpose()?;
        let slice = self.slice.map(|s| parse_slice(s.get_ref()).map_err(|e| src.at(&s, e))).transpose()?;
        Ok(ServerSettings {
            listen,
            metrics: self.metrics.map(Spanned::into_inner),
            workers: workers.transpose()?,
            policy,
            slice,
        })
    }
}

/// `[default]`: a tenant's settings without the keys that match peers.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSettings {
    memory_limit: Option<MemoryLimit>,
    gpus: Option<Spanned<Vec<Spanned<u32>>>>,
    weight: Option<Spanned<i64>>,
    priority: Option<Spanned<String>>,
    sharing: Option<Spanned<String>>,
    active_threads: Option<Spanned<i64>>,
}

impl RawSettings {
    fn check(self, src: &Source) -> Result<TenantSettings, ConfigError> {
        let gpus = match self.gpus {
            Some(list) if list.get_ref().is_empty() => {
                return Err(src.at(&list, "gpus is empty: a tenant without GPUs can do nothing; leave gpus out for all"))
            }
            Some(list) => Some(distinct(list.get_ref(), "GPU", src)?),
            None => None,
        };
        let weight = match self.weight {
            Some(w) => u32::try_from(*w.get_ref())
                .ok()
                .filter(|n| (1..=MAX_WEIGHT).contains(n))
                .ok_or_else(|| src.at(&w, format!("weight must be from 1 to {MAX_WEIGHT}, not {}", w.get_ref())))?,
            None => 1,
        };
        let priority = match self.priority {
            Some(p) => p.get_ref().parse::<Class>().map_err(|e| src.at(&p, e))?,
            None => Class::Normal,
        };
        let sharing = match self.sharing {
            Some(s) => s.get_ref().parse::<Sharing>().map_err(|e| src.at(&s, e))?,
            None => Sharing::Isolated,
        };
        let active_threads = match self.active_threads {
            Some(a) if sharing != Sharing::Spatial => {
                return Err(src.at(&a, "active_threads applies to spatial tenants only (sharing = \"spatial\")"))
            }
            Some(a) => Some(
                u8::try_from(*a.get_ref())
                    .ok()
                    .filter(|n| (1..=100).contains(n))
                    .ok_or_else(|| src.at(&a, format!("active_threads must be from 1 to 100, not {}", a.get_ref())))?,
            ),
            None => None,
        };
        Ok(TenantSettings {
            memory_limit: self.memory_limit.map(|m| m.0),
            gpus,
            weight,
            priority,
            sharing,
            active_threads,
        })
    }
}

/// `[tenants.NAME]`: the settings and who belongs to the tenant. (The
/// settings are repeated rather than flattened: serde cannot refuse unknown
/// keys in a flattened struct.)
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenant {
    uids: Option<Vec<Spanned<u32>>>,
    gids: Option<Vec<Spanned<u32>>>,
    token_file: Option<Spanned<PathBuf>>,
    memory_limit: Option<MemoryLimit>,
    gpus: Option<Spanned<Vec<Spanned<u32>>>>,
    weight: Option<Spanned<i64>>,
    priority: Option<Spanned<String>>,
    sharing: Option<Spanned<String>>,
    active_threads: Option<Spanned<i64>>,
}

impl RawTenant {
    fn check(self, name: Spanned<String>, claims: &mut Claims, src: &Source) -> Result<Tenant, ConfigError> {
        check_name(&name, src)?;
        let line = src.line(name.span().start);
        let name = name.into_inner();
        let settings = RawSettings {
            memory_limit: self.memory_limit,
            gpus: self.gpus,
            weight: self.weight,
            priority: self.priority,
            sharing: self.sharing,
            active_threads: self.active_threads,
        }
        .check(src)?;
        let uids = claims.claim(&self.uids.unwrap_or_default(), "uid", &name, src)?;
        let gids = claims.claim(&self.gids.unwrap_or_default(), "gid", &name, src)?;
        let token = match &self.token_file {
            Some(file) => {
                let dir = src.path.parent().unwrap_or(Path::new(""));
                let token = Token::from_file(&dir.join(file.get_ref())).map_err(|e| src.at(file, e.to_string()))?;
                if let Some((_, first)) = claims.tokens.iter().find(|(other, _)| *other == token) {
                    return Err(src.at(file, Claims::clash("the same token", first, &name)));
                }
                claims.tokens.push((token.clone(), name.clone()));
                Some(token)
            }
            None => None,
        };
        if uids.is_empty() && gids.is_empty() && token.is_none() {
            return Err(src.error(
                Some(line),
                format!("tenant {name:?} has no uids, gids or token_file, so no peer could ever belong to it"),
            ));
        }
        Ok(Tenant { name, uids, gids, token, settings, line })
    }
}

/// The uids, gids and tokens the tenants read so far claim: a peer must
/// belong to exactly one tenant, so a second claim is an error, reported
/// where it is made.
#[derive(Default)]
struct Claims {
    /// By ("uid" or "gid", the id): the tenant that claimed it.
    ids: HashMap<(&'static str, u32), String>,
    tokens: Vec<(Token, String)>,
}

impl Claims {
    /// Claims a tenant's uids or gids (`what` says which) and returns them.
    fn claim(
        &mut self,
        list: &[Spanned<u32>],
        what: &'static str,
        name: &str,
        src: &Source,
    ) -> Result<Vec<u32>, ConfigError> {
        let ids = distinct(list, what, src)?;
        for item in list {
            let id = *item.get_ref();
            if let Some(first) = self.ids.insert((what, id), name.to_owned()) {
                return Err(src.at(item, Claims::clash(&format!("{what} {id}"), &first, name)));
            }
        }
        Ok(ids)
    }

    fn clash(what: &str, first: &str, second: &str) -> String {
        format!("{what} is claimed by tenants {first:?} and {second:?}; a peer must belong to one tenant")
    }
}

fn check_name(name: &Spanned<String>, src: &Source) -> Result<(), ConfigError> {
    let s = name.get_ref();
    if s.starts_with(RESERVED_PREFIX) {
        return Err(
            src.at(name, format!("tenant name {s:?} is reserved: {RESERVED_PREFIX:?} names the tenants of [default]"))
        );
    }
    let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    if s.is_empty() || s.len() > MAX_NAME_LEN || !s.chars().all(valid) {
        return Err(src.at(
            name,
            format!("tenant name {s:?} must be 1 to {MAX_NAME_LEN} letters, digits, '_', '.' or '-' (it labels logs and metrics)"),
        ));
    }
    Ok(())
}

/// The values of a list, refusing one listed twice.
fn distinct(list: &[Spanned<u32>], what: &str, src: &Source) -> Result<Vec<u32>, ConfigError> {
    let mut values = Vec::with_capacity(list.len());
    for item in list {
        if values.contains(item.get_ref()) {
            return Err(src.at(item, format!("{what} {} is listed twice", item.get_ref())));
        }
        values.push(*item.get_ref());
    }
    Ok(values)
}

/// `memory_limit`: a size with a unit, or a number of bytes; never 0.
struct MemoryLimit(u64);

impl<'de> Deserialize<'de> for MemoryLimit {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<MemoryLimit, D::Error> {
        deserializer.deserialize_any(MemoryLimitVisitor)
    }
}

struct MemoryLimitVisitor;

impl MemoryLimitVisitor {
    fn nonzero<E: de::Error>(bytes: u64) -> Result<MemoryLimit, E> {
        match bytes {
            0 => Err(E::custom("a tenant with no memory can do nothing; leave memory_limit out for no limit")),
            n => Ok(MemoryLimit(n)),
        }
    }
}

impl Visitor<'_> for MemoryLimitVisitor {
    type Value = MemoryLimit;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a size such as \"16GiB\", or a number of bytes")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<MemoryLimit, E> {
        let bytes = u64::try_from(v).map_err(|_| E::custom(format!("memory_limit must not be negative, not {v}")))?;
        Self::nonzero(bytes)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<MemoryLimit, E> {
        Self::nonzero(v)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<MemoryLimit, E> {
        Self::nonzero(parse_size(v).map_err(E::custom)?)
    }
}

/// Reads a size: a number with an optional unit (B, KiB, MiB, GiB, TiB, or
/// decimal KB, MB, GB, TB, in any case, a space before it allowed). The
/// number may have a fraction ("1.5GiB"), rounded down to whole bytes; no
/// unit means bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let text = s.trim();
    let split = text.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(text.len());
    let (number, unit) = (&text[..split], text[split..].trim_start());
    let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ if number.is_empty() => {
            return Err(format!(
                "{s:?} is not a size: expected a number of bytes, or a number and a unit such as \"16GiB\""
            ))
        }
        _ => {
            return Err(format!("{s:?} has an unknown unit {unit:?}: expected B, KiB, MiB, GiB, TiB, KB, MB, GB or TB"))
        }
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || (number.contains('.') && !digits(fraction)) {
        return Err(format!("{s:?} is not a size: expected a number such as 16 or 1.5 before the unit"));
    }
    // A byte is about 1e-12 TiB; more places than that say nothing.
    if fraction.len() > 18 {
        return Err(format!("{s:?} has more decimal places than a byte needs"));
    }
    let too_large = || format!("{s:?} is too large: at most {} bytes", u64::MAX);
    let whole: u128 = whole.parse().map_err(|_| too_large())?;
    let fraction_bytes = match fraction {
        "" => 0,
        f => f.parse::<u128>().unwrap_or(0) * u128::from(multiplier) / 10u128.pow(f.len() as u32),
    };
    let bytes = whole.checked_mul(u128::from(multiplier)).and_then(|b| b.checked_add(fraction_bytes));
    bytes.and_then(|b| u64::try_from(b).ok()).ok_or_else(too_large)
}

/// The shortest and longest slice: below the first, hand-overs would take
/// much of the GPU's time; above the second, a waiter would wait seconds.
pub const SLICES: std::ops::RangeInclusive<Duration> = Duration::from_millis(1)..=Duration::from_secs(1);

/// Reads a slice: a number and a unit, `us`, `ms` or `s` ("10ms",
/// "2.5 ms"), within [`SLICES`].
pub fn parse_slice(s: &str) -> Result<Duration, String> {
    let text = s.trim();
    let split = text.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(text.len());
    let (number, unit) = (&text[..split], text[split..].trim_start());
    let scale = match unit {
        "us" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => return Err(format!("{s:?} is not a slice: expected a number and us, ms or s, such as \"10ms\"")),
    };
    let seconds =
        number.parse::<f64>().map_err(|_| format!("{s:?} is not a slice: expected a number before {unit}"))?;
    let slice = Duration::try_from_secs_f64(seconds * scale).map_err(|_| format!("{s:?} is not a slice"))?;
    if !SLICES.contains(&slice) {
        return Err(format!("slice must be from 1ms to 1s, not {s:?}"));
    }
    Ok(slice)
}

/// A size in binary units for people: "16 GiB", "1.5 GiB", "123 B" (two
/// decimal places at most, rounded down).
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let exp = UNITS.iter().enumerate().skip(1).take_while(|&(i, _)| bytes >> (10 * i) != 0).count();
    if exp == 0 {
        return format!("{bytes} B");
    }
    let hundredths = (u128::from(bytes) * 100) >> (10 * exp);
    let (whole, fraction) = (hundredths / 100, hundredths % 100);
    match fraction {
        0 => format!("{whole} {}", UNITS[exp]),
        f if f % 10 == 0 => format!("{whole}.{} {}", f / 10, UNITS[exp]),
        f => format!("{whole}.{f:02} {}", UNITS[exp]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A directory of its own for one test, removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> TempDir {
            let dir = std::env::temp_dir().join(format!("gpuplex-config-test-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }

        fn write(&self, name: &str, contents: &str, mode: u32) -> PathBuf {
            let path = self.0.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, contents).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            path
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const PATH: &str = "/etc/gpuplex/gpuplex.toml";

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new(PATH))
    }

    /// The error a text gets, checked to be on `line` and to say `says`.
    fn refused(text: &str, line: usize, says: &str) -> ConfigError {
        let e = parse(text).expect_err(text);
        assert_eq!(e.line, Some(line), "{e}");
        assert!(e.reason.contains(says), "{e:?} does not say {says:?}");
        assert!(e.to_string().starts_with(&format!("{PATH}:{line}: ")), "{e}");
        e
    }

    #[test]
    fn parses_a_complete_file() {
        let dir = TempDir::new("complete");
        dir.write("carol.token", "carol's secret, 32 bytes or so\n", 0o600);
        let text = r#"
# A comment.
[server]
listen = "tcp:0.0.0.0:7070"
metrics = "127.0.0.1:9400"
workers = 2

[default]
memory_limit = "8GiB"
gpus = [0]

[tenants.bob]
gids = [100, 200]
weight = 1000

[tenants.alice]
uids = [1000, 1001]
memory_limit = 17179869184
gpus = [1, 0]
weight = 2

[tenants."carol.remote-1"]
token_file = "carol.token"
"#;
        let config = Config::parse(text, &dir.0.join("gpuplex.toml")).unwrap();
        assert_eq!(config.path, dir.0.join("gpuplex.toml"));
        assert_eq!(
            config.server,
            ServerSettings {
                listen: Some(Address::Tcp("0.0.0.0:7070".into())),
                metrics: Some("127.0.0.1:9400".into()),
                workers: Some(2),
                policy: None,
                slice: None,
            }
        );
        assert_eq!(
            config.default,
            Some(TenantSettings {
                memory_limit: Some(8 << 30),
                gpus: Some(vec![0]),
                weight: 1,
                ..TenantSettings::default()
            })
        );
        let names: Vec<_> = config.tenants.iter().map(|t| (t.name.as_str(), t.line)).collect();
        assert_eq!(names, [("bob", 12), ("alice", 16), ("carol.remote-1", 22)], "in the file's order");
        let bob = config.tenant("bob").unwrap();
        assert_eq!((bob.uids.as_slice(), bob.gids.as_slice()), (&[][..], &[100, 200][..]));
        assert_eq!(bob.settings, TenantSettings { weight: 1000, ..TenantSettings::default() });
        assert!(bob.token.is_none());
        let alice = config.tenant("alice").unwrap();
        assert_eq!(alice.uids, [1000, 1001]);
        assert_eq!(
            alice.settings,
            TenantSettings {
                memory_limit: Some(16 << 30),
                gpus: Some(vec![1, 0]),
                weight: 2,
                ..TenantSettings::default()
            }
        );
        let carol = config.tenant("carol.remote-1").unwrap();
        assert_eq!(carol.token, Some(Token::new(b"carol's secret, 32 bytes or so").unwrap()));
        assert_eq!(carol.settings, TenantSettings::default());
        assert!(config.tenant("dave").is_none());
    }

    #[test]
    fn the_documented_example_parses() {
        let doc = include_str!("../../../docs/configuration.md");
        let start = doc.find("```toml\n").expect("docs/configuration.md has a ```toml example") + "```toml\n".len();
        let example = &doc[start..][..doc[start..].find("```").unwrap()];

        // Its tokens live in /etc/gpuplex; here they live in a directory of the test's.
        let dir = TempDir::new("example");
        dir.write("inference.token", "inference token, not a real one\n", 0o600);
        dir.write("tokens/notebooks.token", "notebooks token, not a real one\n", 0o600);
        let text = example.replace("/etc/gpuplex/", &format!("{}/", dir.0.display()));
        let path = dir.write("gpuplex.toml", &text, 0o644);
        let config = Config::load(&path).unwrap();

        assert_eq!(config.server.listen, Some(Address::Unix("/run/gpuplex/gpuplex.sock".into())));
        let names: Vec<_> = config.tenants.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["training", "inference", "notebooks"]);
        assert!(config.tenants.iter().filter(|t| t.name != "training").all(|t| t.token.is_some()));
        assert_eq!(config.tenant("inference").unwrap().settings.memory_limit, Some(40 << 30));
        config.check_devices(2).unwrap();
    }

    #[test]
    fn no_file_makes_every_user_a_tenant_without_limits() {
        let config = Config::none();
        assert!(config.tenants.is_empty());
        assert_eq!(config.default, Some(TenantSettings::default()));
        assert!(config.local_tenant(1000, &[100]).is_none());
        assert_eq!(default_tenant_name(1000), "uid:1000");
        config.check_devices(0).unwrap();
        assert_eq!(config.server, ServerSettings::default());
    }

    #[test]
    fn sizes_parse() {
        for (text, bytes) in [
            ("0", 0),
            ("123", 123),
            ("123B", 123),
            ("123 b", 123),
            ("1KiB", 1024),
            ("16GiB", 16 << 30),
            ("16 GiB", 16 << 30),
            (" 16gib ", 16 << 30),
            ("512 MiB", 512 << 20),
            ("2TiB", 2 << 40),
            ("1.5GiB", 3 << 29),
            ("0.5 KiB", 512),
            ("1.0009765625KiB", 1025),
            ("1.00097KiB", 1024),
            ("1.9", 1),
            ("1KB", 1000),
            ("1.5 MB", 1_500_000),
            ("16GB", 16_000_000_000),
            ("3TB", 3_000_000_000_000),
            ("007MiB", 7 << 20),
            ("18446744073709551615", u64::MAX),
            ("16777215.999999999999TiB", u64::MAX - 1),
        ] {
            assert_eq!(parse_size(text), Ok(bytes), "{text:?}");
        }
    }

    #[test]
    fn sizes_refused() {
        for (text, says) in [
            ("", "not a size"),
            ("GiB", "not a size"),
            ("-1", "not a size"),
            ("-1GiB", "not a size"),
            ("+1GiB", "not a size"),
            ("1.GiB", "not a size"),
            (".5GiB", "not a size"),
            ("1.2.3GiB", "not a size"),
            ("1,5GiB", "unknown unit \",5GiB\""),
            ("16 G", "unknown unit \"G\""),
            ("16 GiB of it", "unknown unit"),
            ("16 Gb", "1 << 30"),
            ("1e9", "unknown unit \"e9\""),
            ("16TiB!", "unknown unit"),
            ("18446744073709551616", "too large"),
            ("16777216TiB", "too large"),
            ("99999999999999999999999999999999999999999", "too large"),
            ("1.0000000000000000001GiB", "decimal places"),
        ] {
            match parse_size(text) {
                // "Gb" is a decimal unit in any case: not an error.
                Ok(n) if says == "1 << 30" => assert_eq!(n, 16_000_000_000),
                Ok(n) => panic!("{text:?} parsed as {n}"),
                Err(e) => assert!(e.contains(says), "{text:?}: {e}"),
            }
        }
    }

    #[test]
    fn sizes_print_in_binary_units() {
        for (bytes, text) in [
            (0, "0 B"),
            (123, "123 B"),
            (1023, "1023 B"),
            (1024, "1 KiB"),
            (1536, "1.5 KiB"),
            (512 << 20, "512 MiB"),
            (16 << 30, "16 GiB"),
            (3 << 29, "1.5 GiB"),
            ((5 << 30) / 4, "1.25 GiB"),
            ((1 << 30) - 1, "1023.99 MiB"),
            (16_000_000_000, "14.9 GiB"),
            (3 << 40, "3 TiB"),
            (u64::MAX, "15.99 EiB"),
        ] {
            assert_eq!(format_size(bytes), text, "{bytes}");
        }
        for bytes in [1, 1024, 1536, 512 << 20, 3 << 29, 16 << 30, (5 << 30) / 4, 7 << 40] {
            assert_eq!(parse_size(&format_size(bytes)), Ok(bytes), "{}", format_size(bytes));
        }
    }

    #[test]
    fn memory_limits_are_sizes_and_never_zero() {
        let limit = |value: &str| {
            let config = parse(&format!("[tenants.a]\nuids = [1]\nmemory_limit = {value}\n"));
            config.map(|c| c.tenants[0].settings.memory_limit.unwrap())
        };
        assert_eq!(limit("\"1.5GiB\""), Ok(3 << 29));
        assert_eq!(limit("4096"), Ok(4096));
        assert_eq!(limit("\"4096\""), Ok(4096));
        for (value, says) in [
            ("0", "no memory can do nothing"),
            ("\"0 GiB\"", "no memory can do nothing"),
            ("\"0.1B\"", "no memory can do nothing"),
            ("-5", "must not be negative"),
            ("1.5", "expected a size such as \"16GiB\""),
            ("\"16 G\"", "unknown unit"),
            ("[1]", "expected a size"),
        ] {
            refused(&format!("[tenants.a]\nuids = [1]\nmemory_limit = {value}\n"), 3, says);
            refused(&format!("[default]\n\nmemory_limit = {value}\n"), 3, says);
        }
    }

    #[test]
    fn syntax_errors_and_unknown_keys_name_their_line() {
        refused("[server]\nworkers = 2\n\n[tenants.alice\nuids = [1]\n", 4, "unclosed table");
        refused("[tenants.a]\nuids = [1]\n\n[tenants.a]\ngids = [2]\n", 4, "duplicate key");
        refused("[tenants.a]\nuids = [1\n", 2, "");
        refused("# servers\n[serve]\nworkers = 2\n", 2, "unknown field `serve`");
        refused("[server]\nlisten = \"unix:/x\"\nworker = 2\n", 3, "unknown field `worker`");
        refused("[default]\nweight = 1\nuids = [5]\n", 3, "unknown field `uids`");
        let e = refused("[tenants.a]\nuids = [1]\nmemory_limt = \"1GiB\"\n", 3, "unknown field `memory_limt`");
        assert!(!e.reason.contains('\n'), "{e:?}");
        refused("[tenants.a]\nuids = [1]\n[tenants.a.b]\nuids = [2]\n", 3, "unknown field `b`");
        refused("[tenants.a]\nuids = [1, -2]\n", 2, "expected u32");
        refused("[tenants.a]\nuids = 1\n", 2, "expected a sequence");
        refused("[tenants.a]\nuids = [1]\nweight = \"2\"\n", 3, "invalid type");
        refused("tenants = 5\n", 1, "expected a map");
    }

    #[test]
    fn tenant_names_are_short_plain_and_not_reserved() {
        for name in ["a", "\"A-z_0.9\"", &"x".repeat(MAX_NAME_LEN), "\"quoted-but-plain\""] {
            parse(&format!("[tenants.{name}]\nuids = [1]\n")).unwrap();
        }
        for name in ["\"\"", "\"a b\"", "\"a/b\"", "\"ünï\"", &"x".repeat(MAX_NAME_LEN + 1), "\"a\\nb\""] {
            refused(&format!("\n[tenants.{name}]\nuids = [1]\n"), 2, "must be 1 to 64 letters");
        }
        refused("[tenants.a]\nuids = [1]\n\n[tenants.\"uid:7\"]\nuids = [2]\n", 4, "is reserved");
        refused("[tenants]\n\"uid:7\" = { uids = [2] }\n", 2, "is reserved");
    }

    #[test]
    fn server_settings_are_checked() {
        let server = |text: &str| parse(&format!("[server]\n{text}\n[default]\n")).map(|c| c.server);
        assert_eq!(server("listen = \"unix:/run/g.sock\"").unwrap().listen, Some(Address::Unix("/run/g.sock".into())));
        assert_eq!(server("metrics = \"[::1]:9400\"").unwrap().metrics.as_deref(), Some("[::1]:9400"));
        assert_eq!(server("workers = 0").unwrap().workers, Some(0));
        assert_eq!(server("workers = 64").unwrap().workers, Some(64));
        assert_eq!(server("slice = \"25ms\"").unwrap().slice, Some(Duration::from_millis(25)));
        assert_eq!(server("slice = \"2.5 ms\"").unwrap().slice, Some(Duration::from_micros(2500)));
        assert_eq!(server("slice = \"1s\"").unwrap().slice, Some(Duration::from_secs(1)));
        for (text, says) in [
            ("listen = \"/run/g.sock\"", "expected unix:PATH, tcp:HOST:PORT or vm:PATH"),
            ("listen = \"tcp:host\"", "expected unix:PATH, tcp:HOST:PORT or vm:PATH"),
            ("metrics = \"9400\"", "metrics must be HOST:PORT"),
            ("metrics = \"localhost\"", "metrics must be HOST:PORT"),
            ("metrics = \"localhost:http\"", "metrics must be HOST:PORT"),
            ("metrics = \"tcp:localhost:9400\"", "metrics must be HOST:PORT"),
            ("workers = 65", "workers must be from 0 to 64, not 65"),
            ("workers = -1", "workers must be from 0 to 64, not -1"),
            ("slice = \"10\"", "expected a number and us, ms or s"),
            ("slice = \"ms\"", "expected a number before ms"),
            ("slice = \"500us\"", "slice must be from 1ms to 1s"),
            ("slice = \"2s\"", "slice must be from 1ms to 1s"),
        ] {
            refused(&format!("[server]\n{text}\n[default]\n"), 2, says);
        }
    }

    #[test]
    fn weights_and_gpus_are_checked() {
        let settings =
            |text: &str| parse(&format!("[tenants.a]\nuids = [1]\n{text}\n")).map(|c| c.tenants[0].settings.clone());
        assert_eq!(settings("weight = 1").unwrap().weight, 1);
        assert_eq!(settings("weight = 1000").unwrap().weight, 1000);
        assert_eq!(settings("gpus = [3]").unwrap().gpus, Some(vec![3]));
        for (text, says) in [
            ("weight = 0", "weight must be from 1 to 1000, not 0"),
            ("weight = 1001", "not 1001"),
            ("weight = -3", "not -3"),
            ("weight = 4294967297", "not 4294967297"),
            ("gpus = []", "gpus is empty"),
            ("gpus = [0, 1, 0]", "GPU 0 is listed twice"),
            ("gpus = [-1]", "expected u32"),
        ] {
            refused(&format!("[tenants.a]\nuids = [1]\n{text}\n"), 3, says);
            refused(&format!("[default]\n\n{text}\n"), 3, says);
        }
        refused("[tenants.a]\nuids = [1]\ngpus = [\n  0,\n  1,\n  1,\n]\n", 6, "GPU 1 is listed twice");
    }

    #[test]
    fn sharing_is_a_name_and_active_threads_a_spatial_percentage() {
        let settings =
            |text: &str| parse(&format!("[tenants.a]\nuids = [1]\n{text}\n")).map(|c| c.tenants[0].settings.clone());
        assert_eq!(settings("").unwrap().sharing, Sharing::Isolated);
        let spatial = settings("sharing = \"spatial\"\nactive_threads = 25").unwrap();
        assert_eq!((spatial.sharing, spatial.active_threads), (Sharing::Spatial, Some(25)));
        for (text, says) in [
            ("sharing = \"mps\"", "unknown sharing \"mps\": expected isolated or spatial"),
            ("active_threads = 50", "active_threads applies to spatial tenants only"),
            ("sharing = \"spatial\"\nactive_threads = 0", "active_threads must be from 1 to 100, not 0"),
            ("sharing = \"spatial\"\nactive_threads = 101", "active_threads must be from 1 to 100, not 101"),
        ] {
            let line = 3 + text.matches('\n').count();
            refused(&format!("[tenants.a]\nuids = [1]\n{text}\n"), line, says);
        }
    }

    #[test]
    fn priorities_and_the_policy_are_names() {
        let settings =
            |text: &str| parse(&format!("[tenants.a]\nuids = [1]\n{text}\n")).map(|c| c.tenants[0].settings.clone());
        assert_eq!(settings("").unwrap().priority, Class::Normal);
        assert_eq!(settings("priority = \"high\"").unwrap().priority, Class::High);
        assert_eq!(settings("priority = \"low\"").unwrap().priority, Class::Low);
        refused(
            "[tenants.a]\nuids = [1]\npriority = \"urgent\"\n",
            3,
            "unknown priority \"urgent\": expected low, normal or high",
        );
        refused("[default]\npriority = 2\n", 2, "invalid type");
        for name in Policy::NAMES {
            let config = parse(&format!("[server]\npolicy = \"{name}\"\n[default]\n")).unwrap();
            assert_eq!(config.server.policy.map(Policy::name), Some(name));
        }
        refused(
            "[server]\npolicy = \"credit\"\n[default]\n",
            2,
            "unknown policy \"credit\": expected fair, fifo, band or none",
        );
    }

    #[test]
    fn a_uid_gid_or_token_belongs_to_one_tenant() {
        let e = refused("[tenants.alice]\nuids = [1000]\n\n[tenants.bob]\nuids = [1001,\n  1000]\n", 6, "uid 1000");
        assert_eq!(e.reason, "uid 1000 is claimed by tenants \"alice\" and \"bob\"; a peer must belong to one tenant");
        refused(
            "[tenants.a]\ngids = [100]\n[tenants.b]\ngids = [100]\n",
            4,
            "gid 100 is claimed by tenants \"a\" and \"b\"",
        );
        refused("[tenants.a]\nuids = [5, 6, 5]\n", 2, "uid 5 is listed twice");
        refused("[tenants.a]\ngids = [5, 5]\n", 2, "gid 5 is listed twice");
        // A uid and a gid of the same number are different things.
        parse("[tenants.a]\nuids = [100]\n[tenants.b]\ngids = [100]\n").unwrap();

        let dir = TempDir::new("same-token");
        dir.write("a.token", "the same secret, twice\n", 0o600);
        dir.write("b.token", "  the same secret, twice", 0o400);
        let text = "[tenants.a]\ntoken_file = \"a.token\"\n\n[tenants.b]\ntoken_file = \"b.token\"\n";
        let e = Config::parse(text, &dir.0.join("g.toml")).unwrap_err();
        assert_eq!(e.line, Some(5));
        assert!(e.reason.starts_with("the same token is claimed by tenants \"a\" and \"b\""), "{e}");
        assert!(!e.to_string().contains("secret"), "{e}");
    }

    #[test]
    fn a_tenant_must_be_reachable_and_someone_admitted() {
        refused("[tenants.a]\nuids = [1]\n\n[tenants.idle]\nweight = 3\n", 4, "no uids, gids or token_file");
        refused("[tenants.empty]\nuids = []\ngids = []\n", 1, "tenant \"empty\" has no uids");
        for text in ["", "# nothing\n", "[server]\nworkers = 1\n", "[tenants]\n"] {
            let e = parse(text).unwrap_err();
            assert_eq!((e.line, e.to_string().starts_with(&format!("{PATH}: no tenants"))), (None, true), "{e}");
        }
        assert!(parse("[default]\n").unwrap().tenants.is_empty());
    }

    #[test]
    fn tokens_are_read_private_and_relative_to_the_file() {
        let dir = TempDir::new("tokens");
        dir.write("good.token", "0123456789abcdef\n", 0o600);
        dir.write("open.token", "0123456789abcdef\n", 0o644);
        dir.write("short.token", "0123456789\n", 0o600);
        let config_file = dir.write("conf.d/g.toml", "", 0o644);
        let with = |file: &str| format!("[tenants.a]\nuids = [1]\ntoken_file = {file:?}\n");

        // Relative to the file's directory, never the working directory.
        let config = Config::parse(&with("../good.token"), &config_file).unwrap();
        assert_eq!(config.tenants[0].token, Some(Token::new(b"0123456789abcdef").unwrap()));
        let absolute = dir.0.join("good.token");
        Config::parse(&with(absolute.to_str().unwrap()), Path::new("g.toml")).unwrap();

        for (file, says) in [
            ("../open.token", "chmod 600"),
            ("../short.token", "at least 16"),
            ("../missing.token", "No such file"),
            ("good.token", "No such file"),
        ] {
            let e = Config::parse(&format!("\n{}", with(file)), &config_file).unwrap_err();
            assert_eq!(e.line, Some(4), "{e}");
            assert!(e.reason.contains(says) && e.reason.contains("token file"), "{file}: {e}");
        }
    }

    #[test]
    fn load_reads_the_file_and_names_it() {
        let dir = TempDir::new("load");
        let path = dir.write("g.toml", "[tenants.a]\nuids = [1]\n", 0o644);
        assert_eq!(Config::load(&path).unwrap().tenants[0].name, "a");

        let missing = dir.0.join("missing.toml");
        let e = Config::load(&missing).unwrap_err();
        assert_eq!((e.path.as_path(), e.line), (missing.as_path(), None));
        assert!(e.to_string().starts_with(&format!("{}: cannot read the file: ", missing.display())), "{e}");

        let bad = dir.write("bad.toml", "[default]\nweight = 0\n", 0o644);
        assert_eq!(
            Config::load(&bad).unwrap_err().to_string(),
            format!("{}:2: weight must be from 1 to 1000, not 0", bad.display())
        );
    }

    #[test]
    fn local_peers_match_by_uid_then_by_group() {
        let config = parse(
            "[tenants.alice]\nuids = [1000]\ngids = [10]\n\n[tenants.staff]\ngids = [50, 20]\n\n[tenants.ops]\ngids = [30]\nuids = [0]\n",
        )
        .unwrap();
        let tenant = |uid, gids: &[u32]| config.local_tenant(uid, gids).map(|t| t.name.as_str());
        assert_eq!(tenant(1000, &[]), Some("alice"));
        // The uid wins over any group, even one listed first.
        assert_eq!(tenant(1000, &[20, 30]), Some("alice"));
        assert_eq!(tenant(0, &[50]), Some("ops"));
        // Groups in the order given: the primary group first.
        assert_eq!(tenant(7, &[20, 30]), Some("staff"));
        assert_eq!(tenant(7, &[30, 20]), Some("ops"));
        assert_eq!(tenant(7, &[99, 10]), Some("alice"));
        assert_eq!(tenant(7, &[99]), None);
        assert_eq!(tenant(7, &[]), None);
    }

    #[test]
    fn devices_are_checked_once_known() {
        let config =
            parse("[default]\ngpus = [1]\n\n[tenants.a]\nuids = [1]\n\n[tenants.b]\nuids = [2]\ngpus = [0, 3]\n")
                .unwrap();
        config.check_devices(4).unwrap();
        let e = config.check_devices(3).unwrap_err();
        assert_eq!(e.to_string(), format!("{PATH}:7: tenant \"b\" lists GPU 3, but this machine has 3 (GPUs 0-2)"));
        let e = config.check_devices(1).unwrap_err();
        assert_eq!(e.to_string(), format!("{PATH}:1: [default] lists GPU 1, but this machine has 1 (GPU 0)"));
        let e = parse("[tenants.a]\nuids = [1]\ngpus = [0]\n").unwrap().check_devices(0).unwrap_err();
        assert_eq!(e.to_string(), format!("{PATH}:1: tenant \"a\" lists GPU 0, but this machine has none"));
        // Without gpus, a tenant may use whatever there is, even nothing.
        parse("[tenants.a]\nuids = [1]\n").unwrap().check_devices(0).unwrap();
    }
}
