//! The framing of CUDA module images as programs hand them to the driver: a
//! pointer and no length. A fatbin says how long it is in its header and
//! holds entries (PTX or ELF, possibly compressed) after it; an ELF cubin's
//! headers say where its tables and sections lie; PTX is text up to its
//! NUL.
//!
//! The front-end reads this framing to find how many bytes an image spans
//! (it has only the pointer); the server to check that an image's headers
//! stay inside the bytes it was sent before its driver reads them, and to
//! find the entry whose code it reads. What lies inside an entry (ELF
//! contents, PTX syntax, decompression) is the server's alone.

/// A fatbin's first four bytes, little-endian.
pub const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// The wrapper nvcc emits around a fatbin (`__fatBinC_Wrapper_t`: magic,
/// version, a pointer to the fatbin, a file name).
pub const FATBIN_WRAPPER_MAGIC: u32 = 0x4662_43B1;
pub const ELF_MAGIC: [u8; 4] = *b"\x7fELF";

/// A fatbin's header: u32 magic, u16 version, u16 header size @6, u64 size
/// of the entries @8.
pub const FATBIN_HEADER: usize = 16;
/// An entry's header, as nvcc writes it: u16 kind @0, u32 header size @4,
/// u64 payload size @8, u32 compressed size @0x10, u32 arch @0x1c, u64
/// flags @0x28, u64 decompressed size @0x38.
pub const ENTRY_HEADER: usize = 0x40;
/// A 64-bit ELF header, and the least a section header may take.
pub const ELF_HEADER: usize = 64;

/// Entry kinds that carry code.
pub const ENTRY_PTX: u16 = 1;
pub const ENTRY_ELF: u16 = 2;
/// Entry flags: the old compression (unsupported by today's tools), LZ4, zstd.
pub const COMPRESSED_OLD: u64 = 0x1000;
pub const COMPRESSED_LZ4: u64 = 0x2000;
pub const COMPRESSED_ZSTD: u64 = 0x8000;

fn le(b: &[u8], at: usize, n: usize) -> Option<u64> {
    let bytes = b.get(at..at.checked_add(n)?)?;
    Some(bytes.iter().rev().fold(0, |v, &x| v << 8 | u64::from(x)))
}

/// The bytes a fatbin spans, from its header.
pub fn fatbin_len(header: &[u8; FATBIN_HEADER]) -> Option<u64> {
    let header_size = le(header, 6, 2)?;
    (header_size >= FATBIN_HEADER as u64).then(|| header_size.checked_add(le(header, 8, 8)?)).flatten()
}

/// One entry of a fatbin.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    /// [`ENTRY_PTX`], [`ENTRY_ELF`] or another (which carries no code).
    pub kind: u16,
    /// The SM version the code is for (90 for sm_90).
    pub arch: u32,
    pub flags: u64,
    /// With a compression flag: the compressed bytes at the payload's
    /// start, and the size they decompress to.
    pub compressed: u64,
    pub decompressed: u64,
    /// The entry's header, of at least [`ENTRY_HEADER`] bytes.
    pub header: &'a [u8],
    pub payload: &'a [u8],
}

impl Entry<'_> {
    /// The compression flags set, if any.
    pub fn compression(&self) -> u64 {
        self.flags & (COMPRESSED_OLD | COMPRESSED_LZ4 | COMPRESSED_ZSTD)
    }
}

