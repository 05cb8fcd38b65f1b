//! `GPUPLEX_TRACE=1` (or `gpuplex run --trace`): at exit, a table on stderr
//! of every CUDA function the program called, with how many of its calls
//! waited for the server and for how long, so that a user sees where a
//! slow program waits and what was refused.
//!
//! Each export runs inside [`entry`](crate::ffi::entry), which names the
//! function for the calling thread; the connection charges every frame it
//! sends and every wait for the server to the function named. Off, the
//! cost is one relaxed load per call.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Undecided, off, on.
static STATE: AtomicU8 = AtomicU8::new(UNDECIDED);
const UNDECIDED: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;

/// What one function cost, summed over its calls.
#[derive(Default, Clone)]
struct Tally {
    calls: u64,
    errors: u64,
    /// Calls sent that waited for their reply.
    waited: u64,
    /// Calls sent without waiting.
    posted: u64,
    /// Time blocked on the connection: waiting for replies, or for room to send.
    blocked: Duration,
    /// Time inside the function, all of it.
    inside: Duration,
}

static TALLIES: Mutex<Option<HashMap<&'static str, Tally>>> = Mutex::new(None);

thread_local! {
    /// The export the calling thread is in; frames sent outside any (the
    /// library's own threads) are charged to [`INTERNAL`].
    static CURRENT: Cell<Option<&'static str>> = const { Cell::new(None) };
}

const INTERNAL: &str = "(private tables, own threads)";

/// The row of the host functions the server had this process run: each is
/// a round trip the stream waited for, so a remote guest sees their cost.
const HOST_FUNCTIONS: &str = "(host functions run for the server)";

/// Whether tracing is on; decided once, from `GPUPLEX_TRACE`.
pub fn on() -> bool {
    match STATE.load(Ordering::Relaxed) {
        OFF => false,
        ON => true,
        _ => decide(),
    }
}

#[cold]
fn decide() -> bool {
    let on = std::env::var("GPUPLEX_TRACE").is_ok_and(|v| !v.is_empty() && v != "0");
    if STATE.compare_exchange(UNDECIDED, if on { ON } else { OFF }, Ordering::Relaxed, Ordering::Relaxed).is_ok() && on
    {
        // SAFETY: registers a plain function with no arguments to run at exit.
        unsafe { libc::atexit(print_at_exit) };
    }
    on
}

fn with_tally(name: &'static str, f: impl FnOnce(&mut Tally)) {
    let mut tallies = TALLIES.lock().unwrap_or_else(PoisonError::into_inner);
    f(tallies.get_or_insert_with(HashMap::new).entry(name).or_default());
}

/// Runs `body` as the export `name`, counting it. An export called from
/// inside another (the runtime's private tables call some) is part of the
/// outer one: its frames and time are charged there.
pub fn export<T>(name: &'static str, body: impl FnOnce() -> T, failed: impl FnOnce(&T) -> bool) -> T {
    if CURRENT.with(Cell::get).is_some() {
        return body();
    }
    CURRENT.with(|c| c.set(Some(name)));
    let start = Instant::now();
    let result = body();
    let inside = start.elapsed();
    CURRENT.with(|c| c.set(None));
    let failed = failed(&result);
    with_tally(name, |t| {
        t.calls += 1;
        t.errors += u64::from(failed);
        t.inside += inside;
    });
    result
}

/// A frame went to the server: `posted` ones wait for no reply.
pub fn sent(posted: bool) {
    let name = CURRENT.with(Cell::get).unwrap_or(INTERNAL);
    with_tally(name, |t| if posted { t.posted += 1 } else { t.waited += 1 });
}

/// A host function the server asked for ran and was answered, `d` after
/// the request arrived.
pub fn host_function(d: Duration) {
    with_tally(HOST_FUNCTIONS, |t| {
        t.calls += 1;
        t.inside += d;
    });
}

