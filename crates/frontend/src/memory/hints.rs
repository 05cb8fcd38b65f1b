//! The hints a program gave ranges of its managed memory (advice and
//! prefetches), kept so that `cuMemRangeGetAttribute(s)` answers with them
//! as the driver does. They change nothing here: the memory is where the
//! program and its kernels both reach it (`managed.rs`).

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use gpuplex_protocol::CuError;

/// A `CUmemLocation`: its type and id.
pub type Location = (u32, i32);

/// `CU_MEM_LOCATION_TYPE_DEVICE`, `_HOST`.
pub const DEVICE: u32 = 1;
pub const HOST: u32 = 2;
/// `CU_DEVICE_CPU`, `CU_DEVICE_INVALID`.
const DEVICE_CPU: i32 = -1;
const DEVICE_INVALID: i32 = -2;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Hints {
    read_mostly: bool,
    preferred: Option<Location>,
    /// Devices the range is advised to be accessed by, a bit each.
    accessed_by: u64,
    last_prefetch: Option<Location>,
}

/// Hinted ranges, `start -> (end, hints)`, none overlapping; memory not in
/// any has no hints.
static RANGES: Mutex<BTreeMap<u64, (u64, Hints)>> = Mutex::new(BTreeMap::new());

/// The ranges covering `[start, end)`, split at its ends, gaps included.
fn covering(ranges: &mut BTreeMap<u64, (u64, Hints)>, start: u64, end: u64) -> Vec<(u64, u64, Hints)> {
    for at in [start, end] {
        let split = ranges.range(..at).next_back().map(|(&s, &(e, h))| (s, e, h)).filter(|&(_, e, _)| e > at);
        if let Some((s, e, h)) = split {
            ranges.insert(s, (at, h));
            ranges.insert(at, (e, h));
        }
    }
    let mut out = Vec::new();
    let mut at = start;
    for (&s, &(e, h)) in ranges.range(start..end) {
        if s > at {
            out.push((at, s, Hints::default()));
        }
        out.push((s, e, h));
        at = e;
    }
    if at < end {
        out.push((at, end, Hints::default()));
    }
    out
}

fn change(start: u64, len: u64, f: impl Fn(&mut Hints)) {
    let mut ranges = RANGES.lock().unwrap_or_else(PoisonError::into_inner);
    let end = start.saturating_add(len);
    for (s, e, mut h) in covering(&mut ranges, start, end) {
        f(&mut h);
        ranges.insert(s, (e, h));
    }
}

/// A new allocation's range starts with no hints.
pub fn forget(start: u64, len: u64) {
    let mut ranges = RANGES.lock().unwrap_or_else(PoisonError::into_inner);
    let end = start.saturating_add(len);
    for (s, _, _) in covering(&mut ranges, start, end) {
        ranges.remove(&s);
    }
}

/// `CU_MEM_ADVISE_SET_READ_MOSTLY` (1) to `UNSET_ACCESSED_BY` (6), checked
/// by the caller.
pub fn advise(start: u64, len: u64, advice: u32, at: Location) {
    let device_bit = if at.0 == DEVICE && (0..64).contains(&at.1) { 1u64 << at.1 } else { 0 };
    change(start, len, |h| match advice {
        1 => h.read_mostly = true,
        2 => h.read_mostly = false,
        3 => h.preferred = Some(at),
        4 => h.preferred = None,
        5 => h.accessed_by |= device_bit,
        _ => h.accessed_by &= !device_bit,
    });
}

pub fn prefetched(start: u64, len: u64, to: Location) {
    change(start, len, |h| h.last_prefetch = Some(to));
}

/// A location as the legacy attributes give it: a device number,
/// `CU_DEVICE_CPU` for the host, `CU_DEVICE_INVALID` for none.
fn legacy(l: Option<Location>) -> i32 {
    match l {
        Some((DEVICE, id)) => id,
        Some((HOST, _)) => DEVICE_CPU,
        _ => DEVICE_INVALID,
    }
}

