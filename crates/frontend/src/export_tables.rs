//! `cuGetExportTable`: the driver's private interfaces, which the CUDA
//! runtime and libraries such as cuBLAS require before they do anything.
//!
//! Each table is a static array of function pointers at a stable address,
//! found by a 16-byte id. Slot 0 holds the table's size in bytes, except in
//! the context-local-storage table. What each slot does is undocumented;
//! what is used here was read from the real driver with the probe in
//! `tools/driver-facts/` (`data/export_tables.tsv`) and checked against the
//! real runtime on a GPU. Slots nobody has needed are NULL where the real
//! driver's callers accept that, or log their name once and answer
//! `CUDA_ERROR_NOT_SUPPORTED`. Everything here runs in the client.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::ptr::null;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use gpuplex_protocol::CuError;
use hmac::{KeyInit, Mac};

use crate::ffi::{entry, CUresult, CUDA_SUCCESS};
use crate::{client, context, log, module};

/// A private interface: `N` pointer-sized slots.
#[repr(transparent)]
pub struct Table<const N: usize>([*const c_void; N]);

// SAFETY: the tables are immutable and hold only function addresses and sizes.
unsafe impl<const N: usize> Sync for Table<N> {}

impl<const N: usize> Table<N> {
    fn start(&'static self) -> *const c_void {
        self.0.as_ptr().cast()
    }
}

/// Slot 0 of most tables: the table's size in bytes.
const fn size<const N: usize>() -> *const c_void {
    (N * std::mem::size_of::<usize>()) as *const c_void
}

/// Known tables, by id (the 16 bytes in memory order). Their sizes are the
/// real driver's (`data/export_tables.tsv`, from tools/driver-facts).
const CUDART_INTERFACE_ID: [u8; 16] = id("6bd5fb6c5bf4e74a8987d93912fd9df9");
const TOOLS_TLS_ID: [u8; 16] = id("42d85a8123f6cb478298f6e78a3aecdc");
const TOOLS_RUNTIME_CALLBACK_HOOKS_ID: [u8; 16] = id("a094798c2e742e7493f20800200c0a66");
const CONTEXT_LOCAL_STORAGE_ID: [u8; 16] = id("c693336e1121df11a8c368f355d89593");
const CTX_CREATE_BYPASS_ID: [u8; 16] = id("0ca50b8c1004929a89a7d0df10e77286");
const DEVICE_EXTENDED_RT_ID: [u8; 16] = id("b10541e1f7c7c74a9f64f223be99f1e2");
const INTEGRITY_CHECK_ID: [u8; 16] = id("d4082055bde6704b8d34ba123c66e1f2");
const CONTEXT_CHECKS_ID: [u8; 16] = id("263e88607cd2614392f6bbd5006dfa7e");
const TOOLS_CONTEXT_ID: [u8; 16] = id("21318c60971432488ca641ff7324c8f2");
const TOOLS_MODULE_ID: [u8; 16] = id("6e163fbeb958444d835ce182aff1991e");
const ERROR_LOG_ID: [u8; 16] = id("f8cff95121468b4eb9e2fb469e7c0dd9");

/// Parses 32 hex digits at compile time.
const fn id(hex: &str) -> [u8; 16] {
    const fn digit(c: u8) -> u8 {
        match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => panic!("not a hex digit"),
        }
    }
    let h = hex.as_bytes();
    let mut out = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        out[i] = digit(h[2 * i]) << 4 | digit(h[2 * i + 1]);
        i += 1;
    }
    out
}

/// The tables' names, indexed by the `TABLE` parameter of [`unknown_slot`].
const NAMES: [&str; 9] = [
    "CUDART_INTERFACE",
    "CONTEXT_LOCAL_STORAGE",
    "CTX_CREATE_BYPASS",
    "DEVICE_EXTENDED_RT",
    "INTEGRITY_CHECK",
    "CONTEXT_CHECKS",
    "TOOLS_CONTEXT",
    "TOOLS_MODULE",
    "ERROR_LOG",
];
const TOOLS_MODULE: usize = 7;

/// A slot nobody has needed yet: says which (once, and with the raw
/// register arguments at debug level, to learn what callers want), and
/// fails. Reading six argument registers is harmless whatever the real
/// signature.
unsafe extern "C" fn unknown_slot<const TABLE: usize, const SLOT: usize>(
    a0: u64,
    a1: u64,
    a2: u64,
    a3: u64,
    a4: u64,
    a5: u64,
) -> CUresult {
    refuse(TABLE, SLOT, "", &[a0, a1, a2, a3, a4, a5])
}

