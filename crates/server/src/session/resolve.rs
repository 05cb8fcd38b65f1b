//! How a guest's handles and arguments become the backend's: contexts
//! (primary ones activated on use), streams (each client thread's
//! per-thread default stream), events, functions and kernels with their
//! parameter buffers, launch configurations, memsets' ranges, and what a
//! module image takes on the device. Every call's handler goes through
//! these, so nothing reaches the backend unresolved or unchecked.

use gpuplex_protocol::{CallError, Ctx, CuError, DevPtr, Event, Func, Stream};

use super::tables::{self, CtxEntry, Entry, Kind, Owner, Region};
use super::{invalid, Session};
use crate::backend::{self, Obj};

type R<T> = Result<T, CallError>;

/// The largest packed parameter buffer CUDA accepts (32764 bytes since 12.1).
pub(super) const MAX_PARAM_BYTES: usize = 32764;
/// One `CUlaunchAttribute` as it travels: id, then the 64-byte value.
const ATTR_RECORD: usize = 4 + 64;
/// Per-thread default streams one session may hold.
const MAX_PER_THREAD_STREAMS: usize = 4096;
/// `CU_CTX_MAP_HOST`.
pub(super) const CU_CTX_MAP_HOST: u32 = 0x8;
/// Launch attributes that carry only plain values. The others (programmatic
/// and completion events, updatable graph nodes) hold client handles or
/// write back, and are refused until they are translated.
const PLAIN_LAUNCH_ATTRS: &[u32] = &[0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 14, 16];

/// The bytes a packed parameter buffer spans.
pub(super) fn packed_size(layout: &[backend::ParamSlot]) -> usize {
    layout.iter().map(|p| (p.offset + p.size) as usize).max().unwrap_or(0)
}

/// A launch or stream attribute id that carries only a plain value.
pub(super) fn plain_attribute(attr: u32) -> R<u32> {
    if PLAIN_LAUNCH_ATTRS.contains(&attr) {
        Ok(attr)
    } else {
        Err(CallError::new(
            CuError::NOT_SUPPORTED,
            format!("attribute {attr} holds handles gpuplex does not translate"),
        ))
    }
}

impl Session {
    /// A device as the guest numbers it, checked.
    pub(super) fn device(&self, dev: i32) -> R<usize> {
        usize::try_from(dev)
            .ok()
            .filter(|&d| d < self.primaries.len())
            .ok_or_else(|| CallError::new(CuError::INVALID_DEVICE, format!("no device {dev}")))
    }

    /// The backend's ordinal of a device the guest names.
    pub(super) fn backend_device(&self, dev: i32) -> R<i32> {
        Ok(self.devices[self.device(dev)?])
    }

    /// A context handle as `(handle, backend context)`; a retained primary
    /// context that was reset comes back to life here, as the driver's does.
    pub(super) fn resolve_ctx(&mut self, h: u64) -> R<(u64, Obj)> {
        if h == 0 {
            return Err(CallError::new(CuError::INVALID_CONTEXT, "no current context"));
        }
        let entry = self.tables.ctx(h)?;
        match entry.obj {
            Some(obj) => Ok((h, obj)),
            None if entry.primary && self.primaries[entry.device as usize].refcount > 0 => {
                Ok((h, self.activate_primary(entry.device as usize)?))
            }
            None => Err(CallError::new(CuError::INVALID_CONTEXT, "primary context is not retained")),
        }
    }

    pub(super) fn current_ctx(&mut self) -> R<(u64, Obj)> {
        self.resolve_ctx(self.current.0)
    }

    /// An explicit context argument, where NULL means the current one.
    pub(super) fn ctx_or_current(&mut self, ctx: Ctx) -> R<(u64, Obj)> {
        if ctx.0 == 0 {
            self.current_ctx()
        } else {
            self.resolve_ctx(ctx.0)
        }
    }

    pub(super) fn activate_primary(&mut self, dev: usize) -> R<Obj> {
        let p = self.primaries[dev];
        // The driver's primary contexts always map host memory.
        let obj = self.backend.ctx_create(self.devices[dev], p.flags | CU_CTX_MAP_HOST)?;
        self.seat.context(obj, self.devices[dev]);
        self.tables.contexts.insert(p.handle, CtxEntry { obj: Some(obj), device: dev as i32, primary: true });
        Ok(obj)
    }

