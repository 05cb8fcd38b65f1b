//! Unit tests, and one that drives a real GPU (ignored unless asked for).

use super::*;
use crate::backend::prelude::*;

/// A fatbin header and one entry (header 0x40 bytes, payload `payload`
/// bytes), `extra` bytes beyond what the header counts, 8-byte aligned.
fn fatbin(payload: u64, extra: usize) -> Vec<u64> {
    let [a, b, c, d] = image::FATBIN_MAGIC;
    let mut bytes = vec![a, b, c, d, 1, 0, 16, 0];
    bytes.extend((0x40 + payload).to_le_bytes());
    bytes.extend([2, 0, 1, 0, 0x40, 0, 0, 0]);
    bytes.extend(payload.to_le_bytes());
    bytes.resize(16 + 0x40 + payload as usize + extra, 0);
    bytes.resize(bytes.len().div_ceil(8) * 8, 0);
    bytes.chunks(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap())).collect()
}

fn as_bytes(words: &[u64]) -> &[u8] {
    // SAFETY: views the words' own initialised bytes.
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast(), words.len() * 8) }
}

#[test]
fn text_images_get_a_nul() {
    let ptx = b".version 8.0";
    let image = Image::new(ptx).unwrap();
    assert!(matches!(image, Image::Copied(_)));
    assert_eq!(&image.bytes()[..ptx.len()], ptx);
    assert_eq!(image.bytes()[ptx.len()], 0);
    assert_eq!(Image::new(b"").unwrap().bytes()[0], 0);
}

#[test]
fn binaries_pass_in_place_when_aligned_and_within_their_bytes() {
    let words = fatbin(32, 0);
    let bytes = &as_bytes(&words)[..16 + 0x40 + 32];
    assert!(matches!(Image::new(bytes).unwrap(), Image::InPlace(_)));
    let unaligned = [&[0u8][..], bytes].concat();
    let image = Image::new(&unaligned[1..]).unwrap();
    assert!(matches!(image, Image::Copied(_)));
    assert_eq!(&image.bytes()[..bytes.len()], bytes);

    // Headers that reach past the bytes sent never get to the driver.
    for cut in [8, 16, 16 + 0x20, 16 + 0x40 + 31] {
        assert_eq!(Image::new(&bytes[..cut]).unwrap_err().code, CuError::INVALID_IMAGE, "cut at {cut}");
    }
    let mut elf = vec![0u64; 8];
    as_bytes_mut(&mut elf)[..4].copy_from_slice(b"\x7fELF");
    assert_eq!(Image::new(as_bytes(&elf)).unwrap_err().code, CuError::INVALID_IMAGE);
}

fn as_bytes_mut(words: &mut [u64]) -> &mut [u8] {
    // SAFETY: views the words' own initialised bytes; any bytes are valid u64s.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast(), words.len() * 8) }
}

#[test]
fn stream_specials_pass_through() {
    assert_eq!(raw::<sys::CUstream_st>(Obj(1)) as usize, 1);
    assert_eq!(obj(raw::<sys::CUstream_st>(Obj(2))), Obj(2));
}

