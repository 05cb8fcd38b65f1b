//! What a module image holds, read without a driver.
//!
//! The CUDA backend asks the driver about a loaded module; the emulated backend has no driver to
//! ask, so it reads the image a client loads (cuModuleLoadData, cuLibraryLoadData) itself: each
//! kernel's parameter layout (to copy launch parameters), static shared memory, registers and
//! launch bound (for attribute queries), and each `__device__` / `__constant__` variable with its
//! initial bytes (for cuModuleGetGlobal). The bytes come from an untrusted client: every offset
//! and length is checked against the input, and nothing here panics.
//!
//! Checked against CUDA 13.0 nvcc output and an H100 driver (see `testdata/README.md`):
//! - fatbins (magic 0xBA55ED50) with plain, LZ4 or Zstd entries: the ELF entry of the highest
//!   arch is read, else the PTX entry of the highest arch;
//! - 64-bit cubins: kernels are the functions marked as entries, laid out by `.nv.info.<name>`;
//! - PTX: parameters get natural alignment, as the driver gives them; initialisers listing
//!   integers or hex floats are read, others (addresses, decimal floats) read as zeros; static
//!   shared memory counts the `.shared` declared inside the entry only; registers are 0 (unknown
//!   before JIT).
//!
//! Not supported: the fatbin wrapper (0x466243B1, which the client resolves), CUDA 11's fatbin
//! compression (flag 0x1000), 32-bit cubins, relocated initialisers (a pointer-valued global
//! reads as its unrelocated bytes). Kernels and globals come sorted by name.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Read;

use object::elf::{EM_CUDA, SHT_NOBITS, STT_FUNC, STT_OBJECT};
use object::read::elf::{ElfFile64, FileHeader, SectionHeader, Sym};
use object::{LittleEndian, Object, ObjectSection, ObjectSymbol};

use gpuplex_image::{
    COMPRESSED_LZ4, COMPRESSED_OLD, COMPRESSED_ZSTD, ENTRY_ELF, ENTRY_PTX, FATBIN_MAGIC, FATBIN_WRAPPER_MAGIC,
};

use crate::backend::ParamSlot;

/// A module image's contents.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Image {
    pub kernels: Vec<KernelInfo>,
    pub globals: Vec<GlobalInfo>,
}

/// One kernel (`.entry`) of an image.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct KernelInfo {
    /// As cuModuleGetFunction expects it: mangled unless `extern "C"`.
    pub name: String,
    /// In parameter order.
    pub params: Vec<ParamSlot>,
    /// Size of the whole parameter buffer.
    pub param_bytes: u32,
    /// Static shared memory, as CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES says.
    pub shared_bytes: u32,
    /// Registers per thread if the image records them, else 0.
    pub registers: u32,
    /// From `__launch_bounds__` (`.maxntid`) or `.reqntid`, if any.
    pub max_threads_per_block: Option<u32>,
}

/// One `__device__` or `__constant__` variable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GlobalInfo {
    pub name: String,
    pub size: u64,
    /// Initial contents, `size` bytes (zeros where none are given).
    pub init: Vec<u8>,
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ImageError {
    #[error("image is a fatbin wrapper, not a fatbin")]
    Wrapper,
    #[error("unrecognised image format")]
    UnknownFormat,
    #[error("malformed fatbin: {0}")]
    Fatbin(&'static str),
    #[error("fatbin holds no ELF or PTX entry")]
    NoEntry,
    #[error("unsupported fatbin compression (flags {0:#x})")]
    Compression(u64),
    #[error("corrupt compressed fatbin entry")]
    Decompress,
    #[error("malformed cubin: {0}")]
    Elf(String),
    #[error("malformed PTX: {0}")]
    Ptx(String),
    #[error("image needs more than 1 GiB")]
    TooLarge,
}

/// Reads what `image` (fatbin, cubin or PTX) holds.
pub fn parse(image: &[u8]) -> Result<Image, ImageError> {
    let mut img = match u32_at(image, 0) {
        Some(FATBIN_MAGIC) => {
            let entry = select_entry(image)?;
            let data = entry_payload(&entry)?;
            match entry.kind {
                EntryKind::Elf => parse_cubin(&data)?,
                EntryKind::Ptx => parse_ptx(&data)?,
            }
        }
        Some(FATBIN_WRAPPER_MAGIC) => return Err(ImageError::Wrapper),
        _ if image.starts_with(b"\x7fELF") => parse_cubin(image)?,
        _ if looks_like_ptx(image) => parse_ptx(image)?,
        _ => return Err(ImageError::UnknownFormat),
    };
    img.kernels.sort_by(|a, b| a.name.cmp(&b.name));
    img.globals.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(img)
}

/// Little-endian integer of `n` bytes at `at`, if in bounds.
fn le(b: &[u8], at: usize, n: usize) -> Option<u64> {
    let bytes = b.get(at..at.checked_add(n)?)?;
    Some(bytes.iter().rev().fold(0, |v, &x| v << 8 | u64::from(x)))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    le(b, at, 4).map(|v| v as u32)
}

/// Cap on a decompressed entry, and on all globals of an image together.
const MAX_BYTES: u64 = 1 << 30;

/// Counts `n` more bytes of globals against [`MAX_BYTES`].
fn charge(total: &mut u64, n: u64) -> Result<usize, ImageError> {
    *total = total.checked_add(n).filter(|&t| t <= MAX_BYTES).ok_or(ImageError::TooLarge)?;
    usize::try_from(n).map_err(|_| ImageError::TooLarge)
}

// ---- fatbin ----

/// Ordered so that the preferred kind compares greater.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum EntryKind {
    Ptx,
    Elf,
}

struct Entry<'a> {
    kind: EntryKind,
    framed: gpuplex_image::Entry<'a>,
}