/// Refuses a call to `NAMES[table][slot]` with `CUDA_ERROR_NOT_SUPPORTED`:
/// a warning the first time (with `why`, if any), its arguments at debug
/// level every time.
fn refuse(table: usize, slot: usize, why: &str, args: &[u64]) -> CUresult {
    static SEEN: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
    let name = NAMES[table];
    let mut seen = SEEN.lock().unwrap_or_else(PoisonError::into_inner);
    if !seen.contains(&(table, slot)) {
        seen.push((table, slot));
        let why = if why.is_empty() { String::new() } else { format!(" ({why})") };
        log::warn(&format!("private driver function {name}[{slot}] is not supported by gpuplex{why}"));
    }
    let args: Vec<String> = args.iter().map(|a| format!("{a:#x}")).collect();
    log::debug(&format!("{name}[{slot}]({})", args.join(", ")));
    CuError::NOT_SUPPORTED.0
}

unsafe extern "C" fn returns_zero() -> CUresult {
    CUDA_SUCCESS
}

// ---- CUDART_INTERFACE: how the runtime loads its fatbins and finds contexts.

/// [1] and [6]: a module from nvcc's fatbin wrapper.
unsafe extern "C" fn module_from_wrapper(out: *mut *mut c_void, wrapper: *const c_void) -> CUresult {
    // SAFETY: the runtime passes its registered fatbin wrapper.
    unsafe { module::cuModuleLoadData(out, wrapper) }
}

unsafe extern "C" fn module_from_wrapper_ext(
    out: *mut *mut c_void,
    wrapper: *const c_void,
    a: *mut c_void,
    b: *mut c_void,
    c: u32,
) -> CUresult {
    if !a.is_null() || !b.is_null() || c != 0 {
        log::warn("CUDART_INTERFACE[6] with extra arguments is not supported by gpuplex");
        return CuError::NOT_SUPPORTED.0;
    }
    // SAFETY: as module_from_wrapper.
    unsafe { module_from_wrapper(out, wrapper) }
}

/// [8]: a module from a fatbin header.
unsafe extern "C" fn module_from_fatbin_ext(
    fatbin: *const c_void,
    out: *mut *mut c_void,
    a: *mut c_void,
    b: *mut c_void,
    c: u32,
) -> CUresult {
    if !a.is_null() || !b.is_null() || c != 0 {
        log::warn("CUDART_INTERFACE[8] with extra arguments is not supported by gpuplex");
        return CuError::NOT_SUPPORTED.0;
    }
    // SAFETY: the runtime passes a complete fatbin.
    unsafe { module::cuModuleLoadData(out, fatbin) }
}

/// [2]: the device's primary context, neither retained nor made active.
unsafe extern "C" fn primary_context(out: *mut *mut c_void, dev: i32) -> CUresult {
    entry("CUDART_INTERFACE[2]", || {
        crate::ffi::check_out(out)?;
        let ctx = context::primary_handle(dev)?;
        // SAFETY: checked non-NULL; the runtime passes a valid pointer.
        unsafe { crate::ffi::write_out(out, ctx as *mut c_void) };
        Ok(())
    })
}

/// [7]: takes a size and does nothing the client can observe.
unsafe extern "C" fn ignore_usize(_: usize) -> CUresult {
    CUDA_SUCCESS
}

/// Slot 10 is NULL in the real driver too.
static CUDART_INTERFACE: Table<13> = Table([
    size::<13>(),
    module_from_wrapper as *const c_void,
    primary_context as *const c_void,
    unknown_slot::<0, 3> as *const c_void,
    unknown_slot::<0, 4> as *const c_void,
    unknown_slot::<0, 5> as *const c_void,
    module_from_wrapper_ext as *const c_void,
    ignore_usize as *const c_void,
    module_from_fatbin_ext as *const c_void,
    unknown_slot::<0, 9> as *const c_void,
    null(),
    unknown_slot::<0, 11> as *const c_void,
    returns_zero as *const c_void,
]);

// ---- Tools interfaces: no tools are attached.

static TOOLS_TLS: Table<3> = Table([size::<3>(), returns_zero as *const c_void, returns_zero as *const c_void]);

/// Zeroed buffers the runtime's tool hooks write into; generously sized.
static mut HOOK_BUFFER_1: [u8; 4096] = [0; 4096];
static mut HOOK_BUFFER_2: [u8; 4096] = [0; 4096];

unsafe extern "C" fn hook_buffer_1(ptr: *mut *mut c_void, size: *mut usize) -> CUresult {
    // SAFETY: the runtime passes valid out-pointers; the buffer is static.
    unsafe {
        crate::ffi::write_out(ptr, (&raw mut HOOK_BUFFER_1).cast());
        crate::ffi::write_out(size, 1024);
    }
    CUDA_SUCCESS
}

