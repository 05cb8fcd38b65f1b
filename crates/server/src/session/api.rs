//! The session's side of every call in the table: translate client handles
//! through the session's tables, check device ranges and sizes, then call
//! the backend. Nothing reaches the backend unchecked. A copy or memset of
//! no bytes is checked as any other, then answered without the backend.

use gpuplex_protocol::calls::*;
use gpuplex_protocol::{Api, CallError, Ctx, CuError, DevPtr, Event, Func, Seq, Stream, MAX_PAYLOAD};

use super::launcher::ReadyLaunch;
use super::resolve::packed_size;
use super::tables::{CtxEntry, Entry, Kind, Owner, Region};
use super::{invalid, Session};
use crate::backend::{self, Obj};
use crate::sched::{Seat, Work};

type R<T> = Result<T, CallError>;

/// Runs a lane copy to or from `target` as the session's copy work: timed,
/// and under `band` held back for the turn. A copy whose target failed its
/// checks only drains the lanes, and reaches no GPU.
fn copying<T>(seat: &Seat, target: &Result<(Obj, Obj), CallError>, copy: impl FnOnce() -> T) -> T {
    match target {
        Ok((ctx, stream)) => seat.submit(*ctx, *stream, Work::Copy, copy),
        Err(_) => copy(),
    }
}

#[allow(non_snake_case)]
impl Api for Session {
    fn GraphAddMemAllocNode(&mut self, req: GraphAddMemAllocNode::Request) -> R<GraphAddMemAllocNode::Reply> {
        self.graph_add_mem_alloc_node(req)
    }

    fn GraphAddMemFreeNode(&mut self, req: GraphAddMemFreeNode::Request) -> R<GraphAddMemFreeNode::Reply> {
        self.graph_add_mem_free_node(req)
    }

    fn GraphMemAllocNodeParams(&mut self, req: GraphMemAllocNodeParams::Request) -> R<GraphMemAllocNodeParams::Reply> {
        self.graph_mem_alloc_node_params(req)
    }

    fn GraphMemAttributeSet(&mut self, req: GraphMemAttributeSet::Request) -> R<GraphMemAttributeSet::Reply> {
        self.graph_mem_set_attribute(req)
    }

    fn LibraryGetManaged(&mut self, req: LibraryGetManaged::Request) -> R<LibraryGetManaged::Reply> {
        if !self.shared.connected() {
            return Err(CallError::new(CuError::NOT_SUPPORTED, "managed variables are mirrored in shared memory only"));
        }
        let lib = self.tables.get(Kind::Library, req.library.0)?;
        let (ptr, size) = self.backend.library_get_managed(lib.obj, &req.name)?;
        let new = self.managed.add(&*self.backend, req.library.0, ptr, size)?;
        // Copies and launches in any context may name it.
        self.tables.add_region(ptr, Region { size, ctx: 0, owner: Some(Owner::Library(req.library.0)) });
        let (mirror, mirrorLen) = new.map_or((0, 0), |pages| {
            self.fd_after_reply = Some(pages.fd);
            (pages.at, pages.len)
        });
        Ok(LibraryGetManaged::Reply { dptr: DevPtr(ptr), bytes: size, mirror, mirrorLen })
    }

    fn LibraryManagedValue(&mut self, req: LibraryManagedValue::Request) -> R<LibraryManagedValue::Reply> {
        let lib = self.tables.get(Kind::Library, req.library.0)?;
        let (ptr, size) = self.backend.library_get_managed(lib.obj, &req.name)?;
        if size > gpuplex_protocol::MAX_PAYLOAD as u64 / 2 {
            return Err(CallError::new(CuError::NOT_SUPPORTED, "a __managed__ variable larger than a frame"));
        }
        let mut value = vec![0u8; size as usize];
        // SAFETY: the variable the backend just named, whole.
        unsafe { self.backend.managed_read(ptr, &mut value) }?;
        Ok(LibraryManagedValue::Reply { value })
    }

    fn CaptureMode(&mut self, req: CaptureMode::Request) -> R<CaptureMode::Reply> {
        self.capture_mode(req)
    }

    fn StreamBeginCapture(&mut self, req: StreamBeginCapture::Request) -> R<StreamBeginCapture::Reply> {
        self.begin_capture(req)
    }

    fn StreamBeginCaptureToGraph(
        &mut self,
        req: StreamBeginCaptureToGraph::Request,
    ) -> R<StreamBeginCaptureToGraph::Reply> {
        self.begin_capture_to_graph(req)
    }

    fn StreamEndCapture(&mut self, req: StreamEndCapture::Request) -> R<StreamEndCapture::Reply> {
        self.end_capture(req)
    }

    fn StreamCaptureInfo(&mut self, req: StreamCaptureInfo::Request) -> R<StreamCaptureInfo::Reply> {
        self.capture_info(req)
    }

    fn cuGraphCreate(&mut self, req: cuGraphCreate::Request) -> R<cuGraphCreate::Reply> {
        self.graph_create(req)
    }

    fn cuGraphDestroy(&mut self, req: cuGraphDestroy::Request) -> R<cuGraphDestroy::Reply> {
        self.graph_destroy(req)
    }

    fn cuGraphInstantiateWithFlags(
        &mut self,
        req: cuGraphInstantiateWithFlags::Request,
    ) -> R<cuGraphInstantiateWithFlags::Reply> {
        self.graph_instantiate(req)
    }

    fn cuGraphLaunch(&mut self, req: cuGraphLaunch::Request) -> R<cuGraphLaunch::Reply> {
        self.graph_launch(req)
    }

    fn cuGraphUpload(&mut self, req: cuGraphUpload::Request) -> R<cuGraphUpload::Reply> {
        self.graph_upload(req)
    }

    fn cuGraphExecDestroy(&mut self, req: cuGraphExecDestroy::Request) -> R<cuGraphExecDestroy::Reply> {
        self.graph_exec_destroy(req)
    }

    fn GraphAddKernelNode(&mut self, req: GraphAddKernelNode::Request) -> R<GraphAddKernelNode::Reply> {
        self.graph_add_kernel_node(req)
    }

    fn GraphAddMemcpyNode(&mut self, req: GraphAddMemcpyNode::Request) -> R<GraphAddMemcpyNode::Reply> {
        self.graph_add_memcpy_node(req)
    }

    fn GraphAddMemsetNode(&mut self, req: GraphAddMemsetNode::Request) -> R<GraphAddMemsetNode::Reply> {
        self.graph_add_memset_node(req)
    }

    fn cuGraphChildGraphNodeGetGraph(
        &mut self,
        req: cuGraphChildGraphNodeGetGraph::Request,
    ) -> R<cuGraphChildGraphNodeGetGraph::Reply> {
        self.child_graph(req)
    }

    fn GraphMemsetNodeParams(&mut self, req: GraphMemsetNodeParams::Request) -> R<GraphMemsetNodeParams::Reply> {
        self.memset_node_params(req)
    }

    fn GraphAddConditionalNode(&mut self, req: GraphAddConditionalNode::Request) -> R<GraphAddConditionalNode::Reply> {
        self.graph_add_conditional_node(req)
    }

