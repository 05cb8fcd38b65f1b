//! JIT linking on the real driver: one link state per call, made, fed,
//! completed and destroyed within it, its logs in buffers of the server's.

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

use gpuplex_protocol::LINK_INPUT_PTX;

use super::api::{self, check};
use super::{enter, BResult, Obj};
use crate::backend::Linked;

/// Each log's buffer: the driver cuts a longer log there.
const LOG_BYTES: usize = 64 << 10;

/// `CU_JIT_INFO_LOG_BUFFER` and its size, the error log's.
const INFO_LOG: c_int = 3;
const INFO_LOG_SIZE: c_int = 4;
const ERROR_LOG: c_int = 5;
const ERROR_LOG_SIZE: c_int = 6;

pub(super) fn link(ctx: Obj, options: &[(u32, u64)], inputs: &[(u32, &[u8])]) -> BResult<Linked> {
    enter(ctx)?;
    let (mut info, mut error) = (vec![0u8; LOG_BYTES], vec![0u8; LOG_BYTES]);
    let mut codes: Vec<c_int> = options.iter().map(|&(o, _)| o as c_int).collect();
    // Each option's value is the unsigned integer itself, in the pointer's place.
    let mut values: Vec<*mut c_void> = options.iter().map(|&(_, v)| v as usize as *mut c_void).collect();
    codes.extend([INFO_LOG, INFO_LOG_SIZE, ERROR_LOG, ERROR_LOG_SIZE]);
    values.extend([
        info.as_mut_ptr().cast(),
        LOG_BYTES as *mut c_void,
        error.as_mut_ptr().cast(),
        LOG_BYTES as *mut c_void,
    ]);
    let mut state = null_mut();
    // SAFETY: as many codes as values, which (and the log buffers) outlive
    // the state: it is destroyed below.
    check(unsafe { api::cuLinkCreate_v2(codes.len() as u32, codes.as_mut_ptr(), values.as_mut_ptr(), &mut state) })?;
    let linked = (|| -> BResult<Vec<u8>> {
        for &(kind, data) in inputs {
            // PTX is text the driver reads to its NUL.
            let mut text;
            let data = if kind == LINK_INPUT_PTX && data.last() != Some(&0) {
                text = data.to_vec();
                text.push(0);
                &text[..]
            } else {
                data
            };
            // SAFETY: a live link state; the input's bytes, which the driver
            // reads within the call; no name and no options of its own.
            check(unsafe {
                api::cuLinkAddData_v2(
                    state,
                    kind as c_int,
                    data.as_ptr().cast_mut().cast(),
                    data.len(),
                    std::ptr::null(),
                    0,
                    null_mut(),
                    null_mut(),
                )
            })?;
        }
        let (mut image, mut size) = (null_mut(), 0usize);
        // SAFETY: a live link state; out-pointers to locals.
        check(unsafe { api::cuLinkComplete(state, &mut image, &mut size) })?;
        // SAFETY: the driver's image of `size` bytes, valid until the state goes.
        Ok(unsafe { std::slice::from_raw_parts(image.cast::<u8>(), size) }.to_vec())
    })();
    // SAFETY: the live link state made above, not used after.
    let _ = check(unsafe { api::cuLinkDestroy(state) });
    let text = |log: &[u8]| log[..log.iter().position(|&b| b == 0).unwrap_or(log.len())].to_vec();
    let (status, image) = match linked {
        Ok(image) => (0, image),
        Err(e) => (e.code.0, Vec::new()),
    };
    Ok(Linked { status, image, info_log: text(&info), error_log: text(&error) })
}
