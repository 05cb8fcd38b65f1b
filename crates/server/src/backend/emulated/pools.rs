//! Memory pools on the emulated device.
//!
//! Work runs when it is issued here, so a stream-ordered free is complete
//! at once. What a pool keeps is modelled as the driver describes it: a
//! freed allocation's bytes stay reserved for the pool (taken from the
//! device's capacity) and are given back at a synchronization above the
//! release threshold, or by a trim; a later allocation reuses them first.

use std::collections::HashMap;

use gpuplex_protocol::{AccessDesc, CuError, PoolProps, ALLOCATION_PINNED, HANDLE_TYPE_POSIX_FD, LOCATION_DEVICE};

use super::memory::{Memory, Owner, PROT_READWRITE};
use super::{err, BResult, Emulated, Obj};
use crate::backend;

/// `CUmemPool_attribute`.
const REUSE_FOLLOW_EVENT_DEPENDENCIES: i32 = 1;
const REUSE_ALLOW_INTERNAL_DEPENDENCIES: i32 = 3;
const RELEASE_THRESHOLD: i32 = 4;
const RESERVED_MEM_CURRENT: i32 = 5;
const RESERVED_MEM_HIGH: i32 = 6;
const USED_MEM_CURRENT: i32 = 7;
const USED_MEM_HIGH: i32 = 8;

#[derive(Default)]
pub struct Pools {
    next: u64,
    pools: HashMap<u64, Pool>,
}

struct Pool {
    device: i32,
    /// Bytes of live allocations.
    used: u64,
    /// Freed bytes the pool keeps reserved.
    kept: u64,
    used_high: u64,
    reserved_high: u64,
    release_threshold: u64,
    /// The three reuse policies, as set.
    reuse: [u64; 3],
    /// Access granted to devices other than the pool's own.
    access: HashMap<i32, u32>,
    /// Destroyed while allocations were live: it goes with the last of them.
    destroyed: bool,
}

impl Pool {
    fn reserved(&self) -> u64 {
        self.used + self.kept
    }

    /// Gives back what it keeps beyond `target` bytes reserved.
    fn shrink_to(&mut self, memory: &mut Memory, target: u64) {
        let kept = self.kept.min(target.saturating_sub(self.used));
        memory.uncharge(self.kept - kept);
        self.kept = kept;
    }
}

impl Pools {
    pub fn create(&mut self, props: &PoolProps, devices: usize) -> BResult<Obj> {
        if props.kind != ALLOCATION_PINNED || props.location_kind != LOCATION_DEVICE {
            return Err(err(CuError::INVALID_VALUE, "the emulated device makes pools of device memory only"));
        }
        if usize::try_from(props.location).map_or(true, |d| d >= devices) {
            return Err(CuError::INVALID_DEVICE.into());
        }
        if props.handle_types & !HANDLE_TYPE_POSIX_FD != 0 {
            return Err(err(CuError::NOT_SUPPORTED, "the emulated device makes no fabric or Windows handles"));
        }
        self.next += 1;
        let pool = Pool {
            device: props.location,
            used: 0,
            kept: 0,
            used_high: 0,
            reserved_high: 0,
            release_threshold: 0,
            reuse: [1; 3],
            access: HashMap::new(),
            destroyed: false,
        };
        self.pools.insert(self.next, pool);
        Ok(Obj(self.next))
    }

    fn pool(&mut self, pool: Obj) -> BResult<&mut Pool> {
        self.pools.get_mut(&pool.0).filter(|p| !p.destroyed).ok_or_else(|| err(CuError::INVALID_VALUE, "no such pool"))
    }

    pub fn destroy(&mut self, memory: &mut Memory, pool: Obj) -> BResult<()> {
        let p = self.pool(pool)?;
        p.shrink_to(memory, 0);
        p.destroyed = true;
        if p.used == 0 {
            self.pools.remove(&pool.0);
        }
        Ok(())
    }

    pub fn alloc(&mut self, memory: &mut Memory, size: u64, pool: Obj) -> BResult<u64> {
        if size == 0 {
            return Err(err(CuError::INVALID_VALUE, "zero-byte allocation"));
        }
        let p = self.pool(pool)?;
        // Bytes the pool keeps are reused first.
        let reused = p.kept.min(size);
        memory.uncharge(reused);
        let addr = match memory.alloc(size, Owner::Pooled { pool: pool.0 }, &[]) {
            Ok(addr) => addr,
            Err(e) => {
                // Taken back: the failed allocation gave up what it charged.
                memory.recharge(reused);
                return Err(e.into());
            }
        };
        p.kept -= reused;
        p.used += size;
        p.used_high = p.used_high.max(p.used);
        p.reserved_high = p.reserved_high.max(p.reserved());
        Ok(addr)
    }

    /// Frees a pool's allocation; the pool keeps its bytes.
    pub fn free(&mut self, memory: &mut Memory, addr: u64, pool: u64) -> BResult<()> {
        let size = memory.forget(addr).ok_or(CuError::INVALID_VALUE)?;
        let p = self.pools.get_mut(&pool).expect("a pooled block's pool lives while it does");
        p.used -= size;
        if p.destroyed {
            memory.uncharge(size);
            if p.used == 0 {
                self.pools.remove(&pool);
            }
        } else {
            p.kept += size;
        }
        Ok(())
    }