unsafe extern "C" fn hook_buffer_2(ptr: *mut *mut c_void, size: *mut usize) -> CUresult {
    // SAFETY: as above.
    unsafe {
        crate::ffi::write_out(ptr, (&raw mut HOOK_BUFFER_2).cast());
        crate::ffi::write_out(size, 14);
    }
    CUDA_SUCCESS
}

static TOOLS_RUNTIME_CALLBACK_HOOKS: Table<7> = Table([
    size::<7>(),
    returns_zero as *const c_void,
    hook_buffer_1 as *const c_void,
    returns_zero as *const c_void,
    returns_zero as *const c_void,
    returns_zero as *const c_void,
    hook_buffer_2 as *const c_void,
]);

// ---- CONTEXT_LOCAL_STORAGE: the runtime's per-context state, kept here.

type Dtor = unsafe extern "C" fn(ctx: *mut c_void, key: *mut c_void, value: *mut c_void);

/// `(context, key)`.
type Slot = (u64, usize);
/// `(value, destructor)`; values are client pointers.
type Stored = (usize, Option<Dtor>);

static STORAGE: Mutex<Option<HashMap<Slot, Stored>>> = Mutex::new(None);
/// Changes made to [`STORAGE`], counted: a thread's remembered answer
/// holds while the count has not moved.
static STORAGE_CHANGES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The last slot this thread read, its value and the count then: the
    /// runtime reads the same slot at the start of each of its calls.
    static LAST_READ: Cell<Option<(u64, Slot, usize)>> = const { Cell::new(None) };
}

fn with_storage<T>(f: impl FnOnce(&mut HashMap<Slot, Stored>) -> T) -> T {
    f(STORAGE.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert_with(HashMap::new))
}

/// [`with_storage`] for a change: counted before it is made, under the
/// lock, so that no thread reads the old value as current afterwards.
fn change_storage<T>(f: impl FnOnce(&mut HashMap<Slot, Stored>) -> T) -> T {
    with_storage(|s| {
        STORAGE_CHANGES.fetch_add(1, Ordering::AcqRel);
        f(s)
    })
}

/// The value in `slot`, if any.
fn read_storage(slot: Slot) -> Option<usize> {
    let changes = STORAGE_CHANGES.load(Ordering::Acquire);
    if let Some((seen, last, value)) = LAST_READ.get() {
        if seen == changes && last == slot {
            return Some(value);
        }
    }
    let value = with_storage(|s| s.get(&slot).map(|e| e.0))?;
    LAST_READ.set(Some((changes, slot, value)));
    Some(value)
}

/// NULL and -1 name the calling thread's current context.
fn storage_ctx(ctx: *mut c_void) -> u64 {
    match ctx as usize {
        0 | usize::MAX => context::current(),
        c => c as u64,
    }
}

unsafe extern "C" fn storage_put(
    ctx: *mut c_void,
    key: *mut c_void,
    value: *mut c_void,
    dtor: Option<Dtor>,
) -> CUresult {
    let ctx = storage_ctx(ctx);
    if ctx == 0 {
        return CuError::INVALID_CONTEXT.0;
    }
    change_storage(|s| s.insert((ctx, key as usize), (value as usize, dtor)));
    CUDA_SUCCESS
}

unsafe extern "C" fn storage_delete(ctx: *mut c_void, key: *mut c_void) -> CUresult {
    let ctx = storage_ctx(ctx);
    change_storage(|s| s.remove(&(ctx, key as usize)));
    CUDA_SUCCESS
}

unsafe extern "C" fn storage_get(value: *mut *mut c_void, ctx: *mut c_void, key: *mut c_void) -> CUresult {
    let ctx = storage_ctx(ctx);
    // A miss is how the runtime learns that it must set the context up.
    match read_storage((ctx, key as usize)) {
        Some(v) if !value.is_null() => {
            // SAFETY: checked non-NULL; the runtime passes a valid pointer.
            unsafe { value.write(v as *mut c_void) };
            CUDA_SUCCESS
        }
        Some(_) => CuError::INVALID_VALUE.0,
        None => CuError::INVALID_HANDLE.0,
    }
}

/// Runs the destructors stored for a context that was destroyed, reset or
/// released to zero, and forgets its entries.
pub fn context_gone(ctx: u64) {
    let dead: Vec<(Slot, Stored)> = change_storage(|s| {
        let keys: Vec<Slot> = s.keys().filter(|k| k.0 == ctx).copied().collect();
        keys.into_iter().filter_map(|k| s.remove(&k).map(|v| (k, v))).collect()
    });
    for ((ctx, key), (value, dtor)) in dead {
        if let Some(dtor) = dtor {
            // SAFETY: the runtime registered this destructor for this entry.
            unsafe { dtor(ctx as *mut c_void, key as *mut c_void, value as *mut c_void) };
        }
    }
}

