//! Tensor maps (TMA descriptors), encoded by the driver: a host-side
//! encoding of a global tensor's shape that the guest's kernels read.

use std::ffi::{c_int, c_void};

use super::api::{self, check};
use super::BResult;
use crate::backend::{TensorMap, TensorMapBytes, TensorWindow};

/// `CUtensorMap`, whose alignment the driver requires.
#[repr(C, align(64))]
pub(super) struct Raw(pub(super) TensorMapBytes);

pub(super) fn encode(m: &TensorMap) -> BResult<TensorMapBytes> {
    let mut out = Raw([0; 128]);
    let rank = m.dims.len() as u32;
    let address = m.address as usize as *mut c_void;
    let enums = [m.interleave, m.swizzle, m.l2_promotion, m.oob_fill].map(|v| v as c_int);
    // SAFETY: every list is as long as the rank asks (the session's check);
    // the driver only encodes, touching no memory at `address`.
    check(unsafe {
        match &m.window {
            TensorWindow::Tiled(window) => api::cuTensorMapEncodeTiled(
                &mut out,
                m.data_type as c_int,
                rank,
                address,
                m.dims.as_ptr(),
                m.strides.as_ptr(),
                window.as_ptr(),
                m.element_strides.as_ptr(),
                enums[0],
                enums[1],
                enums[2],
                enums[3],
            ),
            TensorWindow::Im2col { lower, upper, channels, pixels } => api::cuTensorMapEncodeIm2col(
                &mut out,
                m.data_type as c_int,
                rank,
                address,
                m.dims.as_ptr(),
                m.strides.as_ptr(),
                lower.as_ptr(),
                upper.as_ptr(),
                *channels,
                *pixels,
                m.element_strides.as_ptr(),
                enums[0],
                enums[1],
                enums[2],
                enums[3],
            ),
        }
    })?;
    Ok(out.0)
}

pub(super) fn replace_address(map: &TensorMapBytes, address: u64) -> BResult<TensorMapBytes> {
    let mut out = Raw(*map);
    // SAFETY: a map of 128 aligned bytes, rewritten in place.
    check(unsafe { api::cuTensorMapReplaceAddress(&mut out, address as usize as *mut c_void) })?;
    Ok(out.0)
}