    fn GraphAddEmptyNode(&mut self, req: GraphAddEmptyNode::Request) -> R<GraphAddEmptyNode::Reply> {
        self.graph_add_empty_node(req)
    }

    fn GraphAddChildGraphNode(&mut self, req: GraphAddChildGraphNode::Request) -> R<GraphAddChildGraphNode::Reply> {
        self.graph_add_child_node(req)
    }

    fn GraphAddEventNode(&mut self, req: GraphAddEventNode::Request) -> R<GraphAddEventNode::Reply> {
        self.graph_add_event_node(req)
    }

    fn GraphDependencies(&mut self, req: GraphDependencies::Request) -> R<GraphDependencies::Reply> {
        self.graph_dependencies(req)
    }

    fn GraphEdges(&mut self, req: GraphEdges::Request) -> R<GraphEdges::Reply> {
        self.graph_edges(req)
    }

    fn GraphNodeEdges(&mut self, req: GraphNodeEdges::Request) -> R<GraphNodeEdges::Reply> {
        self.graph_node_edges(req)
    }

    fn GraphKernelNodeSetParams(
        &mut self,
        req: GraphKernelNodeSetParams::Request,
    ) -> R<GraphKernelNodeSetParams::Reply> {
        self.graph_kernel_node_set(req)
    }

    fn cuGraphClone(&mut self, req: cuGraphClone::Request) -> R<cuGraphClone::Reply> {
        self.graph_clone(req)
    }

    fn cuGraphNodeFindInClone(&mut self, req: cuGraphNodeFindInClone::Request) -> R<cuGraphNodeFindInClone::Reply> {
        self.graph_find_in_clone(req)
    }

    fn cuGraphDestroyNode(&mut self, req: cuGraphDestroyNode::Request) -> R<cuGraphDestroyNode::Reply> {
        self.graph_destroy_node(req)
    }

    fn GraphExecUpdate(&mut self, req: GraphExecUpdate::Request) -> R<GraphExecUpdate::Reply> {
        self.graph_exec_update(req)
    }

    fn GraphAddHostNode(&mut self, req: GraphAddHostNode::Request) -> R<GraphAddHostNode::Reply> {
        self.graph_add_host_node(req)
    }

    fn GraphHostNodeSetParams(&mut self, req: GraphHostNodeSetParams::Request) -> R<GraphHostNodeSetParams::Reply> {
        self.graph_host_node_set(req)
    }

    fn GraphMemcpyNodeSetParams(
        &mut self,
        req: GraphMemcpyNodeSetParams::Request,
    ) -> R<GraphMemcpyNodeSetParams::Reply> {
        self.graph_memcpy_node_set(req)
    }

    fn GraphMemsetNodeSetParams(
        &mut self,
        req: GraphMemsetNodeSetParams::Request,
    ) -> R<GraphMemsetNodeSetParams::Reply> {
        self.graph_memset_node_set(req)
    }

    fn GraphChildNodeSetParams(&mut self, req: GraphChildNodeSetParams::Request) -> R<GraphChildNodeSetParams::Reply> {
        self.graph_child_node_set(req)
    }

    fn GraphEventNodeSetEvent(&mut self, req: GraphEventNodeSetEvent::Request) -> R<GraphEventNodeSetEvent::Reply> {
        self.graph_event_node_set(req)
    }

    fn TensorMapEncode(&mut self, req: TensorMapEncode::Request) -> R<TensorMapEncode::Reply> {
        self.tensor_map_encode(req)
    }

    fn TensorMapReplaceAddress(&mut self, req: TensorMapReplaceAddress::Request) -> R<TensorMapReplaceAddress::Reply> {
        self.tensor_map_replace_address(req)
    }

    fn LaunchHostFunc(&mut self, req: LaunchHostFunc::Request) -> R<LaunchHostFunc::Reply> {
        self.launch_host_func(req)
    }

    fn StreamUpdateCaptureDependencies(
        &mut self,
        req: StreamUpdateCaptureDependencies::Request,
    ) -> R<StreamUpdateCaptureDependencies::Reply> {
        self.update_capture_deps(req)
    }

    fn GraphNodes(&mut self, req: GraphNodes::Request) -> R<GraphNodes::Reply> {
        self.graph_nodes(req)
    }

    fn Memcpy3D(&mut self, req: Memcpy3D::Request) -> R<Memcpy3D::Reply> {
        self.memcpy_3d(req)
    }

    fn ArrayCreate(&mut self, req: ArrayCreate::Request) -> R<ArrayCreate::Reply> {
        self.array_create(req)
    }

    fn cuArrayDestroy(&mut self, req: cuArrayDestroy::Request) -> R<cuArrayDestroy::Reply> {
        self.array_destroy(req)
    }

    fn ArrayDescriptor(&mut self, req: ArrayDescriptor::Request) -> R<ArrayDescriptor::Reply> {
        self.array_descriptor(req)
    }

    fn IpcGetMemHandle(&mut self, req: IpcGetMemHandle::Request) -> R<IpcGetMemHandle::Reply> {
        self.ipc_get_mem_handle(req)
    }

    fn IpcOpenMemHandle(&mut self, req: IpcOpenMemHandle::Request) -> R<IpcOpenMemHandle::Reply> {
        self.ipc_open_mem_handle(req)
    }

    fn cuIpcCloseMemHandle(&mut self, req: cuIpcCloseMemHandle::Request) -> R<cuIpcCloseMemHandle::Reply> {
        self.ipc_close_mem_handle(req)
    }

    fn IpcGetEventHandle(&mut self, req: IpcGetEventHandle::Request) -> R<IpcGetEventHandle::Reply> {
        self.ipc_get_event_handle(req)
    }

    fn IpcOpenEventHandle(&mut self, req: IpcOpenEventHandle::Request) -> R<IpcOpenEventHandle::Reply> {
        self.ipc_open_event_handle(req)
    }

    fn MipmappedArrayCreate(&mut self, req: MipmappedArrayCreate::Request) -> R<MipmappedArrayCreate::Reply> {
        self.mipmap_create(req)
    }

    fn cuMipmappedArrayGetLevel(
        &mut self,
        req: cuMipmappedArrayGetLevel::Request,
    ) -> R<cuMipmappedArrayGetLevel::Reply> {
        self.mipmap_level(req)
    }

    fn cuMipmappedArrayDestroy(&mut self, req: cuMipmappedArrayDestroy::Request) -> R<cuMipmappedArrayDestroy::Reply> {
        self.mipmap_destroy(req)
    }

    fn TexObjectCreate(&mut self, req: TexObjectCreate::Request) -> R<TexObjectCreate::Reply> {
        self.tex_object_create(req)
    }

    fn TexObjectDestroy(&mut self, req: TexObjectDestroy::Request) -> R<TexObjectDestroy::Reply> {
        self.tex_object_destroy(req)
    }

    fn SurfObjectCreate(&mut self, req: SurfObjectCreate::Request) -> R<SurfObjectCreate::Reply> {
        self.surf_object_create(req)
    }

    fn SurfObjectDestroy(&mut self, req: SurfObjectDestroy::Request) -> R<SurfObjectDestroy::Reply> {
        self.surf_object_destroy(req)
    }

