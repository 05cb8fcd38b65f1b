//! What a tenant's sessions hold and do, in memory the supervisor and the
//! tenant's workers share.
//!
//! Each tenant has one [`Ledger`]: a sealed memfd holding its memory limit
//! and one [`Slot`] per live session. A worker writes only its own session's
//! slot (device memory charged, calls, contexts, GPU time), with
//! plain atomic stores and no round trip to the supervisor, which reads
//! every slot for `gpuplex status` and the metrics, and clears the slot of
//! a worker that died. Nothing else is kept about a session's usage, so a
//! worker killed at any instant leaves nothing to reconcile.
//!
//! The memory limit holds across processes without a lock: a worker first
//! adds what it wants to its own slot, then sums every slot of the tenant,
//! and takes the amount back if the sum is over the limit. With
//! sequentially consistent atomics, of two workers racing for the last
//! bytes at least one sees the other's reservation, so the tenant never
//! holds more than its limit; both may back off, and each then retries once.
//!
//! It also records the interprocess (IPC) handles the tenant's sessions
//! gave out, so that a session opens only its own tenant's: natively any
//! process that learns a handle may open it, but a handle of another
//! tenant's must not reach across the isolation between tenants.
//!
//! A ledger is shared only among one tenant's workers: a worker can at
//! worst misstate its own tenant's usage, never another tenant's.

use std::sync::atomic::Ordering::{Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Arc;

use gpuplex_protocol::{CallError, CuError};
use gpuplex_transport::shm::Region;

/// Slots in a ledger: the most sessions a tenant can have at once.
pub const SLOTS: usize = crate::MAX_SESSIONS;

/// One session's counters. A cache line each, so that workers counting
/// calls do not slow each other down.
#[repr(C, align(64))]
pub struct Slot {
    /// Device memory the session holds, charged against the tenant's limit.
    pub memory: AtomicU64,
    /// Calls the session has made.
    pub calls: AtomicU64,
    /// Live contexts.
    pub contexts: AtomicU32,
    /// GPU time the session's kernels and memsets took, and its copies
    /// (ns; see `sched::seat`).
    pub compute_ns: AtomicU64,
    pub copy_ns: AtomicU64,
    /// When the work the meter is waiting for was submitted (CLOCK_MONOTONIC
    /// ns), so that a long kernel shows as busy before it ends; 0: none.
    pub running_since: AtomicU64,
}

#[repr(C)]
struct Header {
    /// Bytes of device memory the tenant may hold; 0: no limit.
    limit: AtomicU64,
    /// Slots below this index may be in use (the supervisor hands out the
    /// lowest free one), so a sum reads only as many as there are sessions.
    high_water: AtomicU32,
}

/// The IPC handles a tenant gave out, the latest this many: an older one
/// is forgotten and no longer opens (programs open a handle soon after it
/// is made, and keep the mapping).
pub const IPC_HANDLES: usize = 1024;

/// A `CUipcMemHandle` or `CUipcEventHandle`.
pub type IpcHandle = [u8; 64];

#[repr(C)]
struct IpcRecord {
    /// How many handles were recorded, the next one's place modulo the ring.
    count: AtomicU64,
    handles: [[AtomicU64; 8]; IPC_HANDLES],
}

#[repr(C)]
struct Page {
    header: Header,
    slots: [Slot; SLOTS],
    ipc: IpcRecord,
}

/// A tenant's ledger, mapped.
pub struct Ledger {
    region: Region,
}

// The region is created zeroed, and zero is a valid value of every atomic.
const _: () = assert!(std::mem::align_of::<Page>() <= 4096);

impl Ledger {
    /// A new ledger (the supervisor's), with every slot free.
    pub fn create(tenant: &str, limit: u64) -> std::io::Result<Ledger> {
        let region = Region::create(&format!("gpuplex-ledger-{tenant}"), std::mem::size_of::<Page>())?;
        let ledger = Ledger { region };
        ledger.set_limit(limit);
        Ok(ledger)
    }

    /// A ledger passed by the supervisor (a worker's). Refuses a region of
    /// the wrong size.
    pub fn open(fd: std::os::fd::OwnedFd) -> std::io::Result<Ledger> {
        let region = Region::open(fd)?;
        if region.len() < std::mem::size_of::<Page>() {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "ledger region too small"));
        }
        Ok(Ledger { region })
    }

    fn page(&self) -> &Page {
        // SAFETY: the region is at least a `Page`, page-aligned, and lives as
        // long as `self`; every field is an atomic, valid for any bytes.
        unsafe { &*self.region.as_ptr().cast::<Page>() }
    }

    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.region.fd()
    }

    pub fn limit(&self) -> u64 {
        self.page().header.limit.load(SeqCst)
    }

    pub fn set_limit(&self, limit: u64) {
        self.page().header.limit.store(limit, SeqCst);
    }

    pub fn slot(&self, index: usize) -> &Slot {
        &self.page().slots[index]
    }

    /// Marks slot `index` in use (the supervisor's, before a worker gets it).
    pub fn claim(&self, index: usize) {
        let slot = self.slot(index);
        slot.memory.store(0, SeqCst);
        slot.calls.store(0, SeqCst);
        slot.contexts.store(0, SeqCst);
        slot.compute_ns.store(0, SeqCst);
        slot.copy_ns.store(0, SeqCst);
        slot.running_since.store(0, SeqCst);
        self.page().header.high_water.fetch_max(index as u32 + 1, SeqCst);
    }

    /// Frees slot `index` once its session's worker is gone: whatever it
    /// held stops counting against the tenant.
    pub fn release(&self, index: usize) {
        self.slot(index).memory.store(0, SeqCst);
        self.slot(index).running_since.store(0, SeqCst);
    }

    /// Lowers the high-water mark to just past the highest slot still used.
    pub fn shrink(&self, in_use: impl Iterator<Item = usize>) {
        let top = in_use.max().map_or(0, |i| i + 1);
        self.page().header.high_water.store(top as u32, SeqCst);
    }

    /// Records an IPC handle a session of the tenant gave out.
    pub fn record_ipc(&self, handle: &IpcHandle) {
        if self.gave_ipc(handle) {
            return;
        }
        let ipc = &self.page().ipc;
        let at = (ipc.count.fetch_add(1, SeqCst) % IPC_HANDLES as u64) as usize;
        for (word, bytes) in ipc.handles[at].iter().zip(handle.chunks_exact(8)) {
            word.store(u64::from_le_bytes(bytes.try_into().expect("8 bytes")), SeqCst);
        }
    }

    /// Whether a session of the tenant gave out `handle` (among the latest
    /// [`IPC_HANDLES`]). An all-zero handle is never one.
    pub fn gave_ipc(&self, handle: &IpcHandle) -> bool {
        if handle.iter().all(|&b| b == 0) {
            return false;
        }
        let words: Vec<u64> =
            handle.chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes"))).collect();
        let ipc = &self.page().ipc;
        let n = (ipc.count.load(SeqCst) as usize).min(IPC_HANDLES);
        ipc.handles[..n].iter().any(|h| h.iter().zip(&words).all(|(a, &b)| a.load(SeqCst) == b))
    }

    /// Device memory the tenant's sessions hold together.
    pub fn used(&self) -> u64 {
        let page = self.page();
        let n = (page.header.high_water.load(SeqCst) as usize).min(SLOTS);
        page.slots[..n].iter().map(|s| s.memory.load(SeqCst)).fold(0u64, u64::saturating_add)
    }
}

