//! The board: who holds each GPU and who waits for it, in memory the
//! supervisor and every worker share.
//!
//! Each GPU has one holder at a time, a session's seat; a session submits
//! work that the policy gates only while it holds that GPU. A session that
//! wants a GPU another holds marks itself waiting and sleeps on the GPU's
//! futex word. The holder (or, for a holder whose worker died, the
//! supervisor) gives the GPU up by choosing the next holder among the
//! waiters ([`Board::release`]), so the policy is applied in one place and
//! no waiter races another for it. A GPU nobody holds is taken with one
//! compare-and-swap, which is all an uncontended session ever pays.
//!
//! Rows are written by the processes they describe (a seat's by its
//! worker; a tenant's weight and class by the supervisor; its GPU time by
//! its workers' meters), with plain atomics: a worker killed at any instant
//! leaves at worst a stale claim, which the supervisor clears when it reaps
//! the worker ([`Board::vacate`]).

use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::Duration;

use gpuplex_transport::shm::{futex_wait, futex_wake_all, Region};
use tracing::trace;

use super::{now_ns, Class, Policy};

/// GPUs a board schedules: ordinals at or above it run unscheduled.
pub const MAX_GPUS: usize = 16;
/// Seats: one per live session.
pub const SEATS: usize = crate::MAX_SESSIONS;
/// Tenant rows: one per tenant the server has seen since it started.
pub const TENANTS: usize = crate::MAX_SESSIONS;

/// A waiter that has waited this many slices goes before every waiter
/// that has not, whatever the classes: strict priority alone would let a
/// busy high-priority tenant starve every other one for as long as it runs.
pub const STARVATION_SLICES: u32 = 100;

/// How long a waiter told it is next ([`Board::heads_up`]) spins for its
/// turn before it sleeps again: the holder's last work is a kernel or a
/// few, and a turn that takes longer to come is worth a core no more.
const HEADS_UP_SPIN: Duration = Duration::from_millis(2);

/// Virtual time advances by GPU nanoseconds times this over the tenant's
/// weight, so that weights up to `MAX_WEIGHT` divide it evenly enough.
const VTIME_SCALE: u64 = crate::config::MAX_WEIGHT as u64;

#[repr(C)]
struct Header {
    policy: AtomicU32,
    /// How long a holder keeps a GPU others wait for, in microseconds.
    slice_us: AtomicU32,
    /// Seats below this index may be in use, so a scan stops there.
    high_water: AtomicU32,
}

/// One GPU's turn-taking.
#[repr(C, align(64))]
pub struct Gpu {
    /// The holding seat + 1; 0 when nobody holds the GPU.
    holder: AtomicU32,
    /// Bumped at every change of holder; waiters sleep on it.
    turn: AtomicU32,
    /// Waiters of each class ([`Class`] as index).
    waiting: [AtomicU32; 3],
    /// When the holder took the GPU (CLOCK_MONOTONIC, ns).
    since: AtomicU64,
    /// The waiter chosen to hold the GPU next (its seat + 1), told while
    /// the holder's last work drains so that it is awake when its turn
    /// comes ([`Board::heads_up`]); 0 when none is.
    next: AtomicU32,
    /// The GPU's virtual time: that of each holder as it took the GPU
    /// (the least of those that wanted it), and as it was charged while
    /// nobody else wanted it; never going back. A tenant that begins to
    /// want the GPU is brought up to a slice behind it ([`Board::arrive`]),
    /// so it banks little credit by idling and pays nothing for time others
    /// had alone.
    clock: AtomicU64,
}

impl Gpu {
    /// Waiters of every class.
    pub fn waiting_total(&self) -> u32 {
        self.waiting.iter().map(|w| w.load(Relaxed)).sum()
    }
}

/// A session's seat.
#[repr(C, align(64))]
struct Seat {
    /// Its tenant's row + 1; 0 while the seat is free.
    tenant: AtomicU32,
    /// The GPUs it waits for, a bit each.
    wants: AtomicU32,
    /// The class it waits in (its tenant's may change meanwhile).
    class: AtomicU32,
    /// When it began waiting (ns): first come, first served under `fifo`
    /// and between equals otherwise.
    ticket: AtomicU64,
}

/// A tenant's share and what it has used.
#[repr(C, align(64))]
pub struct TenantRow {
    pub weight: AtomicU32,
    pub class: AtomicU32,
    /// GPU nanoseconds scaled by `VTIME_SCALE / weight`, per GPU.
    vtime: [AtomicU64; MAX_GPUS],
    /// GPU time its work took on each GPU, kernels and memsets (ns).
    pub compute_ns: [AtomicU64; MAX_GPUS],
    /// GPU time its copies took on each GPU (ns).
    pub copy_ns: [AtomicU64; MAX_GPUS],
}