/// No size slot: four functions.
static CONTEXT_LOCAL_STORAGE: Table<4> = Table([
    storage_put as *const c_void,
    storage_delete as *const c_void,
    storage_get as *const c_void,
    unknown_slot::<1, 3> as *const c_void,
]);

// ---- Interfaces whose functions gpuplex does not offer.

static CTX_CREATE_BYPASS: Table<2> = Table([size::<2>(), unknown_slot::<2, 1> as *const c_void]);

// ---- DEVICE_EXTENDED_RT.

/// [5]: an attribute, as `result[0]`.
unsafe extern "C" fn device_attribute_ext(
    dev: i32,
    attribute: u32,
    _unknown: i32,
    result: *mut [usize; 2],
) -> CUresult {
    let mut value = 0i32;
    // SAFETY: a valid out-pointer to a local.
    let rc = unsafe { crate::device::cuDeviceGetAttribute(&mut value, attribute as i32, dev) };
    if rc == CUDA_SUCCESS && !result.is_null() {
        // SAFETY: checked non-NULL; the runtime passes a valid pointer.
        unsafe { result.write([value as usize, 0]) };
    }
    rc
}

/// [13]: a per-device flag that reads 0.
unsafe extern "C" fn device_flag(out: *mut u8, _dev: i32) -> CUresult {
    // SAFETY: NULL is skipped; otherwise the runtime passes a valid pointer.
    unsafe { crate::ffi::write_out(out, 0) };
    CUDA_SUCCESS
}

macro_rules! slots {
    ($table:literal; $($slot:literal)*) => { [$(unknown_slot::<$table, $slot> as *const c_void),*] };
}

static DEVICE_EXTENDED_RT: Table<31> = {
    let mut t: [*const c_void; 31] =
        slots!(3; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30);
    t[0] = size::<31>();
    // NULL in the real driver too.
    t[30] = null();
    t[5] = device_attribute_ext as *const c_void;
    t[13] = device_flag as *const c_void;
    Table(t)
};

// ---- CONTEXT_CHECKS.

/// [2]: reports a context as ordinary (no special bits set).
unsafe extern "C" fn context_check(_ctx: *mut c_void, result: *mut u32, _extra: *mut *const c_void) -> CUresult {
    // SAFETY: NULL is skipped; otherwise the runtime passes a valid pointer.
    unsafe { crate::ffi::write_out(result, 0) };
    CUDA_SUCCESS
}

static CONTEXT_CHECKS: Table<15> = {
    let mut t: [*const c_void; 15] = slots!(5; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14);
    t[0] = size::<15>();
    t[2] = context_check as *const c_void;
    t[3] = returns_zero as *const c_void;
    Table(t)
};

// ---- TOOLS_CONTEXT (21318c60...): asked for by cuBLAS and cuFFT.

/// [4]: whether a context is valid, as 0 or 1 in `*out`.
unsafe extern "C" fn tools_context_is_valid(ctx: *mut c_void, out: *mut u64) -> CUresult {
    if out.is_null() {
        return CuError::UNKNOWN.0;
    }
    // SAFETY: checked non-NULL; the caller passes a valid pointer.
    unsafe { out.write(!ctx.is_null() as u64) };
    CUDA_SUCCESS
}

/// [39]: a per-context value that reads 0.
unsafe extern "C" fn tools_context_zero(_: *mut c_void, key: *mut c_void, out: *mut u64) -> CUresult {
    if key.is_null() || out.is_null() {
        return CuError::INVALID_VALUE.0;
    }
    // SAFETY: checked non-NULL; the caller passes a valid pointer.
    unsafe { out.write(0) };
    CUDA_SUCCESS
}

/// Zeroed memory handed out as an opaque driver object.
static mut OPAQUE_OBJECT: [u64; 64] = [0; 64];

/// [51]: an opaque object for a handle; -1 is an invalid handle.
unsafe extern "C" fn tools_context_object(_: *mut c_void, handle: u64, out: *mut *mut c_void) -> CUresult {
    if out.is_null() {
        return CuError::INVALID_VALUE.0;
    }
    if handle == u64::MAX {
        return CuError::INVALID_HANDLE.0;
    }
    // SAFETY: checked non-NULL; the object is static.
    unsafe { out.write((&raw mut OPAQUE_OBJECT).cast()) };
    CUDA_SUCCESS
}

static TOOLS_CONTEXT: Table<93> = {
    let mut t: [*const c_void; 93] = slots!(6; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27
        28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64
        65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92);
    t[0] = size::<93>();
    t[4] = tools_context_is_valid as *const c_void;
    t[39] = tools_context_zero as *const c_void;
    t[51] = tools_context_object as *const c_void;
    // NULL in the real driver too.
    t[91] = null();
    Table(t)
};

