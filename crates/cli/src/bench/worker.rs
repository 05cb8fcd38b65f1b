//! `gpuplex bench-worker --library PATH|system`: one column's measurements.
//!
//! The same code runs for every column; only the libcuda it loads differs.
//! It prints a [`WorkerReport`] as one JSON line on stdout. A failed
//! measurement is reported in its row and the others still run; only a
//! failure to reach a device at all ends the worker.
//!
//! `--part` picks the latency rows (launches, small copies, alloc+free) or
//! the bandwidth rows; without it the worker measures both. Each metric is
//! sampled `--samples` times and reported as the median of its samples,
//! with their minimum and maximum: a single sample varied widely from run
//! to run on a real GPU (launch overhead, bandwidth), and a median is not
//! moved by one disturbed sample. A latency sample is one timed loop of
//! calls; a bandwidth sample is one stretch of copies.
//!
//! The bench asks for the bandwidth rows this way, one sample per worker.
//! The latency rows it takes with `--turns`: the worker stays up and
//! answers one sample of a row at a time, when asked, so that the columns
//! can take turns at the machine (see `latency.rs` for why).

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use super::driver::{self, DeviceBuffer, Driver, Function, Stream};
use super::report::{
    bandwidth_metric, bandwidth_sizes, size_label, Checks, Direction, HostMemory, Outcome, Summary, WorkerReport,
    ALLOC_FREE_1MIB, ALLOC_FREE_1MIB_BESIDE, COPY_DTOH_4B, COPY_HTOD_4B, GRAPH_100, LATENCY_METRICS, LAUNCH_ASYNC,
    LAUNCH_SYNC, MIB,
};
use crate::Error;

/// An empty kernel, as PTX so that any GPU can JIT it and the emulated
/// device can read it (it runs the reference kernel of the same name).
const EMPTY_KERNEL_PTX: &CStr = c".version 8.0
.target sm_75
.address_size 64

.visible .entry gpuplex_bench_empty()
{
    ret;
}
";
const EMPTY_KERNEL: &CStr = c"gpuplex_bench_empty";

/// How much of each measurement to do, per sample. A latency sample (a
/// turn, in `--turns`) lasts about 10 ms on the H100 machine: short enough
/// that the columns' turns see the machine alike (see `latency.rs`).
struct Plan {
    samples: usize,
    /// Launches queued before the one synchronize.
    async_launches: u32,
    /// Iterations of each latency measurement.
    sync_launches: u32,
    small_copies: u32,
    allocations: u32,
    /// Bandwidth: how long each size is copied each way.
    copy_time: Duration,
    sizes: &'static [usize],
}

impl Plan {
    fn new(quick: bool, samples: usize) -> Plan {
        if quick {
            Plan {
                samples,
                async_launches: 200,
                sync_launches: 50,
                small_copies: 50,
                allocations: 10,
                copy_time: Duration::from_millis(2),
                sizes: bandwidth_sizes(true),
            }
        } else {
            Plan {
                samples,
                async_launches: 2000,
                sync_launches: 1000,
                small_copies: 1000,
                allocations: 200,
                copy_time: Duration::from_millis(40),
                sizes: bandwidth_sizes(false),
            }
        }
    }
}

/// Warm-up iterations before timing `n`: a tenth, at least one.
fn warmup(n: u32) -> u32 {
    (n / 10).max(1)
}

/// Which rows a worker measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    Latency,
    Bandwidth,
}

impl Part {
    pub fn name(self) -> &'static str {
        match self {
            Part::Latency => "latency",
            Part::Bandwidth => "bandwidth",
        }
    }
}

