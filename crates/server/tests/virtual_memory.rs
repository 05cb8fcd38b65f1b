//! Virtual memory through a live server on the emulated backend: what a
//! session may map, copy and free is checked against its own reservations,
//! allocations and mappings; another session's handles and ranges are
//! nobody's to it; and a vanished session leaves nothing held.

use gpuplex_protocol::calls::*;
use gpuplex_protocol::{AccessDesc, AllocProp, CuError, DevPtr, Seq, Stream, LOCATION_DEVICE};

mod common;

use common::*;

const MIB: u64 = 1 << 20;

fn prop() -> AllocProp {
    AllocProp::pinned(0)
}

fn granule(c: &mut Client) -> u64 {
    c.call(MemGranularity::Request { prop: prop(), option: 0 }).unwrap().granularity
}

fn create(c: &mut Client, size: u64) -> u64 {
    c.call(MemCreate::Request { size, prop: prop(), flags: 0 }).unwrap().handle
}

fn reserve(c: &mut Client, size: u64) -> u64 {
    c.call(MemAddressReserve::Request { size, alignment: 0, addr: DevPtr(0), flags: 0 }).unwrap().ptr.0
}

fn map(c: &mut Client, ptr: u64, size: u64, handle: u64) -> Result<(), CuError> {
    c.call(MemMap::Request { ptr: DevPtr(ptr), size, offset: 0, handle, flags: 0 }).map(drop)
}

fn grant(c: &mut Client, ptr: u64, size: u64) {
    let access = Seq(vec![AccessDesc { location_kind: LOCATION_DEVICE, location: 0, flags: 3 }]);
    c.call(MemSetAccess::Request { ptr: DevPtr(ptr), size, access }).unwrap();
}

/// Two granules mapped back to back at the start of a reservation of four,
/// granted read-write: `(granule, base, [first, second])`.
fn two_mapped(c: &mut Client) -> (u64, u64, [u64; 2]) {
    let g = granule(c);
    let base = reserve(c, 4 * g);
    let handles = [create(c, g), create(c, g)];
    map(c, base, g, handles[0]).unwrap();
    map(c, base + g, g, handles[1]).unwrap();
    grant(c, base, 2 * g);
    (g, base, handles)
}

#[test]
fn copies_reach_mapped_memory_across_the_seam_and_nothing_beyond() {
    within_30_s(|| {
        let address = start_server("vmm-copies");
        let mut c = Client::connect(&address);
        let (g, base, _) = two_mapped(&mut c);
        let data = pattern(4096, 3);
        c.write(DevPtr(base + g - 2048), &data);
        assert_eq!(c.read(DevPtr(base + g - 2048), 4096), data);
        // The third granule is reserved but not mapped.
        let beyond =
            MemcpyHtoD::Request { dst: DevPtr(base + 2 * g - 8), data: vec![1; 16], stream: Stream::NULL, sync: true };
        assert_eq!(err(c.call(beyond)), CuError::INVALID_VALUE);
        let unmapped = MemcpyDtoH::Request { src: DevPtr(base + 3 * g), size: 4, stream: Stream::NULL, sync: true };
        assert_eq!(err(c.call(unmapped)), CuError::INVALID_VALUE);
        // A mapping is not an allocation.
        assert_eq!(err(c.call(cuMemFree_v2::Request { dptr: DevPtr(base) })), CuError::INVALID_VALUE);
    });
}

#[test]
fn maps_unmaps_and_frees_must_name_the_session_s_own_whole_pieces() {
    within_30_s(|| {
        let address = start_server("vmm-rules");
        let mut c = Client::connect(&address);
        let (g, base, [a, b]) = two_mapped(&mut c);
        let spare = create(&mut c, g);
        assert_eq!(map(&mut c, base + g, g, spare), Err(CuError::INVALID_VALUE), "over a mapping");
        assert_eq!(map(&mut c, base + 4 * g, g, spare), Err(CuError::INVALID_VALUE), "past the reservation");
        assert_eq!(map(&mut c, base + 3 * g, 2 * g, spare), Err(CuError::INVALID_VALUE), "longer than the allocation");
        assert_eq!(map(&mut c, base + 3 * g, g, 0xdead_0000), Err(CuError::INVALID_VALUE), "a forged handle");
        let half = MemUnmap::Request { ptr: DevPtr(base), size: g / 2 };
        assert_eq!(err(c.call(half)), CuError::INVALID_VALUE, "half a mapping");
        let gap = MemUnmap::Request { ptr: DevPtr(base), size: 3 * g };
        assert_eq!(err(c.call(gap)), CuError::INVALID_VALUE, "a range with an unmapped part");
        let busy = MemAddressFree::Request { ptr: DevPtr(base), size: 4 * g };
        assert_eq!(err(c.call(busy)), CuError::INVALID_VALUE, "a reservation with mappings");
        let wrong = MemAddressFree::Request { ptr: DevPtr(base), size: 2 * g };
        assert_eq!(err(c.call(wrong)), CuError::INVALID_VALUE, "not the reserved size");

        c.call(MemUnmap::Request { ptr: DevPtr(base), size: 2 * g }).unwrap();
        for h in [a, b, spare] {
            c.call(MemRelease::Request { handle: h }).unwrap();
            assert_eq!(err(c.call(MemRelease::Request { handle: h })), CuError::INVALID_VALUE, "released twice");
        }
        c.call(MemAddressFree::Request { ptr: DevPtr(base), size: 4 * g }).unwrap();
    });
}

