//! The supervisor's book of live sessions and of the tenants they belong
//! to: who each session is, where it runs, where its lanes go, and each
//! tenant's [`Ledger`], in which the session's worker counts what it holds
//! and does.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use gpuplex_transport::Peer;

use super::tenancy::Plan;
use crate::ledger::{Account, Ledger, SLOTS};
use crate::sched::{board, Board, Class, Sharing};
use crate::session::lanes::{random_key, LaneKey};
use crate::worker::link::Link;

/// Where a session runs, and so where its lanes are sent.
#[derive(Clone)]
pub enum Route {
    /// Not placed yet.
    Pending,
    /// In a worker process, reached over its link.
    Worker(Arc<Link>),
    /// On a thread of the supervisor's own process.
    InProcess,
}

/// One live session.
#[derive(Clone)]
pub struct SessionEntry {
    pub id: u64,
    pub tenant: String,
    pub slot: usize,
    /// Its seat on the scheduling board.
    pub seat: usize,
    /// Its tenant's row on the board.
    pub row: usize,
    pub peer: Peer,
    pub program: String,
    /// The process serving it (the supervisor's own for in-process ones; 0
    /// until it is placed).
    pub worker_pid: u32,
    /// For a spatial session, the GPU whose MPS server it is a client of.
    pub mps_gpu: Option<usize>,
    pub started: Instant,
    pub lane_key: LaneKey,
    pub route: Route,
}

/// One tenant that has had a session since the server started.
pub struct TenantEntry {
    pub ledger: Arc<Ledger>,
    pub weight: u32,
    pub class: Class,
    /// How its new sessions share a GPU.
    pub sharing: Sharing,
    /// Its row on the scheduling board, for as long as the server runs.
    pub row: usize,
    /// Slots of the ledger its live sessions use.
    slots: BTreeSet<usize>,
    /// Calls of its sessions that have ended.
    pub ended_calls: u64,
}

#[derive(Default)]
struct Book {
    sessions: BTreeMap<u64, SessionEntry>,
    tenants: BTreeMap<String, TenantEntry>,
    lanes: HashMap<LaneKey, u64>,
    /// Board seats of live sessions.
    seats: BTreeSet<usize>,
}

pub struct Registry {
    next_id: AtomicU64,
    book: Mutex<Book>,
    /// Notified when the last session closes.
    emptied: Condvar,
    board: Arc<Board>,
}

/// A tenant as [`Registry::tenants`] lists it.
pub struct TenantView {
    pub name: String,
    pub ledger: Arc<Ledger>,
    pub weight: u32,
    pub class: Class,
    pub sharing: Sharing,
    pub row: usize,
    /// Live sessions.
    pub sessions: usize,
    /// Calls of its sessions that have ended.
    pub ended_calls: u64,
}

/// Closes a session when dropped, so that no way out of serving it (a
/// panic included) leaves it listed.
pub struct Closing<'a>(pub &'a Registry, pub u64);

impl Drop for Closing<'_> {
    fn drop(&mut self) {
        self.0.close(self.1);
    }
}

/// Why a session could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("tenant {0} has {SLOTS} sessions already")]
    Full(String),
    #[error("the server has {} sessions already", board::SEATS)]
    NoSeat,
    #[error("the server has seen {} tenants since it started", board::TENANTS)]
    NoRow,
    #[error("cannot set up the tenant's ledger: {0}")]
    Ledger(std::io::Error),
}

impl Registry {
    pub fn new(board: Arc<Board>) -> Registry {
        Registry { next_id: AtomicU64::new(0), book: Mutex::default(), emptied: Condvar::new(), board }
    }

    pub fn board(&self) -> &Arc<Board> {
        &self.board
    }

