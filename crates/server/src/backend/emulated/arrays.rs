//! Arrays, texture and surface objects, and 2D and 3D copies on the
//! emulated device.
//!
//! An array's elements are kept row after row, slice after slice, as a
//! pitched allocation without padding would be; a layered or cubemap array
//! counts its layers as slices. Texture and surface objects are records of
//! what they read, which reference kernels sample through [`Device`]: point
//! sampling at unnormalized coordinates clamped to the texture, and fetches
//! from linear memory, which is what the test programs ask; anything else
//! is NOT_SUPPORTED.

use std::collections::HashMap;

use gpuplex_protocol::{
    element_bytes, ArrayDesc, CuError, ResourceDesc, ARRAY_CUBEMAP, ARRAY_LAYERED, COPY_ARRAY_LINEAR, RESOURCE_ARRAY,
    RESOURCE_LINEAR, RESOURCE_PITCH2D, TEXTURE_DESC_BYTES,
};

use super::memory::{self, Memory};
use super::{err, graph::Conditions, kernels::DeviceMemory, BResult, Emulated, Obj};
use crate::backend;
use crate::backend::{Copy3D, CopyEnd, Place};

/// `CUDA_ARRAY3D_LAYERED`, `_SURFACE_LDST`, `_CUBEMAP`, `_TEXTURE_GATHER`:
/// the flags of arrays the test device makes.
const FLAGS: u32 = 0x01 | 0x02 | 0x04 | 0x08;

#[derive(Default)]
pub struct Arrays {
    next: u64,
    arrays: HashMap<u64, Array>,
    objects: HashMap<u64, Object>,
    /// Mipmapped arrays: each level's array.
    mipmaps: HashMap<u64, Vec<Obj>>,
}

/// A texture or surface object: its context, what it reads, and for a
/// texture how (its `CUDA_TEXTURE_DESC`).
struct Object {
    ctx: u64,
    res: ResourceDesc,
    tex: Option<[u8; TEXTURE_DESC_BYTES]>,
}

struct Array {
    ctx: u64,
    desc: ArrayDesc,
    /// Bytes of a row.
    row: u64,
    data: Vec<u8>,
}

impl Array {
    fn rows(&self) -> u64 {
        self.desc.height.max(1)
    }

    fn slices(&self) -> u64 {
        self.desc.depth.max(1)
    }
}

impl Arrays {
    fn next_id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    pub fn create(&mut self, memory: &mut Memory, ctx: u64, desc: &ArrayDesc) -> BResult<Obj> {
        let elem = element_bytes(desc.format, desc.channels)?;
        if desc.width == 0 || desc.flags & !FLAGS != 0 {
            return Err(CuError::INVALID_VALUE.into());
        }
        let row = desc.width.checked_mul(elem).ok_or(CuError::INVALID_VALUE)?;
        let bytes = row
            .checked_mul(desc.height.max(1))
            .and_then(|b| b.checked_mul(desc.depth.max(1)))
            .ok_or(CuError::OUT_OF_MEMORY)?;
        memory.charge(bytes)?;
        let data = match memory::zeroed(bytes) {
            Ok(data) => data,
            Err(e) => {
                memory.uncharge(bytes);
                return Err(e.into());
            }
        };
        let id = self.next_id();
        self.arrays.insert(id, Array { ctx, desc: desc.clone(), row, data });
        Ok(Obj(id))
    }

    fn array(&mut self, array: Obj) -> BResult<&mut Array> {
        self.arrays.get_mut(&array.0).ok_or_else(|| err(CuError::INVALID_HANDLE, "no such array"))
    }

    pub fn destroy(&mut self, memory: &mut Memory, array: Obj) -> BResult<()> {
        let a = self.arrays.remove(&array.0).ok_or_else(|| err(CuError::INVALID_HANDLE, "no such array"))?;
        memory.uncharge(a.data.len() as u64);
        Ok(())
    }