/// Every entry of the fatbin `data` starts with, each checked to lie inside
/// the fatbin, and the fatbin inside `data`; a compressed entry's input
/// inside its payload.
pub fn fatbin_entries(data: &[u8]) -> Result<Vec<Entry<'_>>, &'static str> {
    let header: &[u8; FATBIN_HEADER] =
        data.get(..FATBIN_HEADER).and_then(|h| h.try_into().ok()).ok_or("truncated fatbin header")?;
    let end = fatbin_len(header).filter(|&end| end <= data.len() as u64).ok_or("fatbin size exceeds the image")?;
    let (end, mut at) = (end as usize, le(header, 6, 2).unwrap_or(0) as usize);
    let mut found = Vec::new();
    while at < end {
        let rest = &data[at..end];
        let header = rest.get(..ENTRY_HEADER).ok_or("truncated fatbin entry header")?;
        // `header` holds ENTRY_HEADER bytes: these reads cannot miss.
        let field = |at, n| le(header, at, n).unwrap_or(0);
        let (start, len) = (field(4, 4), field(8, 8));
        let stop = start
            .checked_add(len)
            .filter(|&stop| start >= ENTRY_HEADER as u64 && stop <= rest.len() as u64)
            .ok_or("fatbin entry exceeds the fatbin")? as usize;
        let entry = Entry {
            kind: field(0, 2) as u16,
            arch: field(0x1c, 4) as u32,
            flags: field(0x28, 8),
            compressed: field(0x10, 4),
            decompressed: field(0x38, 8),
            header: &rest[..start as usize],
            payload: &rest[start as usize..stop],
        };
        if entry.compression() != 0 && entry.compressed > len {
            return Err("compressed fatbin entry exceeds its payload");
        }
        found.push(entry);
        at += stop;
    }
    Ok(found)
}

/// Whether a device of compute capability `device` (90 for 9.0) could run
/// `entry`: SASS runs only within its major version, PTX is compiled for
/// its own arch or any later one. Entries that carry no code are kept.
fn runs_on(entry: &Entry<'_>, device: u32) -> bool {
    match entry.kind {
        ENTRY_ELF => entry.arch / 10 == device / 10,
        ENTRY_PTX => entry.arch <= device,
        _ => true,
    }
}

/// The fatbin `data` without the entries that none of the devices `archs`
/// could run, so that a library built for many GPUs does not travel whole.
/// The driver chooses among what is left exactly as it would among all of
/// it. `None` where nothing would be dropped, where nothing would be left
/// (the driver then reports what it would have), or where an entry's length
/// is not a multiple of 8 (moving it would change its alignment).
pub fn fatbin_for(data: &[u8], archs: &[u32]) -> Option<Vec<u8>> {
    let entries = fatbin_entries(data).ok()?;
    let header_len = le(data, 6, 2)? as usize;
    let mut kept = Vec::with_capacity(entries.len());
    let mut at = header_len;
    for entry in &entries {
        let len = entry.header.len() + entry.payload.len();
        if len % 8 != 0 {
            return None;
        }
        if archs.iter().any(|&device| runs_on(entry, device)) {
            kept.push(at..at + len);
        }
        at += len;
    }
    if kept.is_empty() || kept.len() == entries.len() {
        return None;
    }
    let size: usize = kept.iter().map(|r| r.len()).sum();
    let mut out = Vec::with_capacity(header_len + size);
    out.extend_from_slice(&data[..header_len]);
    out[8..16].copy_from_slice(&(size as u64).to_le_bytes());
    for range in kept {
        out.extend_from_slice(&data[range]);
    }
    Some(out)
}

