//! A session's arrays, texture and surface objects, and its 2D and 3D
//! copies.
//!
//! Arrays are handles of the session's tables, charged to the tenant by
//! their elements' bytes. Texture and surface objects are the driver's own
//! values, since kernels take them as parameters; the session keeps the
//! ones it made, and answers any other with an error. Every device range a
//! copy or an object reads is checked against the session's allocations,
//! row extent and all.

use gpuplex_protocol::calls::*;
use gpuplex_protocol::{
    calls, element_bytes, ArrayDesc, ArraysCalls, CallError, CopySide, ResourceDesc, COPY_2D, COPY_2D_UNALIGNED,
    COPY_3D, COPY_ARRAY_LINEAR, MAX_MIP_LEVELS, RESOURCE_ARRAY, RESOURCE_LINEAR, RESOURCE_MIPMAPPED_ARRAY,
    RESOURCE_PITCH2D, RESOURCE_VIEW_DESC_BYTES, SIDE_ARRAY, SIDE_BLOCK, SIDE_DEVICE, SIDE_INLINE, TEXTURE_DESC_BYTES,
};

use super::tables::{Entry, HandleMap, Kind, Owner};
use super::{invalid, Session};
use crate::backend::{self, CopyEnd, Obj, Place};
use crate::sched::Work;

type R<T> = Result<T, CallError>;

/// The most bytes a copy's inline side may carry: the client sends them in
/// chunks well under this, and a reply must fit in a frame.
const MAX_INLINE: u64 = 32 << 20;

/// Texture and surface objects the session made, each with the handle of
/// its context.
#[derive(Default)]
pub struct Samplers {
    textures: HandleMap<u64, u64>,
    surfaces: HandleMap<u64, u64>,
}

impl Samplers {
    /// Forgets the objects of a context that is gone (the driver destroyed
    /// them with it).
    pub fn context_gone(&mut self, ctx: u64) {
        self.textures.retain(|_, c| *c != ctx);
        self.surfaces.retain(|_, c| *c != ctx);
    }
}

/// The bytes of an array's elements, what it is charged.
fn array_bytes(d: &ArrayDesc) -> R<u64> {
    let elem = element_bytes(d.format, d.channels)
        .map_err(|code| CallError::new(code, format!("array format {:#x} with {} channels", d.format, d.channels)))?;
    [d.width, d.height.max(1), d.depth.max(1)]
        .into_iter()
        .try_fold(elem, u64::checked_mul)
        .ok_or_else(|| invalid("array size overflows"))
}

/// Where a linear end's first byte is from its base, and how many bytes
/// from there the copy touches: `depth` slices `side.height` rows apart, of
/// `height` rows `side.pitch` bytes apart.
fn linear_extent(side: &CopySide, c: &gpuplex_protocol::Copy3D) -> Option<(u64, u64)> {
    let start = side.z.checked_mul(side.height)?.checked_add(side.y)?.checked_mul(side.pitch)?.checked_add(side.x)?;
    if c.width == 0 || c.height == 0 || c.depth == 0 {
        return Some((start, 0));
    }
    let last_row = (c.depth - 1).checked_mul(side.height)?.checked_add(c.height - 1)?;
    Some((start, last_row.checked_mul(side.pitch)?.checked_add(c.width)?))
}

/// Checks a copy's shape as the driver function it names takes it: a 2D
/// copy has one slice and no z, a linear array copy one row at byte
/// offsets (so that the range checked below is exactly the range copied);
/// rows and slices of linear memory do not overlap.
pub(super) fn check_shape(c: &gpuplex_protocol::Copy3D) -> R<()> {
    let sides = [&c.src, &c.dst];
    let fits = match c.shape {
        COPY_3D => true,
        COPY_2D | COPY_2D_UNALIGNED => c.depth == 1 && sides.iter().all(|s| s.z == 0),
        COPY_ARRAY_LINEAR => c.height == 1 && c.depth == 1 && sides.iter().all(|s| s.y == 0 && s.z == 0),
        shape => return Err(invalid(format!("copy shape {shape}"))),
    };
    if !fits {
        return Err(invalid("a position or extent the copy's function does not take"));
    }
    for s in sides.iter().filter(|s| matches!(s.kind, SIDE_DEVICE | SIDE_BLOCK)) {
        let rows = (c.height > 1 || c.depth > 1) && s.x.checked_add(c.width).is_none_or(|end| s.pitch < end);
        let slices = c.depth > 1 && s.y.checked_add(c.height).is_none_or(|end| s.height < end);
        if rows || slices {
            return Err(invalid("a pitch or slice height smaller than the copy"));
        }
    }
    Ok(())
}

