//! What `gpuplex status` and the metrics endpoint show: every tenant and
//! session with what it holds and does, read from the registry and the
//! ledgers, and rates over the last [`INTERVAL`].
//!
//! A guest may ask too, and sees only its own tenant: which programs other
//! tenants run, and as whom, is theirs. The server's owner sees everything,
//! and so does whoever can reach the metrics endpoint.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, PoisonError, Weak};
use std::time::Duration;

use gpuplex_protocol::{GpuTime, Seq, ServerStatus, ServerSummary, SessionStatus, SessionSummary, TenantStatus};

use super::Supervisor;
use crate::ledger::Slot;
use crate::sched::board;

/// The window rates are measured over.
pub const INTERVAL: Duration = Duration::from_secs(5);

/// Who asks.
pub enum Viewer {
    Owner,
    Tenant(String),
    /// A peer no tenant admits: it sees the server, no sessions.
    Nobody,
}

impl Viewer {
    fn sees(&self, tenant: &str) -> bool {
        match self {
            Viewer::Owner => true,
            Viewer::Tenant(mine) => mine == tenant,
            Viewer::Nobody => false,
        }
    }
}

/// How often the sampling thread reads every session's counters: rates
/// cover the last [`INTERVAL`] to within one step, however late one asks.
pub const STEP: Duration = Duration::from_secs(1);

/// Session counters sampled each [`STEP`] over the last [`INTERVAL`], from
/// which a status computes its rates when it is asked.
#[derive(Default)]
pub struct Rates {
    history: Mutex<VecDeque<Snapshot>>,
}

struct Snapshot {
    /// When it was taken, on the scheduler's clock (ns).
    at_ns: u64,
    /// Each live session's counters then.
    counters: HashMap<u64, Sample>,
}

#[derive(Clone, Copy, Default)]
struct Sample {
    calls: u64,
    /// GPU time its kernels took, as far as its meter has timed them (ns).
    compute_ns: u64,
    /// When the work its meter still waits for was submitted (ns; 0: none).
    running_since: u64,
}

impl Sample {
    fn of(slot: &Slot) -> Sample {
        Sample {
            calls: slot.calls.load(Ordering::Relaxed),
            compute_ns: slot.compute_ns.load(Ordering::Relaxed),
            running_since: slot.running_since.load(Ordering::Relaxed),
        }
    }
}

/// Samples every session's counters each [`STEP`] while the supervisor lives.
pub fn start_sampling(supervisor: Weak<Supervisor>) {
    let spawned = std::thread::Builder::new().name("gpuplex-rates".into()).spawn(move || loop {
        std::thread::sleep(STEP);
        let Some(s) = supervisor.upgrade() else { return };
        let counters = s
            .registry
            .sessions()
            .into_iter()
            .filter_map(|session| {
                let ledger = s.registry.ledger(&session.tenant)?;
                Some((session.id, Sample::of(ledger.slot(session.slot))))
            })
            .collect();
        s.rates.record(crate::sched::now_ns(), counters);
    });
    if let Err(e) = spawned {
        tracing::warn!("status will show no rates: {e}");
    }
}

impl Rates {
    fn record(&self, at_ns: u64, counters: HashMap<u64, Sample>) {
        let mut history = self.history.lock().unwrap_or_else(PoisonError::into_inner);
        history.push_back(Snapshot { at_ns, counters });
        // Asked later than now, a window starts after `at_ns - INTERVAL`:
        // older snapshots are never read again.
        let oldest = at_ns.saturating_sub(INTERVAL.as_nanos() as u64);
        while history.front().is_some_and(|s| s.at_ns < oldest) {
            history.pop_front();
        }
    }

