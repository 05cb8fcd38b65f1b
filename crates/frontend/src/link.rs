//! JIT linking (`cuLink*`). A link state gathers its options and inputs in
//! the process, and cuLinkComplete sends them to the server in one call,
//! whose driver links them there. The linked image stays with the state
//! until cuLinkDestroy, as the driver keeps its own. What the driver would
//! refuse in an input is refused at cuLinkComplete rather than when the
//! input is added, with the driver's log.

use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use gpuplex_protocol::{calls, CuError, Seq, LINK_INPUT_TYPES, LINK_OPTIONS, MAX_PAYLOAD};

use crate::client;
use crate::ffi::{check_out, entry, write_out, CUresult};

/// `CUjit_option`s whose values come back to the caller.
const WALL_TIME: i32 = 2;
const INFO_LOG: i32 = 3;
const INFO_LOG_SIZE: i32 = 4;
const ERROR_LOG: i32 = 5;
const ERROR_LOG_SIZE: i32 = 6;

/// A log the caller asked for: its buffer, and the option value that holds
/// its size, where the filled size goes back.
#[derive(Clone, Copy)]
struct Log {
    buffer: *mut u8,
    size: *mut *mut c_void,
}

struct LinkState {
    options: Vec<u32>,
    values: Vec<u64>,
    info: Option<Log>,
    error: Option<Log>,
    wall_time: Option<*mut f32>,
    kinds: Vec<u32>,
    inputs: Vec<Vec<u8>>,
    /// The linked image, once complete.
    image: Vec<u8>,
}

// SAFETY: the pointers are the caller's option values and buffers, which
// the CUDA API requires to stay valid while the state lives; they are only
// written through under the states' lock.
unsafe impl Send for LinkState {}

/// The live link states, by the handle the program holds.
static STATES: Mutex<Option<HashMap<u64, LinkState>>> = Mutex::new(None);
static NEXT: AtomicU64 = AtomicU64::new(1);

fn with_state<T>(h: *mut c_void, f: impl FnOnce(&mut LinkState) -> Result<T, CuError>) -> Result<T, CuError> {
    let mut states = STATES.lock().unwrap_or_else(PoisonError::into_inner);
    let state = states.get_or_insert_with(HashMap::new).get_mut(&(h as u64)).ok_or(CuError::INVALID_HANDLE)?;
    f(state)
}

/// Reads a `cuLinkCreate` option list into a new state.
///
/// # Safety
/// `options` and `values` hold `n` entries each (NULL where `n` is 0).
unsafe fn read_options(n: u32, options: *const i32, values: *mut *mut c_void) -> Result<LinkState, CuError> {
    let mut state = LinkState {
        options: Vec::new(),
        values: Vec::new(),
        info: None,
        error: None,
        wall_time: None,
        kinds: Vec::new(),
        inputs: Vec::new(),
        image: Vec::new(),
    };
    if n == 0 {
        return Ok(state);
    }
    if options.is_null() || values.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    let (mut info, mut error) = ((None, None), (None, None));
    for i in 0..n as usize {
        // SAFETY: `n` entries each, per the contract.
        let (option, slot) = unsafe { (*options.add(i), values.add(i)) };
        // SAFETY: as above.
        let value = unsafe { *slot };
        match option {
            o if u32::try_from(o).is_ok_and(|o| LINK_OPTIONS.contains(&o)) => {
                state.options.push(o as u32);
                state.values.push(value as u64);
            }
            INFO_LOG => info.0 = Some(value.cast::<u8>()),
            INFO_LOG_SIZE => info.1 = Some(slot),
            ERROR_LOG => error.0 = Some(value.cast::<u8>()),
            ERROR_LOG_SIZE => error.1 = Some(slot),
            WALL_TIME => state.wall_time = Some(slot.cast::<f32>()),
            o => crate::log::debug(&format!("cuLinkCreate: JIT option {o} is not passed on")),
        }
    }
    let log = |(buffer, size): (Option<*mut u8>, Option<*mut *mut c_void>)| match (buffer, size) {
        (Some(buffer), Some(size)) if !buffer.is_null() => Some(Log { buffer, size }),
        _ => None,
    };
    (state.info, state.error) = (log(info), log(error));
    Ok(state)
}

impl Log {
    /// Writes `text` (cut to the buffer, NUL-terminated) and its filled size.
    ///
    /// # Safety
    /// The buffer holds the size its option gave; the size's slot is writable.
    unsafe fn write(self, text: &[u8]) {
        // SAFETY: per the contract.
        unsafe {
            let room = *self.size as usize;
            if room == 0 {
                return;
            }
            let n = text.len().min(room - 1);
            std::ptr::copy_nonoverlapping(text.as_ptr(), self.buffer, n);
            self.buffer.add(n).write(0);
            *self.size = (n + 1) as *mut c_void;
        }
    }
}

fn add(h: *mut c_void, kind: u32, data: Vec<u8>) -> Result<(), CuError> {
    if kind >= LINK_INPUT_TYPES || data.is_empty() {
        return Err(CuError::INVALID_VALUE);
    }
    with_state(h, |state| {
        let total: usize = state.inputs.iter().map(Vec::len).sum::<usize>() + data.len();
        if total > MAX_PAYLOAD - 4096 {
            crate::log::warn(&format!("cuLinkAddData: {total} bytes of inputs exceed gpuplex's limit for one link"));
            return Err(CuError::INVALID_VALUE);
        }
        state.kinds.push(kind);
        state.inputs.push(data);
        Ok(())
    })
}