// ---- TOOLS_MODULE (6e163fbe...): per-module and per-function queries for
// tools (NVIDIA's cuxtra names it `CU_ETID_ToolsModule`). cuFFT takes it, with
// TOOLS_CONTEXT, when it first loads the driver, and fails every plan
// (CUFFT_INTERNAL_ERROR) if either is missing. cuFFT 12.0 (CUDA 13.0) calls
// only slot 7; the runtime and cuBLAS do not ask for this table.

/// What [7] calls for each function of a module.
type FunctionVisitor = unsafe extern "C" fn(user: *mut c_void, function: *mut c_void);

/// [7]: `(context, module, visit, user)` calls `visit(user, function)` for
/// the functions of `module`. cuFFT loads its kernels with
/// `cuModuleLoadData` and, for a kernel it has no name for, takes the one
/// function this reports; it treats the answer 1 (not 0) as success and
/// needs the slot to exist (the table's size above 0x37).
///
/// The functions come from the server (`ModuleFunctions`, the same handles
/// cuModuleGetFunction gives). `context` is not checked: a module belongs to
/// the one context it was loaded in and the server answers from that one,
/// so the driver presumably has no use for it either (cuFFT passes the
/// current context). The answer is 1 after visiting every function (also
/// for a module without any: 1 reads as success, and cuFFT's modules have
/// exactly one, so "success" and "count visited" agree there). Since
/// CUDA_ERROR_INVALID_VALUE is also 1, no failure may answer 1: bad
/// arguments answer CUDA_ERROR_INVALID_HANDLE, and an INVALID_VALUE from the
/// server is answered as CUDA_ERROR_UNKNOWN.
unsafe extern "C" fn module_functions(
    ctx: *mut c_void,
    module: *mut c_void,
    visit: Option<FunctionVisitor>,
    user: *mut c_void,
) -> CUresult {
    let args = [ctx as u64, module as u64, visit.map_or(0, |f| f as usize as u64), user as u64];
    let args: Vec<String> = args.iter().map(|a| format!("{a:#x}")).collect();
    log::debug(&format!("{}[7]({})", NAMES[TOOLS_MODULE], args.join(", ")));
    let rc = entry("TOOLS_MODULE[7]", || {
        let visit = visit.ok_or(CuError::INVALID_HANDLE)?;
        let funcs = module::functions(module)?;
        log::debug(&format!("{}[7]: {} functions", NAMES[TOOLS_MODULE], funcs.len()));
        for f in funcs {
            // SAFETY: the caller's visitor, with the caller's `user`, as the
            // driver calls it.
            unsafe { visit(user, f) };
        }
        Ok(())
    });
    tools_module_answer(rc)
}

/// [7]'s answer for `rc`: 1 for success, never 1 for a failure.
fn tools_module_answer(rc: CUresult) -> CUresult {
    match rc {
        CUDA_SUCCESS => 1,
        rc if rc == CuError::INVALID_VALUE.0 => CuError::UNKNOWN.0,
        rc => rc,
    }
}

/// 99 slots; slot 93 is NULL in the real driver too.
static TOOLS_MODULE_TABLE: Table<99> = {
    let mut t: [*const c_void; 99] = slots!(7; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27
        28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64
        65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94 95 96 97 98);
    t[0] = size::<99>();
    t[7] = module_functions as *const c_void;
    t[93] = null();
    Table(t)
};

// ---- ERROR_LOG (f8cff951...): the CUDA 13 runtime (libcudart 13.0 and the
// copy inside cuBLAS 13.0) takes this table at start-up and, if it gets it,
// hands slot 1 each error message it would otherwise keep to itself ("%s
// cannot be NULL", "Insufficient driver: %d < %d", ...), presumably for the
// driver's error log (`cuLogs*`). It calls nothing else here.

#[cfg(target_arch = "x86_64")]
extern "C" {
    /// libc's; on x86-64 a `va_list` argument is a pointer to the caller's list.
    fn vsnprintf(buf: *mut c_char, len: usize, format: *const c_char, args: *mut c_void) -> std::ffi::c_int;
}

/// [1]: `(component, level, printf format, va_list)`: one message, logged
/// at info level. The runtime ignores the result.
unsafe extern "C" fn runtime_message(
    component: *const c_char,
    level: i32,
    format: *const c_char,
    args: *mut c_void,
) -> CUresult {
    entry("ERROR_LOG[1]", || {
        if format.is_null() {
            return Err(CuError::INVALID_VALUE);
        }
        let component = if component.is_null() {
            "CUDA".into()
        } else {
            // SAFETY: the runtime passes a NUL-terminated name.
            unsafe { CStr::from_ptr(component) }.to_string_lossy()
        };
        // SAFETY: the runtime's format and the list of its arguments.
        let text = unsafe { format_message(format, args) };
        log::info(&format!("{component} (level {level}): {text}"));
        Ok(())
    })
}

