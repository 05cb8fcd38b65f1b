//! Turns and shares, with sessions on threads and the emulated device,
//! whose "work" is the submitting closure itself: it takes the time it
//! spins, and the meter's events (stamped when recorded) time it.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::board::{Board, Work};
use super::{Class, Place, Policy, Seat, Sharing};
use crate::backend::emulated::Emulated;
use crate::backend::{Backend, Obj};
use crate::ledger::{Account, Ledger};

const LEGACY: Obj = Obj(1);

fn board(policy: Policy) -> Arc<Board> {
    Arc::new(Board::create(policy, Duration::from_millis(5)).unwrap())
}

/// A session's seat in tenant row `row`, with a context on GPU 0.
fn seat(board: &Arc<Board>, seat: usize, row: usize) -> (Seat, Arc<dyn Backend>, Obj) {
    let backend: Arc<dyn Backend> = Arc::new(Emulated::new());
    let ledger = Arc::new(Ledger::create("t", 0).unwrap());
    ledger.claim(0);
    board.occupy(seat, row);
    let place = Place { board: board.clone(), seat, row, gpus: vec![0], sharing: Sharing::Isolated };
    let s = Seat::start(backend.clone(), place, Account::new(ledger, 0));
    let ctx = backend.ctx_create(0, 0).unwrap();
    s.context(ctx, 0);
    (s, backend, ctx)
}