impl Session {
    pub(super) fn array_create(&mut self, req: ArrayCreate::Request) -> R<ArrayCreate::Reply> {
        let (h, ctx) = self.current_ctx()?;
        let d = &req.desc;
        let bytes = array_bytes(d)?;
        self.charge_reclaiming(bytes)?;
        let obj = self.backend.array_create(ctx, d)?;
        let handle = self.tables.add(Kind::Array, Entry { obj, ctx: h, owner: Owner::Ctx(h) });
        self.tables.set_footprint(handle, bytes);
        Ok(ArrayCreate::Reply { array: gpuplex_protocol::Array(handle) })
    }

    pub(super) fn mipmap_create(&mut self, req: MipmappedArrayCreate::Request) -> R<MipmappedArrayCreate::Reply> {
        let (h, ctx) = self.current_ctx()?;
        let d = &req.desc;
        if !(1..=MAX_MIP_LEVELS).contains(&req.levels) {
            return Err(invalid(format!("{} levels", req.levels)));
        }
        let bytes = (0..req.levels).try_fold(0u64, |sum, l| {
            sum.checked_add(array_bytes(&d.mip_level(l))?).ok_or_else(|| invalid("mipmapped array size overflows"))
        })?;
        self.charge_reclaiming(bytes)?;
        let obj = self.backend.mipmap_create(ctx, d, req.levels)?;
        let handle = self.tables.add(Kind::Mipmap, Entry { obj, ctx: h, owner: Owner::Ctx(h) });
        self.tables.set_footprint(handle, bytes);
        Ok(MipmappedArrayCreate::Reply { mipmap: gpuplex_protocol::Mipmap(handle) })
    }

    /// A mipmapped array handle as `(backend context, backend object)`.
    fn mipmap(&mut self, h: u64) -> R<(Obj, Obj)> {
        let entry = self.tables.get(Kind::Mipmap, h)?;
        Ok((self.ctx_of(&entry)?, entry.obj))
    }

    pub(super) fn mipmap_level(
        &mut self,
        req: cuMipmappedArrayGetLevel::Request,
    ) -> R<cuMipmappedArrayGetLevel::Reply> {
        let entry = self.tables.get(Kind::Mipmap, req.hMipmappedArray.0)?;
        let ctx = self.ctx_of(&entry)?;
        let level = self.backend.mipmap_level(ctx, entry.obj, req.level)?;
        let owner = Owner::Mipmap(req.hMipmappedArray.0);
        let array = self.tables.add(Kind::Array, Entry { obj: level, ctx: entry.ctx, owner });
        Ok(cuMipmappedArrayGetLevel::Reply { pLevelArray: gpuplex_protocol::Array(array) })
    }

    pub(super) fn mipmap_destroy(
        &mut self,
        req: cuMipmappedArrayDestroy::Request,
    ) -> R<cuMipmappedArrayDestroy::Reply> {
        let (ctx, obj) = self.mipmap(req.hMipmappedArray.0)?;
        self.backend.mipmap_destroy(ctx, obj)?;
        // Its levels' handles go with it.
        self.tables.remove(Kind::Mipmap, req.hMipmappedArray.0)?;
        Ok(cuMipmappedArrayDestroy::Reply {})
    }

    /// An array handle as `(backend context, backend array)`.
    fn array(&mut self, h: u64) -> R<(Obj, Obj)> {
        let entry = self.tables.get(Kind::Array, h)?;
        Ok((self.ctx_of(&entry)?, entry.obj))
    }

    pub(super) fn array_destroy(&mut self, req: cuArrayDestroy::Request) -> R<cuArrayDestroy::Reply> {
        if let Owner::Mipmap(_) = self.tables.get(Kind::Array, req.hArray.0)?.owner {
            return Err(invalid("a mipmapped array's level goes with the mipmapped array"));
        }
        let (ctx, obj) = self.array(req.hArray.0)?;
        self.backend.array_destroy(ctx, obj)?;
        self.tables.remove(Kind::Array, req.hArray.0)?;
        Ok(cuArrayDestroy::Reply {})
    }

    pub(super) fn array_descriptor(&mut self, req: ArrayDescriptor::Request) -> R<ArrayDescriptor::Reply> {
        let (ctx, obj) = self.array(req.array.0)?;
        Ok(ArrayDescriptor::Reply { desc: self.backend.array_descriptor(ctx, obj)? })
    }