fn complete(h: *mut c_void, image_out: *mut *mut c_void, size_out: *mut usize) -> Result<(), CuError> {
    check_out(image_out)?;
    check_out(size_out.cast::<*mut c_void>())?;
    with_state(h, |state| {
        let req = calls::Link::Request {
            options: Seq(state.options.clone()),
            values: Seq(state.values.clone()),
            kinds: Seq(state.kinds.clone()),
            sizes: Seq(state.inputs.iter().map(|i| i.len() as u64).collect()),
            data: state.inputs.concat(),
        };
        let reply = client::call(req)?;
        // SAFETY: the caller's buffers and option values, valid while the
        // state lives, per the CUDA API.
        unsafe {
            if let Some(log) = state.info {
                log.write(&reply.infoLog);
            }
            if let Some(log) = state.error {
                log.write(&reply.errorLog);
            }
            if let Some(wall) = state.wall_time {
                wall.write(0.0);
            }
        }
        if reply.status != 0 {
            let log = String::from_utf8_lossy(&reply.errorLog);
            crate::log::debug(&format!("cuLinkComplete: the server's driver refused the link: {log}"));
            return Err(CuError(reply.status));
        }
        state.image = reply.cubin;
        // SAFETY: checked non-NULL; the caller vouches for them.
        unsafe {
            write_out(image_out, state.image.as_mut_ptr().cast::<c_void>());
            write_out(size_out, state.image.len());
        }
        Ok(())
    })
}

/// # Safety
/// `options`/`values` hold `n` entries, which (for the results they ask)
/// stay valid while the state lives; `state_out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuLinkCreate_v2(
    n: u32,
    options: *const i32,
    values: *mut *mut c_void,
    state_out: *mut *mut c_void,
) -> CUresult {
    entry("cuLinkCreate_v2", || {
        check_out(state_out)?;
        // SAFETY: per this function's contract.
        let state = unsafe { read_options(n, options, values)? };
        // Nonzero and aligned, as a pointer would be.
        let h = NEXT.fetch_add(1, Ordering::Relaxed) << 4;
        STATES.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert_with(HashMap::new).insert(h, state);
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(state_out, h as *mut c_void) };
        Ok(())
    })
}

/// # Safety
/// As `cuLinkCreate_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuLinkCreate(
    n: u32,
    options: *const i32,
    values: *mut *mut c_void,
    state_out: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuLinkCreate_v2(n, options, values, state_out) }
}

/// # Safety
/// `data` holds `size` bytes. The input's own options only tune its
/// compilation, and are not passed on.
#[no_mangle]
pub unsafe extern "C" fn cuLinkAddData_v2(
    state: *mut c_void,
    kind: u32,
    data: *const c_void,
    size: usize,
    _name: *const c_char,
    _n: u32,
    _options: *const i32,
    _values: *mut *mut c_void,
) -> CUresult {
    entry("cuLinkAddData_v2", || {
        if data.is_null() {
            return Err(CuError::INVALID_VALUE);
        }
        // SAFETY: `size` readable bytes, per the contract.
        add(state, kind, unsafe { std::slice::from_raw_parts(data.cast::<u8>(), size) }.to_vec())
    })
}

/// # Safety
/// As `cuLinkAddData_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuLinkAddData(
    state: *mut c_void,
    kind: u32,
    data: *const c_void,
    size: usize,
    name: *const c_char,
    n: u32,
    options: *const i32,
    values: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuLinkAddData_v2(state, kind, data, size, name, n, options, values) }
}

/// # Safety
/// `path` is a NUL-terminated path.
#[no_mangle]
pub unsafe extern "C" fn cuLinkAddFile_v2(
    state: *mut c_void,
    kind: u32,
    path: *const c_char,
    _n: u32,
    _options: *const i32,
    _values: *mut *mut c_void,
) -> CUresult {
    entry("cuLinkAddFile_v2", || add(state, kind, crate::module::read_file(path)?))
}

/// # Safety
/// As `cuLinkAddFile_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuLinkAddFile(
    state: *mut c_void,
    kind: u32,
    path: *const c_char,
    n: u32,
    options: *const i32,
    values: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuLinkAddFile_v2(state, kind, path, n, options, values) }
}

/// # Safety
/// `image_out` and `size_out` are valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuLinkComplete(
    state: *mut c_void,
    image_out: *mut *mut c_void,
    size_out: *mut usize,
) -> CUresult {
    entry("cuLinkComplete", || complete(state, image_out, size_out))
}

#[no_mangle]
pub extern "C" fn cuLinkDestroy(state: *mut c_void) -> CUresult {
    entry("cuLinkDestroy", || {
        let mut states = STATES.lock().unwrap_or_else(PoisonError::into_inner);
        states.get_or_insert_with(HashMap::new).remove(&(state as u64)).map(drop).ok_or(CuError::INVALID_HANDLE)
    })
}