/// One session's slot in its tenant's ledger: what its worker charges
/// device memory to and counts in.
#[derive(Clone)]
pub struct Account {
    ledger: Arc<Ledger>,
    index: usize,
}

impl Account {
    pub fn new(ledger: Arc<Ledger>, index: usize) -> Account {
        assert!(index < SLOTS, "slot {index} of {SLOTS}");
        Account { ledger, index }
    }

    pub fn slot(&self) -> &Slot {
        self.ledger.slot(self.index)
    }

    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// What this session holds.
    pub fn held(&self) -> u64 {
        self.slot().memory.load(SeqCst)
    }

    /// Takes `bytes` of the tenant's memory for this session, or refuses
    /// with `CUDA_ERROR_OUT_OF_MEMORY` if the tenant would exceed its limit.
    pub fn charge(&self, bytes: u64) -> Result<(), CallError> {
        let memory = &self.slot().memory;
        if self.ledger.limit() == 0 {
            // Nothing to check against: only the supervisor reads this.
            memory.store(memory.load(Relaxed).saturating_add(bytes), Release);
            return Ok(());
        }
        for attempt in 0..2 {
            let mine = memory.load(SeqCst).saturating_add(bytes);
            memory.store(mine, SeqCst);
            let limit = self.ledger.limit();
            let used = if limit == 0 { 0 } else { self.ledger.used() };
            if used <= limit || limit == 0 {
                return Ok(());
            }
            memory.store(mine - bytes, SeqCst);
            if attempt == 0 {
                // Another session of the tenant may be backing off too.
                std::thread::yield_now();
            } else {
                let others = used.saturating_sub(mine);
                return Err(CallError::new(
                    CuError::OUT_OF_MEMORY,
                    format!(
                        "the tenant's memory limit of {limit} bytes: this session holds {} and others {others}; \
                         {bytes} more do not fit",
                        mine - bytes
                    ),
                ));
            }
        }
        unreachable!("the loop returns on its last attempt")
    }

    /// Records that the session holds exactly `bytes`: what its tables say
    /// after a call, whatever the call charged beforehand or freed.
    pub fn settle(&self, bytes: u64) {
        // What a charge published stays at least as large until the memory
        // is freed, so lowering it needs no more order than this.
        let memory = &self.slot().memory;
        if memory.load(Relaxed) != bytes {
            memory.store(bytes, Release);
        }
    }

