//! User objects on the test device: each object's references counted as the
//! driver counts them, the program's and its graphs' together, and the
//! references each graph and executable graph owns, which go with it. An
//! executable graph owns what its graph owned when it was made, as a clone
//! does. The destructor runs once the last reference is gone: handed back
//! to the caller, which runs it once the device is unlocked.

use std::collections::HashMap;

use gpuplex_protocol::CuError;

use super::err;
use crate::backend::{BResult, HostFn};

/// `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`: the one flag, and a required one.
const NO_DESTRUCTOR_SYNC: u32 = 1;
/// `CU_GRAPH_USER_OBJECT_MOVE`: references move from the caller to the graph.
const MOVE: u32 = 1;

#[derive(Default)]
pub struct UserObjects {
    /// Each object's references and destructor.
    objects: HashMap<u64, (u64, HostFn)>,
    /// The references each graph or executable graph owns, by object.
    owned: HashMap<u64, HashMap<u64, u64>>,
}

/// A count of references as the driver takes one: nonzero, at most INT_MAX.
fn count(n: u32) -> BResult<u64> {
    if n == 0 || n > i32::MAX as u32 {
        return Err(err(CuError::INVALID_VALUE, format!("{n} references")));
    }
    Ok(n.into())
}

impl UserObjects {
    pub fn create(&mut self, id: u64, destroy: HostFn, refs: u32, flags: u32) -> BResult<()> {
        if flags != NO_DESTRUCTOR_SYNC {
            return Err(err(CuError::INVALID_VALUE, "user objects take CU_USER_OBJECT_NO_DESTRUCTOR_SYNC"));
        }
        self.objects.insert(id, (count(refs)?, destroy));
        Ok(())
    }

    fn refs(&mut self, object: u64) -> BResult<&mut u64> {
        self.objects.get_mut(&object).map(|(r, _)| r).ok_or_else(|| err(CuError::INVALID_VALUE, "no such user object"))
    }

    pub fn retain(&mut self, object: u64, n: u32) -> BResult<()> {
        *self.refs(object)? += count(n)?;
        Ok(())
    }

    /// Drops `n` references; the destructor to run if they were the last.
    pub fn release(&mut self, object: u64, n: u32) -> BResult<Option<HostFn>> {
        let n = count(n)?;
        let refs = self.refs(object)?;
        *refs = refs.checked_sub(n).ok_or_else(|| err(CuError::INVALID_VALUE, "more references released than held"))?;
        Ok(if *refs == 0 { self.objects.remove(&object).map(|(_, f)| f) } else { None })
    }

    /// References owned by `owner` (a graph): new ones, or with
    /// [`MOVE`] the caller's own.
    pub fn owner_retain(&mut self, owner: u64, object: u64, n: u32, flags: u32) -> BResult<()> {
        if flags & !MOVE != 0 {
            return Err(err(CuError::INVALID_VALUE, format!("user object flags {flags:#x}")));
        }
        let n = count(n)?;
        let refs = self.refs(object)?;
        if flags & MOVE == 0 {
            *refs += n;
        }
        *self.owned.entry(owner).or_default().entry(object).or_default() += n;
        Ok(())
    }

    pub fn owner_release(&mut self, owner: u64, object: u64, n: u32) -> BResult<Option<HostFn>> {
        let held = self.owned.get_mut(&owner).and_then(|o| o.get_mut(&object));
        let held = held.ok_or_else(|| err(CuError::INVALID_VALUE, "the graph owns no reference to the user object"))?;
        *held = held
            .checked_sub(count(n)?)
            .ok_or_else(|| err(CuError::INVALID_VALUE, "more references than the graph owns"))?;
        self.release(object, n)
    }

    /// `to` (an executable graph or a clone) owns what `from` owns.
    pub fn copy_owned(&mut self, from: u64, to: u64) {
        let Some(owned) = self.owned.get(&from).cloned() else { return };
        for (&object, &n) in &owned {
            if let Some((refs, _)) = self.objects.get_mut(&object) {
                *refs += n;
            }
        }
        self.owned.insert(to, owned);
    }

    /// An owner is gone, and its references with it: the destructors to run.
    pub fn owner_gone(&mut self, owner: u64) -> Vec<HostFn> {
        let mut destroy = Vec::new();
        for (object, n) in self.owned.remove(&owner).unwrap_or_default() {
            let refs = self.objects.get_mut(&object).map(|(r, _)| r);
            if let Some(refs) = refs.filter(|_| n > 0) {
                *refs = refs.saturating_sub(n);
                if *refs == 0 {
                    destroy.extend(self.objects.remove(&object).map(|(_, f)| f));
                }
            }
        }
        destroy
    }
}

/// Runs destructors, with the device unlocked (a destructor reaches the
/// guest, not the device).
pub fn run(destroy: impl IntoIterator<Item = HostFn>) {
    for f in destroy {
        // SAFETY: the session's function and data, which it keeps alive
        // for as long as the object may be destroyed.
        unsafe { (f.run)(f.data) };
    }
}
