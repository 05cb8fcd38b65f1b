//! Initialization, versions, devices and error strings: all answered in the
//! client from the table the handshake brought back (or, for error strings,
//! from the driver's own table compiled in), so none of them costs a round
//! trip.

use std::ffi::{c_char, CStr, CString};
use std::sync::OnceLock;

use gpuplex_protocol::{CuError, DeviceInfo, CUDA_ERRORS, DEVICE_ATTRIBUTE_COUNT};

use crate::client;
use crate::ffi::{check_out, entry, write_out, CUresult};

/// `CU_DEVICE_ATTRIBUTE_*` ids used below.
const COMPUTE_CAPABILITY_MAJOR: usize = 75;
const COMPUTE_CAPABILITY_MINOR: usize = 76;

fn device(dev: i32) -> Result<&'static DeviceInfo, CuError> {
    let devices = &client::client()?.welcome.devices.0;
    usize::try_from(dev).ok().and_then(|d| devices.get(d)).ok_or(CuError::INVALID_DEVICE)
}

fn attribute(info: &DeviceInfo, id: usize) -> Result<i32, CuError> {
    let a = info.attributes.0.get(id).ok_or(CuError::INVALID_VALUE)?;
    CuError::check(a.status).map(|()| a.value)
}

/// A device's compute capability, `(major, minor)`.
fn capability(info: &DeviceInfo) -> Result<(i32, i32), CuError> {
    Ok((attribute(info, COMPUTE_CAPABILITY_MAJOR)?, attribute(info, COMPUTE_CAPABILITY_MINOR)?))
}

/// Every device's compute capability, as 90 for 9.0.
pub(crate) fn compute_capabilities() -> Result<Vec<u32>, CuError> {
    let devices = &client::client()?.welcome.devices.0;
    devices.iter().map(|d| capability(d).map(|(major, minor)| (major * 10 + minor) as u32)).collect()
}

/// Copies `s` into a caller's buffer of `len` bytes, truncating, always
/// NUL-terminated.
fn copy_c_string(s: &str, out: *mut c_char, len: i32) -> Result<(), CuError> {
    if out.is_null() || len <= 0 {
        return Err(CuError::INVALID_VALUE);
    }
    let n = s.len().min(len as usize - 1);
    // SAFETY: the caller's buffer holds `len` bytes; we write n + 1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), out, n);
        out.add(n).write(0);
    }
    Ok(())
}

/// # Safety
/// None beyond the CUDA API's.
#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: u32) -> CUresult {
    entry("cuInit", || if flags != 0 { Err(CuError::INVALID_VALUE) } else { client::init() })
}

/// # Safety
/// `version` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut i32) -> CUresult {
    entry("cuDriverGetVersion", || {
        check_out(version)?;
        // Answered before cuInit too, as the driver does: it reports the
        // server's driver, which is the one that runs the work.
        let v = client::connection()?.welcome.driver_version;
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(version, v) };
        Ok(())
    })
}

/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(out: *mut i32, ordinal: i32) -> CUresult {
    entry("cuDeviceGet", || {
        check_out(out)?;
        device(ordinal)?;
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(out, ordinal) };
        Ok(())
    })
}

/// # Safety
/// `count` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut i32) -> CUresult {
    entry("cuDeviceGetCount", || {
        check_out(count)?;
        let n = client::client()?.welcome.devices.0.len() as i32;
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(count, n) };
        Ok(())
    })
}

/// # Safety
/// `name` holds `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: i32, dev: i32) -> CUresult {
    entry("cuDeviceGetName", || copy_c_string(&device(dev)?.name, name, len))
}

fn uuid(out: *mut [u8; 16], dev: i32) -> Result<(), CuError> {
    check_out(out)?;
    let uuid = device(dev)?.uuid;
    // SAFETY: checked non-NULL; a CUuuid is 16 bytes.
    unsafe { write_out(out, uuid) };
    Ok(())
}

/// # Safety
/// `out` is valid for a 16-byte write.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(out: *mut [u8; 16], dev: i32) -> CUresult {
    entry("cuDeviceGetUuid", || uuid(out, dev))
}

/// # Safety
/// `out` is valid for a 16-byte write.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(out: *mut [u8; 16], dev: i32) -> CUresult {
    entry("cuDeviceGetUuid_v2", || uuid(out, dev))
}

/// # Safety
/// `bytes` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: i32) -> CUresult {
    entry("cuDeviceTotalMem_v2", || {
        check_out(bytes)?;
        let total = device(dev)?.total_mem as usize;
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(bytes, total) };
        Ok(())
    })
}

/// # Safety
/// `value` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(value: *mut i32, attrib: i32, dev: i32) -> CUresult {
    entry("cuDeviceGetAttribute", || {
        check_out(value)?;
        let info = device(dev)?;
        let id = usize::try_from(attrib)
            .ok()
            .filter(|&a| a < DEVICE_ATTRIBUTE_COUNT as usize)
            .ok_or(CuError::INVALID_VALUE)?;
        let v = attribute(info, id)?;
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(value, v) };
        Ok(())
    })
}

/// # Safety
/// `major` and `minor` are valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceComputeCapability(major: *mut i32, minor: *mut i32, dev: i32) -> CUresult {
    entry("cuDeviceComputeCapability", || {
        check_out(major)?;
        check_out(minor)?;
        let info = device(dev)?;
        let (ma, mi) = capability(info)?;
        // SAFETY: checked non-NULL; the caller vouches for them.
        unsafe {
            write_out(major, ma);
            write_out(minor, mi);
        }
        Ok(())
    })
}

