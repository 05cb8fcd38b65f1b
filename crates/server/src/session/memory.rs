//! The session's side of device memory, copies and memsets: every device
//! range checked against the session's allocations, every allocation
//! charged to the tenant before it is made. A copy or memset of no bytes is
//! checked as any other, then answered without the backend.

use gpuplex_protocol::{calls, CallError, CuError, DevPtr, HostMemoryCalls, MemPool, MemoryCalls, Stream, MAX_PAYLOAD};

use super::tables::{Owner, Region};
use super::{invalid, Session};
use crate::backend;
use crate::sched::Work;

type R<T> = Result<T, CallError>;

#[allow(non_snake_case)]
impl MemoryCalls for Session {
    fn cuMemAlloc_v2(&mut self, req: calls::cuMemAlloc_v2::Request) -> R<calls::cuMemAlloc_v2::Reply> {
        let (h, ctx) = self.current_ctx()?;
        if req.bytesize == 0 {
            return Err(invalid("zero-byte allocation"));
        }
        self.charge_reclaiming(req.bytesize)?;
        let ptr = self.backend.mem_alloc(ctx, req.bytesize)?;
        self.tables.add_region(ptr, Region { size: req.bytesize, ctx: h, owner: None });
        Ok(calls::cuMemAlloc_v2::Reply { dptr: DevPtr(ptr) })
    }

    fn cuMemFree_v2(&mut self, req: calls::cuMemFree_v2::Request) -> R<calls::cuMemFree_v2::Reply> {
        // Freeing NULL is a no-op, as with free(3).
        if req.dptr.0 == 0 {
            return Ok(calls::cuMemFree_v2::Reply {});
        }
        if let Some(freed) = self.free_pooled_now(req.dptr.0) {
            return freed.map(|()| calls::cuMemFree_v2::Reply {});
        }
        let region = self
            .tables
            .region_at(req.dptr.0)
            .filter(|r| r.owner.is_none())
            .ok_or_else(|| invalid(format!("{:#x} is not an allocation", req.dptr.0)))?;
        let ctx = self.tables.ctx(region.ctx)?.obj.ok_or_else(|| invalid("allocation's context is gone"))?;
        self.backend.mem_free(ctx, req.dptr.0)?;
        self.tables.remove_region(req.dptr.0);
        Ok(calls::cuMemFree_v2::Reply {})
    }

    /// Under a memory limit the device is as large as the limit, and what
    /// the tenant's other sessions hold is not free.
    fn cuMemGetInfo_v2(&mut self, _: calls::cuMemGetInfo_v2::Request) -> R<calls::cuMemGetInfo_v2::Reply> {
        let (_, ctx) = self.current_ctx()?;
        self.reread_pools();
        self.account.settle(self.tables.charged_bytes());
        let (free, total) = self.backend.mem_get_info(ctx)?;
        match self.account.tenant_usage() {
            (0, _) => Ok(calls::cuMemGetInfo_v2::Reply { free, total }),
            (limit, used) => Ok(calls::cuMemGetInfo_v2::Reply {
                free: free.min(limit.saturating_sub(used)),
                total: total.min(limit),
            }),
        }
    }

    fn cuMemAllocPitch_v2(&mut self, req: calls::cuMemAllocPitch_v2::Request) -> R<calls::cuMemAllocPitch_v2::Reply> {
        let (h, ctx) = self.current_ctx()?;
        // The pitch is known only once allocated: charge the rows' bytes
        // first, then the padding, and give it all back if that is refused.
        let rows = req.widthInBytes.checked_mul(req.height).ok_or_else(|| invalid("pitched size overflows"))?;
        self.account.charge(rows)?;
        let (ptr, pitch) = self.backend.mem_alloc_pitch(ctx, req.widthInBytes, req.height, req.elementSizeBytes)?;
        let size = pitch.checked_mul(req.height).filter(|&s| s >= rows);
        let padding = size.ok_or_else(|| invalid("pitched size overflows")).and_then(|size| {
            self.account.charge(size - rows)?;
            Ok(size)
        });
        let size = match padding {
            Ok(size) => size,
            Err(e) => {
                self.backend.mem_free(ctx, ptr)?;
                return Err(e);
            }
        };
        self.tables.add_region(ptr, Region { size, ctx: h, owner: None });
        Ok(calls::cuMemAllocPitch_v2::Reply { dptr: DevPtr(ptr), pitch })
    }

    fn cuMemGetAddressRange_v2(
        &mut self,
        req: calls::cuMemGetAddressRange_v2::Request,
    ) -> R<calls::cuMemGetAddressRange_v2::Reply> {
        let (base, region) = self.device_region(req.dptr)?;
        Ok(calls::cuMemGetAddressRange_v2::Reply { pbase: DevPtr(base), psize: region.size })
    }

