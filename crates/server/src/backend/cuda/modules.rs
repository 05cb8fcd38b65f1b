//! The backend's modules, libraries, functions and kernels, and their launches.

use std::ffi::{c_int, c_uint, CStr};
use std::ptr::null_mut;

use cudarc::driver::sys;
use gpuplex_protocol::{CallError, CuError};

use super::{
    api, c_name, check, enter, global, handle, launch_config, link, obj, query, raw, size, tensor_maps, with_packed,
    Cuda, Image, MAX_PARAMS,
};
use crate::backend::{BResult, ClusterQuery, Launch, Linked, Modules, Obj, ParamSlot, TensorMap, TensorMapBytes};

impl Modules for Cuda {
    fn module_load(&self, ctx: Obj, image: &[u8]) -> BResult<Obj> {
        enter(ctx)?;
        let image = Image::new(image)?;
        // SAFETY: out-pointer to a local; `Image` checked the binary's
        // framing against its length, or NUL-terminated the text.
        handle(|m| unsafe { api::cuModuleLoadData(m, image.as_ptr()) })
    }

    fn module_unload(&self, ctx: Obj, module: Obj) -> BResult<()> {
        enter(ctx)?;
        // SAFETY: the module is live.
        check(unsafe { api::cuModuleUnload(raw(module)) })
    }

    fn module_get_function(&self, ctx: Obj, module: Obj, name: &str) -> BResult<Obj> {
        enter(ctx)?;
        let name = c_name(name)?;
        // SAFETY: out-pointer to a local; live module; NUL-terminated name.
        handle(|f| unsafe { api::cuModuleGetFunction(f, raw(module), name.as_ptr()) })
    }

    fn module_get_global(&self, ctx: Obj, module: Obj, name: &str) -> BResult<(u64, u64)> {
        enter(ctx)?;
        let name = c_name(name)?;
        // SAFETY: out-pointers to locals; live module; NUL-terminated name.
        global(|p, n| unsafe { api::cuModuleGetGlobal_v2(p, n, raw(module), name.as_ptr()) })
    }

    fn module_function_count(&self, ctx: Obj, module: Obj) -> BResult<u32> {
        enter(ctx)?;
        // SAFETY: out-pointer to a local; live module.
        query(|n| unsafe { api::cuModuleGetFunctionCount(n, raw(module)) })
    }

    fn module_functions(&self, ctx: Obj, module: Obj) -> BResult<Vec<Obj>> {
        enter(ctx)?;
        // SAFETY: out-pointer to a local; live module.
        let count: c_uint = query(|n| unsafe { api::cuModuleGetFunctionCount(n, raw(module)) })?;
        let mut funcs: Vec<sys::CUfunction> = vec![null_mut(); count as usize];
        // SAFETY: `funcs` has room for `count` handles; live module.
        check(unsafe { api::cuModuleEnumerateFunctions(funcs.as_mut_ptr(), count, raw(module)) })?;
        Ok(funcs.into_iter().map(obj).collect())
    }

    fn module_loading_mode(&self) -> BResult<i32> {
        // SAFETY: out-pointer to a local `int`.
        query(|m| unsafe { api::cuModuleGetLoadingMode(m) })
    }

    fn library_load(&self, image: &[u8]) -> BResult<Obj> {
        let image = Image::new(image)?;
        // SAFETY: out-pointer to a local; the image as for modules; no
        // options (NULL arrays, zero counts).
        handle(|l| unsafe {
            api::cuLibraryLoadData(l, image.as_ptr(), null_mut(), null_mut(), 0, null_mut(), null_mut(), 0)
        })
    }

    fn library_unload(&self, library: Obj) -> BResult<()> {
        // SAFETY: the library is live.
        check(unsafe { api::cuLibraryUnload(raw(library)) })
    }

    fn library_get_kernel(&self, library: Obj, name: &str) -> BResult<Obj> {
        let name = c_name(name)?;
        // SAFETY: out-pointer to a local; live library; NUL-terminated name.
        handle(|k| unsafe { api::cuLibraryGetKernel(k, raw(library), name.as_ptr()) })
    }

    fn library_get_module(&self, ctx: Obj, library: Obj) -> BResult<Obj> {
        enter(ctx)?;
        // SAFETY: out-pointer to a local; live library.
        handle(|m| unsafe { api::cuLibraryGetModule(m, raw(library)) })
    }

