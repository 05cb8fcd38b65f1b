//! Virtual memory management on the emulated device.
//!
//! A reservation is an address range taken like an allocation's, with no
//! block in it. A physical allocation's bytes live here while it is
//! unmapped and move into a memory block at its address while mapped, so
//! they survive an unmap and a map elsewhere. The test device maps an
//! allocation whole and at one place at a time (it does not alias memory);
//! anything else is refused with `CUDA_ERROR_NOT_SUPPORTED`, not pretended.

use std::collections::{BTreeMap, HashMap};

use gpuplex_protocol::{AccessDesc, AllocProp, CuError, ALLOCATION_PINNED, HANDLE_TYPE_POSIX_FD, LOCATION_DEVICE};

use super::memory::{self, Memory, Owner, PROT_READ, PROT_READWRITE};
use super::{err, BResult, Emulated, Obj};
use crate::backend::VirtualMemory;

/// The granularity of sizes and reservations, minimum and recommended
/// alike, as on the GPUs gpuplex serves.
pub const GRANULARITY: u64 = 2 << 20;

#[derive(Default)]
pub struct Vmm {
    next: u64,
    physical: HashMap<u64, Physical>,
    /// Reserved ranges: base to size.
    reserved: BTreeMap<u64, u64>,
}

struct Physical {
    size: u64,
    /// References the guest holds (creation and retains); at 0 and unmapped it is freed.
    refs: u32,
    /// Its bytes while unmapped; None while mapped (they are in the block).
    data: Option<Vec<u8>>,
}

fn check_prop(prop: &AllocProp, devices: usize) -> BResult<()> {
    if prop.kind != ALLOCATION_PINNED || prop.location_kind != LOCATION_DEVICE {
        return Err(err(CuError::INVALID_VALUE, "the emulated device makes pinned device allocations only"));
    }
    if usize::try_from(prop.location).map_or(true, |d| d >= devices) {
        return Err(CuError::INVALID_DEVICE.into());
    }
    if prop.handle_types & !HANDLE_TYPE_POSIX_FD != 0 {
        return Err(err(CuError::NOT_SUPPORTED, "the emulated device makes no fabric or Windows handles"));
    }
    Ok(())
}

/// Sizes and alignments are whole granules.
fn granules(size: u64) -> BResult<()> {
    if size == 0 || size % GRANULARITY != 0 {
        return Err(err(CuError::INVALID_VALUE, format!("{size} bytes is not a multiple of {GRANULARITY}")));
    }
    Ok(())
}

impl Vmm {
    pub fn granularity(&self, prop: &AllocProp, option: u32, devices: usize) -> BResult<u64> {
        check_prop(prop, devices)?;
        match option {
            0 | 1 => Ok(GRANULARITY),
            _ => Err(CuError::INVALID_VALUE.into()),
        }
    }

    pub fn create(
        &mut self,
        mem: &mut Memory,
        size: u64,
        prop: &AllocProp,
        flags: u64,
        devices: usize,
    ) -> BResult<Obj> {
        check_prop(prop, devices)?;
        granules(size)?;
        if flags != 0 {
            return Err(CuError::INVALID_VALUE.into());
        }
        mem.charge(size)?;
        let data = memory::zeroed(size).inspect_err(|_| mem.uncharge(size))?;
        self.next += 1;
        self.physical.insert(self.next, Physical { size, refs: 1, data: Some(data) });
        Ok(Obj(self.next))
    }

    pub fn release(&mut self, mem: &mut Memory, handle: Obj) -> BResult<()> {
        let p = self.physical.get_mut(&handle.0).filter(|p| p.refs > 0).ok_or(CuError::INVALID_VALUE)?;
        p.refs -= 1;
        self.free_if_done(mem, handle.0);
        Ok(())
    }

    fn free_if_done(&mut self, mem: &mut Memory, handle: u64) {
        if let Some(p) = self.physical.get(&handle).filter(|p| p.refs == 0 && p.data.is_some()) {
            mem.uncharge(p.size);
            self.physical.remove(&handle);
        }
    }