    /// The tenant's limit (0: none) and what all its sessions hold.
    pub fn tenant_usage(&self) -> (u64, u64) {
        (self.ledger.limit(), self.ledger.used())
    }

    /// Counts one call. Only the session's own thread counts, so a plain
    /// load and store do (a locked add costs the launch path measurably).
    pub fn count_call(&self) {
        let calls = &self.slot().calls;
        calls.store(calls.load(Relaxed) + 1, Relaxed);
    }

    pub fn set_contexts(&self, n: u32) {
        let contexts = &self.slot().contexts;
        if contexts.load(Relaxed) != n {
            contexts.store(n, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(limit: u64, sessions: usize) -> Vec<Account> {
        let ledger = Arc::new(Ledger::create("t", limit).unwrap());
        (0..sessions)
            .map(|i| {
                ledger.claim(i);
                Account::new(ledger.clone(), i)
            })
            .collect()
    }

    #[test]
    fn a_limit_holds_across_sessions_and_refunds_free_it() {
        let s = tenant(1000, 2);
        s[0].charge(600).unwrap();
        assert_eq!(s[1].charge(500).unwrap_err().code, CuError::OUT_OF_MEMORY);
        assert_eq!(s[1].held(), 0, "a refused charge takes nothing");
        s[1].charge(400).unwrap();
        assert_eq!(s[0].tenant_usage(), (1000, 1000));
        s[0].settle(0);
        s[1].charge(600).unwrap();
        assert_eq!(s[1].held(), 1000);
    }

    #[test]
    fn no_limit_takes_anything() {
        let s = tenant(0, 1);
        s[0].charge(u64::MAX / 2).unwrap();
        s[0].charge(u64::MAX / 2).unwrap();
        assert_eq!(s[0].tenant_usage().1, u64::MAX - 1);
    }

    #[test]
    fn a_released_slot_stops_counting_and_the_limit_can_change() {
        let s = tenant(100, 2);
        s[0].charge(100).unwrap();
        assert!(s[1].charge(1).is_err());
        s[0].ledger().release(0);
        s[1].charge(100).unwrap();
        s[0].ledger().set_limit(50);
        assert!(s[1].charge(1).is_err(), "over a lowered limit nothing more is granted");
        s[1].settle(40);
        s[1].charge(10).unwrap();
    }

    #[test]
    fn racing_sessions_never_exceed_the_limit() {
        const LIMIT: u64 = 1 << 20;
        let sessions = tenant(LIMIT, 8);
        let granted: u64 = std::thread::scope(|scope| {
            let workers: Vec<_> = sessions
                .iter()
                .map(|account| {
                    scope.spawn(move || {
                        let mut mine = 0;
                        for _ in 0..10_000 {
                            if account.charge(4096).is_ok() {
                                mine += 4096;
                            }
                        }
                        mine
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        });
        assert!(granted <= LIMIT, "granted {granted} of {LIMIT}");
        assert_eq!(granted, sessions[0].tenant_usage().1);
        assert!(granted >= LIMIT - 8 * 4096, "only {granted} of {LIMIT} granted: backed off for good");
    }

    #[test]
    fn a_tenant_opens_only_the_ipc_handles_it_gave_out_lately() {
        let (ours, theirs) = (tenant(0, 1), tenant(0, 1));
        let handle = |n: u64| {
            let mut h = [0u8; 64];
            h[..8].copy_from_slice(&n.to_le_bytes());
            h[63] = 1;
            h
        };
        ours[0].ledger().record_ipc(&handle(1));
        assert!(ours[0].ledger().gave_ipc(&handle(1)));
        assert!(!theirs[0].ledger().gave_ipc(&handle(1)), "another tenant's");
        assert!(!ours[0].ledger().gave_ipc(&handle(2)));
        assert!(!ours[0].ledger().gave_ipc(&[0; 64]), "an empty handle");
        ours[0].ledger().record_ipc(&handle(1));
        for n in 2..=IPC_HANDLES as u64 {
            ours[0].ledger().record_ipc(&handle(n));
        }
        assert!(ours[0].ledger().gave_ipc(&handle(1)), "recorded once, still among the latest");
        ours[0].ledger().record_ipc(&handle(IPC_HANDLES as u64 + 1));
        assert!(!ours[0].ledger().gave_ipc(&handle(1)), "the oldest forgotten");
        assert!(ours[0].ledger().gave_ipc(&handle(2)));
    }

    #[test]
    fn a_worker_sees_what_the_supervisor_set() {
        let ledger = Ledger::create("shared", 7).unwrap();
        ledger.claim(3);
        let fd = ledger.fd().try_clone_to_owned().unwrap();
        let worker = Arc::new(Ledger::open(fd).unwrap());
        let account = Account::new(worker, 3);
        account.charge(5).unwrap();
        assert_eq!(ledger.used(), 5);
        assert!(account.charge(3).is_err());
        ledger.set_limit(8);
        account.charge(3).unwrap();
    }
}
