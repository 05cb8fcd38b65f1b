//! A session's view of its objects: which handles it was issued, what each
//! one is on the backend, who owns it, and which device ranges it may touch.
//!
//! Handles are numbers from one counter, unique across object kinds and
//! never reused within a session, so a stale or forged handle can only miss.
//! Ownership is recorded so that destroying a context, unloading a module or
//! a library drops every handle that died with it.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use gpuplex_protocol::{CallError, CuError, FIRST_HANDLE};

use super::arrays::Samplers;
use super::pools::Pools;
use super::vmm::Vmm;
use crate::backend::Obj;

/// A map keyed by handles and other small integers, hashed cheaply: every
/// call looks up several handles, and SipHash was about a quarter of the
/// session's own cost per kernel launch. The server issues the handles, so a
/// client cannot pile keys into one bucket; maps it keys itself
/// (per-thread streams) are bounded.
pub type HandleMap<K, V> = HashMap<K, V, BuildHasherDefault<HandleHasher>>;

/// Multiplies each word in and folds the 128-bit product, so that handles,
/// which step by 16, still spread over the low bits the table indexes with.
#[derive(Default)]
pub struct HandleHasher(u64);

impl Hasher for HandleHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.write_u64(n.into());
    }

    fn write_u64(&mut self, n: u64) {
        let product = u128::from(self.0 ^ n) * 0x9e37_79b9_7f4a_7c15;
        self.0 = (product as u64) ^ ((product >> 64) as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CtxEntry {
    /// None for a primary context that is not active (released or reset).
    pub obj: Option<Obj>,
    pub device: i32,
    pub primary: bool,
}

/// What an object belongs to, for cascading teardown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    Ctx(u64),
    Module(u64),
    Library(u64),
    Kernel(u64),
    /// Pinned host memory shared with the client, mapped for the device.
    HostBlock(u64),
    /// A physical allocation mapped into a reserved range (`vmm.rs`).
    Mapping(u64),
    /// A node's graph.
    Graph(u64),
    /// A conditional node's body graphs are the node's.
    Node(u64),
    /// The pool a stream-ordered allocation came from (`pools.rs`).
    Pool(u64),
    /// A mipmapped array's levels are its.
    Mipmap(u64),
    /// Memory another session of the tenant shared, opened from its IPC
    /// handle (a region's owner only).
    Ipc,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub obj: Obj,
    /// The context the object lives in (0 for context-free objects).
    pub ctx: u64,
    pub owner: Owner,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Module,
    Func,
    Stream,
    Event,
    Library,
    Kernel,
    /// Graphs belong to no context (their entries name context 0);
    /// executable graphs belong to the context they were instantiated in.
    Graph,
    GraphExec,
    GraphNode,
    Array,
    Mipmap,
}

/// A device range the session may read and write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    pub size: u64,
    pub ctx: u64,
    /// `None` for a `cuMemAlloc` allocation, else the module or library
    /// whose global it is, or the host block.
    pub owner: Option<Owner>,
}

/// The error for a handle that is not one of `kind`.
pub fn unknown(kind: Kind, h: u64) -> CallError {
    CallError::new(CuError::INVALID_HANDLE, format!("unknown {kind:?} handle {h:#x}"))
}

/// The bytes a region counts as allocated: `cuMemAlloc`'s, not globals' or
/// host blocks'.
fn allocation_bytes(region: Option<Region>) -> u64 {
    region.filter(|r| r.owner.is_none()).map_or(0, |r| r.size)
}

#[derive(Default)]
pub struct Tables {
    next: u64,
    pub contexts: HandleMap<u64, CtxEntry>,
    objects: HandleMap<u64, (Kind, Entry)>,
    /// Reverse map so that asking twice for the same function, kernel or
    /// module yields the same handle, as the real driver does.
    issued: HandleMap<(u8, u64, u64), u64>,
    regions: BTreeMap<u64, Region>,
    /// Bytes of `cuMemAlloc` regions, kept up to date: every call reports it.
    allocated: u64,
    /// Device memory each loaded module or library takes (its code and
    /// globals), by handle, as charged to the tenant.
    footprints: HandleMap<u64, u64>,
    /// The sum of `footprints`.
    footprint: u64,
    /// Reserved ranges, physical allocations and their mappings.
    pub vmm: Vmm,
    /// Memory pools and their allocations.
    pub pools: Pools,
    /// Texture and surface objects.
    pub samplers: Samplers,
}

