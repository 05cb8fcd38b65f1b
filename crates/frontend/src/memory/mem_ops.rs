//! `cuStreamBatchMemOp`: a batch of stream memory operations, sent as the
//! single operations they are (`cuStreamWriteValue*`, `cuStreamWaitValue*`,
//! each a row of the table), in order on the same stream, which is what the
//! batch does.

use std::ffi::c_void;

use gpuplex_protocol::{calls, CuError, DevPtr, Stream};

use crate::client;
use crate::ffi::{entry, ptsz_stream, CUresult};

/// `CUstreamBatchMemOpParams`, as its wait and write members lay it out.
#[repr(C)]
pub struct MemOp {
    operation: u32,
    address: u64,
    value: u64,
    flags: u32,
    alias: u64,
    pad: u64,
}

const _: () = assert!(std::mem::size_of::<MemOp>() == 48);

/// `CU_STREAM_MEM_OP_WAIT_VALUE_32`, `_WRITE_VALUE_32`, `_WAIT_VALUE_64`, `_WRITE_VALUE_64`.
const WAIT_32: u32 = 1;
const WRITE_32: u32 = 2;
const WAIT_64: u32 = 4;
const WRITE_64: u32 = 5;
/// The most operations one batch takes, as the driver documents it.
const MAX_OPS: u32 = 256;

/// # Safety
/// `ops` holds `count` operations.
unsafe fn batch(stream: Stream, count: u32, ops: *const MemOp, flags: u32) -> Result<(), CuError> {
    if count == 0 || count > MAX_OPS || ops.is_null() || flags != 0 {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: `count` operations, per the contract.
    let ops = unsafe { std::slice::from_raw_parts(ops, count as usize) };
    // All are checked before any is sent, so a bad one sends nothing.
    if let Some(op) = ops.iter().find(|op| ![WAIT_32, WRITE_32, WAIT_64, WRITE_64].contains(&op.operation)) {
        crate::log::warn(&format!("cuStreamBatchMemOp: operation {} is not supported by gpuplex", op.operation));
        return Err(CuError::NOT_SUPPORTED);
    }
    for op in ops {
        let (addr, flags) = (DevPtr(op.address), op.flags);
        match op.operation {
            WAIT_32 => {
                client::post(calls::cuStreamWaitValue32_v2::Request { stream, addr, value: op.value as u32, flags })
            }
            WRITE_32 => {
                client::post(calls::cuStreamWriteValue32_v2::Request { stream, addr, value: op.value as u32, flags })
            }
            WAIT_64 => client::post(calls::cuStreamWaitValue64_v2::Request { stream, addr, value: op.value, flags }),
            _ => client::post(calls::cuStreamWriteValue64_v2::Request { stream, addr, value: op.value, flags }),
        }?;
    }
    Ok(())
}

exports! {
    cuStreamBatchMemOp_v2(s: *mut c_void, count: u32, ops: *const MemOp, flags: u32) =>
        // SAFETY: per the export's contract.
        unsafe { batch(Stream(s as u64), count, ops, flags) };
    cuStreamBatchMemOp_v2_ptsz(s: *mut c_void, count: u32, ops: *const MemOp, flags: u32) =>
        // SAFETY: per the export's contract.
        unsafe { batch(ptsz_stream(s), count, ops, flags) };
    cuStreamBatchMemOp(s: *mut c_void, count: u32, ops: *const MemOp, flags: u32) =>
        // SAFETY: per the export's contract.
        unsafe { batch(Stream(s as u64), count, ops, flags) };
    cuStreamBatchMemOp_ptsz(s: *mut c_void, count: u32, ops: *const MemOp, flags: u32) =>
        // SAFETY: per the export's contract.
        unsafe { batch(ptsz_stream(s), count, ops, flags) };
}
