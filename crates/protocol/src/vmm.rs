//! The structures of virtual memory management and memory pools as they travel.

crate::wire_struct! {
    /// `CUmemAllocationProp`: what kind of physical memory to create, and
    /// where. `location` is a device as the guest numbers it when
    /// `location_kind` is `CU_MEM_LOCATION_TYPE_DEVICE`. The Windows-only
    /// pointer of the C structure never travels.
    pub struct AllocProp {
        pub kind: u32,
        pub handle_types: u32,
        pub location_kind: u32,
        pub location: i32,
        pub compression: u32,
        pub rdma_capable: u32,
        pub usage: u32,
    }
}

impl AllocProp {
    /// Pinned memory on device `dev`, exportable by no handle: what most
    /// programs ask for.
    pub fn pinned(dev: i32) -> AllocProp {
        AllocProp {
            kind: ALLOCATION_PINNED,
            handle_types: HANDLE_TYPE_NONE,
            location_kind: LOCATION_DEVICE,
            location: dev,
            compression: 0,
            rdma_capable: 0,
            usage: 0,
        }
    }
}

crate::wire_struct! {
    /// `CUmemPoolProps`: what a pool's allocations are and where they live,
    /// with `location` numbered as [`AllocProp`]'s. `max_size` 0 leaves the
    /// size to the driver.
    pub struct PoolProps {
        pub kind: u32,
        pub handle_types: u32,
        pub location_kind: u32,
        pub location: i32,
        pub max_size: u64,
        pub usage: u32,
    }
}

crate::wire_struct! {
    /// `CUmemAccessDesc`: who may access a mapped range, and how.
    pub struct AccessDesc {
        pub location_kind: u32,
        pub location: i32,
        pub flags: u32,
    }
}

/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const LOCATION_DEVICE: u32 = 1;
/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
pub const ALLOCATION_PINNED: u32 = 1;
/// `CU_MEM_HANDLE_TYPE_NONE`.
pub const HANDLE_TYPE_NONE: u32 = 0;
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
pub const HANDLE_TYPE_POSIX_FD: u32 = 1;
