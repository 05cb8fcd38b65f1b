//! The session's side of modules, libraries, functions and launches:
//! images charged by what they take on the device, functions' parameter
//! buffers checked against their layouts.

use gpuplex_protocol::{
    calls, CallError, CuError, DevPtr, Func, FunctionsCalls, LaunchesCalls, Library, ModulesCalls, Seq,
};

use super::launcher::ReadyLaunch;
use super::managed::{NewPages, Reach};
use super::resolve::packed_size;
use super::tables::{Entry, Kind, Owner, Region};
use super::{invalid, Session};
use crate::backend;

type R<T> = Result<T, CallError>;

#[allow(non_snake_case)]
impl ModulesCalls for Session {
    fn LibraryGetManaged(&mut self, req: calls::LibraryGetManaged::Request) -> R<calls::LibraryGetManaged::Reply> {
        if self.shared.heap().is_some() {
            return Err(invalid("a VM guest's managed variables are mirrored in its heap (LibraryGetManagedInPlace)"));
        }
        let (dptr, bytes, new) = self.mirror_managed(req.library, &req.name)?;
        let (mirror, mirrorLen) = match new {
            Some(NewPages { at, len, reach: Reach::Descriptor(fd) }) => {
                self.fd_after_reply = Some(fd);
                (at, len)
            }
            _ => (0, 0),
        };
        Ok(calls::LibraryGetManaged::Reply { dptr, bytes, mirror, mirrorLen })
    }

    fn LibraryGetManagedInPlace(
        &mut self,
        req: calls::LibraryGetManagedInPlace::Request,
    ) -> R<calls::LibraryGetManagedInPlace::Reply> {
        if self.shared.heap().is_none() {
            return Err(CallError::new(CuError::NOT_SUPPORTED, "only a VM guest's memory is shared in place"));
        }
        let (dptr, bytes, new) = self.mirror_managed(req.library, &req.name)?;
        let (mirror, mirrorLen, offset) = match new {
            Some(NewPages { at, len, reach: Reach::Heap(offset) }) => (at, len, offset as u64),
            _ => (0, 0, 0),
        };
        Ok(calls::LibraryGetManagedInPlace::Reply { dptr, bytes, mirror, mirrorLen, offset })
    }

    fn LibraryManagedValue(
        &mut self,
        req: calls::LibraryManagedValue::Request,
    ) -> R<calls::LibraryManagedValue::Reply> {
        let lib = self.tables.get(Kind::Library, req.library.0)?;
        let (ptr, size) = self.backend.library_get_managed(lib.obj, &req.name)?;
        if size > gpuplex_protocol::MAX_PAYLOAD as u64 / 2 {
            return Err(CallError::new(CuError::NOT_SUPPORTED, "a __managed__ variable larger than a frame"));
        }
        let mut value = vec![0u8; size as usize];
        // SAFETY: the variable the backend just named, whole.
        unsafe { self.backend.managed_read(ptr, &mut value) }?;
        Ok(calls::LibraryManagedValue::Reply { value })
    }

    fn ModuleLoad(&mut self, req: calls::ModuleLoad::Request) -> R<calls::ModuleLoad::Reply> {
        let (h, ctx) = self.current_ctx()?;
        let image = self.images.resolve(req.digest, req.image)?;
        let footprint = self.charge_image(req.digest, &image)?;
        let obj = self.backend.module_load(ctx, &image)?;
        let module = self.tables.add(Kind::Module, Entry { obj, ctx: h, owner: Owner::Ctx(h) });
        self.tables.set_footprint(module, footprint);
        Ok(calls::ModuleLoad::Reply { module: gpuplex_protocol::Module(module) })
    }

    fn cuModuleUnload(&mut self, req: calls::cuModuleUnload::Request) -> R<calls::cuModuleUnload::Reply> {
        let (ctx, entry) = self.module(req.hmod.0)?;
        if let Owner::Library(_) = entry.owner {
            return Err(CallError::new(CuError::NOT_PERMITTED, "a library's module is unloaded with its library"));
        }
        self.backend.module_unload(ctx, entry.obj)?;
        self.tables.remove(Kind::Module, req.hmod.0)?;
        Ok(calls::cuModuleUnload::Reply {})
    }

    fn cuModuleGetFunction(
        &mut self,
        req: calls::cuModuleGetFunction::Request,
    ) -> R<calls::cuModuleGetFunction::Reply> {
        let (ctx, entry) = self.module(req.hmod.0)?;
        let obj = self.backend.module_get_function(ctx, entry.obj, &req.name)?;
        let h = self.tables.add(Kind::Func, Entry { obj, ctx: entry.ctx, owner: Owner::Module(req.hmod.0) });
        Ok(calls::cuModuleGetFunction::Reply { hfunc: Func(h) })
    }