    /// Destroys the primary context's backend context and everything in it;
    /// the handle stays valid for a later retain.
    pub(super) fn deactivate_primary(&mut self, dev: usize) -> R<()> {
        let h = self.primaries[dev].handle;
        if let Some(obj) = self.tables.ctx(h)?.obj {
            self.tables.drop_context_contents(h);
            self.tables.contexts.insert(h, CtxEntry { obj: None, device: dev as i32, primary: true });
            self.context_gone(obj);
            self.backend.ctx_destroy(obj)?;
        }
        Ok(())
    }

    /// The backend context an object lives in.
    pub(super) fn ctx_of(&self, entry: &Entry) -> R<Obj> {
        self.ctx_obj(entry.ctx)
    }

    /// The backend context of a context handle, if active.
    pub(super) fn ctx_obj(&self, h: u64) -> R<Obj> {
        self.tables.ctx(h)?.obj.ok_or_else(|| CallError::new(CuError::INVALID_CONTEXT, "context is not active"))
    }

    /// A stream as `(backend context, backend stream)`. Default streams
    /// belong to the current context.
    pub(super) fn stream(&mut self, s: Stream) -> R<(Obj, Obj)> {
        if s == Stream::PER_THREAD {
            return self.per_thread_stream();
        }
        if s.is_default() {
            return Ok((self.current_ctx()?.1, Obj(s.0)));
        }
        let entry = self.tables.get(Kind::Stream, s.0)?;
        Ok((self.ctx_of(&entry)?, entry.obj))
    }

    /// The calling client thread's per-thread default stream in the current
    /// context. The server runs a session on one thread, so the driver's own
    /// per-thread stream would be shared by all of the client's threads;
    /// each gets an ordinary blocking stream instead, which is what a
    /// per-thread default stream is.
    pub(super) fn per_thread_stream(&mut self) -> R<(Obj, Obj)> {
        let (h, ctx) = self.current_ctx()?;
        let key = (self.thread, h);
        if let Some(entry) = self.per_thread_streams.get(&key).and_then(|s| self.tables.get(Kind::Stream, *s).ok()) {
            return Ok((ctx, entry.obj));
        }
        if self.per_thread_streams.len() >= MAX_PER_THREAD_STREAMS {
            self.per_thread_streams.retain(|_, s| self.tables.get(Kind::Stream, *s).is_ok());
            if self.per_thread_streams.len() >= MAX_PER_THREAD_STREAMS {
                return Err(CallError::new(CuError::OUT_OF_MEMORY, "too many client threads with per-thread streams"));
            }
        }
        let obj = self.backend.stream_create(ctx, 0, 0)?;
        self.seat.stream(ctx, obj);
        let handle = self.tables.add(Kind::Stream, Entry { obj, ctx: h, owner: Owner::Ctx(h) });
        self.per_thread_streams.insert(key, handle);
        Ok((ctx, obj))
    }

    pub(super) fn event(&self, e: Event) -> R<(Obj, Obj)> {
        let entry = self.tables.get(Kind::Event, e.0)?;
        Ok((self.ctx_of(&entry)?, entry.obj))
    }

    /// A function as `(backend context, backend function)`. A kernel handle
    /// stands for its function in the current context.
    pub(super) fn func(&mut self, f: Func) -> R<(Obj, Obj)> {
        match self.tables.lookup(f.0) {
            Some((Kind::Func, entry)) => Ok((self.ctx_of(&entry)?, entry.obj)),
            Some((Kind::Kernel, kernel)) => {
                let (ctx_h, ctx) = self.current_ctx()?;
                let func = self.backend.kernel_get_function(ctx, kernel.obj)?;
                self.tables.add(Kind::Func, Entry { obj: func, ctx: ctx_h, owner: Owner::Kernel(f.0) });
                Ok((ctx, func))
            }
            _ => Err(tables::unknown(Kind::Func, f.0)),
        }
    }

    pub(super) fn kernel(&self, h: u64) -> R<Obj> {
        Ok(self.tables.get(Kind::Kernel, h)?.obj)
    }

    pub(super) fn module(&self, h: u64) -> R<(Obj, Entry)> {
        let entry = self.tables.get(Kind::Module, h)?;
        Ok((self.ctx_of(&entry)?, entry))
    }

