//! Arrays, texture objects and 2D and 3D copies through a live server on
//! the emulated backend: every device range a copy or an object reaches is
//! checked, rows and slices included; another session's arrays and objects
//! are nobody's to this one; bad sizes fail alone; and arrays are held
//! until destroyed or their session vanishes.

use gpuplex_protocol::calls::*;
use gpuplex_protocol::{
    Array, ArrayDesc, Copy3D, CopySide, CuError, DevPtr, ResourceDesc, Stream, COPY_2D, COPY_3D, COPY_ARRAY_LINEAR,
    RESOURCE_ARRAY, RESOURCE_LINEAR, RESOURCE_MIPMAPPED_ARRAY, RESOURCE_PITCH2D, SIDE_ARRAY, SIDE_DEVICE, SIDE_INLINE,
    TEXTURE_DESC_BYTES,
};

mod common;

use common::*;

/// `CU_AD_FORMAT_FLOAT`.
const FLOAT: u32 = 0x20;

fn array(c: &mut Client, width: u64, height: u64) -> Result<Array, CuError> {
    let desc = ArrayDesc { width, height, depth: 0, format: FLOAT, channels: 1, flags: 0 };
    c.call(ArrayCreate::Request { desc }).map(|r| r.array)
}

fn inline() -> CopySide {
    CopySide { kind: SIDE_INLINE, at: 0, block: 0, x: 0, y: 0, z: 0, pitch: 0, height: 0 }
}

fn device(p: DevPtr, pitch: u64) -> CopySide {
    CopySide { kind: SIDE_DEVICE, at: p.0, pitch, ..inline() }
}

fn in_array(a: Array) -> CopySide {
    CopySide { kind: SIDE_ARRAY, at: a.0, ..inline() }
}

/// A 2D copy of `rows` rows of `width` bytes.
fn copy(
    c: &mut Client,
    src: CopySide,
    dst: CopySide,
    width: u64,
    rows: u64,
    input: Vec<u8>,
) -> Result<Vec<u8>, CuError> {
    let copy = Copy3D { shape: COPY_2D, src, dst, width, height: rows, depth: 1 };
    c.call(Memcpy3D::Request { copy, input, stream: Stream::NULL, sync: true }).map(|r| r.output)
}

fn texture(c: &mut Client, res: ResourceDesc) -> Result<u64, CuError> {
    c.call(TexObjectCreate::Request { res, tex: vec![0; TEXTURE_DESC_BYTES], view: vec![] }).map(|r| r.object)
}

fn resource(kind: u32, at: u64) -> ResourceDesc {
    ResourceDesc { kind, at, format: FLOAT, channels: 1, width: 0, height: 0, pitch: 0, size: 0, flags: 0 }
}

#[test]
fn copies_reach_every_row_inside_the_allocation_and_nothing_beyond() {
    within_30_s(|| {
        let address = start_server("arrays-rows");
        let mut c = Client::connect(&address);
        let p = c.alloc(64 * 16);
        let image = pattern(32 * 16, 1);
        // Rows of 32 bytes, 64 apart: the last ends 32 bytes before the allocation does.
        copy(&mut c, inline(), device(p, 64), 32, 16, image.clone()).unwrap();
        assert_eq!(copy(&mut c, device(p, 64), inline(), 32, 16, vec![]).unwrap(), image);
        // One row more, or a pitch that walks past the end, is refused.
        let over = copy(&mut c, inline(), device(p, 64), 32, 17, vec![0; 32 * 17]);
        assert_eq!(over, Err(CuError::INVALID_VALUE));
        assert_eq!(copy(&mut c, device(p, 128), inline(), 32, 16, vec![]), Err(CuError::INVALID_VALUE));
        let far = CopySide { y: u64::MAX / 2, ..device(p, 64) };
        assert_eq!(copy(&mut c, far, inline(), 32, 2, vec![]), Err(CuError::INVALID_VALUE), "an overflowing start");
        // The bytes sent must be the copy's, and fit in a frame.
        assert_eq!(copy(&mut c, inline(), device(p, 64), 32, 16, vec![0; 5]), Err(CuError::INVALID_VALUE));
        assert_eq!(copy(&mut c, device(p, 64), inline(), 1 << 20, 64, vec![]), Err(CuError::INVALID_VALUE));
        assert_eq!(copy(&mut c, inline(), inline(), 4, 1, vec![0; 4]), Err(CuError::INVALID_VALUE));
        // A 3D copy's slices count too.
        let slices = Copy3D {
            shape: COPY_3D,
            src: inline(),
            dst: CopySide { height: 8, ..device(p, 64) },
            width: 32,
            height: 8,
            depth: 3,
        };
        let req = Memcpy3D::Request { copy: slices, input: vec![0; 32 * 8 * 3], stream: Stream::NULL, sync: true };
        assert_eq!(err(c.call(req)), CuError::INVALID_VALUE, "a third slice past the end");
        assert_eq!(c.read(p, 32), image[..32], "nothing refused was written");

        // Each copy function takes only the positions it has: a 2D copy no
        // slice, a linear array copy no row (else the range checked would
        // not be the range copied).
        let other = c.alloc(64 * 16);
        let shaped = |c: &mut Client, shape, src: CopySide, dst: CopySide, width, height| {
            let copy = Copy3D { shape, src, dst, width, height, depth: 1 };
            c.call(Memcpy3D::Request { copy, input: vec![], stream: Stream::NULL, sync: true }).map(drop)
        };
        let sliced = CopySide { z: 1, height: 1, ..device(p, 64) };
        assert_eq!(shaped(&mut c, COPY_2D, sliced, device(other, 64), 8, 1), Err(CuError::INVALID_VALUE));
        let a = array(&mut c, 16, 1).unwrap();
        let rowed = CopySide { y: 1, ..device(p, 64) };
        assert_eq!(shaped(&mut c, COPY_ARRAY_LINEAR, rowed, in_array(a), 8, 1), Err(CuError::INVALID_VALUE));
        // Rows of linear memory may not overlap.
        assert_eq!(shaped(&mut c, COPY_2D, device(p, 16), device(other, 64), 32, 4), Err(CuError::INVALID_VALUE));
    });
}

