//! Copies into memory the CPU will not read soon, with streaming stores.
//!
//! A copy from the device over the lanes lands in the caller's buffer,
//! often hundreds of MiB the CPU does not read again soon. Received straight
//! there, the kernel writes it with ordinary stores, so every line is first
//! read from memory and later written back, while the GPU is writing the
//! server's slots: memory, not the cores, is what runs out. So each lane
//! receives into a small buffer that stays in its core's cache and writes
//! it out with streaming (non-temporal) stores, which skip that read: the
//! 16-byte ones every x86-64 has. What it gained: `docs/performance.md`.

/// Copies `src` to `dst` (of equal length), bypassing the cache for what
/// it can; the bytes are visible to other threads once it returns.
pub fn copy(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "streaming copy of unequal lengths");
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        const LINE: usize = 64;
        // Streaming stores need 16-byte aligned targets; the edges go the usual way.
        let head = dst.as_ptr().align_offset(16).min(dst.len());
        let body = (dst.len() - head) / LINE * LINE;
        dst[..head].copy_from_slice(&src[..head]);
        // SAFETY: SSE2 is part of x86_64; every access lies in
        // `head..head + body` of both slices, and the stores are 16-byte
        // aligned by the choice of `head`.
        unsafe {
            let (d, s) = (dst.as_mut_ptr().add(head), src.as_ptr().add(head));
            for line in (0..body).step_by(LINE) {
                for part in (line..line + LINE).step_by(16) {
                    let v = _mm_loadu_si128(s.add(part).cast::<__m128i>());
                    _mm_stream_si128(d.add(part).cast::<__m128i>(), v);
                }
            }
            // Streaming stores are weakly ordered: fence them before
            // whatever tells another thread that the copy is done.
            _mm_sfence();
        }
        dst[head + body..].copy_from_slice(&src[head + body..]);
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_every_byte_at_any_alignment_and_length() {
        let src: Vec<u8> = (0..4096u32).map(|i| (i * 7 + i / 251) as u8).collect();
        for offset in [0, 1, 3, 8, 15, 16, 17] {
            for len in [0, 1, 15, 16, 63, 64, 65, 200, 1000, 4000] {
                let mut dst = vec![0xA5u8; 4096 + 32];
                copy(&mut dst[offset..offset + len], &src[5..5 + len]);
                assert_eq!(&dst[offset..offset + len], &src[5..5 + len], "offset {offset} len {len}");
                assert!(dst[..offset].iter().chain(&dst[offset + len..]).all(|&b| b == 0xA5), "{offset} {len}");
            }
        }
    }
}
