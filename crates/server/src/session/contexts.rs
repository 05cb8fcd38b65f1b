//! The session's side of devices, contexts and the profiler: a context
//! handle for each context the guest makes or retains, each client
//! thread's current one sent in every header.

use gpuplex_protocol::{calls, CallError, ContextsCalls, Ctx, CuError, DevicesCalls, ProfilerCalls};

use super::tables::CtxEntry;
use super::Session;

type R<T> = Result<T, CallError>;

#[allow(non_snake_case)]
impl DevicesCalls for Session {
    fn cuDeviceCanAccessPeer(
        &mut self,
        req: calls::cuDeviceCanAccessPeer::Request,
    ) -> R<calls::cuDeviceCanAccessPeer::Reply> {
        let (dev, peer) = (self.backend_device(req.dev)?, self.backend_device(req.peerDev)?);
        Ok(calls::cuDeviceCanAccessPeer::Reply { canAccessPeer: self.backend.can_access_peer(dev, peer)? })
    }
}

#[allow(non_snake_case)]
impl ContextsCalls for Session {
    fn CtxCreate(&mut self, req: calls::CtxCreate::Request) -> R<calls::CtxCreate::Reply> {
        let device = self.device(req.dev)? as i32;
        let obj = self.backend.ctx_create(self.devices[device as usize], req.flags)?;
        self.seat.context(obj, self.devices[device as usize]);
        Ok(calls::CtxCreate::Reply {
            ctx: Ctx(self.tables.add_ctx(CtxEntry { obj: Some(obj), device, primary: false })),
        })
    }

    fn CtxDestroy(&mut self, req: calls::CtxDestroy::Request) -> R<calls::CtxDestroy::Reply> {
        let entry = self.tables.ctx(req.ctx.0)?;
        if entry.primary {
            return Err(CallError::new(CuError::INVALID_CONTEXT, "a primary context is released, not destroyed"));
        }
        self.tables.drop_context_contents(req.ctx.0);
        self.tables.contexts.remove(&req.ctx.0);
        if let Some(obj) = entry.obj {
            self.context_gone(obj);
            self.backend.ctx_destroy(obj)?;
        }
        Ok(calls::CtxDestroy::Reply {})
    }

    fn cuDevicePrimaryCtxRetain(
        &mut self,
        req: calls::cuDevicePrimaryCtxRetain::Request,
    ) -> R<calls::cuDevicePrimaryCtxRetain::Reply> {
        let dev = self.device(req.dev)?;
        if self.tables.ctx(self.primaries[dev].handle)?.obj.is_none() {
            self.activate_primary(dev)?;
        }
        self.primaries[dev].refcount += 1;
        Ok(calls::cuDevicePrimaryCtxRetain::Reply { pctx: Ctx(self.primaries[dev].handle) })
    }

    fn PrimaryCtxRelease(&mut self, req: calls::PrimaryCtxRelease::Request) -> R<calls::PrimaryCtxRelease::Reply> {
        let dev = self.device(req.dev)?;
        if self.primaries[dev].refcount == 0 {
            return Err(CallError::new(CuError::INVALID_CONTEXT, "primary context is not retained"));
        }
        self.primaries[dev].refcount -= 1;
        if self.primaries[dev].refcount == 0 {
            // Released to zero, the primary context starts over, flags too.
            self.primaries[dev].flags = 0;
            self.deactivate_primary(dev)?;
        }
        Ok(calls::PrimaryCtxRelease::Reply { active: self.primaries[dev].refcount > 0 })
    }

    fn PrimaryCtxReset(&mut self, req: calls::PrimaryCtxReset::Request) -> R<calls::PrimaryCtxReset::Reply> {
        let dev = self.device(req.dev)?;
        self.deactivate_primary(dev)?;
        self.primaries[dev].flags = 0;
        Ok(calls::PrimaryCtxReset::Reply {})
    }

    fn cuDevicePrimaryCtxSetFlags_v2(
        &mut self,
        req: calls::cuDevicePrimaryCtxSetFlags_v2::Request,
    ) -> R<calls::cuDevicePrimaryCtxSetFlags_v2::Reply> {
        let dev = self.device(req.dev)?;
        if let Some(obj) = self.tables.ctx(self.primaries[dev].handle)?.obj {
            self.backend.ctx_set_flags(obj, req.flags)?;
        }
        self.primaries[dev].flags = req.flags;
        Ok(calls::cuDevicePrimaryCtxSetFlags_v2::Reply {})
    }

    fn cuDevicePrimaryCtxGetState(
        &mut self,
        req: calls::cuDevicePrimaryCtxGetState::Request,
    ) -> R<calls::cuDevicePrimaryCtxGetState::Reply> {
        let dev = self.device(req.dev)?;
        let active = self.tables.ctx(self.primaries[dev].handle)?.obj.is_some();
        Ok(calls::cuDevicePrimaryCtxGetState::Reply { flags: self.primaries[dev].flags, active: active as i32 })
    }