    fn MemAllocAsync(&mut self, req: MemAllocAsync::Request) -> R<MemAllocAsync::Reply> {
        self.mem_alloc_async(req)
    }

    fn MemFreeAsync(&mut self, req: MemFreeAsync::Request) -> R<MemFreeAsync::Reply> {
        self.mem_free_async(req)
    }

    fn MemPoolCreate(&mut self, req: MemPoolCreate::Request) -> R<MemPoolCreate::Reply> {
        self.mem_pool_create(req)
    }

    fn cuMemPoolDestroy(&mut self, req: cuMemPoolDestroy::Request) -> R<cuMemPoolDestroy::Reply> {
        self.mem_pool_destroy(req)
    }

    fn cuMemPoolTrimTo(&mut self, req: cuMemPoolTrimTo::Request) -> R<cuMemPoolTrimTo::Reply> {
        self.mem_pool_trim(req)
    }

    fn MemPoolSetAttribute(&mut self, req: MemPoolSetAttribute::Request) -> R<MemPoolSetAttribute::Reply> {
        self.mem_pool_set_attribute(req)
    }

    fn MemPoolGetAttribute(&mut self, req: MemPoolGetAttribute::Request) -> R<MemPoolGetAttribute::Reply> {
        self.mem_pool_get_attribute(req)
    }

    fn MemPoolSetAccess(&mut self, req: MemPoolSetAccess::Request) -> R<MemPoolSetAccess::Reply> {
        self.mem_pool_set_access(req)
    }

    fn MemPoolGetAccess(&mut self, req: MemPoolGetAccess::Request) -> R<MemPoolGetAccess::Reply> {
        self.mem_pool_get_access(req)
    }

    fn cuDeviceGetDefaultMemPool(
        &mut self,
        req: cuDeviceGetDefaultMemPool::Request,
    ) -> R<cuDeviceGetDefaultMemPool::Reply> {
        self.device_default_pool(req)
    }

    fn cuDeviceGetMemPool(&mut self, req: cuDeviceGetMemPool::Request) -> R<cuDeviceGetMemPool::Reply> {
        self.device_pool(req)
    }

    fn cuDeviceSetMemPool(&mut self, req: cuDeviceSetMemPool::Request) -> R<cuDeviceSetMemPool::Reply> {
        self.device_set_pool(req)
    }

    fn MemGranularity(&mut self, req: MemGranularity::Request) -> R<MemGranularity::Reply> {
        self.mem_granularity(req)
    }

    fn MemCreate(&mut self, req: MemCreate::Request) -> R<MemCreate::Reply> {
        self.mem_create(req)
    }

    fn MemRelease(&mut self, req: MemRelease::Request) -> R<MemRelease::Reply> {
        self.mem_release(req)
    }

    fn MemRetain(&mut self, req: MemRetain::Request) -> R<MemRetain::Reply> {
        self.mem_retain(req)
    }

    fn MemProperties(&mut self, req: MemProperties::Request) -> R<MemProperties::Reply> {
        self.mem_properties(req)
    }

    fn MemAddressReserve(&mut self, req: MemAddressReserve::Request) -> R<MemAddressReserve::Reply> {
        self.mem_address_reserve(req)
    }

    fn MemAddressFree(&mut self, req: MemAddressFree::Request) -> R<MemAddressFree::Reply> {
        self.mem_address_free(req)
    }

    fn MemMap(&mut self, req: MemMap::Request) -> R<MemMap::Reply> {
        self.mem_map(req)
    }

    fn MemUnmap(&mut self, req: MemUnmap::Request) -> R<MemUnmap::Reply> {
        self.mem_unmap(req)
    }

    fn MemSetAccess(&mut self, req: MemSetAccess::Request) -> R<MemSetAccess::Reply> {
        self.mem_set_access(req)
    }

    fn MemGetAccess(&mut self, req: MemGetAccess::Request) -> R<MemGetAccess::Reply> {
        self.mem_get_access(req)
    }

    fn cuDeviceCanAccessPeer(&mut self, req: cuDeviceCanAccessPeer::Request) -> R<cuDeviceCanAccessPeer::Reply> {
        let (dev, peer) = (self.backend_device(req.dev)?, self.backend_device(req.peerDev)?);
        Ok(cuDeviceCanAccessPeer::Reply { canAccessPeer: self.backend.can_access_peer(dev, peer)? })
    }

    fn CtxCreate(&mut self, req: CtxCreate::Request) -> R<CtxCreate::Reply> {
        let device = self.device(req.dev)? as i32;
        let obj = self.backend.ctx_create(self.devices[device as usize], req.flags)?;
        self.seat.context(obj, self.devices[device as usize]);
        Ok(CtxCreate::Reply { ctx: Ctx(self.tables.add_ctx(CtxEntry { obj: Some(obj), device, primary: false })) })
    }

    fn CtxDestroy(&mut self, req: CtxDestroy::Request) -> R<CtxDestroy::Reply> {
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
        Ok(CtxDestroy::Reply {})
    }

    fn cuDevicePrimaryCtxRetain(
        &mut self,
        req: cuDevicePrimaryCtxRetain::Request,
    ) -> R<cuDevicePrimaryCtxRetain::Reply> {
        let dev = self.device(req.dev)?;
        if self.tables.ctx(self.primaries[dev].handle)?.obj.is_none() {
            self.activate_primary(dev)?;
        }
        self.primaries[dev].refcount += 1;
        Ok(cuDevicePrimaryCtxRetain::Reply { pctx: Ctx(self.primaries[dev].handle) })
    }

    fn PrimaryCtxRelease(&mut self, req: PrimaryCtxRelease::Request) -> R<PrimaryCtxRelease::Reply> {
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
        Ok(PrimaryCtxRelease::Reply { active: self.primaries[dev].refcount > 0 })
    }

    fn PrimaryCtxReset(&mut self, req: PrimaryCtxReset::Request) -> R<PrimaryCtxReset::Reply> {
        let dev = self.device(req.dev)?;
        self.deactivate_primary(dev)?;
        self.primaries[dev].flags = 0;
        Ok(PrimaryCtxReset::Reply {})
    }

    fn cuDevicePrimaryCtxSetFlags_v2(
        &mut self,
        req: cuDevicePrimaryCtxSetFlags_v2::Request,
    ) -> R<cuDevicePrimaryCtxSetFlags_v2::Reply> {
        let dev = self.device(req.dev)?;
        if let Some(obj) = self.tables.ctx(self.primaries[dev].handle)?.obj {
            self.backend.ctx_set_flags(obj, req.flags)?;
        }
        self.primaries[dev].flags = req.flags;
        Ok(cuDevicePrimaryCtxSetFlags_v2::Reply {})
    }

    fn cuDevicePrimaryCtxGetState(
        &mut self,
        req: cuDevicePrimaryCtxGetState::Request,
    ) -> R<cuDevicePrimaryCtxGetState::Reply> {
        let dev = self.device(req.dev)?;
        let active = self.tables.ctx(self.primaries[dev].handle)?.obj.is_some();
        Ok(cuDevicePrimaryCtxGetState::Reply { flags: self.primaries[dev].flags, active: active as i32 })
    }