    /// A mipmapped array: an array per level, each a halving of the last.
    pub fn mipmap_create(&mut self, memory: &mut Memory, ctx: u64, desc: &ArrayDesc, levels: u32) -> BResult<Obj> {
        let largest = desc.width.max(desc.height).max(if desc.flags & (ARRAY_LAYERED | ARRAY_CUBEMAP) != 0 {
            0
        } else {
            desc.depth
        });
        // As the driver, no more levels than halvings of the largest extent.
        if levels == 0 || u64::from(levels) > 64 - u64::from(largest.leading_zeros()) {
            return Err(err(CuError::INVALID_VALUE, format!("{levels} levels for a largest extent of {largest}")));
        }
        let mut made = Vec::with_capacity(levels as usize);
        for level in 0..levels {
            match self.create(memory, ctx, &desc.mip_level(level)) {
                Ok(array) => made.push(array),
                Err(e) => {
                    for array in made {
                        let _ = self.destroy(memory, array);
                    }
                    return Err(e);
                }
            }
        }
        let id = self.next_id();
        self.mipmaps.insert(id, made);
        Ok(Obj(id))
    }

    pub fn mipmap_level(&self, mipmap: Obj, level: u32) -> BResult<Obj> {
        let levels =
            self.mipmaps.get(&mipmap.0).ok_or_else(|| err(CuError::INVALID_HANDLE, "no such mipmapped array"))?;
        levels.get(level as usize).copied().ok_or_else(|| err(CuError::INVALID_VALUE, format!("no level {level}")))
    }

    pub fn mipmap_destroy(&mut self, memory: &mut Memory, mipmap: Obj) -> BResult<()> {
        let levels =
            self.mipmaps.remove(&mipmap.0).ok_or_else(|| err(CuError::INVALID_HANDLE, "no such mipmapped array"))?;
        for array in levels {
            self.destroy(memory, array)?;
        }
        Ok(())
    }

    pub fn descriptor(&mut self, array: Obj) -> BResult<ArrayDesc> {
        Ok(self.array(array)?.desc.clone())
    }

    /// Frees what a destroyed context held.
    pub fn context_gone(&mut self, memory: &mut Memory, ctx: u64) {
        self.arrays.retain(|_, a| {
            if a.ctx == ctx {
                memory.uncharge(a.data.len() as u64);
            }
            a.ctx != ctx
        });
        self.objects.retain(|_, o| o.ctx != ctx);
        let arrays = &self.arrays;
        self.mipmaps.retain(|_, levels| levels.iter().all(|a| arrays.contains_key(&a.0)));
    }

    /// Copies row by row, a bounded piece of a row at a time.
    ///
    /// # Safety
    /// Host ends are valid for the rows the copy reads or writes.
    pub unsafe fn copy(&mut self, memory: &mut Memory, c: &Copy3D) -> BResult<()> {
        const PIECE: u64 = 1 << 20;
        let linear = c.shape == COPY_ARRAY_LINEAR;
        for end in [&c.src, &c.dst] {
            // Rows and slices of linear memory may not overlap: the driver
            // refuses that too, and it bounds the rows by the memory's size.
            let flat = matches!(end.place, Place::Host(_) | Place::Device(_));
            let rows = flat && c.height > 1 && end.pitch < end.x.saturating_add(c.width);
            let slices = flat && c.depth > 1 && end.height < end.y.saturating_add(c.height);
            if rows || slices {
                return Err(err(CuError::INVALID_VALUE, "a pitch or slice height smaller than the copy"));
            }
        }
        let mut buf = memory::zeroed(c.width.min(PIECE))?;
        for z in 0..c.depth {
            for y in 0..c.height {
                let mut dx = 0;
                while dx < c.width {
                    let piece = &mut buf[..(c.width - dx).min(PIECE) as usize];
                    // SAFETY: the caller's guarantee.
                    unsafe {
                        self.row(memory, &c.src, [dx, y, z], linear, Row::Read(piece))?;
                        self.row(memory, &c.dst, [dx, y, z], linear, Row::Write(piece))?;
                    }
                    dx += piece.len() as u64;
                }
            }
        }
        Ok(())
    }

