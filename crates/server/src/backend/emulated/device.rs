//! What the emulated device reports about itself.
//!
//! The numbers follow a compute-capability-9.0 part with 8 GiB so that
//! programs choosing code paths by capability take ordinary ones, but the
//! name says plainly that this is not a GPU.

use gpuplex_protocol::{Attribute, CuError, DeviceInfo, Seq, DEVICE_ATTRIBUTE_COUNT};

pub const NAME: &str = "gpuplex emulated device (not a GPU)";
pub const TOTAL_MEMORY: u64 = 8 << 30;
pub const MAX_THREADS_PER_BLOCK: u32 = 1024;
pub const MAX_BLOCK: [u32; 3] = [1024, 1024, 64];
pub const MAX_GRID: [u32; 3] = [i32::MAX as u32, 65535, 65535];
pub const SHARED_PER_BLOCK: u32 = 48 << 10;
pub const SHARED_PER_BLOCK_OPTIN: u32 = 227 << 10;
pub const SHARED_PER_SM: u32 = 228 << 10;
pub const THREADS_PER_SM: u32 = 2048;
pub const BLOCKS_PER_SM: u32 = 32;
pub const REGISTERS_PER_SM: u32 = 65536;
pub const MULTIPROCESSORS: u32 = 8;
/// `(least, greatest)` stream priority.
pub const PRIORITY_RANGE: (i32, i32) = (0, -5);

/// `(attribute id, value)`; ids not listed report 0, as real devices do
/// for features they lack.
const ATTRIBUTES: &[(u32, i32)] = &[
    (1, MAX_THREADS_PER_BLOCK as i32),
    (2, MAX_BLOCK[0] as i32),
    (3, MAX_BLOCK[1] as i32),
    (4, MAX_BLOCK[2] as i32),
    (5, MAX_GRID[0] as i32),
    (6, MAX_GRID[1] as i32),
    (7, MAX_GRID[2] as i32),
    (8, SHARED_PER_BLOCK as i32),
    (9, 65536),
    (10, 32),
    (11, i32::MAX),
    (12, 65536),
    (13, 1_000_000),
    (14, 512),
    (15, 1),
    (16, MULTIPROCESSORS as i32),
    (19, 1),
    (30, 512),
    (31, 1),
    (36, 1_000_000),
    (37, 256),
    (38, 4 << 20),
    (39, THREADS_PER_SM as i32),
    (40, 1),
    (41, 1),
    (51, 32),
    (75, 9),
    (76, 0),
    (78, 1),
    (79, 1),
    (80, 1),
    (81, SHARED_PER_SM as i32),
    (82, REGISTERS_PER_SM as i32),
    (87, 2),
    (90, 1),
    (95, 1),
    (97, SHARED_PER_BLOCK_OPTIN as i32),
    (99, 1),
    // Virtual memory management and memory pools (vmm.rs, pools.rs).
    (102, 1),
    (106, BLOCKS_PER_SM as i32),
    (111, 1024),
    (115, 1),
    (126, 1),
];

pub fn info() -> DeviceInfo {
    let attributes = (0..DEVICE_ATTRIBUTE_COUNT)
        .map(|id| match id {
            0 => Attribute { status: CuError::INVALID_VALUE.0, value: 0 },
            _ => Attribute { status: 0, value: ATTRIBUTES.iter().find(|a| a.0 == id).map_or(0, |a| a.1) },
        })
        .collect();
    DeviceInfo {
        name: NAME.to_owned(),
        uuid: *b"gpuplex-emulated",
        total_mem: TOTAL_MEMORY,
        pci_bus_id: "0000:00:00.0".to_owned(),
        attributes: Seq(attributes),
    }
}