    fn ModuleGetGlobal(&mut self, req: calls::ModuleGetGlobal::Request) -> R<calls::ModuleGetGlobal::Reply> {
        let (ctx, entry) = self.module(req.hmod.0)?;
        let global = self.backend.module_get_global(ctx, entry.obj, &req.name)?;
        let (dptr, bytes) = self.add_global(entry.ctx, Owner::Module(req.hmod.0), global);
        Ok(calls::ModuleGetGlobal::Reply { dptr, bytes })
    }

    fn cuModuleGetLoadingMode(
        &mut self,
        _: calls::cuModuleGetLoadingMode::Request,
    ) -> R<calls::cuModuleGetLoadingMode::Reply> {
        Ok(calls::cuModuleGetLoadingMode::Reply { mode: self.backend.module_loading_mode()? })
    }

    fn cuModuleGetFunctionCount(
        &mut self,
        req: calls::cuModuleGetFunctionCount::Request,
    ) -> R<calls::cuModuleGetFunctionCount::Reply> {
        let (ctx, entry) = self.module(req.hmod.0)?;
        Ok(calls::cuModuleGetFunctionCount::Reply { count: self.backend.module_function_count(ctx, entry.obj)? })
    }

    fn Link(&mut self, req: calls::Link::Request) -> R<calls::Link::Reply> {
        self.link(req)
    }

    fn FuncName(&mut self, req: calls::FuncName::Request) -> R<calls::FuncName::Reply> {
        let (ctx, func) = self.func(req.func)?;
        Ok(calls::FuncName::Reply { name: self.backend.func_name(ctx, func)? })
    }

    fn ModuleFunctions(&mut self, req: calls::ModuleFunctions::Request) -> R<calls::ModuleFunctions::Reply> {
        let (ctx, entry) = self.module(req.hmod.0)?;
        let funcs = self.backend.module_functions(ctx, entry.obj)?;
        // The same handles cuModuleGetFunction issues for these functions.
        let funcs = funcs
            .into_iter()
            .map(|obj| self.tables.add(Kind::Func, Entry { obj, ctx: entry.ctx, owner: Owner::Module(req.hmod.0) }))
            .collect();
        Ok(calls::ModuleFunctions::Reply { funcs: Seq(funcs) })
    }

    fn LibraryLoad(&mut self, req: calls::LibraryLoad::Request) -> R<calls::LibraryLoad::Reply> {
        let image = self.images.resolve(req.digest, req.image)?;
        let footprint = self.charge_image(req.digest, &image)?;
        let obj = self.backend.library_load(&image)?;
        let h = self.tables.add(Kind::Library, Entry { obj, ctx: 0, owner: Owner::Ctx(0) });
        self.tables.set_footprint(h, footprint);
        Ok(calls::LibraryLoad::Reply { library: gpuplex_protocol::Library(h) })
    }

    fn cuLibraryUnload(&mut self, req: calls::cuLibraryUnload::Request) -> R<calls::cuLibraryUnload::Reply> {
        let entry = self.tables.get(Kind::Library, req.library.0)?;
        self.managed.unloaded(req.library.0);
        self.backend.library_unload(entry.obj)?;
        self.tables.remove(Kind::Library, req.library.0)?;
        Ok(calls::cuLibraryUnload::Reply {})
    }

    fn cuLibraryGetKernel(&mut self, req: calls::cuLibraryGetKernel::Request) -> R<calls::cuLibraryGetKernel::Reply> {
        let lib = self.tables.get(Kind::Library, req.library.0)?;
        let obj = self.backend.library_get_kernel(lib.obj, &req.name)?;
        let h = self.tables.add(Kind::Kernel, Entry { obj, ctx: 0, owner: Owner::Library(req.library.0) });
        Ok(calls::cuLibraryGetKernel::Reply { pKernel: gpuplex_protocol::Kernel(h) })
    }

    fn cuLibraryGetModule(&mut self, req: calls::cuLibraryGetModule::Request) -> R<calls::cuLibraryGetModule::Reply> {
        let lib = self.tables.get(Kind::Library, req.library.0)?;
        let (h, ctx) = self.current_ctx()?;
        let obj = self.backend.library_get_module(ctx, lib.obj)?;
        let m = self.tables.add(Kind::Module, Entry { obj, ctx: h, owner: Owner::Library(req.library.0) });
        Ok(calls::cuLibraryGetModule::Reply { pMod: gpuplex_protocol::Module(m) })
    }

    fn LibraryGetGlobal(&mut self, req: calls::LibraryGetGlobal::Request) -> R<calls::LibraryGetGlobal::Reply> {
        let lib = self.tables.get(Kind::Library, req.library.0)?;
        let (h, ctx) = self.current_ctx()?;
        let global = self.backend.library_get_global(ctx, lib.obj, &req.name)?;
        let (dptr, bytes) = self.add_global(h, Owner::Library(req.library.0), global);
        Ok(calls::LibraryGetGlobal::Reply { dptr, bytes })
    }

