//! The backend's modules, libraries, functions and kernels, and their launches.

use std::collections::HashMap;
use std::sync::Arc;

use gpuplex_protocol::{CuError, LINK_INPUT_CUBIN, LINK_INPUT_FATBIN, LINK_INPUT_PTX};

use super::{
    check_occupancy_flags, device, err, occupancy, tensor_maps, Emulated, Function, KernelRef, Library, Owner, Work,
};
use crate::backend::{BResult, ClusterQuery, Launch, Linked, Modules, Obj, ParamSlot, TensorMap, TensorMapBytes};
use crate::image;

impl Modules for Emulated {
    fn module_load(&self, ctx: Obj, image: &[u8]) -> BResult<Obj> {
        let parsed = image::parse(image).map_err(|e| err(CuError::INVALID_IMAGE, e.to_string()))?;
        let mut s = self.state();
        s.ctx(ctx)?;
        s.load_module(ctx.0, Arc::new(parsed)).map(Obj)
    }

    fn module_unload(&self, ctx: Obj, module: Obj) -> BResult<()> {
        let mut s = self.state();
        s.ctx(ctx)?;
        if !s.modules.contains_key(&module.0) {
            return Err(CuError::INVALID_HANDLE.into());
        }
        s.unload_module(module.0);
        Ok(())
    }

    fn module_get_function(&self, ctx: Obj, module: Obj, name: &str) -> BResult<Obj> {
        let mut s = self.state();
        s.ctx(ctx)?;
        s.module_function(module.0, name).map(Obj)
    }

    fn module_get_global(&self, ctx: Obj, module: Obj, name: &str) -> BResult<(u64, u64)> {
        let mut s = self.state();
        s.ctx(ctx)?;
        s.global(module.0, name)
    }

    fn module_function_count(&self, ctx: Obj, module: Obj) -> BResult<u32> {
        let mut s = self.state();
        s.ctx(ctx)?;
        let m = s.modules.get(&module.0).ok_or(CuError::INVALID_HANDLE)?;
        Ok(m.image.kernels.len() as u32)
    }

    fn module_functions(&self, ctx: Obj, module: Obj) -> BResult<Vec<Obj>> {
        let mut s = self.state();
        s.ctx(ctx)?;
        let m = s.modules.get(&module.0).ok_or(CuError::INVALID_HANDLE)?;
        let names: Vec<String> = m.image.kernels.iter().map(|k| k.name.clone()).collect();
        names.iter().map(|name| s.module_function(module.0, name).map(Obj)).collect()
    }

    fn module_loading_mode(&self) -> BResult<i32> {
        // CU_MODULE_LAZY_LOADING: libraries load into a context on first use.
        Ok(2)
    }

    fn library_load(&self, image: &[u8]) -> BResult<Obj> {
        let parsed = image::parse(image).map_err(|e| err(CuError::INVALID_IMAGE, e.to_string()))?;
        let mut s = self.state();
        let id = s.id();
        s.libraries.insert(
            id,
            Library {
                image: Arc::new(parsed),
                kernels: HashMap::new(),
                modules: HashMap::new(),
                managed: HashMap::new(),
            },
        );
        Ok(Obj(id))
    }

    fn library_unload(&self, library: Obj) -> BResult<()> {
        let mut s = self.state();
        let lib = s.libraries.remove(&library.0).ok_or(CuError::INVALID_HANDLE)?;
        for m in lib.modules.values() {
            s.unload_module(*m);
        }
        for k in lib.kernels.values() {
            s.kernels.remove(k);
        }
        s.memory.free_where(|o| o == Owner::Managed { library: library.0 });
        Ok(())
    }

    fn library_get_kernel(&self, library: Obj, name: &str) -> BResult<Obj> {
        let mut s = self.state();
        let lib = s.libraries.get(&library.0).ok_or(CuError::INVALID_HANDLE)?;
        if let Some(&k) = lib.kernels.get(name) {
            return Ok(Obj(k));
        }
        if !lib.image.kernels.iter().any(|k| k.name == name) {
            return Err(err(CuError::NOT_FOUND, format!("no kernel {name:?} in the library")));
        }
        let id = s.id();
        s.kernels.insert(id, KernelRef { library: library.0, name: name.to_owned(), set: Vec::new() });
        if let Some(lib) = s.libraries.get_mut(&library.0) {
            lib.kernels.insert(name.to_owned(), id);
        }
        Ok(Obj(id))
    }

    fn library_get_module(&self, ctx: Obj, library: Obj) -> BResult<Obj> {
        let mut s = self.state();
        s.ctx(ctx)?;
        s.library_module(ctx.0, library).map(Obj)
    }

    fn library_get_global(&self, ctx: Obj, library: Obj, name: &str) -> BResult<(u64, u64)> {
        let mut s = self.state();
        s.ctx(ctx)?;
        let m = s.library_module(ctx.0, library)?;
        s.global(m, name)
    }