impl Tables {
    pub fn new() -> Tables {
        Tables { next: FIRST_HANDLE, ..Tables::default() }
    }

    /// A new handle, of any kind.
    pub fn issue(&mut self) -> u64 {
        let h = self.next;
        // Step by 16 so handles look like aligned pointers to C code that
        // checks them that way.
        self.next += 16;
        h
    }

    pub fn add_ctx(&mut self, entry: CtxEntry) -> u64 {
        let h = self.issue();
        self.contexts.insert(h, entry);
        h
    }

    pub fn ctx(&self, h: u64) -> Result<CtxEntry, CallError> {
        self.contexts
            .get(&h)
            .copied()
            .ok_or_else(|| CallError::new(CuError::INVALID_CONTEXT, format!("unknown context {h:#x}")))
    }

    /// Adds an object, or returns the handle already issued for the same
    /// backend object in the same context.
    pub fn add(&mut self, kind: Kind, entry: Entry) -> u64 {
        let key = (kind as u8, entry.ctx, entry.obj.0);
        if let Some(&h) = self.issued.get(&key) {
            if self.objects.contains_key(&h) {
                return h;
            }
        }
        let h = self.issue();
        self.objects.insert(h, (kind, entry));
        self.issued.insert(key, h);
        h
    }

    /// The handle issued for a backend object, if one is live.
    pub fn issued(&self, kind: Kind, ctx: u64, obj: Obj) -> Option<u64> {
        self.issued.get(&(kind as u8, ctx, obj.0)).copied().filter(|h| self.objects.contains_key(h))
    }

    /// The live handle of a backend object, in whichever context it was
    /// issued.
    pub fn handle_of(&self, kind: Kind, obj: Obj) -> Option<u64> {
        self.objects.iter().find(|(_, (k, e))| *k == kind && e.obj == obj).map(|(h, _)| *h)
    }

    pub fn get(&self, kind: Kind, h: u64) -> Result<Entry, CallError> {
        match self.objects.get(&h) {
            Some((k, e)) if *k == kind => Ok(*e),
            _ => Err(unknown(kind, h)),
        }
    }

    /// A known handle's kind and entry, whatever its kind.
    pub fn lookup(&self, h: u64) -> Option<(Kind, Entry)> {
        self.objects.get(&h).copied()
    }

    pub fn remove(&mut self, kind: Kind, h: u64) -> Result<Entry, CallError> {
        let entry = self.get(kind, h)?;
        self.objects.remove(&h);
        if let Some(bytes) = self.footprints.remove(&h) {
            self.footprint -= bytes;
        }
        self.issued.remove(&(kind as u8, entry.ctx, entry.obj.0));
        self.drop_owned_by(match kind {
            Kind::Module => Owner::Module(h),
            Kind::Library => Owner::Library(h),
            Kind::Kernel => Owner::Kernel(h),
            Kind::Graph => Owner::Graph(h),
            Kind::GraphNode => Owner::Node(h),
            Kind::Mipmap => Owner::Mipmap(h),
            Kind::Func | Kind::Stream | Kind::Event | Kind::GraphExec | Kind::Array => return Ok(entry),
        });
        Ok(entry)
    }

    /// Forgets everything that lived in context `ctx` (the backend frees it
    /// with the context), keeping the context entry itself.
    pub fn drop_context_contents(&mut self, ctx: u64) {
        let dead: Vec<(u64, Kind)> =
            self.objects.iter().filter(|(_, (_, e))| e.ctx == ctx).map(|(h, (k, _))| (*h, *k)).collect();
        for (h, kind) in dead {
            // Cascades to functions of dead modules and so on.
            let _ = self.remove(kind, h);
        }
        self.regions.retain(|_, r| r.ctx != ctx);
        self.samplers.context_gone(ctx);
        self.recount();
    }

    /// All live objects of one kind, for teardown.
    pub fn all(&self, kind: Kind) -> Vec<(u64, Entry)> {
        self.objects.iter().filter(|(_, (k, _))| *k == kind).map(|(h, (_, e))| (*h, *e)).collect()
    }