/// A printf format and a `va_list` of its arguments, formatted (cut at
/// 1 KiB). Elsewhere than x86-64 the format stays unformatted.
///
/// # Safety
/// `format` is a NUL-terminated printf format; `args` points at a
/// `va_list` holding its arguments.
unsafe fn format_message(format: *const c_char, args: *mut c_void) -> String {
    #[cfg(target_arch = "x86_64")]
    {
        let mut buf = [0u8; 1024];
        // SAFETY: `buf` holds `len` bytes; format and arguments per the contract.
        unsafe { vsnprintf(buf.as_mut_ptr().cast(), buf.len(), format, args) };
        CStr::from_bytes_until_nul(&buf).map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = args;
        // SAFETY: NUL-terminated per the contract.
        unsafe { CStr::from_ptr(format) }.to_string_lossy().into_owned()
    }
}

static ERROR_LOG: Table<3> =
    Table([size::<3>(), runtime_message as *const c_void, unknown_slot::<8, 2> as *const c_void]);

// ---- INTEGRITY_CHECK: the runtime verifies it talks to a real driver.

/// [1]: answers the runtime's challenge (`version`, time) with the value
/// the real driver computes: HMAC-MD2 over the driver version, challenge,
/// caller identity, table addresses and the devices' identities.
unsafe extern "C" fn integrity_check(version: u32, unix_seconds: u64, out: *mut [u64; 2]) -> CUresult {
    entry("INTEGRITY_CHECK[1]", || {
        crate::ffi::check_out(out)?;
        let answer = integrity_answer(version, unix_seconds)?;
        // SAFETY: checked non-NULL; the runtime passes a valid pointer.
        unsafe { out.write(answer) };
        Ok(())
    })
}

const INTEGRITY_KEY: [u8; 16] = id("146addae53a9a752aa0841360bf55a9f");

fn integrity_answer(version: u32, unix_seconds: u64) -> Result<[u64; 2], CuError> {
    match version % 10 {
        0 => return Ok([0x3341181C03CB675C, 0x8ED383AA1F4CD1E8]),
        1 => return Ok([0x1841181C03CB675C, 0x8ED383AA1F4CD1E8]),
        _ => {}
    }
    let welcome = &client::connection()?.welcome;
    let mut message = Vec::with_capacity(48 + 28 * welcome.devices.0.len());
    message.extend_from_slice(&(welcome.driver_version as u32).to_le_bytes());
    message.extend_from_slice(&version.to_le_bytes());
    message.extend_from_slice(&std::process::id().to_le_bytes());
    // SAFETY: pthread_self has no preconditions.
    message.extend_from_slice(&(unsafe { libc::pthread_self() } as u32).to_le_bytes());
    message.extend_from_slice(&(CUDART_INTERFACE.start() as u64).to_le_bytes());
    message.extend_from_slice(&(INTEGRITY_CHECK.start() as u64).to_le_bytes());
    message.extend_from_slice(&(INTEGRITY_CHECK.0[1] as u64).to_le_bytes());
    message.extend_from_slice(&unix_seconds.to_le_bytes());
    for d in &welcome.devices.0 {
        message.extend_from_slice(&d.uuid);
        // PCI domain, bus and device: attributes 50, 33, 34.
        for id in [50, 33, 34] {
            let value = d.attributes.0.get(id).map_or(0, |a| a.value);
            message.extend_from_slice(&value.to_le_bytes());
        }
    }
    Ok(hmac_md2(&message))
}

fn hmac_md2(message: &[u8]) -> [u64; 2] {
    let mut mac = hmac::SimpleHmac::<md2::Md2>::new_from_slice(&INTEGRITY_KEY).expect("HMAC takes any key length");
    mac.update(message);
    let digest = mac.finalize().into_bytes();
    let half = |i: usize| u64::from_le_bytes(digest[i..i + 8].try_into().expect("16-byte digest"));
    [half(0), half(8)]
}

static INTEGRITY_CHECK: Table<3> =
    Table([size::<3>(), integrity_check as *const c_void, unknown_slot::<4, 2> as *const c_void]);