    fn lock(&self) -> MutexGuard<'_, Book> {
        // A panicking thread must not take status down with it.
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens a session of `plan`'s tenant: its id, its account (a slot of
    /// the tenant's ledger) and its lane key.
    pub fn open(&self, plan: &Plan, peer: Peer, program: String) -> Result<SessionEntry, OpenError> {
        let lane_key = random_key().map_err(OpenError::Ledger)?;
        let mut book = self.lock();
        if !book.tenants.contains_key(&plan.tenant) {
            let row = book.tenants.len();
            if row >= board::TENANTS {
                return Err(OpenError::NoRow);
            }
            let ledger = Ledger::create(&plan.tenant, plan.memory_limit).map_err(OpenError::Ledger)?;
            self.board.set_tenant(row, plan.weight, plan.class);
            let entry = TenantEntry {
                ledger: Arc::new(ledger),
                weight: plan.weight,
                class: plan.class,
                sharing: plan.sharing,
                row,
                slots: BTreeSet::new(),
                ended_calls: 0,
            };
            book.tenants.insert(plan.tenant.clone(), entry);
        }
        let seat = (0..board::SEATS).find(|s| !book.seats.contains(s)).ok_or(OpenError::NoSeat)?;
        let tenant = book.tenants.get_mut(&plan.tenant).expect("inserted above");
        let slot =
            (0..SLOTS).find(|s| !tenant.slots.contains(s)).ok_or_else(|| OpenError::Full(plan.tenant.clone()))?;
        tenant.slots.insert(slot);
        tenant.ledger.claim(slot);
        let row = tenant.row;
        book.seats.insert(seat);
        self.board.occupy(seat, row);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let entry = SessionEntry {
            id,
            tenant: plan.tenant.clone(),
            slot,
            seat,
            row,
            peer,
            program,
            worker_pid: 0,
            mps_gpu: None,
            started: Instant::now(),
            lane_key,
            route: Route::Pending,
        };
        book.lanes.insert(lane_key, id);
        book.sessions.insert(id, entry.clone());
        Ok(entry)
    }

    /// The session's account in its tenant's ledger.
    pub fn account(&self, session: &SessionEntry) -> Account {
        let book = self.lock();
        let ledger = book.tenants[&session.tenant].ledger.clone();
        Account::new(ledger, session.slot)
    }

    /// The ledger of a tenant that has had sessions.
    pub fn ledger(&self, tenant: &str) -> Option<Arc<Ledger>> {
        self.lock().tenants.get(tenant).map(|t| t.ledger.clone())
    }

    /// Records where a session runs.
    pub fn placed(&self, id: u64, route: Route, worker_pid: u32, mps_gpu: Option<usize>) {
        if let Some(s) = self.lock().sessions.get_mut(&id) {
            s.route = route;
            s.worker_pid = worker_pid;
            s.mps_gpu = mps_gpu;
        }
    }

    /// Of `gpus`, the one with the fewest spatial sessions.
    pub fn least_spatial(&self, gpus: &[i32]) -> Option<usize> {
        let book = self.lock();
        let on = |g: usize| book.sessions.values().filter(|s| s.mps_gpu == Some(g)).count();
        gpus.iter().filter_map(|&g| usize::try_from(g).ok()).min_by_key(|&g| on(g))
    }

    /// The live session whose lanes present `key`.
    pub fn by_lane_key(&self, key: &LaneKey) -> Option<SessionEntry> {
        let book = self.lock();
        book.lanes.get(key).and_then(|id| book.sessions.get(id)).cloned()
    }

    /// Forgets a session whose worker is gone: what it held stops counting
    /// against its tenant, and its lane key opens nothing any more.
    pub fn close(&self, id: u64) {
        let mut book = self.lock();
        let Some(s) = book.sessions.remove(&id) else { return };
        book.lanes.remove(&s.lane_key);
        self.board.vacate(s.seat);
        book.seats.remove(&s.seat);
        if let Some(tenant) = book.tenants.get_mut(&s.tenant) {
            tenant.ended_calls += tenant.ledger.slot(s.slot).calls.load(Ordering::Relaxed);
            tenant.ledger.release(s.slot);
            tenant.slots.remove(&s.slot);
            tenant.ledger.shrink(tenant.slots.iter().copied());
        }
        if book.sessions.is_empty() {
            self.emptied.notify_all();
        }
    }

