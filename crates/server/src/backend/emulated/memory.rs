//! The emulated device's memory: host buffers at fake device addresses.
//!
//! Addresses start in a range no Linux process maps by default and are
//! never reused, with a guard gap after each block, so a stale pointer or an
//! overrun faults instead of landing in a neighbour. Buffers are zeroed
//! allocations, so large but untouched blocks cost no host memory.
//!
//! Registered host memory (a session's shared blocks) appears at its own
//! address, as unified addressing shows it on a GPU, and is read and
//! written in place.

use std::collections::BTreeMap;

use gpuplex_protocol::CuError;

use super::kernels::DeviceMemory;

/// Where emulated device addresses begin.
const BASE: u64 = 0x3e00_0000_0000;
/// cuMemAlloc's alignment on real devices.
const ALIGN: u64 = 512;
/// Unmapped bytes left after each block.
const GUARD: u64 = 64 << 10;

/// What a block is for, so that teardown can find it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// `cuMemAlloc` in a context.
    Alloc { ctx: u64 },
    /// A module's global variable.
    Global { module: u64 },
    /// Host memory registered from a context.
    Host { ctx: u64 },
    /// A physical allocation mapped into a reserved range (`vmm.rs`).
    Mapped { handle: u64 },
    /// A stream-ordered allocation from a pool (`pools.rs`).
    Pooled { pool: u64 },
    /// A library's `__managed__` variable, one for every context.
    Managed { library: u64 },
}

/// `CU_MEM_ACCESS_FLAGS_PROT_READ`, and with it `_READWRITE`.
pub const PROT_READ: u32 = 1;
pub const PROT_READWRITE: u32 = 3;

pub struct Block {
    data: Storage,
    pub owner: Owner,
    /// What the device may do with the block: everything, but for a mapped
    /// allocation what `cuMemSetAccess` granted.
    access: u32,
}

enum Storage {
    Owned(Vec<u8>),
    /// Host memory the registering session keeps mapped until it
    /// unregisters it.
    Host {
        ptr: *mut u8,
        len: usize,
    },
}

// SAFETY: a `Host` block is plain memory that outlives its registration
// (the session's guarantee); access is serialised by the device lock.
unsafe impl Send for Storage {}

impl Storage {
    fn len(&self) -> usize {
        match self {
            Storage::Owned(v) => v.len(),
            Storage::Host { len, .. } => *len,
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Owned(v) => v,
            // SAFETY: mapped for `len` bytes while registered.
            Storage::Host { ptr, len } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Storage::Owned(v) => v,
            // SAFETY: as above, and writable.
            Storage::Host { ptr, len } => unsafe { std::slice::from_raw_parts_mut(*ptr, *len) },
        }
    }
}

pub struct Memory {
    next: u64,
    used: u64,
    capacity: u64,
    blocks: BTreeMap<u64, Block>,
}

impl Memory {
    pub fn new(capacity: u64) -> Memory {
        Memory { next: BASE, used: 0, capacity, blocks: BTreeMap::new() }
    }

