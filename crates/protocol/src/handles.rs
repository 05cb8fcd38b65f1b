//! Handle types as they travel.
//!
//! Every object handle a client holds (context, module, function, stream,
//! event, library, kernel) is an opaque number the server issued from the
//! session's own table, never a server pointer; the server looks each one up
//! before use. Device pointers are the one exception: they are real device
//! addresses inside the session's own contexts, checked against the
//! session's allocation table wherever the server dereferences them.

use crate::codec::{Reader, Wire};
use crate::DecodeError;

macro_rules! handles {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {$(
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        pub struct $name(pub u64);

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, concat!(stringify!($name), "({:#x})"), self.0)
            }
        }

        impl Wire for $name {
            const MIN_SIZE: usize = 8;
            fn put(&self, out: &mut Vec<u8>) {
                self.0.put(out)
            }
            fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
                u64::take(r).map($name)
            }
        }
    )*};
}

handles! {
    /// `CUcontext`; 0 means "none current".
    Ctx,
    /// `CUmodule`.
    Module,
    /// `CUfunction`; a `Kernel` handle is also accepted where a function is
    /// expected, as the real driver does.
    Func,
    /// `CUstream`; see the associated constants for the special values.
    Stream,
    /// `CUevent`.
    Event,
    /// `CUlibrary`.
    Library,
    /// `CUkernel`.
    Kernel,
    /// `CUgraph`.
    Graph,
    /// `CUgraphExec`: an instantiated graph.
    GraphExec,
    /// `CUgraphNode`.
    GraphNode,
    /// `CUmemoryPool`: a pool stream-ordered allocations come from.
    MemPool,
    /// `CUarray`.
    Array,
    /// `CUmipmappedArray`.
    Mipmap,
    /// `CUuserObject`: an object of the program's with a destructor, which
    /// runs in the guest once the last reference to it is gone.
    UserObject,
    /// `CUdeviceptr`: a real device address in one of the session's contexts.
    DevPtr,
}

impl Stream {
    /// The NULL stream: the legacy default stream.
    pub const NULL: Stream = Stream(0);
    /// `CU_STREAM_LEGACY`.
    pub const LEGACY: Stream = Stream(1);
    /// `CU_STREAM_PER_THREAD`.
    pub const PER_THREAD: Stream = Stream(2);

    /// True for the three values that name a default stream rather than a
    /// created one.
    pub fn is_default(self) -> bool {
        self.0 <= 2
    }
}

/// The first number the server hands out for objects. Keeps issued handles
/// clear of NULL and of the special stream values.
pub const FIRST_HANDLE: u64 = 0x1000;
