//! Posted launches against a live server on the emulated backend: a lone
//! one runs, a run of them reports its first failure, and a flood of them
//! all run in the order sent.

use std::time::Duration;

use gpuplex_protocol::calls::*;
use gpuplex_protocol::{CuError, DevPtr};
use gpuplex_transport::shm::Region;

mod common;

use common::*;

/// Posted launches are batched only while further frames have arrived: a
/// posted launch with nothing after it still runs, with no other call to
/// push it, and writes the client's pinned memory.
#[test]
fn a_lone_posted_launch_runs_without_another_call() {
    let address = start_server("lone-launch");
    let mut c = Client::connect(&address);
    let _shared = c.share_memory();
    let host = c.call(HostAlloc::Request { size: 4096, flags: 0, at: 0, mirror: false }).unwrap();
    let block = Region::open(c.carrier.recv_fd().unwrap()).unwrap();
    let spin = c.function(LAUNCH_PTX, "spin");
    assert_eq!(peek(&block, 0, 16), vec![0; 16]);
    c.post(launch(spin, 4, spin_params(host.devptr, 7)));
    wait_for("the posted launch to write the block", || peek(&block, 0, 16) != vec![0; 16]);
}

/// Posted launches report the first failure among them: launches the
/// backend refuses, then one the session's own checks refuse, must answer
/// with the backend's error. One refused launch runs on the session's
/// thread; forty, more than a batch, arrive while the session is busy and
/// go to its launcher thread.
#[test]
fn posted_launches_report_the_first_failure_of_their_run() {
    for refused in [1, 40] {
        let address = start_server(&format!("first-failure-{refused}"));
        let mut c = Client::connect(&address);
        let _shared = c.share_memory();
        let spin = c.function(LAUNCH_PTX, "spin");
        let nowhere = c.function(LAUNCH_PTX, "nowhere");
        let threads = 1 << 22;
        let out = c.alloc(4 * threads as u64);
        // Keeps the session busy while the frames below arrive together.
        c.post(launch(spin, threads, spin_params(out, 1)));
        std::thread::sleep(Duration::from_millis(1));
        for _ in 0..refused {
            c.post(launch(nowhere, 1, Vec::new()));
        }
        c.post(launch(spin, 1, vec![0; 8]));
        let (code, detail) = c.call_detail(cuCtxSynchronize::Request {}).err().unwrap();
        assert_eq!(code, CuError::NOT_SUPPORTED, "{refused} refused: {detail}");
        assert!(detail.contains("Launch (posted)") && detail.contains("nowhere"), "{detail}");
        c.call(cuCtxSynchronize::Request {}).unwrap();
    }
}

/// A flood of posted launches, many times what the session hands its
/// launcher at once or lets it hold unfinished, all run, in the order
/// sent, before the next waited call: each of the first kind writes its own
/// element, and the second kind all write one buffer, the last one sent
/// last.
#[test]
fn a_flood_of_posted_launches_all_run_in_order() {
    let address = start_server("launch-flood");
    let mut c = Client::connect(&address);
    let _shared = c.share_memory();
    let spin = c.function(LAUNCH_PTX, "spin");
    let n = 2048u32;
    let each = c.alloc(4 * u64::from(n));
    let last = c.alloc(4 * 256);
    for k in 0..n {
        c.post(launch(spin, 1, spin_params(DevPtr(each.0 + 4 * u64::from(k)), k)));
        c.post(launch(spin, 256, spin_params(last, k)));
    }
    let (got_each, got_last) = (c.read(each, 4 * u64::from(n)), c.read(last, 4 * 256));
    // Thread 0 of a launch with seed k writes what thread k of one with seed 0 does.
    let reference = c.alloc(4 * u64::from(n));
    c.call(launch(spin, n, spin_params(reference, 0))).unwrap();
    assert!(got_each == c.read(reference, 4 * u64::from(n)), "every posted launch ran");
    c.call(launch(spin, 256, spin_params(reference, n - 1))).unwrap();
    assert!(got_last == c.read(reference, 4 * 256), "the last launch sent ran last");
}