/// The same location over the whole range, if it is.
fn common(all: &[Hints], pick: impl Fn(&Hints) -> Option<Location>) -> Option<Location> {
    let first = pick(all.first()?);
    all.iter().all(|h| pick(h) == first).then_some(first).flatten()
}

/// `CUmem_range_attribute` `attr` of `[start, start + len)` into `data`
/// (`size` bytes): 4-byte values, or for `ACCESSED_BY` (3) as many device
/// numbers as fit, padded with `CU_DEVICE_INVALID`.
pub fn attribute(start: u64, len: u64, attr: u32, size: usize) -> Result<Vec<i32>, CuError> {
    let all: Vec<Hints> = {
        let mut ranges = RANGES.lock().unwrap_or_else(PoisonError::into_inner);
        covering(&mut ranges, start, start.saturating_add(len)).into_iter().map(|(_, _, h)| h).collect()
    };
    if !size.is_multiple_of(4) || size == 0 || (attr != 3 && size != 4) {
        return Err(CuError::INVALID_VALUE);
    }
    let preferred = common(&all, |h| h.preferred);
    let prefetch = common(&all, |h| h.last_prefetch);
    let kind = |l: Option<Location>| l.map_or(0, |l| l.0 as i32);
    let id = |l: Option<Location>| l.map_or(DEVICE_INVALID, |l| l.1);
    Ok(match attr {
        1 => vec![i32::from(all.iter().all(|h| h.read_mostly))],
        2 => vec![legacy(preferred)],
        3 => {
            let devices = all.iter().fold(u64::MAX, |acc, h| acc & h.accessed_by);
            let mut out: Vec<i32> = (0..64).filter(|d| devices & (1 << d) != 0).collect();
            out.resize(size / 4, DEVICE_INVALID);
            out.truncate(size / 4);
            out
        }
        4 => vec![legacy(prefetch)],
        5 => vec![kind(preferred)],
        6 => vec![id(preferred)],
        7 => vec![kind(prefetch)],
        8 => vec![id(prefetch)],
        _ => return Err(CuError::INVALID_VALUE),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_hold_for_the_ranges_they_were_given() {
        let base = 1 << 40;
        forget(base, 1 << 20);
        advise(base, 4096, 1, (DEVICE, 0));
        assert_eq!(attribute(base, 4096, 1, 4), Ok(vec![1]));
        assert_eq!(attribute(base, 8192, 1, 4), Ok(vec![0]), "half read-mostly");
        advise(base, 8192, 3, (DEVICE, 0));
        assert_eq!(attribute(base + 100, 4000, 2, 4), Ok(vec![0]));
        advise(base + 4096, 4096, 3, (HOST, 0));
        assert_eq!(attribute(base, 8192, 2, 4), Ok(vec![DEVICE_INVALID]), "two locations");
        assert_eq!(attribute(base + 4096, 10, 2, 4), Ok(vec![DEVICE_CPU]));
        assert_eq!(attribute(base + 4096, 10, 5, 4), Ok(vec![HOST as i32]));
        advise(base, 8192, 5, (DEVICE, 0));
        advise(base, 8192, 5, (DEVICE, 2));
        advise(base, 4096, 6, (DEVICE, 2));
        assert_eq!(attribute(base, 8192, 3, 12), Ok(vec![0, DEVICE_INVALID, DEVICE_INVALID]));
        prefetched(base, 8192, (DEVICE, 0));
        assert_eq!(attribute(base, 8192, 4, 4), Ok(vec![0]));
        assert_eq!(attribute(base, 8192, 1, 8), Err(CuError::INVALID_VALUE));
        forget(base, 1 << 20);
        assert_eq!(attribute(base, 8192, 4, 4), Ok(vec![DEVICE_INVALID]));
    }
}