/// Never panics: without a driver it says so; with one it reads every
/// attribute of every device.
#[test]
fn open_reports_instead_of_panicking() {
    match Cuda::open() {
        Ok(cuda) => {
            for dev in cuda.devices() {
                assert_eq!(dev.attributes.0.len(), DEVICE_ATTRIBUTE_COUNT as usize);
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

/// Two kernels and a global, as PTX without the trailing NUL.
const PTX: &str = "
.version 8.0
.target sm_80
.address_size 64
.visible .global .align 4 .u32 counter = 7;
.visible .entry add(.param .u64 buf, .param .u32 n, .param .u32 k)
{
.reg .pred %p;
.reg .b32 %r<6>;
.reg .b64 %rd<4>;
ld.param.u64 %rd1, [buf];
ld.param.u32 %r1, [n];
ld.param.u32 %r2, [k];
mov.u32 %r3, %tid.x;
mov.u32 %r4, %ctaid.x;
mov.u32 %r5, %ntid.x;
mad.lo.s32 %r3, %r4, %r5, %r3;
setp.ge.u32 %p, %r3, %r1;
@%p bra DONE;
cvta.to.global.u64 %rd1, %rd1;
mul.wide.u32 %rd2, %r3, 4;
add.s64 %rd3, %rd1, %rd2;
ld.global.u32 %r4, [%rd3];
add.s32 %r4, %r4, %r2;
st.global.u32 [%rd3], %r4;
DONE:
ret;
}
.visible .entry nothing()
{
ret;
}
";

fn read_u32s(cuda: &Cuda, ctx: Obj, ptr: u64, n: usize, stream: Obj) -> Vec<u32> {
    let mut out = vec![0u8; n * 4];
    cuda.memcpy_dtoh(ctx, &mut out, ptr, stream).unwrap();
    out.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// The whole backend against a real driver.
#[test]
#[ignore = "needs a GPU: cargo test -p gpuplex-server -- --ignored"]
fn drives_a_real_gpu() {
    let cuda = Cuda::open().unwrap();
    let dev = &cuda.devices()[0];
    let failed = dev.attributes.0.iter().filter(|a| a.status != 0).count();
    eprintln!(
        "driver {} {:?} {} {} bytes, {failed} attributes unanswered",
        cuda.driver_version(),
        dev.name,
        dev.pci_bus_id,
        dev.total_mem
    );
    assert_eq!(dev.attributes.0[1], Attribute { status: 0, value: 1024 }); // MAX_THREADS_PER_BLOCK
    assert_eq!(dev.attributes.0[0].status, 1);

    let ctx = cuda.ctx_create(0, 0).unwrap();
    let other = cuda.ctx_create(0, 0).unwrap();
    assert_ne!(cuda.ctx_id(ctx).unwrap(), cuda.ctx_id(other).unwrap());
    cuda.ctx_destroy(other).unwrap();
    assert!(cuda.ctx_api_version(ctx).unwrap() >= 3020);
    assert!(cuda.ctx_get_limit(ctx, 0).unwrap() > 0); // stack size
    assert!(cuda.ctx_get_limit(ctx, 9999).is_err());
    let (free, total) = cuda.mem_get_info(ctx).unwrap();
    assert!(free <= total && total > 0);

    let n = 1000u32;
    let buf = cuda.mem_alloc(ctx, 4 * n as u64).unwrap();
    let set = Memset { dst: buf, pitch: 0, value: 5, element_size: 4, width: n as u64, height: 1 };
    cuda.memset(ctx, &set, Obj(0), true).unwrap();

    let module = cuda.module_load(ctx, PTX.as_bytes()).unwrap();
    assert_eq!(cuda.module_function_count(ctx, module).unwrap(), 2);
    let add = cuda.module_get_function(ctx, module, "add").unwrap();
    let listed = cuda.module_functions(ctx, module).unwrap();
    assert_eq!(listed.len(), 2);
    assert!(listed.contains(&add));
    let err = cuda.module_get_function(ctx, module, "absent").unwrap_err();
    assert_eq!(err.code, CuError::NOT_FOUND);
    let slots: Vec<_> = cuda.param_layout(ctx, add).unwrap().iter().map(|s| (s.offset, s.size)).collect();
    assert_eq!(slots, [(0, 8), (8, 4), (12, 4)]);
    assert_eq!(cuda.func_get_attribute(ctx, add, 0).unwrap(), 1024);
    assert_eq!(cuda.func_get_attribute(ctx, add, 9999).unwrap_err().code, CuError::INVALID_VALUE);
    let (_, block) = cuda.occupancy_max_potential_block_size(ctx, add, 0, 0, 0).unwrap();
    assert!(block > 0);
    assert!(cuda.occupancy_max_active_blocks(ctx, add, 256, 0, 0).unwrap() > 0);
    assert_eq!(cuda.module_get_global(ctx, module, "counter").unwrap().1, 4);

    let stream = cuda.stream_create(ctx, 1, 0).unwrap();
    let (start, end) = (cuda.event_create(ctx, 0).unwrap(), cuda.event_create(ctx, 0).unwrap());
    cuda.event_record(ctx, start, stream, 0).unwrap();
    let mut params = buf.to_le_bytes().to_vec();
    params.extend(n.to_le_bytes());
    params.extend(3u32.to_le_bytes());
    let mut priority = [0u8; 64];
    priority[..4].copy_from_slice(&0i32.to_le_bytes());
    let attrs = vec![(sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PRIORITY as u32, priority)];
    let launch = Launch { grid: [4, 1, 1], block: [256, 1, 1], shared_mem: 0, stream, attrs };
    cuda.launch(ctx, add, &launch, &params).unwrap();
    cuda.event_record(ctx, end, stream, 0).unwrap();
    cuda.event_synchronize(ctx, end).unwrap();
    assert!(cuda.event_elapsed(ctx, start, end).unwrap() >= 0.0);
    assert!(read_u32s(&cuda, ctx, buf, n as usize, stream).iter().all(|&v| v == 8));

    // No parameters, on the per-thread stream.
    let nothing = cuda.module_get_function(ctx, module, "nothing").unwrap();
    assert!(cuda.param_layout(ctx, nothing).unwrap().is_empty());
    let bare = Launch { grid: [1, 1, 1], block: [1, 1, 1], shared_mem: 0, stream: Obj(2), attrs: vec![] };
    cuda.launch(ctx, nothing, &bare, &[]).unwrap();
    cuda.stream_synchronize(ctx, Obj(2)).unwrap();

    // An async upload whose source is reused at once.
    let mut host = vec![9u8; 4 * n as usize];
    cuda.memcpy_htod(ctx, buf, &host, stream, false).unwrap();
    host.fill(0);
    cuda.stream_synchronize(ctx, stream).unwrap();
    assert!(read_u32s(&cuda, ctx, buf, n as usize, Obj(1)).iter().all(|&v| v == 0x0909_0909));

    // Libraries, and another thread using the same context.
    let mut text = PTX.as_bytes().to_vec();
    text.push(0);
    let library = cuda.library_load(&text).unwrap();
    assert_eq!(cuda.library_kernel_count(library).unwrap(), 2);
    let kernel = cuda.library_get_kernel(library, "add").unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let f = cuda.kernel_get_function(ctx, kernel).unwrap();
            let on_null = Launch { stream: Obj(0), attrs: vec![], ..launch.clone() };
            cuda.launch(ctx, f, &on_null, &params).unwrap();
            let (counter, bytes) = cuda.library_get_global(ctx, library, "counter").unwrap();
            assert_eq!(read_u32s(&cuda, ctx, counter, 1, Obj(0)), [7]);
            assert_eq!(bytes, 4);
        });
    });
    assert!(read_u32s(&cuda, ctx, buf, n as usize, Obj(0)).iter().all(|&v| v == 0x0909_090c));
    let pitched = cuda.mem_alloc_pitch(ctx, 100, 3, 4).unwrap();
    let set = Memset { dst: pitched.0, pitch: pitched.1, value: 0xab, element_size: 1, width: 100, height: 3 };
    cuda.memset(ctx, &set, stream, true).unwrap();

    cuda.library_unload(library).unwrap();
    cuda.module_unload(ctx, module).unwrap();
    cuda.event_destroy(ctx, start).unwrap();
    cuda.event_destroy(ctx, end).unwrap();
    cuda.stream_destroy(ctx, stream).unwrap();
    cuda.mem_free(ctx, buf).unwrap();
    cuda.mem_free(ctx, pitched.0).unwrap();
    cuda.ctx_destroy(ctx).unwrap();
}
