//! The driver entry points the CUDA backend calls.
//!
//! Each is declared here with its cuda.h 13.0 prototype, except that C enums
//! are `c_int` and `CUresult` is `u32`: the values come from clients and
//! from drivers newer than these bindings, and an unknown value in one of
//! cudarc's Rust enums would be undefined behaviour. Each symbol is looked
//! up once, on first use; one an older driver lacks answers [`Missing`]
//! rather than panicking as cudarc's own wrappers do.
#![allow(non_snake_case, clippy::too_many_arguments)]

use std::ffi::{c_char, c_int, c_uchar, c_uint, c_ulonglong, c_ushort, c_void};
use std::sync::OnceLock;

use cudarc::driver::sys::{
    CUcontext, CUctxCreateParams, CUdevice, CUdeviceptr, CUevent, CUfunction, CUkernel, CUlibrary, CUmodule,
    CUoccupancyB2DSize, CUstream, CUuuid,
};
use gpuplex_protocol::{CallError, CuError};

use super::arrays::{Array3DDescriptor, Memcpy2D, Memcpy3D, Resource};
use super::graph::{ConditionalNodeParams, ExecUpdateResultInfo, HostNodeParams, KernelNodeParams, MemsetNodeParams};
use super::ipc::IpcBytes;
use super::tensor_maps::Raw as TensorMapRaw;
use super::{BResult, LaunchConfig};

/// `CUmemLocation`.
#[repr(C)]
#[derive(Default)]
pub(super) struct MemLocation {
    pub kind: c_int,
    pub id: c_int,
}

/// `CUmemAllocationProp`.
#[repr(C)]
pub(super) struct AllocationProp {
    pub kind: c_int,
    pub handle_types: c_int,
    pub location: MemLocation,
    pub win32_metadata: *mut c_void,
    pub compression: c_uchar,
    pub rdma_capable: c_uchar,
    pub usage: c_ushort,
    pub reserved: [c_uchar; 4],
}

/// `CUmemPoolProps`.
#[repr(C)]
pub(super) struct PoolProps {
    pub kind: c_int,
    pub handle_types: c_int,
    pub location: MemLocation,
    pub win32_security_attributes: *mut c_void,
    pub max_size: usize,
    pub usage: c_ushort,
    pub reserved: [c_uchar; 54],
}