    fn library_get_global(&self, ctx: Obj, library: Obj, name: &str) -> BResult<(u64, u64)> {
        enter(ctx)?;
        let name = c_name(name)?;
        // SAFETY: out-pointers to locals; live library; NUL-terminated name.
        global(|p, n| unsafe { api::cuLibraryGetGlobal(p, n, raw(library), name.as_ptr()) })
    }

    fn library_kernel_count(&self, library: Obj) -> BResult<u32> {
        // SAFETY: out-pointer to a local; live library.
        query(|n| unsafe { api::cuLibraryGetKernelCount(n, raw(library)) })
    }

    fn kernel_get_function(&self, ctx: Obj, kernel: Obj) -> BResult<Obj> {
        enter(ctx)?;
        // SAFETY: out-pointer to a local; live kernel.
        handle(|f| unsafe { api::cuKernelGetFunction(f, raw(kernel)) })
    }

    fn func_name(&self, ctx: Obj, func: Obj) -> BResult<String> {
        enter(ctx)?;
        let mut name = std::ptr::null();
        // SAFETY: a live function; out-pointer to a local. The driver's
        // string lives as long as the module, and is copied at once.
        check(unsafe { api::cuFuncGetName(&mut name, raw(func)) })?;
        if name.is_null() {
            return Err(CuError::NOT_FOUND.into());
        }
        // SAFETY: a NUL-terminated string of the driver's, per its contract.
        Ok(unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned())
    }

    fn param_layout(&self, ctx: Obj, func: Obj) -> BResult<Vec<ParamSlot>> {
        enter(ctx)?;
        let mut slots = Vec::new();
        for index in 0..=MAX_PARAMS {
            let (mut offset, mut bytes) = (0usize, 0usize);
            // SAFETY: out-pointers to locals; live function.
            let r = check(unsafe { api::cuFuncGetParamInfo(raw(func), index, &mut offset, &mut bytes) });
            match r {
                Ok(()) => {}
                // The driver's way of saying there are no more.
                Err(e) if e.code == CuError::INVALID_VALUE => return Ok(slots),
                Err(e) => return Err(e),
            }
            let (Ok(offset), Ok(size)) = (u32::try_from(offset), u32::try_from(bytes)) else {
                return Err(CallError::new(CuError::INVALID_VALUE, "parameter beyond 4 GiB"));
            };
            slots.push(ParamSlot { offset, size });
        }
        Err(CallError::new(CuError::NOT_SUPPORTED, format!("more than {MAX_PARAMS} kernel parameters")))
    }

    fn func_get_attribute(&self, ctx: Obj, func: Obj, attr: i32) -> BResult<i32> {
        enter(ctx)?;
        // SAFETY: out-pointer to a local; live function; the attribute is a
        // plain integer, which the driver validates.
        query(|v| unsafe { api::cuFuncGetAttribute(v, attr, raw(func)) })
    }

    fn func_set_attribute(&self, ctx: Obj, func: Obj, attr: i32, value: i32) -> BResult<()> {
        enter(ctx)?;
        // SAFETY: live function; plain values, which the driver validates.
        check(unsafe { api::cuFuncSetAttribute(raw(func), attr, value) })
    }

    fn func_set_cache_config(&self, ctx: Obj, func: Obj, config: i32) -> BResult<()> {
        enter(ctx)?;
        // SAFETY: live function; plain value, which the driver validates.
        check(unsafe { api::cuFuncSetCacheConfig(raw(func), config) })
    }

    fn kernel_get_attribute(&self, kernel: Obj, attr: i32, dev: i32) -> BResult<i32> {
        // SAFETY: out-pointer to a local; live kernel; plain integers, which
        // the driver validates.
        query(|v| unsafe { api::cuKernelGetAttribute(v, attr, raw(kernel), dev) })
    }

    fn kernel_set_attribute(&self, kernel: Obj, attr: i32, value: i32, dev: i32) -> BResult<()> {
        // SAFETY: live kernel; plain integers, which the driver validates.
        check(unsafe { api::cuKernelSetAttribute(attr, value, raw(kernel), dev) })
    }

