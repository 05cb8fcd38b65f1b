//! Ordinary (pageable) host memory in graphs: a copy captured from a
//! stream, or a memcpy node, whose host end is the program's own memory.
//!
//! The driver keeps such a copy's host address and reaches it each time the
//! graph runs, but the program's memory is out of the server's reach. So
//! the range gets a mirror: a block shared with the server and registered
//! with its driver, which the graph copies to or from instead. The program
//! and the mirror agree at the points where the program could tell: before
//! each graph launch the mirror takes what the program wrote, and after
//! each waited call that reaches the device, and around each host function
//! the graph runs here, the program's memory takes what the device wrote.
//! Only the bytes a side changed since they last agreed cross, so a write
//! of the program's is never undone by an old value of the device's.
//!
//! The program may free the memory while a graph still names it (natively
//! the graph then must not run). Its pages are therefore read and written
//! with `process_vm_readv`/`writev` on this process, which fail instead of
//! faulting; a mirror whose memory is gone is dropped, and its block freed
//! at the next mirror made.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use gpuplex_protocol::CuError;
use gpuplex_transport::shm::{differing_runs, take_changes, Region};

use super::host::{self, PAGE};

/// Bytes of the program's memory mirrored at most.
const BUDGET: usize = 1 << 30;

struct Mirror {
    /// The program's range.
    host: u64,
    len: usize,
    /// The server's block, and its mapping here.
    block: u64,
    region: Region,
    /// What the program's memory and the mirror held when they last agreed.
    agreed: Vec<u8>,
    /// Whether a graph copies into the program's range.
    from_device: bool,
}

static MIRRORS: Mutex<Vec<Mirror>> = Mutex::new(Vec::new());
/// Blocks of mirrors whose memory is gone, freed without the connection held.
static GONE: Mutex<Vec<u64>> = Mutex::new(Vec::new());
static ANY: AtomicBool = AtomicBool::new(false);

fn mirrors() -> std::sync::MutexGuard<'static, Vec<Mirror>> {
    MIRRORS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The shared block and offset a graph's copy of `[ptr, ptr + len)` uses,
/// `to_device` (the host end is the source) or from it. Where memory is not
/// shared with the server, a block of the server's kept in step with the
/// program's bytes (`mapped::mirror`). None where the range is not readable
/// memory.
pub fn block_for(ptr: u64, len: usize, to_device: bool) -> Result<Option<(u64, u64)>, CuError> {
    if len == 0 {
        return Ok(None);
    }
    if !host::shared_memory() {
        return super::mapped::mirror(ptr, len);
    }
    let gone = std::mem::take(&mut *GONE.lock().unwrap_or_else(PoisonError::into_inner));
    for block in gone {
        host::free_block(block);
    }
    let end = ptr.checked_add(len as u64).ok_or(CuError::INVALID_VALUE)?;
    {
        let mut all = mirrors();
        if let Some(m) = all.iter_mut().find(|m| m.host <= ptr && end <= m.host + m.len as u64) {
            m.from_device |= !to_device;
            return Ok(Some((m.block, ptr - m.host)));
        }
        if all.iter().map(|m| m.len).sum::<usize>() + len > BUDGET {
            crate::log::warn("a graph's copies name more ordinary host memory than gpuplex mirrors (1 GiB)");
            return Ok(None);
        }
    }
    let mut agreed = vec![0u8; len];
    if !read_own(ptr, &mut agreed) {
        return Ok(None);
    }
    let (block, region) = host::new_block((len as u64).next_multiple_of(PAGE), 0, 0, true)?;
    // SAFETY: the block's fresh mapping, at least `len` bytes.
    unsafe { std::ptr::copy_nonoverlapping(agreed.as_ptr(), region.as_ptr(), len) };
    let m = Mirror { host: ptr, len, block: block.id, region, agreed, from_device: !to_device };
    mirrors().push(m);
    ANY.store(true, Ordering::Release);
    Ok(Some((block.id, 0)))
}

/// The program's address that `offset` of mirror block `block` mirrors.
pub fn program_address(block: u64, offset: u64) -> Option<u64> {
    let found = {
        let all = mirrors();
        all.iter().find(|m| m.block == block).map(|m| (offset < m.len as u64).then(|| m.host + offset))
    };
    found.unwrap_or_else(|| super::mapped::program_address(block, offset))
}

/// Before a graph launch: what the device wrote first, then what the
/// program wrote, into the mirrors; into those the graph only writes too,
/// so that the device's next write is told from the program's last.
pub fn to_device() {
    if ANY.load(Ordering::Acquire) {
        mirrors().retain_mut(|m| m.agree(true));
    }
}

/// After a waited call that reaches the device, and before a host function
/// the graph runs here: what the device wrote, into the program's memory.
pub fn from_device() {
    if ANY.load(Ordering::Acquire) {
        mirrors().retain_mut(|m| m.agree(false));
    }
}

