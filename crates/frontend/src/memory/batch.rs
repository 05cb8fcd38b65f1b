//! Batched copies (`cuMemcpyBatchAsync`, `cuMemcpy3DBatchAsync`): each copy
//! of the batch is sent as the single asynchronous copy it is, in order on
//! the batch's stream. The batch promises no order among its copies, so
//! any order is one the driver could have taken; the access-order and
//! location hints change where and when the driver may read, not what is
//! copied.
//!
//! One promise needs care: a copy whose source is accessed "during the API
//! call" may read a source that is gone once the call returns. Ordinary
//! host memory is read before a copy call returns here anyway (staged or
//! sent inline); pinned host memory is read by the GPU later, so a batch
//! with such a copy waits for its stream before it returns.

use std::ffi::c_void;

use gpuplex_protocol::{element_bytes, CuError, Stream};

use super::copy3d::{self, End};
use super::{host, unified_copy};
use crate::ffi::{entry, ptsz_stream, stream, CUresult};

/// `CUmemcpySrcAccessOrder`: stream, during the API call, any.
const ORDER_STREAM: u32 = 1;
const ORDER_DURING_CALL: u32 = 2;
const ORDER_ANY: u32 = 3;
/// `CUmemcpy3DOperandType`.
const OPERAND_POINTER: u32 = 1;
const OPERAND_ARRAY: u32 = 2;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Location {
    kind: i32,
    id: i32,
}

/// `CUmemcpyAttributes`.
#[repr(C)]
pub struct Attributes {
    src_access_order: u32,
    src_location: Location,
    dst_location: Location,
    flags: u32,
}

const _: () = assert!(std::mem::size_of::<Attributes>() == 24);

/// `CUmemcpy3DOperand`: the type, then a pointer (address, row length,
/// layer height, location hint) or an array (handle, element offset).
#[repr(C)]
pub struct Operand {
    kind: u32,
    words: [u64; 4],
}

/// `CUDA_MEMCPY3D_BATCH_OP`.
#[repr(C)]
pub struct BatchOp {
    src: Operand,
    dst: Operand,
    extent: [usize; 3],
    src_access_order: u32,
    flags: u32,
}

const _: () = assert!(std::mem::size_of::<BatchOp>() == 112);

/// The batch's stream: the legacy default stream is refused, as the driver
/// refuses it.
fn batch_stream(s: Stream) -> Result<Stream, CuError> {
    if s == Stream::NULL || s == Stream::LEGACY {
        return Err(CuError::INVALID_VALUE);
    }
    Ok(s)
}

fn known_order(order: u32) -> Result<u32, CuError> {
    if [ORDER_STREAM, ORDER_DURING_CALL, ORDER_ANY].contains(&order) {
        Ok(order)
    } else {
        Err(CuError::INVALID_VALUE)
    }
}

/// Every copy's access order, from attribute runs that begin at the copies
/// `idxs` names: the first at 0, each after the one before, all within
/// the batch.
fn access_orders(attrs: &[Attributes], idxs: &[usize], count: usize) -> Result<Vec<u32>, CuError> {
    if attrs.is_empty() || attrs.len() > count || idxs.first() != Some(&0) {
        return Err(CuError::INVALID_VALUE);
    }
    if idxs.windows(2).any(|w| w[0] >= w[1]) || idxs.last().is_some_and(|&l| l >= count) {
        return Err(CuError::INVALID_VALUE);
    }
    let mut orders = Vec::with_capacity(count);
    for (k, a) in attrs.iter().enumerate() {
        let end = idxs.get(k + 1).copied().unwrap_or(count);
        orders.resize(end, known_order(a.src_access_order)?);
    }
    Ok(orders)
}

/// Waits for the batch's stream where a copy read "during the call" comes
/// from pinned memory, which the GPU reads after the call.
fn settle(stream: Stream, pinned_during_call: bool) -> Result<(), CuError> {
    if pinned_during_call {
        crate::client::call(gpuplex_protocol::calls::cuStreamSynchronize::Request { hStream: stream })?;
    }
    Ok(())
}