    fn kernel_set_cache_config(&self, kernel: Obj, config: i32, dev: i32) -> BResult<()> {
        // SAFETY: live kernel; plain integers, which the driver validates.
        check(unsafe { api::cuKernelSetCacheConfig(raw(kernel), config, dev) })
    }

    fn occupancy_max_active_blocks(&self, ctx: Obj, func: Obj, block: i32, smem: u64, flags: u32) -> BResult<i32> {
        enter(ctx)?;
        let smem = size(smem)?;
        // SAFETY: out-pointer to a local; live function; plain values.
        query(|n| unsafe {
            api::cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(n, raw(func), block, smem, flags)
        })
    }

    fn occupancy_available_smem(&self, ctx: Obj, func: Obj, blocks: i32, block: i32) -> BResult<u64> {
        enter(ctx)?;
        // SAFETY: out-pointer to a local; live function; plain values.
        query(|n| unsafe { api::cuOccupancyAvailableDynamicSMemPerBlock(n, raw(func), blocks, block) })
            .map(|n: usize| n as u64)
    }

    fn occupancy_max_potential_block_size(
        &self,
        ctx: Obj,
        func: Obj,
        smem: u64,
        limit: i32,
        flags: u32,
    ) -> BResult<(i32, i32)> {
        enter(ctx)?;
        let smem = size(smem)?;
        let (mut min_grid, mut block) = (0, 0);
        // SAFETY: out-pointers to locals; live function; no per-block
        // shared-memory callback; plain values.
        check(unsafe {
            api::cuOccupancyMaxPotentialBlockSizeWithFlags(
                &mut min_grid,
                &mut block,
                raw(func),
                None,
                smem,
                limit,
                flags,
            )
        })?;
        Ok((min_grid, block))
    }

    /// `params` must be exactly the layout's bytes: driver 580 refuses a
    /// longer buffer (`CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`) but launches with
    /// a shorter one, leaving the rest of the parameters undefined.
    fn occupancy_clusters(&self, ctx: Obj, func: Obj, launch: &Launch, query: ClusterQuery) -> BResult<i32> {
        enter(ctx)?;
        let mut attrs = Vec::new();
        let config = launch_config(launch, &mut attrs)?;
        let mut n: c_int = 0;
        // SAFETY: out-pointer to a local; `config` and its attributes outlive
        // the call; live function; the stream is live or special.
        check(unsafe {
            match query {
                ClusterQuery::MaxActiveClusters => api::cuOccupancyMaxActiveClusters(&mut n, raw(func), &config),
                ClusterQuery::MaxPotentialClusterSize => {
                    api::cuOccupancyMaxPotentialClusterSize(&mut n, raw(func), &config)
                }
            }
        })?;
        Ok(n)
    }

    fn launch(&self, ctx: Obj, func: Obj, launch: &Launch, params: &[u8]) -> BResult<()> {
        enter(ctx)?;
        let mut attrs = Vec::new();
        let config = launch_config(launch, &mut attrs)?;
        // SAFETY: `config` and the attributes it points to outlive the call,
        // and `with_packed` keeps `extra` valid across it; the call copies
        // the parameters before returning and only reads them; live
        // function; the stream is live or special; the session checked the
        // attributes carry no handles.
        check(with_packed(params, |extra| unsafe {
            if launch.attrs.is_empty() {
                // The plain entry point: the driver's fastest path.
                let [gx, gy, gz] = launch.grid;
                let [bx, by, bz] = launch.block;
                let (smem, stream) = (launch.shared_mem, raw(launch.stream));
                api::cuLaunchKernel(raw(func), gx, gy, gz, bx, by, bz, smem, stream, null_mut(), extra)
            } else {
                api::cuLaunchKernelEx(&config, raw(func), null_mut(), extra)
            }
        }))
    }

    fn tensor_map_encode(&self, map: &TensorMap) -> BResult<TensorMapBytes> {
        tensor_maps::encode(map)
    }

    fn tensor_map_replace_address(&self, map: &TensorMapBytes, address: u64) -> BResult<TensorMapBytes> {
        tensor_maps::replace_address(map, address)
    }

    fn link(&self, ctx: Obj, options: &[(u32, u64)], inputs: &[(u32, &[u8])]) -> BResult<Linked> {
        link::link(ctx, options, inputs)
    }
}
