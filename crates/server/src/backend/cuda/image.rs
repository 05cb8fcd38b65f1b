//! Module and library images, made safe to hand to the driver.
//!
//! `cuModuleLoadData` and `cuLibraryLoadData` take a pointer and no length:
//! the driver reads a fatbin or cubin as far as its headers say, and PTX up
//! to its NUL. The bytes come from a client, so before the driver sees them
//! an [`Image`] checks that a binary's framing (fatbin header and entries,
//! ELF headers, sections and segments) stays inside the bytes sent, gives
//! text its NUL, and gives binaries the 8-byte alignment the driver (and
//! the ELF check) read them with. What lies inside a fatbin entry is left to
//! the driver.

use std::ffi::c_void;

use gpuplex_protocol::{CallError, CuError};
use object::read::elf::ElfFile64;
use object::{LittleEndian, Object, ObjectSection, ObjectSegment};

use super::BResult;

/// A fatbin's first four bytes (0xBA55ED50, little-endian).
pub(super) const FATBIN_MAGIC: [u8; 4] = 0xBA55_ED50_u32.to_le_bytes();
const ELF_MAGIC: &[u8; 4] = b"\x7fELF";
/// Fatbin entry flags naming a compression whose input size is at 0x10.
const FATBIN_LZ4: u64 = 0x2000;
const FATBIN_ZSTD: u64 = 0x8000;

/// An image where the driver can read it.
#[derive(Debug)]
pub(super) enum Image<'a> {
    /// Already aligned and, if text, NUL-terminated.
    InPlace(&'a [u8]),
    /// Copied into words, with at least one zero byte after it.
    Copied(Vec<u64>),
}

impl Image<'_> {
    /// Checks `image` and holds it for the driver; a binary whose headers
    /// reach past its end is `CUDA_ERROR_INVALID_IMAGE`.
    pub(super) fn new(image: &[u8]) -> BResult<Image<'_>> {
        let fatbin = image.starts_with(&FATBIN_MAGIC);
        let elf = image.starts_with(ELF_MAGIC);
        let terminated = fatbin || elf || image.last() == Some(&0);
        let held = if terminated && image.as_ptr().cast::<u64>().is_aligned() {
            Image::InPlace(image)
        } else {
            let mut words = vec![0u64; image.len() / 8 + 1];
            for (word, chunk) in words.iter_mut().zip(image.chunks(8)) {
                let mut bytes = [0u8; 8];
                bytes[..chunk.len()].copy_from_slice(chunk);
                *word = u64::from_ne_bytes(bytes);
            }
            Image::Copied(words)
        };
        let checked = if fatbin {
            check_fatbin(image).map_err(str::to_owned)
        } else if elf {
            // The aligned bytes, without the copy's padding.
            check_elf(&held.bytes()[..image.len()])
        } else {
            Ok(())
        };
        checked.map_err(|why| CallError::new(CuError::INVALID_IMAGE, why))?;
        Ok(held)
    }

    /// The bytes the driver will read (a copy's zero padding included).
    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            Image::InPlace(bytes) => bytes,
            // SAFETY: each u64 is 8 initialised bytes, u8 needs no
            // alignment, and the view borrows the words.
            Image::Copied(words) => unsafe { std::slice::from_raw_parts(words.as_ptr().cast(), words.len() * 8) },
        }
    }

    pub(super) fn as_ptr(&self) -> *const c_void {
        self.bytes().as_ptr().cast()
    }
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at.checked_add(4)?)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at.checked_add(8)?)?.try_into().ok()?))
}

/// The header (u16 header size @6, u64 size of the entries @8) and each
/// entry (u32 header size @4, u64 payload size @8; compressed input size
/// @0x10 and flags @0x28, as nvcc 13.0 writes them) lie inside `b`.
fn check_fatbin(b: &[u8]) -> Result<(), &'static str> {
    let header = b.get(6..8).map(|h| usize::from(u16::from_le_bytes([h[0], h[1]])));
    let (Some(hs), Some(fat)) = (header, u64_at(b, 8)) else { return Err("truncated fatbin header") };
    let end = usize::try_from(fat)
        .ok()
        .and_then(|f| f.checked_add(hs))
        .filter(|&end| hs >= 16 && end <= b.len())
        .ok_or("fatbin size exceeds the image")?;
    let mut at = hs;
    while at < end {
        let entry = &b[at..end];
        let (Some(ehs), Some(payload)) = (u32_at(entry, 4), u64_at(entry, 8)) else {
            return Err("truncated fatbin entry header");
        };
        let start = usize::try_from(ehs).map_err(|_| "bad fatbin entry header size")?;
        let stop = usize::try_from(payload)
            .ok()
            .and_then(|p| p.checked_add(start))
            .filter(|&stop| start >= 16 && stop <= entry.len())
            .ok_or("fatbin entry exceeds the fatbin")?;
        if let (Some(input), Some(flags)) = (u32_at(entry, 0x10), u64_at(entry, 0x28)) {
            if start >= 0x30 && flags & (FATBIN_LZ4 | FATBIN_ZSTD) != 0 && u64::from(input) > payload {
                return Err("compressed fatbin entry exceeds its payload");
            }
        }
        at += stop;
    }
    Ok(())
}

/// The ELF headers, every section's data and every segment's data lie
/// inside `b` (8-byte aligned, as `object` reads it in place).
fn check_elf(b: &[u8]) -> Result<(), String> {
    let bad = |e: object::Error| format!("malformed ELF image: {e}");
    let elf = ElfFile64::<LittleEndian>::parse(b).map_err(bad)?;
    for section in elf.sections() {
        section.data().map_err(bad)?;
    }
    for segment in elf.segments() {
        segment.data().map_err(bad)?;
    }
    Ok(())
}
