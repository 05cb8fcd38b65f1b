//! Tensor maps on the emulated device: the parameters checked as the driver
//! documents, then packed into the map's 128 bytes. The emulated device runs
//! no kernel that reads one, so the packing only has to keep what it was given.

use gpuplex_protocol::{CallError, CuError};

use crate::backend::{BResult, TensorMap, TensorMapBytes, TensorWindow};

/// Bytes per element of `CUtensorMapDataType` 0 (`UINT8`) to 12 (`TFLOAT32_FTZ`).
const ELEMENT_BYTES: [u64; 13] = [1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4];
const INTERLEAVE_NONE: u32 = 0;
const INTERLEAVE_32B: u32 = 2;

fn invalid(why: &str) -> CallError {
    CallError::new(CuError::INVALID_VALUE, format!("tensor map: {why}"))
}

fn check(m: &TensorMap) -> BResult<()> {
    let element = *ELEMENT_BYTES.get(m.data_type as usize).ok_or_else(|| invalid("unknown data type"))?;
    let rank = m.dims.len();
    let least = if m.interleave == INTERLEAVE_NONE { 1 } else { 3 };
    if !(least..=5).contains(&rank) {
        return Err(invalid("rank out of range"));
    }
    let align = if m.interleave == INTERLEAVE_32B { 32 } else { 16 };
    if m.address % align != 0 {
        return Err(invalid("global address misaligned"));
    }
    if m.dims.iter().any(|&d| d == 0 || d > 1 << 32) {
        return Err(invalid("a global dimension out of range"));
    }
    if m.strides.iter().any(|&s| s % 16 != 0 || s >= 1 << 40) {
        return Err(invalid("a global stride not a multiple of 16 below 2^40"));
    }
    if m.element_strides.iter().any(|&s| s == 0 || s > 8) {
        return Err(invalid("an element stride out of range"));
    }
    // A swizzle of 32, 64 or 128 bytes takes an inner dimension no wider.
    let swizzled = matches!(m.swizzle, 1..=3).then(|| 16u64 << m.swizzle);
    let inner = match &m.window {
        TensorWindow::Tiled(window) => window.first().map_or(0, |&b| b as u64 * element),
        TensorWindow::Im2col { channels, .. } => *channels as u64 * element,
    };
    if m.interleave == INTERLEAVE_NONE && swizzled.is_some_and(|bytes| inner > bytes) {
        return Err(invalid("the box's inner dimension is wider than its swizzle"));
    }
    match &m.window {
        TensorWindow::Tiled(window) => {
            if window.iter().any(|&b| b == 0 || b > 256) {
                return Err(invalid("a box dimension out of range"));
            }
            if m.interleave == INTERLEAVE_NONE && (window[0] as u64 * element) % 16 != 0 {
                return Err(invalid("the box's inner dimension is not a multiple of 16 bytes"));
            }
        }
        TensorWindow::Im2col { channels, pixels, .. } => {
            if rank < 3 || *channels == 0 || *channels > 256 || *pixels == 0 || *pixels > 1024 {
                return Err(invalid("im2col rank, channels or pixels out of range"));
            }
        }
    }
    Ok(())
}

pub fn encode(m: &TensorMap) -> BResult<TensorMapBytes> {
    check(m)?;
    let mut out = Vec::with_capacity(128);
    out.extend(m.address.to_le_bytes());
    out.extend(m.dims.iter().flat_map(|d| d.to_le_bytes()));
    out.extend(m.strides.iter().flat_map(|s| s.to_le_bytes()));
    out.extend(m.element_strides.iter().map(|&s| s as u8));
    match &m.window {
        TensorWindow::Tiled(window) => out.extend(window.iter().flat_map(|&b| (b as u16).to_le_bytes())),
        TensorWindow::Im2col { lower, upper, channels, pixels } => {
            out.extend(lower.iter().chain(upper).flat_map(|&c| (c as i16).to_le_bytes()));
            out.extend((*channels as u16).to_le_bytes());
            out.extend((*pixels as u16).to_le_bytes());
        }
    }
    out.extend([m.data_type, m.interleave, m.swizzle, m.l2_promotion, m.oob_fill].map(|v| v as u8));
    let mut map = [0; 128];
    map[..out.len()].copy_from_slice(&out);
    Ok(map)
}

pub fn replace_address(map: &TensorMapBytes, address: u64) -> BResult<TensorMapBytes> {
    if address % 16 != 0 {
        return Err(invalid("global address misaligned"));
    }
    let mut out = *map;
    out[..8].copy_from_slice(&address.to_le_bytes());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiled() -> TensorMap {
        TensorMap {
            data_type: 7,
            address: 0x7f00_0000_1000,
            dims: vec![1024, 512],
            strides: vec![4096],
            element_strides: vec![1, 1],
            window: TensorWindow::Tiled(vec![32, 32]),
            interleave: 0,
            swizzle: 3,
            l2_promotion: 2,
            oob_fill: 0,
        }
    }

    #[test]
    fn a_valid_map_encodes_and_its_address_is_replaced() {
        let map = encode(&tiled()).unwrap();
        assert_eq!(u64::from_le_bytes(map[..8].try_into().unwrap()), 0x7f00_0000_1000);
        let moved = replace_address(&map, 0x7f00_0000_2000).unwrap();
        assert_eq!(u64::from_le_bytes(moved[..8].try_into().unwrap()), 0x7f00_0000_2000);
        assert_eq!(moved[8..], map[8..]);
    }

    #[test]
    fn what_the_driver_documents_as_invalid_is_refused() {
        let cases: [fn(&mut TensorMap); 7] = [
            |m| m.window = TensorWindow::Tiled(vec![64, 32]),
            |m| m.address += 8,
            |m| m.strides[0] = 4100,
            |m| m.window = TensorWindow::Tiled(vec![257, 32]),
            |m| m.window = TensorWindow::Tiled(vec![2, 32]),
            |m| m.element_strides[1] = 9,
            |m| m.data_type = 99,
        ];
        for (i, change) in cases.iter().enumerate() {
            let mut m = tiled();
            change(&mut m);
            assert_eq!(encode(&m).unwrap_err().code, CuError::INVALID_VALUE, "case {i}");
        }
    }
}