    fn PointerMapping(&mut self, req: calls::PointerMapping::Request) -> R<calls::PointerMapping::Reply> {
        let (start, region) = self.device_region(req.dptr)?;
        let pool = match region.owner {
            Some(Owner::Pool(h)) => h,
            _ => 0,
        };
        // A host block's device address is the guest's view of the block,
        // mapped whole; the driver here knows it under the server's address.
        let (base, size, decompress) = if let Some(Owner::HostBlock(_)) = region.owner {
            (start, region.size, false)
        } else {
            let ctx = self.current_ctx().ok().map(|(_, ctx)| ctx);
            self.backend.mem_mapping(ctx, req.dptr.0)?
        };
        Ok(calls::PointerMapping::Reply { pool: MemPool(pool), base: DevPtr(base), size, decompress })
    }

    fn MemcpyHtoD(&mut self, req: calls::MemcpyHtoD::Request) -> R<calls::MemcpyHtoD::Reply> {
        self.tables.check_range(req.dst.0, req.data.len() as u64)?;
        let (ctx, stream) = self.stream(req.stream)?;
        if req.data.is_empty() {
            return Ok(calls::MemcpyHtoD::Reply {});
        }
        self.refuse_in_capture(ctx, stream, "a copy from pageable memory")?;
        let backend = &self.backend;
        self.seat
            .submit(ctx, stream, Work::Copy, || backend.memcpy_htod(ctx, req.dst.0, &req.data, stream, req.sync))?;
        Ok(calls::MemcpyHtoD::Reply {})
    }

    fn MemcpyDtoH(&mut self, req: calls::MemcpyDtoH::Request) -> R<calls::MemcpyDtoH::Reply> {
        Ok(calls::MemcpyDtoH::Reply { data: self.read_device(req.src, req.size, req.stream)? })
    }

    fn MemcpyDtoD(&mut self, req: calls::MemcpyDtoD::Request) -> R<calls::MemcpyDtoD::Reply> {
        self.tables.check_range(req.dst.0, req.size)?;
        self.tables.check_range(req.src.0, req.size)?;
        let (ctx, stream) = self.stream(req.stream)?;
        if req.size == 0 {
            return Ok(calls::MemcpyDtoD::Reply {});
        }
        let backend = &self.backend;
        self.seat.submit(ctx, stream, Work::Copy, || {
            backend.memcpy_dtod(ctx, req.dst.0, req.src.0, req.size, stream, req.sync)
        })?;
        Ok(calls::MemcpyDtoD::Reply {})
    }

    fn Memset(&mut self, req: calls::Memset::Request) -> R<calls::Memset::Reply> {
        let op = backend::Memset {
            dst: req.dst.0,
            pitch: req.pitch,
            value: req.value,
            element_size: req.elementSize,
            width: req.width,
            height: req.height,
        };
        self.check_memset(&op)?;
        let (ctx, stream) = self.stream(req.stream)?;
        if op.is_empty() {
            return Ok(calls::Memset::Reply {});
        }
        let backend = &self.backend;
        self.seat.submit(ctx, stream, Work::Compute, || backend.memset(ctx, &op, stream, req.sync))?;
        Ok(calls::Memset::Reply {})
    }
}

#[allow(non_snake_case)]
impl HostMemoryCalls for Session {
    fn HostAlloc(&mut self, req: calls::HostAlloc::Request) -> R<calls::HostAlloc::Reply> {
        let ctx = self.host_block_context(req.flags)?;
        let alloc = |s: &mut Session| -> R<_> {
            let (block, host) = s.shared.alloc(&*s.backend, ctx, req.size, req.at)?;
            Ok((block, host.region.as_ptr() as u64, host.devptr, host.region.fd().try_clone_to_owned()))
        };
        // A mirror stands in for memory the driver takes into a capture
        // as it is: its registration must not be refused as the guest's own
        // allocation would be.
        let (block, address, devptr, fd) = if req.mirror { self.relaxed(alloc) } else { alloc(self) }?;
        let fd = match fd {
            Ok(fd) => fd,
            Err(e) => {
                self.shared.free(&*self.backend, block)?;
                return Err(CallError::new(CuError::OUT_OF_MEMORY, format!("a host block's descriptor: {e}")));
            }
        };
        // Kernels may use the memory through its device address.
        self.tables.add_region(devptr, Region { size: req.size, ctx: 0, owner: Some(Owner::HostBlock(block)) });
        self.fd_after_reply = Some(fd);
        Ok(calls::HostAlloc::Reply { block, address, devptr: DevPtr(devptr) })
    }

    fn HostPlace(&mut self, req: calls::HostPlace::Request) -> R<calls::HostPlace::Reply> {
        let ctx = self.host_block_context(req.flags)?;
        let place = |s: &mut Session| -> R<_> {
            let (block, host) = s.shared.place(&*s.backend, ctx, req.offset, req.size, req.at)?;
            Ok((block, host.region.as_ptr() as u64, host.devptr))
        };
        // As for HostAlloc: a mirror is registered even while a stream captures.
        let (block, address, devptr) = if req.mirror { self.relaxed(place) } else { place(self) }?;
        self.tables.add_region(devptr, Region { size: req.size, ctx: 0, owner: Some(Owner::HostBlock(block)) });
        Ok(calls::HostPlace::Reply { block, address, devptr: DevPtr(devptr) })
    }

