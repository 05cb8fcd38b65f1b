use super::*;
use crate::backend::prelude::*;
use crate::backend::{ClusterQuery, CU_EVENT_DISABLE_TIMING};

fn setup() -> (Emulated, Obj) {
    let e = Emulated::new();
    let ctx = e.ctx_create(0, 0).unwrap();
    (e, ctx)
}

#[test]
fn memory_round_trips_and_is_freed_with_its_context() {
    let (e, ctx) = setup();
    let p = e.mem_alloc(ctx, 1000).unwrap();
    e.memcpy_htod(ctx, p + 10, &[1, 2, 3], Obj(0), true).unwrap();
    let mut out = [0u8; 5];
    e.memcpy_dtoh(ctx, &mut out, p + 9, Obj(0)).unwrap();
    assert_eq!(out, [0, 1, 2, 3, 0]);
    let (free, total) = e.mem_get_info(ctx).unwrap();
    assert_eq!(total - free, 1000);
    e.ctx_destroy(ctx).unwrap();
    let other = e.ctx_create(0, 0).unwrap();
    assert_eq!(e.mem_get_info(other).unwrap().0, device::TOTAL_MEMORY);
}

#[test]
fn memsets_fill_rows_and_leave_the_pitch_gap() {
    let (e, ctx) = setup();
    let p = e.mem_alloc(ctx, 64).unwrap();
    let op = Memset { dst: p, pitch: 16, value: 0xAABB, element_size: 2, width: 3, height: 2 };
    e.memset(ctx, &op, Obj(0), true).unwrap();
    let mut out = [0u8; 24];
    e.memcpy_dtoh(ctx, &mut out, p, Obj(0)).unwrap();
    assert_eq!(&out[..6], &[0xBB, 0xAA, 0xBB, 0xAA, 0xBB, 0xAA]);
    assert_eq!(&out[6..16], &[0; 10]);
    assert_eq!(&out[16..22], &[0xBB, 0xAA, 0xBB, 0xAA, 0xBB, 0xAA]);
}

#[test]
fn fill_repeats_its_element_over_any_whole_number_of_elements() {
    for len in [0, 4, 8, 12, 4 * 1000 + 4] {
        let mut bytes = vec![0u8; len];
        fill(&mut bytes, &[1, 2, 3, 4]);
        assert!(bytes.chunks(4).all(|c| c == [1, 2, 3, 4]), "{len} bytes");
    }
    let mut one = [0u8; 7];
    fill(&mut one, &[9]);
    assert_eq!(one, [9; 7]);
}

#[test]
fn out_of_bounds_copies_fail() {
    let (e, ctx) = setup();
    let p = e.mem_alloc(ctx, 16).unwrap();
    assert_eq!(e.memcpy_htod(ctx, p + 8, &[0; 9], Obj(0), true).unwrap_err().code, CuError::INVALID_VALUE);
    assert_eq!(e.memcpy_dtod(ctx, p, p + 1, 16, Obj(0), true).unwrap_err().code, CuError::INVALID_VALUE);
}

#[test]
fn events_time_and_refuse_untimed_ones() {
    let (e, ctx) = setup();
    let a = e.event_create(ctx, 0).unwrap();
    let b = e.event_create(ctx, 0).unwrap();
    let untimed = e.event_create(ctx, CU_EVENT_DISABLE_TIMING).unwrap();
    assert_eq!(e.event_elapsed(ctx, a, b).unwrap_err().code, CuError::INVALID_HANDLE);
    e.event_record(ctx, a, Obj(0), 0).unwrap();
    e.event_record(ctx, b, Obj(0), 0).unwrap();
    e.event_record(ctx, untimed, Obj(0), 0).unwrap();
    assert!(e.event_elapsed(ctx, a, b).unwrap() >= 0.0);
    assert_eq!(e.event_elapsed(ctx, a, untimed).unwrap_err().code, CuError::INVALID_HANDLE);
    e.event_destroy(ctx, a).unwrap();
    assert_eq!(e.event_query(ctx, a).unwrap_err().code, CuError::INVALID_HANDLE);
}

#[test]
fn streams_clamp_priorities_and_vanish_with_their_context() {
    let (e, ctx) = setup();
    let s = e.stream_create(ctx, 1, -100).unwrap();
    assert_eq!(e.cuStreamGetPriority(ctx.0, s.0).unwrap(), device::PRIORITY_RANGE.1);
    assert_eq!(e.cuStreamGetFlags(ctx.0, s.0).unwrap(), 1);
    e.ctx_destroy(ctx).unwrap();
    let ctx = e.ctx_create(0, 0).unwrap();
    assert_eq!(e.stream_query(ctx, s).unwrap_err().code, CuError::INVALID_HANDLE);
}

#[test]
fn garbage_images_are_invalid() {
    let (e, ctx) = setup();
    assert_eq!(e.module_load(ctx, b"not an image").unwrap_err().code, CuError::INVALID_IMAGE);
    assert_eq!(e.library_load(&[0xff; 64]).unwrap_err().code, CuError::INVALID_IMAGE);
}

