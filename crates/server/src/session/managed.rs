//! `__managed__` variables of a guest on shared memory.
//!
//! The driver places a library's managed variables in managed memory of
//! this process, and its kernels reach them there; the guest's program
//! reaches them at the same address. So the pages a variable lies in are
//! mirrored: a shared block the guest maps at those very pages, which this
//! process maps anywhere (a memfd, or for a VM guest chunks of its region's
//! heap, claimed here for it). The program reads and writes the mirror; the
//! variable is brought up to date from it before every call that reaches
//! the device (rows marked `device` in the API table), and the mirror from
//! the variable after every such call the guest waited for. That is the
//! coherence the driver promises a program that does not touch managed
//! memory while a kernel may be using it; a program that polls a variable a
//! running kernel writes sees it change only at its next waited call.
//!
//! Each variable keeps the bytes both sides last agreed on, so only what a
//! side changed since crosses, byte by byte: a program's write is never
//! lost to a device write elsewhere in the variable, nor the other way.

use std::os::fd::OwnedFd;

use gpuplex_protocol::{CallError, CuError};
use gpuplex_transport::shm::{differing_runs, take_changes, Region};
use gpuplex_transport::vm::Heap;
use tracing::warn;

use crate::backend::Backend;

const PAGE: u64 = 4096;
/// Bytes of managed variables one session may mirror.
const BUDGET: u64 = 1 << 30;

#[derive(Default)]
pub struct ManagedVars {
    mirrors: Vec<Mirror>,
    vars: Vec<Var>,
    bytes: u64,
}

/// Pages of managed memory shared with the guest at their own address.
struct Mirror {
    at: u64,
    region: Region,
}

/// The part of a variable that lies in one mirror.
struct Var {
    library: u64,
    dptr: u64,
    /// Where the bytes at `dptr` are in this process's mapping of the mirror.
    here: *mut u8,
    /// What the variable and the mirror held when they last agreed.
    agreed: Vec<u8>,
}

// SAFETY: `here` points into a mirror this struct's owner keeps mapped.
unsafe impl Send for Var {}

/// New pages for the guest to map: `len` bytes at `at`, and how it reaches
/// them.
pub struct NewPages {
    pub at: u64,
    pub len: u64,
    pub reach: Reach,
}

pub enum Reach {
    /// A memfd's descriptor, passed after the reply.
    Descriptor(OwnedFd),
    /// Chunks of the VM's heap, at this offset of its region.
    Heap(usize),
}

impl ManagedVars {
    pub fn any(&self) -> bool {
        !self.vars.is_empty()
    }

    /// Mirrors the variable at `[dptr, dptr + size)` of `library`, whose
    /// bytes are read here; returns the pages that were not mirrored yet,
    /// made in `heap` where the guest has one.
    pub fn add(
        &mut self,
        backend: &dyn Backend,
        library: u64,
        dptr: u64,
        size: u64,
        heap: Option<&Heap>,
    ) -> Result<Option<NewPages>, CallError> {
        if self.vars.iter().any(|v| v.library == library && v.dptr == dptr) || size == 0 {
            return Ok(None);
        }
        let end =
            dptr.checked_add(size).ok_or_else(|| CallError::new(CuError::INVALID_VALUE, "a variable past 2^64"))?;
        let (first, last) = (dptr / PAGE * PAGE, end.next_multiple_of(PAGE));
        if self.bytes + (last - first) > BUDGET {
            return Err(CallError::new(CuError::OUT_OF_MEMORY, "managed variables past what one session may mirror"));
        }
        // Variables never overlap, so the pages not mirrored yet are one run:
        // only the first and last pages can be another variable's too.
        let mirrored = |page: u64| self.mirrors.iter().any(|m| m.at <= page && page < m.at + m.region.len() as u64);
        let mut new = (first..last).step_by(PAGE as usize).filter(|&p| !mirrored(p));
        let new_pages = match new.next() {
            Some(start) => {
                let stop = new.last().unwrap_or(start) + PAGE;
                let (region, reach) = pages((stop - start) as usize, heap)
                    .map_err(|e| CallError::new(CuError::OUT_OF_MEMORY, format!("a managed mirror: {e}")))?;
                self.mirrors.push(Mirror { at: start, region });
                self.bytes += stop - start;
                Some(NewPages { at: start, len: stop - start, reach })
            }
            None => None,
        };
        let mut pieces = Vec::new();
        for m in &self.mirrors {
            let (start, stop) = (dptr.max(m.at), end.min(m.at + m.region.len() as u64));
            if start >= stop {
                continue;
            }
            let mut agreed = vec![0u8; (stop - start) as usize];
            // SAFETY: a range of the variable the driver just named.
            unsafe { backend.managed_read(start, &mut agreed) }?;
            // SAFETY: `start..stop` lies in the mirror's mapping.
            let here = unsafe { m.region.as_ptr().add((start - m.at) as usize) };
            // SAFETY: as above; the guest has not seen these bytes yet.
            unsafe { std::ptr::copy_nonoverlapping(agreed.as_ptr(), here, agreed.len()) };
            pieces.push(Var { library, dptr: start, here, agreed });
        }
        self.vars.extend(pieces);
        Ok(new_pages)
    }

