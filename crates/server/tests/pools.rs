//! Memory pools through a live server on the emulated backend: a session's
//! pools and stream-ordered allocations are its own, what a pool keeps for
//! reuse is held until given back, bad handles and sizes fail alone, and a
//! vanished session leaves nothing held.

use gpuplex_protocol::calls::*;
use gpuplex_protocol::{
    AccessDesc, CuError, DevPtr, MemPool, PoolProps, Seq, Stream, ALLOCATION_PINNED, HANDLE_TYPE_NONE, LOCATION_DEVICE,
};

mod common;

use common::*;

const MIB: u64 = 1 << 20;
/// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD` and `_USED_MEM_CURRENT`.
const RELEASE_THRESHOLD: i32 = 4;
const USED_MEM_CURRENT: i32 = 7;

fn alloc_from(c: &mut Client, size: u64, pool: MemPool) -> Result<DevPtr, CuError> {
    c.call(MemAllocAsync::Request { size, pool, stream: Stream::NULL }).map(|r| r.dptr)
}

fn free_async(c: &mut Client, ptr: DevPtr) -> Result<(), CuError> {
    c.call(MemFreeAsync::Request { dptr: ptr, stream: Stream::NULL }).map(drop)
}

fn sync(c: &mut Client) {
    c.call(cuStreamSynchronize::Request { hStream: Stream::NULL }).unwrap();
}

fn default_pool(c: &mut Client) -> MemPool {
    c.call(cuDeviceGetDefaultMemPool::Request { dev: 0 }).unwrap().pool_out
}

fn props(location: i32) -> PoolProps {
    PoolProps {
        kind: ALLOCATION_PINNED,
        handle_types: HANDLE_TYPE_NONE,
        location_kind: LOCATION_DEVICE,
        location,
        max_size: 0,
        usage: 0,
    }
}

#[test]
fn another_session_s_pools_and_allocations_are_not_this_one_s() {
    within_30_s(|| {
        let address = start_server("pools-others");
        let mut owner = Client::connect(&address);
        let pool = owner.call(MemPoolCreate::Request { props: props(0) }).unwrap().pool;
        let ptr = alloc_from(&mut owner, MIB, pool).unwrap();
        owner.write(ptr, &[9; 64]);
        let mut other = Client::connect(&address);
        assert_eq!(alloc_from(&mut other, MIB, pool), Err(CuError::INVALID_VALUE), "another session's pool");
        assert_eq!(free_async(&mut other, ptr), Err(CuError::INVALID_VALUE), "another session's allocation");
        assert_eq!(err(other.call(cuMemFree_v2::Request { dptr: ptr })), CuError::INVALID_VALUE);
        let read = MemcpyDtoH::Request { src: ptr, size: 64, stream: Stream::NULL, sync: true };
        assert_eq!(err(other.call(read)), CuError::INVALID_VALUE);
        assert_eq!(err(other.call(cuMemPoolDestroy::Request { pool })), CuError::INVALID_VALUE);
        assert_eq!(err(other.call(cuDeviceSetMemPool::Request { dev: 0, pool })), CuError::INVALID_VALUE);
        let attr = MemPoolGetAttribute::Request { pool, attr: USED_MEM_CURRENT };
        assert_eq!(err(other.call(attr)), CuError::INVALID_VALUE);
        // Its own default pool is a pool of its own.
        let own = default_pool(&mut other);
        let mine = alloc_from(&mut other, MIB, MemPool(0)).unwrap();
        other.write(mine, &[1; 64]);
        let used = other.call(MemPoolGetAttribute::Request { pool: own, attr: USED_MEM_CURRENT }).unwrap().value;
        assert_eq!(used, MIB);
        assert_eq!(owner.read(ptr, 64), vec![9; 64]);
        let used = owner.call(MemPoolGetAttribute::Request { pool, attr: USED_MEM_CURRENT }).unwrap().value;
        assert_eq!(used, MIB, "the other session's allocation is not in this pool");
    });
}

#[test]
fn what_a_pool_keeps_is_held_until_given_back_and_a_vanished_session_frees_everything() {
    within_30_s(|| {
        let address = start_server("pools-held");
        let mut observer = Client::connect(&address);
        let before = observer.free_memory();
        let mut c = Client::connect(&address);
        let pool = default_pool(&mut c);

        // Release threshold 0, the default: given back at the synchronize.
        let p = alloc_from(&mut c, 8 * MIB, MemPool(0)).unwrap();
        assert_eq!(observer.free_memory(), before - 8 * MIB);
        free_async(&mut c, p).unwrap();
        sync(&mut c);
        assert_eq!(observer.free_memory(), before);

        // Kept under a threshold, until a trim; the tenant's reading says so too.
        c.call(MemPoolSetAttribute::Request { pool, attr: RELEASE_THRESHOLD, value: u64::MAX }).unwrap();
        let p = alloc_from(&mut c, 8 * MIB, MemPool(0)).unwrap();
        free_async(&mut c, p).unwrap();
        sync(&mut c);
        assert_eq!(observer.free_memory(), before - 8 * MIB, "kept for reuse");
        assert_eq!(c.free_memory(), before - 8 * MIB);
        c.call(cuMemPoolTrimTo::Request { pool, minBytesToKeep: 0 }).unwrap();
        assert_eq!(observer.free_memory(), before);

        // A vanished session's allocations and pools go with it.
        let own = c.call(MemPoolCreate::Request { props: props(0) }).unwrap().pool;
        alloc_from(&mut c, 4 * MIB, own).unwrap();
        alloc_from(&mut c, 4 * MIB, MemPool(0)).unwrap();
        assert_eq!(observer.free_memory(), before - 8 * MIB);
        drop(c);
        wait_for("the vanished session's pools to be freed", || observer.free_memory() == before);
    });
}