/// `CUdevprop`, the pre-attribute device summary.
#[repr(C)]
pub struct DevProp {
    max_threads_per_block: i32,
    max_threads_dim: [i32; 3],
    max_grid_size: [i32; 3],
    shared_mem_per_block: i32,
    total_constant_memory: i32,
    simd_width: i32,
    mem_pitch: i32,
    regs_per_block: i32,
    clock_rate: i32,
    texture_align: i32,
}

/// # Safety
/// `prop` is valid for a write of a `CUdevprop`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetProperties(prop: *mut DevProp, dev: i32) -> CUresult {
    entry("cuDeviceGetProperties", || {
        check_out(prop)?;
        let info = device(dev)?;
        let a = |id| attribute(info, id);
        let p = DevProp {
            max_threads_per_block: a(1)?,
            max_threads_dim: [a(2)?, a(3)?, a(4)?],
            max_grid_size: [a(5)?, a(6)?, a(7)?],
            shared_mem_per_block: a(8)?,
            total_constant_memory: a(9)?,
            simd_width: a(10)?,
            mem_pitch: a(11)?,
            regs_per_block: a(12)?,
            clock_rate: a(13)?,
            texture_align: a(14)?,
        };
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(prop, p) };
        Ok(())
    })
}

/// # Safety
/// `out` holds `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(out: *mut c_char, len: i32, dev: i32) -> CUresult {
    entry("cuDeviceGetPCIBusId", || copy_c_string(&device(dev)?.pci_bus_id, out, len))
}

/// `[domain:]bus:device[.function]` in hex, as numbers.
fn parse_bus_id(s: &str) -> Option<(u32, u32, u32, u32)> {
    let (rest, function) = match s.rsplit_once('.') {
        Some((r, f)) => (r, u32::from_str_radix(f, 16).ok()?),
        None => (s, 0),
    };
    let parts: Vec<u32> = rest.split(':').map(|p| u32::from_str_radix(p, 16).ok()).collect::<Option<_>>()?;
    match parts.as_slice() {
        [domain, bus, device] => Some((*domain, *bus, *device, function)),
        [bus, device] => Some((0, *bus, *device, function)),
        _ => None,
    }
}

/// # Safety
/// `dev` is valid for a write; `bus_id` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetByPCIBusId(dev: *mut i32, bus_id: *const c_char) -> CUresult {
    entry("cuDeviceGetByPCIBusId", || {
        check_out(dev)?;
        let wanted = parse_bus_id(&crate::ffi::c_name(bus_id)?).ok_or(CuError::INVALID_VALUE)?;
        let devices = &client::client()?.welcome.devices.0;
        let index =
            devices.iter().position(|d| parse_bus_id(&d.pci_bus_id) == Some(wanted)).ok_or(CuError::INVALID_DEVICE)?;
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(dev, index as i32) };
        Ok(())
    })
}

/// The driver's error names and descriptions as C strings that live as
/// long as the library.
fn error_strings() -> &'static [(u32, CString, CString)] {
    static TABLE: OnceLock<Vec<(u32, CString, CString)>> = OnceLock::new();
    TABLE.get_or_init(|| {
        CUDA_ERRORS
            .iter()
            .map(|(code, name, text)| {
                let c = |s: &str| CString::new(s).unwrap_or_default();
                (*code, c(name), c(text))
            })
            .collect()
    })
}

fn error_string(
    code: u32,
    out: *mut *const c_char,
    pick: fn(&(u32, CString, CString)) -> &CStr,
) -> Result<(), CuError> {
    check_out(out)?;
    match error_strings().iter().find(|e| e.0 == code) {
        Some(e) => {
            // SAFETY: checked non-NULL; the string is static.
            unsafe { write_out(out, pick(e).as_ptr()) };
            Ok(())
        }
        None => {
            // SAFETY: checked non-NULL.
            unsafe { write_out(out, std::ptr::null()) };
            Err(CuError::INVALID_VALUE)
        }
    }
}

/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(code: u32, out: *mut *const c_char) -> CUresult {
    entry("cuGetErrorName", || error_string(code, out, |e| &e.1))
}

/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(code: u32, out: *mut *const c_char) -> CUresult {
    entry("cuGetErrorString", || error_string(code, out, |e| &e.2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_parse_in_both_forms() {
        assert_eq!(parse_bus_id("00000000:1A:00.0"), Some((0, 0x1a, 0, 0)));
        assert_eq!(parse_bus_id("0000:1a:00.0"), parse_bus_id("00000000:1A:00.0"));
        assert_eq!(parse_bus_id("1a:00"), Some((0, 0x1a, 0, 0)));
        assert_eq!(parse_bus_id("zz:00.0"), None);
    }

    #[test]
    fn error_strings_come_from_the_driver_table() {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: `p` is a valid out-pointer.
        assert_eq!(unsafe { cuGetErrorString(1, &mut p) }, 0);
        // SAFETY: the table's strings are NUL-terminated and static.
        assert_eq!(unsafe { CStr::from_ptr(p) }.to_str().unwrap(), "invalid argument");
        // SAFETY: as above.
        assert_eq!(unsafe { cuGetErrorName(424242, &mut p) }, CuError::INVALID_VALUE.0);
        assert!(p.is_null());
    }

    #[test]
    fn names_are_truncated_and_terminated() {
        let mut buf = [0x55 as c_char; 4];
        copy_c_string("abcdef", buf.as_mut_ptr(), 4).unwrap();
        assert_eq!(buf, [b'a' as c_char, b'b' as c_char, b'c' as c_char, 0]);
        assert_eq!(copy_c_string("x", buf.as_mut_ptr(), 0), Err(CuError::INVALID_VALUE));
    }
}