#[test]
fn another_session_s_arrays_and_objects_are_not_this_one_s() {
    within_30_s(|| {
        let address = start_server("arrays-others");
        let mut owner = Client::connect(&address);
        let a = array(&mut owner, 16, 16).unwrap();
        let data = pattern(64 * 16, 2);
        copy(&mut owner, inline(), in_array(a), 64, 16, data.clone()).unwrap();
        let p = owner.alloc(4096);
        let tex = texture(&mut owner, resource(RESOURCE_ARRAY, a.0)).unwrap();

        let mut other = Client::connect(&address);
        assert_eq!(copy(&mut other, in_array(a), inline(), 64, 16, vec![]), Err(CuError::INVALID_HANDLE));
        assert_eq!(err(other.call(cuArrayDestroy::Request { hArray: a })), CuError::INVALID_HANDLE);
        assert_eq!(err(other.call(ArrayDescriptor::Request { array: a })), CuError::INVALID_HANDLE);
        assert_eq!(texture(&mut other, resource(RESOURCE_ARRAY, a.0)), Err(CuError::INVALID_HANDLE));
        let linear = ResourceDesc { size: 4096, ..resource(RESOURCE_LINEAR, p.0) };
        assert_eq!(texture(&mut other, linear), Err(CuError::INVALID_VALUE), "another session's memory");
        assert_eq!(err(other.call(TexObjectDestroy::Request { object: tex })), CuError::INVALID_VALUE);
        assert_eq!(err(other.call(SurfObjectDestroy::Request { object: tex })), CuError::INVALID_VALUE);

        assert_eq!(copy(&mut owner, in_array(a), inline(), 64, 16, vec![]).unwrap(), data);
        owner.call(TexObjectDestroy::Request { object: tex }).unwrap();
        assert_eq!(err(owner.call(TexObjectDestroy::Request { object: tex })), CuError::INVALID_VALUE, "twice");
    });
}

#[test]
fn objects_read_only_the_session_s_memory_and_bad_descriptors_fail_alone() {
    within_30_s(|| {
        let address = start_server("arrays-objects");
        let mut c = Client::connect(&address);
        let p = c.alloc(64 * 16);
        let pitched = ResourceDesc { width: 16, height: 16, pitch: 64, ..resource(RESOURCE_PITCH2D, p.0) };
        let tex = texture(&mut c, pitched.clone()).unwrap();
        c.call(TexObjectDestroy::Request { object: tex }).unwrap();
        let flat = ResourceDesc { height: 0, ..pitched.clone() };
        assert_eq!(texture(&mut c, flat), Err(CuError::INVALID_VALUE), "no rows");
        let narrow = ResourceDesc { pitch: 32, ..pitched.clone() };
        assert_eq!(texture(&mut c, narrow), Err(CuError::INVALID_VALUE), "rows wider than the pitch");
        let taller = ResourceDesc { height: 17, ..pitched.clone() };
        assert_eq!(texture(&mut c, taller), Err(CuError::INVALID_VALUE));
        let wider = ResourceDesc { width: 17, pitch: 68, ..pitched.clone() };
        assert_eq!(texture(&mut c, wider), Err(CuError::INVALID_VALUE));
        let linear = ResourceDesc { size: 64 * 16 + 1, ..resource(RESOURCE_LINEAR, p.0) };
        assert_eq!(texture(&mut c, linear), Err(CuError::INVALID_VALUE));
        assert_eq!(texture(&mut c, resource(RESOURCE_MIPMAPPED_ARRAY, 0x1000)), Err(CuError::INVALID_HANDLE));
        assert_eq!(texture(&mut c, resource(9, p.0)), Err(CuError::INVALID_VALUE));
        let short = TexObjectCreate::Request { res: pitched.clone(), tex: vec![0; 8], view: vec![] };
        assert_eq!(err(c.call(short)), CuError::INVALID_VALUE);
        let view = TexObjectCreate::Request { res: pitched, tex: vec![0; TEXTURE_DESC_BYTES], view: vec![0; 3] };
        assert_eq!(err(c.call(view)), CuError::INVALID_VALUE);
        // Formats the server cannot size, and sizes that overflow.
        let odd = ArrayDesc { width: 4, height: 4, depth: 0, format: 0x91, channels: 4, flags: 0 };
        assert_eq!(err(c.call(ArrayCreate::Request { desc: odd })), CuError::NOT_SUPPORTED);
        let three = ArrayDesc { width: 4, height: 4, depth: 0, format: FLOAT, channels: 3, flags: 0 };
        assert_eq!(err(c.call(ArrayCreate::Request { desc: three })), CuError::INVALID_VALUE);
        assert_eq!(array(&mut c, u64::MAX / 2, u64::MAX / 2), Err(CuError::INVALID_VALUE));
        assert!(c.free_memory() > 0, "the server carries on");
    });
}