#[test]
fn kernel_attributes_set_hold_for_its_functions_now_and_later() {
    const MAX_DYNAMIC_SHARED: i32 = 8;
    let (e, ctx) = setup();
    let lib = e.library_load(include_bytes!("../../../testdata/plain.fatbin")).unwrap();
    let kernel = e.library_get_kernel(lib, "reduce").unwrap();
    // reduce has 1024 bytes of static shared memory.
    assert_eq!(e.kernel_get_attribute(kernel, MAX_DYNAMIC_SHARED, 0).unwrap(), 48 * 1024 - 1024);
    let before = e.kernel_get_function(ctx, kernel).unwrap();
    e.kernel_set_attribute(kernel, MAX_DYNAMIC_SHARED, 100_000, 0).unwrap();
    assert_eq!(e.kernel_get_attribute(kernel, MAX_DYNAMIC_SHARED, 0).unwrap(), 100_000);
    assert_eq!(e.func_get_attribute(ctx, before, MAX_DYNAMIC_SHARED).unwrap(), 100_000);
    let other = e.ctx_create(0, 0).unwrap();
    let later = e.kernel_get_function(other, kernel).unwrap();
    assert_eq!(e.func_get_attribute(other, later, MAX_DYNAMIC_SHARED).unwrap(), 100_000);
    // Too much, or a read-only attribute: refused, nothing changes.
    assert!(e.kernel_set_attribute(kernel, MAX_DYNAMIC_SHARED, 227 * 1024, 0).is_err());
    assert!(e.kernel_set_attribute(kernel, 0, 128, 0).is_err());
    assert_eq!(e.kernel_get_attribute(kernel, MAX_DYNAMIC_SHARED, 0).unwrap(), 100_000);
}

#[test]
fn empty_memsets_cost_nothing_whatever_their_height() {
    let (e, ctx) = setup();
    let p = e.mem_alloc(ctx, 64).unwrap();
    let start = Instant::now();
    for (width, height) in [(0, 1 << 62), (0, u64::MAX), (16, 0)] {
        let op = Memset { dst: p, pitch: 0, value: 0xff, element_size: 1, width, height };
        e.memset(ctx, &op, Obj(0), true).unwrap();
    }
    assert!(start.elapsed() < std::time::Duration::from_secs(1), "{:?}", start.elapsed());
    let mut out = [1u8; 64];
    e.memcpy_dtoh(ctx, &mut out, p, Obj(0)).unwrap();
    assert_eq!(out, [0; 64], "nothing was set");
}

#[test]
fn memsets_refuse_overlapping_rows_odd_elements_and_overruns_whole() {
    let (e, ctx) = setup();
    let p = e.mem_alloc(ctx, 64).unwrap();
    let set = |pitch, element_size, width, height| {
        let op = Memset { dst: p, pitch, value: u32::MAX, element_size, width, height };
        e.memset(ctx, &op, Obj(0), true).map_err(|e| e.code)
    };
    // Rows written over and over, 2^62 times: refused before any is.
    assert_eq!(set(0, 1, 1, 1 << 62), Err(CuError::INVALID_VALUE));
    assert_eq!(set(3, 4, 1, 2), Err(CuError::INVALID_VALUE));
    assert_eq!(set(8, 3, 1, 1), Err(CuError::INVALID_VALUE));
    // The last row overruns the block: no row is set.
    assert_eq!(set(16, 1, 8, 5), Err(CuError::INVALID_VALUE));
    assert_eq!(set(u64::MAX, 1, 1, 3), Err(CuError::INVALID_VALUE), "the extent overflows");
    let mut out = [1u8; 64];
    e.memcpy_dtoh(ctx, &mut out, p, Obj(0)).unwrap();
    assert_eq!(out, [0; 64]);
    // Rows that just meet, and the largest height the block holds.
    set(4, 4, 1, 16).unwrap();
    e.memcpy_dtoh(ctx, &mut out, p, Obj(0)).unwrap();
    assert_eq!(out, [0xff; 64]);
    set(1, 1, 1, 64).unwrap();
}

/// A function whose image claims everything at its largest.
fn absurd_function(e: &Emulated, ctx: Obj) -> Obj {
    let kernel = KernelInfo {
        name: "absurd".into(),
        shared_bytes: u32::MAX,
        registers: u32::MAX,
        max_threads_per_block: Some(u32::MAX),
        ..KernelInfo::default()
    };
    let mut s = e.state();
    let id = s.id();
    s.functions.insert(id, Function::new(ctx.0, kernel));
    Obj(id)
}