/// Picks the entry to read: ELF over PTX, then the highest arch.
fn select_entry(data: &[u8]) -> Result<Entry<'_>, ImageError> {
    entries(data)?.into_iter().max_by_key(|e| (e.kind, e.framed.arch)).ok_or(ImageError::NoEntry)
}

/// Every entry of a fatbin that holds code, in order.
fn entries(data: &[u8]) -> Result<Vec<Entry<'_>>, ImageError> {
    let framed = gpuplex_image::fatbin_entries(data).map_err(ImageError::Fatbin)?;
    // Other kinds (none seen so far) carry no code.
    let kind = |e: &gpuplex_image::Entry<'_>| match e.kind {
        ENTRY_PTX => Some(EntryKind::Ptx),
        ENTRY_ELF => Some(EntryKind::Elf),
        _ => None,
    };
    Ok(framed.into_iter().filter_map(|framed| Some(Entry { kind: kind(&framed)?, framed })).collect())
}

/// The entry's image, decompressed if need be.
fn entry_payload<'a>(e: &Entry<'a>) -> Result<Cow<'a, [u8]>, ImageError> {
    let (method, e) = (e.framed.compression(), &e.framed);
    if method & COMPRESSED_OLD != 0 || method == COMPRESSED_LZ4 | COMPRESSED_ZSTD {
        return Err(ImageError::Compression(e.flags));
    } else if method == 0 {
        return Ok(Cow::Borrowed(e.payload));
    }
    // The framing checked that the compressed bytes lie inside the payload.
    let input = &e.payload[..e.compressed as usize];
    let size = e.decompressed;
    if input.is_empty() {
        return Err(ImageError::Fatbin("an empty compressed entry"));
    }
    if size > MAX_BYTES {
        return Err(ImageError::TooLarge);
    }
    let out = match method {
        COMPRESSED_LZ4 => {
            // The output is preallocated, so its size must be one LZ4 can reach: a block expands
            // at most about 255 times.
            if size > (input.len() as u64).saturating_mul(255).saturating_add(64) {
                return Err(ImageError::Decompress);
            }
            let mut out = vec![0; size as usize];
            let n = lz4_flex::block::decompress_into(input, &mut out);
            out.truncate(n.map_err(|_| ImageError::Decompress)?);
            out
        }
        COMPRESSED_ZSTD => {
            // Grows as it is decoded, never sized from the header (ruzstd caps its window at 100 MiB).
            let dec = ruzstd::decoding::StreamingDecoder::new(input).map_err(|_| ImageError::Decompress)?;
            let mut out = Vec::new();
            dec.take(size + 1).read_to_end(&mut out).map_err(|_| ImageError::Decompress)?;
            out
        }
        _ => return Err(ImageError::Compression(e.flags)),
    };
    if out.len() as u64 != size {
        return Err(ImageError::Decompress);
    }
    Ok(Cow::Owned(out))
}

// ---- footprint ----

/// Device memory loading `image` may take: the code and data the driver
/// keeps and every global, zero-initialised ones included. A fatbin counts
/// as its largest entry, since the driver loads one of them and which one
/// depends on the device. Only sizes are read: nothing the size of a global
/// is allocated here.
pub fn footprint(image: &[u8]) -> Result<u64, ImageError> {
    match u32_at(image, 0) {
        Some(FATBIN_MAGIC) => {
            let mut most = 0;
            for entry in entries(image)? {
                let data = entry_payload(&entry)?;
                most = most.max(match entry.kind {
                    EntryKind::Elf => cubin_footprint(&data)?,
                    EntryKind::Ptx => ptx_footprint(&data)?,
                });
            }
            Ok(most)
        }
        Some(FATBIN_WRAPPER_MAGIC) => Err(ImageError::Wrapper),
        _ if image.starts_with(b"\x7fELF") => cubin_footprint(image),
        _ if looks_like_ptx(image) => ptx_footprint(image),
        _ => Err(ImageError::UnknownFormat),
    }
}

/// The sections a cubin loads, by size: code, constants, globals. Shared
/// and local memory are per block and per thread, not the module's.
fn cubin_footprint(data: &[u8]) -> Result<u64, ImageError> {
    with_aligned(data, |data| {
        let elf = Elf::parse(data).map_err(elf_err)?;
        let mut total = 0u64;
        for s in elf.sections() {
            let object::SectionFlags::Elf { sh_flags } = s.flags() else { continue };
            let name = s.name().unwrap_or_default();
            if sh_flags & u64::from(object::elf::SHF_ALLOC) == 0
                || name.starts_with(".nv.shared.")
                || name.starts_with(".nv.local.")
            {
                continue;
            }
            total = total.saturating_add(s.size());
        }
        Ok(total)
    })
}

/// PTX's own length (what it compiles to is about as large) and its
/// module-scope `.global` and `.const` variables.
fn ptx_footprint(bytes: &[u8]) -> Result<u64, ImageError> {
    let text = bytes.split(|&b| b == 0).next().unwrap_or_default();
    let mut total = text.len() as u64;
    walk_ptx(
        text,
        |stmt| {
            let linkage = [".visible", ".weak", ".extern", ".common"];
            if matches!(stmt.iter().find(|t| !linkage.contains(t)), Some(&".global" | &".const")) {
                let d = decl(stmt)?;
                if !d.is_extern {
                    total = total.saturating_add(d.size()?);
                }
            }
            Ok(())
        },
        |_, _| Ok(()),
    )?;
    Ok(total)
}

// ---- cubin ----

type Elf<'a> = ElfFile64<'a, LittleEndian>;

/// `st_other` bit of kernels; device functions lack it.
const STO_CUDA_ENTRY: u8 = 0x10;
/// Symbol type of variables in relocatable (`-rdc`) cubins.
const STT_CUDA_OBJECT: u8 = 13;
/// sm_90+ cubins (those that refer to `.nv.reservedSmem.offset0`) count the driver's 1 KiB
/// reserved area in each `.nv.shared.<kernel>`, which the driver does not report (seen on an
/// H100: 2048-byte sections, 1024 reported, with and without `-G`).
const RESERVED_SMEM: u32 = 1024;

