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
}

pub struct Block {
    data: Storage,
    pub owner: Owner,
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
        if size == 0 || size > self.capacity - self.used {
            return Err(CuError::OUT_OF_MEMORY);
        }
        let mut data = Vec::new();
        data.try_reserve_exact(size as usize).map_err(|_| CuError::OUT_OF_MEMORY)?;
        // Zeroed by doubling copies: `resize` writes a byte at a time in the
        // unoptimized server the end-to-end tests run (3.5 s for 512 MiB).
        data.push(0);
        while data.len() < size as usize {
            data.extend_from_within(..data.len().min(size as usize - data.len()));
        }
        let n = init.len().min(data.len());
        data[..n].copy_from_slice(&init[..n]);
        let addr = self.next;
        self.next = (addr + size + GUARD).next_multiple_of(ALIGN);
        self.used += size;
        self.blocks.insert(addr, Block { data: Storage::Owned(data), owner });
        Ok(addr)
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
        self.blocks.insert(addr, Block { data: Storage::Host { ptr, len }, owner: Owner::Host { ctx } });
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

    fn locate(&self, addr: u64, len: u64) -> Option<(u64, usize)> {
        let (&base, block) = self.blocks.range(..=addr).next_back()?;
        let offset = addr - base;
        (offset.checked_add(len)? <= block.data.len() as u64).then_some((base, offset as usize))
    }

    pub fn slice(&self, addr: u64, len: u64) -> Option<&[u8]> {
        let (base, off) = self.locate(addr, len)?;
        Some(&self.blocks[&base].data.bytes()[off..off + len as usize])
    }

    pub fn slice_mut(&mut self, addr: u64, len: u64) -> Option<&mut [u8]> {
        let (base, off) = self.locate(addr, len)?;
        let block = self.blocks.get_mut(&base)?;
        Some(&mut block.data.bytes_mut()[off..off + len as usize])
    }
}

/// What reference kernels see: any access outside a live block faults.
impl DeviceMemory for Memory {
    fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), CuError> {
        out.copy_from_slice(self.slice(addr, out.len() as u64).ok_or(CuError::ILLEGAL_ADDRESS)?);
        Ok(())
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), CuError> {
        self.slice_mut(addr, data.len() as u64).ok_or(CuError::ILLEGAL_ADDRESS)?.copy_from_slice(data);
        Ok(())
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
        assert_eq!(m.slice(b, 3).unwrap(), &[7, 8, 0]);
        assert!(m.slice(a + 99, 2).is_none());
        assert!(m.slice(a + 100, 1).is_none());
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
