//! `gpuplex bench-tenant`: one tenant process of `gpuplex bench --tenants`.
//!
//! It loads a libcuda by path, as `bench-worker` does, so that the same
//! code runs on the machine's driver and on gpuplex's front-end. After a
//! warm-up it waits for the wall-clock start that every process of the run
//! was given, so that their windows coincide, then runs a closed loop of
//! launch + synchronize of the busy kernel for the window and prints one
//! JSON line ([`Loop`]). A closed loop keeps one kernel in flight, so a
//! tenant's kernels per second follow the GPU time it got, and each
//! iteration's time is what a caller waiting on its kernel would see.

use std::ffi::CStr;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::report::{percentile, Loop};
use super::Kernel;
use crate::bench::driver::Driver;
use crate::Error;

/// Every thread waits `ns` nanoseconds on the GPU's own clock from the
/// moment it starts (`tests/cuda/sched/busy_loop.cu` in PTX), so that a
/// kernel's length does not depend on how many blocks share an SM. PTX,
/// so that any GPU can JIT it and the emulated device can read it.
const BUSY_KERNEL_PTX: &CStr = c".version 8.0
.target sm_70
.address_size 64

.visible .entry gpuplex_bench_busy(.param .u64 ns)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [ns];
    mov.u64 %rd2, %globaltimer;
$spin:
    mov.u64 %rd3, %globaltimer;
    sub.s64 %rd4, %rd3, %rd2;
    setp.lt.u64 %p1, %rd4, %rd1;
    @%p1 bra $spin;
    ret;
}
";
const BUSY_KERNEL: &CStr = c"gpuplex_bench_busy";

/// Threads per block: one warp.
pub const THREADS: u32 = 32;

/// Launches before the window, so that module loading and the first
/// launch's set-up fall outside it.
const WARMUP: u32 = 3;

pub fn run(library: &str, kernel: Kernel, seconds: f64, start: f64) -> Result<ExitCode, Error> {
    if !(seconds.is_finite() && seconds > 0.0) {
        return Err(format!("--seconds {seconds}: want a positive number").into());
    }
    let d = Driver::load(if library == "system" { "libcuda.so.1" } else { library })?;
    d.init()?;
    let _ctx = d.primary_context(d.device(0)?)?;
    let module = d.load_ptx(BUSY_KERNEL_PTX)?;
    let f = module.function(BUSY_KERNEL)?;
    let (blocks, micros) = kernel.shape();
    let ns = micros * 1000;
    for _ in 0..WARMUP {
        d.launch_u64(&f, blocks, THREADS, ns)?;
    }
    d.synchronize()?;

    let wait = start - wall();
    if wait > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(wait));
    }
    let late_ms = ((wall() - start) * 1e3).max(0.0);
    let began = Instant::now();
    let window = Duration::from_secs_f64(seconds);
    let mut latencies = Vec::new();
    while began.elapsed() < window {
        let t = Instant::now();
        d.launch_u64(&f, blocks, THREADS, ns)?;
        d.synchronize_default_stream()?;
        latencies.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let took = began.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    let report = Loop {
        kernels: latencies.len() as u64,
        per_second: latencies.len() as f64 / took,
        p50_us: percentile(&latencies, 0.50),
        p99_us: percentile(&latencies, 0.99),
        late_ms,
    };
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, &report)?;
    writeln!(out)?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// Seconds since the epoch: the clock every tenant of a run shares.
pub fn wall() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}