    /// The mapped allocation holding `ptr`.
    fn mapped_at(mem: &Memory, ptr: u64) -> BResult<(u64, u64)> {
        match mem.covering(ptr, 1).as_deref() {
            Some([(base, block)]) => match block.owner {
                Owner::Mapped { handle } => Ok((*base, handle)),
                _ => Err(CuError::INVALID_VALUE.into()),
            },
            _ => Err(CuError::INVALID_VALUE.into()),
        }
    }

    pub fn retain(&mut self, mem: &Memory, ptr: u64) -> BResult<Obj> {
        let (_, handle) = Self::mapped_at(mem, ptr)?;
        self.physical.get_mut(&handle).expect("a mapped block's allocation").refs += 1;
        Ok(Obj(handle))
    }

    pub fn address_reserve(&mut self, mem: &mut Memory, size: u64, alignment: u64, flags: u64) -> BResult<u64> {
        granules(size)?;
        if flags != 0 || (alignment != 0 && !alignment.is_power_of_two()) {
            return Err(CuError::INVALID_VALUE.into());
        }
        let base = mem.reserve(size, alignment.max(GRANULARITY)).ok_or(CuError::OUT_OF_MEMORY)?;
        self.reserved.insert(base, size);
        Ok(base)
    }

    pub fn address_free(&mut self, mem: &Memory, ptr: u64, size: u64) -> BResult<()> {
        if self.reserved.get(&ptr) != Some(&size) {
            return Err(err(CuError::INVALID_VALUE, "not a reserved range"));
        }
        if mem.any_in(ptr, ptr + size) {
            return Err(err(CuError::INVALID_VALUE, "the range still has mappings"));
        }
        self.reserved.remove(&ptr);
        Ok(())
    }

    pub fn map(&mut self, mem: &mut Memory, ptr: u64, size: u64, offset: u64, handle: Obj, flags: u64) -> BResult<()> {
        let p = self.physical.get_mut(&handle.0).filter(|p| p.refs > 0).ok_or(CuError::INVALID_VALUE)?;
        if flags != 0 || size == 0 {
            return Err(CuError::INVALID_VALUE.into());
        }
        if offset != 0 || size != p.size || p.data.is_none() {
            return Err(err(CuError::NOT_SUPPORTED, "the emulated device maps an allocation whole, at one place"));
        }
        let end = ptr.checked_add(size).ok_or(CuError::INVALID_VALUE)?;
        let reserved = self.reserved.range(..=ptr).next_back().is_some_and(|(&b, &s)| end <= b + s);
        if !reserved || mem.any_in(ptr, end) || ptr % GRANULARITY != 0 {
            return Err(err(CuError::INVALID_VALUE, "not a free, aligned part of a reserved range"));
        }
        mem.map(ptr, p.data.take().expect("checked"), handle.0);
        Ok(())
    }

    /// The mapped blocks that make up exactly `[ptr, ptr + size)`, as `(base, handle)`.
    fn mappings(mem: &Memory, ptr: u64, size: u64) -> BResult<Vec<(u64, u64)>> {
        let blocks = mem.covering(ptr, size).ok_or(CuError::INVALID_VALUE)?;
        let whole = blocks.first().is_some_and(|&(b, _)| b == ptr);
        let mapped: Option<Vec<(u64, u64)>> = blocks
            .iter()
            .map(|&(base, block)| match block.owner {
                Owner::Mapped { handle } => Some((base, handle)),
                _ => None,
            })
            .collect();
        match mapped {
            Some(m) if whole => Ok(m),
            _ => Err(err(CuError::INVALID_VALUE, "not whole mappings")),
        }
    }

    pub fn unmap(&mut self, mem: &mut Memory, ptr: u64, size: u64) -> BResult<()> {
        let mappings = Self::mappings(mem, ptr, size)?;
        let ends_whole = mappings.last().map(|&(base, handle)| base + self.physical[&handle].size) == Some(ptr + size);
        if !ends_whole {
            return Err(err(CuError::INVALID_VALUE, "not whole mappings"));
        }
        for (base, handle) in mappings {
            let data = mem.unmap(base).expect("a mapped block");
            self.physical.get_mut(&handle).expect("a mapped block's allocation").data = Some(data);
            self.free_if_done(mem, handle);
        }
        Ok(())
    }

