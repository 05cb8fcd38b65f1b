use super::*;

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
    assert_eq!(e.stream_priority(ctx, s).unwrap(), device::PRIORITY_RANGE.1);
    assert_eq!(e.stream_flags(ctx, s).unwrap(), 1);
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
