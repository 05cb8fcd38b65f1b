//! Reference kernels: what the emulated device runs instead of machine code.
//!
//! The emulated device has no GPU, so it cannot execute a kernel's SASS or
//! PTX. The kernels of the driver-API test programs (`tests/cuda/*.cu`) are
//! registered here by their exact symbol name, each with a Rust
//! implementation that computes exactly what the CUDA kernel computes over
//! the whole grid. That lets the CI end-to-end tests exercise the launch
//! path honestly: the parameter layout read from the cubin, the packed
//! parameter buffer, and the kernel's effect on device memory. Any other
//! kernel is refused with `CUDA_ERROR_NOT_SUPPORTED` by the caller.
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
}

pub type ReferenceKernel = fn(&KernelLaunch<'_>, &mut dyn DeviceMemory) -> Result<(), CuError>;

/// The reference implementation registered for a kernel symbol, if any.
pub fn lookup(name: &str) -> Option<ReferenceKernel> {
    match name {
        "vector_add" => Some(vector_add),
        "spin" => Some(spin),
        "update_globals" => Some(update_globals),
        "mixed_params" => Some(mixed_params),
        _ => None,
    }
}

/// Elements a reference kernel holds in host memory at once.
const CHUNK: u64 = 1 << 16;

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
fn update_globals(k: &KernelLaunch<'_>, mem: &mut dyn DeviceMemory) -> Result<(), CuError> {
    let (counter, table, uninit, out) = (k.ptr_param(0)?, k.ptr_param(1)?, k.ptr_param(2)?, k.ptr_param(3)?);
    if k.threads_x() == 0 {
        return Ok(());
    }
    for _ in 0..k.threads_per_x() {
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
/// `*f` as float bits and `*ip` sign-extended.
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
    for _ in 0..k.threads_per_x() {
        write_u64s(mem, out, &slots)?;
        let f_bits = read_f32s(mem, f, 1)?[0].to_bits();
        write_u64s(mem, element(out, 10, 8)?, &[f_bits as u64])?;
        let pointee = read_i32(mem, ip)?;
        write_u64s(mem, element(out, 11, 8)?, &[pointee as i64 as u64])?;
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
        for name in ["vector_add", "spin", "update_globals", "mixed_params"] {
            assert!(lookup(name).is_some(), "{name}");
        }
        assert!(lookup("reset_globals").is_none());
        assert!(lookup("_Z10vector_addPKfS0_Pfi").is_none());
    }
}
