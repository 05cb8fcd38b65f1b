//! Module images as guests load them: the server's reader
//! (`image::parse`, which the emulated backend runs on) and the CUDA
//! backend's check before the driver sees the bytes (`check_image`). Both
//! must return on every input, within the allocation cap, and neither may
//! depend on where the bytes lie: each also runs on a copy one byte off
//! the allocator's alignment, and must answer the same.

#![no_main]

use gpuplex_server::backend::cuda::check_image;
use gpuplex_server::image;
use libfuzzer_sys::fuzz_target;

gpuplex_fuzz::cap_allocations!();

fuzz_target!(|data: &[u8]| {
    let mut shifted = Vec::with_capacity(data.len() + 1);
    shifted.push(0);
    shifted.extend_from_slice(data);
    let unaligned = &shifted[1..];

    let parsed = image::parse(data);
    assert_eq!(parsed, image::parse(unaligned), "the answer depends on the alignment");
    if let Ok(img) = parsed {
        for k in &img.kernels {
            for p in &k.params {
                let end = u64::from(p.offset) + u64::from(p.size);
                assert!(end <= u64::from(k.param_bytes), "{}: a parameter overruns {} bytes", k.name, k.param_bytes);
            }
        }
        for g in &img.globals {
            assert_eq!(g.init.len() as u64, g.size, "{}: initial bytes of another size", g.name);
        }
    }

    let checked = check_image(data);
    assert_eq!(checked, check_image(unaligned), "the check depends on the alignment");
});
