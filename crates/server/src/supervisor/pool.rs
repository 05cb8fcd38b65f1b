//! Worker processes, started ahead of the guests that will need them.
//!
//! Starting a worker costs what initializing the CUDA driver costs (a
//! tenth of a second or so), so the pool keeps a few started and ready
//! (`--workers`, default [`DEFAULT_IDLE`]); a guest takes one at once and a
//! thread of the pool starts its replacement. Guests that come together,
//! more than are idle, get theirs started side by side (up to
//! [`MAX_STARTING`] at once), as their processes would each initialize the
//! driver natively. A worker is used once: it serves one guest and exits
//! with it, so nothing of one guest survives into the next.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use crate::worker::link::{self, Kind, Link};
use crate::worker::LINK_FD;

/// Workers kept started and idle unless told otherwise.
pub const DEFAULT_IDLE: usize = 2;
/// Workers starting at once, at most: enough for a burst of guests not to
/// wait on each other's start, few enough that a flood of them cannot have
/// the server start processes without bound.
pub const MAX_STARTING: usize = 8;
/// How long a new worker may take to open its backend.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a guest waits for a worker before it is refused.
const TAKE_TIMEOUT: Duration = Duration::from_secs(120);
/// The pause after a worker failed to start, before the next try.
const RETRY_AFTER: Duration = Duration::from_secs(2);
/// How long after a guest took a worker its replacement starts, where the
/// pool can wait ([`start_wait`]): a starting worker initializes the driver,
/// which slows the context the new guest creates meanwhile on the same GPU.
const SETTLE: Duration = Duration::from_millis(300);

/// A started worker, ready for a guest.
pub struct Worker {
    pub child: Child,
    pub link: Arc<Link>,
    pub ready: link::Ready,
}

/// How to start a worker: the `gpuplex` executable, its arguments and any
/// variables to set for it.
#[derive(Clone, Debug)]
pub struct WorkerCommand {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub env: Vec<(OsString, OsString)>,
}

#[derive(Default)]
struct State {
    idle: VecDeque<Worker>,
    /// Guests waiting in `take`.
    waiting: usize,
    /// Workers being started for the pool.
    starting: usize,
    /// Why the last start failed, while no start has succeeded since.
    failure: Option<String>,
    /// After a failed start, none begins before this.
    retry_at: Option<Instant>,
    /// When a guest last took a worker.
    taken_at: Option<Instant>,
    stopped: bool,
}

impl State {
    /// How long the pool's thread waits before it looks again, or `None`
    /// to start a worker now (or stop).
    fn wait_before_start(&self, keep_idle: usize) -> Option<Duration> {
        if self.stopped {
            return None;
        }
        if let Some(left) = self.retry_at.map(|at| at.saturating_duration_since(Instant::now())) {
            if !left.is_zero() {
                return Some(left);
            }
        }
        let settling = self.taken_at.map(|at| SETTLE.saturating_sub(at.elapsed())).filter(|d| !d.is_zero());
        start_wait(self.idle.len() + self.starting, self.waiting, keep_idle, settling, self.starting)
    }
}

/// With `coming` workers ready or starting (`starting` of them), `waiting`
/// guests and the last guest to take one `settling` for so much longer:
/// `None` to start a worker now, else how long to wait before looking
/// again. One starts while fewer are coming than kept plus guests waiting,
/// once the last guest has settled; only the first replacement of a burst
/// waits for that, not one where the pool lacks more than one worker or a
/// guest waits.
fn start_wait(
    coming: usize,
    waiting: usize,
    keep_idle: usize,
    settling: Option<Duration>,
    starting: usize,
) -> Option<Duration> {
    let wanted = coming < keep_idle.max(waiting) && starting < MAX_STARTING;
    let urgent = waiting > 0 || coming + 1 < keep_idle;
    match settling {
        _ if !wanted => Some(Duration::from_secs(1)),
        Some(left) if !urgent => Some(left),
        _ => None,
    }
}

pub struct Pool {
    command: WorkerCommand,
    keep_idle: usize,
    state: Mutex<State>,
    changed: Condvar,
}