    /// Reads or writes the piece of a row at `[dx, y, z]` from one end's first byte.
    ///
    /// # Safety
    /// As for [`Arrays::copy`].
    unsafe fn row(
        &mut self,
        memory: &mut Memory,
        end: &CopyEnd,
        [dx, y, z]: [u64; 3],
        linear: bool,
        row: Row<'_>,
    ) -> BResult<()> {
        let bad = || err(CuError::INVALID_VALUE, "a copy outside its memory");
        let width = row.len() as u64;
        let x = end.x.checked_add(dx).ok_or_else(bad)?;
        let (ey, ez) = (end.y.checked_add(y).ok_or_else(bad)?, end.z.checked_add(z).ok_or_else(bad)?);
        let offset = |pitch: u64, height: u64| -> Option<u64> {
            ez.checked_mul(height)?.checked_add(ey)?.checked_mul(pitch)?.checked_add(x)
        };
        match end.place {
            Place::Host(p) => {
                let at = offset(end.pitch, end.height).ok_or_else(bad)? as usize;
                // SAFETY: the caller's guarantee.
                unsafe {
                    match row {
                        Row::Read(out) => std::ptr::copy_nonoverlapping(p.add(at), out.as_mut_ptr(), out.len()),
                        Row::Write(data) => std::ptr::copy_nonoverlapping(data.as_ptr(), p.add(at), data.len()),
                    }
                }
                Ok(())
            }
            Place::Device(d) => {
                let at = d.checked_add(offset(end.pitch, end.height).ok_or_else(bad)?).ok_or_else(bad)?;
                let done = match row {
                    Row::Read(out) => memory.read_at(at, out),
                    Row::Write(data) => memory.write_at(at, data),
                };
                done.then_some(()).ok_or_else(bad)
            }
            Place::Array(a) => {
                let a = self.array(a)?;
                // A linear copy's offset runs on across rows; a 2D or 3D
                // copy stays inside one row of one slice.
                let inside = linear || (x.saturating_add(width) <= a.row && ey < a.rows() && ez < a.slices());
                let at = if linear { Some(x) } else { offset(a.row, a.rows()) };
                let range = at.filter(|_| inside).and_then(|at| Some(at as usize..(at.checked_add(width)?) as usize));
                let bytes = range.and_then(|r| a.data.get_mut(r)).ok_or_else(bad)?;
                match row {
                    Row::Read(out) => out.copy_from_slice(bytes),
                    Row::Write(data) => bytes.copy_from_slice(data),
                }
                Ok(())
            }
        }
    }

    /// A texture object over `res` (with its descriptor's bytes), or a
    /// surface object (`tex` None), whose array if any is the device's.
    pub fn object(&mut self, ctx: u64, res: &ResourceDesc, tex: Option<&[u8]>) -> BResult<u64> {
        if res.kind == RESOURCE_ARRAY {
            let a = self.array(Obj(res.at))?;
            if tex.is_none() && a.desc.flags & 0x02 == 0 {
                return Err(err(CuError::INVALID_VALUE, "a surface needs an array made for load and store"));
            }
        } else if tex.is_none() {
            return Err(err(CuError::INVALID_VALUE, "a surface reads an array"));
        }
        let tex = tex.map(|t| t.try_into()).transpose().map_err(|_| CuError::INVALID_VALUE)?;
        let id = self.next_id();
        self.objects.insert(id, Object { ctx, res: res.clone(), tex });
        Ok(id)
    }

    pub fn destroy_object(&mut self, object: u64) -> BResult<()> {
        self.objects.remove(&object).map(drop).ok_or_else(|| err(CuError::INVALID_VALUE, "no such object"))
    }
}

