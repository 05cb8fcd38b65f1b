//! Module and library loading.
//!
//! The driver takes images by pointer with no length, so the client works
//! the length out from the image's own headers (fatbin, ELF cubin, or
//! NUL-terminated PTX) and sends the image; the server never reads client
//! memory. A fatbin goes without the entries for GPUs the session does not
//! have.

use std::collections::HashSet;
use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use gpuplex_image::{ELF_MAGIC, FATBIN_MAGIC, FATBIN_WRAPPER_MAGIC};
use gpuplex_protocol::{calls, image_digest, CuError, DevPtr, Library, Module, MAX_PAYLOAD};

use crate::client;
use crate::ffi::{c_name, check_out, entry, write_out, CUresult};

/// The largest image sent (it must fit one frame with room to spare).
const MAX_IMAGE: usize = MAX_PAYLOAD - 4096;

/// Reads a little-endian integer at `p + offset`.
///
/// # Safety
/// `p + offset .. + N` is readable.
unsafe fn read<const N: usize>(p: *const u8, offset: usize) -> [u8; N] {
    let mut out = [0u8; N];
    // SAFETY: readable per the contract.
    unsafe { std::ptr::copy_nonoverlapping(p.add(offset), out.as_mut_ptr(), N) };
    out
}

/// The bytes of an image handed to a load function.
///
/// # Safety
/// `image` points at a complete image of one of the kinds the driver
/// accepts, as the CUDA API requires.
pub unsafe fn image_bytes<'a>(image: *const c_void) -> Result<&'a [u8], CuError> {
    if image.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    let p = image.cast::<u8>();
    // SAFETY: every image kind starts with at least 4 readable bytes.
    let magic = u32::from_le_bytes(unsafe { read(p, 0) });
    let len = match magic {
        FATBIN_WRAPPER_MAGIC => {
            // { u32 magic, u32 version, const u64 *data, void *filename }
            // SAFETY: a wrapper is 24 bytes.
            let data = u64::from_le_bytes(unsafe { read(p, 8) });
            // SAFETY: the wrapper points at its fatbin.
            return unsafe { image_bytes(data as *const c_void) };
        }
        // SAFETY: a fatbin begins with its header.
        FATBIN_MAGIC => gpuplex_image::fatbin_len(&unsafe { read(p, 0) }).ok_or(CuError::INVALID_IMAGE)?,
        m if m.to_le_bytes() == ELF_MAGIC => {
            // SAFETY: an ELF image begins with its header, and its section
            // headers lie where it says.
            unsafe { gpuplex_image::elf_len(&read(p, 0), |at| Some(read(p, usize::try_from(at).ok()?))) }
                .map_err(|_| CuError::INVALID_IMAGE)?
        }
        // SAFETY: anything else must be NUL-terminated PTX text.
        _ => (unsafe { std::ffi::CStr::from_ptr(p.cast::<c_char>()) }.to_bytes().len() + 1) as u64,
    };
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    if len > MAX_IMAGE {
        crate::log::warn(&format!("a {len}-byte module image exceeds gpuplex's {MAX_IMAGE}-byte limit"));
        return Err(CuError::INVALID_IMAGE);
    }
    // SAFETY: the image's own headers say it spans `len` bytes.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// Digests of the images this process has sent to its session.
static SENT: Mutex<Option<HashSet<u64>>> = Mutex::new(None);

/// Sends an image once per session: later loads of the same bytes name it
/// by digest. `send` makes the call from `(digest, image or empty)`, the
/// request's image left empty and the bytes sent after it.
fn send_image<T>(image: &[u8], send: impl Fn(u64, &[u8]) -> Result<T, CuError>) -> Result<T, CuError> {
    let pruned = for_session_devices(image)?;
    let image = pruned.as_deref().unwrap_or(image);
    let digest = image_digest(image);
    let sent = SENT.lock().unwrap_or_else(PoisonError::into_inner).as_ref().is_some_and(|s| s.contains(&digest));
    if sent {
        match send(digest, &[]) {
            // The server let it go (its cache is bounded): send it again.
            Err(CuError::NOT_FOUND) => {}
            other => return other,
        }
    }
    let reply = send(digest, image)?;
    SENT.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert_with(HashSet::new).insert(digest);
    Ok(reply)
}

/// A fatbin without the entries no device of the session could run
/// (libraries such as cuBLAS carry code for six GPU generations, most of
/// their bytes); `None` to send `image` as it is.
fn for_session_devices(image: &[u8]) -> Result<Option<Vec<u8>>, CuError> {
    if !image.starts_with(&FATBIN_MAGIC.to_le_bytes()) {
        return Ok(None);
    }
    let archs = crate::device::compute_capabilities()?;
    let pruned = gpuplex_image::fatbin_for(image, &archs);
    if let Some(p) = &pruned {
        crate::log::debug(&format!("a fatbin of {} bytes goes as {} for devices {archs:?}", image.len(), p.len()));
    }
    Ok(pruned)
}

fn load_module(module: *mut *mut c_void, image: &[u8]) -> Result<(), CuError> {
    check_out(module)?;
    let reply = send_image(image, |digest, image| {
        client::lock()?.call_with_bytes(calls::ModuleLoad::Request { digest, image: Vec::new() }, image)
    })?;
    // SAFETY: checked non-NULL; the caller vouches for it.
    unsafe { write_out(module, reply.module.0 as *mut c_void) };
    Ok(())
}

fn load_library(library: *mut *mut c_void, image: &[u8]) -> Result<(), CuError> {
    check_out(library)?;
    let reply = send_image(image, |digest, image| {
        client::lock()?.call_with_bytes(calls::LibraryLoad::Request { digest, image: Vec::new() }, image)
    })?;
    // SAFETY: checked non-NULL; the caller vouches for it.
    unsafe { write_out(library, reply.library.0 as *mut c_void) };
    Ok(())
}

/// The bytes of the file named by a C string: a module image or a link input.
pub(crate) fn read_file(name: *const c_char) -> Result<Vec<u8>, CuError> {
    let path = c_name(name)?;
    std::fs::read(&path).map_err(|e| {
        crate::log::debug(&format!("cannot read {path}: {e}"));
        CuError::FILE_NOT_FOUND
    })
}

/// `CUjit_option`s that write results back to the caller.
const CU_JIT_WALL_TIME: i32 = 2;
const CU_JIT_INFO_LOG_BUFFER: i32 = 3;
const CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES: i32 = 4;
const CU_JIT_ERROR_LOG_BUFFER: i32 = 5;
const CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES: i32 = 6;

/// Answers JIT options locally: logs come back empty and the wall time as
/// zero. The server compiles with its defaults; the other options are
/// optimization hints that do not change what a correct program computes.
///
/// # Safety
/// `options` and `values` hold `n` entries each, as the CUDA API requires.
unsafe fn answer_jit_options(n: u32, options: *const i32, values: *mut *mut c_void) {
    if n == 0 || options.is_null() || values.is_null() {
        return;
    }
    for i in 0..n as usize {
        // SAFETY: `n` entries each, per the contract.
        let (option, value) = unsafe { (*options.add(i), values.add(i)) };
        // SAFETY: as above; buffers and sizes are the caller's.
        unsafe {
            match option {
                CU_JIT_INFO_LOG_BUFFER | CU_JIT_ERROR_LOG_BUFFER if !(*value).is_null() => {
                    (*value).cast::<u8>().write(0)
                }
                CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES | CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES => *value = std::ptr::null_mut(),
                CU_JIT_WALL_TIME => value.cast::<f32>().write(0.0),
                _ => {}
            }
        }
    }
}

/// # Safety
/// `image` is a complete image; `module` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut *mut c_void, image: *const c_void) -> CUresult {
    // SAFETY: per this function's contract.
    entry("cuModuleLoadData", || load_module(module, unsafe { image_bytes(image)? }))
}