    fn cuLibraryGetKernelCount(
        &mut self,
        req: calls::cuLibraryGetKernelCount::Request,
    ) -> R<calls::cuLibraryGetKernelCount::Reply> {
        let lib = self.tables.get(Kind::Library, req.lib.0)?;
        Ok(calls::cuLibraryGetKernelCount::Reply { count: self.backend.library_kernel_count(lib.obj)? })
    }

    fn cuKernelGetFunction(
        &mut self,
        req: calls::cuKernelGetFunction::Request,
    ) -> R<calls::cuKernelGetFunction::Reply> {
        let kernel = self.kernel(req.kernel.0)?;
        let (h, ctx) = self.current_ctx()?;
        let obj = self.backend.kernel_get_function(ctx, kernel)?;
        let f = self.tables.add(Kind::Func, Entry { obj, ctx: h, owner: Owner::Kernel(req.kernel.0) });
        Ok(calls::cuKernelGetFunction::Reply { pFunc: Func(f) })
    }

    fn cuKernelGetLibrary(&mut self, req: calls::cuKernelGetLibrary::Request) -> R<calls::cuKernelGetLibrary::Reply> {
        match self.tables.get(Kind::Kernel, req.kernel.0)?.owner {
            Owner::Library(lib) => Ok(calls::cuKernelGetLibrary::Reply { pLib: gpuplex_protocol::Library(lib) }),
            _ => Err(CallError::new(CuError::INVALID_HANDLE, "kernel has no library")),
        }
    }

    fn cuFuncGetModule(&mut self, req: calls::cuFuncGetModule::Request) -> R<calls::cuFuncGetModule::Reply> {
        match self.tables.get(Kind::Func, req.hfunc.0)?.owner {
            Owner::Module(m) => Ok(calls::cuFuncGetModule::Reply { hmod: gpuplex_protocol::Module(m) }),
            _ => Err(CallError::new(CuError::NOT_FOUND, "function was not obtained from a module")),
        }
    }
}

#[allow(non_snake_case)]
impl FunctionsCalls for Session {
    fn ParamLayout(&mut self, req: calls::ParamLayout::Request) -> R<calls::ParamLayout::Reply> {
        let (ctx, func) = self.func(req.func)?;
        let layout = self.backend.param_layout(ctx, func)?;
        self.param_bytes.insert(req.func.0, packed_size(&layout));
        const MAX_THREADS_PER_BLOCK: i32 = 0;
        const SHARED_SIZE_BYTES: i32 = 1;
        Ok(calls::ParamLayout::Reply {
            offsets: Seq(layout.iter().map(|p| p.offset).collect()),
            sizes: Seq(layout.iter().map(|p| p.size).collect()),
            maxThreads: self.backend.func_get_attribute(ctx, func, MAX_THREADS_PER_BLOCK)?,
            staticShared: self.backend.func_get_attribute(ctx, func, SHARED_SIZE_BYTES)?,
        })
    }

    fn cuFuncGetAttribute(&mut self, req: calls::cuFuncGetAttribute::Request) -> R<calls::cuFuncGetAttribute::Reply> {
        let (ctx, func) = self.func(req.hfunc)?;
        Ok(calls::cuFuncGetAttribute::Reply { pi: self.backend.func_get_attribute(ctx, func, req.attrib)? })
    }

    fn cuFuncSetAttribute(&mut self, req: calls::cuFuncSetAttribute::Request) -> R<calls::cuFuncSetAttribute::Reply> {
        let (ctx, func) = self.func(req.hfunc)?;
        self.backend.func_set_attribute(ctx, func, req.attrib, req.value)?;
        Ok(calls::cuFuncSetAttribute::Reply {})
    }

    fn cuFuncSetCacheConfig(
        &mut self,
        req: calls::cuFuncSetCacheConfig::Request,
    ) -> R<calls::cuFuncSetCacheConfig::Reply> {
        let (ctx, func) = self.func(req.hfunc)?;
        self.backend.func_set_cache_config(ctx, func, req.config)?;
        Ok(calls::cuFuncSetCacheConfig::Reply {})
    }

    fn cuKernelGetAttribute(
        &mut self,
        req: calls::cuKernelGetAttribute::Request,
    ) -> R<calls::cuKernelGetAttribute::Reply> {
        let kernel = self.kernel(req.kernel.0)?;
        let dev = self.backend_device(req.dev)?;
        Ok(calls::cuKernelGetAttribute::Reply { pi: self.backend.kernel_get_attribute(kernel, req.attrib, dev)? })
    }