    fn cuCtxSynchronize(&mut self, _: cuCtxSynchronize::Request) -> R<cuCtxSynchronize::Reply> {
        let (_, ctx) = self.current_ctx()?;
        self.backend.ctx_synchronize(ctx)?;
        Ok(cuCtxSynchronize::Reply {})
    }

    fn cuCtxSynchronize_v2(&mut self, req: cuCtxSynchronize_v2::Request) -> R<cuCtxSynchronize_v2::Reply> {
        let (_, ctx) = self.ctx_or_current(req.ctx)?;
        self.backend.ctx_synchronize(ctx)?;
        Ok(cuCtxSynchronize_v2::Reply {})
    }

    fn cuCtxGetDevice(&mut self, _: cuCtxGetDevice::Request) -> R<cuCtxGetDevice::Reply> {
        let (h, _) = self.current_ctx()?;
        Ok(cuCtxGetDevice::Reply { device: self.tables.ctx(h)?.device })
    }

    fn cuCtxGetDevice_v2(&mut self, req: cuCtxGetDevice_v2::Request) -> R<cuCtxGetDevice_v2::Reply> {
        let (h, _) = self.ctx_or_current(req.ctx)?;
        Ok(cuCtxGetDevice_v2::Reply { device: self.tables.ctx(h)?.device })
    }

    fn cuCtxGetApiVersion(&mut self, req: cuCtxGetApiVersion::Request) -> R<cuCtxGetApiVersion::Reply> {
        let (_, ctx) = self.ctx_or_current(req.ctx)?;
        Ok(cuCtxGetApiVersion::Reply { version: self.backend.ctx_api_version(ctx)? })
    }

    fn cuCtxGetFlags(&mut self, _: cuCtxGetFlags::Request) -> R<cuCtxGetFlags::Reply> {
        let (_, ctx) = self.current_ctx()?;
        Ok(cuCtxGetFlags::Reply { flags: self.backend.ctx_get_flags(ctx)? })
    }

    fn cuCtxSetFlags(&mut self, req: cuCtxSetFlags::Request) -> R<cuCtxSetFlags::Reply> {
        let (_, ctx) = self.current_ctx()?;
        self.backend.ctx_set_flags(ctx, req.flags)?;
        Ok(cuCtxSetFlags::Reply {})
    }

    fn cuCtxGetLimit(&mut self, req: cuCtxGetLimit::Request) -> R<cuCtxGetLimit::Reply> {
        let (_, ctx) = self.current_ctx()?;
        Ok(cuCtxGetLimit::Reply { pvalue: self.backend.ctx_get_limit(ctx, req.limit)? })
    }

    fn cuCtxSetLimit(&mut self, req: cuCtxSetLimit::Request) -> R<cuCtxSetLimit::Reply> {
        let (_, ctx) = self.current_ctx()?;
        self.backend.ctx_set_limit(ctx, req.limit, req.value)?;
        Ok(cuCtxSetLimit::Reply {})
    }

    fn cuCtxGetCacheConfig(&mut self, _: cuCtxGetCacheConfig::Request) -> R<cuCtxGetCacheConfig::Reply> {
        let (_, ctx) = self.current_ctx()?;
        Ok(cuCtxGetCacheConfig::Reply { pconfig: self.backend.ctx_get_cache_config(ctx)? })
    }

    fn cuCtxSetCacheConfig(&mut self, req: cuCtxSetCacheConfig::Request) -> R<cuCtxSetCacheConfig::Reply> {
        let (_, ctx) = self.current_ctx()?;
        self.backend.ctx_set_cache_config(ctx, req.config)?;
        Ok(cuCtxSetCacheConfig::Reply {})
    }

    fn cuCtxGetStreamPriorityRange(
        &mut self,
        _: cuCtxGetStreamPriorityRange::Request,
    ) -> R<cuCtxGetStreamPriorityRange::Reply> {
        let (_, ctx) = self.current_ctx()?;
        let (least, greatest) = self.backend.ctx_stream_priority_range(ctx)?;
        Ok(cuCtxGetStreamPriorityRange::Reply { leastPriority: least, greatestPriority: greatest })
    }

    fn cuCtxGetId(&mut self, req: cuCtxGetId::Request) -> R<cuCtxGetId::Reply> {
        let (_, ctx) = self.ctx_or_current(req.ctx)?;
        Ok(cuCtxGetId::Reply { ctxId: self.backend.ctx_id(ctx)? })
    }

    fn cuMemAlloc_v2(&mut self, req: cuMemAlloc_v2::Request) -> R<cuMemAlloc_v2::Reply> {
        let (h, ctx) = self.current_ctx()?;
        if req.bytesize == 0 {
            return Err(invalid("zero-byte allocation"));
        }
        self.charge_reclaiming(req.bytesize)?;
        let ptr = self.backend.mem_alloc(ctx, req.bytesize)?;
        self.tables.add_region(ptr, Region { size: req.bytesize, ctx: h, owner: None });
        Ok(cuMemAlloc_v2::Reply { dptr: DevPtr(ptr) })
    }

    fn cuMemFree_v2(&mut self, req: cuMemFree_v2::Request) -> R<cuMemFree_v2::Reply> {
        // Freeing NULL is a no-op, as with free(3).
        if req.dptr.0 == 0 {
            return Ok(cuMemFree_v2::Reply {});
        }
        if let Some(freed) = self.free_pooled_now(req.dptr.0) {
            return freed.map(|()| cuMemFree_v2::Reply {});
        }
        let region = self
            .tables
            .region_at(req.dptr.0)
            .filter(|r| r.owner.is_none())
            .ok_or_else(|| invalid(format!("{:#x} is not an allocation", req.dptr.0)))?;
        let ctx = self.tables.ctx(region.ctx)?.obj.ok_or_else(|| invalid("allocation's context is gone"))?;
        self.backend.mem_free(ctx, req.dptr.0)?;
        self.tables.remove_region(req.dptr.0);
        Ok(cuMemFree_v2::Reply {})
    }

    /// Under a memory limit the device is as large as the limit, and what
    /// the tenant's other sessions hold is not free.
    fn cuMemGetInfo_v2(&mut self, _: cuMemGetInfo_v2::Request) -> R<cuMemGetInfo_v2::Reply> {
        let (_, ctx) = self.current_ctx()?;
        self.reread_pools();
        self.account.settle(self.tables.charged_bytes());
        let (free, total) = self.backend.mem_get_info(ctx)?;
        match self.account.tenant_usage() {
            (0, _) => Ok(cuMemGetInfo_v2::Reply { free, total }),
            (limit, used) => {
                Ok(cuMemGetInfo_v2::Reply { free: free.min(limit.saturating_sub(used)), total: total.min(limit) })
            }
        }
    }

    fn cuMemAllocPitch_v2(&mut self, req: cuMemAllocPitch_v2::Request) -> R<cuMemAllocPitch_v2::Reply> {
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
        Ok(cuMemAllocPitch_v2::Reply { dptr: DevPtr(ptr), pitch })
    }

    fn cuMemGetAddressRange_v2(&mut self, req: cuMemGetAddressRange_v2::Request) -> R<cuMemGetAddressRange_v2::Reply> {
        let (base, region) = self
            .tables
            .region_containing(req.dptr.0)
            .ok_or_else(|| CallError::new(CuError::NOT_FOUND, format!("{:#x} is not device memory", req.dptr.0)))?;
        Ok(cuMemGetAddressRange_v2::Reply { pbase: DevPtr(base), psize: region.size })
    }