    fn library_kernel_count(&self, library: Obj) -> BResult<u32> {
        let s = self.state();
        let lib = s.libraries.get(&library.0).ok_or(CuError::INVALID_HANDLE)?;
        Ok(lib.image.kernels.len() as u32)
    }

    fn kernel_get_function(&self, ctx: Obj, kernel: Obj) -> BResult<Obj> {
        let mut s = self.state();
        s.ctx(ctx)?;
        let k = s.kernels.get(&kernel.0).ok_or(CuError::INVALID_HANDLE)?;
        let (library, name, set) = (Obj(k.library), k.name.clone(), k.set.clone());
        let m = s.library_module(ctx.0, library)?;
        let f = s.module_function(m, &name)?;
        if let Some(func) = s.functions.get_mut(&f) {
            for (attr, value) in set {
                func.set_attribute(attr, value)?;
            }
        }
        Ok(Obj(f))
    }

    fn param_layout(&self, _ctx: Obj, func: Obj) -> BResult<Vec<ParamSlot>> {
        Ok(self.state().function(func)?.kernel.params.clone())
    }

    fn func_name(&self, _ctx: Obj, func: Obj) -> BResult<String> {
        Ok(self.state().function(func)?.kernel.name.clone())
    }

    fn func_get_attribute(&self, _ctx: Obj, func: Obj, attr: i32) -> BResult<i32> {
        self.state().function(func)?.attribute(attr)
    }

    fn func_set_attribute(&self, _ctx: Obj, func: Obj, attr: i32, value: i32) -> BResult<()> {
        let mut s = self.state();
        s.functions.get_mut(&func.0).ok_or(CuError::INVALID_HANDLE)?.set_attribute(attr, value)
    }

    fn func_set_cache_config(&self, _ctx: Obj, func: Obj, config: i32) -> BResult<()> {
        self.state().function(func)?;
        if !(0..=3).contains(&config) {
            return Err(CuError::INVALID_VALUE.into());
        }
        Ok(())
    }

    fn kernel_get_attribute(&self, kernel: Obj, attr: i32, _dev: i32) -> BResult<i32> {
        let s = self.state();
        let k = s.kernels.get(&kernel.0).ok_or(CuError::INVALID_HANDLE)?;
        let lib = s.libraries.get(&k.library).ok_or(CuError::INVALID_HANDLE)?;
        let info = lib.image.kernels.iter().find(|i| i.name == k.name).ok_or(CuError::INVALID_HANDLE)?;
        // A function not yet tuned, with what cuKernelSetAttribute set.
        let mut f = Function::new(0, info.clone());
        for &(a, v) in &k.set {
            f.set_attribute(a, v)?;
        }
        f.attribute(attr)
    }

    fn kernel_set_attribute(&self, kernel: Obj, attr: i32, value: i32, _dev: i32) -> BResult<()> {
        let mut s = self.state();
        let k = s.kernels.get(&kernel.0).ok_or(CuError::INVALID_HANDLE)?;
        let (library, name) = (k.library, k.name.clone());
        let lib = s.libraries.get(&library).ok_or(CuError::INVALID_HANDLE)?;
        let info = lib.image.kernels.iter().find(|i| i.name == name).ok_or(CuError::INVALID_HANDLE)?;
        // Checked as for a fresh function; then kept for functions to come.
        Function::new(0, info.clone()).set_attribute(attr, value)?;
        let modules: Vec<u64> = lib.modules.values().copied().collect();
        if let Some(k) = s.kernels.get_mut(&kernel.0) {
            k.set.retain(|&(a, _)| a != attr);
            k.set.push((attr, value));
        }
        // The kernel's functions that exist already: those of its library's modules.
        let targets: Vec<u64> =
            modules.iter().filter_map(|m| s.modules.get(m).and_then(|m| m.functions.get(&name).copied())).collect();
        for f in targets {
            if let Some(func) = s.functions.get_mut(&f) {
                func.set_attribute(attr, value)?;
            }
        }
        Ok(())
    }

    fn kernel_set_cache_config(&self, kernel: Obj, config: i32, _dev: i32) -> BResult<()> {
        if !self.state().kernels.contains_key(&kernel.0) {
            return Err(CuError::INVALID_HANDLE.into());
        }
        if !(0..=3).contains(&config) {
            return Err(CuError::INVALID_VALUE.into());
        }
        Ok(())
    }

    fn occupancy_max_active_blocks(&self, _ctx: Obj, func: Obj, block: i32, smem: u64, flags: u32) -> BResult<i32> {
        check_occupancy_flags(flags)?;
        let s = self.state();
        Ok(occupancy(s.function(func)?, block, smem)? as i32)
    }

    /// As the occupancy calculator: `blocks` must fit with no dynamic shared
    /// memory at all, else INVALID_VALUE.
    fn occupancy_available_smem(&self, _ctx: Obj, func: Obj, blocks: i32, block: i32) -> BResult<u64> {
        let s = self.state();
        let f = s.function(func)?;
        if blocks <= 0 || occupancy(f, block, 0)? < blocks as u32 {
            return Err(err(CuError::INVALID_VALUE, format!("{blocks} blocks of {block} threads do not fit")));
        }
        let per_block = device::SHARED_PER_SM as u64 / blocks as u64;
        let (fixed, dynamic) = (f.kernel.shared_bytes as u64, f.max_dynamic_shared as u64);
        Ok(per_block.min(fixed + dynamic).saturating_sub(fixed))
    }