    fn cuCtxSynchronize(&mut self, _: calls::cuCtxSynchronize::Request) -> R<calls::cuCtxSynchronize::Reply> {
        let (_, ctx) = self.current_ctx()?;
        self.backend.ctx_synchronize(ctx)?;
        Ok(calls::cuCtxSynchronize::Reply {})
    }

    fn cuCtxSynchronize_v2(
        &mut self,
        req: calls::cuCtxSynchronize_v2::Request,
    ) -> R<calls::cuCtxSynchronize_v2::Reply> {
        let (_, ctx) = self.ctx_or_current(req.ctx)?;
        self.backend.ctx_synchronize(ctx)?;
        Ok(calls::cuCtxSynchronize_v2::Reply {})
    }

    fn cuCtxGetDevice(&mut self, _: calls::cuCtxGetDevice::Request) -> R<calls::cuCtxGetDevice::Reply> {
        let (h, _) = self.current_ctx()?;
        Ok(calls::cuCtxGetDevice::Reply { device: self.tables.ctx(h)?.device })
    }

    fn cuCtxGetDevice_v2(&mut self, req: calls::cuCtxGetDevice_v2::Request) -> R<calls::cuCtxGetDevice_v2::Reply> {
        let (h, _) = self.ctx_or_current(req.ctx)?;
        Ok(calls::cuCtxGetDevice_v2::Reply { device: self.tables.ctx(h)?.device })
    }

    fn cuCtxGetApiVersion(&mut self, req: calls::cuCtxGetApiVersion::Request) -> R<calls::cuCtxGetApiVersion::Reply> {
        let (_, ctx) = self.ctx_or_current(req.ctx)?;
        Ok(calls::cuCtxGetApiVersion::Reply { version: self.backend.ctx_api_version(ctx)? })
    }

    fn cuCtxGetFlags(&mut self, _: calls::cuCtxGetFlags::Request) -> R<calls::cuCtxGetFlags::Reply> {
        let (_, ctx) = self.current_ctx()?;
        Ok(calls::cuCtxGetFlags::Reply { flags: self.backend.ctx_get_flags(ctx)? })
    }

    fn cuCtxSetFlags(&mut self, req: calls::cuCtxSetFlags::Request) -> R<calls::cuCtxSetFlags::Reply> {
        let (_, ctx) = self.current_ctx()?;
        self.backend.ctx_set_flags(ctx, req.flags)?;
        Ok(calls::cuCtxSetFlags::Reply {})
    }

    fn cuCtxGetLimit(&mut self, req: calls::cuCtxGetLimit::Request) -> R<calls::cuCtxGetLimit::Reply> {
        let (_, ctx) = self.current_ctx()?;
        Ok(calls::cuCtxGetLimit::Reply { pvalue: self.backend.ctx_get_limit(ctx, req.limit)? })
    }

    fn cuCtxSetLimit(&mut self, req: calls::cuCtxSetLimit::Request) -> R<calls::cuCtxSetLimit::Reply> {
        let (_, ctx) = self.current_ctx()?;
        self.backend.ctx_set_limit(ctx, req.limit, req.value)?;
        Ok(calls::cuCtxSetLimit::Reply {})
    }

    fn cuCtxGetCacheConfig(&mut self, _: calls::cuCtxGetCacheConfig::Request) -> R<calls::cuCtxGetCacheConfig::Reply> {
        let (_, ctx) = self.current_ctx()?;
        Ok(calls::cuCtxGetCacheConfig::Reply { pconfig: self.backend.ctx_get_cache_config(ctx)? })
    }

    fn cuCtxSetCacheConfig(
        &mut self,
        req: calls::cuCtxSetCacheConfig::Request,
    ) -> R<calls::cuCtxSetCacheConfig::Reply> {
        let (_, ctx) = self.current_ctx()?;
        self.backend.ctx_set_cache_config(ctx, req.config)?;
        Ok(calls::cuCtxSetCacheConfig::Reply {})
    }

    fn cuCtxGetStreamPriorityRange(
        &mut self,
        _: calls::cuCtxGetStreamPriorityRange::Request,
    ) -> R<calls::cuCtxGetStreamPriorityRange::Reply> {
        let (_, ctx) = self.current_ctx()?;
        let (least, greatest) = self.backend.ctx_stream_priority_range(ctx)?;
        Ok(calls::cuCtxGetStreamPriorityRange::Reply { leastPriority: least, greatestPriority: greatest })
    }

    fn cuCtxGetId(&mut self, req: calls::cuCtxGetId::Request) -> R<calls::cuCtxGetId::Reply> {
        let (_, ctx) = self.ctx_or_current(req.ctx)?;
        Ok(calls::cuCtxGetId::Reply { ctxId: self.backend.ctx_id(ctx)? })
    }
}

impl ProfilerCalls for Session {}