pub fn run(library: &str, quick: bool, samples: usize, part: Option<Part>, turns: bool) -> Result<ExitCode, Error> {
    if samples == 0 {
        return Err("--samples must be at least 1".into());
    }
    // `system`: whatever libcuda.so.1 the dynamic linker finds, as a CUDA program would.
    let driver = Driver::load(if library == "system" { "libcuda.so.1" } else { library })?;
    let plan = Plan::new(quick, samples);
    if turns {
        answer_turns(&driver, &plan)?;
    } else {
        let report = measure(&driver, &plan, part)?;
        print_line(&mut std::io::stdout().lock(), &report)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// One JSON line, flushed: the bench waits for it.
fn print_line(out: &mut impl Write, value: &impl serde::Serialize) -> Result<(), Error> {
    serde_json::to_writer(&mut *out, value)?;
    writeln!(out)?;
    out.flush()?;
    Ok(())
}

/// The device's primary context, made current, and a report of what was
/// reached, with no rows yet.
fn open(d: &Driver) -> Result<(WorkerReport, driver::PrimaryContext<'_>), Error> {
    d.init()?;
    let dev = d.device(0)?;
    let (device, driver_version) = (d.device_name(dev)?, d.driver_version()?);
    let ctx = d.primary_context(dev)?;
    let header = WorkerReport {
        library: d.path.clone(),
        gpuplex: d.is_gpuplex,
        device,
        driver_version,
        results: BTreeMap::new(),
        checks: Checks::default(),
    };
    Ok((header, ctx))
}

fn measure(d: &Driver, plan: &Plan, part: Option<Part>) -> Result<WorkerReport, Error> {
    let (mut report, _ctx) = open(d)?;
    let checks = &mut report.checks;
    if part != Some(Part::Bandwidth) {
        report.results.extend(latency(d, plan, checks)?);
    }
    if part != Some(Part::Latency) {
        report.results.extend(bandwidth(d, plan, checks));
    }
    final_synchronize(d, checks);
    Ok(report)
}

/// Errors of queued work surface here rather than going unnoticed.
fn final_synchronize(d: &Driver, checks: &mut Checks) {
    if let Err(e) = d.synchronize() {
        checks.failed.push(format!("final synchronize: {e}"));
    }
}

/// `--turns`: the latency rows, one sample at a time, as the bench asks for
/// them. Prints the report of what was reached (with no rows) once set up;
/// then, for each row name read from stdin, one sample of that row as an
/// [`Outcome`]; at the end of input, the [`Checks`] of the final
/// synchronize. The bench keeps every column's worker up at once and asks
/// each in turn (see `latency.rs`).
fn answer_turns(d: &Driver, plan: &Plan) -> Result<(), Error> {
    let (mut header, _ctx) = open(d)?;
    let module = d.load_ptx(EMPTY_KERNEL_PTX)?;
    let rig = Rig::new(d, &module, &mut header.checks)?;
    let mut out = std::io::stdout().lock();
    print_line(&mut out, &header)?;
    for metric in std::io::stdin().lock().lines() {
        print_line(&mut out, &rig.measure(metric?.trim(), 1, plan))?;
    }
    let mut checks = Checks::default();
    final_synchronize(d, &mut checks);
    print_line(&mut out, &checks)
}

/// Every latency row, `k` samples each.
fn latency(d: &Driver, plan: &Plan, checks: &mut Checks) -> Result<Vec<(String, Outcome)>, Error> {
    let module = d.load_ptx(EMPTY_KERNEL_PTX)?;
    let rig = Rig::new(d, &module, checks)?;
    Ok(LATENCY_METRICS.iter().map(|&m| (m.to_owned(), rig.measure(m, plan.samples, plan))).collect())
}

/// What the latency rows use, set up once per worker. It holds no device
/// memory between samples: the alloc+free row is taken with none held (see
/// [`alloc_free`]).
struct Rig<'a> {
    d: &'a Driver,
    kernel: Function<'a>,
    stream: Stream<'a>,
    /// Whether 4 bytes were seen to round-trip, or why the 4 B rows cannot be measured.
    small_copies: Result<(), String>,
}

/// What the 4-byte copies write.
const SMALL: [u8; 4] = [0xC0, 0xFF, 0xEE, 0x42];

impl<'a> Rig<'a> {
    fn new(d: &'a Driver, module: &'a driver::Module<'a>, checks: &mut Checks) -> Result<Rig<'a>, Error> {
        let kernel = module.function(EMPTY_KERNEL)?;
        let stream = d.create_stream()?;
        Ok(Rig { d, kernel, stream, small_copies: check_small_copies(d, checks) })
    }

    /// `k` samples of the latency row `metric`, each one timed loop of the
    /// plan's calls after a warm-up.
    fn measure(&self, metric: &str, k: usize, plan: &Plan) -> Outcome {
        let d = self.d;
        let n = plan.small_copies;
        outcome(match metric {
            LAUNCH_ASYNC => launch_async(d, &self.kernel, &self.stream, k, plan.async_launches),
            LAUNCH_SYNC => launch_sync(d, &self.kernel, &self.stream, k, plan.sync_launches),
            GRAPH_100 => d.capture_graph(&self.kernel, &self.stream, 100).and_then(|graph| {
                latency_us(k, plan.sync_launches, || {
                    d.launch_graph(&graph, &self.stream)?;
                    self.stream.synchronize()
                })
            }),
            COPY_HTOD_4B => return self.small_copy(|dev| latency_us(k, n, || d.htod(dev, &SMALL))),
            COPY_DTOH_4B => return self.small_copy(|dev| latency_us(k, n, || d.dtoh(&mut [0; 4], dev))),
            ALLOC_FREE_1MIB => alloc_free(d, k, plan.allocations),
            ALLOC_FREE_1MIB_BESIDE => d.alloc(4).and_then(|_held| alloc_free(d, k, plan.allocations)),
            _ => return Outcome::Error(format!("no latency row is named {metric}")),
        })
    }

    /// `time`d with 4 device bytes of this measurement's own, if the 4-byte
    /// round trip checked out.
    fn small_copy(&self, time: impl FnOnce(&DeviceBuffer<'_>) -> driver::Result<Summary>) -> Outcome {
        match &self.small_copies {
            Ok(()) => outcome(self.d.alloc(4).and_then(|dev| time(&dev))),
            Err(e) => Outcome::Error(e.clone()),
        }
    }
}

/// `k` (at least one) values from `one`, summarised; the first error ends the sampling.
fn sample<E>(k: usize, mut one: impl FnMut() -> Result<f64, E>) -> Result<Summary, E> {
    let samples = (0..k.max(1)).map(|_| one()).collect::<Result<Vec<f64>, E>>()?;
    Ok(Summary::of(&samples).expect("at least one sample"))
}

fn micros_per_call(elapsed: Duration, calls: u32) -> f64 {
    elapsed.as_secs_f64() * 1e6 / calls as f64
}

/// Microseconds per call of `op`: after one warm-up, each sample is the mean of `n` calls.
fn latency_us(k: usize, n: u32, mut op: impl FnMut() -> driver::Result<()>) -> driver::Result<Summary> {
    for _ in 0..warmup(n) {
        op()?;
    }
    sample(k, || {
        let start = Instant::now();
        for _ in 0..n {
            op()?;
        }
        Ok(micros_per_call(start.elapsed(), n))
    })
}

/// `n` launches queued without waiting, then one synchronize: microseconds per launch.
fn launch_async(d: &Driver, f: &Function<'_>, s: &Stream<'_>, k: usize, n: u32) -> driver::Result<Summary> {
    for _ in 0..warmup(n) {
        d.launch_empty(f, s)?;
    }
    s.synchronize()?;
    sample(k, || {
        let start = Instant::now();
        for _ in 0..n {
            d.launch_empty(f, s)?;
        }
        // Each sample waits for its own launches, so none runs on into the next.
        s.synchronize()?;
        Ok(micros_per_call(start.elapsed(), n))
    })
}

/// A launch then a synchronize of its stream: microseconds per pair.
fn launch_sync(d: &Driver, f: &Function<'_>, s: &Stream<'_>, k: usize, n: u32) -> driver::Result<Summary> {
    latency_us(k, n, || {
        d.launch_empty(f, s)?;
        s.synchronize()
    })
}

fn outcome(r: driver::Result<Summary>) -> Outcome {
    r.map_or_else(|e| Outcome::Error(e.to_string()), Outcome::Measured)
}

/// Whether [`SMALL`] round-trips through 4 device bytes from `malloc`'d
/// memory, counted in `checks`.
fn check_small_copies(d: &Driver, checks: &mut Checks) -> Result<(), String> {
    let dev = d.alloc(4).map_err(|e| e.to_string())?;
    let mut back = [0u8; 4];
    d.htod(&dev, &SMALL).and_then(|()| d.dtoh(&mut back, &dev)).map_err(|e| e.to_string())?;
    if back != SMALL {
        checks.failed.push(format!("4 B round trip: wrote {SMALL:02x?}, read back {back:02x?}"));
        return Err("data check failed (4 B round trip)".into());
    }
    checks.passed += 1;
    Ok(())
}

/// 1 MiB allocated and freed: microseconds per pair. What a pair costs
/// depends on what else is allocated: in a C loop on the H100, with nothing
/// else allocated a pair took 57-72 µs, with 4 B or 64 KiB held 1.8-3.6 µs,
/// and with 4 MiB held about 60 again. A small live allocation seemingly
/// keeps the driver's suballocation block mapped, where otherwise each pair
/// maps and unmaps its own. The rig therefore holds no device memory: the
/// plain row is the empty heap (the brief's 63 µs baseline), and
/// [`ALLOC_FREE_1MIB_BESIDE`] holds 4 B, where native is a few µs and
/// gpuplex's round trip for the allocation's address shows in full.
///
/// On the empty heap a pair also ran slow in spells of seconds (85-100 µs
/// instead of 62-72), natively and through gpuplex alike, with the whole
/// driver slowing (`cuMemGetInfo` 5.3 to 7.0 µs) while arithmetic did not;
/// profiled, the extra time was spread over libcuda, nvidia.ko and the
/// kernel, as on a CPU far from its memory. Hence the turns of
/// `latency.rs`.
fn alloc_free(d: &Driver, k: usize, n: u32) -> driver::Result<Summary> {
    latency_us(k, n, || d.alloc(MIB)?.free())
}

/// Host buffers of one kind, as large as the largest transfer.
enum HostBuffers<'d> {
    Pageable(Vec<u8>, Vec<u8>),
    Pinned(driver::PinnedBuffer<'d>, driver::PinnedBuffer<'d>),
}

impl<'d> HostBuffers<'d> {
    fn new(d: &'d Driver, mem: HostMemory, len: usize) -> driver::Result<HostBuffers<'d>> {
        Ok(match mem {
            // Zeroed pages are mapped on first touch; every byte is written before any timing.
            HostMemory::Pageable => HostBuffers::Pageable(vec![0; len], vec![0; len]),
            HostMemory::Pinned => HostBuffers::Pinned(d.alloc_host(len)?, d.alloc_host(len)?),
        })
    }

    fn split(&mut self) -> (&mut [u8], &mut [u8]) {
        match self {
            HostBuffers::Pageable(a, b) => (a, b),
            HostBuffers::Pinned(a, b) => (a, b),
        }
    }
}

/// Every bandwidth row: for each kind of host memory and size, synchronous
/// copies host->device then device->host, in GB/s. Each way, each sample of
/// each size is `plan.copy_time` of copies.
fn bandwidth(d: &Driver, plan: &Plan, checks: &mut Checks) -> Vec<(String, Outcome)> {
    let largest = plan.sizes.iter().copied().max().unwrap_or(0);
    let mut out = Vec::new();
    let fail_all = |out: &mut Vec<_>, mem: Option<HostMemory>, e: String| {
        for m in [HostMemory::Pageable, HostMemory::Pinned].into_iter().filter(|&m| mem.is_none_or(|x| x == m)) {
            for dir in [Direction::HostToDevice, Direction::DeviceToHost] {
                for &bytes in plan.sizes {
                    out.push((bandwidth_metric(dir, m, bytes), Outcome::Error(e.clone())));
                }
            }
        }
    };
    let dev = match d.alloc(largest) {
        Ok(dev) => dev,
        Err(e) => {
            fail_all(&mut out, None, e.to_string());
            return out;
        }
    };
    for mem in [HostMemory::Pageable, HostMemory::Pinned] {
        let mut host = match HostBuffers::new(d, mem, largest) {
            Ok(h) => h,
            Err(e) => {
                fail_all(&mut out, Some(mem), e.to_string());
                continue;
            }
        };
        let (src, dst) = host.split();
        for (i, &bytes) in plan.sizes.iter().enumerate() {
            let seed = ((mem as u64) << 8) | i as u64;
            let (htod, dtoh) = copy_pair(d, &dev, &mut src[..bytes], &mut dst[..bytes], plan, seed);
            let (htod, dtoh) = match (htod, dtoh) {
                (Ok(h), Ok(t)) if src[..bytes] == dst[..bytes] => {
                    checks.passed += 1;
                    (Outcome::Measured(h), Outcome::Measured(t))
                }
                (Ok(_), Ok(_)) => {
                    let what = format!("{} {} round trip", mem.name(), size_label(bytes));
                    checks.failed.push(format!("{what}: the bytes read back differ from those written"));
                    let e = format!("data check failed ({what})");
                    (Outcome::Error(e.clone()), Outcome::Error(e))
                }
                // A copy whose partner failed cannot be checked, so it reports no bandwidth either.
                (h, t) => (unchecked(h), unchecked(t)),
            };
            out.push((bandwidth_metric(Direction::HostToDevice, mem, bytes), htod));
            out.push((bandwidth_metric(Direction::DeviceToHost, mem, bytes), dtoh));
        }
    }
    out
}

fn unchecked(r: Result<Summary, String>) -> Outcome {
    Outcome::Error(r.err().unwrap_or_else(|| "not checked: the copy the other way failed".into()))
}

fn gb_per_s(bytes: usize, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e9
}

/// Fills `src` with a pattern, times copies of it to the device, poisons
/// `dst`, then times copies back into it: GB/s each way. The caller
/// compares `dst` with `src`, which checks the last copy each way.
fn copy_pair(
    d: &Driver,
    dev: &DeviceBuffer<'_>,
    src: &mut [u8],
    dst: &mut [u8],
    plan: &Plan,
    seed: u64,
) -> (Result<Summary, String>, Result<Summary, String>) {
    fill_pattern(src, seed);
    let bytes = src.len();
    let (k, time) = (plan.samples, plan.copy_time);
    let htod = copy_bandwidth(bytes, k, time, || d.htod(dev, src)).map_err(|e| e.to_string());
    // A copy that moves nothing leaves the poison, and fails the check.
    dst.fill(0xA5);
    let dtoh = copy_bandwidth(bytes, k, time, || d.dtoh(dst, dev)).map_err(|e| e.to_string());
    (htod, dtoh)
}

/// GB/s of `copy`, which moves `bytes`: after one warm-up copy, each of `k`
/// samples repeats it for `copy_time`.
fn copy_bandwidth(
    bytes: usize,
    k: usize,
    copy_time: Duration,
    mut copy: impl FnMut() -> driver::Result<()>,
) -> driver::Result<Summary> {
    copy()?;
    sample(k, || Ok(gb_per_s(bytes, repeat_for(copy_time, &mut copy)?)))
}

/// Seconds per call of `op`, repeated until `min_time` has passed (at least once).
fn repeat_for(min_time: Duration, mut op: impl FnMut() -> driver::Result<()>) -> driver::Result<f64> {
    let (start, mut n) = (Instant::now(), 0u32);
    loop {
        op()?;
        n += 1;
        let elapsed = start.elapsed();
        if elapsed >= min_time {
            return Ok(elapsed.as_secs_f64() / n as f64);
        }
    }
}

/// Pseudo-random bytes from `seed` in a block of prime length, tiled: no
/// misplaced chunk of a power-of-two size matches, and tiling runs at memcpy
/// speed.
fn fill_pattern(buf: &mut [u8], seed: u64) {
    const BLOCK: usize = 65_521;
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let block: Vec<u8> = (0..BLOCK.min(buf.len()))
        .map(|_| {
            // xorshift64
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 32) as u8
        })
        .collect();
    for chunk in buf.chunks_mut(BLOCK) {
        chunk.copy_from_slice(&block[..chunk.len()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_takes_samples_many_and_stops_at_an_error() {
        let mut values = [9.0, 1.0, 4.0, 7.0, 3.0, 100.0].into_iter();
        let s = sample(5, || values.next().ok_or("ran out")).unwrap();
        assert_eq!((s.median, s.min, s.max, s.values.len()), (4.0, 1.0, 9.0, 5));
        assert_eq!(values.next(), Some(100.0), "no sample beyond the five asked for");
        let mut calls = 0;
        let failed = sample(5, || {
            calls += 1;
            if calls == 2 {
                Err("broke")
            } else {
                Ok(1.0)
            }
        });
        assert_eq!((failed, calls), (Err("broke"), 2));
    }

    #[test]
    fn latency_samples_are_whole_loops_after_one_warm_up() {
        let mut calls = 0u32;
        let s = latency_us(5, 40, || {
            calls += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(calls, warmup(40) + 5 * 40);
        assert_eq!(s.values.len(), 5);
        assert!(s.min <= s.median && s.median <= s.max, "{s:?}");
    }

    #[test]
    fn bandwidth_samples_last_the_copy_time_and_are_in_gb_per_s() {
        // Copies of at least 2 ms: each sample's 1 ms holds just one.
        let mut copies = 0u32;
        let s = copy_bandwidth(4_000_000, 5, Duration::from_millis(1), || {
            copies += 1;
            std::thread::sleep(Duration::from_millis(2));
            Ok(())
        })
        .unwrap();
        assert_eq!(copies, 1 + 5, "a warm-up, then one copy per sample");
        assert_eq!(s.values.len(), 5);
        // 4 MB in 2 ms or more is at most 2 GB/s.
        assert!(0.0 < s.min && s.min <= s.median && s.median <= s.max && s.max <= 2.0, "{s:?}");
    }

    #[test]
    fn patterns_differ_by_seed_and_do_not_repeat_at_powers_of_two() {
        let (mut a, mut b) = (vec![0u8; 1 << 18], vec![0u8; 1 << 18]);
        fill_pattern(&mut a, 1);
        fill_pattern(&mut b, 2);
        assert_ne!(a, b);
        for shift in [1 << 12, 1 << 16, 1 << 17] {
            assert_ne!(a[..4096], a[shift..shift + 4096], "period {shift}");
        }
        assert!(a.iter().any(|&x| x != 0xA5));
    }
}