/// Tests that time spinning threads run one at a time: on a machine of
/// two cores, two of them at once starve each other's threads.
static TIMING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn spin(d: Duration) {
    let start = Instant::now();
    while start.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// Runs `work`-long submissions from each seat for about `run`, and returns
/// how many each made and when they began (once no other timed test runs).
fn compete(seats: &[(Seat, Arc<dyn Backend>, Obj)], work: Duration, run: Duration) -> (Vec<u32>, Instant) {
    let _alone = TIMING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let started = Instant::now();
    let stop = AtomicBool::new(false);
    let counts: Vec<AtomicU32> = seats.iter().map(|_| AtomicU32::new(0)).collect();
    thread::scope(|scope| {
        for ((seat, _, ctx), count) in seats.iter().zip(&counts) {
            let stop = &stop;
            scope.spawn(move || {
                while !stop.load(Relaxed) {
                    seat.submit(*ctx, LEGACY, Work::Compute, || spin(work));
                    count.fetch_add(1, Relaxed);
                }
            });
        }
        thread::sleep(run);
        stop.store(true, Relaxed);
    });
    (counts.iter().map(|c| c.load(Relaxed)).collect(), started)
}

fn compute_ns(board: &Board, row: usize) -> u64 {
    board.tenant(row).compute_ns[0].load(Relaxed)
}

#[test]
fn an_uncontended_gpu_is_taken_and_a_waiter_gets_it_when_released() {
    let board = board(Policy::Fair);
    board.occupy(0, 0);
    board.occupy(1, 1);
    assert!(board.try_take(0, 0));
    assert!(!board.try_take(0, 1));
    let waiter = {
        let board = board.clone();
        thread::spawn(move || board.wait_turn(0, 1))
    };
    while board.waiters(0, Class::Normal) == (false, false) {
        thread::yield_now();
    }
    board.release(0, 0);
    waiter.join().unwrap();
    assert!(board.holds(0, 1));
    assert_eq!(board.waiters(0, Class::Low), (false, false), "the waiter stopped waiting");
}

#[test]
fn the_waiter_told_it_is_next_gets_the_turn() {
    let board = board(Policy::Fifo);
    for seat in 0..3 {
        board.occupy(seat, seat);
    }
    assert!(board.try_take(0, 0));
    let first = wait(&board, 1);
    let second = {
        let board = board.clone();
        thread::spawn(move || board.wait_turn(0, 2))
    };
    while board.gpu(0).waiting_total() < 2 {
        thread::yield_now();
    }
    board.heads_up(0, 0);
    assert_eq!(board.told_next(0), Some(1), "the first to wait goes next under fifo");
    // Told, it waits awake; the release still decides.
    thread::sleep(Duration::from_millis(5));
    board.release(0, 0);
    first.join().unwrap();
    assert!(board.holds(0, 1));
    assert_eq!(board.told_next(0), None, "the hand-over clears it");
    board.release(0, 1);
    second.join().unwrap();
    assert!(board.holds(0, 2));
}

/// Has `seats` wait for GPU 0 (held by seat 0) one after another, runs
/// `meanwhile`, then releases the GPU: the order the turns went in, each
/// waiter releasing to the next as it gets its turn.
fn turns(board: &Arc<Board>, seats: &[usize], meanwhile: impl FnOnce()) -> Vec<usize> {
    assert!(board.try_take(0, 0));
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for &seat in seats {
        let (b, order) = (board.clone(), order.clone());
        waiters.push(thread::spawn(move || {
            b.wait_turn(0, seat);
            order.lock().unwrap().push(seat);
            b.release(0, seat);
        }));
        while board.gpu(0).waiting_total() < waiters.len() as u32 {
            thread::yield_now();
        }
    }
    meanwhile();
    board.release(0, 0);
    waiters.into_iter().for_each(|w| w.join().unwrap());
    let order = order.lock().unwrap().clone();
    order
}

/// Seat `seat` waiting for GPU 0 on a thread, once it is counted waiting
/// (and nobody else waits).
fn wait(board: &Arc<Board>, seat: usize) -> thread::JoinHandle<()> {
    let b = board.clone();
    let waiter = thread::spawn(move || b.wait_turn(0, seat));
    while board.gpu(0).waiting_total() == 0 {
        thread::yield_now();
    }
    waiter
}

#[test]
fn the_next_holder_is_the_highest_class_then_the_least_virtual_time() {
    let board = board(Policy::Fair);
    for (row, class) in [Class::Normal, Class::Normal, Class::Low, Class::High, Class::Normal].into_iter().enumerate() {
        board.set_tenant(row, 1, class);
        board.occupy(row, row);
    }
    let charge = || {
        board.charge(1, 0, Work::Compute, 5_000);
        board.charge(4, 0, Work::Compute, 1_000);
    };
    assert_eq!(turns(&board, &[2, 1, 3, 4], charge), vec![3, 4, 1, 2]);
}

#[test]
fn a_waiter_that_waited_too_long_goes_before_a_higher_class() {
    let board = Arc::new(Board::create(Policy::Fair, Duration::from_millis(1)).unwrap());
    for (row, class) in [Class::High, Class::Normal, Class::High].into_iter().enumerate() {
        board.set_tenant(row, 1, class);
        board.occupy(row, row);
    }
    let bound = Duration::from_millis(1) * super::board::STARVATION_SLICES;
    // Both waited past the bound: the one that came first goes first.
    assert_eq!(turns(&board, &[1, 2], || thread::sleep(bound)), vec![1, 2]);
    // Neither did: the class decides.
    assert_eq!(turns(&board, &[1, 2], || ()), vec![2, 1]);
}

#[test]
fn time_a_tenant_had_the_gpu_alone_does_not_count_against_it() {
    let board = board(Policy::Fair);
    board.occupy(0, 0);
    board.occupy(1, 1);
    assert!(board.try_take(0, 0));
    // A second alone on the GPU, then a newcomer.
    board.charge(0, 0, Work::Compute, 1_000_000_000);
    let newcomer = wait(&board, 1);
    board.release(0, 0);
    newcomer.join().unwrap();
    let first = wait(&board, 0);
    // Arriving, the newcomer was a slice (5 ms) behind: it keeps the turn
    // for that much, and no more.
    board.charge(1, 0, Work::Compute, 4_000_000);
    assert!(board.keep_turn(0, 1), "the newcomer still has credit");
    board.charge(1, 0, Work::Compute, 2_000_000);
    assert!(!board.keep_turn(0, 1), "the newcomer's credit is spent: the two take turns");
    board.release(0, 1);
    first.join().unwrap();
    assert!(board.holds(0, 0));
}

#[test]
fn copies_count_to_virtual_time_under_band_only() {
    for (policy, first) in [(Policy::Fair, 1), (Policy::Band, 2)] {
        let board = board(policy);
        for row in 0..3 {
            board.occupy(row, row);
        }
        let charge = || {
            board.charge(1, 0, Work::Copy, 9_000);
            board.charge(2, 0, Work::Compute, 1_000);
        };
        assert_eq!(turns(&board, &[1, 2], charge)[0], first, "{policy:?}");
    }
}

#[test]
fn fifo_serves_waiters_in_the_order_they_came() {
    let board = board(Policy::Fifo);
    for row in 0..4 {
        board.set_tenant(row, 1 + 10 * row as u32, Class::Normal);
        board.occupy(row, row);
    }
    // Under fifo, virtual time does not matter.
    assert_eq!(turns(&board, &[2, 1, 3], || board.charge(1, 0, Work::Compute, 9_000_000)), vec![2, 1, 3]);
}

#[test]
fn a_vacated_holder_gives_the_gpu_to_its_waiter() {
    let board = board(Policy::Fair);
    board.occupy(0, 0);
    board.occupy(1, 1);
    assert!(board.try_take(0, 0));
    let waiter = wait(&board, 1);
    // The supervisor reaping seat 0's worker.
    board.vacate(0);
    waiter.join().unwrap();
    assert!(board.holds(0, 1));
}

#[test]
fn a_holder_whose_seat_was_freed_without_a_release_is_passed_over() {
    let board = board(Policy::Fair);
    board.occupy(0, 0);
    board.occupy(1, 1);
    assert!(board.try_take(0, 0));
    // A worker killed after the supervisor freed the seat but before it
    // let go: the seat is free, the claim stale.
    board.forget_seat(0);
    let started = Instant::now();
    board.wait_turn(0, 1);
    assert!(board.holds(0, 1));
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[test]
fn weights_divide_the_time_of_tenants_that_compete() {
    let board = board(Policy::Fair);
    board.set_tenant(0, 1, Class::Normal);
    board.set_tenant(1, 3, Class::Normal);
    let seats = vec![seat(&board, 0, 0), seat(&board, 1, 1)];
    let (counts, _) = compete(&seats, Duration::from_millis(1), Duration::from_millis(1500));
    drop(seats);
    let (a, b) = (compute_ns(&board, 0) as f64, compute_ns(&board, 1) as f64);
    assert!(a > 0.0 && b > 0.0, "both ran: {counts:?}");
    let share = b / (a + b);
    assert!((0.65..=0.85).contains(&share), "weight 3 of 4 got {share:.3} of the time ({counts:?})");
}

#[test]
fn a_tenant_alone_is_not_held_back_and_its_time_is_measured() {
    let board = board(Policy::Fair);
    board.set_tenant(0, 1, Class::Normal);
    board.set_tenant(1, 5, Class::Normal);
    let seats = vec![seat(&board, 0, 0), seat(&board, 1, 1)];
    let run = Duration::from_millis(600);
    // Only the first submits: the weight-5 tenant's share is not reserved.
    let (counts, started) = compete(&seats[..1], Duration::from_millis(1), run);
    let wall = started.elapsed().as_nanos() as f64;
    drop(seats);
    let measured = compute_ns(&board, 0) as f64;
    // Held to its weight's share it would make about a sixth of them; other
    // tests' threads on a small machine take the rest of the margin.
    assert!(counts[0] as f64 >= 0.5 * run.as_millis() as f64, "{counts:?} submissions of 1 ms in {run:?}");
    assert!((0.8..=1.05).contains(&(measured / wall)), "measured {measured} ns of {wall} ns busy");
}

#[test]
fn the_none_policy_measures_without_holding_back() {
    let board = board(Policy::None);
    let seats = vec![seat(&board, 0, 0), seat(&board, 1, 1)];
    let (a, b) = (&seats[0], &seats[1]);
    a.0.submit(a.2, LEGACY, Work::Compute, || spin(Duration::from_millis(2)));
    b.0.submit(b.2, LEGACY, Work::Compute, || spin(Duration::from_millis(2)));
    assert_eq!((board.holder(0), board.gpu(0).waiting_total()), (None, 0));
    drop(seats);
    for row in 0..2 {
        let ns = compute_ns(&board, row);
        assert!((1_500_000..50_000_000).contains(&ns), "row {row}: {ns} ns");
    }
}

/// Submits from seat 1, `b`, while seat 0 holds GPU 0's turn and uses it
/// no more: `b` must get the turn (seat 0's meter gives it up), within 2 s.
fn gets_the_unused_turn(board: &Arc<Board>, b: Arc<(Seat, Arc<dyn Backend>, Obj)>) {
    // The seat stays here too: dropped, it would give the turn back.
    let waiter = {
        let b = b.clone();
        thread::spawn(move || b.0.submit(b.2, LEGACY, Work::Compute, || ()))
    };
    let started = Instant::now();
    while !board.holds(0, 1) && started.elapsed() < Duration::from_secs(2) {
        thread::sleep(Duration::from_millis(1));
    }
    assert!(board.holds(0, 1), "the other session still waits, {:?} later, for a turn nobody uses", started.elapsed());
    waiter.join().unwrap();
}

#[test]
fn a_turn_is_given_up_after_the_context_that_took_it_is_gone() {
    let board = board(Policy::Fair);
    let (a, b) = (seat(&board, 0, 0), Arc::new(seat(&board, 1, 1)));
    a.0.submit(a.2, LEGACY, Work::Compute, || ());
    assert!(board.holds(0, 0));
    // The program ends: its context goes while its session still holds the turn.
    a.0.context_gone(a.2);
    a.1.ctx_destroy(a.2).unwrap();
    gets_the_unused_turn(&board, b);
}

#[test]
fn a_turn_taken_by_untimed_work_of_an_idle_session_is_given_up() {
    let board = board(Policy::Fair);
    let (a, b) = (seat(&board, 0, 0), Arc::new(seat(&board, 1, 1)));
    // Idle this long, a's meter sleeps until a submission wakes it.
    thread::sleep(Duration::from_millis(60));
    // A stream the seat was never told of is gated but not timed.
    a.0.submit(a.2, Obj(0xdead), Work::Compute, || ());
    assert!(board.holds(0, 0));
    gets_the_unused_turn(&board, b);
}

#[test]
fn a_turn_does_not_end_while_its_holder_submits() {
    let _alone = TIMING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let board = board(Policy::Fair);
    let (a, b) = (Arc::new(seat(&board, 0, 0)), Arc::new(seat(&board, 1, 1)));
    let a_done = Arc::new(std::sync::Mutex::new(None));
    // A's submission outlasts its slice of 5 ms while B waits.
    let holder = {
        let (a, a_done) = (a.clone(), a_done.clone());
        thread::spawn(move || {
            a.0.submit(a.2, LEGACY, Work::Compute, || {
                thread::sleep(Duration::from_millis(30));
                *a_done.lock().unwrap() = Some(Instant::now());
            })
        })
    };
    while !board.holds(0, 0) {
        thread::yield_now();
    }
    let b_began = b.0.submit(b.2, LEGACY, Work::Compute, Instant::now);
    holder.join().unwrap();
    let a_done = a_done.lock().unwrap().expect("A's work ran");
    assert!(b_began >= a_done, "B's work began {:?} before A's ended", a_done - b_began);
}

#[test]
fn a_tenant_that_paused_keeps_a_slice_of_credit() {
    let board = board(Policy::Fair);
    board.occupy(0, 0);
    board.occupy(1, 1);
    // Seat 0 runs 20 ms while seat 1 waits, then seat 1 runs 4 ms.
    assert!(board.try_take(0, 0));
    let w = wait(&board, 1);
    board.charge(0, 0, Work::Compute, 20_000_000);
    board.release(0, 0);
    w.join().unwrap();
    board.charge(1, 0, Work::Compute, 4_000_000);
    // Seat 1 pauses: the GPU goes to seat 0, and seat 1 comes back.
    board.release(0, 1);
    assert!(board.try_take(0, 0));
    let w = wait(&board, 1);
    board.release(0, 0);
    w.join().unwrap();
    // 16 ms behind, it came back a slice (5 ms) behind, not level.
    let w = wait(&board, 0);
    board.charge(1, 0, Work::Compute, 4_000_000);
    assert!(board.keep_turn(0, 1), "the credit of a slice was kept");
    board.charge(1, 0, Work::Compute, 2_000_000);
    assert!(!board.keep_turn(0, 1), "no more than a slice was kept");
    board.release(0, 1);
    w.join().unwrap();
}

#[test]
fn work_of_two_sessions_never_runs_at_once() {
    let _alone = TIMING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let board = board(Policy::Fair);
    let seats = [seat(&board, 0, 0), seat(&board, 1, 1)];
    // Each piece of work checks that no other is under way: a holder that
    // passes the gate without the turn lock must still never run beside
    // the session its turn went to. Pauses around the idle grace make the
    // meter give turns up just as their holder submits again.
    let running = AtomicU32::new(0);
    let overlaps = AtomicU32::new(0);
    let stop = AtomicBool::new(false);
    thread::scope(|scope| {
        for (seat, _, ctx) in &seats {
            let (running, overlaps, stop) = (&running, &overlaps, &stop);
            scope.spawn(move || {
                for i in 0u64.. {
                    if stop.load(Relaxed) {
                        break;
                    }
                    seat.submit(*ctx, LEGACY, Work::Compute, || {
                        if running.fetch_add(1, Relaxed) != 0 {
                            overlaps.fetch_add(1, Relaxed);
                        }
                        spin(Duration::from_micros(50));
                        running.fetch_sub(1, Relaxed);
                    });
                    spin(Duration::from_micros(100 + i * 37 % 250));
                }
            });
        }
        thread::sleep(Duration::from_millis(300));
        stop.store(true, Relaxed);
    });
    assert_eq!(overlaps.load(Relaxed), 0, "work of the two sessions ran at once");
    assert!(compute_ns(&board, 0) > 0 && compute_ns(&board, 1) > 0, "both sessions had turns");
}

#[test]
fn a_session_alone_is_timed_rarely() {
    let _alone = TIMING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let board = board(Policy::Fair);
    let seats = vec![seat(&board, 0, 0)];
    let (seat, _, ctx) = &seats[0];
    // Every look charges the time it measured: count the charges seen
    // while the session works without a pause.
    let (started, mut charges, mut last) = (Instant::now(), 0, 0);
    while started.elapsed() < Duration::from_millis(300) {
        seat.submit(*ctx, LEGACY, Work::Compute, || spin(Duration::from_millis(1)));
        let now = compute_ns(&board, 0);
        if now != last {
            (charges, last) = (charges + 1, now);
        }
    }
    drop(seats);
    // The bound lies between one look per `LOOK_ALONE` (a slow machine
    // makes fewer, never more) and one per `POLL_ALONE`.
    assert!(charges <= 12, "{charges} looks in 300 ms of work alone");
    // At least half: on a small machine other tests' threads delay the
    // meter's looks, which then measure less of the work.
    assert!(compute_ns(&board, 0) > 150_000_000, "the work was measured: {} ns", compute_ns(&board, 0));
}