    fn cuKernelSetAttribute(
        &mut self,
        req: calls::cuKernelSetAttribute::Request,
    ) -> R<calls::cuKernelSetAttribute::Reply> {
        let kernel = self.kernel(req.kernel.0)?;
        let dev = self.backend_device(req.dev)?;
        self.backend.kernel_set_attribute(kernel, req.attrib, req.val, dev)?;
        Ok(calls::cuKernelSetAttribute::Reply {})
    }

    fn cuKernelSetCacheConfig(
        &mut self,
        req: calls::cuKernelSetCacheConfig::Request,
    ) -> R<calls::cuKernelSetCacheConfig::Reply> {
        let kernel = self.kernel(req.kernel.0)?;
        let dev = self.backend_device(req.dev)?;
        self.backend.kernel_set_cache_config(kernel, req.config, dev)?;
        Ok(calls::cuKernelSetCacheConfig::Reply {})
    }

    fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
        &mut self,
        req: calls::cuOccupancyMaxActiveBlocksPerMultiprocessor::Request,
    ) -> R<calls::cuOccupancyMaxActiveBlocksPerMultiprocessor::Reply> {
        let (ctx, func) = self.func(req.func)?;
        let n = self.backend.occupancy_max_active_blocks(ctx, func, req.blockSize, req.dynamicSMemSize, 0)?;
        Ok(calls::cuOccupancyMaxActiveBlocksPerMultiprocessor::Reply { numBlocks: n })
    }

    fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
        &mut self,
        req: calls::cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags::Request,
    ) -> R<calls::cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags::Reply> {
        let (ctx, func) = self.func(req.func)?;
        let n = self.backend.occupancy_max_active_blocks(ctx, func, req.blockSize, req.dynamicSMemSize, req.flags)?;
        Ok(calls::cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags::Reply { numBlocks: n })
    }

    fn cuOccupancyAvailableDynamicSMemPerBlock(
        &mut self,
        req: calls::cuOccupancyAvailableDynamicSMemPerBlock::Request,
    ) -> R<calls::cuOccupancyAvailableDynamicSMemPerBlock::Reply> {
        let (ctx, func) = self.func(req.func)?;
        let size = self.backend.occupancy_available_smem(ctx, func, req.numBlocks, req.blockSize)?;
        Ok(calls::cuOccupancyAvailableDynamicSMemPerBlock::Reply { dynamicSmemSize: size })
    }

    fn OccupancyMaxPotentialBlockSize(
        &mut self,
        req: calls::OccupancyMaxPotentialBlockSize::Request,
    ) -> R<calls::OccupancyMaxPotentialBlockSize::Reply> {
        let (ctx, func) = self.func(req.func)?;
        let (min_grid, block) = self.backend.occupancy_max_potential_block_size(
            ctx,
            func,
            req.dynamicSMemSize,
            req.blockSizeLimit,
            req.flags,
        )?;
        Ok(calls::OccupancyMaxPotentialBlockSize::Reply { minGridSize: min_grid, blockSize: block })
    }

    fn OccupancyClusters(&mut self, req: calls::OccupancyClusters::Request) -> R<calls::OccupancyClusters::Reply> {
        let query = match req.query {
            0 => backend::ClusterQuery::MaxActiveClusters,
            1 => backend::ClusterQuery::MaxPotentialClusterSize,
            q => return Err(invalid(format!("unknown cluster query {q}"))),
        };
        let (_, ctx) = self.current_ctx()?;
        let (_, func) = self.func(req.func)?;
        let dims = [req.gridX, req.gridY, req.gridZ, req.blockX, req.blockY, req.blockZ];
        let launch = self.launch_config(dims, req.sharedMem, req.stream, &req.attrs)?;
        Ok(calls::OccupancyClusters::Reply { value: self.backend.occupancy_clusters(ctx, func, &launch, query)? })
    }
}

#[allow(non_snake_case)]
impl LaunchesCalls for Session {
    fn Launch(&mut self, req: calls::Launch::Request) -> R<calls::Launch::Reply> {
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
        Ok(calls::Launch::Reply {})
    }
}

impl Session {
    /// Mirrors the managed variable `name` of `library` (see `managed.rs`):
    /// its address and size, and the pages new to the guest.
    fn mirror_managed(&mut self, library: Library, name: &str) -> R<(DevPtr, u64, Option<NewPages>)> {
        if !self.shared.connected() {
            return Err(CallError::new(CuError::NOT_SUPPORTED, "managed variables are mirrored in shared memory only"));
        }
        let lib = self.tables.get(Kind::Library, library.0)?;
        let (ptr, size) = self.backend.library_get_managed(lib.obj, name)?;
        let new = self.managed.add(&*self.backend, library.0, ptr, size, self.shared.heap())?;
        // Copies and launches in any context may name it.
        self.tables.add_region(ptr, Region { size, ctx: 0, owner: Some(Owner::Library(library.0)) });
        Ok((DevPtr(ptr), size, new))
    }
}