    fn drop_owned_by(&mut self, owner: Owner) {
        let dead: Vec<(u64, Kind)> =
            self.objects.iter().filter(|(_, (_, e))| e.owner == owner).map(|(h, (k, _))| (*h, *k)).collect();
        for (h, kind) in dead {
            let _ = self.remove(kind, h);
        }
        self.regions.retain(|_, r| r.owner != Some(owner));
        self.recount();
    }

    fn recount(&mut self) {
        self.allocated = self.regions.values().copied().map(Some).map(allocation_bytes).sum();
    }

    pub fn add_region(&mut self, base: u64, region: Region) {
        let replaced = self.regions.insert(base, region);
        self.allocated = self.allocated + allocation_bytes(Some(region)) - allocation_bytes(replaced);
    }

    /// The region starting exactly at `base`.
    pub fn region_at(&self, base: u64) -> Option<Region> {
        self.regions.get(&base).copied()
    }

    pub fn remove_region(&mut self, base: u64) {
        let removed = self.regions.remove(&base);
        self.allocated -= allocation_bytes(removed);
    }

    /// The regions `owner` holds, as `(base, region)`.
    pub fn regions_owned_by(&self, owner: Owner) -> Vec<(u64, Region)> {
        self.regions.iter().filter(|(_, r)| r.owner == Some(owner)).map(|(&b, &r)| (b, r)).collect()
    }

    /// The region holding `ptr`, as `(base, region)`.
    pub fn region_containing(&self, ptr: u64) -> Option<(u64, Region)> {
        let (&base, &r) = self.regions.range(..=ptr).next_back()?;
        (ptr - base < r.size).then_some((base, r))
    }

    /// Checks that `[ptr, ptr + len)` lies inside one region of the session.
    /// This is what keeps a session's copies away from memory it does not
    /// own, even though device addresses are real. An empty range must still
    /// start inside one: whether the driver looks at the pointer of a call
    /// that moves no bytes is not documented, so such a pointer is held to
    /// the rule for one byte (and the call is answered without the driver).
    ///
    /// Mappings of virtual memory count as one where they follow each other
    /// with no gap, as a pool that grows maps them.
    pub fn check_range(&self, ptr: u64, len: u64) -> Result<(), CallError> {
        let fail =
            || CallError::new(CuError::INVALID_VALUE, format!("{len} bytes at {ptr:#x} are not inside one allocation"));
        let (base, r) = self.region_containing(ptr).ok_or_else(fail)?;
        let end = ptr.checked_add(len).ok_or_else(fail)?;
        let mapping = |r: &Region| matches!(r.owner, Some(Owner::Mapping(_)));
        let mut reached = base + r.size;
        if end > reached && mapping(&r) {
            for (&next, r) in self.regions.range(reached..end) {
                if next != reached || !mapping(r) {
                    break;
                }
                reached = next + r.size;
            }
        }
        if end > reached {
            return Err(fail());
        }
        Ok(())
    }

    /// Bytes held by `cuMemAlloc` allocations.
    pub fn allocated_bytes(&self) -> u64 {
        self.allocated
    }

    /// Records what a module or library just added takes on the device.
    pub fn set_footprint(&mut self, h: u64, bytes: u64) {
        if let Some(old) = self.footprints.insert(h, bytes) {
            self.footprint -= old;
        }
        self.footprint += bytes;
    }