/// `CUDA_TEXTURE_DESC`'s address modes, filter mode and flags, at their
/// offsets: `CU_TR_ADDRESS_MODE_CLAMP`, `CU_TR_FILTER_MODE_POINT`,
/// `CU_TRSF_READ_AS_INTEGER`, `CU_TRSF_NORMALIZED_COORDINATES`.
const CLAMP: u32 = 1;
const POINT: u32 = 0;
const READ_AS_INTEGER: u32 = 0x1;
const NORMALIZED: u32 = 0x2;

fn word(tex: &[u8; TEXTURE_DESC_BYTES], at: usize) -> u32 {
    u32::from_le_bytes(tex[at..at + 4].try_into().expect("a word inside the descriptor"))
}

/// What reference kernels see: device memory, and the arrays that texture
/// and surface objects read and write. A bad object faults, as a kernel
/// that uses one does.
pub struct Device<'a> {
    pub memory: &'a mut Memory,
    pub arrays: &'a mut Arrays,
    pub conditions: &'a mut Conditions,
}

impl DeviceMemory for Device<'_> {
    fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), CuError> {
        self.memory.read(addr, out)
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), CuError> {
        self.memory.write(addr, data)
    }

    fn set_conditional(&mut self, handle: u64, value: u32) -> Result<(), CuError> {
        self.conditions.set(handle, value)
    }

    fn texel(&self, tex: u64, x: i64, y: i64, out: &mut [u8]) -> Result<(), CuError> {
        let o = self.arrays.objects.get(&tex).ok_or(CuError::ILLEGAL_ADDRESS)?;
        let desc = o.tex.as_ref().ok_or(CuError::ILLEGAL_ADDRESS)?;
        let res = &o.res;
        let (format, channels) = match res.kind {
            RESOURCE_ARRAY => {
                let a = self.arrays.arrays.get(&res.at).ok_or(CuError::ILLEGAL_ADDRESS)?;
                (a.desc.format, a.desc.channels)
            }
            _ => (res.format, res.channels),
        };
        let elem = element_bytes(format, channels)?;
        // Floats and 32-bit integers read as they are; narrower integers
        // only when asked so (else they are promoted to normalized floats).
        let as_is = matches!(format, 0x20 | 0x03 | 0x0a) || word(desc, 16) & READ_AS_INTEGER != 0;
        if elem != out.len() as u64 || !as_is {
            return Err(CuError::NOT_SUPPORTED);
        }
        if res.kind == RESOURCE_LINEAR {
            // A fetch outside the memory reads zeros.
            if y != 0 || x < 0 || x as u64 >= res.size / elem {
                out.fill(0);
                return Ok(());
            }
            return self.memory.read(res.at + x as u64 * elem, out);
        }
        let sampled = [0, 4].iter().all(|&m| word(desc, m) == CLAMP)
            && word(desc, 12) == POINT
            && word(desc, 16) & NORMALIZED == 0;
        if !sampled {
            return Err(CuError::NOT_SUPPORTED);
        }
        match res.kind {
            RESOURCE_ARRAY => {
                let a = &self.arrays.arrays[&res.at];
                let (x, y) = (x.clamp(0, a.desc.width as i64 - 1) as u64, y.clamp(0, a.rows() as i64 - 1) as u64);
                let at = (y * a.row + x * elem) as usize;
                out.copy_from_slice(&a.data[at..at + out.len()]);
                Ok(())
            }
            RESOURCE_PITCH2D if res.width > 0 && res.height > 0 => {
                let (x, y) = (x.clamp(0, res.width as i64 - 1) as u64, y.clamp(0, res.height as i64 - 1) as u64);
                self.memory.read(res.at + y * res.pitch + x * elem, out)
            }
            _ => Err(CuError::NOT_SUPPORTED),
        }
    }

    fn surface_write(&mut self, surf: u64, x: i64, y: i64, data: &[u8]) -> Result<(), CuError> {
        let o = self.arrays.objects.get(&surf).filter(|o| o.tex.is_none()).ok_or(CuError::ILLEGAL_ADDRESS)?;
        let a = self.arrays.arrays.get_mut(&o.res.at).ok_or(CuError::ILLEGAL_ADDRESS)?;
        // Outside the array, a write traps: surfaces' default boundary mode.
        let inside = x >= 0 && y >= 0 && x as u64 + data.len() as u64 <= a.row && (y as u64) < a.rows();
        if !inside {
            return Err(CuError::ILLEGAL_ADDRESS);
        }
        let at = (y as u64 * a.row + x as u64) as usize;
        a.data[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }
}