/// # Safety
/// The arrays hold `count` (`dsts`, `srcs`, `sizes`) and `num_attrs`
/// (`attrs`, `idxs`) entries, as the CUDA API requires.
#[allow(clippy::too_many_arguments)]
unsafe fn batch(
    dsts: *const u64,
    srcs: *const u64,
    sizes: *const usize,
    count: usize,
    attrs: *const Attributes,
    idxs: *const usize,
    num_attrs: usize,
    stream: Stream,
    failed: &mut usize,
) -> Result<(), CuError> {
    let stream = batch_stream(stream)?;
    if count == 0 || [dsts.is_null(), srcs.is_null(), sizes.is_null(), attrs.is_null(), idxs.is_null()].contains(&true)
    {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: non-NULL and as long as the contract says.
    let (dsts, srcs, sizes, attrs, idxs) = unsafe {
        (
            std::slice::from_raw_parts(dsts, count),
            std::slice::from_raw_parts(srcs, count),
            std::slice::from_raw_parts(sizes, count),
            std::slice::from_raw_parts(attrs, num_attrs),
            std::slice::from_raw_parts(idxs, num_attrs),
        )
    };
    let orders = access_orders(attrs, idxs, count)?;
    let mut pinned_during_call = false;
    for i in 0..count {
        *failed = i;
        unified_copy(dsts[i], srcs[i], sizes[i], stream, false)?;
        pinned_during_call |= orders[i] == ORDER_DURING_CALL && host::contains(srcs[i]);
    }
    *failed = usize::MAX;
    settle(stream, pinned_during_call)
}

/// CUDA 12.8's forms of the batches also name the copy that failed: a batch
/// stops at the first copy refused (`usize::MAX` where the failure is the
/// batch's as a whole). A copy's failure that shows only as the stream runs
/// is reported later, as natively.
///
/// # Safety
/// `fail_idx` is NULL or valid for a write.
unsafe fn naming_failure(
    fail_idx: *mut usize,
    run: impl FnOnce(&mut usize) -> Result<(), CuError>,
) -> Result<(), CuError> {
    let mut failed = usize::MAX;
    let result = run(&mut failed);
    if result.is_err() && !fail_idx.is_null() {
        // SAFETY: non-NULL, valid per the contract.
        unsafe { fail_idx.write_unaligned(failed) };
    }
    result
}

/// One operand of a 3D batch copy as a copy end, with its element size:
/// 1 for a pointer, the array's element for an array.
fn operand_end(op: &Operand) -> Result<(End, Option<u64>), CuError> {
    match op.kind {
        OPERAND_POINTER => Ok((copy3d::unified_at(op.words[0]), None)),
        OPERAND_ARRAY => {
            let desc = super::arrays::descriptor(op.words[0] as *mut c_void)?;
            let elem = element_bytes(desc.format, desc.channels)?;
            Ok((copy3d::array_at(op.words[0] as *mut c_void, 0), Some(elem)))
        }
        _ => Err(CuError::INVALID_VALUE),
    }
}

/// A 3D batch copy as the single 3D copy it describes.
fn op_copy(op: &BatchOp, stream: Stream) -> Result<bool, CuError> {
    let [width, height, depth] = op.extent.map(|e| e as u64);
    if width == 0 || height == 0 || depth == 0 || op.flags != 0 {
        return Err(CuError::INVALID_VALUE);
    }
    let order = known_order(op.src_access_order)?;
    let (mut src, src_elem) = operand_end(&op.src)?;
    let (mut dst, dst_elem) = operand_end(&op.dst)?;
    let elem = match (src_elem, dst_elem) {
        (Some(a), Some(b)) if a != b => return Err(CuError::INVALID_VALUE),
        (Some(e), _) | (_, Some(e)) => e,
        (None, None) => 1,
    };
    for (end, operand) in [(&mut src, &op.src), (&mut dst, &op.dst)] {
        let w = &operand.words;
        if operand.kind == OPERAND_POINTER {
            let (row, layer) = (w[1], w[2]);
            if (row != 0 && row < width) || (layer != 0 && layer < height) {
                return Err(CuError::INVALID_VALUE);
            }
            let row = if row == 0 { width } else { row };
            end.pitch = row.checked_mul(elem).ok_or(CuError::INVALID_VALUE)?;
            end.height = if layer == 0 { height } else { layer };
        } else {
            // The offset in elements: x in bytes, as copies name it.
            end.x = w[1].checked_mul(elem).ok_or(CuError::INVALID_VALUE)?;
            end.y = w[2];
            end.z = w[3];
        }
    }
    let width = width.checked_mul(elem).ok_or(CuError::INVALID_VALUE)?;
    let pinned = src.is_host_pinned();
    copy3d::copy_3d_async(src, dst, [width, height, depth], stream)?;
    Ok(order == ORDER_DURING_CALL && pinned)
}

/// # Safety
/// `ops` holds `count` operations.
unsafe fn batch_3d(
    count: usize,
    ops: *const BatchOp,
    flags: u64,
    stream: Stream,
    failed: &mut usize,
) -> Result<(), CuError> {
    let stream = batch_stream(stream)?;
    if count == 0 || ops.is_null() || flags != 0 {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: non-NULL and `count` long, per the contract.
    let ops = unsafe { std::slice::from_raw_parts(ops, count) };
    let mut pinned_during_call = false;
    for (i, op) in ops.iter().enumerate() {
        *failed = i;
        pinned_during_call |= op_copy(op, stream)?;
    }
    *failed = usize::MAX;
    settle(stream, pinned_during_call)
}

exports! {
    cuMemcpyBatchAsync_v2(dsts: *const u64, srcs: *const u64, sizes: *const usize, count: usize, attrs: *const Attributes, idxs: *const usize, n: usize, s: *mut c_void) =>
        // SAFETY: per the export's contract.
        unsafe { batch(dsts, srcs, sizes, count, attrs, idxs, n, stream(s), &mut 0) };
    cuMemcpyBatchAsync_v2_ptsz(dsts: *const u64, srcs: *const u64, sizes: *const usize, count: usize, attrs: *const Attributes, idxs: *const usize, n: usize, s: *mut c_void) =>
        // SAFETY: per the export's contract.
        unsafe { batch(dsts, srcs, sizes, count, attrs, idxs, n, ptsz_stream(s), &mut 0) };
    cuMemcpyBatchAsync(dsts: *const u64, srcs: *const u64, sizes: *const usize, count: usize, attrs: *const Attributes, idxs: *const usize, n: usize, fail: *mut usize, s: *mut c_void) =>
        // SAFETY: per the export's contract.
        unsafe { naming_failure(fail, |f| batch(dsts, srcs, sizes, count, attrs, idxs, n, stream(s), f)) };
    cuMemcpyBatchAsync_ptsz(dsts: *const u64, srcs: *const u64, sizes: *const usize, count: usize, attrs: *const Attributes, idxs: *const usize, n: usize, fail: *mut usize, s: *mut c_void) =>
        // SAFETY: per the export's contract.
        unsafe { naming_failure(fail, |f| batch(dsts, srcs, sizes, count, attrs, idxs, n, ptsz_stream(s), f)) };
    cuMemcpy3DBatchAsync_v2(count: usize, ops: *const BatchOp, flags: u64, s: *mut c_void) =>
        // SAFETY: per the export's contract.
        unsafe { batch_3d(count, ops, flags, stream(s), &mut 0) };
    cuMemcpy3DBatchAsync_v2_ptsz(count: usize, ops: *const BatchOp, flags: u64, s: *mut c_void) =>
        // SAFETY: per the export's contract.
        unsafe { batch_3d(count, ops, flags, ptsz_stream(s), &mut 0) };
    cuMemcpy3DBatchAsync(count: usize, ops: *const BatchOp, fail: *mut usize, flags: u64, s: *mut c_void) =>
        // SAFETY: per the export's contract.
        unsafe { naming_failure(fail, |f| batch_3d(count, ops, flags, stream(s), f)) };
    cuMemcpy3DBatchAsync_ptsz(count: usize, ops: *const BatchOp, fail: *mut usize, flags: u64, s: *mut c_void) =>
        // SAFETY: per the export's contract.
        unsafe { naming_failure(fail, |f| batch_3d(count, ops, flags, ptsz_stream(s), f)) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(orders: &[u32]) -> Vec<Attributes> {
        let none = Location { kind: 0, id: 0 };
        orders
            .iter()
            .map(|&o| Attributes { src_access_order: o, src_location: none, dst_location: none, flags: 0 })
            .collect()
    }

    #[test]
    fn attribute_runs_give_every_copy_its_order() {
        let a = attrs(&[ORDER_STREAM, ORDER_DURING_CALL]);
        assert_eq!(access_orders(&a, &[0, 2], 4).unwrap(), [1, 1, 2, 2]);
        assert_eq!(access_orders(&a[..1], &[0], 3).unwrap(), [1, 1, 1]);
    }

    #[test]
    fn malformed_attribute_runs_are_refused() {
        let a = attrs(&[ORDER_STREAM, ORDER_ANY]);
        let bad = CuError::INVALID_VALUE;
        assert_eq!(access_orders(&a, &[1, 2], 4).unwrap_err(), bad, "the first run starts at copy 0");
        assert_eq!(access_orders(&a, &[0, 0], 4).unwrap_err(), bad, "runs start in increasing order");
        assert_eq!(access_orders(&a, &[0, 4], 4).unwrap_err(), bad, "a run starts within the batch");
        assert_eq!(access_orders(&a, &[0, 1], 1).unwrap_err(), bad, "no more runs than copies");
        assert_eq!(access_orders(&[], &[], 1).unwrap_err(), bad, "every copy needs attributes");
        assert_eq!(access_orders(&attrs(&[0]), &[0], 1).unwrap_err(), bad, "an invalid access order");
    }

    #[test]
    fn the_legacy_stream_is_refused() {
        assert!(batch_stream(Stream::NULL).is_err());
        assert!(batch_stream(Stream::LEGACY).is_err());
        assert_eq!(batch_stream(Stream::PER_THREAD), Ok(Stream::PER_THREAD));
    }
}