const EIFMT_SVAL: u8 = 0x04;
const EIATTR_MAX_THREADS: u8 = 0x05;
const EIATTR_REQNTID: u8 = 0x10;
const EIATTR_KPARAM_INFO: u8 = 0x17;
/// Used instead of EIATTR_KPARAM_INFO by some kernels with large parameters.
const EIATTR_KPARAM_INFO_V2: u8 = 0x45;
const EIATTR_CBANK_PARAM_SIZE: u8 = 0x19;
const EIATTR_REGCOUNT: u8 = 0x2f;

fn elf_err(e: impl std::fmt::Display) -> ImageError {
    ImageError::Elf(e.to_string())
}

fn parse_cubin(data: &[u8]) -> Result<Image, ImageError> {
    with_aligned(data, parse_aligned_cubin)
}

/// Runs `f` on `data` 8-byte aligned, as `object` reads ELF structures in
/// place (copied if it is not).
fn with_aligned<T>(data: &[u8], f: impl FnOnce(&[u8]) -> Result<T, ImageError>) -> Result<T, ImageError> {
    if data.as_ptr() as usize & 7 == 0 {
        return f(data);
    }
    let mut buf = vec![0u8; data.len() + 7];
    let skip = (8 - (buf.as_ptr() as usize & 7)) & 7;
    match buf.get_mut(skip..skip + data.len()) {
        Some(copy) => {
            copy.copy_from_slice(data);
            f(copy)
        }
        None => Err(elf_err("cannot align the image")),
    }
}

fn parse_aligned_cubin(data: &[u8]) -> Result<Image, ImageError> {
    let elf = Elf::parse(data).map_err(elf_err)?;
    let en = elf.endian();
    if elf.elf_header().e_machine(en) != EM_CUDA {
        return Err(elf_err("not a CUDA ELF"));
    }
    // First of each name, as `section_by_name` (a scan per call) would find.
    let mut by_name = HashMap::new();
    for s in elf.sections() {
        if let Ok(n) = s.name() {
            by_name.entry(n).or_insert(s.index());
        }
    }
    let section = |name: &str| by_name.get(name).and_then(|&i| elf.section_by_index(i).ok());
    let bytes_of = |name: &str| section(name).map_or(Ok(&[][..]), |s| s.data().map_err(elf_err));
    // Kernel symbol index -> registers, from the module-wide .nv.info.
    let mut regs = HashMap::new();
    for (attr, _, p) in nv_info(bytes_of(".nv.info")?)? {
        if let (EIATTR_REGCOUNT, Some(sym)) = (attr, u32_at(p, 0)) {
            regs.extend(u32_at(p, 4).map(|n| (sym as usize, n)));
        }
    }
    let reserved = elf.symbol_by_name(".nv.reservedSmem.offset0").is_some();
    let (mut img, mut total) = (Image::default(), 0);
    for sym in elf.symbols() {
        let Some(index) = sym.section_index() else {
            continue;
        };
        let (raw, sec) = (sym.elf_symbol(), elf.section_by_index(index).map_err(elf_err)?);
        let (ty, sec_name) = (raw.st_type(), sec.name().map_err(elf_err)?);
        if ty == STT_FUNC && raw.st_other() & STO_CUDA_ENTRY != 0 {
            let name = sym.name().map_err(elf_err)?;
            if sec_name.strip_prefix(".text.") == Some(name) {
                let info = bytes_of(&format!(".nv.info.{name}"))?;
                let shared = section(&format!(".nv.shared.{name}")).map(|s| s.size());
                let mut k = cubin_kernel(name, info, shared, reserved)?;
                // Older cubins keep the count in the top byte of sh_info.
                let old = sec.elf_section_header().sh_info(en) >> 24;
                k.registers = regs.get(&sym.index().0).copied().unwrap_or(old);
                img.kernels.push(k);
            }
        } else if (ty == STT_OBJECT || ty == STT_CUDA_OBJECT) && is_var_section(sec_name) {
            let name = sym.name().map_err(elf_err)?.to_owned();
            let (value, size) = (raw.st_value(en), raw.st_size(en));
            let outside = || elf_err(format!("variable {name} lies outside its section"));
            let start = value.checked_sub(sec.address()).ok_or_else(outside)?;
            let end = start.checked_add(size).filter(|&e| e <= sec.size());
            let end = end.ok_or_else(outside)?;
            let n = charge(&mut total, size)?;
            let init = if sec.elf_section_header().sh_type(en) == SHT_NOBITS {
                vec![0; n]
            } else {
                let bytes = sec.data().map_err(elf_err)?;
                let range = usize::try_from(start).ok().zip(usize::try_from(end).ok());
                range.and_then(|(s, e)| bytes.get(s..e)).ok_or_else(outside)?.to_vec()
            };
            img.globals.push(GlobalInfo { name, size, init });
        }
    }
    Ok(img)
}

/// Sections whose variables cuModuleGetGlobal finds.
fn is_var_section(name: &str) -> bool {
    let bank = name.strip_prefix(".nv.constant");
    name == ".nv.global"
        || name == ".nv.global.init"
        || bank.is_some_and(|n| !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()))
}

