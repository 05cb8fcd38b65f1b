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

/// A fatbin's first four bytes.
pub(super) const FATBIN_MAGIC: [u8; 4] = gpuplex_image::FATBIN_MAGIC.to_le_bytes();

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
        let elf = image.starts_with(&gpuplex_image::ELF_MAGIC);
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
            gpuplex_image::fatbin_entries(image).map(drop).map_err(str::to_owned)
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