impl Mirror {
    fn staging(&self) -> &[u8] {
        // SAFETY: the block stays mapped while the mirror lives; the GPU may
        // be writing it, as it may write pinned memory the program reads.
        unsafe { std::slice::from_raw_parts(self.region.as_ptr(), self.len) }
    }

    /// Copies into the program's memory what the device changed in the
    /// mirror, where the program has not changed it since; then, `to_device`,
    /// into the mirror what the program changed. The program's memory is
    /// read once. False when it is gone.
    fn agree(&mut self, to_device: bool) -> bool {
        let device_wrote = self.from_device && self.staging() != self.agreed.as_slice();
        if !device_wrote && !to_device {
            return true;
        }
        let mut program = vec![0u8; self.len];
        if !read_own(self.host, &mut program) {
            return self.gone();
        }
        if device_wrote {
            let staging = self.staging().to_vec();
            let taken = take_changes(&mut self.agreed, &staging, &mut program);
            if !write_own_runs(self.host, &program, &taken) {
                return self.gone();
            }
        }
        if to_device {
            for (start, n) in differing_runs(&self.agreed, &program) {
                // SAFETY: inside the block's mapping.
                unsafe { std::ptr::copy_nonoverlapping(program[start..].as_ptr(), self.region.as_ptr().add(start), n) };
                self.agreed[start..start + n].copy_from_slice(&program[start..start + n]);
            }
        }
        true
    }

    /// Hands the block over to be freed; the mirror is dropped.
    fn gone(&mut self) -> bool {
        GONE.lock().unwrap_or_else(PoisonError::into_inner).push(self.block);
        false
    }
}

/// Reads this process's memory at `addr`, failing instead of faulting.
pub(super) fn read_own(addr: u64, out: &mut [u8]) -> bool {
    let local = libc::iovec { iov_base: out.as_mut_ptr().cast(), iov_len: out.len() };
    let remote = libc::iovec { iov_base: addr as usize as *mut libc::c_void, iov_len: out.len() };
    // SAFETY: `local` is our buffer; the kernel checks `remote` and fails
    // with EFAULT where it is not mapped.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    n == out.len() as isize
}

/// Writes the runs `(start, length)` of `data` to this process's memory at
/// `addr` onwards, failing instead of faulting, in as few system calls as
/// the kernel takes vectors for.
pub(super) fn write_own_runs(addr: u64, data: &[u8], runs: &[(usize, usize)]) -> bool {
    const MAX_VECTORS: usize = 1024;
    runs.chunks(MAX_VECTORS).all(|runs| {
        let local: Vec<libc::iovec> = runs
            .iter()
            .map(|&(start, n)| libc::iovec { iov_base: data[start..start + n].as_ptr().cast_mut().cast(), iov_len: n })
            .collect();
        let remote: Vec<libc::iovec> = runs
            .iter()
            .map(|&(start, n)| libc::iovec { iov_base: (addr as usize + start) as *mut libc::c_void, iov_len: n })
            .collect();
        let total: usize = runs.iter().map(|&(_, n)| n).sum();
        // SAFETY: every local vector lies in `data`; the kernel checks the
        // remote ones, the program's memory that a graph or the device
        // writes as the driver would, and fails with EFAULT where unmapped.
        let n = unsafe {
            libc::process_vm_writev(
                libc::getpid(),
                local.as_ptr(),
                local.len() as _,
                remote.as_ptr(),
                remote.len() as _,
                0,
            )
        };
        n == total as isize
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the runs are written, however many, and a hole still fails.
    #[test]
    fn runs_of_own_memory_are_written_in_few_calls() {
        let mut v = vec![0u8; 5000];
        let data: Vec<u8> = (0..5000).map(|i| (i % 251) as u8 + 1).collect();
        // More runs than one call takes: every third byte.
        let runs: Vec<(usize, usize)> = (0..5000).step_by(3).map(|i| (i, 1)).collect();
        assert!(write_own_runs(v.as_mut_ptr() as u64, &data, &runs));
        for (i, &b) in v.iter().enumerate() {
            assert_eq!(b, if i % 3 == 0 { data[i] } else { 0 }, "byte {i}");
        }
        assert!(!write_own_runs(8, &data, &[(0, 1)]), "page 0 is never mapped");
    }

    #[test]
    fn own_memory_is_read_and_written_and_a_hole_fails() {
        let mut v = vec![1u8, 2, 3, 4];
        let mut out = [0u8; 4];
        assert!(read_own(v.as_ptr() as u64, &mut out));
        assert_eq!(out, [1, 2, 3, 4]);
        assert!(write_own_runs(v.as_mut_ptr() as u64 + 1, &[9, 9], &[(0, 2)]));
        assert_eq!(v, [1, 9, 9, 4]);
        assert!(!read_own(8, &mut out), "page 0 is never mapped");
        assert!(!write_own_runs(8, &[0], &[(0, 1)]));
    }
}