    fn HostFree(&mut self, req: calls::HostFree::Request) -> R<calls::HostFree::Reply> {
        // Forgotten first: a host function's thread may read mapped blocks.
        self.mapped.forget(req.block);
        let block = self.shared.free(&*self.backend, req.block)?;
        self.tables.remove_region(block.devptr);
        if self.made_graphs {
            block.region.unmap_leaving_guard();
        }
        Ok(calls::HostFree::Reply {})
    }

    fn MemcpyHtoDShared(&mut self, req: calls::MemcpyHtoDShared::Request) -> R<calls::MemcpyHtoDShared::Reply> {
        self.tables.check_range(req.dst.0, req.size)?;
        let (ctx, stream) = self.stream(req.stream)?;
        let host = self.shared.range(&*self.backend, ctx, req.block, req.offset, req.size)?;
        if req.size == 0 {
            return Ok(calls::MemcpyHtoDShared::Reply {});
        }
        let backend = &self.backend;
        self.seat.submit(ctx, stream, Work::Copy, || {
            // SAFETY: a checked range of a registered block the session holds.
            unsafe { backend.memcpy_htod_host(ctx, req.dst.0, host.ptr, req.size as usize, stream, req.sync) }
        })?;
        if let Some(slot) = host.slot {
            self.shared.mark_slot(&*self.backend, slot, ctx, stream)?;
        }
        Ok(calls::MemcpyHtoDShared::Reply {})
    }

    fn MemcpyDtoHShared(&mut self, req: calls::MemcpyDtoHShared::Request) -> R<calls::MemcpyDtoHShared::Reply> {
        self.tables.check_range(req.src.0, req.size)?;
        let (ctx, stream) = self.stream(req.stream)?;
        let host = self.shared.range(&*self.backend, ctx, req.block, req.offset, req.size)?;
        if req.size == 0 {
            return Ok(calls::MemcpyDtoHShared::Reply {});
        }
        let backend = &self.backend;
        self.seat.submit(ctx, stream, Work::Copy, || {
            // SAFETY: as above.
            unsafe { backend.memcpy_dtoh_host(ctx, host.ptr, req.src.0, req.size as usize, stream, req.sync) }
        })?;
        if let Some(slot) = host.slot {
            self.shared.mark_slot(&*self.backend, slot, ctx, stream)?;
        }
        Ok(calls::MemcpyDtoHShared::Reply {})
    }

    fn StagingWait(&mut self, req: calls::StagingWait::Request) -> R<calls::StagingWait::Reply> {
        self.shared.wait_slot(&*self.backend, req.slot)?;
        Ok(calls::StagingWait::Reply {})
    }
}

impl Session {
    /// The session's region holding `ptr`, as `(base, region)`; NOT_FOUND,
    /// which the front-end reads as "not device memory", for any other address.
    fn device_region(&self, ptr: DevPtr) -> R<(u64, Region)> {
        let missing = || CallError::new(CuError::NOT_FOUND, format!("{:#x} is not device memory", ptr.0));
        self.tables.region_containing(ptr.0).ok_or_else(missing)
    }

    /// `size` bytes of the session's device memory at `src`, read in
    /// `stream`'s order once its earlier work is done.
    pub(super) fn read_device(&mut self, src: DevPtr, size: u64, stream: Stream) -> R<Vec<u8>> {
        // The client splits large copies; the reply must fit a frame.
        if size > (MAX_PAYLOAD - 64) as u64 {
            return Err(invalid(format!("a {size}-byte read exceeds one frame")));
        }
        self.tables.check_range(src.0, size)?;
        let (ctx, stream) = self.stream(stream)?;
        let len = size as usize;
        if len == 0 {
            return Ok(Vec::new());
        }
        self.refuse_in_capture(ctx, stream, "a copy to pageable memory")?;
        let (backend, seat) = (&self.backend, &self.seat);
        if let Some(pinned) = self.scratch.pinned(&**backend, ctx, len) {
            seat.submit(ctx, stream, Work::Copy, || backend.memcpy_dtoh(ctx, pinned, src.0, stream))?;
            return Ok(pinned.to_vec());
        }
        let mut data = vec![0u8; len];
        seat.submit(ctx, stream, Work::Copy, || backend.memcpy_dtoh(ctx, &mut data, src.0, stream))?;
        Ok(data)
    }

    /// The context a new host block is registered from, once its flags are
    /// known ones.
    fn host_block_context(&mut self, flags: u32) -> R<backend::Obj> {
        const KNOWN_FLAGS: u32 = 0x0f;
        if flags & !KNOWN_FLAGS != 0 {
            return Err(invalid(format!("host allocation flags {flags:#x}")));
        }
        Ok(self.current_ctx()?.1)
    }
}