    /// Applies a reloaded configuration's settings to a tenant already
    /// known (live sessions keep their tenant).
    pub fn update_tenant(&self, plan: &Plan) {
        if let Some(t) = self.lock().tenants.get_mut(&plan.tenant) {
            t.ledger.set_limit(plan.memory_limit);
            t.weight = plan.weight;
            t.class = plan.class;
            t.sharing = plan.sharing;
            self.board.set_tenant(t.row, plan.weight, plan.class);
        }
    }

    /// Every live session, by id.
    pub fn sessions(&self) -> Vec<SessionEntry> {
        self.lock().sessions.values().cloned().collect()
    }

    /// Every tenant that has had a session.
    pub fn tenants(&self) -> Vec<TenantView> {
        self.lock()
            .tenants
            .iter()
            .map(|(name, t)| TenantView {
                name: name.clone(),
                ledger: t.ledger.clone(),
                weight: t.weight,
                class: t.class,
                sharing: t.sharing,
                row: t.row,
                sessions: t.slots.len(),
                ended_calls: t.ended_calls,
            })
            .collect()
    }

    pub fn len(&self) -> usize {
        self.lock().sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until no session is live, or for `at_most`; whether none is.
    pub fn wait_empty(&self, at_most: Duration) -> bool {
        let book = self.lock();
        let (book, _) = self
            .emptied
            .wait_timeout_while(book, at_most, |b| !b.sessions.is_empty())
            .unwrap_or_else(PoisonError::into_inner);
        book.sessions.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(tenant: &str) -> Plan {
        Plan {
            tenant: tenant.into(),
            memory_limit: 0,
            weight: 1,
            class: Class::Normal,
            devices: vec![0],
            sharing: Sharing::Isolated,
            active_threads: None,
        }
    }

    fn registry() -> Registry {
        Registry::new(Arc::new(Board::create(crate::sched::Policy::Fair, crate::sched::DEFAULT_SLICE).unwrap()))
    }

    #[test]
    fn a_panic_while_serving_leaves_no_session_behind() {
        let registry = registry();
        let peer = Peer::Local { pid: 1, uid: 2, gid: 3 };
        let session = registry.open(&plan("t"), peer, "p".into()).unwrap();
        let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _open = Closing(&registry, session.id);
            panic!("a bug while serving");
        }));
        assert!(served.is_err());
        assert!(registry.is_empty());
        assert!(registry.by_lane_key(&session.lane_key).is_none());
    }

    #[test]
    fn a_wait_for_no_sessions_ends_when_the_last_closes_or_at_its_limit() {
        let registry = Arc::new(registry());
        let peer = Peer::Local { pid: 1, uid: 2, gid: 3 };
        let (a, b) = (
            registry.open(&plan("t"), peer, "a".into()).unwrap(),
            registry.open(&plan("u"), peer, "b".into()).unwrap(),
        );
        assert!(!registry.wait_empty(Duration::from_millis(20)), "two sessions live");
        let closer = registry.clone();
        let closing = std::thread::spawn(move || {
            closer.close(a.id);
            std::thread::sleep(Duration::from_millis(50));
            closer.close(b.id);
        });
        let began = Instant::now();
        assert!(registry.wait_empty(Duration::from_secs(30)));
        assert!(began.elapsed() < Duration::from_secs(10), "woken by the close, not the limit");
        closing.join().unwrap();
    }

    #[test]
    fn slots_are_reused_and_usage_of_closed_sessions_stops_counting() {
        let registry = registry();
        let peer = Peer::Local { pid: 1, uid: 2, gid: 3 };
        let a = registry.open(&plan("t"), peer, "a".into()).unwrap();
        let b = registry.open(&plan("t"), peer, "b".into()).unwrap();
        assert_ne!(a.slot, b.slot);
        registry.account(&a).charge(100).unwrap();
        registry.account(&b).charge(10).unwrap();
        assert_eq!(registry.ledger("t").unwrap().used(), 110);
        registry.close(a.id);
        assert_eq!(registry.ledger("t").unwrap().used(), 10);
        let c = registry.open(&plan("t"), peer, "c".into()).unwrap();
        assert_eq!(c.slot, a.slot, "the lowest free slot is reused");
        assert_eq!(registry.account(&c).held(), 0);
    }
}