/// # Safety
/// As `cuModuleLoadData`; `options`/`values` hold `n` entries.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    module: *mut *mut c_void,
    image: *const c_void,
    n: u32,
    options: *const i32,
    values: *mut *mut c_void,
) -> CUresult {
    entry("cuModuleLoadDataEx", || {
        // SAFETY: per this function's contract.
        load_module(module, unsafe { image_bytes(image)? })?;
        // SAFETY: per this function's contract.
        unsafe { answer_jit_options(n, options, values) };
        Ok(())
    })
}

/// # Safety
/// As `cuModuleLoadData`.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadFatBinary(module: *mut *mut c_void, fat_cubin: *const c_void) -> CUresult {
    // SAFETY: per this function's contract.
    entry("cuModuleLoadFatBinary", || load_module(module, unsafe { image_bytes(fat_cubin)? }))
}

/// # Safety
/// `fname` is a NUL-terminated path; `module` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoad(module: *mut *mut c_void, fname: *const c_char) -> CUresult {
    entry("cuModuleLoad", || load_module(module, &read_file(fname)?))
}

/// # Safety
/// `code` is a complete image; option arrays hold their counts.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadData(
    library: *mut *mut c_void,
    code: *const c_void,
    jit_options: *const i32,
    jit_values: *mut *mut c_void,
    num_jit: u32,
    _library_options: *const i32,
    _library_values: *mut *mut c_void,
    _num_library: u32,
) -> CUresult {
    entry("cuLibraryLoadData", || {
        // Library options (e.g. BINARY_IS_PRESERVED) only say how long the
        // caller keeps its copy; the server keeps its own.
        // SAFETY: per this function's contract.
        load_library(library, unsafe { image_bytes(code)? })?;
        // SAFETY: per this function's contract.
        unsafe { answer_jit_options(num_jit, jit_options, jit_values) };
        Ok(())
    })
}