    pub fn set_access(
        &self,
        mem: &mut Memory,
        ptr: u64,
        size: u64,
        access: &[AccessDesc],
        devices: usize,
    ) -> BResult<()> {
        let mappings = Self::mappings(mem, ptr, size)?;
        let mut flags = None;
        for a in access {
            if a.location_kind != LOCATION_DEVICE || usize::try_from(a.location).map_or(true, |d| d >= devices) {
                return Err(CuError::INVALID_DEVICE.into());
            }
            if ![0, PROT_READ, PROT_READWRITE].contains(&a.flags) {
                return Err(CuError::INVALID_VALUE.into());
            }
            flags = Some(a.flags);
        }
        let flags = flags.ok_or(CuError::INVALID_VALUE)?;
        for (base, _) in mappings {
            mem.set_access(base, flags);
        }
        Ok(())
    }

    pub fn get_access(
        &self,
        mem: &Memory,
        location_kind: u32,
        location: i32,
        ptr: u64,
        devices: usize,
    ) -> BResult<u64> {
        if location_kind != LOCATION_DEVICE || usize::try_from(location).map_or(true, |d| d >= devices) {
            return Err(CuError::INVALID_DEVICE.into());
        }
        let (base, _) = Self::mapped_at(mem, ptr)?;
        Ok(mem.access(base).into())
    }
}

impl VirtualMemory for Emulated {
    fn mem_granularity(&self, ctx: Option<Obj>, prop: &AllocProp, option: u32) -> BResult<u64> {
        let mut s = self.state();
        ctx.map_or(Ok(()), |c| s.ctx(c).map(drop))?;
        s.vmm.granularity(prop, option, self.devices.len())
    }

    fn mem_create(&self, ctx: Option<Obj>, size: u64, prop: &AllocProp, flags: u64) -> BResult<Obj> {
        let s = &mut *self.state();
        ctx.map_or(Ok(()), |c| s.ctx(c).map(drop))?;
        s.vmm.create(&mut s.memory, size, prop, flags, self.devices.len())
    }

    fn mem_release(&self, handle: Obj) -> BResult<()> {
        let s = &mut *self.state();
        s.vmm.release(&mut s.memory, handle)
    }

    fn mem_retain(&self, ptr: u64) -> BResult<Obj> {
        let s = &mut *self.state();
        s.vmm.retain(&s.memory, ptr)
    }

    fn mem_address_reserve(&self, ctx: Option<Obj>, size: u64, alignment: u64, _addr: u64, flags: u64) -> BResult<u64> {
        let s = &mut *self.state();
        ctx.map_or(Ok(()), |c| s.ctx(c).map(drop))?;
        s.vmm.address_reserve(&mut s.memory, size, alignment, flags)
    }

    fn mem_address_free(&self, ptr: u64, size: u64) -> BResult<()> {
        let s = &mut *self.state();
        s.vmm.address_free(&s.memory, ptr, size)
    }

    fn mem_map(&self, ptr: u64, size: u64, offset: u64, handle: Obj, flags: u64) -> BResult<()> {
        let s = &mut *self.state();
        s.vmm.map(&mut s.memory, ptr, size, offset, handle, flags)
    }

    fn mem_unmap(&self, ptr: u64, size: u64) -> BResult<()> {
        let s = &mut *self.state();
        s.vmm.unmap(&mut s.memory, ptr, size)
    }

    fn mem_set_access(&self, ptr: u64, size: u64, access: &[AccessDesc]) -> BResult<()> {
        let s = &mut *self.state();
        s.vmm.set_access(&mut s.memory, ptr, size, access, self.devices.len())
    }

