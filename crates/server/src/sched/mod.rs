//! GPU time between tenants: measuring it, and dividing it by policy.
//!
//! The driver time-slices a GPU among the processes that have work on it,
//! equally and without regard to who they belong to. gpuplex divides it
//! by holding work back instead: on each GPU one session at a time holds
//! the *turn* ([`board`]), and a session that submits kernels (or, under
//! `band`, copies) to a GPU it does not hold waits for its turn in the
//! worker, before the work reaches the driver. A guest cannot get around
//! that: its calls reach the GPU only through its worker.
//!
//! - **Measuring** ([`seat`]): each session's meter records an event after
//!   the work its streams received since its last look and times the work
//!   between consecutive events, kernels and copies apart. That is GPU
//!   time as the GPU saw it, counted to the tenant per GPU.
//! - **Turns.** A holder keeps the GPU while others wait for at most a
//!   slice ([`DEFAULT_SLICE`]); then, or as soon as its work has drained and
//!   it has sent nothing new for a moment (work-conserving: an idle holder
//!   costs the others nothing), it lets its queued work finish and hands
//!   the GPU to the waiter the policy puts first. Only one session's work is
//!   on the GPU at a time, so each one's measured time is its own, and the
//!   driver rarely has to switch between contexts.
//! - **Policies.** `fair` gives the turn to the waiting tenant with the
//!   least weighted kernel time (its *virtual time*); a tenant that was
//!   idle is brought up to a slice behind the current virtual time when it
//!   returns, so idling banks at most a slice of credit. `band` is `fair` with copy time counted and
//!   copies held back too. `fifo` serves waiters in the order they began
//!   waiting, weights aside. `none` leaves the GPU to the driver's own
//!   time-slicing and only measures. Under every policy, waiters of a
//!   higher [`Class`] go first, and a holder yields to one at once; a
//!   waiter that has waited [`board::STARVATION_SLICES`] goes before all.
//! - **What it cannot do.** A kernel cannot be preempted, and work already
//!   queued to the driver cannot be recalled: a turn ends only after the
//!   holder's queued work has finished, so a waiter may wait a slice plus
//!   the longest run of work the holder had queued.

pub mod board;
pub mod seat;
#[cfg(test)]
mod tests;

pub use board::{Board, Work};
pub use seat::Seat;

/// Where a session sits on the board.
#[derive(Clone)]
pub struct Place {
    pub board: std::sync::Arc<Board>,
    pub seat: usize,
    /// Its tenant's row.
    pub row: usize,
    /// The server's ordinal of each device the session's backend numbers,
    /// by the backend's ordinal: a spatial worker sees one GPU as its 0.
    pub gpus: Vec<usize>,
    /// Spatial sessions run beside each other, so they are timed but not
    /// held back.
    pub sharing: Sharing,
}

/// How long a holder keeps a GPU that others wait for: each hand-over
/// leaves the GPU idle while the next holder's first work arrives, so
/// this trades that loss against how long a waiter waits.
pub const DEFAULT_SLICE: std::time::Duration = std::time::Duration::from_millis(10);

/// How a server divides each GPU's time among tenants that want it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Weighted fair shares of kernel time.
    #[default]
    Fair = 0,
    /// Turns in the order tenants began waiting, weights aside.
    Fifo = 1,
    /// Weighted fair shares of kernel and copy time.
    Band = 2,
    /// The driver's own time-slicing; GPU time is measured, not divided.
    None = 3,
}

impl Policy {
    pub const NAMES: [&'static str; 4] = ["fair", "fifo", "band", "none"];

    pub fn from_u32(v: u32) -> Policy {
        match v {
            1 => Policy::Fifo,
            2 => Policy::Band,
            3 => Policy::None,
            _ => Policy::Fair,
        }
    }

    pub fn name(self) -> &'static str {
        Policy::NAMES[self as usize]
    }
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Policy, String> {
        let i = Policy::NAMES.iter().position(|&n| n == s);
        i.map(|i| Policy::from_u32(i as u32))
            .ok_or_else(|| format!("unknown policy {s:?}: expected fair, fifo, band or none"))
    }
}

/// A tenant's priority class: a waiting tenant of a higher class gets the
/// turn before any of a lower one, whatever the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Class {
    /// Background work: gets a GPU only when no one else wants it.
    Low = 0,
    #[default]
    Normal = 1,
    /// Latency-sensitive work: goes first, and takes a GPU from a holder
    /// of a lower class as soon as that holder's queued work finishes.
    High = 2,
}

impl Class {
    pub const NAMES: [&'static str; 3] = ["low", "normal", "high"];

    pub fn from_u32(v: u32) -> Class {
        match v {
            0 => Class::Low,
            2 => Class::High,
            _ => Class::Normal,
        }
    }

    pub fn name(self) -> &'static str {
        Class::NAMES[self as usize]
    }
}

impl std::str::FromStr for Class {
    type Err = String;
    fn from_str(s: &str) -> Result<Class, String> {
        let i = Class::NAMES.iter().position(|&n| n == s);
        i.map(|i| Class::from_u32(i as u32))
            .ok_or_else(|| format!("unknown priority {s:?}: expected low, normal or high"))
    }
}

/// Whether a tenant's sessions run alone on a GPU or side by side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sharing {
    /// Each session is a GPU context of its own process, in a fault domain
    /// of its own, and takes turns with the others on the GPU.
    #[default]
    Isolated,
    /// The tenant's sessions on a GPU run side by side with the other
    /// spatial sessions there, as clients of one MPS server: small kernels
    /// fill the GPU together, and a fatal fault in one ends them all.
    Spatial,
}

impl Sharing {
    pub fn name(self) -> &'static str {
        match self {
            Sharing::Isolated => "isolated",
            Sharing::Spatial => "spatial",
        }
    }
}

impl std::str::FromStr for Sharing {
    type Err = String;
    fn from_str(s: &str) -> Result<Sharing, String> {
        match s {
            "isolated" => Ok(Sharing::Isolated),
            "spatial" => Ok(Sharing::Spatial),
            _ => Err(format!("unknown sharing {s:?}: expected isolated or spatial")),
        }
    }
}

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process of the server.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
