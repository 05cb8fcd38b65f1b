//! What the fuzz targets share: a global allocator that turns an absurd
//! allocation into a crash libFuzzer saves the input of.
//!
//! libFuzzer's own `-malloc_limit_mb` works through a sanitizer's allocator
//! hooks, and the targets build without a sanitizer on stable Rust (see
//! `scripts/fuzz.sh`), so the limit is enforced here. A large allocation
//! that is never touched does not show in `-rss_limit_mb` either.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;

/// The largest single allocation any input may cause: the image reader caps
/// decompressed entries and globals at 1 GiB, frames are at most 64 MiB,
/// and nothing else a guest sends should come near either.
pub const MAX_ALLOCATION: usize = (1 << 30) + (64 << 20);

/// The system allocator, aborting on a request over [`MAX_ALLOCATION`].
pub struct Capped;

impl Capped {
    fn check(size: usize) {
        if size > MAX_ALLOCATION {
            // Unwinding out of an allocator is not allowed: abort, which
            // libFuzzer reports as a deadly signal, saving the input. The
            // backtrace's own allocations are small and pass straight through.
            let trace = std::backtrace::Backtrace::force_capture();
            let _ = writeln!(std::io::stderr(), "gpuplex-fuzz: an allocation of {size} bytes at\n{trace}");
            std::process::abort();
        }
    }
}

// SAFETY: every call goes to `System` with the caller's arguments; the
// check before it only aborts.
unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Capped::check(layout.size());
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Capped::check(layout.size());
        // SAFETY: as in `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        Capped::check(new_size);
        // SAFETY: the caller upholds `GlobalAlloc::realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through this allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Makes [`Capped`] the target's global allocator.
#[macro_export]
macro_rules! cap_allocations {
    () => {
        #[global_allocator]
        static ALLOCATOR: $crate::Capped = $crate::Capped;
    };
}