/// A kernel from its `.nv.info.<name>` and the size of its `.nv.shared.<name>`.
fn cubin_kernel(name: &str, info: &[u8], shared: Option<u64>, reserved: bool) -> Result<KernelInfo, ImageError> {
    let mut k = KernelInfo { name: name.to_owned(), ..KernelInfo::default() };
    let (mut slots, mut cbank_size, mut reqntid) = (Vec::new(), None, None);
    for (attr, value, p) in nv_info(info)? {
        match attr {
            // u32 index, u16 ordinal, u16 offset, then a u32 that holds the size in bits 18..32
            // (V1) or is the size (V2).
            EIATTR_KPARAM_INFO | EIATTR_KPARAM_INFO_V2 => {
                let (Some(ord), Some(offset), Some(last)) = (le(p, 4, 2), le(p, 6, 2), u32_at(p, 8)) else {
                    return Err(elf_err(format!("short parameter record in {name}")));
                };
                let size = if attr == EIATTR_KPARAM_INFO { (last >> 18) & 0x3fff } else { last };
                slots.push((ord, ParamSlot { offset: offset as u32, size }));
            }
            EIATTR_CBANK_PARAM_SIZE => cbank_size = Some(value),
            EIATTR_MAX_THREADS => k.max_threads_per_block = threads(p),
            EIATTR_REQNTID => reqntid = threads(p),
            _ => {}
        }
    }
    k.max_threads_per_block = k.max_threads_per_block.or(reqntid);
    // The records come last parameter first.
    slots.sort_by_key(|s| s.0);
    if slots.iter().enumerate().any(|(i, s)| s.0 != i as u64) {
        return Err(elf_err(format!("parameter ordinals of {name} are not 0..n")));
    }
    k.params = slots.into_iter().map(|s| s.1).collect();
    let end = k.params.iter().try_fold(0u32, |m, p| Some(m.max(p.offset.checked_add(p.size)?)));
    k.param_bytes = cbank_size.or(end).unwrap_or(0);
    if end.is_none_or(|e| e > k.param_bytes) {
        return Err(elf_err(format!("parameters of {name} overrun their buffer")));
    }
    if let Some(size) = shared {
        let size = u32::try_from(size).map_err(|_| elf_err("shared section too large"))?;
        k.shared_bytes = if reserved { size.saturating_sub(RESERVED_SMEM) } else { size };
    }
    Ok(k)
}

/// The product of an `{x, y, z}` record, if it is one.
fn threads(p: &[u8]) -> Option<u32> {
    let (x, y, z) = (u32_at(p, 0)?, u32_at(p, 4)?, u32_at(p, 8)?);
    x.checked_mul(y)?.checked_mul(z).filter(|&n| n > 0)
}

/// A `.nv.info` record: u8 format, u8 attribute, u16 value or (format EIFMT_SVAL) payload length,
/// then the payload. Kept as (attribute, value or the payload's first u32, payload).
type Record<'a> = (u8, u32, &'a [u8]);

fn nv_info(mut b: &[u8]) -> Result<Vec<Record<'_>>, ImageError> {
    let mut out = Vec::new();
    while let (Some(&fmt), Some(&attr), Some(inline)) = (b.first(), b.get(1), le(b, 2, 2)) {
        if !(1..=EIFMT_SVAL).contains(&fmt) {
            return Err(elf_err(format!("unknown .nv.info record format {fmt:#x}")));
        }
        let sval = fmt == EIFMT_SVAL;
        let end = 4 + if sval { inline as usize } else { 0 };
        let payload = b.get(4..end).ok_or_else(|| elf_err("truncated .nv.info record"))?;
        let value = u32_at(payload, 0).filter(|_| sval);
        out.push((attr, value.unwrap_or(inline as u32), payload));
        b = b.get(end..).unwrap_or_default();
    }
    if !b.is_empty() {
        return Err(elf_err("truncated .nv.info record"));
    }
    Ok(out)
}

// ---- PTX ----

fn ptx_err(s: impl Into<String>) -> ImageError {
    ImageError::Ptx(s.into())
}

fn looks_like_ptx(b: &[u8]) -> bool {
    let t = b.trim_ascii_start();
    t.starts_with(b".") || t.starts_with(b"//") || t.starts_with(b"/*")
}

fn parse_ptx(bytes: &[u8]) -> Result<Image, ImageError> {
    // The driver reads PTX up to its NUL; fatbin entries are NUL-padded.
    let text = bytes.split(|&b| b == 0).next().unwrap_or_default();
    let (mut globals, mut kernels, mut total) = (Vec::new(), Vec::new(), 0);
    walk_ptx(
        text,
        |stmt| {
            globals.extend(ptx_global(stmt, &mut total)?);
            Ok(())
        },
        |head, body| {
            kernels.push(ptx_kernel(head, body)?);
            Ok(())
        },
    )?;
    Ok(Image { kernels, globals })
}

/// Calls `statement` with each module-scope statement ended by `;` and
/// `entry` with the head and body of each `.entry`.
fn walk_ptx(
    text: &[u8],
    mut statement: impl FnMut(&[&str]) -> Result<(), ImageError>,
    mut entry: impl FnMut(&[&str], &[&str]) -> Result<(), ImageError>,
) -> Result<(), ImageError> {
    let toks = tokenize(std::str::from_utf8(text).map_err(|_| ptx_err("not UTF-8"))?)?;
    if toks.first() != Some(&".version") {
        return Err(ptx_err("no leading .version"));
    }
    let (mut i, mut start) = (0, 0);
    // Whether the statement so far has an `=`, whose `{` opens an initialiser, not a body.
    let mut init = false;
    while let Some(&t) = toks.get(i) {
        // Directives ended by the line rather than by a ';'.
        if i == start && [".version", ".target", ".address_size", ".file"].contains(&t) {
            i += if t == ".file" { 3 } else { 2 };
            while toks.get(i) == Some(&",") {
                i += 2;
            }
            start = i;
            continue;
        }
        init |= t == "=";
        let head = toks.get(start..i).unwrap_or_default();
        match t {
            ";" => {
                statement(head)?;
                (i, start, init) = (i + 1, i + 1, false);
            }
            "{" => {
                let close = matching(&toks, i)?;
                if !init {
                    if head.contains(&".entry") {
                        entry(head, toks.get(i + 1..close).unwrap_or_default())?;
                    }
                    start = close + 1;
                }
                i = close + 1;
            }
            "}" => return Err(ptx_err("unbalanced '}'")),
            _ => i += 1,
        }
    }
    if start < toks.len() {
        return Err(ptx_err("unterminated statement at the end"));
    }
    Ok(())
}