/// The calling thread was blocked on the connection for `d`.
pub fn blocked(d: Duration) {
    let name = CURRENT.with(Cell::get).unwrap_or(INTERNAL);
    with_tally(name, |t| t.blocked += d);
}

extern "C" fn print_at_exit() {
    let tallies = TALLIES.lock().unwrap_or_else(PoisonError::into_inner).take().unwrap_or_default();
    if !tallies.is_empty() {
        eprint!("{}", table(std::process::id(), tallies.into_iter().collect()));
    }
}

/// The table, sorted by time blocked, then by calls.
fn table(pid: u32, mut rows: Vec<(&'static str, Tally)>) -> String {
    rows.sort_by(|a, b| b.1.blocked.cmp(&a.1.blocked).then(b.1.calls.cmp(&a.1.calls)).then(a.0.cmp(b.0)));
    let total = rows.iter().fold(Tally::default(), |mut s, (_, t)| {
        s.calls += t.calls;
        s.errors += t.errors;
        s.waited += t.waited;
        s.posted += t.posted;
        s.blocked += t.blocked;
        s.inside += t.inside;
        s
    });
    let line = |name: &str, cells: [String; 6]| {
        let [calls, errors, waited, posted, blocked, inside] = cells;
        format!("{name:<40} {calls:>10} {errors:>8} {waited:>10} {posted:>10} {blocked:>12} {inside:>12}\n")
    };
    let row = |name: &str, t: &Tally| {
        let ms = |d: Duration| format!("{:.3}", d.as_secs_f64() * 1e3);
        let counts = [t.calls, t.errors, t.waited, t.posted].map(|n| n.to_string());
        let [calls, errors, waited, posted] = counts;
        line(name, [calls, errors, waited, posted, ms(t.blocked), ms(t.inside)])
    };
    let mut s = format!("gpuplex[{pid}] trace: CUDA driver calls, by time waited for the server\n");
    s += &line("function", ["calls", "errors", "waited", "posted", "blocked_ms", "inside_ms"].map(str::to_owned));
    for (name, t) in &rows {
        s += &row(name, t);
    }
    s += &row("total", &total);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_puts_the_longest_waits_first_and_totals_every_column() {
        let t = |calls, waited, posted, blocked_us| Tally {
            calls,
            errors: 1,
            waited,
            posted,
            blocked: Duration::from_micros(blocked_us),
            inside: Duration::from_micros(2 * blocked_us),
        };
        let text = table(7, vec![("cuLaunchKernel", t(100, 0, 100, 5)), ("cuMemAlloc_v2", t(3, 3, 0, 900))]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("gpuplex[7] trace"));
        assert!(lines[2].starts_with("cuMemAlloc_v2 "), "{text}");
        assert!(lines[3].starts_with("cuLaunchKernel "), "{text}");
        let total: Vec<&str> = lines[4].split_whitespace().collect();
        assert_eq!(total, ["total", "103", "2", "3", "100", "0.905", "1.810"]);
    }

    #[test]
    fn host_functions_have_a_row_of_their_own() {
        host_function(Duration::from_micros(30));
        host_function(Duration::from_micros(20));
        let tallies = TALLIES.lock().unwrap().clone().unwrap();
        let row = &tallies[HOST_FUNCTIONS];
        assert_eq!((row.calls, row.waited, row.inside), (2, 0, Duration::from_micros(50)));
    }

    #[test]
    fn frames_are_charged_to_the_outermost_export_of_the_thread() {
        export("outer_fn_for_test", || export("inner_fn_for_test", || sent(false), |_| false), |_| false);
        sent(true);
        let tallies = TALLIES.lock().unwrap().clone().unwrap();
        let outer = &tallies["outer_fn_for_test"];
        assert_eq!((outer.calls, outer.waited), (1, 1));
        assert!(!tallies.contains_key("inner_fn_for_test"));
        assert_eq!(tallies[INTERNAL].posted, 1);
    }
}
