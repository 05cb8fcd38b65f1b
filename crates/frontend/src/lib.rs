//! gpuplex's `libcuda.so.1`: the CUDA driver API, remoted.
//!
//! An unmodified program (or the CUDA runtime, cuBLAS, PyTorch inside it)
//! loads this library instead of NVIDIA's. Every driver symbol NVIDIA's
//! library exports is here too: the remoted calls and their exports are
//! generated from the API table (`crates/protocol/calls.api`), the rest are
//! written by hand in the modules below, and whatever is not implemented
//! yet answers `CUDA_ERROR_NOT_SUPPORTED` and logs its name once.
//!
//! What can be answered without the server is answered here: device
//! queries (from the table the handshake brought), error strings, the
//! per-thread context stack, kernel parameter layouts once fetched. The
//! library never links or loads the real driver.

#![allow(non_snake_case, clippy::missing_safety_doc)]

/// Entry points whose bodies are one expression over their arguments.
macro_rules! exports {
    ($( $name:ident ($($arg:ident: $ty:ty),*) => $body:expr; )*) => {$(
        /// # Safety
        /// Pointers are valid as the CUDA API requires: for the byte counts,
        /// and for writes where they are out-pointers.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
            entry(stringify!($name), || $body)
        }
    )*};
}

mod client;
mod context;
mod device;
mod export_tables;
mod ffi;
mod graph;
mod host_calls;
mod launch;
mod link;
mod log;
mod memo;
mod memory;
pub(crate) mod module;
mod proc_address;
mod tensor_map;
mod trace;

/// Marks this library as gpuplex's, so that a server never mistakes it for
/// NVIDIA's driver (it refuses to start on it). The one export beyond the
/// real driver's list.
#[no_mangle]
pub static gpuplex_frontend: u8 = 1;

mod generated {
    //! Exports generated from the API table.
    use std::ffi::{c_char, c_void};

    #[allow(unused_imports)]
    use gpuplex_protocol::{
        calls, Array, Ctx, DevPtr, Event, Func, Graph, GraphExec, GraphNode, Kernel, Library, MemPool, Mipmap, Module,
        Stream, UserObject,
    };

    use crate::ffi::CUresult;

    include!(concat!(env!("OUT_DIR"), "/exports.rs"));
}