/// One row of a copy, on its way out of one end or into the other.
enum Row<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
}

impl Row<'_> {
    fn len(&self) -> usize {
        match self {
            Row::Read(r) => r.len(),
            Row::Write(w) => w.len(),
        }
    }
}

impl backend::Arrays for Emulated {
    fn array_create(&self, ctx: Obj, desc: &ArrayDesc) -> BResult<Obj> {
        let s = &mut *self.state();
        s.ctx(ctx)?;
        s.arrays.create(&mut s.memory, ctx.0, desc)
    }

    fn array_destroy(&self, ctx: Obj, array: Obj) -> BResult<()> {
        let s = &mut *self.state();
        s.ctx(ctx)?;
        s.arrays.destroy(&mut s.memory, array)
    }

    fn array_descriptor(&self, ctx: Obj, array: Obj) -> BResult<ArrayDesc> {
        let s = &mut *self.state();
        s.ctx(ctx)?;
        s.arrays.descriptor(array)
    }

    fn mipmap_create(&self, ctx: Obj, desc: &ArrayDesc, levels: u32) -> BResult<Obj> {
        let s = &mut *self.state();
        s.ctx(ctx)?;
        s.arrays.mipmap_create(&mut s.memory, ctx.0, desc, levels)
    }

    fn mipmap_level(&self, ctx: Obj, mipmap: Obj, level: u32) -> BResult<Obj> {
        let s = &mut *self.state();
        s.ctx(ctx)?;
        s.arrays.mipmap_level(mipmap, level)
    }

    fn mipmap_destroy(&self, ctx: Obj, mipmap: Obj) -> BResult<()> {
        let s = &mut *self.state();
        s.ctx(ctx)?;
        s.arrays.mipmap_destroy(&mut s.memory, mipmap)
    }

    unsafe fn memcpy_3d(&self, ctx: Obj, copy: &Copy3D, stream: Obj, _sync: bool) -> BResult<()> {
        let s = &mut *self.state();
        s.stream(ctx, stream)?;
        s.graphs.refuse(
            stream,
            CuError::STREAM_CAPTURE_UNSUPPORTED,
            "the emulated device captures no 2D or 3D copies",
        )?;
        // SAFETY: the caller's guarantee.
        unsafe { s.arrays.copy(&mut s.memory, copy) }
    }

    fn tex_object_create(&self, ctx: Obj, res: &ResourceDesc, tex: &[u8], view: Option<&[u8]>) -> BResult<u64> {
        if view.is_some() {
            return Err(err(CuError::NOT_SUPPORTED, "the emulated device takes no resource views"));
        }
        let s = &mut *self.state();
        s.ctx(ctx)?;
        s.arrays.object(ctx.0, res, Some(tex))
    }

    fn tex_object_destroy(&self, ctx: Obj, object: u64) -> BResult<()> {
        let s = &mut *self.state();
        s.ctx(ctx)?;
        s.arrays.destroy_object(object)
    }

    fn surf_object_create(&self, ctx: Obj, res: &ResourceDesc) -> BResult<u64> {
        let s = &mut *self.state();
        s.ctx(ctx)?;
        s.arrays.object(ctx.0, res, None)
    }

    fn surf_object_destroy(&self, ctx: Obj, object: u64) -> BResult<()> {
        let s = &mut *self.state();
        s.ctx(ctx)?;
        s.arrays.destroy_object(object)
    }
}