    fn occupancy_max_potential_block_size(
        &self,
        _ctx: Obj,
        func: Obj,
        smem: u64,
        limit: i32,
        flags: u32,
    ) -> BResult<(i32, i32)> {
        check_occupancy_flags(flags)?;
        let s = self.state();
        let f = s.function(func)?;
        let max = match u32::try_from(limit) {
            Ok(limit) if limit > 0 => f.max_threads().min(limit),
            _ => f.max_threads(),
        };
        // As the occupancy calculator: whole warps from the largest size
        // down (the largest itself even if it is not), keeping the first
        // that holds the most threads. At most 32 sizes.
        let (mut blocks, mut best, mut most) = (0, 0, 0);
        for warps in (1..=max.div_ceil(32)).rev() {
            let block = max.min(warps * 32);
            let n = occupancy(f, block as i32, smem)?;
            if n * block > most {
                (blocks, best, most) = (n, block, n * block);
            }
        }
        Ok(((blocks * device::MULTIPROCESSORS) as i32, best as i32))
    }

    fn occupancy_clusters(&self, ctx: Obj, func: Obj, launch: &Launch, query: ClusterQuery) -> BResult<i32> {
        const CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: u32 = 4;
        /// The largest cluster every device of this kind accepts.
        const PORTABLE_CLUSTER: i32 = 8;
        let mut s = self.state();
        s.stream(ctx, launch.stream)?;
        let f = s.function(func)?;
        s.check_launch(f, launch)?;
        // The attribute's three unsigned dimensions, multiplied without
        // overflow (a 0 among them makes the size 0).
        let cluster: u64 = launch.attrs.iter().find(|a| a.0 == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION).map_or(1, |a| {
            a.1[..12]
                .chunks_exact(4)
                .fold(1u64, |n, d| n.saturating_mul(u32::from_le_bytes(d.try_into().expect("4 bytes")) as u64))
        });
        // `check_launch` has bounded the block by the device's limit.
        let threads: u64 = launch.block.iter().map(|&d| d as u64).product();
        Ok(match query {
            ClusterQuery::MaxPotentialClusterSize => PORTABLE_CLUSTER,
            ClusterQuery::MaxActiveClusters if cluster == 0 || cluster > PORTABLE_CLUSTER as u64 => 0,
            ClusterQuery::MaxActiveClusters => {
                let blocks = occupancy(f, threads as i32, launch.shared_mem as u64)?;
                (blocks as u64 * device::MULTIPROCESSORS as u64 / cluster) as i32
            }
        })
    }

    fn launch(&self, ctx: Obj, func: Obj, launch: &Launch, params: &[u8]) -> BResult<()> {
        let mut s = self.state();
        s.stream(ctx, launch.stream)?;
        s.kernel(ctx, func, launch)?;
        let work = Work::Kernel { func, launch: launch.clone(), params: params.to_vec() };
        if let Some(recorded) = s.graphs.record(launch.stream, work) {
            return recorded;
        }
        s.run_kernel(ctx, func, launch, params)
    }

    fn tensor_map_encode(&self, map: &TensorMap) -> BResult<TensorMapBytes> {
        tensor_maps::encode(map)
    }

    fn tensor_map_replace_address(&self, map: &TensorMapBytes, address: u64) -> BResult<TensorMapBytes> {
        tensor_maps::replace_address(map, address)
    }

    /// The test device cannot compile or link: a link of one image it
    /// loads (cubin, fatbin or PTX) is that image, and anything else is
    /// refused with a log that says so.
    fn link(&self, ctx: Obj, _options: &[(u32, u64)], inputs: &[(u32, &[u8])]) -> BResult<Linked> {
        self.state().ctx(ctx)?;
        match inputs {
            [(kind, image)] if [LINK_INPUT_CUBIN, LINK_INPUT_PTX, LINK_INPUT_FATBIN].contains(kind) => {
                match image::parse(image) {
                    Ok(_) => {
                        // Loaded back by address alone, PTX must end in its NUL.
                        let mut image = image.to_vec();
                        if *kind == LINK_INPUT_PTX && image.last() != Some(&0) {
                            image.push(0);
                        }
                        Ok(Linked { image, ..Linked::default() })
                    }
                    Err(e) => Ok(Linked {
                        // As the driver answers an input it cannot read, PTX or not.
                        status: CuError::INVALID_IMAGE.0,
                        error_log: format!("the input is no image the device loads: {e}").into_bytes(),
                        ..Linked::default()
                    }),
                }
            }
            _ => Ok(Linked {
                status: CuError::NOT_SUPPORTED.0,
                error_log: b"the emulated device links one cubin, fatbin or PTX input only".to_vec(),
                ..Linked::default()
            }),
        }
    }
}
