//! Reference kernels: what the emulated device runs instead of machine code.
//!
//! The emulated device has no GPU, so it cannot execute a kernel's SASS or
//! PTX. The kernels of the test programs (`tests/cuda/*.cu` of the
//! driver-API programs, `tests/cuda/runtime/*.cu` of the runtime-API ones,
//! whose names are mangled C++) are registered here by their exact symbol
//! name, each with a Rust
//! implementation that computes exactly what the CUDA kernel computes over
//! the whole grid. That lets the CI end-to-end tests exercise the launch
//! path honestly: the parameter layout read from the cubin, the packed
//! parameter buffer, and the kernel's effect on device memory. Any other
//! kernel is refused with `CUDA_ERROR_NOT_SUPPORTED` by the caller. The
//! empty and busy kernels of `gpuplex bench` are registered too, so that
//! the bench can check its paths without a GPU.
//!
//! Parameters and memory come from the guest: every access is checked, and
//! work is done in bounded chunks so that no launch makes the server allocate
//! more than a chunk at a time.

use gpuplex_protocol::CuError;

use crate::backend::ParamSlot;

/// What a reference kernel sees of one launch.
pub struct KernelLaunch<'a> {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem: u32,
    /// The packed parameter buffer, laid out as `layout` says.
    pub params: &'a [u8],
    pub layout: &'a [ParamSlot],
}

/// Device memory as a reference kernel reads and writes it. Addresses are
/// device addresses; any access outside a live allocation fails with
/// CuError::ILLEGAL_ADDRESS.
pub trait DeviceMemory {
    fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), CuError>;
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), CuError>;

    /// The bytes of element `(x, y)` of texture object `tex`, point-sampled
    /// (`y` 0 for a fetch from linear memory). Only the kinds of texture the
    /// test programs sample are emulated; others are NOT_SUPPORTED.
    fn texel(&self, _tex: u64, _x: i64, _y: i64, _out: &mut [u8]) -> Result<(), CuError> {
        Err(CuError::NOT_SUPPORTED)
    }

    /// Writes `data` at byte `x` of row `y` of surface object `surf`.
    fn surface_write(&mut self, _surf: u64, _x: i64, _y: i64, _data: &[u8]) -> Result<(), CuError> {
        Err(CuError::NOT_SUPPORTED)
    }

    /// `cudaGraphSetConditional(handle, value)`.
    fn set_conditional(&mut self, _handle: u64, _value: u32) -> Result<(), CuError> {
        Err(CuError::NOT_SUPPORTED)
    }
}