/// The bytes a 64-bit ELF image spans: the furthest of its section header
/// table, its program header table and its sections' contents. `section(o)`
/// gives the first [`ELF_HEADER`] bytes at offset `o`, where each section
/// header lies (None: the image ends before).
pub fn elf_len(
    header: &[u8; ELF_HEADER],
    mut section: impl FnMut(u64) -> Option<[u8; ELF_HEADER]>,
) -> Result<u64, &'static str> {
    const ELFCLASS64: u64 = 2;
    const SHT_NOBITS: u64 = 8;
    let field = |at, n| le(header, at, n).unwrap_or(0);
    let (phoff, shoff, phentsize, phnum, shentsize, shnum) =
        (field(0x20, 8), field(0x28, 8), field(0x36, 2), field(0x38, 2), field(0x3a, 2), field(0x3c, 2));
    if field(4, 1) != ELFCLASS64 || (shnum > 0 && shentsize < ELF_HEADER as u64) {
        return Err("not a 64-bit ELF image");
    }
    let table = |off: u64, n: u64, size: u64| off.checked_add(n * size).ok_or("ELF tables past the address space");
    let mut end = table(shoff, shnum, shentsize)?.max(table(phoff, phnum, phentsize)?).max(ELF_HEADER as u64);
    for i in 0..shnum {
        let sh = section(shoff + i * shentsize).ok_or("ELF section header past the image")?;
        let (kind, offset, size) =
            (le(&sh, 4, 4).unwrap_or(0), le(&sh, 0x18, 8).unwrap_or(0), le(&sh, 0x20, 8).unwrap_or(0));
        if kind != SHT_NOBITS {
            end = end.max(offset.saturating_add(size));
        }
    }
    Ok(end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A fatbin of one entry of `payload` bytes, `kind` and `flags`.
    fn fatbin(kind: u16, flags: u64, compressed: u32, payload: &[u8]) -> Vec<u8> {
        fatbin_of(&[entry(kind, 90, flags, compressed, payload)])
    }

    /// A fatbin holding `entries`, each made by [`entry`].
    fn fatbin_of(entries: &[Vec<u8>]) -> Vec<u8> {
        let entries = entries.concat();
        let mut image = vec![0u8; FATBIN_HEADER];
        image[..4].copy_from_slice(&FATBIN_MAGIC.to_le_bytes());
        image[6..8].copy_from_slice(&(FATBIN_HEADER as u16).to_le_bytes());
        image[8..16].copy_from_slice(&(entries.len() as u64).to_le_bytes());
        image.extend_from_slice(&entries);
        image
    }

    /// One entry, header and payload.
    fn entry(kind: u16, arch: u32, flags: u64, compressed: u32, payload: &[u8]) -> Vec<u8> {
        let mut entry = vec![0u8; ENTRY_HEADER];
        entry[..2].copy_from_slice(&kind.to_le_bytes());
        entry[4..8].copy_from_slice(&(ENTRY_HEADER as u32).to_le_bytes());
        entry[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        entry[0x10..0x14].copy_from_slice(&compressed.to_le_bytes());
        entry[0x1c..0x20].copy_from_slice(&arch.to_le_bytes());
        entry[0x28..0x30].copy_from_slice(&flags.to_le_bytes());
        entry.extend_from_slice(payload);
        entry
    }

    #[test]
    fn a_fatbin_keeps_only_what_the_devices_could_run() {
        let sass = |arch| entry(ENTRY_ELF, arch, 0, 0, &[arch as u8; 8]);
        let ptx = |arch| entry(ENTRY_PTX, arch, 0, 0, &[arch as u8 + 1; 16]);
        let image = fatbin_of(&[sass(75), sass(80), sass(86), sass(90), ptx(90), sass(100), ptx(120)]);
        let summary = |image: &[u8]| {
            fatbin_entries(image).unwrap().iter().map(|e| (e.kind, e.arch, e.payload.to_vec())).collect::<Vec<_>>()
        };
        let all = summary(&image);
        let pick = |keep: &[usize]| keep.iter().map(|&i| all[i].clone()).collect::<Vec<_>>();

        let h100 = fatbin_for(&image, &[90]).expect("entries for other GPUs go");
        assert_eq!(summary(&h100), pick(&[3, 4]), "sm_90 code and PTX it can compile");
        assert_eq!(fatbin_len(h100[..16].try_into().unwrap()), Some(h100.len() as u64));
        let a10 = fatbin_for(&image, &[86]).unwrap();
        assert_eq!(summary(&a10), pick(&[1, 2]), "SASS of its major version, no PTX newer than it");
        let both = fatbin_for(&image, &[86, 90]).unwrap();
        assert_eq!(summary(&both), pick(&[1, 2, 3, 4]), "what either device could run");

        assert_eq!(fatbin_for(&image, &[75, 80, 86, 90, 100, 120]), None, "nothing to drop");
        assert_eq!(fatbin_for(&fatbin_of(&[sass(100)]), &[90]), None, "nothing left: the driver says so");
        let odd = fatbin_of(&[sass(80), entry(ENTRY_ELF, 90, 0, 0, b"12345")]);
        assert_eq!(fatbin_for(&odd, &[90]), None, "an entry that would move off its alignment");
        assert_eq!(fatbin_for(b"not a fatbin", &[90]), None);
    }

    #[test]
    fn a_fatbin_s_entries_are_read_inside_it() {
        let image = fatbin(ENTRY_ELF, 0, 0, b"code");
        assert_eq!(fatbin_len(image[..16].try_into().unwrap()), Some(image.len() as u64));
        let entries = fatbin_entries(&image).unwrap();
        assert_eq!(
            (entries.len(), entries[0].kind, entries[0].arch, entries[0].payload),
            (1, ENTRY_ELF, 90, &b"code"[..])
        );
        // Trailing bytes after the fatbin are not its.
        let mut longer = image.clone();
        longer.extend_from_slice(&[0xff; 7]);
        assert_eq!(fatbin_entries(&longer).unwrap().len(), 1);
        assert!(fatbin_entries(&image[..image.len() - 1]).is_err(), "cut short");
        let mut big = fatbin(ENTRY_PTX, 0, 0, b"x");
        big[FATBIN_HEADER + 8] = 200;
        assert!(fatbin_entries(&big).is_err(), "an entry past the fatbin");
        assert!(fatbin_entries(&fatbin(ENTRY_ELF, COMPRESSED_LZ4, 9, b"1234")).is_err(), "compressed input past it");
        assert!(fatbin_entries(&fatbin(ENTRY_ELF, COMPRESSED_LZ4, 4, b"1234")).is_ok());
    }

    #[test]
    fn an_elf_image_spans_its_tables_and_sections() {
        let mut header = [0u8; ELF_HEADER];
        header[..4].copy_from_slice(&ELF_MAGIC);
        header[4] = 2;
        header[0x28..0x30].copy_from_slice(&1000u64.to_le_bytes());
        header[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        header[0x3c..0x3e].copy_from_slice(&2u16.to_le_bytes());
        let section = |offset: u64, size: u64, kind: u32| {
            let mut sh = [0u8; ELF_HEADER];
            sh[4..8].copy_from_slice(&kind.to_le_bytes());
            sh[0x18..0x20].copy_from_slice(&offset.to_le_bytes());
            sh[0x20..0x28].copy_from_slice(&size.to_le_bytes());
            sh
        };
        let sections = |o: u64| match o {
            1000 => Some(section(2000, 500, 1)),
            1064 => Some(section(9000, 4000, 8)),
            _ => None,
        };
        assert_eq!(elf_len(&header, sections), Ok(2500), "a NOBITS section takes no bytes");
        assert!(elf_len(&header, |_| None).is_err());
        header[4] = 1;
        assert!(elf_len(&header, sections).is_err(), "32-bit");
    }

    proptest! {
        #[test]
        fn a_pruned_fatbin_keeps_exactly_the_entries_some_device_could_run(
            entries in proptest::collection::vec((1u16..4, 50u32..130, 0usize..4), 1..8),
            archs in proptest::collection::vec(50u32..130, 1..3),
        ) {
            let made: Vec<Vec<u8>> =
                entries.iter().map(|&(kind, arch, words)| entry(kind, arch, 0, 0, &vec![kind as u8; 8 * words])).collect();
            let image = fatbin_of(&made);
            let all = fatbin_entries(&image).unwrap();
            let runnable: Vec<_> = all.iter().filter(|e| archs.iter().any(|&d| runs_on(e, d))).map(|e| e.header).collect();
            match fatbin_for(&image, &archs) {
                None => prop_assert!(runnable.is_empty() || runnable.len() == all.len()),
                Some(pruned) => {
                    let kept: Vec<_> = fatbin_entries(&pruned).unwrap().iter().map(|e| e.header).collect();
                    prop_assert_eq!(kept, runnable);
                }
            }
        }

        #[test]
        fn any_bytes_read_as_a_fatbin_stay_inside(image in proptest::collection::vec(any::<u8>(), 0..512)) {
            let inside = |s: &[u8]| {
                let (start, end) = (image.as_ptr() as usize, image.as_ptr() as usize + image.len());
                s.as_ptr() as usize >= start && s.as_ptr() as usize + s.len() <= end
            };
            if let Ok(entries) = fatbin_entries(&image) {
                for e in entries {
                    prop_assert!(inside(e.header) && inside(e.payload));
                }
            }
        }
    }
}