#[test]
fn occupancy_refuses_impossible_blocks_and_counts_none_for_too_large_ones() {
    let (e, ctx) = setup();
    let lib = e.library_load(include_bytes!("../../../testdata/plain.fatbin")).unwrap();
    let kernel = e.library_get_kernel(lib, "reduce").unwrap();
    // reduce: 256 threads at most (its launch bounds), 1024 bytes of static shared memory.
    let f = e.kernel_get_function(ctx, kernel).unwrap();
    let blocks = |block, smem| e.occupancy_max_active_blocks(ctx, f, block, smem, 0).map_err(|e| e.code);
    assert!(blocks(256, 0).unwrap() > 0);
    for block in [i32::MAX, 1025, 0, -1, i32::MIN] {
        assert_eq!(blocks(block, 0), Err(CuError::INVALID_VALUE), "{block} threads");
    }
    assert_eq!(blocks(512, 0), Ok(0), "past the function's launch bounds");
    assert_eq!(blocks(256, 48 << 10), Ok(0), "past its dynamic shared memory");
    assert_eq!(blocks(256, u64::MAX), Ok(0));
    assert_eq!(e.occupancy_max_active_blocks(ctx, f, 256, 0, 2).unwrap_err().code, CuError::INVALID_VALUE);

    let smem = |count, block| e.occupancy_available_smem(ctx, f, count, block).map_err(|e| e.code);
    assert_eq!(smem(1, 256), Ok(47 << 10), "the function's limit");
    assert_eq!(smem(8, 32), Ok((228 << 10) / 8 - 1024), "an eighth of the multiprocessor's");
    for (count, block) in [(0, 256), (i32::MIN, 256), (1, i32::MAX), (1, 0), (1, 512), (i32::MAX, 32), (33, 32)] {
        assert_eq!(smem(count, block), Err(CuError::INVALID_VALUE), "{count} blocks of {block}");
    }

    let potential = |smem, limit| e.occupancy_max_potential_block_size(ctx, f, smem, limit, 0).unwrap();
    assert_eq!(potential(0, 0).1, 256);
    assert_eq!(potential(0, 16).1, 16, "a limit below a warp is a block size too");
    assert_eq!(potential(0, i32::MAX).1, 256);
    assert_eq!(potential(0, i32::MIN).1, 256, "no limit");
    assert_eq!(potential(u64::MAX, 0), (0, 0), "no block size fits");
}

#[test]
fn occupancy_of_an_absurd_image_is_zero_not_a_panic() {
    let (e, ctx) = setup();
    let f = absurd_function(&e, ctx);
    let start = Instant::now();
    assert_eq!(e.occupancy_max_active_blocks(ctx, f, 1024, 0, 0).unwrap(), 0);
    assert_eq!(e.occupancy_max_active_blocks(ctx, f, 1, u64::MAX, 0).unwrap(), 0);
    assert_eq!(e.occupancy_max_potential_block_size(ctx, f, 0, 0, 0).unwrap(), (0, 0));
    assert_eq!(e.occupancy_available_smem(ctx, f, 1, 32).unwrap_err().code, CuError::INVALID_VALUE);
    assert!(start.elapsed() < std::time::Duration::from_secs(1), "{:?}", start.elapsed());
    const MAX_DYNAMIC_SHARED: i32 = 8;
    assert!(e.func_set_attribute(ctx, f, MAX_DYNAMIC_SHARED, 1).is_err(), "u32::MAX static bytes and 1 more");
    assert_eq!(e.func_get_attribute(ctx, f, 0).unwrap(), 1024, "the device's limit bounds the function's");
}

#[test]
fn cluster_occupancy_takes_any_dimensions() {
    const CLUSTER_DIMENSION: u32 = 4;
    let (e, ctx) = setup();
    let lib = e.library_load(include_bytes!("../../../testdata/plain.fatbin")).unwrap();
    let kernel = e.library_get_kernel(lib, "reduce").unwrap();
    let f = e.kernel_get_function(ctx, kernel).unwrap();
    let clusters = |dims: [u32; 3]| {
        let mut value = [0u8; 64];
        for (i, d) in dims.iter().enumerate() {
            value[4 * i..4 * i + 4].copy_from_slice(&d.to_le_bytes());
        }
        let launch = Launch {
            grid: [8, 1, 1],
            block: [256, 1, 1],
            shared_mem: 0,
            stream: Obj(0),
            attrs: vec![(CLUSTER_DIMENSION, value)],
        };
        e.occupancy_clusters(ctx, f, &launch, ClusterQuery::MaxActiveClusters).unwrap()
    };
    assert!(clusters([2, 1, 1]) > 0);
    for dims in [[u32::MAX; 3], [65536, 65536, 1], [0, 1, 1], [u32::MAX, u32::MAX, 1], [3, 3, 1]] {
        assert_eq!(clusters(dims), 0, "{dims:?}");
    }
}

#[test]
fn pitched_allocations_of_absurd_widths_are_refused() {
    let (e, ctx) = setup();
    assert_eq!(e.mem_alloc_pitch(ctx, u64::MAX, 1, 4).unwrap_err().code, CuError::INVALID_VALUE);
    assert_eq!(e.mem_alloc_pitch(ctx, u64::MAX - 510, 1, 4).unwrap_err().code, CuError::INVALID_VALUE);
}