/// # Safety
/// `file_name` is a NUL-terminated path; option arrays hold their counts.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadFromFile(
    library: *mut *mut c_void,
    file_name: *const c_char,
    jit_options: *const i32,
    jit_values: *mut *mut c_void,
    num_jit: u32,
    _library_options: *const i32,
    _library_values: *mut *mut c_void,
    _num_library: u32,
) -> CUresult {
    entry("cuLibraryLoadFromFile", || {
        load_library(library, &read_file(file_name)?)?;
        // SAFETY: per this function's contract.
        unsafe { answer_jit_options(num_jit, jit_options, jit_values) };
        Ok(())
    })
}

/// Writes a global's address and size through whichever pointer is not NULL.
fn write_global(dptr: *mut u64, bytes: *mut usize, reply: (DevPtr, u64)) -> Result<(), CuError> {
    // SAFETY: NULL is skipped; otherwise the caller vouches for the pointers.
    unsafe {
        write_out(dptr, reply.0 .0);
        write_out(bytes, reply.1 as usize);
    }
    Ok(())
}

/// The functions of module `hmod`, as the handles cuModuleGetFunction
/// gives them; a NULL module is CUDA_ERROR_INVALID_HANDLE, as the driver has
/// it.
pub fn functions(hmod: *mut c_void) -> Result<Vec<*mut c_void>, CuError> {
    if hmod.is_null() {
        return Err(CuError::INVALID_HANDLE);
    }
    let r = client::call(calls::ModuleFunctions::Request { hmod: Module(hmod as u64) })?;
    let group = crate::memo::group_of(hmod as u64);
    for &f in &r.funcs.0 {
        crate::memo::adopt(f, group);
    }
    Ok(r.funcs.0.into_iter().map(|f| f as usize as *mut c_void).collect())
}

/// Writes up to `max` of `funcs` to `out`; the driver takes `max` as the
/// room in the buffer, not a count that must match.
///
/// # Safety
/// `out` is valid for `max` writes.
unsafe fn write_functions(out: *mut *mut c_void, max: u32, funcs: &[*mut c_void]) {
    for (i, &f) in funcs.iter().take(max as usize).enumerate() {
        // SAFETY: `i < max`, room the caller vouches for.
        unsafe { out.add(i).write(f) };
    }
}

/// # Safety
/// `functions` is NULL or valid for `num_functions` writes.
#[no_mangle]
pub unsafe extern "C" fn cuModuleEnumerateFunctions(
    functions: *mut *mut c_void,
    num_functions: u32,
    hmod: *mut c_void,
) -> CUresult {
    entry("cuModuleEnumerateFunctions", || {
        check_out(functions)?;
        let funcs = self::functions(hmod)?;
        // SAFETY: checked non-NULL; room for `num_functions`, per the contract.
        unsafe { write_functions(functions, num_functions, &funcs) };
        Ok(())
    })
}

/// Either out-pointer may be NULL, not both, as the driver has it.
fn check_global_outs(dptr: *mut u64, bytes: *mut usize) -> Result<(), CuError> {
    if dptr.is_null() && bytes.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    Ok(())
}

