//! What `gpuplex run` does with signals while its program runs: it stays
//! until the program ends, because it may hold the program's server and
//! always holds the directory its library is found in.
//!
//! - SIGINT and SIGQUIT from a terminal reach the program directly (it is
//!   in the same process group), so here they are ignored, as a shell
//!   ignores them while it waits for a command.
//! - SIGTERM and SIGHUP, which a process manager sends to this command
//!   only, are passed on to the program.
//! - A SIGTERM or SIGHUP that arrives between [`install`] and the moment
//!   the program's pid is known is passed on once it is. (A SIGINT then is
//!   dropped: the program may already be there to take the terminal's.)
//!
//! An embedded server's threads start with these signals blocked
//! ([`blocked_in`]), so that none of their system calls is interrupted.

use std::sync::atomic::{AtomicI32, Ordering::SeqCst};

const SIGNALS: [libc::c_int; 4] = [libc::SIGINT, libc::SIGQUIT, libc::SIGTERM, libc::SIGHUP];

/// The program's pid while it runs; 0 before, [`ENDED`] after.
static PROGRAM: AtomicI32 = AtomicI32::new(0);
/// Once the program is reaped its pid may name another process.
const ENDED: i32 = -1;
/// A SIGTERM or SIGHUP that came before the program's pid was known.
static PENDING: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(signal: libc::c_int) {
    if signal != libc::SIGTERM && signal != libc::SIGHUP {
        return;
    }
    match PROGRAM.load(SeqCst) {
        0 => {
            PENDING.store(signal, SeqCst);
            // The program may have started between the load and the store.
            let program = PROGRAM.load(SeqCst);
            if program > 0 {
                forward_pending(program);
            }
        }
        program if program > 0 => {
            // SAFETY: kill(2) is async-signal-safe and takes no pointers.
            unsafe { libc::kill(program, signal) };
        }
        // Once the program has ended.
        _ => {}
    }
}

fn forward_pending(program: libc::pid_t) {
    let signal = PENDING.swap(0, SeqCst);
    if signal != 0 {
        // SAFETY: as above.
        unsafe { libc::kill(program, signal) };
    }
}

fn mask(how: libc::c_int) {
    // SAFETY: a local set, filled before use; changes this thread's mask only.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in SIGNALS {
            libc::sigaddset(&mut set, signal);
        }
        libc::pthread_sigmask(how, &set, std::ptr::null_mut());
    }
}

/// Runs `start` with the signals blocked, so that the threads it starts
/// never take them.
pub fn blocked_in<T>(start: impl FnOnce() -> T) -> T {
    mask(libc::SIG_BLOCK);
    let started = start();
    mask(libc::SIG_UNBLOCK);
    started
}

/// Takes the signals over, just before the program starts. One ignored
/// already (under `nohup`, say) stays ignored, here and in the program.
pub fn install() {
    for signal in SIGNALS {
        // SAFETY: zeroed sigactions, one read back and one set, with a plain
        // handler that only touches atomics and calls kill(2); SA_RESTART
        // so the wait goes on.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(signal, std::ptr::null(), &mut old);
            if old.sa_sigaction == libc::SIG_IGN {
                continue;
            }
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

/// The program runs as `pid` (with every signal handled by default, since
/// `exec` resets handlers): from now on signals are relayed to it,
/// starting with any that came before.
pub fn program_started(pid: u32) {
    let pid = pid as libc::pid_t;
    PROGRAM.store(pid, SeqCst);
    forward_pending(pid);
}

/// The program has been reaped: nothing is relayed any more.
pub fn program_ended() {
    PROGRAM.store(ENDED, SeqCst);
}