    /// Calls per second and GPU busy share of `session`, whose counters at
    /// `now_ns` are `now`, since the oldest snapshot inside the last
    /// [`INTERVAL`].
    fn of(&self, session: u64, now: Sample, now_ns: u64) -> (f32, f32) {
        let history = self.history.lock().unwrap_or_else(PoisonError::into_inner);
        let window_start = now_ns.saturating_sub(INTERVAL.as_nanos() as u64);
        let Some(base) = history.iter().find(|s| s.at_ns >= window_start).or(history.back()) else {
            return (0.0, 0.0);
        };
        let seconds = (now_ns.saturating_sub(base.at_ns) as f32 / 1e9).max(1e-3);
        let before = base.counters.get(&session).copied().unwrap_or_default();
        let calls = now.calls.saturating_sub(before.calls) as f32 / seconds;
        // Work the meter still waits for (a long kernel) counts from when it
        // was submitted, or from the window's start.
        let running = match now.running_since {
            0 => 0,
            since => now_ns.saturating_sub(since.max(base.at_ns)),
        };
        let busy_ns = now.compute_ns.saturating_sub(before.compute_ns) + running;
        (calls, (busy_ns as f32 / 1e9 / seconds).min(1.0))
    }
}

/// The status `viewer` may see.
pub fn status(supervisor: &Supervisor, viewer: &Viewer) -> ServerStatus {
    let registry = &supervisor.registry;
    let backend = supervisor.backend();
    let mut sessions = Vec::new();
    let mut per_tenant: HashMap<String, (f32, f32)> = HashMap::new();
    let now_ns = crate::sched::now_ns();
    for s in registry.sessions().into_iter().filter(|s| viewer.sees(&s.tenant)) {
        let Some(ledger) = registry.ledger(&s.tenant) else { continue };
        let slot = ledger.slot(s.slot);
        let (calls_per_second, gpu_busy) = supervisor.rates.of(s.id, Sample::of(slot), now_ns);
        let sum = per_tenant.entry(s.tenant.clone()).or_default();
        sum.0 += calls_per_second;
        sum.1 += gpu_busy;
        sessions.push(SessionStatus {
            id: s.id,
            tenant: s.tenant.clone(),
            client_pid: s.peer.pid().unwrap_or(SessionSummary::NO_PID),
            uid: s.peer.uid().unwrap_or(SessionSummary::NO_UID),
            peer: s.peer.to_string(),
            program: s.program.clone(),
            worker_pid: s.worker_pid,
            contexts: slot.contexts.load(Ordering::Relaxed),
            memory_used: slot.memory.load(Ordering::Relaxed),
            calls: slot.calls.load(Ordering::Relaxed),
            calls_per_second,
            gpu_busy,
            seconds: s.started.elapsed().as_secs(),
            compute_seconds: slot.compute_ns.load(Ordering::Relaxed) as f64 / 1e9,
            copy_seconds: slot.copy_ns.load(Ordering::Relaxed) as f64 / 1e9,
            mps_gpu: s.mps_gpu.map_or(SessionStatus::OWN_FAULT_DOMAIN, |g| g as u32),
        });
    }
    let tenants = registry
        .tenants()
        .into_iter()
        .filter(|t| viewer.sees(&t.name))
        .map(|t| {
            let calls: u64 = sessions.iter().filter(|s| s.tenant == t.name).map(|s| s.calls).sum();
            let (calls_per_second, gpu_busy) = per_tenant.get(&t.name).copied().unwrap_or_default();
            let row = registry.board().tenant(t.row);
            let gpu_time = (0..backend.devices.len().min(board::MAX_GPUS))
                .map(|gpu| GpuTime {
                    gpu: gpu as u32,
                    compute_seconds: row.compute_ns[gpu].load(Ordering::Relaxed) as f64 / 1e9,
                    copy_seconds: row.copy_ns[gpu].load(Ordering::Relaxed) as f64 / 1e9,
                })
                .filter(|g| g.compute_seconds + g.copy_seconds > 0.0)
                .collect();
            TenantStatus {
                sessions: t.sessions as u32,
                memory_used: t.ledger.used(),
                memory_limit: t.ledger.limit(),
                weight: t.weight,
                calls: t.ended_calls + calls,
                calls_per_second,
                gpu_busy,
                priority: t.class.name().to_owned(),
                gpu_time: Seq(gpu_time),
                sharing: t.sharing.name().to_owned(),
                name: t.name,
            }
        })
        .collect();
    ServerStatus {
        backend: backend.kind.clone(),
        driver_version: backend.driver_version,
        devices: Seq(backend.devices.clone()),
        full: matches!(viewer, Viewer::Owner),
        uptime_seconds: supervisor.started.elapsed().as_secs(),
        idle_workers: supervisor.idle_workers(),
        interval_seconds: INTERVAL.as_secs_f32(),
        tenants: Seq(tenants),
        sessions: Seq(sessions),
        policy: registry.board().policy().name().to_owned(),
    }
}