/// # Safety
/// `dptr` and `bytes` are NULL or valid for writes; `name` is a C string.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetGlobal_v2(
    dptr: *mut u64,
    bytes: *mut usize,
    hmod: *mut c_void,
    name: *const c_char,
) -> CUresult {
    entry("cuModuleGetGlobal_v2", || {
        check_global_outs(dptr, bytes)?;
        let r = client::call(calls::ModuleGetGlobal::Request { hmod: Module(hmod as u64), name: c_name(name)? })?;
        write_global(dptr, bytes, (r.dptr, r.bytes))
    })
}

/// # Safety
/// `dptr` and `bytes` are NULL or valid for writes; `name` is a C string.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetGlobal(
    dptr: *mut u64,
    bytes: *mut usize,
    library: *mut c_void,
    name: *const c_char,
) -> CUresult {
    entry("cuLibraryGetGlobal", || {
        check_global_outs(dptr, bytes)?;
        let r =
            client::call(calls::LibraryGetGlobal::Request { library: Library(library as u64), name: c_name(name)? })?;
        write_global(dptr, bytes, (r.dptr, r.bytes))
    })
}

/// Libraries whose `__managed__` variables could not be mirrored (without
/// shared memory): gpuplex cannot give the program and the library's
/// kernels one copy of them, so those kernels are not launched
/// (`refused_launch`) rather than run on memory the program does not see.
static WITH_MANAGED_VARIABLES: Mutex<Vec<u64>> = Mutex::new(Vec::new());
/// Whether that list has ever held one: every launch asks, and almost no
/// program has any, so the answer costs one load instead of a lock.
static ANY_WITH_MANAGED_VARIABLES: AtomicBool = AtomicBool::new(false);

/// A `__managed__` variable: mirrored where memory is shared
/// (`memory::managed`). Otherwise the program gets a copy of its first
/// value in memory of its own, since the runtime goes on with whatever
/// pointer this gives (a failure here left it dereferencing nothing), and
/// the library's kernels are refused, so the copy is never mistaken for
/// what they see.
///
/// # Safety
/// `dptr` and `bytes` are NULL or valid for writes; `name` is a C string.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetManaged(
    dptr: *mut u64,
    bytes: *mut usize,
    library: *mut c_void,
    name: *const c_char,
) -> CUresult {
    entry("cuLibraryGetManaged", || {
        check_global_outs(dptr, bytes)?;
        if let Some(variable) = crate::memory::managed::variable(library as u64, c_name(name)?)? {
            return write_global(dptr, bytes, variable);
        }
        let req = calls::LibraryManagedValue::Request { library: Library(library as u64), name: c_name(name)? };
        let value = client::call(req)?.value;
        {
            let mut libraries = WITH_MANAGED_VARIABLES.lock().unwrap_or_else(PoisonError::into_inner);
            if !libraries.contains(&(library as u64)) {
                libraries.push(library as u64);
                ANY_WITH_MANAGED_VARIABLES.store(true, Ordering::Release);
                crate::log::warn(
                    "__managed__ variables are mirrored only for a local server (shared memory): the kernels of their module \
                     will not launch (CUDA_ERROR_NOT_SUPPORTED)",
                );
            }
        }
        let size = value.len() as u64;
        // Lives as long as the process: the runtime keeps the pointer.
        let copy = Box::leak(value.into_boxed_slice());
        write_global(dptr, bytes, (DevPtr(copy.as_mut_ptr() as u64), size))
    })
}

/// Why a launch of `func` is refused, if its library has `__managed__` variables.
pub fn refused_launch(func: u64) -> Option<CuError> {
    if !ANY_WITH_MANAGED_VARIABLES.load(Ordering::Acquire) {
        return None;
    }
    let libraries = WITH_MANAGED_VARIABLES.lock().unwrap_or_else(PoisonError::into_inner);
    libraries.contains(&crate::memo::group_of(func)).then_some(CuError::NOT_SUPPORTED)
}

/// Each function's name as this process was given it, kept (and its
/// address with it) for as long as the process runs, as the driver keeps
/// its own for as long as the module.
static NAMES: Mutex<Option<std::collections::HashMap<u64, std::ffi::CString>>> = Mutex::new(None);