    fn MemcpyHtoD(&mut self, req: MemcpyHtoD::Request) -> R<MemcpyHtoD::Reply> {
        self.tables.check_range(req.dst.0, req.data.len() as u64)?;
        let (ctx, stream) = self.stream(req.stream)?;
        if req.data.is_empty() {
            return Ok(MemcpyHtoD::Reply {});
        }
        self.refuse_in_capture(ctx, stream, "a copy from pageable memory")?;
        let backend = &self.backend;
        self.seat
            .submit(ctx, stream, Work::Copy, || backend.memcpy_htod(ctx, req.dst.0, &req.data, stream, req.sync))?;
        Ok(MemcpyHtoD::Reply {})
    }

    fn MemcpyDtoH(&mut self, req: MemcpyDtoH::Request) -> R<MemcpyDtoH::Reply> {
        // The client splits large copies; the reply must fit a frame.
        if req.size > (MAX_PAYLOAD - 64) as u64 {
            return Err(invalid(format!("a {}-byte read exceeds one frame", req.size)));
        }
        self.tables.check_range(req.src.0, req.size)?;
        let (ctx, stream) = self.stream(req.stream)?;
        let len = req.size as usize;
        if len == 0 {
            return Ok(MemcpyDtoH::Reply { data: Vec::new() });
        }
        self.refuse_in_capture(ctx, stream, "a copy to pageable memory")?;
        let (backend, seat) = (&self.backend, &self.seat);
        if let Some(pinned) = self.scratch.pinned(&**backend, ctx, len) {
            seat.submit(ctx, stream, Work::Copy, || backend.memcpy_dtoh(ctx, pinned, req.src.0, stream))?;
            return Ok(MemcpyDtoH::Reply { data: pinned.to_vec() });
        }
        let mut data = vec![0u8; len];
        seat.submit(ctx, stream, Work::Copy, || backend.memcpy_dtoh(ctx, &mut data, req.src.0, stream))?;
        Ok(MemcpyDtoH::Reply { data })
    }

    fn MemcpyDtoD(&mut self, req: MemcpyDtoD::Request) -> R<MemcpyDtoD::Reply> {
        self.tables.check_range(req.dst.0, req.size)?;
        self.tables.check_range(req.src.0, req.size)?;
        let (ctx, stream) = self.stream(req.stream)?;
        if req.size == 0 {
            return Ok(MemcpyDtoD::Reply {});
        }
        let backend = &self.backend;
        self.seat.submit(ctx, stream, Work::Copy, || {
            backend.memcpy_dtod(ctx, req.dst.0, req.src.0, req.size, stream, req.sync)
        })?;
        Ok(MemcpyDtoD::Reply {})
    }

    fn HostAlloc(&mut self, req: HostAlloc::Request) -> R<HostAlloc::Reply> {
        const KNOWN_FLAGS: u32 = 0x0f;
        if req.flags & !KNOWN_FLAGS != 0 {
            return Err(invalid(format!("host allocation flags {:#x}", req.flags)));
        }
        let (_, ctx) = self.current_ctx()?;
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
        Ok(HostAlloc::Reply { block, address, devptr: DevPtr(devptr) })
    }

    fn HostFree(&mut self, req: HostFree::Request) -> R<HostFree::Reply> {
        let block = self.shared.free(&*self.backend, req.block)?;
        self.tables.remove_region(block.devptr);
        if self.made_graphs {
            block.region.unmap_leaving_guard();
        }
        Ok(HostFree::Reply {})
    }

    fn MemcpyHtoDShared(&mut self, req: MemcpyHtoDShared::Request) -> R<MemcpyHtoDShared::Reply> {
        self.tables.check_range(req.dst.0, req.size)?;
        let (ctx, stream) = self.stream(req.stream)?;
        let host = self.shared.range(&*self.backend, ctx, req.block, req.offset, req.size)?;
        if req.size == 0 {
            return Ok(MemcpyHtoDShared::Reply {});
        }
        let backend = &self.backend;
        self.seat.submit(ctx, stream, Work::Copy, || {
            // SAFETY: a checked range of a registered block the session holds.
            unsafe { backend.memcpy_htod_host(ctx, req.dst.0, host.ptr, req.size as usize, stream, req.sync) }
        })?;
        if let Some(slot) = host.slot {
            self.shared.mark_slot(&*self.backend, slot, ctx, stream)?;
        }
        Ok(MemcpyHtoDShared::Reply {})
    }

    fn MemcpyDtoHShared(&mut self, req: MemcpyDtoHShared::Request) -> R<MemcpyDtoHShared::Reply> {
        self.tables.check_range(req.src.0, req.size)?;
        let (ctx, stream) = self.stream(req.stream)?;
        let host = self.shared.range(&*self.backend, ctx, req.block, req.offset, req.size)?;
        if req.size == 0 {
            return Ok(MemcpyDtoHShared::Reply {});
        }
        let backend = &self.backend;
        self.seat.submit(ctx, stream, Work::Copy, || {
            // SAFETY: as above.
            unsafe { backend.memcpy_dtoh_host(ctx, host.ptr, req.src.0, req.size as usize, stream, req.sync) }
        })?;
        if let Some(slot) = host.slot {
            self.shared.mark_slot(&*self.backend, slot, ctx, stream)?;
        }
        Ok(MemcpyDtoHShared::Reply {})
    }

    fn MemcpyHtoDLanes(&mut self, req: MemcpyHtoDLanes::Request) -> R<MemcpyHtoDLanes::Reply> {
        // A failed check still takes the copy's chunks off the lanes.
        let target = self.tables.check_range(req.dst.0, req.size).and_then(|()| self.stream(req.stream));
        let lanes = self.lanes.as_mut().ok_or_else(|| invalid("no lanes are open"))?;
        copying(&self.seat, &target, || lanes.htod(&*self.backend, target.clone(), req.dst.0, req.size, req.copy))?;
        Ok(MemcpyHtoDLanes::Reply {})
    }

    fn MemcpyDtoHLanes(&mut self, req: MemcpyDtoHLanes::Request) -> R<MemcpyDtoHLanes::Reply> {
        let target = self.tables.check_range(req.src.0, req.size).and_then(|()| self.stream(req.stream));
        let lanes = self.lanes.as_mut().ok_or_else(|| invalid("no lanes are open"))?;
        copying(&self.seat, &target, || lanes.dtoh(&*self.backend, target.clone(), req.src.0, req.size, req.copy))?;
        Ok(MemcpyDtoHLanes::Reply {})
    }

    fn StagingWait(&mut self, req: StagingWait::Request) -> R<StagingWait::Reply> {
        self.shared.wait_slot(&*self.backend, req.slot)?;
        Ok(StagingWait::Reply {})
    }