    /// Device memory the session holds: its allocations, what its modules
    /// and libraries take, its physical allocations and its pools.
    pub fn charged_bytes(&self) -> u64 {
        self.allocated + self.footprint + self.vmm.held_bytes() + self.pools.held_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(obj: u64, ctx: u64, owner: Owner) -> Entry {
        Entry { obj: Obj(obj), ctx, owner }
    }

    #[test]
    fn handles_spread_over_the_low_bits() {
        use std::collections::HashSet;
        use std::hash::BuildHasher;
        // Handles step by 16; a table indexes with the hash's low bits.
        let build = BuildHasherDefault::<HandleHasher>::default();
        let buckets: HashSet<u64> = (0..1024u64).map(|i| build.hash_one(FIRST_HANDLE + 16 * i) & 1023).collect();
        assert!(buckets.len() > 600, "1024 handles fell into only {} of 1024 buckets", buckets.len());
    }

    #[test]
    fn handles_are_typed_unique_and_deduplicated() {
        let mut t = Tables::new();
        let c = t.add_ctx(CtxEntry { obj: Some(Obj(1)), device: 0, primary: false });
        let m = t.add(Kind::Module, entry(10, c, Owner::Ctx(c)));
        let f = t.add(Kind::Func, entry(11, c, Owner::Module(m)));
        assert_eq!(t.add(Kind::Func, entry(11, c, Owner::Module(m))), f);
        assert_ne!(m, f);
        assert!(t.get(Kind::Stream, f).is_err());
        assert_eq!(t.get(Kind::Func, f).unwrap().obj, Obj(11));
        assert_eq!(t.get(Kind::Func, 0xdead).unwrap_err().code, CuError::INVALID_HANDLE);
        assert_eq!(t.ctx(0).unwrap_err().code, CuError::INVALID_CONTEXT);
    }

    #[test]
    fn unloading_a_module_drops_its_functions_and_globals() {
        let mut t = Tables::new();
        let c = t.add_ctx(CtxEntry { obj: Some(Obj(1)), device: 0, primary: false });
        let m = t.add(Kind::Module, entry(10, c, Owner::Ctx(c)));
        let f = t.add(Kind::Func, entry(11, c, Owner::Module(m)));
        t.add_region(0x5000, Region { size: 64, ctx: c, owner: Some(Owner::Module(m)) });
        t.add_region(0x9000, Region { size: 64, ctx: c, owner: None });
        t.remove(Kind::Module, m).unwrap();
        assert!(t.get(Kind::Func, f).is_err());
        assert!(t.check_range(0x5000, 1).is_err());
        assert!(t.check_range(0x9000, 64).is_ok());
    }

    #[test]
    fn destroying_a_context_drops_everything_in_it() {
        let mut t = Tables::new();
        let c = t.add_ctx(CtxEntry { obj: Some(Obj(1)), device: 0, primary: false });
        let d = t.add_ctx(CtxEntry { obj: Some(Obj(2)), device: 0, primary: false });
        let s = t.add(Kind::Stream, entry(20, c, Owner::Ctx(c)));
        let s2 = t.add(Kind::Stream, entry(21, d, Owner::Ctx(d)));
        t.add_region(0x9000, Region { size: 64, ctx: c, owner: None });
        t.add_region(0xa000, Region { size: 32, ctx: d, owner: None });
        t.add_region(0xb000, Region { size: 16, ctx: d, owner: Some(Owner::Module(s2)) });
        assert_eq!(t.allocated_bytes(), 96, "globals are not allocations");
        t.drop_context_contents(c);
        assert!(t.get(Kind::Stream, s).is_err());
        assert!(t.get(Kind::Stream, s2).is_ok());
        assert_eq!(t.allocated_bytes(), 32);
        t.add_region(0xa000, Region { size: 48, ctx: d, owner: None });
        assert_eq!(t.allocated_bytes(), 48, "a region replaced at its base counts once");
        t.remove_region(0xa000);
        assert_eq!(t.allocated_bytes(), 0);
    }

    #[test]
    fn ranges_must_fit_one_region() {
        let mut t = Tables::new();
        t.add_region(0x1000, Region { size: 0x100, ctx: 1, owner: None });
        t.add_region(0x1100, Region { size: 0x100, ctx: 1, owner: None });
        assert!(t.check_range(0x1000, 0x100).is_ok());
        assert!(t.check_range(0x10ff, 1).is_ok());
        assert!(t.check_range(0x10ff, 2).is_err(), "spans two allocations");
        assert!(t.check_range(0xfff, 1).is_err());
        assert!(t.check_range(0x1200, 1).is_err());
        assert!(t.check_range(u64::MAX, 2).is_err());
        assert!(t.check_range(0x1000, u64::MAX).is_err());
        assert!(t.check_range(0x1080, 0).is_ok(), "empty, inside an allocation");
        assert!(t.check_range(0x5000, 0).is_err(), "empty, yet outside every allocation");
        assert!(t.check_range(0x1200, 0).is_err(), "empty, one past the end");
        assert!(t.check_range(0, 0).is_err(), "empty at NULL");
        assert_eq!(t.region_containing(0x1150).unwrap().0, 0x1100);
    }
}