    /// What a synchronization does: each pool gives back what it keeps above
    /// its release threshold.
    pub fn release(&mut self, memory: &mut Memory) {
        for p in self.pools.values_mut() {
            let threshold = p.release_threshold;
            p.shrink_to(memory, threshold);
        }
    }

    pub fn trim(&mut self, memory: &mut Memory, pool: Obj, keep: u64) -> BResult<()> {
        self.pool(pool)?.shrink_to(memory, keep);
        Ok(())
    }

    pub fn set_attribute(&mut self, pool: Obj, attr: i32, value: u64) -> BResult<()> {
        let p = self.pool(pool)?;
        match attr {
            REUSE_FOLLOW_EVENT_DEPENDENCIES..=REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                p.reuse[(attr - REUSE_FOLLOW_EVENT_DEPENDENCIES) as usize] = u64::from(value as u32 != 0)
            }
            RELEASE_THRESHOLD => p.release_threshold = value,
            RESERVED_MEM_HIGH if value == 0 => p.reserved_high = p.reserved(),
            USED_MEM_HIGH if value == 0 => p.used_high = p.used,
            _ => return Err(err(CuError::INVALID_VALUE, format!("pool attribute {attr} cannot be set to {value}"))),
        }
        Ok(())
    }

    pub fn get_attribute(&mut self, pool: Obj, attr: i32) -> BResult<u64> {
        let p = self.pool(pool)?;
        Ok(match attr {
            REUSE_FOLLOW_EVENT_DEPENDENCIES..=REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                p.reuse[(attr - REUSE_FOLLOW_EVENT_DEPENDENCIES) as usize]
            }
            RELEASE_THRESHOLD => p.release_threshold,
            RESERVED_MEM_CURRENT => p.reserved(),
            RESERVED_MEM_HIGH => p.reserved_high,
            USED_MEM_CURRENT => p.used,
            USED_MEM_HIGH => p.used_high,
            _ => return Err(err(CuError::INVALID_VALUE, format!("no pool attribute {attr}"))),
        })
    }

    pub fn set_access(&mut self, pool: Obj, access: &[AccessDesc], devices: usize) -> BResult<()> {
        let p = self.pool(pool)?;
        for a in access {
            if a.location_kind != LOCATION_DEVICE || usize::try_from(a.location).map_or(true, |d| d >= devices) {
                return Err(CuError::INVALID_DEVICE.into());
            }
            if a.location == p.device && a.flags != PROT_READWRITE {
                return Err(err(CuError::INVALID_VALUE, "a pool's own device keeps full access"));
            }
        }
        for a in access {
            p.access.insert(a.location, a.flags);
        }
        Ok(())
    }

    pub fn get_access(&mut self, pool: Obj, location_kind: u32, location: i32) -> BResult<u64> {
        let p = self.pool(pool)?;
        if location_kind != LOCATION_DEVICE {
            return Err(CuError::INVALID_VALUE.into());
        }
        if location == p.device {
            return Ok(PROT_READWRITE.into());
        }
        Ok(p.access.get(&location).copied().unwrap_or(0).into())
    }
}

impl backend::Pools for Emulated {
    fn mem_pool_create(&self, ctx: Option<Obj>, props: &PoolProps) -> BResult<Obj> {
        let s = &mut *self.state();
        ctx.map_or(Ok(()), |c| s.ctx(c).map(drop))?;
        s.pools.create(props, self.devices.len())
    }

    fn mem_pool_destroy(&self, pool: Obj) -> BResult<()> {
        let s = &mut *self.state();
        s.pools.destroy(&mut s.memory, pool)
    }

    fn mem_alloc_from_pool(&self, ctx: Obj, size: u64, pool: Obj, stream: Obj) -> BResult<u64> {
        let s = &mut *self.state();
        s.stream(ctx, stream)?;
        s.graphs.refuse(stream, CuError::STREAM_CAPTURE_UNSUPPORTED, "an allocation")?;
        s.pools.alloc(&mut s.memory, size, pool)
    }

    fn mem_free_async(&self, ctx: Obj, ptr: u64, stream: Obj) -> BResult<()> {
        let s = &mut *self.state();
        s.stream(ctx, stream)?;
        s.graphs.refuse(stream, CuError::STREAM_CAPTURE_UNSUPPORTED, "a free")?;
        match s.memory.owner(ptr) {
            Some(Owner::Pooled { pool }) => s.pools.free(&mut s.memory, ptr, pool),
            _ => Ok(s.memory.free(ptr)?),
        }
    }

    fn mem_pool_trim(&self, pool: Obj, keep: u64) -> BResult<()> {
        let s = &mut *self.state();
        s.pools.trim(&mut s.memory, pool, keep)
    }

    fn mem_pool_set_attribute(&self, pool: Obj, attr: i32, value: u64) -> BResult<()> {
        self.state().pools.set_attribute(pool, attr, value)
    }

    fn mem_pool_get_attribute(&self, pool: Obj, attr: i32) -> BResult<u64> {
        self.state().pools.get_attribute(pool, attr)
    }

    fn mem_pool_set_access(&self, pool: Obj, access: &[AccessDesc]) -> BResult<()> {
        self.state().pools.set_access(pool, access, self.devices.len())
    }

    fn mem_pool_get_access(&self, pool: Obj, location_kind: u32, location: i32) -> BResult<u64> {
        self.state().pools.get_access(pool, location_kind, location)
    }
}