    /// One end of a copy as the backend takes it, checked against what the
    /// session holds, and the staging slot it reads or writes, if any.
    /// `inline` is where the end's packed rows are, for an inline end.
    pub(super) fn copy_end(
        &mut self,
        ctx: Obj,
        side: &CopySide,
        c: &gpuplex_protocol::Copy3D,
        inline: *mut u8,
    ) -> R<(CopyEnd, Option<usize>)> {
        let end = |place| CopyEnd { place, x: side.x, y: side.y, z: side.z, pitch: side.pitch, height: side.height };
        let extent = || linear_extent(side, c).ok_or_else(|| invalid("copy extent overflows"));
        match side.kind {
            SIDE_INLINE => {
                let packed = CopyEnd { place: Place::Host(inline), x: 0, y: 0, z: 0, pitch: c.width, height: c.height };
                Ok((packed, None))
            }
            SIDE_DEVICE => {
                let (start, len) = extent()?;
                let first = side.at.checked_add(start).ok_or_else(|| invalid("copy extent overflows"))?;
                self.tables.check_range(first, len)?;
                Ok((end(Place::Device(side.at)), None))
            }
            SIDE_ARRAY => Ok((end(Place::Array(self.array(side.at)?.1)), None)),
            SIDE_BLOCK => {
                let (start, len) = extent()?;
                let offset = side.at.checked_add(start).ok_or_else(|| invalid("copy extent overflows"))?;
                let host = self.shared.range(&*self.backend, ctx, side.block, offset, len)?;
                // The first byte's position is folded into the pointer.
                let at = CopyEnd { place: Place::Host(host.ptr), x: 0, y: 0, z: 0, ..end(Place::Host(host.ptr)) };
                Ok((at, host.slot))
            }
            kind => Err(invalid(format!("copy side kind {kind}"))),
        }
    }

    pub(super) fn memcpy_3d(&mut self, mut req: Memcpy3D::Request) -> R<Memcpy3D::Reply> {
        let c = req.copy.clone();
        check_shape(&c)?;
        let (ctx, stream) = self.stream(req.stream)?;
        let bytes = c.bytes().ok_or_else(|| invalid("copy size overflows"))?;
        let (src_inline, dst_inline) = (c.src.kind == SIDE_INLINE, c.dst.kind == SIDE_INLINE);
        if src_inline && dst_inline {
            return Err(invalid("a copy between two host buffers is the client's"));
        }
        if (src_inline || dst_inline) && bytes > MAX_INLINE {
            return Err(invalid(format!("{bytes} bytes inline: more than one frame carries")));
        }
        if req.input.len() as u64 != if src_inline { bytes } else { 0 } {
            return Err(invalid("the bytes sent are not the copy's"));
        }
        let mut output = vec![0; if dst_inline { bytes as usize } else { 0 }];
        let (src, src_slot) = self.copy_end(ctx, &c.src, &c, req.input.as_mut_ptr())?;
        let (dst, dst_slot) = self.copy_end(ctx, &c.dst, &c, output.as_mut_ptr())?;
        if bytes == 0 {
            return Ok(Memcpy3D::Reply { output });
        }
        if src_inline || dst_inline {
            self.refuse_in_capture(ctx, stream, "a copy with pageable memory")?;
        }
        let copy = backend::Copy3D { shape: c.shape, src, dst, width: c.width, height: c.height, depth: c.depth };
        // Inline bytes must have moved before the buffers go.
        let sync = req.sync || src_inline || dst_inline || c.shape == COPY_2D_UNALIGNED;
        let backend = &self.backend;
        self.seat.submit(ctx, stream, Work::Copy, || {
            // SAFETY: host ends are the request's and reply's buffers, of
            // the copy's packed size, or checked ranges of the session's
            // shared blocks; the copy is complete before they go.
            unsafe { backend.memcpy_3d(ctx, &copy, stream, sync) }
        })?;
        for slot in [src_slot, dst_slot].into_iter().flatten() {
            self.shared.mark_slot(&*self.backend, slot, ctx, stream)?;
        }
        Ok(Memcpy3D::Reply { output })
    }

    /// A resource as the backend takes it: its array resolved, its memory
    /// checked against the session's allocations.
    fn backend_resource(&mut self, res: &ResourceDesc) -> R<ResourceDesc> {
        let mut out = res.clone();
        match res.kind {
            RESOURCE_ARRAY => out.at = self.array(res.at)?.1 .0,
            RESOURCE_MIPMAPPED_ARRAY => out.at = self.mipmap(res.at)?.1 .0,
            RESOURCE_LINEAR => self.tables.check_range(res.at, res.size)?,
            RESOURCE_PITCH2D => {
                let elem = element_bytes(res.format, res.channels).map_err(|code| CallError::new(code, "format"))?;
                let row = res.width.checked_mul(elem).filter(|&row| row > 0 && res.height > 0 && res.pitch >= row);
                let row = row.ok_or_else(|| invalid("pitched memory with no rows, or rows wider than the pitch"))?;
                let extent = res
                    .pitch
                    .checked_mul(res.height - 1)
                    .and_then(|e| e.checked_add(row))
                    .ok_or_else(|| invalid("pitched extent overflows"))?;
                self.tables.check_range(res.at, extent)?;
            }
            kind => return Err(invalid(format!("resource type {kind}"))),
        }
        Ok(out)
    }