/// `cuFuncGetName` and `cuKernelGetName`: a kernel handle names its function.
fn func_name(name: *mut *const c_char, func: *mut c_void) -> Result<(), CuError> {
    check_out(name)?;
    if func.is_null() {
        return Err(CuError::INVALID_HANDLE);
    }
    let mut names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    let names = names.get_or_insert_with(std::collections::HashMap::new);
    let text = match names.entry(func as u64) {
        std::collections::hash_map::Entry::Occupied(known) => known.into_mut(),
        std::collections::hash_map::Entry::Vacant(slot) => {
            let reply = client::call(calls::FuncName::Request { func: gpuplex_protocol::Func(func as u64) })?;
            slot.insert(std::ffi::CString::new(reply.name).map_err(|_| CuError::UNKNOWN)?)
        }
    };
    // SAFETY: checked non-NULL; the caller vouches for it. The string stays.
    unsafe { write_out(name, text.as_ptr()) };
    Ok(())
}

exports! {
    cuFuncGetName(name: *mut *const c_char, func: *mut c_void) => func_name(name, func);
    cuKernelGetName(name: *mut *const c_char, kernel: *mut c_void) => func_name(name, kernel);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enumerate_writes_no_more_than_the_room_given() {
        let funcs = [0x10 as *mut c_void, 0x20 as *mut c_void, 0x30 as *mut c_void];
        let mut out = [std::ptr::null_mut::<c_void>(); 4];
        // SAFETY: `out` has room for 4.
        unsafe { write_functions(out.as_mut_ptr(), 2, &funcs) };
        assert_eq!(out, [funcs[0], funcs[1], std::ptr::null_mut(), std::ptr::null_mut()]);
        // SAFETY: as above.
        unsafe { write_functions(out.as_mut_ptr(), 4, &funcs) };
        assert_eq!(out[..3], funcs);
        assert!(out[3].is_null());
    }

    #[test]
    fn enumerate_refuses_null_arguments_before_sending() {
        let mut out = [std::ptr::null_mut::<c_void>(); 1];
        // SAFETY: NULL or room for 1; nothing is sent for these.
        let (no_buffer, no_module) = unsafe {
            (
                cuModuleEnumerateFunctions(std::ptr::null_mut(), 1, 0x20 as *mut c_void),
                cuModuleEnumerateFunctions(out.as_mut_ptr(), 1, std::ptr::null_mut()),
            )
        };
        assert_eq!(no_buffer, CuError::INVALID_VALUE.0);
        assert_eq!(no_module, CuError::INVALID_HANDLE.0);
    }

    #[test]
    fn fatbin_length_comes_from_its_header() {
        let mut image = [0u8; 64];
        image[..4].copy_from_slice(&FATBIN_MAGIC.to_le_bytes());
        image[6..8].copy_from_slice(&16u16.to_le_bytes());
        image[8..16].copy_from_slice(&40u64.to_le_bytes());
        // SAFETY: the buffer holds the whole (56-byte) image.
        assert_eq!(unsafe { image_bytes(image.as_ptr().cast()) }.unwrap().len(), 56);
        let wrapper: [u64; 3] = [(FATBIN_WRAPPER_MAGIC as u64) | (1 << 32), image.as_ptr() as u64, 0];
        // SAFETY: the wrapper points at the image above.
        assert_eq!(unsafe { image_bytes(wrapper.as_ptr().cast()) }.unwrap().len(), 56);
    }

    #[test]
    fn ptx_length_includes_its_nul() {
        let ptx = b".version 8.0\n.target sm_90\0";
        // SAFETY: NUL-terminated.
        assert_eq!(unsafe { image_bytes(ptx.as_ptr().cast()) }.unwrap().len(), ptx.len());
    }

    #[test]
    fn elf_length_covers_headers_and_sections() {
        let mut elf = vec![0u8; 0x200];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[0x28..0x30].copy_from_slice(&0x100u64.to_le_bytes()); // shoff
        elf[0x3A..0x3C].copy_from_slice(&64u16.to_le_bytes());
        elf[0x3C..0x3E].copy_from_slice(&2u16.to_le_bytes());
        // Section 1: PROGBITS at 0x180, 0x80 bytes: ends at 0x200.
        let sh = 0x140;
        elf[sh + 4..sh + 8].copy_from_slice(&1u32.to_le_bytes());
        elf[sh + 0x18..sh + 0x20].copy_from_slice(&0x180u64.to_le_bytes());
        elf[sh + 0x20..sh + 0x28].copy_from_slice(&0x80u64.to_le_bytes());
        // SAFETY: the buffer holds all 0x200 bytes.
        assert_eq!(unsafe { image_bytes(elf.as_ptr().cast()) }.unwrap().len(), 0x200);
    }
}