fn tokenize(s: &str) -> Result<Vec<&str>, ImageError> {
    let b = s.as_bytes();
    let word = |c: &u8| c.is_ascii_alphanumeric() || b"_$%.".contains(c);
    let find = |from: usize, pat: &str| s.get(from..).and_then(|r| r.find(pat)).map(|p| p + from);
    let (mut out, mut i) = (Vec::new(), 0);
    while let Some(c) = b.get(i) {
        let (start, rest) = (i, b.get(i..).unwrap_or_default());
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        } else if rest.starts_with(b"//") {
            i = find(i, "\n").unwrap_or(b.len());
            continue;
        } else if rest.starts_with(b"/*") {
            i = find(i + 2, "*/").ok_or_else(|| ptx_err("unterminated comment"))? + 2;
            continue;
        } else if *c == b'"' {
            i += 1;
            while b.get(i) != Some(&b'"') {
                i += if b.get(i) == Some(&b'\\') { 2 } else { 1 };
                if i >= b.len() {
                    return Err(ptx_err("unterminated string"));
                }
            }
            i += 1;
        } else if word(c) {
            i += rest.iter().take_while(|c| word(c)).count();
        } else if c.is_ascii() {
            i += 1;
        } else {
            return Err(ptx_err("non-ASCII character outside a string"));
        }
        out.push(s.get(start..i).ok_or_else(|| ptx_err("bad token"))?);
    }
    Ok(out)
}

/// Index of the `}` closing the `{` at `open`.
fn matching(toks: &[&str], open: usize) -> Result<usize, ImageError> {
    if toks.get(open) != Some(&"{") {
        return Err(ptx_err("expected '{'"));
    }
    let mut depth = 0;
    for (j, &t) in toks.iter().enumerate().skip(open) {
        match t {
            "{" => depth += 1,
            "}" if depth == 1 => return Ok(j),
            "}" => depth -= 1,
            _ => {}
        }
    }
    Err(ptx_err("unterminated block"))
}

/// A `.param` or variable declaration.
#[derive(Default)]
struct Decl<'a> {
    name: &'a str,
    /// Scalar size, the unit of initialisers.
    scalar: u64,
    /// `.v2` / `.v4`: scalars per element.
    vector: u64,
    /// Product of the array dimensions; None for `[]`.
    count: Option<u64>,
    align: Option<u64>,
    is_extern: bool,
    init: &'a [&'a str],
}

impl Decl<'_> {
    fn size(&self) -> Result<u64, ImageError> {
        let size = self.scalar.checked_mul(self.vector.max(1));
        let size = size.zip(self.count).and_then(|(e, n)| e.checked_mul(n));
        size.ok_or_else(|| ptx_err(format!("bad size of {}", self.name)))
    }
    /// (start, end) of this placed at or after `at`, aligned as given or else naturally.
    fn place(&self, at: u64) -> Result<(u64, u64), ImageError> {
        let a = self.align.unwrap_or(self.scalar.saturating_mul(self.vector.max(1))).max(1);
        let bad = || ptx_err(format!("bad alignment or size of {}", self.name));
        let start = at.checked_add(a - 1).filter(|_| a.is_power_of_two()).ok_or_else(bad)? & !(a - 1);
        Ok((start, start.checked_add(self.size()?).ok_or_else(bad)?))
    }
}

fn scalar_size(t: &str) -> Option<u64> {
    Some(match t {
        ".b8" | ".u8" | ".s8" => 1,
        ".b16" | ".u16" | ".s16" | ".f16" | ".bf16" => 2,
        ".b32" | ".u32" | ".s32" | ".f32" | ".f16x2" | ".bf16x2" => 4,
        ".b64" | ".u64" | ".s64" | ".f64" | ".texref" | ".samplerref" | ".surfref" => 8,
        ".b128" => 16,
        _ => return None,
    })
}

fn is_ident(t: &str) -> bool {
    t.bytes().next().is_some_and(|c| c.is_ascii_alphabetic() || b"_$%".contains(&c))
}