    pub(super) fn tex_object_create(&mut self, req: TexObjectCreate::Request) -> R<TexObjectCreate::Reply> {
        let (h, ctx) = self.current_ctx()?;
        let view_ok = req.view.is_empty() || req.view.len() == RESOURCE_VIEW_DESC_BYTES;
        if req.tex.len() != TEXTURE_DESC_BYTES || !view_ok {
            return Err(invalid("texture or view descriptor of the wrong size"));
        }
        let res = self.backend_resource(&req.res)?;
        let view = (!req.view.is_empty()).then_some(&req.view[..]);
        let object = self.backend.tex_object_create(ctx, &res, &req.tex, view)?;
        self.tables.samplers.textures.insert(object, h);
        Ok(TexObjectCreate::Reply { object })
    }

    pub(super) fn surf_object_create(&mut self, req: SurfObjectCreate::Request) -> R<SurfObjectCreate::Reply> {
        let (h, ctx) = self.current_ctx()?;
        let res = self.backend_resource(&req.res)?;
        let object = self.backend.surf_object_create(ctx, &res)?;
        self.tables.samplers.surfaces.insert(object, h);
        Ok(SurfObjectCreate::Reply { object })
    }

    /// The context of one of the session's texture (or surface) objects.
    fn sampler_ctx(&mut self, object: u64, surface: bool) -> R<Obj> {
        let s = &self.tables.samplers;
        let ctx = if surface { s.surfaces.get(&object) } else { s.textures.get(&object) };
        let ctx = *ctx.ok_or_else(|| invalid(format!("{object:#x} is not an object of the session")))?;
        self.tables.ctx(ctx)?.obj.ok_or_else(|| invalid("the object's context is gone"))
    }

    pub(super) fn tex_object_destroy(&mut self, req: TexObjectDestroy::Request) -> R<TexObjectDestroy::Reply> {
        let ctx = self.sampler_ctx(req.object, false)?;
        self.backend.tex_object_destroy(ctx, req.object)?;
        self.tables.samplers.textures.remove(&req.object);
        Ok(TexObjectDestroy::Reply {})
    }

    pub(super) fn surf_object_destroy(&mut self, req: SurfObjectDestroy::Request) -> R<SurfObjectDestroy::Reply> {
        let ctx = self.sampler_ctx(req.object, true)?;
        self.backend.surf_object_destroy(ctx, req.object)?;
        self.tables.samplers.surfaces.remove(&req.object);
        Ok(SurfObjectDestroy::Reply {})
    }
}

#[allow(non_snake_case)]
impl ArraysCalls for Session {
    fn Memcpy3D(&mut self, req: calls::Memcpy3D::Request) -> R<calls::Memcpy3D::Reply> {
        self.memcpy_3d(req)
    }

    fn ArrayCreate(&mut self, req: calls::ArrayCreate::Request) -> R<calls::ArrayCreate::Reply> {
        self.array_create(req)
    }

    fn cuArrayDestroy(&mut self, req: calls::cuArrayDestroy::Request) -> R<calls::cuArrayDestroy::Reply> {
        self.array_destroy(req)
    }

    fn ArrayDescriptor(&mut self, req: calls::ArrayDescriptor::Request) -> R<calls::ArrayDescriptor::Reply> {
        self.array_descriptor(req)
    }

    fn MipmappedArrayCreate(
        &mut self,
        req: calls::MipmappedArrayCreate::Request,
    ) -> R<calls::MipmappedArrayCreate::Reply> {
        self.mipmap_create(req)
    }

    fn cuMipmappedArrayGetLevel(
        &mut self,
        req: calls::cuMipmappedArrayGetLevel::Request,
    ) -> R<calls::cuMipmappedArrayGetLevel::Reply> {
        self.mipmap_level(req)
    }

    fn cuMipmappedArrayDestroy(
        &mut self,
        req: calls::cuMipmappedArrayDestroy::Request,
    ) -> R<calls::cuMipmappedArrayDestroy::Reply> {
        self.mipmap_destroy(req)
    }

    fn TexObjectCreate(&mut self, req: calls::TexObjectCreate::Request) -> R<calls::TexObjectCreate::Reply> {
        self.tex_object_create(req)
    }

    fn TexObjectDestroy(&mut self, req: calls::TexObjectDestroy::Request) -> R<calls::TexObjectDestroy::Reply> {
        self.tex_object_destroy(req)
    }

    fn SurfObjectCreate(&mut self, req: calls::SurfObjectCreate::Request) -> R<calls::SurfObjectCreate::Reply> {
        self.surf_object_create(req)
    }

    fn SurfObjectDestroy(&mut self, req: calls::SurfObjectDestroy::Request) -> R<calls::SurfObjectDestroy::Reply> {
        self.surf_object_destroy(req)
    }
}