impl Pool {
    /// Starts a pool that keeps `keep_idle` workers ready, and waits for
    /// the first, whose `Ready` says what the backend found (or why it
    /// could not open: no driver, say). The pool stops when the last
    /// handle to it is dropped.
    pub fn start(command: WorkerCommand, keep_idle: usize) -> Result<(Arc<Pool>, link::Ready), String> {
        let pool = Arc::new(Pool { command, keep_idle, state: Mutex::default(), changed: Condvar::new() });
        let first = pool.start_one(&[])?;
        let ready = first.ready.clone();
        pool.lock().idle.push_back(first);
        let weak = Arc::downgrade(&pool);
        std::thread::Builder::new()
            .name("gpuplex-pool".into())
            .spawn(move || keep_filled(weak))
            .map_err(|e| format!("cannot start the pool's thread: {e}"))?;
        Ok((pool, ready))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Workers started and waiting for a guest.
    pub fn idle(&self) -> usize {
        self.lock().idle.len()
    }

    /// A ready worker for a guest: an idle one, else the next one started.
    pub fn take(&self) -> Result<Worker, String> {
        let mut state = self.lock();
        state.waiting += 1;
        self.changed.notify_all();
        let deadline = std::time::Instant::now() + TAKE_TIMEOUT;
        let taken = 'taking: loop {
            while let Some(mut worker) = state.idle.pop_front() {
                // One that died while idle is of no use.
                if matches!(worker.child.try_wait(), Ok(None)) {
                    state.taken_at = Some(Instant::now());
                    break 'taking Ok(worker);
                }
                reap(worker);
            }
            if let Some(why) = &state.failure {
                break Err(format!("no worker could start: {why}"));
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() || state.stopped {
                break Err("no worker became ready in time".to_owned());
            }
            state = self.changed.wait_timeout(state, left).unwrap_or_else(PoisonError::into_inner).0;
        };
        state.waiting -= 1;
        self.changed.notify_all();
        taken
    }

    /// Starts one worker with `env` added to its variables, and waits for
    /// it to be ready. The pool's own have none added; a guest that needs a
    /// setting theirs lack gets one started for it, outside the pool.
    pub fn start_one(&self, env: &[(OsString, OsString)]) -> Result<Worker, String> {
        start(&self.command, env)
    }

    /// What a start for the pool came to: the worker for the idle ones, or
    /// why it failed, which holds back the next start a while.
    fn started(&self, outcome: Result<Worker, String>) {
        let mut state = self.lock();
        state.starting -= 1;
        match outcome {
            Ok(worker) => {
                if state.failure.take().is_some() {
                    info!("workers start again");
                }
                state.retry_at = None;
                state.idle.push_back(worker);
            }
            Err(why) => {
                warn!("a worker failed to start: {why}");
                state.failure = Some(why);
                state.retry_at = Some(Instant::now() + RETRY_AFTER);
            }
        }
        self.changed.notify_all();
    }
}

/// Starts one worker by `how`, with `env` added to its variables, and waits
/// for it to be ready.
fn start(how: &WorkerCommand, env: &[(OsString, OsString)]) -> Result<Worker, String> {
    let (supervisor_end, worker_end) = Link::pair().map_err(|e| format!("cannot make a link: {e}"))?;
    let mut command = Command::new(&how.program);
    let env = how.env.iter().chain(env).cloned();
    command.args(&how.args).envs(env).stdin(Stdio::null());
    // Anything a worker writes to its standard output or error (its
    // logs, or a driver message) lands in the server's log.
    if let Ok(log) = std::io::stderr().as_fd().try_clone_to_owned() {
        command.stdout(Stdio::from(log));
    }
    let raw = worker_end.as_raw_fd();
    // SAFETY: every call here is async-signal-safe, as code between fork
    // and exec must be. The link's copy on LINK_FD has no close-on-exec;
    // every descriptor above it goes, including any the server itself
    // inherited without close-on-exec. A worker gets a process group of
    // its own, so that a terminal's Ctrl-C reaches the program and not
    // the worker serving it, and an empty signal mask, whatever the
    // spawning thread had blocked.
    unsafe {
        command.pre_exec(move || {
            if onto_link_fd(raw) < 0 || libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let first = LINK_FD as libc::c_uint + 1;
            if libc::syscall(libc::SYS_close_range, first, libc::c_uint::MAX, 0) != 0 {
                // Kernels before 5.9: each one that could be open.
                let limit = libc::sysconf(libc::_SC_OPEN_MAX).clamp(0, 1 << 16) as libc::c_int;
                for fd in first as libc::c_int..limit {
                    libc::close(fd);
                }
            }
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            Ok(())
        });
    }
    let mut child = command.spawn().map_err(|e| format!("cannot start {}: {e}", how.program.display()))?;
    drop(worker_end);
    let link = Arc::new(supervisor_end);
    match ready(&link) {
        Ok(ready) => {
            debug!(pid = child.id(), "worker ready");
            Ok(Worker { child, link, ready })
        }
        Err(why) => {
            // How it ended, if it did, says why more than its silence.
            let ended = child.try_wait().ok().flatten();
            let _ = child.kill();
            let _ = child.wait();
            Err(match ended {
                Some(status) => format!("{why} ({status})"),
                None => why,
            })
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let mut state = self.lock();
        state.stopped = true;
        // Idle workers see their link close and exit.
        state.idle.drain(..).for_each(reap);
        self.changed.notify_all();
    }
}

/// Puts the worker's end of its link on [`LINK_FD`] without close-on-exec,
/// between fork and exec. Where the link is there already (the supervisor
/// had that descriptor free), `dup2` would do nothing and leave the flag
/// set, and the worker would start without its link.
///
/// # Safety
/// Async-signal-safe, as code between fork and exec must be.
unsafe fn onto_link_fd(raw: libc::c_int) -> libc::c_int {
    // SAFETY: plain descriptor calls.
    unsafe {
        if raw == LINK_FD {
            libc::fcntl(raw, libc::F_SETFD, 0)
        } else {
            libc::dup2(raw, LINK_FD)
        }
    }
}

/// Waits for a new worker's first message.
fn ready(link: &Link) -> Result<link::Ready, String> {
    let mut poll = libc::pollfd { fd: link.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut poll, 1, START_TIMEOUT.as_millis() as i32) };
    if n == 0 {
        return Err(format!("a worker did not become ready within {START_TIMEOUT:?}"));
    }
    match link.recv() {
        Ok(Some(m)) if m.kind == Kind::Ready => m.decode().map_err(|e| format!("undecodable Ready: {e}")),
        Ok(Some(m)) if m.kind == Kind::Failed => {
            Err(m.decode::<link::Failed>().map(|f| f.why).unwrap_or_else(|e| format!("undecodable Failed: {e}")))
        }
        Ok(Some(m)) => Err(format!("a new worker sent {:?}", m.kind)),
        Ok(None) => Err("a worker exited as it started".to_owned()),
        Err(e) => Err(format!("a worker's link failed: {e}")),
    }
}

/// Ends a worker that will serve no one, without waiting for it here.
pub fn reap(mut worker: Worker) {
    let _ = worker.child.kill();
    let spawned = std::thread::Builder::new().name("gpuplex-reap".into()).spawn(move || {
        let _ = worker.child.wait();
    });
    if spawned.is_err() {
        warn!("cannot reap a worker; it stays a zombie until the server exits");
    }
}

/// The pool's thread: starts workers while fewer are idle or starting than
/// kept plus guests waiting, each on a thread of its own.
fn keep_filled(pool: Weak<Pool>) {
    loop {
        let Some(p) = pool.upgrade() else { return };
        {
            let mut state = p.lock();
            while let Some(timeout) = state.wait_before_start(p.keep_idle) {
                state = p.changed.wait_timeout(state, timeout).unwrap_or_else(PoisonError::into_inner).0;
                if Arc::strong_count(&p) == 1 {
                    return;
                }
            }
            if state.stopped {
                return;
            }
            state.starting += 1;
        }
        // The starting thread holds no handle on the pool: a pool dropped
        // meanwhile is not kept alive by a start, whose worker is then reaped.
        let (how, weak) = (p.command.clone(), pool.clone());
        let spawned = std::thread::Builder::new().name("gpuplex-start".into()).spawn(move || {
            let outcome = start(&how, &[]);
            match weak.upgrade() {
                Some(p) => p.started(outcome),
                None => outcome.into_iter().for_each(reap),
            }
        });
        if let Err(e) = spawned {
            p.started(Err(format!("cannot start a thread to start it: {e}")));
        }
    }
}

/// Descriptors a worker is handed with a guest: the guest's socket and its
/// tenant's ledger.
pub fn serve(
    worker: &Worker,
    serve: &link::Serve,
    socket: &OwnedFd,
    ledger: std::os::fd::BorrowedFd<'_>,
    board: std::os::fd::BorrowedFd<'_>,
) -> std::io::Result<()> {
    worker.link.send(Kind::Serve, serve, &[socket.as_fd(), ledger, board])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replacement_starts_once_the_new_guest_settled_or_another_waits() {
        let settling = Some(Duration::from_millis(200));
        assert_eq!(start_wait(1, 0, 2, None, 0), None, "one short, nobody settling: start one");
        assert_eq!(start_wait(1, 0, 2, settling, 0), settling, "a guest just took one: it settles first");
        assert_eq!(start_wait(0, 0, 1, settling, 0), settling, "the only one kept, taken: the same");
        assert_eq!(start_wait(1, 1, 2, settling, 0), None, "a guest waits: start one now");
        assert_eq!(start_wait(1, 0, 3, settling, 0), None, "two short of three: start one now");
        assert_eq!(start_wait(2, 0, 2, None, 0), Some(Duration::from_secs(1)), "none wanted: look again later");
        assert_eq!(start_wait(2, 3, 2, settling, 0), None, "more guests waiting than kept");
    }

    #[test]
    fn a_burst_of_guests_gets_its_workers_started_side_by_side_up_to_a_bound() {
        let later = Some(Duration::from_secs(1));
        assert_eq!(start_wait(1, 3, 0, None, 1), None, "one starting for three waiting: start another");
        assert_eq!(start_wait(3, 3, 0, None, 3), later, "one starting for each guest waiting");
        assert_eq!(start_wait(2, 1, 2, None, 1), later, "one idle and one starting, two kept");
        let many = MAX_STARTING;
        assert_eq!(start_wait(many, 10 * many, 0, None, many), later, "no more than MAX_STARTING at once");
        let state = State { retry_at: Some(Instant::now() + RETRY_AFTER), waiting: 1, ..State::default() };
        let wait = state.wait_before_start(0).expect("a start failed just now");
        assert!(wait > RETRY_AFTER / 2, "{wait:?}");
    }

    #[test]
    fn the_pool_thread_leaves_when_stopped_and_a_guest_settles_first() {
        let mut state = State { stopped: true, ..State::default() };
        assert_eq!(state.wait_before_start(2), None, "stopped: the thread leaves");
        state.stopped = false;
        state.taken_at = Some(Instant::now());
        let wait = state.wait_before_start(1).expect("a guest just took the only one");
        assert!(wait <= SETTLE && wait > SETTLE / 2, "{wait:?}");
    }

    /// Set for this test binary when a pool starts it as a fake worker.
    const FAKE_WORKER: &str = "GPUPLEX_TEST_FAKE_WORKER_MS";

    /// Not a test of its own: this test binary, started by a pool with
    /// [`FAKE_WORKER`] set, acts a worker that takes that many milliseconds
    /// to start, and then waits for its link to close.
    #[test]
    fn fake_worker() {
        let Some(ms) = std::env::var(FAKE_WORKER).ok().and_then(|v| v.parse().ok()) else { return };
        std::thread::sleep(Duration::from_millis(ms));
        use std::os::fd::FromRawFd;
        // SAFETY: the pool put this process's link on LINK_FD.
        let link = Link::from_fd(unsafe { OwnedFd::from_raw_fd(LINK_FD) });
        let ready = link::Ready {
            pid: std::process::id(),
            backend: "fake".into(),
            driver_version: 0,
            devices: gpuplex_protocol::Seq(Vec::new()),
        };
        if link.send(Kind::Ready, &ready, &[]).is_ok() {
            while let Ok(Some(_)) = link.recv() {}
        }
        std::process::exit(0);
    }

    #[test]
    fn guests_that_come_together_wait_for_one_start_not_for_each_other_s() {
        const START: Duration = Duration::from_millis(400);
        let command = WorkerCommand {
            program: std::env::current_exe().expect("this test's executable"),
            args: ["--exact", "supervisor::pool::tests::fake_worker", "--nocapture"].map(OsString::from).into(),
            env: vec![(FAKE_WORKER.into(), START.as_millis().to_string().into())],
        };
        let (pool, ready) = Pool::start(command, 0).expect("the first fake worker starts");
        assert_eq!(ready.backend, "fake");
        let began = Instant::now();
        let guests: Vec<_> = (0..4)
            .map(|_| {
                let pool = pool.clone();
                std::thread::spawn(move || pool.take())
            })
            .collect();
        let workers: Vec<Worker> =
            guests.into_iter().map(|g| g.join().expect("no panic").expect("a worker for each guest")).collect();
        let took = began.elapsed();
        workers.into_iter().for_each(reap);
        // One idle worker, then three started one after another would take 3 x START.
        assert!(took < 2 * START, "4 guests got their workers in {took:?}");
    }

    /// In a child process, where the link may take LINK_FD itself: either
    /// way the descriptor is there afterwards and survives exec.
    #[test]
    fn the_link_survives_exec_even_on_link_fd_already() {
        for already in [true, false] {
            // SAFETY: the child calls only async-signal-safe functions and
            // leaves with _exit.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0);
            if pid == 0 {
                // SAFETY: the child's own descriptors.
                let ok = unsafe {
                    libc::close(LINK_FD);
                    let at = if already { LINK_FD } else { LINK_FD + 10 };
                    let fd = libc::fcntl(libc::STDERR_FILENO, libc::F_DUPFD_CLOEXEC, at);
                    fd >= 0
                        && (fd == LINK_FD) == already
                        && onto_link_fd(fd) == if already { 0 } else { LINK_FD }
                        && libc::fcntl(LINK_FD, libc::F_GETFD) == 0
                };
                // SAFETY: leaving the child without running the parent's handlers.
                unsafe { libc::_exit(if ok { 0 } else { 1 }) };
            }
            let mut status = 0;
            // SAFETY: our own child.
            assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
            assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "already on LINK_FD: {already}");
        }
    }
}