pub type ReferenceKernel = fn(&KernelLaunch<'_>, &mut dyn DeviceMemory) -> Result<(), CuError>;

/// The reference implementation registered for a kernel symbol, if any.
pub fn lookup(name: &str) -> Option<ReferenceKernel> {
    match name {
        "vector_add" => Some(vector_add),
        "spin" => Some(spin),
        "update_globals" => Some(update_globals),
        "mixed_params" => Some(mixed_params),
        // tests/cuda/tenancy.cu
        "sleep_ms" => Some(sleep_ms),
        "peek_poke" => Some(peek_poke),
        "wild_write" => Some(wild_write),
        "say" => Some(say),
        "check" => Some(check),
        "affine" => Some(affine),
        // tests/cuda/queries.cu
        "shared_reverse" => Some(shared_reverse),
        // `gpuplex bench`'s launch benchmarks (crates/cli/src/bench/worker.rs).
        "gpuplex_bench_empty" => Some(empty),
        // `gpuplex bench --tenants` (crates/cli/src/bench/tenants/child.rs).
        "gpuplex_bench_busy" => Some(busy),
        // tests/cuda/runtime: C++ kernels, by mangled name.
        "_Z9vectorAddPKfS0_Pfi" => Some(vector_add),
        "_Z8scaleAddPiPKiiii" => Some(scale_add),
        "_Z9matrixMulPfPKfS1_ii" => Some(matrix_mul),
        "_Z4axpyIiEvT_PKS0_PS0_i" => Some(axpy_i32),
        "_Z4axpyIfEvT_PKS0_PS0_i" => Some(axpy_f32),
        "_Z4axpyIdEvT_PKS0_PS0_i" => Some(axpy_f64),
        "_Z9transformIi6AffineIiEEvPT_iT0_" => Some(transform_affine_i32),
        "_Z9transformId6AffineIdEEvPT_iT0_" => Some(transform_affine_f64),
        "_Z12histogram256PKhiPj" => Some(histogram256),
        "_Z9sumAndMaxPKiiPiPfS1_" => Some(sum_and_max),
        "_Z10casTicketsPjS_i" => Some(cas_tickets),
        "_Z8blockSumPKiPii" => Some(block_sum),
        "_Z13sharedReversePKiPii" => Some(shared_reverse),
        "_Z10useSymbolsPKiPKfPfi" => Some(use_symbols),
        "_Z8texShiftPfyiiii" => Some(tex_shift),
        "_Z10fetchTwicePiyi" => Some(fetch_twice),
        "_Z8surfFillyii" => Some(surf_fill),
        "_Z12setConditionPKiy" => Some(set_condition),
        "_Z5addToPii" => Some(add_to),
        "_Z9countDownPiS_y" => Some(count_down),
        _ => None,
    }
}

/// Elements a reference kernel holds in host memory at once.
const CHUNK: u64 = 1 << 16;

/// Threads a reference runs one after another through the same few loads
/// and stores, at most. Their number is the grid's, which the guest picks
/// independently of the memory touched (up to 2^42 on this device), and the
/// device is locked while a kernel runs: past this a launch is refused with
/// NOT_SUPPORTED, as a shape the reference does not cover.
const MAX_SERIAL_THREADS: u64 = 1024;

/// Multiply-adds (or stores, where `wA < 16`) one `matrixMul` launch may ask
/// of its reference: the grid and `wA` are the guest's to pick, and with
/// `wB == 0` every row rereads and rewrites the same memory, so the memory
/// it holds bounds nothing. The test program's product takes under 2^20.
const MAX_PRODUCT: u64 = 1 << 28;

/// The threads that share each x index, if the reference may run them in turn.
fn serial_threads(k: &KernelLaunch<'_>) -> Result<u64, CuError> {
    Some(k.threads_per_x()).filter(|&n| n <= MAX_SERIAL_THREADS).ok_or(CuError::NOT_SUPPORTED)
}

impl KernelLaunch<'_> {
    /// The bytes of parameter `i`, which must be exactly `N` bytes long.
    pub fn param<const N: usize>(&self, i: usize) -> Result<[u8; N], CuError> {
        let slot = self.layout.get(i).ok_or(CuError::INVALID_VALUE)?;
        if slot.size as usize != N {
            return Err(CuError::INVALID_VALUE);
        }
        let start = slot.offset as usize;
        let bytes = self.params.get(start..start + N).ok_or(CuError::INVALID_VALUE)?;
        let mut out = [0; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    pub fn i8_param(&self, i: usize) -> Result<i8, CuError> {
        self.param(i).map(i8::from_le_bytes)
    }

    pub fn i16_param(&self, i: usize) -> Result<i16, CuError> {
        self.param(i).map(i16::from_le_bytes)
    }

    pub fn i32_param(&self, i: usize) -> Result<i32, CuError> {
        self.param(i).map(i32::from_le_bytes)
    }

    pub fn u32_param(&self, i: usize) -> Result<u32, CuError> {
        self.param(i).map(u32::from_le_bytes)
    }

    pub fn u64_param(&self, i: usize) -> Result<u64, CuError> {
        self.param(i).map(u64::from_le_bytes)
    }

    pub fn f64_param(&self, i: usize) -> Result<f64, CuError> {
        self.param(i).map(f64::from_le_bytes)
    }

    /// A pointer parameter: a device address.
    pub fn ptr_param(&self, i: usize) -> Result<u64, CuError> {
        self.u64_param(i)
    }

    /// Threads along x over the whole grid: the range of
    /// `blockIdx.x * blockDim.x + threadIdx.x`.
    pub fn threads_x(&self) -> u64 {
        self.grid[0] as u64 * self.block[0] as u64
    }

    /// Threads that share each x index (their y and z indices differ).
    pub fn threads_per_x(&self) -> u64 {
        [self.grid[1], self.grid[2], self.block[1], self.block[2]].iter().map(|&d| d as u64).product()
    }
}

/// `base + index * size`, or ILLEGAL_ADDRESS where that leaves the address space.
fn element(base: u64, index: u64, size: u64) -> Result<u64, CuError> {
    index.checked_mul(size).and_then(|off| base.checked_add(off)).ok_or(CuError::ILLEGAL_ADDRESS)
}

macro_rules! typed_access {
    ($read:ident, $write:ident, $t:ty) => {
        /// Reads `n` consecutive values at `addr`.
        pub fn $read(mem: &dyn DeviceMemory, addr: u64, n: usize) -> Result<Vec<$t>, CuError> {
            const SIZE: usize = std::mem::size_of::<$t>();
            element(addr, n as u64, SIZE as u64)?;
            let mut bytes = vec![0; n * SIZE];
            mem.read(addr, &mut bytes)?;
            Ok(bytes.chunks_exact(SIZE).map(|b| <$t>::from_le_bytes(b.try_into().expect("SIZE bytes"))).collect())
        }

        /// Writes `values` consecutively at `addr`.
        pub fn $write(mem: &mut dyn DeviceMemory, addr: u64, values: &[$t]) -> Result<(), CuError> {
            element(addr, values.len() as u64, std::mem::size_of::<$t>() as u64)?;
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            mem.write(addr, &bytes)
        }
    };
}

typed_access!(read_f32s, write_f32s, f32);
typed_access!(read_i32s, write_i32s, i32);
typed_access!(read_u32s, write_u32s, u32);
typed_access!(read_u64s, write_u64s, u64);
typed_access!(read_f64s, write_f64s, f64);

fn read_i32(mem: &dyn DeviceMemory, addr: u64) -> Result<i32, CuError> {
    Ok(read_i32s(mem, addr, 1)?[0])
}

fn write_i32(mem: &mut dyn DeviceMemory, addr: u64, value: i32) -> Result<(), CuError> {
    write_i32s(mem, addr, &[value])
}

/// `vector_add(const float *a, const float *b, float *c, int n)`:
/// `c[i] = a[i] + b[i]` for every thread index `i < n`.
fn vector_add(k: &KernelLaunch<'_>, mem: &mut dyn DeviceMemory) -> Result<(), CuError> {
    let (a, b, c) = (k.ptr_param(0)?, k.ptr_param(1)?, k.ptr_param(2)?);
    let n = k.i32_param(3)?.max(0) as u64;
    let count = n.min(k.threads_x());
    let mut start = 0;
    while start < count {
        let len = CHUNK.min(count - start) as usize;
        let xs = read_f32s(mem, element(a, start, 4)?, len)?;
        let ys = read_f32s(mem, element(b, start, 4)?, len)?;
        let sums: Vec<f32> = xs.iter().zip(&ys).map(|(x, y)| x + y).collect();
        write_f32s(mem, element(c, start, 4)?, &sums)?;
        start += len as u64;
    }
    Ok(())
}

/// `x -> x * 1664525 + 1013904223` applied `times` times, in O(log times)
/// steps by squaring the affine map, so that long spins cost the server
/// nothing.
fn lcg_steps(x: u32, times: u32) -> u32 {
    let (mut mul, mut add) = (1u32, 0u32); // the identity map
    let (mut base_mul, mut base_add) = (1664525u32, 1013904223u32);
    let mut k = times;
    while k > 0 {
        if k & 1 == 1 {
            add = add.wrapping_mul(base_mul).wrapping_add(base_add);
            mul = mul.wrapping_mul(base_mul);
        }
        base_add = base_add.wrapping_mul(base_mul).wrapping_add(base_add);
        base_mul = base_mul.wrapping_mul(base_mul);
        k >>= 1;
    }
    x.wrapping_mul(mul).wrapping_add(add)
}

/// `spin(unsigned *out, unsigned seed, unsigned iters)`: every thread `i`
/// steps the LCG `iters` times from `seed + i` and stores it in `out[i]`.
fn spin(k: &KernelLaunch<'_>, mem: &mut dyn DeviceMemory) -> Result<(), CuError> {
    let (out, seed, iters) = (k.ptr_param(0)?, k.u32_param(1)?, k.u32_param(2)?);
    let total = k.threads_x();
    let mut start = 0;
    while start < total {
        let len = CHUNK.min(total - start);
        // The index is an unsigned int on the device.
        let values: Vec<u32> = (start..start + len).map(|i| lcg_steps(seed.wrapping_add(i as u32), iters)).collect();
        write_u32s(mem, element(out, start, 4)?, &values)?;
        start += len;
    }
    Ok(())
}

/// `update_globals(int *counter, const int *table, int *uninit, int *out)`,
/// run by each thread with `blockIdx.x == 0 && threadIdx.x == 0`, in turn.
/// The CUDA kernel reaches the globals through their symbols and reports in
/// `out[0]` which of the passed addresses match them; the reference can only
/// use the addresses, and reports them all matching (7). Every load and store
/// happens in the kernel's order, so aliasing arguments behave as on the GPU.
/// At most [`MAX_SERIAL_THREADS`] such threads.
fn update_globals(k: &KernelLaunch<'_>, mem: &mut dyn DeviceMemory) -> Result<(), CuError> {
    let (counter, table, uninit, out) = (k.ptr_param(0)?, k.ptr_param(1)?, k.ptr_param(2)?, k.ptr_param(3)?);
    if k.threads_x() == 0 {
        return Ok(());
    }
    for _ in 0..serial_threads(k)? {
        write_i32(mem, out, 7)?;
        for i in 0..8 {
            let product = read_i32(mem, element(table, i, 4)?)?.wrapping_mul(read_i32(mem, counter)?);
            write_i32(mem, element(out, 1 + i, 4)?, product)?;
        }
        let next = read_i32(mem, counter)?.wrapping_add(1);
        write_i32(mem, counter, next)?;
        for i in 0..4 {
            let value = read_i32(mem, counter)?.wrapping_mul(i as i32 + 1);
            write_i32(mem, element(uninit, i, 4)?, value)?;
        }
    }
    Ok(())
}

/// `mixed_params(char c, short s, int i, double d, Pod p, float *f, int *ip,
/// unsigned long long u, unsigned long long *out)` with
/// `struct Pod { int a; double b; char c[5]; }` (24 bytes: a at 0, b at 8, c
/// at 16): every thread with `blockIdx.x == 0 && threadIdx.x == 0` stores
/// each value received as one 64-bit slot of `out`, in parameter order, then
/// `*f` as float bits and `*ip` sign-extended. At most [`MAX_SERIAL_THREADS`]
/// such threads.
fn mixed_params(k: &KernelLaunch<'_>, mem: &mut dyn DeviceMemory) -> Result<(), CuError> {
    let pod: [u8; 24] = k.param(4)?;
    let pod_a = i32::from_le_bytes(pod[0..4].try_into().expect("4 bytes"));
    let pod_b = u64::from_le_bytes(pod[8..16].try_into().expect("8 bytes"));
    let mut chars = [0u8; 8];
    chars[..5].copy_from_slice(&pod[16..21]);
    let (f, ip, out) = (k.ptr_param(5)?, k.ptr_param(6)?, k.ptr_param(8)?);
    let slots = [
        k.i8_param(0)? as i64 as u64,
        k.i16_param(1)? as i64 as u64,
        k.i32_param(2)? as i64 as u64,
        k.f64_param(3)?.to_bits(),
        pod_a as i64 as u64,
        pod_b,
        u64::from_le_bytes(chars),
        f,
        ip,
        k.u64_param(7)?,
    ];
    if k.threads_x() == 0 {
        return Ok(());
    }
    for _ in 0..serial_threads(k)? {
        write_u64s(mem, out, &slots)?;
        let f_bits = read_f32s(mem, f, 1)?[0].to_bits();
        write_u64s(mem, element(out, 10, 8)?, &[f_bits as u64])?;
        let pointee = read_i32(mem, ip)?;
        write_u64s(mem, element(out, 11, 8)?, &[pointee as i64 as u64])?;
    }
    Ok(())
}

/// `gpuplex_bench_empty()`: does nothing, so a launch costs only its overhead.
fn empty(_: &KernelLaunch<'_>, _: &mut dyn DeviceMemory) -> Result<(), CuError> {
    Ok(())
}

/// `gpuplex_bench_busy(u64 ns)`: on a GPU every thread waits `ns` on the
/// GPU's clock. The emulated device has no GPU time to share, so it takes
/// the parameter and returns: the bench checks its paths, not its numbers.
fn busy(k: &KernelLaunch<'_>, _: &mut dyn DeviceMemory) -> Result<(), CuError> {
    k.u64_param(0).map(drop)
}

/// The longest `sleep_ms` the emulated device takes: a test kernel, not a
/// way to hold the device.
const MAX_SLEEP_MS: u32 = 60_000;

/// `sleep_ms(unsigned ms)`: on the GPU one thread waits `ms` milliseconds
/// (the others return at once), a kernel that simply runs long.
fn sleep_ms(k: &KernelLaunch<'_>, _: &mut dyn DeviceMemory) -> Result<(), CuError> {
    let ms = k.u32_param(0)?;
    if k.threads_x() > 0 {
        std::thread::sleep(std::time::Duration::from_millis(ms.min(MAX_SLEEP_MS).into()));
    }
    Ok(())
}

/// `peek_poke(u64 *target, u64 *seen, u64 value)`: `*seen = *target;
/// *target = value;` (each thread in turn; all write the same).
fn peek_poke(k: &KernelLaunch<'_>, mem: &mut dyn DeviceMemory) -> Result<(), CuError> {
    let (target, seen, value) = (k.ptr_param(0)?, k.ptr_param(1)?, k.u64_param(2)?);
    if k.threads_x() == 0 {
        return Ok(());
    }
    let old = read_u64s(mem, target, 1)?;
    write_u64s(mem, seen, &old)?;
    write_u64s(mem, target, &[value])
}

/// `wild_write(unsigned *p)`: `p[threadIdx.x] = 1`.
fn wild_write(k: &KernelLaunch<'_>, mem: &mut dyn DeviceMemory) -> Result<(), CuError> {
    let p = k.ptr_param(0)?;
    for i in 0..k.block[0].min(CHUNK as u32) as u64 {
        write_u32s(mem, element(p, i, 4)?, &[1])?;
    }
    Ok(())
}

/// `say(int round)`: each thread prints `device round R thread T` with the
/// device's `printf`, which the driver writes to the process's C `stdout`.
fn say(k: &KernelLaunch<'_>, _: &mut dyn DeviceMemory) -> Result<(), CuError> {
    let round = k.i32_param(0)?;
    let threads = k.threads_x().saturating_mul(k.threads_per_x());
    let lines =
        (0..threads.min(CHUNK)).map(|t| format!("device round {round} thread {}\n", t % u64::from(k.block[0].max(1))));
    c_stream(false, &lines.collect::<String>());
    Ok(())
}

/// `check(int v)`: `assert(v == 0)`, as a failed device assert reports
/// itself (on the C `stderr`, for the first failing thread) and then
/// poisons the context.
fn check(k: &KernelLaunch<'_>, _: &mut dyn DeviceMemory) -> Result<(), CuError> {
    if k.i32_param(0)? == 0 || k.threads_x() == 0 {
        return Ok(());
    }
    c_stream(true, "tenancy.cu:20: void check(int): block: [0,0,0], thread: [0,0,0] Assertion `v == 0` failed.\n");
    Err(CuError::ASSERT)
}

/// `affine(unsigned *out, unsigned a, unsigned b, unsigned n)`:
/// `out[i] = a * i + b` for every thread index `i < n`.
fn affine(k: &KernelLaunch<'_>, mem: &mut dyn DeviceMemory) -> Result<(), CuError> {
    let (out, a, b, n) = (k.ptr_param(0)?, k.u32_param(1)?, k.u32_param(2)?, k.u32_param(3)?);
    let count = u64::from(n).min(k.threads_x());
    let mut start = 0;
    while start < count {
        let len = CHUNK.min(count - start);
        let values: Vec<u32> = (start..start + len).map(|i| a.wrapping_mul(i as u32).wrapping_add(b)).collect();
        write_u32s(mem, element(out, start, 4)?, &values)?;
        start += len;
    }
    Ok(())
}

/// Writes to this process's C `stdout` (or `stderr`), as the driver prints
/// what kernels print.
fn c_stream(stderr: bool, text: &str) {
    extern "C" {
        #[link_name = "stdout"]
        static mut C_STDOUT: *mut libc::FILE;
        #[link_name = "stderr"]
        static mut C_STDERR: *mut libc::FILE;
    }
    // SAFETY: the C library's own streams, written with a live buffer and
    // its length; stdio locks the stream itself.
    unsafe {
        let stream = if stderr { C_STDERR } else { C_STDOUT };
        libc::fwrite(text.as_ptr().cast(), 1, text.len(), stream);
        libc::fflush(stream);
    }
}

// ---- the kernels of tests/cuda/runtime ----
//
// Most of them are written for one-dimensional launches and are racy or
// compute something else in other shapes: their references refuse any
// other shape with NOT_SUPPORTED rather than guess.

/// NOT_SUPPORTED unless grid and block are one-dimensional.
fn one_dimensional(k: &KernelLaunch<'_>) -> Result<(), CuError> {
    if k.grid[1..] != [1, 1] || k.block[1..] != [1, 1] {
        return Err(CuError::NOT_SUPPORTED);
    }
    Ok(())
}

/// `min(n, threads)`: the indices `i < n` that a one-thread-per-element
/// kernel covers.
fn covered(k: &KernelLaunch<'_>, n: i32) -> u64 {
    (n.max(0) as u64).min(k.threads_x())
}

type Read<T> = fn(&dyn DeviceMemory, u64, usize) -> Result<Vec<T>, CuError>;
type Write<T> = fn(&mut dyn DeviceMemory, u64, &[T]) -> Result<(), CuError>;

/// `dst[i] = f(src[i])` for `i < count`, in chunks; `dst` may be `src`.
fn map_chunks<T>(
    mem: &mut dyn DeviceMemory,
    count: u64,
    (src, dst): (u64, u64),
    (read, write): (Read<T>, Write<T>),
    f: impl Fn(T) -> T,
) -> Result<(), CuError> {
    let size = std::mem::size_of::<T>() as u64;
    let mut start = 0;
    while start < count {
        let len = CHUNK.min(count - start);
        let values: Vec<T> = read(mem, element(src, start, size)?, len as usize)?.into_iter().map(&f).collect();
        write(mem, element(dst, start, size)?, &values)?;
        start += len;
    }
    Ok(())
}

/// `scaleAdd(int *out, const int *in, int scale, int offset, int n)`:
/// `out[i] = in[i] * scale + offset` for `i < n`.
fn scale_add(k: &KernelLaunch<'_>, mem: &mut dyn DeviceMemory) -> Result<(), CuError> {
    one_dimensional(k)?;
    let (out, input) = (k.ptr_param(0)?, k.ptr_param(1)?);
    let (scale, offset, n) = (k.i32_param(2)?, k.i32_param(3)?, k.i32_param(4)?);
    let count = covered(k, n);
    map_chunks(mem, count, (input, out), (read_i32s, write_i32s), |v| v.wrapping_mul(scale).wrapping_add(offset))
}

/// `matrixMul(float *C, const float *A, const float *B, int wA, int wB)`,
/// 16x16 tiles: launched with 16x16 blocks over a 2-D grid, the thread at
/// `(row, col)` stores `C[row * wB + col]`, the sum over `k < 16 * (wA / 16)`
/// of `A[row * wA + k] * B[k * wB + col]`, accumulated in order with fused
/// multiply-adds as the GPU does. A product of more than [`MAX_PRODUCT`]
/// steps is NOT_SUPPORTED.
fn matrix_mul(k: &KernelLaunch<'_>, mem: &mut dyn DeviceMemory) -> Result<(), CuError> {
    const TILE: u32 = 16;
    if k.block != [TILE, TILE, 1] || k.grid[2] != 1 {
        return Err(CuError::NOT_SUPPORTED);
    }
    let (c, a, b) = (k.ptr_param(0)?, k.ptr_param(1)?, k.ptr_param(2)?);
    let (wa, wb) = (k.i32_param(3)?, k.i32_param(4)?);
    if wa < 0 || wb < 0 {
        return Err(CuError::NOT_SUPPORTED);
    }
    let (wa, wb) = (wa as u64, wb as u64);
    let depth = wa / TILE as u64 * TILE as u64;
    let (rows, cols) = (k.grid[1] as u64 * TILE as u64, k.grid[0] as u64 * TILE as u64);
    if rows.saturating_mul(cols).saturating_mul(depth.max(1)) > MAX_PRODUCT {
        return Err(CuError::NOT_SUPPORTED);
    }
    for row in 0..rows {
        let mut col0 = 0;
        while col0 < cols {
            let width = CHUNK.min(cols - col0);
            let mut acc = vec![0f32; width as usize];
            for kk in 0..depth {
                let x = read_f32s(mem, element(a, row * wa + kk, 4)?, 1)?[0];
                let ys = read_f32s(mem, element(b, kk * wb + col0, 4)?, width as usize)?;
                for (sum, y) in acc.iter_mut().zip(ys) {
                    *sum = x.mul_add(y, *sum);
                }
            }
            write_f32s(mem, element(c, row * wb + col0, 4)?, &acc)?;
            col0 += width;
        }
    }
    Ok(())
}

/// `axpy<int>(int a, const int *x, int *y, int n)`: `y[i] = a * x[i] + y[i]`
/// for `i < n`.
fn axpy_i32(k: &KernelLaunch<'_>, mem: &mut dyn DeviceMemory) -> Result<(), CuError> {
    one_dimensional(k)?;
    let (a, x, y, n) = (k.i32_param(0)?, k.ptr_param(1)?, k.ptr_param(2)?, k.i32_param(3)?);
    let count = covered(k, n);
    let mut start = 0;
    while start < count {
        let len = CHUNK.min(count - start) as usize;
        let xs = read_i32s(mem, element(x, start, 4)?, len)?;
        let ys = read_i32s(mem, element(y, start, 4)?, len)?;
        let out: Vec<i32> = xs.iter().zip(&ys).map(|(&xv, &yv)| a.wrapping_mul(xv).wrapping_add(yv)).collect();
        write_i32s(mem, element(y, start, 4)?, &out)?;
        start += len as u64;
    }
    Ok(())
}

/// `axpy<float>`, as `axpy_i32` with one fused multiply-add.
fn axpy_f32(k: &KernelLaunch<'_>, mem: &mut dyn DeviceMemory) -> Result<(), CuError> {
    one_dimensional(k)?;
    let a = f32::from_bits(k.u32_param(0)?);
    let (x, y, n) = (k.ptr_param(1)?, k.ptr_param(2)?, k.i32_param(3)?);
    let count = covered(k, n);
    let mut start = 0;
    while start < count {
        let len = CHUNK.min(count - start) as usize;
        let xs = read_f32s(mem, element(x, start, 4)?, len)?;
        let ys = read_f32s(mem, element(y, start, 4)?, len)?;
        let out: Vec<f32> = xs.iter().zip(&ys).map(|(&xv, &yv)| a.mul_add(xv, yv)).collect();
        write_f32s(mem, element(y, start, 4)?, &out)?;
        start += len as u64;
    }
    Ok(())
}

/// `axpy<double>`, as `axpy_f32` in double precision.
fn axpy_f64(k: &KernelLaunch<'_>, mem: &mut dyn DeviceMemory) -> Result<(), CuError> {
    one_dimensional(k)?;
    let (a, x, y, n) = (k.f64_param(0)?, k.ptr_param(1)?, k.ptr_param(2)?, k.i32_param(3)?);
    let count = covered(k, n);
    let mut start = 0;
    while start < count {
        let len = CHUNK.min(count - start) as usize;
        let xs = read_f64s(mem, element(x, start, 8)?, len)?;
        let ys = read_f64s(mem, element(y, start, 8)?, len)?;
        let out: Vec<f64> = xs.iter().zip(&ys).map(|(&xv, &yv)| a.mul_add(xv, yv)).collect();
        write_f64s(mem, element(y, start, 8)?, &out)?;
        start += len as u64;
    }
    Ok(())
}

/// `transform<int, Affine<int>>(int *data, int n, Affine<int> f)` with
/// `struct Affine { int mul, add; }`: `data[i] = data[i] * mul + add` for
/// every `i < n` (a grid-stride loop: any non-empty grid covers them all).
fn transform_affine_i32(k: &KernelLaunch<'_>, mem: &mut dyn DeviceMemory) -> Result<(), CuError> {
    one_dimensional(k)?;
    let (data, n, f) = (k.ptr_param(0)?, k.i32_param(1)?, k.param::<8>(2)?);
    let mul = i32::from_le_bytes(f[0..4].try_into().expect("4 bytes"));
    let add = i32::from_le_bytes(f[4..8].try_into().expect("4 bytes"));
    map_chunks(mem, n.max(0) as u64, (data, data), (read_i32s, write_i32s), |v| v.wrapping_mul(mul).wrapping_add(add))
}

/// `transform<double, Affine<double>>`: as `transform_affine_i32`, with
/// `struct Affine { double mul, add; }` and one fused multiply-add.
fn transform_affine_f64(k: &KernelLaunch<'_>, mem: &mut dyn DeviceMemory) -> Result<(), CuError> {
    one_dimensional(k)?;
    let (data, n, f) = (k.ptr_param(0)?, k.i32_param(1)?, k.param::<16>(2)?);
    let mul = f64::from_le_bytes(f[0..8].try_into().expect("8 bytes"));
    let add = f64::from_le_bytes(f[8..16].try_into().expect("8 bytes"));
    map_chunks(mem, n.max(0) as u64, (data, data), (read_f64s, write_f64s), |v| v.mul_add(mul, add))
}

/// `histogram256(const unsigned char *data, int n, unsigned *bins)`:
/// `bins[v] +=` the number of `i < n` with `data[i] == v` (a grid-stride
/// loop: any non-empty grid counts every byte once).
fn histogram256(k: &KernelLaunch<'_>, mem: &mut dyn DeviceMemory) -> Result<(), CuError> {
    one_dimensional(k)?;
    let (data, n, bins) = (k.ptr_param(0)?, k.i32_param(1)?, k.ptr_param(2)?);
    let count = n.max(0) as u64;
    let mut counts = [0u32; 256];
    let mut start = 0;
    while start < count {
        let len = CHUNK.min(count - start) as usize;
        let mut bytes = vec![0u8; len];
        mem.read(element(data, start, 1)?, &mut bytes)?;
        for b in bytes {
            counts[b as usize] = counts[b as usize].wrapping_add(1);
        }
        start += len as u64;
    }
    // Bins with no count are not touched, as in the kernel.
    for (v, &c) in counts.iter().enumerate().filter(|(_, &c)| c != 0) {
        let at = element(bins, v as u64, 4)?;
        let old = read_u32s(mem, at, 1)?[0];
        write_u32s(mem, at, &[old.wrapping_add(c)])?;
    }
    Ok(())
}

/// `sumAndMax(const int *x, int n, int *sum, float *fsum, int *max)`: for
/// each `i < n`, `*sum += x[i]`, `*fsum += (float)x[i] * 0.5f` and
/// `*max = max(*max, x[i])`. The float sum is added in index order, which
/// equals the GPU's only where the sums are exact, as the program makes them.
fn sum_and_max(k: &KernelLaunch<'_>, mem: &mut dyn DeviceMemory) -> Result<(), CuError> {
    one_dimensional(k)?;
    let (x, n) = (k.ptr_param(0)?, k.i32_param(1)?);
    let (sum, fsum, max) = (k.ptr_param(2)?, k.ptr_param(3)?, k.ptr_param(4)?);
    let count = covered(k, n);
    if count == 0 {
        return Ok(());
    }
    let (mut s, mut f, mut m) = (read_i32(mem, sum)?, read_f32s(mem, fsum, 1)?[0], read_i32(mem, max)?);
    let mut start = 0;
    while start < count {
        let len = CHUNK.min(count - start) as usize;
        for v in read_i32s(mem, element(x, start, 4)?, len)? {
            s = s.wrapping_add(v);
            f += v as f32 * 0.5;
            m = m.max(v);
        }
        start += len as u64;
    }
    write_i32(mem, sum, s)?;
    write_f32s(mem, fsum, &[f])?;
    write_i32(mem, max, m)
}

/// `casTickets(unsigned *counter, unsigned *taken, int n)`: each thread
/// `i < n` takes ticket `t = (*counter)++` and does `taken[t] += 1`. Which
/// thread gets which ticket varies; the tickets taken do not.
fn cas_tickets(k: &KernelLaunch<'_>, mem: &mut dyn DeviceMemory) -> Result<(), CuError> {
    one_dimensional(k)?;
    let (counter, taken, n) = (k.ptr_param(0)?, k.ptr_param(1)?, k.i32_param(2)?);
    let count = covered(k, n);
    if count == 0 {
        return Ok(());
    }
    let first = read_u32s(mem, counter, 1)?[0];
    let mut done = 0;
    while done < count {
        // Tickets are unsigned ints: they wrap around to 0.
        let ticket = first.wrapping_add(done as u32) as u64;
        let len = CHUNK.min(count - done).min((1 << 32) - ticket) as usize;
        let at = element(taken, ticket, 4)?;
        let counts: Vec<u32> = read_u32s(mem, at, len)?.iter().map(|c| c.wrapping_add(1)).collect();
        write_u32s(mem, at, &counts)?;
        done += len as u64;
    }
    write_u32s(mem, counter, &[first.wrapping_add(count as u32)])
}

/// `blockSum(const int *in, int *out, int n)`, launched with 256 threads
/// (its `__launch_bounds__`, and the size of its shared array): block `b`
/// stores in `out[b]` the sum of `in[b * 256 + t]` over `t < 256` with index
/// below `n`.
fn block_sum(k: &KernelLaunch<'_>, mem: &mut dyn DeviceMemory) -> Result<(), CuError> {
    const BLOCK: u64 = 256;
    one_dimensional(k)?;
    if k.block[0] as u64 != BLOCK {
        return Err(CuError::NOT_SUPPORTED);
    }
    let (input, out, n) = (k.ptr_param(0)?, k.ptr_param(1)?, k.i32_param(2)?);
    let n = n.max(0) as u64;
    for b in 0..k.grid[0] as u64 {
        let first = b * BLOCK;
        let len = BLOCK.min(n.saturating_sub(first)) as usize;
        let values = if len > 0 { read_i32s(mem, element(input, first, 4)?, len)? } else { Vec::new() };
        let sum = values.iter().fold(0i32, |s, &v| s.wrapping_add(v));
        write_i32(mem, element(out, b, 4)?, sum)?;
    }
    Ok(())
}

/// `sharedReverse(const int *in, int *out, int words)`: block `b` stages
/// `in[b * words ..][..words]` in dynamic shared memory and writes it back
/// reversed at `out[b * words ..]`. Staging more words than the launch's
/// dynamic shared memory holds faults, as it does on the GPU.
fn shared_reverse(k: &KernelLaunch<'_>, mem: &mut dyn DeviceMemory) -> Result<(), CuError> {
    one_dimensional(k)?;
    let (input, out, words) = (k.ptr_param(0)?, k.ptr_param(1)?, k.i32_param(2)?);
    let words = words.max(0) as u64;
    if words == 0 {
        return Ok(());
    }
    if words * 4 > k.shared_mem as u64 {
        return Err(CuError::ILLEGAL_ADDRESS);
    }
    for b in 0..k.grid[0] as u64 {
        let mut values = read_i32s(mem, element(input, b * words, 4)?, words as usize)?;
        values.reverse();
        write_i32s(mem, element(out, b * words, 4)?, &values)?;
    }
    Ok(())
}

/// `useSymbols(const int *table, const float *coeffs, float *out, int n)`,
/// one block: the CUDA kernel reads the `__device__ int devTable[16]` and
/// `__constant__ float constCoeffs[8]` symbols and the program passes their
/// addresses as `table` and `coeffs`, which is all the reference can use.
/// Thread `i < n` stores `out[i] = (float)table[i % 16] * coeffs[i % 8]`;
/// thread 0 stores 1.0f in `out[n]` (the kernel's check that the addresses
/// are the symbols'); then threads `i < 16` double `table[i]`.
fn use_symbols(k: &KernelLaunch<'_>, mem: &mut dyn DeviceMemory) -> Result<(), CuError> {
    one_dimensional(k)?;
    if k.grid[0] != 1 {
        return Err(CuError::NOT_SUPPORTED);
    }
    let (table, coeffs, out, n) = (k.ptr_param(0)?, k.ptr_param(1)?, k.ptr_param(2)?, k.i32_param(3)?);
    let count = covered(k, n);
    let t = read_i32s(mem, table, count.min(16) as usize)?;
    let c = read_f32s(mem, coeffs, count.min(8) as usize)?;
    // At most 1024 threads: one write.
    let values: Vec<f32> = (0..count as usize).map(|i| t[i % 16] as f32 * c[i % 8]).collect();
    write_f32s(mem, out, &values)?;
    if n < 0 {
        return Err(CuError::ILLEGAL_ADDRESS);
    }
    write_f32s(mem, element(out, n as u64, 4)?, &[1.0])?;
    let doubled = k.threads_x().min(16) as usize;
    let t: Vec<i32> = read_i32s(mem, table, doubled)?.iter().map(|v| v.wrapping_mul(2)).collect();
    write_i32s(mem, table, &t)
}

/// Elements a 2-D texture or surface reference may touch in one launch: the
/// grid is the guest's to pick, and the device is locked meanwhile.
const MAX_TEXELS: u64 = 1 << 22;

/// The `(columns, rows)` a 2-D launch covers of a `w` x `h` image, if the
/// reference may run it: z of one, and no more than [`MAX_TEXELS`].
fn plane(k: &KernelLaunch<'_>, w: i32, h: i32) -> Result<(u64, u64), CuError> {
    if k.grid[2] != 1 || k.block[2] != 1 {
        return Err(CuError::NOT_SUPPORTED);
    }
    let cols = (w.max(0) as u64).min(k.threads_x());
    let rows = (h.max(0) as u64).min(k.grid[1] as u64 * k.block[1] as u64);
    if cols * rows > MAX_TEXELS {
        return Err(CuError::NOT_SUPPORTED);
    }
    Ok((cols, rows))
}

/// `texShift(float *out, cudaTextureObject_t tex, int w, int h, int dx, int dy)`,
/// 2-D: `out[y * w + x] = tex2D<float>(tex, x + dx + 0.5f, y + dy + 0.5f)`
/// for `x < w`, `y < h`.
fn tex_shift(k: &KernelLaunch<'_>, mem: &mut dyn DeviceMemory) -> Result<(), CuError> {
    let (out, tex) = (k.ptr_param(0)?, k.u64_param(1)?);
    let (w, h, dx, dy) = (k.i32_param(2)?, k.i32_param(3)?, k.i32_param(4)?, k.i32_param(5)?);
    let (cols, rows) = plane(k, w, h)?;
    for y in 0..rows {
        let mut row = Vec::with_capacity(cols as usize);
        for x in 0..cols {
            let mut texel = [0; 4];
            mem.texel(tex, x as i64 + dx as i64, y as i64 + dy as i64, &mut texel)?;
            row.push(f32::from_le_bytes(texel));
        }
        write_f32s(mem, element(out, y * w as u64, 4)?, &row)?;
    }
    Ok(())
}

/// Every thread of a launch, where the reference may run them in turn: the
/// kernels of graph_conditional.cu are meant for one thread, and with more
/// each does the same read-modify-write.
fn each_thread(k: &KernelLaunch<'_>) -> Result<u64, CuError> {
    Some(k.threads_x().saturating_mul(k.threads_per_x()))
        .filter(|&n| n <= MAX_SERIAL_THREADS)
        .ok_or(CuError::NOT_SUPPORTED)
}

/// `setCondition(const int *value, cudaGraphConditionalHandle h)`:
/// `cudaGraphSetConditional(h, *value)`.
fn set_condition(k: &KernelLaunch<'_>, mem: &mut dyn DeviceMemory) -> Result<(), CuError> {
    let (value, handle) = (k.ptr_param(0)?, k.u64_param(1)?);
    if each_thread(k)? == 0 {
        return Ok(());
    }
    let v = read_i32s(mem, value, 1)?[0];
    mem.set_conditional(handle, v as u32)
}

/// `addTo(int *p, int v)`: `*p += v`, by every thread.
fn add_to(k: &KernelLaunch<'_>, mem: &mut dyn DeviceMemory) -> Result<(), CuError> {
    let (p, v) = (k.ptr_param(0)?, k.i32_param(1)?);
    for _ in 0..each_thread(k)? {
        let sum = read_i32s(mem, p, 1)?[0].wrapping_add(v);
        write_i32s(mem, p, &[sum])?;
    }
    Ok(())
}

/// `countDown(int *counter, int *rounds, cudaGraphConditionalHandle h)`:
/// `*counter -= 1; *rounds += 1; cudaGraphSetConditional(h, *counter > 0)`.
fn count_down(k: &KernelLaunch<'_>, mem: &mut dyn DeviceMemory) -> Result<(), CuError> {
    let (counter, rounds, handle) = (k.ptr_param(0)?, k.ptr_param(1)?, k.u64_param(2)?);
    for _ in 0..each_thread(k)? {
        let left = read_i32s(mem, counter, 1)?[0].wrapping_sub(1);
        write_i32s(mem, counter, &[left])?;
        let done = read_i32s(mem, rounds, 1)?[0].wrapping_add(1);
        write_i32s(mem, rounds, &[done])?;
        mem.set_conditional(handle, u32::from(left > 0))?;
    }
    Ok(())
}

/// `fetchTwice(int *out, cudaTextureObject_t tex, int n)`:
/// `out[i] = 2 * tex1Dfetch<int>(tex, i)` for `i < n`.
fn fetch_twice(k: &KernelLaunch<'_>, mem: &mut dyn DeviceMemory) -> Result<(), CuError> {
    one_dimensional(k)?;
    let (out, tex) = (k.ptr_param(0)?, k.u64_param(1)?);
    let count = covered(k, k.i32_param(2)?);
    let mut start = 0;
    while start < count {
        let len = CHUNK.min(count - start);
        let mut values = Vec::with_capacity(len as usize);
        for i in start..start + len {
            let mut texel = [0; 4];
            mem.texel(tex, i as i64, 0, &mut texel)?;
            values.push(i32::from_le_bytes(texel).wrapping_mul(2));
        }
        write_i32s(mem, element(out, start, 4)?, &values)?;
        start += len;
    }
    Ok(())
}

/// `surfFill(cudaSurfaceObject_t surf, int w, int h)`, 2-D:
/// `surf2Dwrite((float)(x * 1000 + y), surf, x * 4, y)` for `x < w`, `y < h`.
fn surf_fill(k: &KernelLaunch<'_>, mem: &mut dyn DeviceMemory) -> Result<(), CuError> {
    let surf = k.u64_param(0)?;
    let (cols, rows) = plane(k, k.i32_param(1)?, k.i32_param(2)?)?;
    for y in 0..rows {
        for x in 0..cols {
            let value = (x * 1000 + y) as f32;
            mem.surface_write(surf, x as i64 * 4, y as i64, &value.to_le_bytes())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One allocation of `len` bytes at `BASE`.
    struct FlatMemory(Vec<u8>);

    const BASE: u64 = 0x7000_0000;

    impl FlatMemory {
        fn range(&self, addr: u64, len: usize) -> Result<std::ops::Range<usize>, CuError> {
            let start = addr.checked_sub(BASE).ok_or(CuError::ILLEGAL_ADDRESS)? as usize;
            let end = start.checked_add(len).ok_or(CuError::ILLEGAL_ADDRESS)?;
            if end > self.0.len() {
                return Err(CuError::ILLEGAL_ADDRESS);
            }
            Ok(start..end)
        }
    }

    impl DeviceMemory for FlatMemory {
        fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), CuError> {
            out.copy_from_slice(&self.0[self.range(addr, out.len())?]);
            Ok(())
        }

        fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), CuError> {
            let r = self.range(addr, data.len())?;
            self.0[r].copy_from_slice(data);
            Ok(())
        }
    }

    /// Packs parameters at their natural alignment, as the compiler lays them out.
    fn pack(params: &[(&[u8], u32)]) -> (Vec<u8>, Vec<ParamSlot>) {
        let (mut buf, mut layout) = (Vec::new(), Vec::new());
        for &(bytes, align) in params {
            while buf.len() % align as usize != 0 {
                buf.push(0);
            }
            layout.push(ParamSlot { offset: buf.len() as u32, size: bytes.len() as u32 });
            buf.extend_from_slice(bytes);
        }
        (buf, layout)
    }

    fn launch<'a>(grid: u32, block: u32, params: &'a [u8], layout: &'a [ParamSlot]) -> KernelLaunch<'a> {
        KernelLaunch { grid: [grid, 1, 1], block: [block, 1, 1], shared_mem: 0, params, layout }
    }

    #[test]
    fn param_accessors_check_index_and_size() {
        let (buf, layout) = pack(&[(&[0xF9], 1), (&(-1234i16).to_le_bytes(), 2), (&7u64.to_le_bytes(), 8)]);
        let k = launch(1, 1, &buf, &layout);
        assert_eq!(k.i8_param(0), Ok(-7));
        assert_eq!(k.i16_param(1), Ok(-1234));
        assert_eq!(k.u64_param(2), Ok(7));
        assert_eq!(k.i32_param(2), Err(CuError::INVALID_VALUE), "size differs");
        assert_eq!(k.u64_param(3), Err(CuError::INVALID_VALUE), "no such parameter");
        let short = &buf[..9];
        let k = launch(1, 1, short, &layout);
        assert_eq!(k.u64_param(2), Err(CuError::INVALID_VALUE), "buffer too short");
    }

    #[test]
    fn typed_memory_round_trips_and_faults_outside() {
        let mut mem = FlatMemory(vec![0; 16]);
        write_f32s(&mut mem, BASE + 4, &[1.5, -2.0]).unwrap();
        assert_eq!(read_f32s(&mem, BASE + 4, 2).unwrap(), vec![1.5, -2.0]);
        assert_eq!(read_i32s(&mem, BASE + 12, 2), Err(CuError::ILLEGAL_ADDRESS));
        assert_eq!(write_u64s(&mut mem, u64::MAX - 4, &[1]), Err(CuError::ILLEGAL_ADDRESS));
    }

    #[test]
    fn vector_add_covers_threads_below_n_only() {
        let n = 70_000u64; // more than one chunk
        let mut mem = FlatMemory(vec![0; 12 * n as usize]);
        let (a, b, c) = (BASE, BASE + 4 * n, BASE + 8 * n);
        let xs: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
        let ys: Vec<f32> = (0..n).map(|i| 3.0 - i as f32).collect();
        write_f32s(&mut mem, a, &xs).unwrap();
        write_f32s(&mut mem, b, &ys).unwrap();
        let limit = (n - 5) as i32;
        let (buf, layout) =
            pack(&[(&a.to_le_bytes(), 8), (&b.to_le_bytes(), 8), (&c.to_le_bytes(), 8), (&limit.to_le_bytes(), 4)]);
        let grid = (n as u32).div_ceil(256);
        vector_add(&launch(grid, 256, &buf, &layout), &mut mem).unwrap();
        let got = read_f32s(&mem, c, n as usize).unwrap();
        for i in 0..n as usize {
            let want = if i < limit as usize { xs[i] + ys[i] } else { 0.0 };
            assert_eq!(got[i], want, "c[{i}]");
        }
        // A grid smaller than n leaves the rest alone.
        write_f32s(&mut mem, c, &vec![0.0; n as usize]).unwrap();
        vector_add(&launch(1, 32, &buf, &layout), &mut mem).unwrap();
        let got = read_f32s(&mem, c, 33).unwrap();
        assert_eq!(got[31], xs[31] + ys[31]);
        assert_eq!(got[32], 0.0);
    }

    #[test]
    fn vector_add_out_of_bounds_faults() {
        let mut mem = FlatMemory(vec![0; 64]);
        let (buf, layout) = pack(&[
            (&BASE.to_le_bytes(), 8),
            (&BASE.to_le_bytes(), 8),
            (&BASE.to_le_bytes(), 8),
            (&17i32.to_le_bytes(), 4),
        ]);
        assert_eq!(vector_add(&launch(1, 32, &buf, &layout), &mut mem), Err(CuError::ILLEGAL_ADDRESS));
    }

    #[test]
    fn spin_matches_the_loop_and_the_gpu() {
        for &(x, times) in &[(0u32, 0u32), (5, 1), (12345, 1000), (u32::MAX, 77777)] {
            let mut want = x;
            for _ in 0..times {
                want = want.wrapping_mul(1664525).wrapping_add(1013904223);
            }
            assert_eq!(lcg_steps(x, times), want);
        }
        let mut mem = FlatMemory(vec![0; 16]);
        let (buf, layout) =
            pack(&[(&BASE.to_le_bytes(), 8), (&0u32.to_le_bytes(), 4), (&2_000_000u32.to_le_bytes(), 4)]);
        spin(&launch(1, 4, &buf, &layout), &mut mem).unwrap();
        // As the H100 computed it (tests/cuda/expected/streams_events.txt).
        assert_eq!(read_u32s(&mem, BASE, 4).unwrap(), vec![0x58b1e680, 0x00d4d881, 0xa8f7ca82, 0x511abc83]);
    }

    #[test]
    fn update_globals_reads_and_updates_through_the_pointers() {
        let mut mem = FlatMemory(vec![0; 4 + 32 + 16 + 36]);
        let (counter, table, uninit, out) = (BASE, BASE + 4, BASE + 36, BASE + 52);
        write_i32s(&mut mem, counter, &[100]).unwrap();
        write_i32s(&mut mem, table, &[1, 2, 3, 5, 8, 13, 21, 34]).unwrap();
        let (buf, layout) = pack(&[
            (&counter.to_le_bytes(), 8),
            (&table.to_le_bytes(), 8),
            (&uninit.to_le_bytes(), 8),
            (&out.to_le_bytes(), 8),
        ]);
        update_globals(&launch(1, 1, &buf, &layout), &mut mem).unwrap();
        assert_eq!(read_i32s(&mem, out, 9).unwrap(), vec![7, 100, 200, 300, 500, 800, 1300, 2100, 3400]);
        assert_eq!(read_i32s(&mem, counter, 1).unwrap(), vec![101]);
        assert_eq!(read_i32s(&mem, uninit, 4).unwrap(), vec![101, 202, 303, 404]);
    }

    #[test]
    fn kernels_that_repeat_per_thread_refuse_huge_grids_at_once() {
        let mut mem = FlatMemory(vec![0; 256]);
        let p = BASE.to_le_bytes();
        let (buf, layout) = pack(&[(&p, 8), (&p, 8), (&p, 8), (&p, 8)]);
        let mut k = launch(1, 1, &buf, &layout);
        k.grid = [1, 65535, 65535];
        k.block = [1, 1024, 64];
        let start = std::time::Instant::now();
        assert_eq!(update_globals(&k, &mut mem), Err(CuError::NOT_SUPPORTED));
        let pod = [0u8; 24];
        let (buf, layout) = pack(&[
            (&[0], 1),
            (&[0; 2], 2),
            (&[0; 4], 4),
            (&[0; 8], 8),
            (&pod, 8),
            (&p, 8),
            (&p, 8),
            (&[0; 8], 8),
            (&p, 8),
        ]);
        let mut k = launch(1, 1, &buf, &layout);
        k.grid = [1, 65535, 65535];
        assert_eq!(mixed_params(&k, &mut mem), Err(CuError::NOT_SUPPORTED));
        assert!(start.elapsed() < std::time::Duration::from_secs(1), "{:?}", start.elapsed());
        // As many threads as one block holds still run, each in turn.
        k.grid = [1, 1, 1];
        k.block = [1, 32, 32];
        mixed_params(&k, &mut mem).unwrap();
    }

    #[test]
    fn mixed_params_echoes_every_parameter() {
        let mut mem = FlatMemory(vec![0; 8 + 96]);
        let (f, ip, out) = (BASE, BASE + 4, BASE + 8);
        write_f32s(&mut mem, f, &[2.5]).unwrap();
        write_i32s(&mut mem, ip, &[-99]).unwrap();
        let mut pod = [0u8; 24];
        pod[0..4].copy_from_slice(&(-42i32).to_le_bytes());
        pod[8..16].copy_from_slice(&1.5e300f64.to_le_bytes());
        pod[16..21].copy_from_slice(b"abcde");
        let (buf, layout) = pack(&[
            (&(-7i8).to_le_bytes(), 1),
            (&(-1234i16).to_le_bytes(), 2),
            (&123456789i32.to_le_bytes(), 4),
            (&3.25f64.to_le_bytes(), 8),
            (&pod, 8),
            (&f.to_le_bytes(), 8),
            (&ip.to_le_bytes(), 8),
            (&0xFEDC_BA98_7654_3210u64.to_le_bytes(), 8),
            (&out.to_le_bytes(), 8),
        ]);
        // The layout cuFuncGetParamInfo reports on the H100.
        let offsets: Vec<u32> = layout.iter().map(|s| s.offset).collect();
        assert_eq!(offsets, vec![0, 2, 4, 8, 16, 40, 48, 56, 64]);
        mixed_params(&launch(1, 32, &buf, &layout), &mut mem).unwrap();
        let got = read_u64s(&mem, out, 12).unwrap();
        assert_eq!(got[0] as i64, -7);
        assert_eq!(got[1] as i64, -1234);
        assert_eq!(got[2] as i64, 123456789);
        assert_eq!(f64::from_bits(got[3]), 3.25);
        assert_eq!(got[4] as i64, -42);
        assert_eq!(f64::from_bits(got[5]), 1.5e300);
        assert_eq!(&got[6].to_le_bytes()[..6], b"abcde\0");
        assert_eq!((got[7], got[8]), (f, ip));
        assert_eq!(got[9], 0xFEDC_BA98_7654_3210);
        assert_eq!(f32::from_bits(got[10] as u32), 2.5);
        assert_eq!(got[11] as i64, -99);
    }

    #[test]
    fn lookup_knows_the_test_kernels_only() {
        for name in [
            "vector_add",
            "spin",
            "update_globals",
            "mixed_params",
            "gpuplex_bench_empty",
            "gpuplex_bench_busy",
            "_Z8scaleAddPiPKiiii",
            "_Z4axpyIdEvT_PKS0_PS0_i",
        ] {
            assert!(lookup(name).is_some(), "{name}");
        }
        assert!(lookup("reset_globals").is_none());
        assert!(lookup("_Z10vector_addPKfS0_Pfi").is_none());
        assert!(lookup("_Z4axpyIlEvT_PKS0_PS0_i").is_none(), "axpy<long> is not a test kernel");
    }

    fn ptr(p: u64) -> ([u8; 8], u32) {
        (p.to_le_bytes(), 8)
    }

    fn int(v: i32) -> ([u8; 4], u32) {
        (v.to_le_bytes(), 4)
    }

    #[test]
    fn scale_add_covers_n_and_refuses_other_shapes() {
        let mut mem = FlatMemory(vec![0; 80]);
        let (input, out) = (BASE, BASE + 40);
        write_i32s(&mut mem, input, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]).unwrap();
        let (p0, p1, p2, p3, p4) = (ptr(out), ptr(input), int(-3), int(100), int(9));
        let (buf, layout) = pack(&[(&p0.0, 8), (&p1.0, 8), (&p2.0, 4), (&p3.0, 4), (&p4.0, 4)]);
        scale_add(&launch(2, 8, &buf, &layout), &mut mem).unwrap();
        assert_eq!(read_i32s(&mem, out, 10).unwrap(), vec![97, 94, 91, 88, 85, 82, 79, 76, 73, 0]);
        let mut k = launch(1, 8, &buf, &layout);
        k.block = [8, 2, 1];
        assert_eq!(scale_add(&k, &mut mem), Err(CuError::NOT_SUPPORTED));
    }

    #[test]
    fn matrix_mul_is_the_product_over_whole_tiles() {
        // A: 16 x 33 (the last column is past the whole tiles), B: 33 x 32.
        let (h, wa, wb) = (16u64, 33u64, 32u64);
        let mut mem = FlatMemory(vec![0; 4 * (h * wa + wa * wb + h * wb) as usize]);
        let (a, b, c) = (BASE, BASE + 4 * h * wa, BASE + 4 * (h * wa + wa * wb));
        let av: Vec<f32> = (0..h * wa).map(|i| (i % 7) as f32 - 3.0).collect();
        let bv: Vec<f32> = (0..wa * wb).map(|i| (i % 5) as f32 - 2.0).collect();
        write_f32s(&mut mem, a, &av).unwrap();
        write_f32s(&mut mem, b, &bv).unwrap();
        let (pc, pa, pb, pwa, pwb) = (ptr(c), ptr(a), ptr(b), int(wa as i32), int(wb as i32));
        let (buf, layout) = pack(&[(&pc.0, 8), (&pa.0, 8), (&pb.0, 8), (&pwa.0, 4), (&pwb.0, 4)]);
        let mut k = launch(2, 16, &buf, &layout);
        k.block = [16, 16, 1];
        matrix_mul(&k, &mut mem).unwrap();
        let got = read_f32s(&mem, c, (h * wb) as usize).unwrap();
        for r in 0..h {
            for col in 0..wb {
                let want: f32 = (0..32).map(|kk| av[(r * wa + kk) as usize] * bv[(kk * wb + col) as usize]).sum();
                assert_eq!(got[(r * wb + col) as usize], want, "C[{r}][{col}]");
            }
        }
        k.block = [8, 8, 1];
        assert_eq!(matrix_mul(&k, &mut mem), Err(CuError::NOT_SUPPORTED));
        // 2^20 blocks over 16 rows of C, each rereading one row of B 2^24
        // times (wB = 0): refused before any memory is read (given the
        // memory, the product would take hours).
        let (pwa, pwb) = (int(1 << 24), int(0));
        let (buf, layout) = pack(&[(&pc.0, 8), (&pa.0, 8), (&pb.0, 8), (&pwa.0, 4), (&pwb.0, 4)]);
        let mut k = launch(1 << 20, 16, &buf, &layout);
        k.block = [16, 16, 1];
        assert_eq!(matrix_mul(&k, &mut mem), Err(CuError::NOT_SUPPORTED));
    }

    #[test]
    fn atomics_kernels_count_every_thread_once() {
        let mut mem = FlatMemory(vec![0; 4096]);
        let (data, bins) = (BASE, BASE + 1024);
        let bytes: Vec<u8> = (0..300u32).map(|i| (i % 3) as u8 * 100).collect();
        mem.write(data, &bytes).unwrap();
        write_u32s(&mut mem, bins, &[5]).unwrap();
        let (p0, p1, p2) = (ptr(data), int(300), ptr(bins));
        let (buf, layout) = pack(&[(&p0.0, 8), (&p1.0, 4), (&p2.0, 8)]);
        histogram256(&launch(1, 32, &buf, &layout), &mut mem).unwrap();
        let got = read_u32s(&mem, bins, 256).unwrap();
        assert_eq!((got[0], got[100], got[200]), (105, 100, 100));
        assert_eq!(got.iter().map(|&c| c as u64).sum::<u64>(), 305);

        let (counter, taken) = (BASE + 2048, BASE + 2052);
        write_u32s(&mut mem, counter, &[3]).unwrap();
        let (p0, p1, p2) = (ptr(counter), ptr(taken), int(1000));
        let (buf, layout) = pack(&[(&p0.0, 8), (&p1.0, 8), (&p2.0, 4)]);
        cas_tickets(&launch(2, 5, &buf, &layout), &mut mem).unwrap();
        assert_eq!(read_u32s(&mem, counter, 1).unwrap(), vec![13]);
        assert_eq!(read_u32s(&mem, taken, 14).unwrap(), vec![0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0]);
    }

    #[test]
    fn shared_reverse_faults_beyond_its_shared_memory() {
        let mut mem = FlatMemory(vec![0; 64]);
        let (input, out) = (BASE, BASE + 32);
        write_i32s(&mut mem, input, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        let (p0, p1, p2) = (ptr(input), ptr(out), int(4));
        let (buf, layout) = pack(&[(&p0.0, 8), (&p1.0, 8), (&p2.0, 4)]);
        let mut k = launch(2, 32, &buf, &layout);
        k.shared_mem = 16;
        shared_reverse(&k, &mut mem).unwrap();
        assert_eq!(read_i32s(&mem, out, 8).unwrap(), vec![4, 3, 2, 1, 8, 7, 6, 5]);
        k.shared_mem = 12;
        assert_eq!(shared_reverse(&k, &mut mem), Err(CuError::ILLEGAL_ADDRESS));
    }

    #[test]
    fn use_symbols_reads_then_doubles_the_table() {
        let mut mem = FlatMemory(vec![0; 64 + 32 + 4 * 41]);
        let (table, coeffs, out) = (BASE, BASE + 64, BASE + 96);
        write_i32s(&mut mem, table, &(1..=16).collect::<Vec<i32>>()).unwrap();
        write_f32s(&mut mem, coeffs, &[0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]).unwrap();
        let (p0, p1, p2, p3) = (ptr(table), ptr(coeffs), ptr(out), int(40));
        let (buf, layout) = pack(&[(&p0.0, 8), (&p1.0, 8), (&p2.0, 8), (&p3.0, 4)]);
        use_symbols(&launch(1, 64, &buf, &layout), &mut mem).unwrap();
        let got = read_f32s(&mem, out, 41).unwrap();
        assert_eq!((got[0], got[9], got[39], got[40]), (0.5, 10.0 * 1.0, 8.0 * 4.0, 1.0));
        assert_eq!(read_i32s(&mem, table, 3).unwrap(), vec![2, 4, 6]);
        assert_eq!(use_symbols(&launch(2, 64, &buf, &layout), &mut mem), Err(CuError::NOT_SUPPORTED));
    }
}