    fn Memset(&mut self, req: Memset::Request) -> R<Memset::Reply> {
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
            return Ok(Memset::Reply {});
        }
        let backend = &self.backend;
        self.seat.submit(ctx, stream, Work::Compute, || backend.memset(ctx, &op, stream, req.sync))?;
        Ok(Memset::Reply {})
    }

    fn ModuleLoad(&mut self, req: ModuleLoad::Request) -> R<ModuleLoad::Reply> {
        let (h, ctx) = self.current_ctx()?;
        let image = self.images.resolve(req.digest, req.image)?;
        let footprint = self.charge_image(req.digest, &image)?;
        let obj = self.backend.module_load(ctx, &image)?;
        let module = self.tables.add(Kind::Module, Entry { obj, ctx: h, owner: Owner::Ctx(h) });
        self.tables.set_footprint(module, footprint);
        Ok(ModuleLoad::Reply { module: gpuplex_protocol::Module(module) })
    }

    fn cuModuleUnload(&mut self, req: cuModuleUnload::Request) -> R<cuModuleUnload::Reply> {
        let (ctx, entry) = self.module(req.hmod.0)?;
        if let Owner::Library(_) = entry.owner {
            return Err(CallError::new(CuError::NOT_PERMITTED, "a library's module is unloaded with its library"));
        }
        self.backend.module_unload(ctx, entry.obj)?;
        self.tables.remove(Kind::Module, req.hmod.0)?;
        Ok(cuModuleUnload::Reply {})
    }

    fn cuModuleGetFunction(&mut self, req: cuModuleGetFunction::Request) -> R<cuModuleGetFunction::Reply> {
        let (ctx, entry) = self.module(req.hmod.0)?;
        let obj = self.backend.module_get_function(ctx, entry.obj, &req.name)?;
        let h = self.tables.add(Kind::Func, Entry { obj, ctx: entry.ctx, owner: Owner::Module(req.hmod.0) });
        Ok(cuModuleGetFunction::Reply { hfunc: Func(h) })
    }

    fn ModuleGetGlobal(&mut self, req: ModuleGetGlobal::Request) -> R<ModuleGetGlobal::Reply> {
        let (ctx, entry) = self.module(req.hmod.0)?;
        let global = self.backend.module_get_global(ctx, entry.obj, &req.name)?;
        let (dptr, bytes) = self.add_global(entry.ctx, Owner::Module(req.hmod.0), global);
        Ok(ModuleGetGlobal::Reply { dptr, bytes })
    }

    fn cuModuleGetLoadingMode(&mut self, _: cuModuleGetLoadingMode::Request) -> R<cuModuleGetLoadingMode::Reply> {
        Ok(cuModuleGetLoadingMode::Reply { mode: self.backend.module_loading_mode()? })
    }

    fn cuModuleGetFunctionCount(
        &mut self,
        req: cuModuleGetFunctionCount::Request,
    ) -> R<cuModuleGetFunctionCount::Reply> {
        let (ctx, entry) = self.module(req.hmod.0)?;
        Ok(cuModuleGetFunctionCount::Reply { count: self.backend.module_function_count(ctx, entry.obj)? })
    }

    fn Link(&mut self, req: Link::Request) -> R<Link::Reply> {
        self.link(req)
    }

    fn FuncName(&mut self, req: FuncName::Request) -> R<FuncName::Reply> {
        let (ctx, func) = self.func(req.func)?;
        Ok(FuncName::Reply { name: self.backend.func_name(ctx, func)? })
    }

    fn ModuleFunctions(&mut self, req: ModuleFunctions::Request) -> R<ModuleFunctions::Reply> {
        let (ctx, entry) = self.module(req.hmod.0)?;
        let funcs = self.backend.module_functions(ctx, entry.obj)?;
        // The same handles cuModuleGetFunction issues for these functions.
        let funcs = funcs
            .into_iter()
            .map(|obj| self.tables.add(Kind::Func, Entry { obj, ctx: entry.ctx, owner: Owner::Module(req.hmod.0) }))
            .collect();
        Ok(ModuleFunctions::Reply { funcs: Seq(funcs) })
    }

    fn LibraryLoad(&mut self, req: LibraryLoad::Request) -> R<LibraryLoad::Reply> {
        let image = self.images.resolve(req.digest, req.image)?;
        let footprint = self.charge_image(req.digest, &image)?;
        let obj = self.backend.library_load(&image)?;
        let h = self.tables.add(Kind::Library, Entry { obj, ctx: 0, owner: Owner::Ctx(0) });
        self.tables.set_footprint(h, footprint);
        Ok(LibraryLoad::Reply { library: gpuplex_protocol::Library(h) })
    }

    fn cuLibraryUnload(&mut self, req: cuLibraryUnload::Request) -> R<cuLibraryUnload::Reply> {
        let entry = self.tables.get(Kind::Library, req.library.0)?;
        self.managed.unloaded(req.library.0);
        self.backend.library_unload(entry.obj)?;
        self.tables.remove(Kind::Library, req.library.0)?;
        Ok(cuLibraryUnload::Reply {})
    }

    fn cuLibraryGetKernel(&mut self, req: cuLibraryGetKernel::Request) -> R<cuLibraryGetKernel::Reply> {
        let lib = self.tables.get(Kind::Library, req.library.0)?;
        let obj = self.backend.library_get_kernel(lib.obj, &req.name)?;
        let h = self.tables.add(Kind::Kernel, Entry { obj, ctx: 0, owner: Owner::Library(req.library.0) });
        Ok(cuLibraryGetKernel::Reply { pKernel: gpuplex_protocol::Kernel(h) })
    }

    fn cuLibraryGetModule(&mut self, req: cuLibraryGetModule::Request) -> R<cuLibraryGetModule::Reply> {
        let lib = self.tables.get(Kind::Library, req.library.0)?;
        let (h, ctx) = self.current_ctx()?;
        let obj = self.backend.library_get_module(ctx, lib.obj)?;
        let m = self.tables.add(Kind::Module, Entry { obj, ctx: h, owner: Owner::Library(req.library.0) });
        Ok(cuLibraryGetModule::Reply { pMod: gpuplex_protocol::Module(m) })
    }

    fn LibraryGetGlobal(&mut self, req: LibraryGetGlobal::Request) -> R<LibraryGetGlobal::Reply> {
        let lib = self.tables.get(Kind::Library, req.library.0)?;
        let (h, ctx) = self.current_ctx()?;
        let global = self.backend.library_get_global(ctx, lib.obj, &req.name)?;
        let (dptr, bytes) = self.add_global(h, Owner::Library(req.library.0), global);
        Ok(LibraryGetGlobal::Reply { dptr, bytes })
    }

    fn cuLibraryGetKernelCount(&mut self, req: cuLibraryGetKernelCount::Request) -> R<cuLibraryGetKernelCount::Reply> {
        let lib = self.tables.get(Kind::Library, req.lib.0)?;
        Ok(cuLibraryGetKernelCount::Reply { count: self.backend.library_kernel_count(lib.obj)? })
    }

    fn cuKernelGetFunction(&mut self, req: cuKernelGetFunction::Request) -> R<cuKernelGetFunction::Reply> {
        let kernel = self.kernel(req.kernel.0)?;
        let (h, ctx) = self.current_ctx()?;
        let obj = self.backend.kernel_get_function(ctx, kernel)?;
        let f = self.tables.add(Kind::Func, Entry { obj, ctx: h, owner: Owner::Kernel(req.kernel.0) });
        Ok(cuKernelGetFunction::Reply { pFunc: Func(f) })
    }

    fn cuKernelGetLibrary(&mut self, req: cuKernelGetLibrary::Request) -> R<cuKernelGetLibrary::Reply> {
        match self.tables.get(Kind::Kernel, req.kernel.0)?.owner {
            Owner::Library(lib) => Ok(cuKernelGetLibrary::Reply { pLib: gpuplex_protocol::Library(lib) }),
            _ => Err(CallError::new(CuError::INVALID_HANDLE, "kernel has no library")),
        }
    }

    fn cuFuncGetModule(&mut self, req: cuFuncGetModule::Request) -> R<cuFuncGetModule::Reply> {
        match self.tables.get(Kind::Func, req.hfunc.0)?.owner {
            Owner::Module(m) => Ok(cuFuncGetModule::Reply { hmod: gpuplex_protocol::Module(m) }),
            _ => Err(CallError::new(CuError::NOT_FOUND, "function was not obtained from a module")),
        }
    }

    fn ParamLayout(&mut self, req: ParamLayout::Request) -> R<ParamLayout::Reply> {
        let (ctx, func) = self.func(req.func)?;
        let layout = self.backend.param_layout(ctx, func)?;
        self.param_bytes.insert(req.func.0, packed_size(&layout));
        const MAX_THREADS_PER_BLOCK: i32 = 0;
        const SHARED_SIZE_BYTES: i32 = 1;
        Ok(ParamLayout::Reply {
            offsets: Seq(layout.iter().map(|p| p.offset).collect()),
            sizes: Seq(layout.iter().map(|p| p.size).collect()),
            maxThreads: self.backend.func_get_attribute(ctx, func, MAX_THREADS_PER_BLOCK)?,
            staticShared: self.backend.func_get_attribute(ctx, func, SHARED_SIZE_BYTES)?,
        })
    }

    fn cuFuncGetAttribute(&mut self, req: cuFuncGetAttribute::Request) -> R<cuFuncGetAttribute::Reply> {
        let (ctx, func) = self.func(req.hfunc)?;
        Ok(cuFuncGetAttribute::Reply { pi: self.backend.func_get_attribute(ctx, func, req.attrib)? })
    }

    fn cuFuncSetAttribute(&mut self, req: cuFuncSetAttribute::Request) -> R<cuFuncSetAttribute::Reply> {
        let (ctx, func) = self.func(req.hfunc)?;
        self.backend.func_set_attribute(ctx, func, req.attrib, req.value)?;
        Ok(cuFuncSetAttribute::Reply {})
    }

    fn cuFuncSetCacheConfig(&mut self, req: cuFuncSetCacheConfig::Request) -> R<cuFuncSetCacheConfig::Reply> {
        let (ctx, func) = self.func(req.hfunc)?;
        self.backend.func_set_cache_config(ctx, func, req.config)?;
        Ok(cuFuncSetCacheConfig::Reply {})
    }

    fn cuKernelGetAttribute(&mut self, req: cuKernelGetAttribute::Request) -> R<cuKernelGetAttribute::Reply> {
        let kernel = self.kernel(req.kernel.0)?;
        let dev = self.backend_device(req.dev)?;
        Ok(cuKernelGetAttribute::Reply { pi: self.backend.kernel_get_attribute(kernel, req.attrib, dev)? })
    }

    fn cuKernelSetAttribute(&mut self, req: cuKernelSetAttribute::Request) -> R<cuKernelSetAttribute::Reply> {
        let kernel = self.kernel(req.kernel.0)?;
        let dev = self.backend_device(req.dev)?;
        self.backend.kernel_set_attribute(kernel, req.attrib, req.val, dev)?;
        Ok(cuKernelSetAttribute::Reply {})
    }

    fn cuKernelSetCacheConfig(&mut self, req: cuKernelSetCacheConfig::Request) -> R<cuKernelSetCacheConfig::Reply> {
        let kernel = self.kernel(req.kernel.0)?;
        let dev = self.backend_device(req.dev)?;
        self.backend.kernel_set_cache_config(kernel, req.config, dev)?;
        Ok(cuKernelSetCacheConfig::Reply {})
    }

    fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
        &mut self,
        req: cuOccupancyMaxActiveBlocksPerMultiprocessor::Request,
    ) -> R<cuOccupancyMaxActiveBlocksPerMultiprocessor::Reply> {
        let (ctx, func) = self.func(req.func)?;
        let n = self.backend.occupancy_max_active_blocks(ctx, func, req.blockSize, req.dynamicSMemSize, 0)?;
        Ok(cuOccupancyMaxActiveBlocksPerMultiprocessor::Reply { numBlocks: n })
    }

    fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
        &mut self,
        req: cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags::Request,
    ) -> R<cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags::Reply> {
        let (ctx, func) = self.func(req.func)?;
        let n = self.backend.occupancy_max_active_blocks(ctx, func, req.blockSize, req.dynamicSMemSize, req.flags)?;
        Ok(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags::Reply { numBlocks: n })
    }

    fn cuOccupancyAvailableDynamicSMemPerBlock(
        &mut self,
        req: cuOccupancyAvailableDynamicSMemPerBlock::Request,
    ) -> R<cuOccupancyAvailableDynamicSMemPerBlock::Reply> {
        let (ctx, func) = self.func(req.func)?;
        let size = self.backend.occupancy_available_smem(ctx, func, req.numBlocks, req.blockSize)?;
        Ok(cuOccupancyAvailableDynamicSMemPerBlock::Reply { dynamicSmemSize: size })
    }

    fn OccupancyMaxPotentialBlockSize(
        &mut self,
        req: OccupancyMaxPotentialBlockSize::Request,
    ) -> R<OccupancyMaxPotentialBlockSize::Reply> {
        let (ctx, func) = self.func(req.func)?;
        let (min_grid, block) = self.backend.occupancy_max_potential_block_size(
            ctx,
            func,
            req.dynamicSMemSize,
            req.blockSizeLimit,
            req.flags,
        )?;
        Ok(OccupancyMaxPotentialBlockSize::Reply { minGridSize: min_grid, blockSize: block })
    }

    fn Launch(&mut self, req: Launch::Request) -> R<Launch::Reply> {
        let (_, ctx) = self.current_ctx()?;
        let (_, func) = self.kernel_with(req.func, &req.params)?;
        let dims = [req.gridX, req.gridY, req.gridZ, req.blockX, req.blockY, req.blockZ];
        let launch = self.launch_config(dims, req.sharedMem, req.stream, &req.attrs)?;
        let ready = ReadyLaunch { ctx, func, launch, params: req.params };
        if self.posting {
            self.launcher.push(ready);
        } else {
            ready.run(&*self.backend, &self.seat)?;
        }
        Ok(Launch::Reply {})
    }

    fn OccupancyClusters(&mut self, req: OccupancyClusters::Request) -> R<OccupancyClusters::Reply> {
        let query = match req.query {
            0 => backend::ClusterQuery::MaxActiveClusters,
            1 => backend::ClusterQuery::MaxPotentialClusterSize,
            q => return Err(invalid(format!("unknown cluster query {q}"))),
        };
        let (_, ctx) = self.current_ctx()?;
        let (_, func) = self.func(req.func)?;
        let dims = [req.gridX, req.gridY, req.gridZ, req.blockX, req.blockY, req.blockZ];
        let launch = self.launch_config(dims, req.sharedMem, req.stream, &req.attrs)?;
        Ok(OccupancyClusters::Reply { value: self.backend.occupancy_clusters(ctx, func, &launch, query)? })
    }

    fn cuStreamCreate(&mut self, req: cuStreamCreate::Request) -> R<cuStreamCreate::Reply> {
        let (h, ctx) = self.current_ctx()?;
        let obj = self.backend.stream_create(ctx, req.flags, 0)?;
        self.seat.stream(ctx, obj);
        Ok(cuStreamCreate::Reply {
            phStream: Stream(self.tables.add(Kind::Stream, Entry { obj, ctx: h, owner: Owner::Ctx(h) })),
        })
    }

    fn cuStreamCreateWithPriority(
        &mut self,
        req: cuStreamCreateWithPriority::Request,
    ) -> R<cuStreamCreateWithPriority::Reply> {
        let (h, ctx) = self.current_ctx()?;
        let obj = self.backend.stream_create(ctx, req.flags, req.priority)?;
        self.seat.stream(ctx, obj);
        let s = self.tables.add(Kind::Stream, Entry { obj, ctx: h, owner: Owner::Ctx(h) });
        Ok(cuStreamCreateWithPriority::Reply { phStream: Stream(s) })
    }

    fn cuStreamDestroy_v2(&mut self, req: cuStreamDestroy_v2::Request) -> R<cuStreamDestroy_v2::Reply> {
        if req.hStream.is_default() {
            return Err(CallError::new(CuError::INVALID_HANDLE, "a default stream cannot be destroyed"));
        }
        let (ctx, stream) = self.stream(req.hStream)?;
        self.seat.stream_gone(ctx, stream);
        self.backend.stream_destroy(ctx, stream)?;
        self.capture_gone(|c| c == (ctx, stream));
        self.tables.remove(Kind::Stream, req.hStream.0)?;
        Ok(cuStreamDestroy_v2::Reply {})
    }

    fn cuStreamSynchronize(&mut self, req: cuStreamSynchronize::Request) -> R<cuStreamSynchronize::Reply> {
        let (ctx, stream) = self.stream(req.hStream)?;
        self.backend.stream_synchronize(ctx, stream)?;
        Ok(cuStreamSynchronize::Reply {})
    }

    fn cuStreamQuery(&mut self, req: cuStreamQuery::Request) -> R<cuStreamQuery::Reply> {
        let (ctx, stream) = self.stream(req.hStream)?;
        self.backend.stream_query(ctx, stream)?;
        Ok(cuStreamQuery::Reply {})
    }

    fn cuStreamWaitEvent(&mut self, req: cuStreamWaitEvent::Request) -> R<cuStreamWaitEvent::Reply> {
        let (ctx, stream) = self.stream(req.hStream)?;
        let (_, event) = self.event(req.hEvent)?;
        self.backend.stream_wait_event(ctx, stream, event, req.flags)?;
        Ok(cuStreamWaitEvent::Reply {})
    }

    fn cuStreamIsCapturing(&mut self, req: cuStreamIsCapturing::Request) -> R<cuStreamIsCapturing::Reply> {
        let (ctx, stream) = self.stream(req.hStream)?;
        Ok(cuStreamIsCapturing::Reply { captureStatus: self.backend.stream_capture_status(ctx, stream)? })
    }

    fn cuStreamGetId(&mut self, req: cuStreamGetId::Request) -> R<cuStreamGetId::Reply> {
        let (ctx, stream) = self.stream(req.hStream)?;
        Ok(cuStreamGetId::Reply { streamId: self.backend.stream_id(ctx, stream)? })
    }

    fn cuStreamGetCtx(&mut self, req: cuStreamGetCtx::Request) -> R<cuStreamGetCtx::Reply> {
        let h = if req.hStream.is_default() {
            self.current_ctx()?.0
        } else {
            self.tables.get(Kind::Stream, req.hStream.0)?.ctx
        };
        Ok(cuStreamGetCtx::Reply { pctx: Ctx(h) })
    }

    fn cuStreamGetDevice(&mut self, req: cuStreamGetDevice::Request) -> R<cuStreamGetDevice::Reply> {
        let h = self.cuStreamGetCtx(cuStreamGetCtx::Request { hStream: req.hStream })?.pctx.0;
        Ok(cuStreamGetDevice::Reply { device: self.tables.ctx(h)?.device })
    }

    fn cuEventCreate(&mut self, req: cuEventCreate::Request) -> R<cuEventCreate::Reply> {
        let (h, ctx) = self.current_ctx()?;
        let obj = self.backend.event_create(ctx, req.flags)?;
        Ok(cuEventCreate::Reply {
            phEvent: Event(self.tables.add(Kind::Event, Entry { obj, ctx: h, owner: Owner::Ctx(h) })),
        })
    }

    fn cuEventDestroy_v2(&mut self, req: cuEventDestroy_v2::Request) -> R<cuEventDestroy_v2::Reply> {
        let (ctx, event) = self.event(req.hEvent)?;
        self.backend.event_destroy(ctx, event)?;
        self.tables.remove(Kind::Event, req.hEvent.0)?;
        Ok(cuEventDestroy_v2::Reply {})
    }

    fn cuEventRecord(&mut self, req: cuEventRecord::Request) -> R<cuEventRecord::Reply> {
        let (ctx, event) = self.event(req.hEvent)?;
        let (_, stream) = self.stream(req.hStream)?;
        self.backend.event_record(ctx, event, stream, 0)?;
        Ok(cuEventRecord::Reply {})
    }

    fn cuEventRecordWithFlags(&mut self, req: cuEventRecordWithFlags::Request) -> R<cuEventRecordWithFlags::Reply> {
        let (ctx, event) = self.event(req.hEvent)?;
        let (_, stream) = self.stream(req.hStream)?;
        self.backend.event_record(ctx, event, stream, req.flags)?;
        Ok(cuEventRecordWithFlags::Reply {})
    }

    fn cuEventSynchronize(&mut self, req: cuEventSynchronize::Request) -> R<cuEventSynchronize::Reply> {
        let (ctx, event) = self.event(req.hEvent)?;
        self.backend.event_synchronize(ctx, event)?;
        Ok(cuEventSynchronize::Reply {})
    }

    fn cuEventQuery(&mut self, req: cuEventQuery::Request) -> R<cuEventQuery::Reply> {
        let (ctx, event) = self.event(req.hEvent)?;
        self.backend.event_query(ctx, event)?;
        Ok(cuEventQuery::Reply {})
    }

    fn cuEventElapsedTime_v2(&mut self, req: cuEventElapsedTime_v2::Request) -> R<cuEventElapsedTime_v2::Reply> {
        let (ctx, start) = self.event(req.hStart)?;
        let (_, end) = self.event(req.hEnd)?;
        Ok(cuEventElapsedTime_v2::Reply { pMilliseconds: self.backend.event_elapsed(ctx, start, end)? })
    }
}