#[test]
fn another_session_s_handles_and_ranges_are_not_this_one_s() {
    within_30_s(|| {
        let address = start_server("vmm-others");
        let mut owner = Client::connect(&address);
        let (g, base, [a, _]) = two_mapped(&mut owner);
        owner.write(DevPtr(base), &[7; 64]);
        let mut other = Client::connect(&address);
        let own = reserve(&mut other, g);
        assert_eq!(map(&mut other, own, g, a), Err(CuError::INVALID_VALUE), "another session's allocation");
        assert_eq!(err(other.call(MemRetain::Request { addr: DevPtr(base) })), CuError::INVALID_VALUE);
        assert_eq!(err(other.call(MemProperties::Request { handle: a })), CuError::INVALID_VALUE);
        let read = MemcpyDtoH::Request { src: DevPtr(base), size: 64, stream: Stream::NULL, sync: true };
        assert_eq!(err(other.call(read)), CuError::INVALID_VALUE);
        let unmap = MemUnmap::Request { ptr: DevPtr(base), size: g };
        assert_eq!(err(other.call(unmap)), CuError::INVALID_VALUE);
        assert_eq!(owner.read(DevPtr(base), 64), vec![7; 64]);
    });
}

#[test]
fn physical_memory_is_held_until_released_and_unmapped_and_a_vanished_session_frees_it() {
    within_30_s(|| {
        let address = start_server("vmm-held");
        let mut observer = Client::connect(&address);
        let before = observer.free_memory();
        let mut c = Client::connect(&address);
        let (g, base, [a, _]) = two_mapped(&mut c);
        assert_eq!(observer.free_memory(), before - 2 * g);
        c.call(MemRelease::Request { handle: a }).unwrap();
        assert_eq!(observer.free_memory(), before - 2 * g, "released but mapped");
        // Still its own to find again from an address, and to release again.
        let found = c.call(MemRetain::Request { addr: DevPtr(base + 10) }).unwrap().handle;
        assert_eq!(found, a);
        assert_eq!(c.call(MemProperties::Request { handle: a }).unwrap().prop, prop());
        c.call(MemRelease::Request { handle: a }).unwrap();
        c.call(MemUnmap::Request { ptr: DevPtr(base), size: g }).unwrap();
        assert_eq!(observer.free_memory(), before - g, "released and unmapped");
        drop(c);
        wait_for("the vanished session's mapping to be freed", || observer.free_memory() == before);
    });
}

#[test]
fn bad_properties_are_refused_and_handle_types_are_the_device_s_to_judge() {
    within_30_s(|| {
        let address = start_server("vmm-props");
        let mut c = Client::connect(&address);
        // Asked for by many programs that never export: the device can make it.
        let fd = AllocProp { handle_types: 1, ..prop() };
        let g = c.call(MemGranularity::Request { prop: fd.clone(), option: 0 }).unwrap().granularity;
        let h = c.call(MemCreate::Request { size: g, prop: fd, flags: 0 }).unwrap().handle;
        c.call(MemRelease::Request { handle: h }).unwrap();
        let fabric = AllocProp { handle_types: 8, ..prop() };
        assert_eq!(err(c.call(MemGranularity::Request { prop: fabric, option: 0 })), CuError::NOT_SUPPORTED);
        let elsewhere = AllocProp { location: 5, ..prop() };
        assert_eq!(
            err(c.call(MemCreate::Request { size: 2 * MIB, prop: elsewhere, flags: 0 })),
            CuError::INVALID_DEVICE
        );
        assert_eq!(err(c.call(MemCreate::Request { size: MIB, prop: prop(), flags: 0 })), CuError::INVALID_VALUE);
        let most = (u64::MAX / 2) & !(2 * MIB - 1);
        let huge = || MemAddressReserve::Request { size: most, alignment: 0, addr: DevPtr(0), flags: 0 };
        let _ = c.call(huge());
        assert_eq!(err(c.call(huge())), CuError::OUT_OF_MEMORY, "the address space ends, and the server carries on");
        assert!(c.free_memory() > 0);
    });
}