#[repr(C)]
struct Page {
    header: Header,
    gpus: [Gpu; MAX_GPUS],
    seats: [Seat; SEATS],
    tenants: [TenantRow; TENANTS],
}

/// How work a session submits counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// Kernels and memsets: the compute engines.
    Compute,
    /// Copies: the copy engines.
    Copy,
}

/// The board, mapped.
pub struct Board {
    region: Region,
}

// The region is created zeroed, and zero is a valid value of every atomic.
const _: () = assert!(std::mem::align_of::<Page>() <= 4096);

impl Board {
    /// A new board (the supervisor's).
    pub fn create(policy: Policy, slice: Duration) -> std::io::Result<Board> {
        let board = Board { region: Region::create("gpuplex-board", std::mem::size_of::<Page>())? };
        board.set_policy(policy, slice);
        Ok(board)
    }

    /// A board passed by the supervisor (a worker's). Refuses a region of
    /// the wrong size.
    pub fn open(fd: std::os::fd::OwnedFd) -> std::io::Result<Board> {
        let region = Region::open(fd)?;
        if region.len() < std::mem::size_of::<Page>() {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "board region too small"));
        }
        Ok(Board { region })
    }

    fn page(&self) -> &Page {
        // SAFETY: the region is at least a `Page`, page-aligned, and lives as
        // long as `self`; every field is an atomic, valid for any bytes.
        unsafe { &*self.region.as_ptr().cast::<Page>() }
    }

    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.region.fd()
    }

    pub fn policy(&self) -> Policy {
        Policy::from_u32(self.page().header.policy.load(Relaxed))
    }

    pub fn slice(&self) -> Duration {
        Duration::from_micros(self.page().header.slice_us.load(Relaxed) as u64)
    }

    pub fn set_policy(&self, policy: Policy, slice: Duration) {
        let header = &self.page().header;
        header.slice_us.store(slice.as_micros().min(u32::MAX as u128) as u32, Relaxed);
        header.policy.store(policy as u32, SeqCst);
    }

    pub fn gpu(&self, gpu: usize) -> &Gpu {
        &self.page().gpus[gpu]
    }

    pub fn tenant(&self, row: usize) -> &TenantRow {
        &self.page().tenants[row]
    }

    /// Sets a tenant's share (the supervisor's, at its first session and
    /// at every reload).
    pub fn set_tenant(&self, row: usize, weight: u32, class: Class) {
        let t = self.tenant(row);
        t.weight.store(weight.max(1), Relaxed);
        t.class.store(class as u32, Relaxed);
    }

    /// Gives seat `seat` to a session of the tenant in `row`.
    pub fn occupy(&self, seat: usize, row: usize) {
        let s = &self.page().seats[seat];
        s.wants.store(0, SeqCst);
        s.tenant.store(row as u32 + 1, SeqCst);
        self.page().header.high_water.fetch_max(seat as u32 + 1, SeqCst);
    }

    /// Frees a seat whose session is gone, giving up whatever GPU it held
    /// or waited for.
    pub fn vacate(&self, seat: usize) {
        let s = &self.page().seats[seat];
        for gpu in 0..MAX_GPUS {
            if s.wants.load(SeqCst) & (1 << gpu) != 0 {
                self.stop_waiting(gpu, seat);
            }
            if self.holds(gpu, seat) {
                self.release(gpu, seat);
            }
        }
        s.tenant.store(0, SeqCst);
    }

    /// Frees a seat and nothing else, as a worker killed between the
    /// supervisor's clean-up and its own release would leave it.
    #[cfg(test)]
    pub fn forget_seat(&self, seat: usize) {
        self.page().seats[seat].tenant.store(0, SeqCst);
    }

    pub fn holds(&self, gpu: usize, seat: usize) -> bool {
        self.gpu(gpu).holder.load(SeqCst) == seat as u32 + 1
    }

    /// Takes `gpu` if nobody holds it.
    pub fn try_take(&self, gpu: usize, seat: usize) -> bool {
        let g = self.gpu(gpu);
        let taken = g.holder.compare_exchange(0, seat as u32 + 1, SeqCst, SeqCst).is_ok();
        if taken {
            g.since.store(now_ns(), Relaxed);
            self.arrive(gpu, seat);
            self.follow(gpu, seat);
        }
        taken
    }

    /// Brings the virtual time of seat `seat`'s tenant, which begins to
    /// want `gpu`, up to a slice behind the GPU's clock: time it did not
    /// want the GPU banks at most a slice of credit, and time others had it
    /// alone costs it nothing. The slice kept is what a busy tenant that
    /// paused between two kernels, and lost its turn for it, is owed.
    fn arrive(&self, gpu: usize, seat: usize) {
        if let Some(row) = self.row_of(seat) {
            let credit = (self.slice().as_nanos() as u64).saturating_mul(VTIME_SCALE);
            let floor = self.gpu(gpu).clock.load(SeqCst).saturating_sub(credit);
            self.tenant(row).vtime[gpu].fetch_max(floor, SeqCst);
        }
    }

    /// Moves `gpu`'s clock up to the virtual time of seat `seat`, its new holder.
    fn follow(&self, gpu: usize, seat: usize) {
        if let Some(row) = self.row_of(seat) {
            self.gpu(gpu).clock.fetch_max(self.tenant(row).vtime[gpu].load(SeqCst), SeqCst);
        }
    }

    /// Waiters of a class above `class` on `gpu`, and waiters at all.
    pub fn waiters(&self, gpu: usize, class: Class) -> (bool, bool) {
        let w = &self.gpu(gpu).waiting;
        let above = (class as usize + 1..3).any(|c| w[c].load(Relaxed) > 0);
        (above, above || (0..=class as usize).any(|c| w[c].load(Relaxed) > 0))
    }

    /// How long the holder of `gpu` has held it.
    pub fn held_for(&self, gpu: usize) -> Duration {
        Duration::from_nanos(now_ns().saturating_sub(self.gpu(gpu).since.load(Relaxed)))
    }

    /// Waits until seat `seat` holds `gpu`.
    pub fn wait_turn(&self, gpu: usize, seat: usize) {
        let (g, s) = (self.gpu(gpu), &self.page().seats[seat]);
        let class = self.class_of(seat);
        self.arrive(gpu, seat);
        s.ticket.store(now_ns(), SeqCst);
        s.class.store(class as u32, SeqCst);
        g.waiting[class as usize].fetch_add(1, SeqCst);
        s.wants.fetch_or(1 << gpu, SeqCst);
        let mut spun = Duration::ZERO;
        loop {
            let seen = g.turn.load(SeqCst);
            if self.holds(gpu, seat) || self.try_take(gpu, seat) {
                break;
            }
            // A holder whose seat was freed (its worker died before or
            // while the supervisor cleaned up) gives the GPU up here.
            if let Some(h) = self.holder(gpu).filter(|&h| self.row_of(h).is_none()) {
                self.release(gpu, h);
                continue;
            }
            if g.next.load(SeqCst) == seat as u32 + 1 && spun < HEADS_UP_SPIN {
                let start = std::time::Instant::now();
                while g.turn.load(SeqCst) == seen && start.elapsed() < HEADS_UP_SPIN - spun {
                    std::hint::spin_loop();
                }
                spun += start.elapsed();
                continue;
            }
            // The turn word changes with every holder; the timeout only
            // bounds a wake-up lost to a process that died mid-release.
            futex_wait(&g.turn, seen, Duration::from_millis(20));
        }
        self.stop_waiting(gpu, seat);
    }

    /// Wakes the waiter that will hold `gpu` after seat `seat`, which is
    /// about to wait for its last work to finish: the waiter then spins
    /// for its turn instead of being woken when the work is done, which on
    /// a virtual machine costs tens of microseconds more of an idle GPU.
    pub fn heads_up(&self, gpu: usize, seat: usize) {
        let g = self.gpu(gpu);
        if let Some(n) = self.next_holder(gpu, Some(seat)) {
            g.next.store(n as u32 + 1, SeqCst);
            g.turn.fetch_add(1, SeqCst);
            futex_wake_all(&g.turn);
        }
    }

    /// The waiter last told it holds `gpu` next, until the GPU changes hands.
    #[cfg(test)]
    pub fn told_next(&self, gpu: usize) -> Option<usize> {
        (self.gpu(gpu).next.load(SeqCst) as usize).checked_sub(1)
    }

    fn stop_waiting(&self, gpu: usize, seat: usize) {
        let s = &self.page().seats[seat];
        if s.wants.fetch_and(!(1 << gpu), SeqCst) & (1 << gpu) != 0 {
            self.gpu(gpu).waiting[s.class.load(SeqCst).min(2) as usize].fetch_sub(1, SeqCst);
        }
    }

    /// Gives up `gpu`, which seat `seat` holds, to the waiter the policy
    /// puts first, or to nobody.
    pub fn release(&self, gpu: usize, seat: usize) {
        let g = self.gpu(gpu);
        let next = self.next_holder(gpu, Some(seat));
        let to = next.map_or(0, |n| n as u32 + 1);
        if g.holder.compare_exchange(seat as u32 + 1, to, SeqCst, SeqCst).is_err() {
            return;
        }
        trace!(gpu, from = seat, to = ?next, held = ?self.held_for(gpu), "turn released");
        g.next.store(0, SeqCst);
        if let Some(n) = next {
            g.since.store(now_ns(), Relaxed);
            self.follow(gpu, n);
        }
        g.turn.fetch_add(1, SeqCst);
        futex_wake_all(&g.turn);
    }

    /// Starts the turn of seat `seat`, which holds `gpu`, over if it goes
    /// before every waiter as if it began waiting now; returns whether it did.
    pub fn keep_turn(&self, gpu: usize, seat: usize) -> bool {
        let Some(next) = self.next_holder(gpu, None) else { return true };
        let mine = self.row_of(seat).map(|row| self.key_on(gpu, row, now_ns()));
        let keeps = match (mine, self.row_of(next)) {
            (Some(mine), Some(row)) => mine <= self.key_on(gpu, row, self.page().seats[next].ticket.load(SeqCst)),
            _ => false,
        };
        if keeps {
            self.gpu(gpu).since.store(now_ns(), Relaxed);
        }
        keeps
    }

    /// The waiter on `gpu` that goes first, `except` aside.
    fn next_holder(&self, gpu: usize, except: Option<usize>) -> Option<usize> {
        let page = self.page();
        let n = (page.header.high_water.load(SeqCst) as usize).min(SEATS);
        let mut best: Option<(usize, (u32, u64, u64))> = None;
        for (i, s) in page.seats[..n].iter().enumerate() {
            if Some(i) == except || s.wants.load(SeqCst) & (1 << gpu) == 0 {
                continue;
            }
            let Some(row) = self.row_of(i) else { continue };
            let key = self.key_on(gpu, row, s.ticket.load(SeqCst));
            if best.is_none_or(|(_, k)| key < k) {
                best = Some((i, key));
            }
        }
        best.map(|(i, _)| i)
    }

    /// Who goes first, lowest first: a waiter that has waited
    /// [`STARVATION_SLICES`] (the longest waiting first), then the class
    /// (descending), then the virtual time (not under `fifo`), then when it
    /// began waiting.
    fn key_on(&self, gpu: usize, row: usize, ticket: u64) -> (u32, u64, u64) {
        let bound = self.slice().saturating_mul(STARVATION_SLICES).as_nanos() as u64;
        if now_ns().saturating_sub(ticket) >= bound {
            return (0, 0, ticket);
        }
        let t = self.tenant(row);
        let vtime = if self.policy() == Policy::Fifo { 0 } else { t.vtime[gpu].load(SeqCst) };
        (3 - t.class.load(Relaxed).min(2), vtime, ticket)
    }

    fn row_of(&self, seat: usize) -> Option<usize> {
        match self.page().seats[seat].tenant.load(SeqCst) {
            0 => None,
            r => Some(r as usize - 1),
        }
    }

    pub fn class_of(&self, seat: usize) -> Class {
        self.row_of(seat).map_or(Class::Normal, |r| Class::from_u32(self.tenant(r).class.load(Relaxed)))
    }

    /// Counts `ns` of GPU time on `gpu` to the tenant in `row`, and to its
    /// virtual time where the policy says this kind of work counts.
    pub fn charge(&self, row: usize, gpu: usize, work: Work, ns: u64) {
        let t = self.tenant(row);
        match work {
            Work::Compute => t.compute_ns[gpu].fetch_add(ns, Relaxed),
            Work::Copy => t.copy_ns[gpu].fetch_add(ns, Relaxed),
        };
        if work == Work::Compute || self.policy() == Policy::Band {
            let weight = t.weight.load(Relaxed).max(1) as u64;
            let step = ns.saturating_mul(VTIME_SCALE) / weight;
            let vtime = t.vtime[gpu].fetch_add(step, SeqCst).saturating_add(step);
            let alone = self.gpu(gpu).waiting_total() == 0;
            if alone && self.holder(gpu).and_then(|h| self.row_of(h)) == Some(row) {
                self.gpu(gpu).clock.fetch_max(vtime, SeqCst);
            }
        }
    }

    /// The seat holding `gpu`, if any.
    pub fn holder(&self, gpu: usize) -> Option<usize> {
        match self.gpu(gpu).holder.load(SeqCst) {
            0 => None,
            h => Some(h as usize - 1),
        }
    }
}