    pub fn used(&self) -> u64 {
        self.used
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn alloc(&mut self, size: u64, owner: Owner, init: &[u8]) -> Result<u64, CuError> {
        self.charge(size)?;
        let mut data = match zeroed(size) {
            Ok(data) => data,
            Err(e) => {
                self.used -= size;
                return Err(e);
            }
        };
        let n = init.len().min(data.len());
        data[..n].copy_from_slice(&init[..n]);
        let Some(addr) = self.reserve(size, ALIGN) else {
            self.used -= size;
            return Err(CuError::OUT_OF_MEMORY);
        };
        self.blocks.insert(addr, Block { data: Storage::Owned(data), owner, access: PROT_READWRITE });
        Ok(addr)
    }

    /// Counts `size` bytes of the device's capacity as taken.
    pub fn charge(&mut self, size: u64) -> Result<(), CuError> {
        if size == 0 || size > self.capacity - self.used {
            return Err(CuError::OUT_OF_MEMORY);
        }
        self.used += size;
        Ok(())
    }

    /// Gives back what [`Memory::charge`] took.
    pub fn uncharge(&mut self, size: u64) {
        self.used -= size;
    }

    /// Takes again what was just given back, which fits by construction.
    pub fn recharge(&mut self, size: u64) {
        self.used += size;
    }

    /// An address range of `size` bytes, aligned to `align` (a power of
    /// two), that no block or other range will ever take; None once the
    /// address space is used up.
    pub fn reserve(&mut self, size: u64, align: u64) -> Option<u64> {
        let addr = self.next.checked_next_multiple_of(align)?;
        self.next = addr.checked_add(size)?.checked_add(GUARD)?.checked_next_multiple_of(ALIGN)?;
        Some(addr)
    }

    /// Whether any block has a byte in `[start, end)`.
    pub fn any_in(&self, start: u64, end: u64) -> bool {
        let before = self.blocks.range(..start).next_back().is_some_and(|(&b, blk)| b + blk.data.len() as u64 > start);
        before || self.blocks.range(start..end).next().is_some()
    }

    /// Puts `data` at `addr` (in a reserved range, clear of every block) as
    /// a mapped allocation, accessible to nobody yet.
    pub fn map(&mut self, addr: u64, data: Vec<u8>, handle: u64) {
        self.blocks.insert(addr, Block { data: Storage::Owned(data), owner: Owner::Mapped { handle }, access: 0 });
    }

    /// Takes the mapped allocation at `addr` out; its bytes.
    pub fn unmap(&mut self, addr: u64) -> Option<Vec<u8>> {
        match self.blocks.get(&addr)?.owner {
            Owner::Mapped { .. } => match self.blocks.remove(&addr)?.data {
                Storage::Owned(data) => Some(data),
                Storage::Host { .. } => None,
            },
            _ => None,
        }
    }

    /// The blocks that cover `[addr, addr + len)` back to back, as
    /// `(base, block)`; None if a byte of it is in none.
    pub fn covering(&self, addr: u64, len: u64) -> Option<Vec<(u64, &Block)>> {
        let end = addr.checked_add(len)?;
        let (&first, _) = self.blocks.range(..=addr).next_back()?;
        let mut blocks = Vec::new();
        let mut at = addr;
        for (&base, block) in self.blocks.range(first..) {
            if at >= end {
                break;
            }
            if base > at || base + block.data.len() as u64 <= at {
                return None;
            }
            blocks.push((base, block));
            at = base + block.data.len() as u64;
        }
        (at >= end && len > 0).then_some(blocks)
    }

    /// The block holding `addr`, as `(base, size)`.
    pub fn block_holding(&self, addr: u64) -> Option<(u64, u64)> {
        let (&base, block) = self.blocks.range(..=addr).next_back()?;
        let size = block.data.len() as u64;
        (addr - base < size).then_some((base, size))
    }

    /// What the device may do with the block at `base`.
    pub fn access(&self, base: u64) -> u32 {
        self.blocks.get(&base).map_or(0, |b| b.access)
    }

    /// Sets what the device may do with the mapped block at `base`.
    pub fn set_access(&mut self, base: u64, access: u32) {
        if let Some(b) = self.blocks.get_mut(&base).filter(|b| matches!(b.owner, Owner::Mapped { .. })) {
            b.access = access;
        }
    }

    /// Makes `len` bytes of host memory at `ptr` device memory at the same
    /// address.
    ///
    /// # Safety
    /// The memory stays mapped and writable until [`Memory::unregister`].
    pub unsafe fn register(&mut self, ptr: *mut u8, len: usize, ctx: u64) -> Result<u64, CuError> {
        let addr = ptr as u64;
        let end = addr.checked_add(len as u64).ok_or(CuError::INVALID_VALUE)?;
        let overlaps = self.blocks.range(..end).next_back().is_some_and(|(&b, blk)| b + blk.data.len() as u64 > addr);
        if len == 0 || overlaps {
            return Err(CuError::INVALID_VALUE);
        }
        let block = Block { data: Storage::Host { ptr, len }, owner: Owner::Host { ctx }, access: PROT_READWRITE };
        self.blocks.insert(addr, block);
        Ok(addr)
    }

    pub fn unregister(&mut self, addr: u64) -> Result<(), CuError> {
        match self.blocks.get(&addr) {
            Some(b) if matches!(b.owner, Owner::Host { .. }) => {
                self.blocks.remove(&addr);
                Ok(())
            }
            _ => Err(CuError::INVALID_VALUE),
        }
    }

    /// Frees the `cuMemAlloc` block starting at `addr`.
    pub fn free(&mut self, addr: u64) -> Result<(), CuError> {
        match self.blocks.get(&addr) {
            Some(b) if matches!(b.owner, Owner::Alloc { .. }) => {
                self.used -= b.data.len() as u64;
                self.blocks.remove(&addr);
                Ok(())
            }
            _ => Err(CuError::INVALID_VALUE),
        }
    }

    /// What the block starting at `addr` is for.
    pub fn owner(&self, addr: u64) -> Option<Owner> {
        self.blocks.get(&addr).map(|b| b.owner)
    }

    /// Removes a pool's block and says its size, leaving its bytes counted
    /// as taken: the pool keeps them.
    pub fn forget(&mut self, addr: u64) -> Option<u64> {
        match self.blocks.get(&addr) {
            Some(b) if matches!(b.owner, Owner::Pooled { .. }) => {
                self.blocks.remove(&addr).map(|b| b.data.len() as u64)
            }
            _ => None,
        }
    }

    /// Frees every block `dead` selects.
    pub fn free_where(&mut self, dead: impl Fn(Owner) -> bool) {
        let used = &mut self.used;
        self.blocks.retain(|_, b| {
            let keep = !dead(b.owner);
            if !keep && !matches!(b.owner, Owner::Host { .. }) {
                *used -= b.data.len() as u64;
            }
            keep
        });
    }

    /// The block holding `[addr, addr + len)` if it grants `access`, and the offset there.
    fn locate(&self, addr: u64, len: u64, access: u32) -> Option<(u64, usize)> {
        let (&base, block) = self.blocks.range(..=addr).next_back()?;
        let offset = addr - base;
        (offset.checked_add(len)? <= block.data.len() as u64 && block.access & access == access)
            .then_some((base, offset as usize))
    }

    pub fn slice_mut(&mut self, addr: u64, len: u64) -> Option<&mut [u8]> {
        let (base, off) = self.locate(addr, len, PROT_READWRITE)?;
        let block = self.blocks.get_mut(&base)?;
        Some(&mut block.data.bytes_mut()[off..off + len as usize])
    }

    /// The pieces of `[addr, addr + len)` in the blocks that hold it back to
    /// back (adjacent mappings of one reservation), each granting `access`:
    /// `(base, offset, bytes)`.
    fn pieces(&self, addr: u64, len: u64, access: u32) -> Option<Vec<(u64, usize, usize)>> {
        if let Some((base, off)) = self.locate(addr, len, access) {
            return Some(vec![(base, off, len as usize)]);
        }
        let blocks = self.covering(addr, len)?;
        let end = addr + len;
        let pieces = blocks.iter().map(|&(base, block)| {
            let from = addr.max(base);
            let to = end.min(base + block.data.len() as u64);
            (block.access & access == access).then_some((base, (from - base) as usize, (to - from) as usize))
        });
        pieces.collect()
    }

    /// Reads `out.len()` bytes at `addr`, across adjacent blocks; false,
    /// reading nothing, if any byte is not readable.
    pub fn read_at(&self, addr: u64, out: &mut [u8]) -> bool {
        let Some(pieces) = self.pieces(addr, out.len() as u64, PROT_READ) else { return false };
        let mut done = 0;
        for (base, off, n) in pieces {
            out[done..done + n].copy_from_slice(&self.blocks[&base].data.bytes()[off..off + n]);
            done += n;
        }
        true
    }

    /// Writes `data` at `addr`, across adjacent blocks; false, writing
    /// nothing, if any byte is not writable.
    pub fn write_at(&mut self, addr: u64, data: &[u8]) -> bool {
        let Some(pieces) = self.pieces(addr, data.len() as u64, PROT_READWRITE) else { return false };
        let mut done = 0;
        for (base, off, n) in pieces {
            let block = self.blocks.get_mut(&base).expect("a piece's block");
            block.data.bytes_mut()[off..off + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
        true
    }
}

/// `size` zero bytes, or OUT_OF_MEMORY if the host has no room for them.
pub fn zeroed(size: u64) -> Result<Vec<u8>, CuError> {
    let size = usize::try_from(size).map_err(|_| CuError::OUT_OF_MEMORY)?;
    let mut data = Vec::new();
    data.try_reserve_exact(size).map_err(|_| CuError::OUT_OF_MEMORY)?;
    // Zeroed by doubling copies: `resize` writes a byte at a time in the
    // unoptimized server the end-to-end tests run (3.5 s for 512 MiB).
    data.push(0);
    while data.len() < size {
        data.extend_from_within(..data.len().min(size - data.len()));
    }
    data.truncate(size);
    Ok(data)
}

/// What reference kernels see: any access outside a live block, or beyond
/// what a mapping grants, faults.
impl DeviceMemory for Memory {
    fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), CuError> {
        self.read_at(addr, out).then_some(()).ok_or(CuError::ILLEGAL_ADDRESS)
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), CuError> {
        self.write_at(addr, data).then_some(()).ok_or(CuError::ILLEGAL_ADDRESS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_aligned_separate_and_bounded() {
        let mut m = Memory::new(1 << 20);
        let a = m.alloc(100, Owner::Alloc { ctx: 1 }, &[]).unwrap();
        let b = m.alloc(100, Owner::Alloc { ctx: 1 }, &[7, 8]).unwrap();
        assert_eq!(a % ALIGN, 0);
        assert!(b >= a + 100 + GUARD);
        let mut three = [0u8; 3];
        assert!(m.read_at(b, &mut three));
        assert_eq!(three, [7, 8, 0]);
        assert!(!m.read_at(a + 99, &mut [0; 2]));
        assert!(!m.read_at(a + 100, &mut [0; 1]));
        let mut out = [0u8; 1];
        assert_eq!(m.read(a + 100, &mut out), Err(CuError::ILLEGAL_ADDRESS));
        assert_eq!(m.used(), 200);
    }

    #[test]
    fn capacity_and_free_are_exact() {
        let mut m = Memory::new(1000);
        let a = m.alloc(600, Owner::Alloc { ctx: 1 }, &[]).unwrap();
        assert_eq!(m.alloc(600, Owner::Alloc { ctx: 1 }, &[]), Err(CuError::OUT_OF_MEMORY));
        assert_eq!(m.free(a + 1), Err(CuError::INVALID_VALUE));
        m.free(a).unwrap();
        assert_eq!(m.free(a), Err(CuError::INVALID_VALUE));
        let g = m.alloc(10, Owner::Global { module: 5 }, &[]).unwrap();
        assert_eq!(m.free(g), Err(CuError::INVALID_VALUE), "globals are not freed by cuMemFree");
        m.free_where(|o| o == Owner::Global { module: 5 });
        assert_eq!(m.used(), 0);
    }
}