/// The summary an older `gpuplex info` asks for, as `viewer` may see it.
pub fn summary(supervisor: &Supervisor, viewer: &Viewer) -> ServerSummary {
    let s = status(supervisor, viewer);
    let sessions = s
        .sessions
        .0
        .into_iter()
        .map(|t| SessionSummary {
            id: t.id,
            pid: t.client_pid,
            uid: t.uid,
            program: t.program,
            contexts: t.contexts,
            device_bytes: t.memory_used,
            calls: t.calls,
            seconds: t.seconds,
        })
        .collect();
    ServerSummary { backend: s.backend, driver_version: s.driver_version, devices: s.devices, sessions: Seq(sessions) }
}

/// The whole server in Prometheus' text format, names prefixed `gpuplex_`
/// and labelled by tenant.
pub fn prometheus(supervisor: &Supervisor) -> String {
    let s = status(supervisor, &Viewer::Owner);
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, rows: Vec<(String, String)>| {
        let _ = writeln!(out, "# HELP gpuplex_{name} {help}\n# TYPE gpuplex_{name} {kind}");
        for (labels, value) in rows {
            let _ = writeln!(out, "gpuplex_{name}{{{labels}}} {value}");
        }
    };
    let tenant = |t: &TenantStatus| format!("tenant=\"{}\"", escape(&t.name));
    let per_tenant = |f: &dyn Fn(&TenantStatus) -> String| s.tenants.0.iter().map(|t| (tenant(t), f(t))).collect();
    family("tenant_sessions", "gauge", "Live sessions of the tenant.", per_tenant(&|t| t.sessions.to_string()));
    family(
        "tenant_memory_bytes",
        "gauge",
        "Device memory the tenant's sessions hold.",
        per_tenant(&|t| t.memory_used.to_string()),
    );
    family(
        "tenant_memory_limit_bytes",
        "gauge",
        "The tenant's device memory limit (0: none).",
        per_tenant(&|t| t.memory_limit.to_string()),
    );
    family("tenant_weight", "gauge", "The tenant's configured weight.", per_tenant(&|t| t.weight.to_string()));
    family(
        "tenant_calls_total",
        "counter",
        "CUDA calls the tenant's sessions made.",
        per_tenant(&|t| t.calls.to_string()),
    );
    family(
        "tenant_gpu_busy_ratio",
        "gauge",
        "Share of the last interval the tenant's work kept a GPU busy.",
        per_tenant(&|t| format!("{:.4}", t.gpu_busy)),
    );
    let gpu_time = |engine: &str, f: &dyn Fn(&GpuTime) -> f64| -> Vec<(String, String)> {
        let rows = s.tenants.0.iter().flat_map(|t| t.gpu_time.0.iter().map(move |g| (t, g)));
        rows.map(|(t, g)| (format!("{},gpu=\"{}\",engine=\"{engine}\"", tenant(t), g.gpu), format!("{:.6}", f(g))))
            .collect()
    };
    let mut engines = gpu_time("compute", &|g| g.compute_seconds);
    engines.extend(gpu_time("copy", &|g| g.copy_seconds));
    family(
        "tenant_gpu_seconds_total",
        "counter",
        "GPU time the tenant's work took on each GPU, kernels (engine=compute) and copies apart.",
        engines,
    );
    let session = |t: &SessionStatus| {
        format!("tenant=\"{}\",session=\"{}\",worker_pid=\"{}\"", escape(&t.tenant), t.id, t.worker_pid)
    };
    let per_session = |f: &dyn Fn(&SessionStatus) -> String| s.sessions.0.iter().map(|t| (session(t), f(t))).collect();
    family(
        "session_memory_bytes",
        "gauge",
        "Device memory the session holds.",
        per_session(&|t| t.memory_used.to_string()),
    );
    family("session_calls_total", "counter", "CUDA calls the session made.", per_session(&|t| t.calls.to_string()));
    let _ = writeln!(out, "# HELP gpuplex_idle_workers Worker processes ready for a guest.");
    let _ = writeln!(out, "# TYPE gpuplex_idle_workers gauge\ngpuplex_idle_workers {}", s.idle_workers);
    let _ = writeln!(out, "# HELP gpuplex_uptime_seconds Seconds since the server started.");
    let _ = writeln!(out, "# TYPE gpuplex_uptime_seconds counter\ngpuplex_uptime_seconds {}", s.uptime_seconds);
    out
}