#[test]
fn arrays_are_held_until_destroyed_and_a_vanished_session_frees_them() {
    within_30_s(|| {
        let address = start_server("arrays-held");
        let mut observer = Client::connect(&address);
        let before = observer.free_memory();
        let mut c = Client::connect(&address);
        let a = array(&mut c, 1024, 256).unwrap();
        assert_eq!(observer.free_memory(), before - (1 << 20));
        let desc = c.call(ArrayDescriptor::Request { array: a }).unwrap().desc;
        assert_eq!((desc.width, desc.height, desc.format, desc.channels), (1024, 256, FLOAT, 1));
        c.call(cuArrayDestroy::Request { hArray: a }).unwrap();
        assert_eq!(observer.free_memory(), before);
        array(&mut c, 1024, 512).unwrap();
        drop(c);
        wait_for("the vanished session's array to be freed", || observer.free_memory() == before);
    });
}

/// A mipmapped array is charged by all its levels' bytes; each level is an
/// array handle of the session's that goes with the mipmapped array, and
/// that cuArrayDestroy refuses; another session names none of them.
#[test]
fn a_mipmap_s_levels_go_with_it() {
    within_30_s(|| {
        let address = start_server("arrays-mipmap");
        let mut observer = Client::connect(&address);
        let before = observer.free_memory();
        let mut c = Client::connect(&address);
        let desc = ArrayDesc { width: 256, height: 256, depth: 0, format: FLOAT, channels: 1, flags: 0 };
        let create = |c: &mut Client, levels| c.call(MipmappedArrayCreate::Request { desc: desc.clone(), levels });
        assert_eq!(err(create(&mut c, 0)), CuError::INVALID_VALUE);
        assert_eq!(err(create(&mut c, 10)), CuError::INVALID_VALUE, "more levels than halvings of 256");
        let mip = create(&mut c, 3).unwrap().mipmap;
        let levels = (256 * 256 + 128 * 128 + 64 * 64) * 4;
        assert_eq!(observer.free_memory(), before - levels);

        let level = |c: &mut Client, level| {
            c.call(cuMipmappedArrayGetLevel::Request { hMipmappedArray: mip, level }).map(|r| r.pLevelArray)
        };
        let second = level(&mut c, 1).unwrap();
        assert_eq!(level(&mut c, 1).unwrap(), second, "one handle per level");
        assert_eq!(err(level(&mut c, 3)), CuError::INVALID_VALUE);
        let d = c.call(ArrayDescriptor::Request { array: second }).unwrap().desc;
        assert_eq!((d.width, d.height), (128, 128));
        let row = vec![7u8; 512];
        copy(&mut c, inline(), in_array(second), 512, 1, row.clone()).unwrap();
        assert_eq!(copy(&mut c, in_array(second), inline(), 512, 1, vec![]).unwrap(), row);
        assert_eq!(err(c.call(cuArrayDestroy::Request { hArray: second })), CuError::INVALID_VALUE);
        let tex = texture(&mut c, resource(RESOURCE_MIPMAPPED_ARRAY, mip.0)).unwrap();

        let mut other = Client::connect(&address);
        assert_eq!(err(other.call(ArrayDescriptor::Request { array: second })), CuError::INVALID_HANDLE);
        assert_eq!(err(other.call(cuMipmappedArrayDestroy::Request { hMipmappedArray: mip })), CuError::INVALID_HANDLE);

        c.call(TexObjectDestroy::Request { object: tex }).unwrap();
        c.call(cuMipmappedArrayDestroy::Request { hMipmappedArray: mip }).unwrap();
        assert_eq!(err(c.call(ArrayDescriptor::Request { array: second })), CuError::INVALID_HANDLE);
        assert_eq!(observer.free_memory(), before);
        create(&mut c, 2).unwrap();
        drop(c);
        wait_for("the vanished session's mipmap to be freed", || observer.free_memory() == before);
    });
}
