//! Arrays, texture and surface objects, and 2D and 3D copies on the
//! emulated device.
//!
//! An array's elements are kept row after row, slice after slice, as a
//! pitched allocation without padding would be; a layered or cubemap array
//! counts its layers as slices. Texture and surface objects are records of
//! what they read: the test device runs no kernel that samples them.

use std::collections::HashMap;

use gpuplex_protocol::{element_bytes, ArrayDesc, CuError, ResourceDesc, COPY_ARRAY_LINEAR, RESOURCE_ARRAY};

use super::memory::{self, Memory};
use super::{err, BResult, Obj};
use crate::backend::{Copy3D, CopyEnd, Place};

/// `CUDA_ARRAY3D_LAYERED`, `_SURFACE_LDST`, `_CUBEMAP`, `_TEXTURE_GATHER`:
/// the flags of arrays the test device makes.
const FLAGS: u32 = 0x01 | 0x02 | 0x04 | 0x08;

#[derive(Default)]
pub struct Arrays {
    next: u64,
    arrays: HashMap<u64, Array>,
    /// Texture and surface objects: what each reads, and its context.
    objects: HashMap<u64, (u64, ResourceDesc)>,
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
        self.objects.retain(|_, (c, _)| *c != ctx);
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
        let offset = |pitch: u64, height: u64| -> Option<u64> {
            (end.z + z).checked_mul(height)?.checked_add(end.y + y)?.checked_mul(pitch)?.checked_add(x)
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
                let inside = linear || (x + width <= a.row && end.y + y < a.rows() && end.z + z < a.slices());
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

    /// A texture or surface object over `res`, whose array (if any) is one
    /// of the device's.
    pub fn object(&mut self, ctx: u64, res: &ResourceDesc, surface: bool) -> BResult<u64> {
        if res.kind == RESOURCE_ARRAY {
            let a = self.array(Obj(res.at))?;
            if surface && a.desc.flags & 0x02 == 0 {
                return Err(err(CuError::INVALID_VALUE, "a surface needs an array made for load and store"));
            }
        } else if surface {
            return Err(err(CuError::INVALID_VALUE, "a surface reads an array"));
        }
        let id = self.next_id();
        self.objects.insert(id, (ctx, res.clone()));
        Ok(id)
    }

    pub fn destroy_object(&mut self, object: u64) -> BResult<()> {
        self.objects.remove(&object).map(drop).ok_or_else(|| err(CuError::INVALID_VALUE, "no such object"))
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