/// `CUmemAccessDesc`.
#[repr(C)]
pub(super) struct AccessDesc {
    pub location: MemLocation,
    pub flags: c_int,
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS`.
#[repr(C)]
pub(super) struct MemAllocNodeParams {
    pub pool_props: PoolProps,
    pub access_descs: *const AccessDesc,
    pub access_desc_count: usize,
    pub bytesize: usize,
    pub dptr: CUdeviceptr,
}

/// `CUmemcpyAttributes`: how the copies of a batch that it applies to are
/// made.
#[repr(C)]
#[derive(Default)]
pub(super) struct MemcpyAttributes {
    pub src_access_order: c_int,
    pub src_loc_hint: MemLocation,
    pub dst_loc_hint: MemLocation,
    pub flags: c_uint,
}

/// `CU_MEMCPY_SRC_ACCESS_ORDER_STREAM`: the source is read in stream order.
pub(super) const SRC_ACCESS_ORDER_STREAM: c_int = 1;

/// A driver entry point this `libcuda` does not export (a driver older than
/// the call).
#[derive(Clone, Copy, Debug)]
pub(super) struct Missing(pub(super) &'static str);

/// What an entry point answered: its raw `CUresult`, or that it is missing.
pub(super) type Raw = Result<u32, Missing>;

/// Declares each entry point as an `unsafe fn` of the same name that looks
/// the symbol up on first use and returns [`Raw`].
macro_rules! driver_api {
    ($($name:ident($($arg:ident: $ty:ty),* $(,)?);)*) => {$(
        pub(super) unsafe fn $name($($arg: $ty),*) -> Raw {
            type F = unsafe extern "C" fn($($ty),*) -> u32;
            static SYM: OnceLock<Option<F>> = OnceLock::new();
            // SAFETY: `F` is the entry point's prototype in cuda.h 13.0, with
            // C enums as `c_int` and `CUresult` as `u32` (same ABI).
            let f = SYM.get_or_init(|| unsafe { symbol::<F>(concat!(stringify!($name), "\0")) });
            match f {
                // SAFETY: the caller upholds the entry point's contract.
                Some(f) => Ok(unsafe { f($($arg),*) }),
                None => Err(Missing(stringify!($name))),
            }
        }
    )*};
}

// The entry points of the API table's `pass` rows (`passthrough.rs`).
include!(concat!(env!("OUT_DIR"), "/cuda_bindings.rs"));

/// The symbol `name` (NUL-terminated) of the loaded driver.
///
/// # Safety
/// `F` must be the symbol's C type, and the driver must have been found
/// ([`super::Cuda::open`] checks it first; only `Cuda`'s methods get here).
unsafe fn symbol<F: Copy>(name: &str) -> Option<F> {
    // SAFETY: the library is present, so `culib` opens it rather than
    // panicking; it is never unloaded, so the pointer stays valid; the
    // caller vouches for `F`.
    unsafe { cudarc::driver::sys::culib().get::<F>(name.as_bytes()).ok().map(|s| *s) }
}

driver_api! {
    cuInit(flags: c_uint);
    cuDriverGetVersion(version: *mut c_int);
    cuDeviceGetCount(count: *mut c_int);
    cuDeviceGet(dev: *mut CUdevice, ordinal: c_int);
    cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice);
    cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice);
    cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice);
    cuDeviceGetPCIBusId(id: *mut c_char, len: c_int, dev: CUdevice);
    cuDeviceGetAttribute(value: *mut c_int, attrib: c_int, dev: CUdevice);
    cuDeviceCanAccessPeer(can: *mut c_int, dev: CUdevice, peer: CUdevice);

    cuCtxCreate_v4(ctx: *mut CUcontext, params: *mut CUctxCreateParams, flags: c_uint, dev: CUdevice);
    cuCtxCreate_v2(ctx: *mut CUcontext, flags: c_uint, dev: CUdevice);
    cuCtxDestroy_v2(ctx: CUcontext);
    cuCtxSetCurrent(ctx: CUcontext);
    cuCtxPopCurrent_v2(ctx: *mut CUcontext);
    cuCtxSynchronize();
    cuCtxGetApiVersion(ctx: CUcontext, version: *mut c_uint);
    cuCtxGetFlags(flags: *mut c_uint);
    cuCtxSetFlags(flags: c_uint);
    cuCtxGetLimit(value: *mut usize, limit: c_int);
    cuCtxSetLimit(limit: c_int, value: usize);
    cuCtxGetCacheConfig(config: *mut c_int);
    cuCtxSetCacheConfig(config: c_int);
    cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int);
    cuCtxGetId(ctx: CUcontext, id: *mut c_ulonglong);

    cuMemGetInfo_v2(free: *mut usize, total: *mut usize);
    cuMemAlloc_v2(ptr: *mut CUdeviceptr, size: usize);
    cuMemAllocPitch_v2(ptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, element: c_uint);
    cuMemFree_v2(ptr: CUdeviceptr);
    cuMemHostRegister_v2(ptr: *mut c_void, size: usize, flags: c_uint);
    cuMemHostUnregister(ptr: *mut c_void);
    cuMemHostGetDevicePointer_v2(dptr: *mut CUdeviceptr, ptr: *mut c_void, flags: c_uint);
    cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, size: usize);
    cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, size: usize, stream: CUstream);
    cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, size: usize);
    cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, size: usize, stream: CUstream);
    cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, size: usize, stream: CUstream);
    cuMemcpyBatchAsync_v2(
        dsts: *mut CUdeviceptr,
        srcs: *mut CUdeviceptr,
        sizes: *mut usize,
        count: usize,
        attrs: *mut MemcpyAttributes,
        attrs_idxs: *mut usize,
        num_attrs: usize,
        stream: CUstream,
    );
    cuMemGetAllocationGranularity(granularity: *mut usize, prop: *const AllocationProp, option: c_int);
    cuMemCreate(handle: *mut c_ulonglong, size: usize, prop: *const AllocationProp, flags: c_ulonglong);
    cuMemRelease(handle: c_ulonglong);
    cuMemRetainAllocationHandle(handle: *mut c_ulonglong, addr: *mut c_void);
    cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, alignment: usize, addr: CUdeviceptr, flags: c_ulonglong);
    cuMemAddressFree(ptr: CUdeviceptr, size: usize);
    cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: c_ulonglong, flags: c_ulonglong);
    cuMemUnmap(ptr: CUdeviceptr, size: usize);
    cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const AccessDesc, count: usize);
    cuMemGetAccess(flags: *mut c_ulonglong, location: *const MemLocation, ptr: CUdeviceptr);
    cuMemcpy3DAsync_v2(copy: *const Memcpy3D, stream: CUstream);
    cuMemcpy2DAsync_v2(copy: *const Memcpy2D, stream: CUstream);
    cuMemcpy2DUnaligned_v2(copy: *const Memcpy2D);
    cuMemcpyHtoAAsync_v2(dst: *mut c_void, offset: usize, src: *const c_void, size: usize, stream: CUstream);
    cuMemcpyAtoHAsync_v2(dst: *mut c_void, src: *mut c_void, offset: usize, size: usize, stream: CUstream);
    cuMemcpyDtoA_v2(dst: *mut c_void, offset: usize, src: CUdeviceptr, size: usize);
    cuMemcpyAtoD_v2(dst: CUdeviceptr, src: *mut c_void, offset: usize, size: usize);
    cuMemcpyAtoA_v2(dst: *mut c_void, dst_offset: usize, src: *mut c_void, src_offset: usize, size: usize);
    cuArray3DCreate_v2(array: *mut *mut c_void, desc: *const Array3DDescriptor);
    cuArrayDestroy(array: *mut c_void);
    cuMipmappedArrayCreate(mipmap: *mut *mut c_void, desc: *const Array3DDescriptor, levels: c_uint);
    cuMipmappedArrayGetLevel(array: *mut *mut c_void, mipmap: *mut c_void, level: c_uint);
    cuMipmappedArrayDestroy(mipmap: *mut c_void);
    cuArray3DGetDescriptor_v2(desc: *mut Array3DDescriptor, array: *mut c_void);
    cuTexObjectCreate(object: *mut c_ulonglong, res: *const Resource, tex: *const c_void, view: *const c_void);
    cuTexObjectDestroy(object: c_ulonglong);
    cuSurfObjectCreate(object: *mut c_ulonglong, res: *const Resource);
    cuSurfObjectDestroy(object: c_ulonglong);
    cuMemPoolCreate(pool: *mut *mut c_void, props: *const PoolProps);
    cuMemPoolDestroy(pool: *mut c_void);
    cuMemAllocFromPoolAsync(ptr: *mut CUdeviceptr, size: usize, pool: *mut c_void, stream: CUstream);
    cuMemFreeAsync(ptr: CUdeviceptr, stream: CUstream);
    cuMemPoolTrimTo(pool: *mut c_void, keep: usize);
    cuMemPoolSetAttribute(pool: *mut c_void, attr: c_int, value: *mut c_void);
    cuMemPoolGetAttribute(pool: *mut c_void, attr: c_int, value: *mut c_void);
    cuMemPoolSetAccess(pool: *mut c_void, desc: *const AccessDesc, count: usize);
    cuMemPoolGetAccess(flags: *mut c_int, pool: *mut c_void, location: *const MemLocation);
    cuMemsetD8Async(dst: CUdeviceptr, value: c_uchar, n: usize, stream: CUstream);
    cuMemsetD16Async(dst: CUdeviceptr, value: c_ushort, n: usize, stream: CUstream);
    cuMemsetD32Async(dst: CUdeviceptr, value: c_uint, n: usize, stream: CUstream);
    cuMemsetD2D8Async(dst: CUdeviceptr, pitch: usize, value: c_uchar, w: usize, h: usize, stream: CUstream);
    cuMemsetD2D16Async(dst: CUdeviceptr, pitch: usize, value: c_ushort, w: usize, h: usize, stream: CUstream);
    cuMemsetD2D32Async(dst: CUdeviceptr, pitch: usize, value: c_uint, w: usize, h: usize, stream: CUstream);

    cuModuleLoadData(module: *mut CUmodule, image: *const c_void);
    cuModuleUnload(module: CUmodule);
    cuModuleGetFunction(func: *mut CUfunction, module: CUmodule, name: *const c_char);
    cuModuleGetGlobal_v2(ptr: *mut CUdeviceptr, size: *mut usize, module: CUmodule, name: *const c_char);
    cuModuleGetFunctionCount(count: *mut c_uint, module: CUmodule);
    cuModuleEnumerateFunctions(functions: *mut CUfunction, count: c_uint, module: CUmodule);
    cuModuleGetLoadingMode(mode: *mut c_int);
    cuLibraryLoadData(
        library: *mut CUlibrary,
        image: *const c_void,
        jit_options: *mut c_int,
        jit_values: *mut *mut c_void,
        jit_count: c_uint,
        library_options: *mut c_int,
        library_values: *mut *mut c_void,
        library_count: c_uint,
    );
    cuLibraryUnload(library: CUlibrary);
    cuLibraryGetKernel(kernel: *mut CUkernel, library: CUlibrary, name: *const c_char);
    cuLibraryGetModule(module: *mut CUmodule, library: CUlibrary);
    cuLibraryGetGlobal(ptr: *mut CUdeviceptr, size: *mut usize, library: CUlibrary, name: *const c_char);
    cuLibraryGetKernelCount(count: *mut c_uint, library: CUlibrary);
    cuLibraryGetManaged(ptr: *mut CUdeviceptr, size: *mut usize, library: CUlibrary, name: *const c_char);
    cuKernelGetFunction(func: *mut CUfunction, kernel: CUkernel);
    cuKernelGetAttribute(value: *mut c_int, attrib: c_int, kernel: CUkernel, dev: CUdevice);
    cuKernelSetAttribute(attrib: c_int, value: c_int, kernel: CUkernel, dev: CUdevice);
    cuKernelSetCacheConfig(kernel: CUkernel, config: c_int, dev: CUdevice);

    cuFuncGetParamInfo(func: CUfunction, index: usize, offset: *mut usize, size: *mut usize);
    cuFuncGetAttribute(value: *mut c_int, attrib: c_int, func: CUfunction);
    cuFuncSetAttribute(func: CUfunction, attrib: c_int, value: c_int);
    cuFuncSetCacheConfig(func: CUfunction, config: c_int);
    cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
        blocks: *mut c_int,
        func: CUfunction,
        block: c_int,
        smem: usize,
        flags: c_uint,
    );
    cuOccupancyAvailableDynamicSMemPerBlock(smem: *mut usize, func: CUfunction, blocks: c_int, block: c_int);
    cuOccupancyMaxPotentialBlockSizeWithFlags(
        min_grid: *mut c_int,
        block: *mut c_int,
        func: CUfunction,
        smem_of_block: CUoccupancyB2DSize,
        smem: usize,
        limit: c_int,
        flags: c_uint,
    );
    cuOccupancyMaxActiveClusters(clusters: *mut c_int, func: CUfunction, config: *const LaunchConfig);
    cuOccupancyMaxPotentialClusterSize(size: *mut c_int, func: CUfunction, config: *const LaunchConfig);
    cuLaunchKernel(
        func: CUfunction,
        gx: c_uint,
        gy: c_uint,
        gz: c_uint,
        bx: c_uint,
        by: c_uint,
        bz: c_uint,
        smem: c_uint,
        stream: CUstream,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    );
    cuLaunchKernelEx(
        config: *const LaunchConfig,
        func: CUfunction,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    );

    cuStreamCreateWithPriority(stream: *mut CUstream, flags: c_uint, priority: c_int);
    cuStreamDestroy_v2(stream: CUstream);
    cuStreamSynchronize(stream: CUstream);
    cuStreamQuery(stream: CUstream);
    cuStreamWaitEvent(stream: CUstream, event: CUevent, flags: c_uint);
    cuStreamBeginCapture_v2(stream: CUstream, mode: c_int);
    cuStreamEndCapture(stream: CUstream, graph: *mut *mut c_void);
    cuStreamGetCaptureInfo_v3(
        stream: CUstream,
        status: *mut c_int,
        id: *mut c_ulonglong,
        graph: *mut *mut c_void,
        deps: *mut *const *mut c_void,
        edges: *mut *const u64,
        count: *mut usize,
    );
    cuThreadExchangeStreamCaptureMode(mode: *mut c_int);
    cuGraphCreate(graph: *mut *mut c_void, flags: c_uint);
    cuGraphDestroy(graph: *mut c_void);
    cuGraphInstantiateWithFlags(exec: *mut *mut c_void, graph: *mut c_void, flags: c_ulonglong);
    cuGraphExecDestroy(exec: *mut c_void);
    cuGraphLaunch(exec: *mut c_void, stream: CUstream);
    cuGraphUpload(exec: *mut c_void, stream: CUstream);
    cuGraphGetNodes(graph: *mut c_void, nodes: *mut *mut c_void, count: *mut usize);
    cuGraphGetRootNodes(graph: *mut c_void, nodes: *mut *mut c_void, count: *mut usize);
    cuGraphAddKernelNode_v2(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        params: *const KernelNodeParams,
    );
    cuGraphAddMemcpyNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        copy: *const Memcpy3D,
        ctx: CUcontext,
    );
    cuGraphAddMemsetNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        params: *const MemsetNodeParams,
        ctx: CUcontext,
    );
    cuGraphAddEmptyNode(node: *mut *mut c_void, graph: *mut c_void, deps: *const *mut c_void, count: usize);
    cuGraphAddChildGraphNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        child: *mut c_void,
    );
    cuGraphAddEventRecordNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        event: CUevent,
    );
    cuGraphAddEventWaitNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        event: CUevent,
    );
    cuGraphAddMemAllocNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        params: *mut MemAllocNodeParams,
    );
    cuGraphAddMemFreeNode(node: *mut *mut c_void, graph: *mut c_void, deps: *const *mut c_void, count: usize, dptr: CUdeviceptr);
    cuGraphMemAllocNodeGetParams(node: *mut c_void, params: *mut MemAllocNodeParams);
    cuLinkCreate_v2(count: c_uint, options: *mut c_int, values: *mut *mut c_void, state: *mut *mut c_void);
    cuLinkAddData_v2(
        state: *mut c_void,
        kind: c_int,
        data: *mut c_void,
        size: usize,
        name: *const c_char,
        count: c_uint,
        options: *mut c_int,
        values: *mut *mut c_void,
    );
    cuLinkComplete(state: *mut c_void, image: *mut *mut c_void, size: *mut usize);
    cuLinkDestroy(state: *mut c_void);
    cuFuncGetName(name: *mut *const c_char, func: *mut c_void);
    cuIpcGetMemHandle(handle: *mut IpcBytes, dptr: CUdeviceptr);
    cuIpcOpenMemHandle_v2(dptr: *mut CUdeviceptr, handle: IpcBytes, flags: c_uint);
    cuIpcCloseMemHandle(dptr: CUdeviceptr);
    cuIpcGetEventHandle(handle: *mut IpcBytes, event: *mut c_void);
    cuIpcOpenEventHandle(event: *mut *mut c_void, handle: IpcBytes);
    cuMemGetAddressRange_v2(base: *mut CUdeviceptr, size: *mut usize, dptr: CUdeviceptr);
    cuPointerGetAttribute(data: *mut c_void, attr: c_int, ptr: CUdeviceptr);
    cuGraphDebugDotPrint(graph: *mut c_void, path: *const c_char, flags: c_uint);
    cuGraphChildGraphNodeGetGraph(node: *mut c_void, graph: *mut *mut c_void);
    cuGraphMemsetNodeGetParams(node: *mut c_void, params: *mut MemsetNodeParams);
    cuGraphMemcpyNodeGetParams(node: *mut c_void, params: *mut Memcpy3D);
    cuUserObjectCreate(
        object: *mut *mut c_void,
        ptr: *mut c_void,
        destroy: unsafe extern "C" fn(*mut c_void),
        refs: c_uint,
        flags: c_uint,
    );
    cuGraphAddNode_v2(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        data: *const u64,
        count: usize,
        params: *mut ConditionalNodeParams,
    );
    cuDeviceSetGraphMemAttribute(dev: CUdevice, attr: c_int, value: *mut c_void);
    cuStreamBeginCaptureToGraph(
        stream: CUstream,
        graph: *mut c_void,
        deps: *const *mut c_void,
        data: *const u64,
        count: usize,
        mode: c_int,
    );
    cuGraphAddDependencies_v2(
        graph: *mut c_void,
        from: *const *mut c_void,
        to: *const *mut c_void,
        data: *const u64,
        count: usize,
    );
    cuGraphRemoveDependencies_v2(
        graph: *mut c_void,
        from: *const *mut c_void,
        to: *const *mut c_void,
        data: *const u64,
        count: usize,
    );
    cuGraphGetEdges_v2(
        graph: *mut c_void,
        from: *mut *mut c_void,
        to: *mut *mut c_void,
        data: *mut u64,
        count: *mut usize,
    );
    cuGraphNodeGetDependencies_v2(node: *mut c_void, deps: *mut *mut c_void, data: *mut u64, count: *mut usize);
    cuGraphNodeGetDependentNodes_v2(node: *mut c_void, deps: *mut *mut c_void, data: *mut u64, count: *mut usize);
    cuGraphKernelNodeSetParams_v2(node: *mut c_void, params: *const KernelNodeParams);
    cuGraphExecKernelNodeSetParams_v2(exec: *mut c_void, node: *mut c_void, params: *const KernelNodeParams);
    cuGraphClone(clone: *mut *mut c_void, graph: *mut c_void);
    cuGraphNodeFindInClone(node: *mut *mut c_void, original: *mut c_void, clone: *mut c_void);
    cuGraphDestroyNode(node: *mut c_void);
    cuStreamUpdateCaptureDependencies(stream: CUstream, deps: *mut *mut c_void, count: usize, flags: c_uint);
    cuGraphAddHostNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        params: *const HostNodeParams,
    );
    cuGraphHostNodeSetParams(node: *mut c_void, params: *const HostNodeParams);
    cuGraphExecHostNodeSetParams(exec: *mut c_void, node: *mut c_void, params: *const HostNodeParams);
    cuGraphMemcpyNodeSetParams(node: *mut c_void, copy: *const Memcpy3D);
    cuGraphExecMemcpyNodeSetParams(exec: *mut c_void, node: *mut c_void, copy: *const Memcpy3D, ctx: CUcontext);
    cuGraphMemsetNodeSetParams(node: *mut c_void, params: *const MemsetNodeParams);
    cuGraphExecMemsetNodeSetParams(
        exec: *mut c_void,
        node: *mut c_void,
        params: *const MemsetNodeParams,
        ctx: CUcontext,
    );
    cuGraphEventRecordNodeSetEvent(node: *mut c_void, event: CUevent);
    cuGraphExecChildGraphNodeSetParams(exec: *mut c_void, node: *mut c_void, child: *mut c_void);
    cuGraphEventWaitNodeSetEvent(node: *mut c_void, event: CUevent);
    cuGraphExecEventRecordNodeSetEvent(exec: *mut c_void, node: *mut c_void, event: CUevent);
    cuGraphExecEventWaitNodeSetEvent(exec: *mut c_void, node: *mut c_void, event: CUevent);
    cuLaunchHostFunc(stream: CUstream, run: unsafe extern "C" fn(*mut c_void), data: *mut c_void);
    cuGraphExecUpdate_v2(exec: *mut c_void, graph: *mut c_void, info: *mut ExecUpdateResultInfo);
    cuTensorMapEncodeTiled(
        map: *mut TensorMapRaw,
        data_type: c_int,
        rank: c_uint,
        address: *mut c_void,
        dims: *const u64,
        strides: *const u64,
        window: *const c_uint,
        element_strides: *const c_uint,
        interleave: c_int,
        swizzle: c_int,
        l2_promotion: c_int,
        oob_fill: c_int,
    );
    cuTensorMapEncodeIm2col(
        map: *mut TensorMapRaw,
        data_type: c_int,
        rank: c_uint,
        address: *mut c_void,
        dims: *const u64,
        strides: *const u64,
        lower: *const c_int,
        upper: *const c_int,
        channels: c_uint,
        pixels: c_uint,
        element_strides: *const c_uint,
        interleave: c_int,
        swizzle: c_int,
        l2_promotion: c_int,
        oob_fill: c_int,
    );
    cuTensorMapReplaceAddress(map: *mut TensorMapRaw, address: *mut c_void);
    cuStreamGetId(stream: CUstream, id: *mut c_ulonglong);
    cuStreamIsCapturing(stream: CUstream, status: *mut c_uint);
    cuEventCreate(event: *mut CUevent, flags: c_uint);
    cuEventDestroy_v2(event: CUevent);
    cuEventRecord(event: CUevent, stream: CUstream);
    cuEventRecordWithFlags(event: CUevent, stream: CUstream, flags: c_uint);
    cuEventSynchronize(event: CUevent);
    cuEventQuery(event: CUevent);
    cuEventElapsedTime_v2(ms: *mut f32, start: CUevent, end: CUevent);
    cuEventElapsedTime(ms: *mut f32, start: CUevent, end: CUevent);
}

/// `Ok` for `CUDA_SUCCESS`, else the status as the caller will see it.
pub(super) fn check(r: Raw) -> BResult<()> {
    match r {
        Ok(0) => Ok(()),
        Ok(code) => Err(CuError(code).into()),
        Err(Missing(name)) => Err(CallError::new(
            CuError::NOT_SUPPORTED,
            format!("the server's CUDA driver has no {name}; it needs a newer driver"),
        )),
    }
}

/// `r`, or `fallback()` where `r`'s entry point is missing (an older driver).
pub(super) fn or_older(r: Raw, fallback: impl FnOnce() -> Raw) -> Raw {
    match r {
        Err(Missing(_)) => fallback(),
        r => r,
    }
}