/// The table with this id.
fn table(id: &[u8; 16]) -> Option<*const c_void> {
    Some(match *id {
        CUDART_INTERFACE_ID => CUDART_INTERFACE.start(),
        TOOLS_TLS_ID => TOOLS_TLS.start(),
        TOOLS_RUNTIME_CALLBACK_HOOKS_ID => TOOLS_RUNTIME_CALLBACK_HOOKS.start(),
        CONTEXT_LOCAL_STORAGE_ID => CONTEXT_LOCAL_STORAGE.start(),
        CTX_CREATE_BYPASS_ID => CTX_CREATE_BYPASS.start(),
        DEVICE_EXTENDED_RT_ID => DEVICE_EXTENDED_RT.start(),
        INTEGRITY_CHECK_ID => INTEGRITY_CHECK.start(),
        CONTEXT_CHECKS_ID => CONTEXT_CHECKS.start(),
        TOOLS_CONTEXT_ID => TOOLS_CONTEXT.start(),
        TOOLS_MODULE_ID => TOOLS_MODULE_TABLE.start(),
        ERROR_LOG_ID => ERROR_LOG.start(),
        _ => return None,
    })
}

/// # Safety
/// `out` is valid for a write; `id` points at 16 bytes.
#[no_mangle]
pub unsafe extern "C" fn cuGetExportTable(out: *mut *const c_void, id: *const [u8; 16]) -> CUresult {
    entry("cuGetExportTable", || {
        crate::ffi::check_out(out)?;
        // SAFETY: NULL or valid, per the contract.
        let id = unsafe { id.as_ref() }.ok_or(CuError::INVALID_VALUE)?;
        let Some(t) = table(id) else {
            let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
            log::warn(&format!("cuGetExportTable: unknown table {hex}"));
            return Err(CuError::INVALID_VALUE);
        };
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { crate::ffi::write_out(out, t) };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse_in_memory_order() {
        assert_eq!(CUDART_INTERFACE_ID[0], 0x6b);
        assert_eq!(CUDART_INTERFACE_ID[15], 0xf9);
    }

    #[test]
    fn tables_have_the_real_driver_s_sizes() {
        // data/export_tables.tsv: id, status, slot 0, which slots are non-NULL.
        for line in include_str!("../data/export_tables.tsv").lines() {
            let f: Vec<&str> = line.split('\t').collect();
            let ours = table(&id_of(f[0]));
            if f[1] != "0" {
                assert!(ours.is_none(), "{}: the real driver has no such table", f[0]);
                continue;
            }
            let Some(ours) = ours else { continue };
            if id_of(f[0]) == CONTEXT_LOCAL_STORAGE_ID {
                continue; // No size slot.
            }
            // SAFETY: our tables are at least one slot long.
            let size = unsafe { *ours.cast::<usize>() };
            assert_eq!(size.to_string(), f[2], "{}", f[0]);
            // SAFETY: `size` bytes of slots.
            let slots = unsafe { std::slice::from_raw_parts(ours.cast::<usize>(), size / 8) };
            let nonnull: String = slots.iter().map(|&p| if p != 0 { '1' } else { '0' }).collect();
            assert_eq!(nonnull, f[3][..nonnull.len()], "{}: NULL slots", f[0]);
        }
    }

    fn id_of(hex: &str) -> [u8; 16] {
        let mut out = [0u8; 16];
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
        }
        out
    }

    #[test]
    fn hmac_md2_matches_the_rfc_construction() {
        // HMAC-MD2 with a 16-byte key and the empty message, computed from
        // the RFC 1319 and RFC 2104 definitions independently of the crates:
        // MD2((K ^ opad) || MD2(K ^ ipad)).
        fn md2(data: &[u8]) -> [u8; 16] {
            use md2::Digest;
            md2::Md2::digest(data).into()
        }
        let inner: Vec<u8> = INTEGRITY_KEY.iter().map(|b| b ^ 0x36).collect();
        let mut outer: Vec<u8> = INTEGRITY_KEY.iter().map(|b| b ^ 0x5c).collect();
        outer.extend_from_slice(&md2(&inner));
        let expected = md2(&outer);
        let got = hmac_md2(&[]);
        assert_eq!(got[0].to_le_bytes(), expected[..8]);
        assert_eq!(got[1].to_le_bytes(), expected[8..]);
    }

    #[test]
    fn cufft_finds_slot_7_of_tools_module() {
        // cuFFT refuses the table unless its size reaches past slot 7.
        let t = table(&TOOLS_MODULE_ID).expect("served");
        // SAFETY: the table has 99 slots.
        let (size, slot7) = unsafe { (*t.cast::<usize>(), *t.cast::<usize>().add(7)) };
        assert!(size > 0x37);
        assert_eq!(slot7, module_functions as *const () as usize);
    }

    static VISITED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    unsafe extern "C" fn count_visit(_: *mut c_void, _: *mut c_void) {
        VISITED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    #[test]
    fn module_functions_refuses_bad_arguments_without_visiting() {
        let mut out: *mut c_void = std::ptr::null_mut();
        let user: *mut c_void = (&raw mut out).cast();
        let ctx = 0x10 as *mut c_void;
        // SAFETY: the arguments are as cuFFT passes them; nothing is dereferenced.
        let (no_module, no_visitor) = unsafe {
            (
                module_functions(ctx, std::ptr::null_mut(), Some(count_visit), user),
                module_functions(ctx, 0x20 as *mut c_void, None, user),
            )
        };
        // Never 1, which cuFFT takes for success; nothing was sent.
        assert_eq!(no_module, CuError::INVALID_HANDLE.0);
        assert_eq!(no_visitor, CuError::INVALID_HANDLE.0);
        assert_eq!(VISITED.load(std::sync::atomic::Ordering::SeqCst), 0);
    }

    #[test]
    fn module_functions_answers_1_only_for_success() {
        assert_eq!(tools_module_answer(CUDA_SUCCESS), 1);
        assert_eq!(tools_module_answer(CuError::INVALID_VALUE.0), CuError::UNKNOWN.0);
        assert_eq!(tools_module_answer(CuError::INVALID_HANDLE.0), CuError::INVALID_HANDLE.0);
    }

    /// A System V x86-64 `va_list` whose register areas are used up, so
    /// that every argument comes from `stack`.
    #[cfg(target_arch = "x86_64")]
    #[repr(C)]
    struct VaList {
        gp_offset: u32,
        fp_offset: u32,
        overflow_arg_area: *mut u64,
        reg_save_area: *mut c_void,
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn runtime_messages_are_formatted() {
        let what = c"driver";
        let mut stack: [u64; 3] = [what.as_ptr() as u64, 12090, 13000];
        let mut list = VaList {
            gp_offset: 48,
            fp_offset: 304,
            overflow_arg_area: stack.as_mut_ptr(),
            reg_save_area: std::ptr::null_mut(),
        };
        // SAFETY: a format and a list holding its three arguments.
        let text = unsafe { format_message(c"Insufficient %s: %d < %d".as_ptr(), (&raw mut list).cast()) };
        assert_eq!(text, "Insufficient driver: 12090 < 13000");
        // SAFETY: as above.
        let rc = unsafe { runtime_message(c"CUDA".as_ptr(), 0, c"plain".as_ptr(), (&raw mut list).cast()) };
        assert_eq!(rc, CUDA_SUCCESS);
    }

    #[test]
    fn local_storage_misses_then_hits_then_destructs() {
        static DESTROYED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        unsafe extern "C" fn dtor(_: *mut c_void, _: *mut c_void, value: *mut c_void) {
            DESTROYED.store(value as usize, std::sync::atomic::Ordering::SeqCst);
        }
        let (ctx, key) = (0x5550 as *mut c_void, 0x77 as *mut c_void);
        let mut v: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid pointers throughout.
        unsafe {
            assert_eq!(storage_get(&mut v, ctx, key), CuError::INVALID_HANDLE.0);
            assert_eq!(storage_put(ctx, key, 0x1234 as *mut c_void, Some(dtor)), 0);
            assert_eq!(storage_get(&mut v, ctx, key), 0);
        }
        assert_eq!(v as usize, 0x1234);
        context_gone(0x5550);
        assert_eq!(DESTROYED.load(std::sync::atomic::Ordering::SeqCst), 0x1234);
        // SAFETY: as above.
        assert_eq!(unsafe { storage_get(&mut v, ctx, key) }, CuError::INVALID_HANDLE.0);
    }

    #[test]
    fn a_value_read_again_is_the_one_stored_last_by_any_thread() {
        let (ctx, key) = (0x6660usize, 0x88usize);
        let get = || {
            let mut v: *mut c_void = std::ptr::null_mut();
            // SAFETY: a valid out-pointer; any context and key may be asked for.
            let rc = unsafe { storage_get(&mut v, ctx as *mut c_void, key as *mut c_void) };
            (rc == CUDA_SUCCESS).then_some(v as usize)
        };
        let put = move |value: usize| {
            // SAFETY: no destructor; any value may be stored.
            unsafe { storage_put(ctx as *mut c_void, key as *mut c_void, value as *mut c_void, None) }
        };
        assert_eq!(put(1), CUDA_SUCCESS);
        assert_eq!((get(), get()), (Some(1), Some(1)), "read twice, the second from this thread's memory");
        std::thread::spawn(move || assert_eq!(put(2), CUDA_SUCCESS)).join().unwrap();
        assert_eq!(get(), Some(2), "another thread's change is seen");
        // SAFETY: a context and key as above.
        std::thread::spawn(move || unsafe { storage_delete(ctx as *mut c_void, key as *mut c_void) }).join().unwrap();
        assert_eq!(get(), None, "another thread's delete is seen");
    }
}