#[test]
fn bad_pool_calls_fail_alone_and_destroyed_pools_outlive_their_allocations() {
    within_30_s(|| {
        let address = start_server("pools-bad");
        let mut c = Client::connect(&address);
        let forged = MemPool(0xdead_0000);
        assert_eq!(alloc_from(&mut c, MIB, forged), Err(CuError::INVALID_VALUE));
        assert_eq!(err(c.call(cuMemPoolDestroy::Request { pool: forged })), CuError::INVALID_VALUE);
        assert_eq!(err(c.call(cuMemPoolTrimTo::Request { pool: forged, minBytesToKeep: 0 })), CuError::INVALID_VALUE);
        assert_eq!(alloc_from(&mut c, 0, MemPool(0)), Err(CuError::INVALID_VALUE), "zero bytes");
        assert_eq!(alloc_from(&mut c, u64::MAX, MemPool(0)), Err(CuError::OUT_OF_MEMORY), "more than the device");
        assert_eq!(free_async(&mut c, DevPtr(0x1234_5678)), Err(CuError::INVALID_VALUE));
        free_async(&mut c, DevPtr(0)).unwrap();
        let host = PoolProps { location_kind: 2, ..props(0) };
        assert_eq!(err(c.call(MemPoolCreate::Request { props: host })), CuError::NOT_SUPPORTED);
        assert_eq!(err(c.call(MemPoolCreate::Request { props: props(5) })), CuError::INVALID_DEVICE);
        assert_eq!(err(c.call(cuDeviceGetDefaultMemPool::Request { dev: 5 })), CuError::INVALID_DEVICE);
        let access = Seq(vec![AccessDesc { location_kind: 2, location: 0, flags: 3 }]);
        let pool = default_pool(&mut c);
        assert_eq!(err(c.call(MemPoolSetAccess::Request { pool, access })), CuError::NOT_SUPPORTED);
        assert_eq!(err(c.call(cuMemPoolDestroy::Request { pool })), CuError::INVALID_VALUE, "the default pool");
        let unknown = MemPoolGetAttribute::Request { pool, attr: 99 };
        assert_eq!(err(c.call(unknown)), CuError::NOT_SUPPORTED, "an attribute gpuplex does not know");

        // Destroyed with an allocation live: the handle is gone, the allocation
        // stays usable until freed, by cuMemFree as well.
        let own = c.call(MemPoolCreate::Request { props: props(0) }).unwrap().pool;
        c.call(cuDeviceSetMemPool::Request { dev: 0, pool: own }).unwrap();
        let p = alloc_from(&mut c, MIB, MemPool(0)).unwrap();
        c.call(cuMemPoolDestroy::Request { pool: own }).unwrap();
        assert_eq!(c.call(cuDeviceGetMemPool::Request { dev: 0 }).unwrap().pool, pool, "back to the default");
        assert_eq!(alloc_from(&mut c, MIB, own), Err(CuError::INVALID_VALUE));
        c.write(p, &[5; 16]);
        assert_eq!(c.read(p, 16), vec![5; 16]);
        let before = c.free_memory();
        c.call(cuMemFree_v2::Request { dptr: p }).unwrap();
        assert_eq!(c.free_memory(), before + MIB);
        assert_eq!(free_async(&mut c, p), Err(CuError::INVALID_VALUE), "freed twice");
        assert!(c.free_memory() > 0, "the server carries on");
    });
}

/// Readings taken before a synchronization gave memory back, or before a
/// reclaim, are not what an allocation's growth is measured from (once a
/// subtraction that went below zero and ended the session).
#[test]
fn an_allocation_after_the_pool_gave_memory_back_is_measured_from_then() {
    within_30_s(|| {
        let address = start_server("pools-after-release");
        let mut c = Client::connect(&address);
        let p = alloc_from(&mut c, 8 * MIB, MemPool(0)).unwrap();
        free_async(&mut c, p).unwrap();
        sync(&mut c);
        let small = alloc_from(&mut c, MIB, MemPool(0)).unwrap();
        free_async(&mut c, small).unwrap();
        // A cuMemAlloc allocation freed in stream order too.
        let plain = c.alloc(MIB);
        free_async(&mut c, plain).unwrap();
        sync(&mut c);
        assert!(c.free_memory() > 0, "the session carries on");
    });
}