    fn mem_get_access(&self, location_kind: u32, location: i32, ptr: u64) -> BResult<u64> {
        let s = &*self.state();
        s.vmm.get_access(&s.memory, location_kind, location, ptr, self.devices.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::emulated::kernels::DeviceMemory;

    fn prop() -> AllocProp {
        AllocProp::pinned(0)
    }

    fn access(flags: u32) -> [AccessDesc; 1] {
        [AccessDesc { location_kind: LOCATION_DEVICE, location: 0, flags }]
    }

    #[test]
    fn a_mapping_is_reached_only_as_its_access_allows() {
        let (mut vmm, mut mem) = (Vmm::default(), Memory::new(64 << 20));
        let h = vmm.create(&mut mem, GRANULARITY, &prop(), 0, 1).unwrap();
        let base = vmm.address_reserve(&mut mem, 2 * GRANULARITY, 0, 0).unwrap();
        vmm.map(&mut mem, base, GRANULARITY, 0, h, 0).unwrap();
        let mut byte = [0u8; 1];
        assert_eq!(mem.read(base, &mut byte), Err(CuError::ILLEGAL_ADDRESS), "no access granted yet");
        vmm.set_access(&mut mem, base, GRANULARITY, &access(PROT_READ), 1).unwrap();
        assert!(mem.read(base, &mut byte).is_ok());
        assert_eq!(mem.write(base, &[1]), Err(CuError::ILLEGAL_ADDRESS), "read-only");
        vmm.set_access(&mut mem, base, GRANULARITY, &access(PROT_READWRITE), 1).unwrap();
        assert_eq!(vmm.get_access(&mem, LOCATION_DEVICE, 0, base + 5, 1).unwrap(), 3);
        mem.write(base + 7, &[42]).unwrap();
        assert_eq!(mem.read(base + GRANULARITY, &mut byte), Err(CuError::ILLEGAL_ADDRESS), "reserved, not mapped");
    }

    #[test]
    fn bytes_survive_an_unmap_and_a_map_elsewhere_and_are_freed_last() {
        let (mut vmm, mut mem) = (Vmm::default(), Memory::new(64 << 20));
        let h = vmm.create(&mut mem, GRANULARITY, &prop(), 0, 1).unwrap();
        assert_eq!(mem.used(), GRANULARITY);
        let base = vmm.address_reserve(&mut mem, 4 * GRANULARITY, 0, 0).unwrap();
        vmm.map(&mut mem, base, GRANULARITY, 0, h, 0).unwrap();
        vmm.set_access(&mut mem, base, GRANULARITY, &access(PROT_READWRITE), 1).unwrap();
        mem.write(base + 100, &[9, 8, 7]).unwrap();
        assert_eq!(
            vmm.map(&mut mem, base + GRANULARITY, GRANULARITY, 0, h, 0).unwrap_err().code,
            CuError::NOT_SUPPORTED
        );
        vmm.unmap(&mut mem, base, GRANULARITY).unwrap();
        vmm.map(&mut mem, base + 2 * GRANULARITY, GRANULARITY, 0, h, 0).unwrap();
        vmm.set_access(&mut mem, base + 2 * GRANULARITY, GRANULARITY, &access(PROT_READ), 1).unwrap();
        let mut three = [0u8; 3];
        mem.read(base + 2 * GRANULARITY + 100, &mut three).unwrap();
        assert_eq!(three, [9, 8, 7]);
        vmm.release(&mut mem, h).unwrap();
        assert_eq!(mem.used(), GRANULARITY, "still mapped");
        assert_eq!(vmm.address_free(&mem, base, 4 * GRANULARITY).unwrap_err().code, CuError::INVALID_VALUE);
        vmm.unmap(&mut mem, base + 2 * GRANULARITY, GRANULARITY).unwrap();
        assert_eq!(mem.used(), 0);
        vmm.address_free(&mem, base, 4 * GRANULARITY).unwrap();
    }

    #[test]
    fn sizes_that_are_not_granules_and_an_address_space_used_up_are_refused() {
        let (mut vmm, mut mem) = (Vmm::default(), Memory::new(64 << 20));
        assert_eq!(vmm.create(&mut mem, GRANULARITY + 1, &prop(), 0, 1).unwrap_err().code, CuError::INVALID_VALUE);
        assert_eq!(vmm.create(&mut mem, 128 << 20, &prop(), 0, 1).unwrap_err().code, CuError::OUT_OF_MEMORY);
        let most = u64::MAX / GRANULARITY / 2 * GRANULARITY;
        vmm.address_reserve(&mut mem, most, 0, 0).unwrap();
        assert_eq!(vmm.address_reserve(&mut mem, most, 0, 0).unwrap_err().code, CuError::OUT_OF_MEMORY);
        assert_eq!(mem.used(), 0);
    }
}