    /// Asks the backend for a function's parameter layout and remembers
    /// how many packed bytes it takes.
    pub(super) fn learn_param_bytes(&mut self, handle: u64, ctx: Obj, func: Obj) -> R<usize> {
        let n = packed_size(&self.backend.param_layout(ctx, func)?);
        self.param_bytes.insert(handle, n);
        Ok(n)
    }

    /// Checks a memset's shape, and that every row lies in one of the
    /// session's allocations. An empty memset's destination is checked too
    /// (`check_range`); its caller answers it, however many empty rows it names.
    pub(super) fn check_memset(&self, op: &backend::Memset) -> R<()> {
        if ![1, 2, 4].contains(&op.element_size) {
            return Err(invalid("memset element size must be 1, 2 or 4"));
        }
        if op.height > 1 && op.pitch < op.width.saturating_mul(op.element_size as u64) {
            return Err(invalid("pitch is narrower than a row"));
        }
        let extent = op.extent().ok_or_else(|| invalid("memset extent overflows"))?;
        self.tables.check_range(op.dst, extent)
    }

    /// A function to run with `params`, as `(backend context, backend
    /// function)`, once the parameters are checked to be as many packed
    /// bytes as it takes.
    pub(super) fn kernel_with(&mut self, f: Func, params: &[u8]) -> R<(Obj, Obj)> {
        if params.len() > MAX_PARAM_BYTES {
            return Err(invalid(format!("{} bytes of kernel parameters", params.len())));
        }
        let (func_ctx, func) = self.func(f)?;
        let expected = match self.param_bytes.get(&f.0) {
            Some(&n) => n,
            None => self.learn_param_bytes(f.0, func_ctx, func)?,
        };
        if params.len() != expected {
            return Err(invalid(format!("{} parameter bytes for a kernel that takes {expected}", params.len())));
        }
        Ok((func_ctx, func))
    }

    /// A launch as the backend takes it: the stream resolved, the attribute
    /// records split and checked to carry only plain values.
    pub(super) fn launch_config(
        &mut self,
        dims: [u32; 6],
        shared_mem: u32,
        stream: Stream,
        attrs: &[u8],
    ) -> R<backend::Launch> {
        if attrs.len() % ATTR_RECORD != 0 {
            return Err(invalid("launch attributes are not whole records"));
        }
        let mut parsed = Vec::with_capacity(attrs.len() / ATTR_RECORD);
        for record in attrs.chunks_exact(ATTR_RECORD) {
            let id = u32::from_le_bytes([record[0], record[1], record[2], record[3]]);
            if !PLAIN_LAUNCH_ATTRS.contains(&id) {
                return Err(CallError::new(CuError::NOT_SUPPORTED, format!("launch attribute {id} is not supported")));
            }
            let mut value = [0u8; 64];
            value.copy_from_slice(&record[4..]);
            parsed.push((id, value));
        }
        let (_, stream) = self.stream(stream)?;
        Ok(backend::Launch {
            grid: [dims[0], dims[1], dims[2]],
            block: [dims[3], dims[4], dims[5]],
            shared_mem,
            stream,
            attrs: parsed,
        })
    }

    /// Charges the tenant what loading `image` takes on the device (see
    /// [`crate::image::footprint`]). Under a memory limit an image that
    /// cannot be measured is refused, since it could hold anything; without
    /// one it counts as its own length.
    pub(super) fn charge_image(&mut self, digest: u64, image: &[u8]) -> R<u64> {
        let limited = self.account.tenant_usage().0 != 0;
        let footprint = match self.images.footprint(digest) {
            Some(bytes) => bytes,
            None if !limited => image.len() as u64,
            None => {
                let bytes = crate::image::footprint(image).map_err(|e| {
                    CallError::new(
                        CuError::INVALID_IMAGE,
                        format!("cannot tell what this image takes on the device, for the tenant's memory limit: {e}"),
                    )
                })?;
                self.images.set_footprint(digest, bytes);
                bytes
            }
        };
        self.account.charge(footprint)?;
        Ok(footprint)
    }

    pub(super) fn add_global(&mut self, ctx: u64, owner: Owner, (ptr, size): (u64, u64)) -> (DevPtr, u64) {
        self.tables.add_region(ptr, Region { size, ctx, owner: Some(owner) });
        (DevPtr(ptr), size)
    }
}