    /// Forgets the variables of an unloaded library; their pages stay
    /// mapped in the guest, as the program's own memory.
    pub fn unloaded(&mut self, library: u64) {
        self.vars.retain(|v| v.library != library);
    }

    /// Writes what the program changed in the mirror to the variables.
    pub fn write_variables(&mut self, backend: &dyn Backend) {
        self.vars.retain_mut(|v| {
            let now = v.mirror();
            for (at, run) in differing_runs(&v.agreed, &now) {
                // SAFETY: a range of a variable of a loaded library.
                if let Err(e) = unsafe { backend.managed_write(v.dptr + at as u64, &now[at..at + run]) } {
                    return v.lost(&e);
                }
                v.agreed[at..at + run].copy_from_slice(&now[at..at + run]);
            }
            true
        });
    }

    /// Brings the mirror up to date with what the device changed, leaving
    /// what the program changed since the last call for the next.
    pub fn read_variables(&mut self, backend: &dyn Backend) {
        self.vars.retain_mut(|v| {
            let mut device = vec![0u8; v.agreed.len()];
            // SAFETY: a range of a variable of a loaded library.
            if let Err(e) = unsafe { backend.managed_read(v.dptr, &mut device) } {
                return v.lost(&e);
            }
            let mut mirror = v.mirror();
            for (at, run) in take_changes(&mut v.agreed, &device, &mut mirror) {
                // SAFETY: inside the mirror's mapping.
                unsafe { std::ptr::copy_nonoverlapping(mirror[at..].as_ptr(), v.here.add(at), run) };
            }
            true
        });
    }
}

/// `len` bytes of mirror, and how the guest reaches them.
fn pages(len: usize, heap: Option<&Heap>) -> Result<(Region, Reach), String> {
    let Some(heap) = heap else {
        let region = Region::create("gpuplex-managed", len).map_err(|e| e.to_string())?;
        let fd = region.fd().try_clone_to_owned().map_err(|e| format!("its descriptor: {e}"))?;
        return Ok((region, Reach::Descriptor(fd)));
    };
    let (offset, region) = heap.claim(len, std::ptr::null_mut()).map_err(|e| e.to_string())?;
    Ok((region, Reach::Heap(offset)))
}

impl Var {
    /// Drops a variable the backend no longer reaches (its context ended on
    /// the emulated device): the mirror becomes the program's own memory.
    fn lost(&self, e: &CallError) -> bool {
        warn!(dptr = self.dptr, "a managed variable is no longer kept up to date: {}", e.detail);
        false
    }

    /// The mirror's bytes now (the guest may be writing them).
    fn mirror(&self) -> Vec<u8> {
        let mut now = vec![0u8; self.agreed.len()];
        // SAFETY: the mirror stays mapped while the variable is kept.
        unsafe { std::ptr::copy_nonoverlapping(self.here, now.as_mut_ptr(), now.len()) };
        now
    }
}
