//! Tensor maps (TMA descriptors): encoded by the server's driver, since
//! their layout is the driver's; the guest passes the 128 bytes to its kernels.
//! An encoding depends on nothing but its parameters, so each is kept and
//! given again for the same parameters (Triton and XLA encode the same maps
//! before every launch).

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

use gpuplex_protocol::{calls, CuError, DevPtr, Seq};

use crate::client;
use crate::ffi::{check_out, entry, CUresult};

/// `CUtensorMap`.
#[repr(C, align(64))]
pub struct TensorMap([u8; 128]);

/// The most dimensions a tensor map has; the driver refuses more.
const MAX_RANK: u32 = 5;

/// `n` entries at `p`, which may be NULL only where `n` is 0.
///
/// # Safety
/// `p` is NULL or valid for `n` reads.
unsafe fn list<T: Copy, U>(p: *const T, n: usize, to: impl Fn(T) -> U) -> Result<Seq<U>, CuError> {
    if n == 0 {
        return Ok(Seq(Vec::new()));
    }
    if p.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: per the contract.
    Ok(Seq(unsafe { std::slice::from_raw_parts(p, n) }.iter().map(|&v| to(v)).collect()))
}

fn write_map(out: *mut TensorMap, map: &[u8]) -> Result<(), CuError> {
    let map: [u8; 128] = map.try_into().map_err(|_| CuError::UNKNOWN)?;
    // SAFETY: checked non-NULL by the caller; the export's caller vouches for it.
    unsafe { out.write(TensorMap(map)) };
    Ok(())
}

/// The parameters both encodings share.
struct Common {
    data_type: u32,
    rank: u32,
    address: *mut c_void,
    dims: *const u64,
    strides: *const u64,
    element_strides: *const u32,
    modes: [u32; 4],
}

/// A tiled map has a box of `window` dimensions; an im2col map has pixel
/// box corners, channels and pixels.
enum Window {
    Tiled(*const u32),
    Im2col { lower: *const i32, upper: *const i32, channels: u32, pixels: u32 },
}

/// # Safety
/// The lists are valid for as many entries as the rank asks.
unsafe fn encode(out: *mut TensorMap, c: Common, window: Window) -> Result<(), CuError> {
    check_out(out)?;
    if c.rank == 0 || c.rank > MAX_RANK {
        return Err(CuError::INVALID_VALUE);
    }
    let rank = c.rank as usize;
    let spatial = rank.saturating_sub(2);
    let same = |v: u32| v;
    let bits = |v: i32| v as u32;
    // SAFETY: per the contract, for each list.
    let req = unsafe {
        let (im2col, window, lower, upper, channels, pixels) = match window {
            Window::Tiled(w) => (false, list(w, rank, same)?, Seq(Vec::new()), Seq(Vec::new()), 0, 0),
            Window::Im2col { lower, upper, channels, pixels } => {
                (true, Seq(Vec::new()), list(lower, spatial, bits)?, list(upper, spatial, bits)?, channels, pixels)
            }
        };
        calls::TensorMapEncode::Request {
            im2col,
            dataType: c.data_type,
            rank: c.rank,
            address: DevPtr(c.address as u64),
            dims: list(c.dims, rank, |v: u64| v)?,
            strides: list(c.strides, rank - 1, |v: u64| v)?,
            window,
            lower,
            upper,
            channels,
            pixels,
            elementStrides: list(c.element_strides, rank, same)?,
            interleave: c.modes[0],
            swizzle: c.modes[1],
            l2Promotion: c.modes[2],
            oobFill: c.modes[3],
        }
    };
    write_map(out, &keep(req)?.map)
}

/// Encodings kept, at most; past it they are all forgotten, as a program
/// that encodes ever new addresses would otherwise grow the memo forever.
const MOST_KEPT: usize = 4096;
static KEPT: AtomicUsize = AtomicUsize::new(0);

fn keep(req: calls::TensorMapEncode::Request) -> Result<calls::TensorMapEncode::Reply, CuError> {
    crate::memo::TENSOR_MAPS.keep_if(0, req, |_| {
        if KEPT.fetch_add(1, Ordering::Relaxed) >= MOST_KEPT {
            KEPT.store(0, Ordering::Relaxed);
            crate::memo::TENSOR_MAPS.forget();
        }
        true
    })
}

/// # Safety
/// The lists are valid for as many entries as `rank` asks; `out` for a write.
#[no_mangle]
pub unsafe extern "C" fn cuTensorMapEncodeTiled(
    out: *mut TensorMap,
    data_type: u32,
    rank: u32,
    address: *mut c_void,
    dims: *const u64,
    strides: *const u64,
    window: *const u32,
    element_strides: *const u32,
    interleave: u32,
    swizzle: u32,
    l2_promotion: u32,
    oob_fill: u32,
) -> CUresult {
    let c = Common {
        data_type,
        rank,
        address,
        dims,
        strides,
        element_strides,
        modes: [interleave, swizzle, l2_promotion, oob_fill],
    };
    // SAFETY: per the export's contract.
    entry("cuTensorMapEncodeTiled", || unsafe { encode(out, c, Window::Tiled(window)) })
}

/// # Safety
/// As for [`cuTensorMapEncodeTiled`]; the corners have `rank - 2` entries.
#[no_mangle]
pub unsafe extern "C" fn cuTensorMapEncodeIm2col(
    out: *mut TensorMap,
    data_type: u32,
    rank: u32,
    address: *mut c_void,
    dims: *const u64,
    strides: *const u64,
    lower: *const i32,
    upper: *const i32,
    channels: u32,
    pixels: u32,
    element_strides: *const u32,
    interleave: u32,
    swizzle: u32,
    l2_promotion: u32,
    oob_fill: u32,
) -> CUresult {
    let c = Common {
        data_type,
        rank,
        address,
        dims,
        strides,
        element_strides,
        modes: [interleave, swizzle, l2_promotion, oob_fill],
    };
    let window = Window::Im2col { lower, upper, channels, pixels };
    // SAFETY: per the export's contract.
    entry("cuTensorMapEncodeIm2col", || unsafe { encode(out, c, window) })
}

/// # Safety
/// `map` is valid for a read and a write.
#[no_mangle]
pub unsafe extern "C" fn cuTensorMapReplaceAddress(map: *mut TensorMap, address: *mut c_void) -> CUresult {
    entry("cuTensorMapReplaceAddress", || {
        check_out(map)?;
        // SAFETY: checked non-NULL; the caller vouches for it.
        let old = unsafe { (*map).0.to_vec() };
        let req = calls::TensorMapReplaceAddress::Request { map: old, address: DevPtr(address as u64) };
        write_map(map, &client::call(req)?.map)
    })
}