fn decl<'a>(toks: &'a [&'a str]) -> Result<Decl<'a>, ImageError> {
    let mut d = Decl { count: Some(1), ..Decl::default() };
    let (mut ptr, mut i) = (false, 0);
    let num = |j: usize| toks.get(j).and_then(|n| int_lit(n));
    while let Some(&t) = toks.get(i) {
        i += 1;
        if !d.name.is_empty() {
            match (t, toks.get(i)) {
                ("[", Some(&"]")) => (d.count, i) = (None, i + 1),
                ("[", _) if toks.get(i + 1) == Some(&"]") => {
                    let n = num(i).ok_or_else(|| ptx_err(format!("bad array size of {}", d.name)))?;
                    (d.count, i) = (d.count.and_then(|c| c.checked_mul(n)), i + 2);
                }
                ("=", _) => (d.init, i) = (toks.get(i..).unwrap_or_default(), toks.len()),
                _ => return Err(ptx_err(format!("unexpected {t:?} after {}", d.name))),
            }
        } else if t == ".align" {
            // After `.ptr`, `.align` is the pointee's alignment.
            let n = num(i).ok_or_else(|| ptx_err("bad .align"))?;
            (d.align, i) = (if ptr { d.align } else { Some(n) }, i + 1);
        } else if let Some(s) = scalar_size(t) {
            d.scalar = s;
        } else if let Some(v) = t.strip_prefix(".v").and_then(|v| v.parse().ok()) {
            d.vector = v;
        } else if t == "(" {
            // `.attribute(.managed)`
            let close = toks.get(i..).and_then(|r| r.iter().position(|&t| t == ")"));
            i += close.ok_or_else(|| ptx_err("unterminated '('"))? + 1;
        } else if is_ident(t) {
            d.name = t;
        } else if !t.starts_with('.') {
            return Err(ptx_err(format!("unexpected {t:?} in a declaration")));
        }
        ptr |= t == ".ptr";
        d.is_extern |= t == ".extern";
    }
    if d.name.is_empty() || d.scalar == 0 {
        return Err(ptx_err("declaration without a name or type"));
    }
    Ok(d)
}

fn ptx_kernel(head: &[&str], body: &[&str]) -> Result<KernelInfo, ImageError> {
    let at = head.iter().position(|&t| t == ".entry").unwrap_or_default();
    let name = head.get(at + 1).filter(|n| is_ident(n));
    let name = *name.ok_or_else(|| ptx_err(".entry without a name"))?;
    let mut k = KernelInfo { name: name.to_owned(), ..KernelInfo::default() };
    let rest = head.get(at + 2..).unwrap_or_default();
    let close = match rest.first() {
        Some(&"(") => rest.iter().position(|&t| t == ")"),
        _ => Some(0),
    };
    let close = close.ok_or_else(|| ptx_err("unterminated parameter list"))?;
    let (params, after) = (rest.get(1..close).unwrap_or_default(), rest.get(close + 1..));
    let too_big = || ptx_err(format!("parameters of {name} too large"));
    let mut end = 0;
    for p in params.split(|&t| t == ",").filter(|p| !p.is_empty()) {
        let (start, next) = decl(p)?.place(end)?;
        let slot = (u32::try_from(start).ok(), u32::try_from(next - start).ok());
        let (Some(offset), Some(size)) = slot else {
            return Err(too_big());
        };
        k.params.push(ParamSlot { offset, size });
        end = next;
    }
    k.param_bytes = u32::try_from(end).map_err(|_| too_big())?;
    // `.maxntid x[, y[, z]]`
    let after = after.unwrap_or_default();
    let bound = |dir: &str| {
        let mut j = after.iter().position(|&t| t == dir)? + 1;
        let mut n = u32::try_from(int_lit(after.get(j)?)?).ok()?;
        while after.get(j + 1) == Some(&",") {
            j += 2;
            n = n.checked_mul(u32::try_from(int_lit(after.get(j)?)?).ok()?)?;
        }
        (n > 0).then_some(n)
    };
    k.max_threads_per_block = bound(".maxntid").or_else(|| bound(".reqntid"));
    let mut shared = 0;
    for stmt in body.split(|&t| matches!(t, ";" | "{" | "}")) {
        if stmt.first() == Some(&".shared") {
            let d = decl(stmt)?;
            if !d.is_extern && d.count.is_some() {
                shared = d.place(shared)?.1;
            }
        }
    }
    k.shared_bytes = u32::try_from(shared).map_err(|_| too_big())?;
    Ok(k)
}

/// A module-scope `.global` / `.const` definition; None for other statements.
fn ptx_global(stmt: &[&str], total: &mut u64) -> Result<Option<GlobalInfo>, ImageError> {
    let linkage = [".visible", ".weak", ".extern", ".common"];
    let space = stmt.iter().find(|t| !linkage.contains(t));
    if !matches!(space, Some(&".global" | &".const")) {
        return Ok(None);
    }
    let d = decl(stmt)?;
    if d.is_extern {
        return Ok(None);
    }
    let size = d.size()?;
    let mut init = vec![0; charge(total, size)?];
    // Integers (braces flattened), `scalar` bytes each; anything else leaves the variable zero.
    let items: Vec<&str> = d.init.iter().copied().filter(|t| !matches!(*t, "{" | "}")).collect();
    let mut bytes = Vec::new();
    for item in items.split(|&t| t == ",").filter(|_| !items.is_empty()) {
        let v = match item {
            [n] => int_lit(n),
            ["-", n] => int_lit(n).map(u64::wrapping_neg),
            _ => None,
        };
        let Some(v) = v.filter(|_| d.scalar <= 8) else {
            bytes.clear();
            break;
        };
        bytes.extend(v.to_le_bytes().into_iter().take(d.scalar as usize));
        if bytes.len() > init.len() {
            return Err(ptx_err(format!("initialiser of {} is too long", d.name)));
        }
    }
    init.iter_mut().zip(bytes).for_each(|(dst, b)| *dst = b);
    Ok(Some(GlobalInfo { name: d.name.to_owned(), size, init }))
}

/// A PTX integer, or a hex float (`0f` + 8 digits, `0d` + 16) as its bits.
fn int_lit(t: &str) -> Option<u64> {
    let t = t.strip_suffix('U').unwrap_or(t).to_ascii_lowercase();
    let (digits, radix) = match t.as_bytes() {
        [b'0', b'x', ..] => (t.get(2..)?, 16),
        [b'0', b'f', ..] if t.len() == 10 => (t.get(2..)?, 16),
        [b'0', b'd', ..] if t.len() == 18 => (t.get(2..)?, 16),
        [b'0', b'b', ..] => (t.get(2..)?, 2),
        [b'0', _, ..] => (t.get(1..)?, 8),
        _ => (t.as_str(), 10),
    };
    let plain = !digits.is_empty() && digits.bytes().all(|c| c.is_ascii_alphanumeric());
    plain.then(|| u64::from_str_radix(digits, radix).ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: &[u8] = include_bytes!("../testdata/plain.fatbin");
    const ZSTD: &[u8] = include_bytes!("../testdata/zstd.fatbin");
    const LZ4: &[u8] = include_bytes!("../testdata/lz4.fatbin");
    const PTX_ONLY: &[u8] = include_bytes!("../testdata/ptxonly.fatbin");
    const CUBIN: &[u8] = include_bytes!("../testdata/sm90.cubin");
    const PTX: &[u8] = include_bytes!("../testdata/kernels.ptx");
    const BINARIES: [&[u8]; 5] = [PLAIN, ZSTD, LZ4, PTX_ONLY, CUBIN];
    /// char@0, short@2, int@4, double@8, 24-byte struct@16, pointer@40.
    const MIXED: [(u32, u32); 6] = [(0, 1), (2, 2), (4, 4), (8, 8), (16, 24), (40, 8)];

    fn kernel(name: &str, params: &[(u32, u32)], bytes: u32, regs: u32) -> KernelInfo {
        let params = params.iter().map(|&(offset, size)| ParamSlot { offset, size }).collect();
        KernelInfo { name: name.into(), params, param_bytes: bytes, registers: regs, ..Default::default() }
    }

    fn le_bytes<const N: usize>(v: &[impl Copy + Into<i128>]) -> Vec<u8> {
        v.iter().flat_map(|&x| x.into().to_le_bytes().into_iter().take(N)).collect()
    }

    /// kernels.cu as the H100 driver reported it for every fixture
    /// (registers of the sm_90 code; PTX has none).
    fn expected(ptx: bool) -> Image {
        let r = |n| if ptx { 0 } else { n };
        let reduce = KernelInfo {
            shared_bytes: 1024,
            max_threads_per_block: Some(256),
            ..kernel("reduce", &[(0, 8), (8, 8)], 16, r(12))
        };
        let kernels = vec![
            kernel("_Z5scaleIfEvPT_S0_j", &[(0, 8), (8, 4), (12, 4)], 16, r(8)),
            kernel("mixed", &MIXED, 48, r(13)),
            reduce,
        ];
        let global = |name: &str, init: Vec<u8>| GlobalInfo { name: name.into(), size: init.len() as u64, init };
        let globals = vec![
            global("answer", le_bytes::<8>(&[0x1122_3344_5566_7788i64])),
            global("buf", vec![0; 64]),
            global("coeffs", le_bytes::<4>(&[10, 20, 30, 40, 50, 60, 70, 80])),
            global("table", le_bytes::<4>(&[1, 2, 3, 4])),
        ];
        Image { kernels, globals }
    }

    #[test]
    fn mixed_kernel_has_c_layout() {
        let img = parse(CUBIN).expect("cubin parses");
        assert_eq!(img.kernels.get(1), Some(&kernel("mixed", &MIXED, 48, 13)));
    }

    #[test]
    fn every_fixture_yields_the_same_module() {
        for (i, bytes) in BINARIES.iter().enumerate() {
            assert_eq!(parse(bytes), Ok(expected(i == 3)), "fixture {i}");
            // Wherever it lies in memory.
            for skip in 1..8 {
                let buf = [&vec![0; skip][..], bytes].concat();
                assert_eq!(parse(&buf[skip..]), Ok(expected(i == 3)), "fixture {i} at {skip}");
            }
        }
        assert_eq!(parse(PTX), Ok(expected(true)));
        let terminated = [PTX, b"\0garbage"].concat();
        assert_eq!(parse(&terminated), Ok(expected(true)));
    }

    #[test]
    fn fixtures_are_the_kinds_they_claim() {
        let pick = |b| {
            let e = select_entry(b).expect("an entry");
            (e.kind, e.framed.arch, e.framed.compression())
        };
        assert_eq!(pick(PLAIN), (EntryKind::Elf, 90, 0));
        assert_eq!(pick(ZSTD), (EntryKind::Elf, 90, COMPRESSED_ZSTD));
        assert_eq!(pick(LZ4), (EntryKind::Elf, 90, COMPRESSED_LZ4));
        assert_eq!(pick(PTX_ONLY), (EntryKind::Ptx, 90, COMPRESSED_ZSTD));
    }

    #[test]
    fn rejects_wrappers_and_garbage() {
        assert_eq!(parse(&0x4662_43B1u32.to_le_bytes()), Err(ImageError::Wrapper));
        for junk in [&b""[..], b"\x7fEL", b"hello", &[0; 8], &[0xff; 64], b"\x7fELF\x02\x01"] {
            assert!(parse(junk).is_err(), "{junk:?}");
        }
        assert!(parse(b"// no version\n.entry k() {}").is_err());
        // One entry, of an unknown kind, then of a CUDA 11 compressed ELF.
        let mut f = PLAIN[..16 + 0x40].to_vec();
        f[8..16].copy_from_slice(&0x40u64.to_le_bytes());
        f[16..18].copy_from_slice(&7u16.to_le_bytes());
        f[24..32].copy_from_slice(&0u64.to_le_bytes());
        assert_eq!(parse(&f), Err(ImageError::NoEntry));
        f[16..18].copy_from_slice(&2u16.to_le_bytes());
        f[0x38..0x40].copy_from_slice(&0x1011u64.to_le_bytes());
        assert_eq!(parse(&f), Err(ImageError::Compression(0x1011)));
    }

    #[test]
    fn rejects_lying_decompressed_sizes() {
        for bytes in [ZSTD, LZ4] {
            // The sm_90 ELF entry, the second, is the one read.
            let second = 16 + 0x40 + le(bytes, 24, 8).unwrap_or(0) as usize;
            for size in [0u64, 9959, 9961, 1 << 29, 1 << 31, u64::MAX] {
                let mut f = bytes.to_vec();
                f[second + 0x38..second + 0x40].copy_from_slice(&size.to_le_bytes());
                assert!(parse(&f).is_err(), "size {size}");
            }
        }
    }

    #[test]
    fn truncations_are_errors() {
        for (i, bytes) in BINARIES.iter().enumerate() {
            for n in 0..bytes.len() {
                assert!(parse(&bytes[..n]).is_err(), "fixture {i} cut to {n}");
            }
        }
        // PTX cut after a statement is valid PTX; a cut inside `mixed` is not.
        let text = std::str::from_utf8(PTX).unwrap_or_default();
        let start = text.find(".visible .entry mixed").unwrap_or_default() + 16;
        let end = start + text[start..].find("\n}").unwrap_or_default();
        assert!(end > start + 100);
        for n in 0..PTX.len() {
            let r = parse(&PTX[..n]);
            assert!(r.is_err() || !(start..=end).contains(&n), "ptx cut to {n}");
        }
    }

    #[test]
    fn bit_flips_never_panic() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut rand = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        for bytes in BINARIES.into_iter().chain([PTX]) {
            for _ in 0..1500 {
                let mut f = bytes.to_vec();
                for _ in 0..=rand(4) {
                    f[rand(bytes.len())] ^= 1 << rand(8);
                }
                let _ = parse(&f);
            }
        }
    }

    #[test]
    fn nv_info_records() {
        // NVAL, HVAL 0x30, SVAL of 4 bytes.
        let b = [1, 0x36, 0, 0, 3, 0x19, 0x30, 0, 4, 0x37, 4, 0, 0x82, 0, 0, 0];
        let recs = nv_info(&b).expect("well formed");
        let got: Vec<_> = recs.iter().map(|r| (r.0, r.1)).collect();
        assert_eq!(got, [(0x36, 0), (0x19, 0x30), (0x37, 0x82)]);
        assert!(nv_info(&b[..10]).is_err());
        assert!(nv_info(&b[..6]).is_err());
        assert!(nv_info(&[9, 0, 0, 0]).is_err());
    }

    #[test]
    fn large_parameters() {
        // `.nv.info.big` of `struct B { int v[1100]; }; extern "C" __global__ void big(B b, int *out)`
        // (nvcc 13.0, sm_90): EIATTR_KPARAM_INFO_V2 records, which carry the size whole.
        let info = "04370400 82000000 04450c00 00000000 01003011 08000000 04450c00 00000000 00000000 30110000
            03500000 031bff00 035f0101 041c0400 d0000000 03193811 040a0800 23000000 10023811 04360400 08000000";
        let info: Vec<u8> = info
            .split_whitespace()
            .flat_map(|w| (0..4).map(move |i| &w[2 * i..2 * i + 2]))
            .map(|h| u8::from_str_radix(h, 16).unwrap_or_default())
            .collect();
        let k = cubin_kernel("big", &info, None, false);
        assert_eq!(k, Ok(kernel("big", &[(0, 4400), (4400, 8)], 4408, 0)));
    }

    #[test]
    fn ptx_globals() {
        let src = r#".version 9.0
            .target sm_90, texmode_independent
            .file 1 "/tmp/a//b.cu", 1, 2
            .extern .global .align 4 .b8 ext[];
            .global .s32 neg[3] = {-2, 0x10, 017};
            .global .align 8 .f32 one[2] = {0f3F800000};
            .global .f64 half = 0d3FE0000000000000;
            .global .u64 addr = generic(neg);
            .global .f32 dec = 1.5;
            .global .attribute(.managed) .align 4 .v2 .u32 vec[2] = {{1, 2}, {3, 4}};
            .global .b8 long[2] = {1, 2, 3};"#;
        let too_long = ImageError::Ptx("initialiser of long is too long".into());
        assert_eq!(parse(src.as_bytes()), Err(too_long));
        let img = parse(src.replace("{1, 2, 3}", "{1, 2}").as_bytes()).expect("parses");
        let got: Vec<_> = img.globals.iter().map(|g| (g.name.as_str(), g.init.clone())).collect();
        let want = [
            ("addr", vec![0; 8]),
            ("dec", vec![0; 4]),
            ("half", 0.5f64.to_le_bytes().to_vec()),
            ("long", vec![1, 2]),
            ("neg", le_bytes::<4>(&[-2, 16, 15])),
            ("one", le_bytes::<4>(&[0x3F80_0000, 0])),
            ("vec", le_bytes::<4>(&[1, 2, 3, 4])),
        ];
        assert_eq!(got, want.map(|(n, v)| (n, v.to_vec())));
    }

    #[test]
    fn ptx_entries() {
        let src = b".version 9.0\n.target sm_90\n.address_size 64\n
            .visible .entry k(.param .u8 a, .param .u64 .ptr .global .align 16 p,
                .param .v4 .f32 v, .param .align 4 .b8 s[6], .param .u16 h)
            .maxntid 64, 2 .minnctapersm 4
            { .reg .b32 %r<3>; .shared .align 2 .b8 x[3]; .shared .align 8 .u64 y[2];
              .extern .shared .align 16 .b8 dyn[]; $L1: ld.shared.u32 %r1, [x]; { ret; } }
            .entry none() .reqntid 32 { ret; }
            .func (.param .b32 r) f(.param .b32 x) { ret; }
            .section .debug_abbrev { .b8 17 .b8 1 }";
        let img = parse(src).expect("parses");
        let k = KernelInfo {
            shared_bytes: 24,
            max_threads_per_block: Some(128),
            ..kernel("k", &[(0, 1), (8, 8), (16, 16), (32, 6), (38, 2)], 40, 0)
        };
        let none = KernelInfo { max_threads_per_block: Some(32), ..kernel("none", &[], 0, 0) };
        assert_eq!(img.kernels, [k, none]);
        let bad = ["k(.param .b8 a[]) {}", "k(.param .b8 a) { ", "k(.param q) {}", "k(.param"];
        for b in bad {
            assert!(parse(format!(".version 9.0\n.entry {b}").as_bytes()).is_err(), "{b}");
        }
        assert!(parse(b".version 9.0\n.global .b8 g[1]").is_err());
    }

    #[test]
    fn global_bytes_are_capped() {
        let src = b".version 9.0\n.global .b8 a[1073741824];\n.global .b8 b[1];";
        assert_eq!(parse(src), Err(ImageError::TooLarge));
    }
}