/// A label value as Prometheus' text format quotes it.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Serves [`prometheus`] at `/metrics` on `address` (HOST:PORT), on a
/// thread of its own, until the supervisor is gone. Anyone who can reach
/// the address sees every tenant: bind it where only the operator can.
pub fn serve_metrics(supervisor: Weak<Supervisor>, address: &str) -> std::io::Result<std::net::SocketAddr> {
    let listener = std::net::TcpListener::bind(address)?;
    let bound = listener.local_addr()?;
    std::thread::Builder::new().name("gpuplex-metrics".into()).spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let Some(s) = supervisor.upgrade() else { return };
            let _ = answer_http(stream, &s);
        }
    })?;
    Ok(bound)
}

/// Answers one HTTP request: `GET /metrics`, or 404. Reads at most a few
/// KiB under a short deadline, so a stray client holds the thread briefly.
fn answer_http(mut stream: std::net::TcpStream, supervisor: &Supervisor) -> std::io::Result<()> {
    use std::io::{Read, Write as _};
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 8192 {
        match stream.read(&mut buf)? {
            0 => break,
            n => request.extend_from_slice(&buf[..n]),
        }
    }
    let line = request.split(|&b| b == b'\n').next().unwrap_or_default();
    let mut words = line.split(|&b| b == b' ');
    let (method, path) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
    let (status, kind, body) = if method == b"GET" && (path == b"/metrics" || path.starts_with(b"/metrics?")) {
        ("200 OK", "text/plain; version=0.0.4; charset=utf-8", prometheus(supervisor))
    } else {
        ("404 Not Found", "text/plain; charset=utf-8", "gpuplex serves /metrics only\n".to_owned())
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn sample(calls: u64, compute_ns: u64, running_since: u64) -> Sample {
        Sample { calls, compute_ns, running_since }
    }

    fn record(rates: &Rates, at_ns: u64, session: Sample) {
        rates.record(at_ns, HashMap::from([(7, session)]));
    }

    #[test]
    fn rates_cover_the_last_interval_however_late_one_asks() {
        let rates = Rates::default();
        assert_eq!(rates.of(7, sample(0, 0, 0), 100 * S), (0.0, 0.0), "nothing sampled yet");
        // 10 calls a second for 20 s; a kernel submitted at 12.5 s still runs.
        for t in 1..=20 {
            record(&rates, t * S, sample(10 * t, 0, if t >= 13 { 12 * S + S / 2 } else { 0 }));
        }
        // Asked at 20.9 s: the window starts at the 16 s snapshot, all of it
        // inside the kernel, however far the last sample lies behind.
        let (calls, busy) = rates.of(7, sample(209, 0, 12 * S + S / 2), 20 * S + 9 * S / 10);
        assert!((calls - 10.0).abs() < 0.01, "{calls}");
        assert_eq!(busy, 1.0);
        // A kernel submitted at 18 s, asked at 20 s: busy 2 s of the last 5.
        let (_, busy) = rates.of(7, sample(200, 0, 18 * S), 20 * S);
        assert!((busy - 0.4).abs() < 0.01, "{busy}");
        // Finished kernels count what their meter timed inside the window.
        record(&rates, 21 * S, sample(210, 3 * S, 0));
        let (_, busy) = rates.of(7, sample(210, 3 * S, 0), 21 * S);
        assert!((busy - 0.6).abs() < 0.01, "{busy}");
    }

    #[test]
    fn snapshots_older_than_the_interval_are_dropped() {
        let rates = Rates::default();
        for t in 1..=100 {
            record(&rates, t * S, sample(t, 0, 0));
        }
        let history = rates.history.lock().unwrap();
        assert_eq!(history.front().map(|s| s.at_ns), Some(95 * S));
        assert_eq!(history.len(), 6);
    }
}
