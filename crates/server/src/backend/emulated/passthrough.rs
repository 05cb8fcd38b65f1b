//! The API table's `pass` rows the test device models. The rest answer
//! CUDA_ERROR_NOT_SUPPORTED (`Passthrough`'s defaults).

use gpuplex_protocol::{CuError, Passthrough};

use super::graph::Work;
use super::kernels::DeviceMemory;
use super::{err, user_objects, BResult, Emulated, Obj, STREAM_ATTRIBUTES, STREAM_PRIORITY};

#[allow(non_snake_case)]
impl Passthrough for Emulated {
    /// `CU_FUNCTION_LOADING_STATE_LOADED`: emulated modules load eagerly.
    fn cuFuncIsLoaded(&self, _ctx: u64, function: u64) -> BResult<i32> {
        self.state().function(Obj(function)).map(|_| 1)
    }

    fn cuFuncLoad(&self, _ctx: u64, function: u64) -> BResult<()> {
        self.state().function(Obj(function)).map(drop)
    }

    fn cuStreamGetPriority(&self, ctx: u64, stream: u64) -> BResult<i32> {
        let mut s = self.state();
        s.stream(Obj(ctx), Obj(stream))?;
        Ok(s.streams.get(&stream).map_or(0, |st| st.priority))
    }

    fn cuStreamGetFlags(&self, ctx: u64, stream: u64) -> BResult<u32> {
        let mut s = self.state();
        s.stream(Obj(ctx), Obj(stream))?;
        Ok(s.streams.get(&stream).map_or(0, |st| st.flags))
    }

    fn cuStreamWriteValue32_v2(&self, ctx: u64, stream: u64, addr: u64, value: u32, _flags: u32) -> BResult<()> {
        self.write_value(ctx, stream, addr, &value.to_le_bytes())
    }

    fn cuStreamWriteValue64_v2(&self, ctx: u64, stream: u64, addr: u64, value: u64, _flags: u32) -> BResult<()> {
        self.write_value(ctx, stream, addr, &value.to_le_bytes())
    }

    fn cuStreamWaitValue32_v2(&self, ctx: u64, stream: u64, addr: u64, value: u32, flags: u32) -> BResult<()> {
        self.wait_value(ctx, stream, addr, value.into(), flags, 4)
    }

    fn cuStreamWaitValue64_v2(&self, ctx: u64, stream: u64, addr: u64, value: u64, flags: u32) -> BResult<()> {
        self.wait_value(ctx, stream, addr, value, flags, 8)
    }

    fn cuStreamSetAttribute(&self, ctx: u64, stream: u64, attr: u32, value: [u8; 64]) -> BResult<()> {
        let mut s = self.state();
        s.stream(Obj(ctx), Obj(stream))?;
        known_attribute(attr)?;
        match s.streams.get_mut(&stream) {
            Some(st) => st.attributes.insert(attr, value),
            None => {
                return Err(err(CuError::INVALID_VALUE, "the emulated device keeps no attributes of default streams"))
            }
        };
        Ok(())
    }

    fn cuStreamGetAttribute(&self, ctx: u64, stream: u64, attr: u32) -> BResult<[u8; 64]> {
        let mut s = self.state();
        s.stream(Obj(ctx), Obj(stream))?;
        known_attribute(attr)?;
        let st = s.streams.get(&stream);
        let mut value = st.and_then(|st| st.attributes.get(&attr).copied()).unwrap_or([0; 64]);
        if attr == STREAM_PRIORITY && st.is_some_and(|st| !st.attributes.contains_key(&attr)) {
            value[..4].copy_from_slice(&st.map_or(0, |st| st.priority).to_le_bytes());
        }
        Ok(value)
    }

    fn cuStreamCopyAttributes(&self, ctx: u64, dst: u64, src: u64) -> BResult<()> {
        let mut s = self.state();
        s.stream(Obj(ctx), Obj(dst))?;
        let default = || err(CuError::INVALID_VALUE, "the emulated device keeps no attributes of default streams");
        let attributes = s.streams.get(&src).ok_or_else(default)?.attributes.clone();
        s.streams.get_mut(&dst).ok_or_else(default)?.attributes = attributes;
        Ok(())
    }

    /// The widest 1D texture over linear memory, in elements: the test
    /// device takes 2^27, whatever the format.
    fn cuDeviceGetTexture1DLinearMaxWidth(&self, _: u64, format: i32, channels: u32, _dev: i32) -> BResult<u64> {
        gpuplex_protocol::element_bytes(format as u32, channels)?;
        Ok(1 << 27)
    }

    /// The test device has one device per context and no peers.
    fn cuCtxEnablePeerAccess(&self, ctx: u64, peer: u64, _flags: u32) -> BResult<()> {
        self.no_peer(ctx, peer)
    }

    fn cuCtxDisablePeerAccess(&self, ctx: u64, peer: u64) -> BResult<()> {
        self.no_peer(ctx, peer)
    }

    /// Everything the test device is given has run by the time the call
    /// returns, so all of a context's work is before the event already.
    fn cuCtxRecordEvent(&self, _: u64, ctx: u64, event: u64) -> BResult<()> {
        let mut s = self.state();
        s.ctx(Obj(ctx))?;
        s.event(Obj(event))?.recorded = Some(std::time::Instant::now());
        Ok(())
    }

    fn cuCtxWaitEvent(&self, _: u64, ctx: u64, event: u64) -> BResult<()> {
        let mut s = self.state();
        s.ctx(Obj(ctx))?;
        s.event(Obj(event)).map(drop)
    }

    /// The test device's shared memory has banks of one size, four bytes,
    /// as every GPU's since Maxwell.
    fn cuCtxGetSharedMemConfig(&self, ctx: u64) -> BResult<i32> {
        self.state().ctx(Obj(ctx)).map(|_| SHARED_MEM_FOUR_BYTE_BANKS)
    }

    /// Taken and ignored, as the driver does where the bank size is fixed.
    fn cuCtxSetSharedMemConfig(&self, ctx: u64, config: i32) -> BResult<()> {
        self.state().ctx(Obj(ctx))?;
        bank_config(config)
    }

    fn cuFuncSetSharedMemConfig(&self, _ctx: u64, function: u64, config: i32) -> BResult<()> {
        self.state().function(Obj(function))?;
        bank_config(config)
    }

    /// The test device has no L2 cache to set lines aside in.
    fn cuCtxResetPersistingL2Cache(&self, ctx: u64) -> BResult<()> {
        self.state().ctx(Obj(ctx)).map(drop)
    }

    /// The session passes only its own devices: the test device's one, and
    /// itself is no peer, as the driver says of any device.
    fn cuDeviceGetP2PAttribute(&self, _: u64, _attrib: i32, _src: i32, _dst: i32) -> BResult<i32> {
        Err(err(CuError::INVALID_DEVICE, "the emulated device has no peers"))
    }

    /// No profiler is ever attached: the call only needs a context.
    fn cuProfilerStart(&self, ctx: u64) -> BResult<()> {
        self.state().ctx(Obj(ctx)).map(drop)
    }

    fn cuProfilerStop(&self, ctx: u64) -> BResult<()> {
        self.state().ctx(Obj(ctx)).map(drop)
    }

    fn cuGraphNodeGetType(&self, _ctx: u64, node: u64) -> BResult<u32> {
        self.state().graphs.node_type(Obj(node))
    }

    fn cuGraphMemFreeNodeGetParams(&self, _ctx: u64, node: u64) -> BResult<u64> {
        match self.state().graphs.node_work(Obj(node))? {
            Work::MemFree(dptr) => Ok(*dptr),
            _ => Err(err(CuError::INVALID_VALUE, "not a free node")),
        }
    }

    /// The test device keeps graph memory for good: nothing to give back.
    fn cuDeviceGraphMemTrim(&self, _ctx: u64, _device: i32) -> BResult<()> {
        Ok(())
    }

    /// What every allocation node holds, used and reserved alike.
    fn cuDeviceGetGraphMemAttribute(&self, _ctx: u64, _device: i32, attr: i32) -> BResult<u64> {
        match attr {
            0..=3 => Ok(self.state().graphs.memory()),
            _ => Err(err(CuError::INVALID_VALUE, format!("graph memory attribute {attr}"))),
        }
    }

    fn cuGraphNodeSetEnabled(&self, _ctx: u64, exec: u64, node: u64, enabled: u32) -> BResult<()> {
        self.state().graphs.set_enabled(Obj(exec), Obj(node), enabled != 0)
    }

    fn cuGraphNodeGetEnabled(&self, _ctx: u64, exec: u64, node: u64) -> BResult<u32> {
        self.state().graphs.enabled(Obj(exec), Obj(node)).map(u32::from)
    }

    fn cuGraphConditionalHandleCreate(&self, _: u64, graph: u64, ctx: u64, default: u32, flags: u32) -> BResult<u64> {
        let mut s = self.state();
        s.ctx(Obj(ctx))?;
        s.graphs.conditional_handle(Obj(graph), default, flags)
    }

    fn cuGraphEventRecordNodeGetEvent(&self, _ctx: u64, node: u64) -> BResult<u64> {
        self.node_event(node, false)
    }

    fn cuGraphEventWaitNodeGetEvent(&self, _ctx: u64, node: u64) -> BResult<u64> {
        self.node_event(node, true)
    }

    /// Kept with the node's launch, which the test device runs without
    /// them, as it runs launches.
    fn cuGraphKernelNodeSetAttribute(&self, _ctx: u64, node: u64, attr: u32, value: [u8; 64]) -> BResult<()> {
        known_attribute(attr)?;
        let mut s = self.state();
        let attrs = s.graphs.kernel_attributes(Obj(node))?;
        match attrs.iter_mut().find(|(id, _)| *id == attr) {
            Some((_, v)) => *v = value,
            None => attrs.push((attr, value)),
        }
        Ok(())
    }

    fn cuGraphKernelNodeGetAttribute(&self, _ctx: u64, node: u64, attr: u32) -> BResult<[u8; 64]> {
        known_attribute(attr)?;
        let mut s = self.state();
        let attrs = s.graphs.kernel_attributes(Obj(node))?;
        Ok(attrs.iter().find(|(id, _)| *id == attr).map_or([0; 64], |(_, v)| *v))
    }

    fn cuGraphKernelNodeCopyAttributes(&self, _ctx: u64, dst: u64, src: u64) -> BResult<()> {
        let mut s = self.state();
        let attrs = s.graphs.kernel_attributes(Obj(src))?.clone();
        *s.graphs.kernel_attributes(Obj(dst))? = attrs;
        Ok(())
    }

    fn cuUserObjectRetain(&self, _ctx: u64, object: u64, count: u32) -> BResult<()> {
        self.state().user_objects.retain(object, count)
    }

    fn cuUserObjectRelease(&self, _ctx: u64, object: u64, count: u32) -> BResult<()> {
        let destroy = self.state().user_objects.release(object, count)?;
        user_objects::run(destroy);
        Ok(())
    }

    fn cuGraphRetainUserObject(&self, _ctx: u64, graph: u64, object: u64, count: u32, flags: u32) -> BResult<()> {
        let mut s = self.state();
        s.graphs.nodes(Obj(graph), true)?;
        s.user_objects.owner_retain(graph, object, count, flags)
    }

    fn cuGraphReleaseUserObject(&self, _ctx: u64, graph: u64, object: u64, count: u32) -> BResult<()> {
        let destroy = {
            let mut s = self.state();
            s.graphs.nodes(Obj(graph), true)?;
            s.user_objects.owner_release(graph, object, count)?
        };
        user_objects::run(destroy);
        Ok(())
    }

    /// The test device instantiates with no flags only.
    fn cuGraphExecGetFlags(&self, _ctx: u64, exec: u64) -> BResult<u64> {
        self.state().graphs.exec_work(Obj(exec)).map(|_| 0)
    }
}

/// `CU_STREAM_WAIT_VALUE_GEQ`, `_EQ`, `_AND`, `_NOR`; `_FLUSH` may be added.
const WAIT_GEQ: u32 = 0;
const WAIT_EQ: u32 = 1;
const WAIT_AND: u32 = 2;
const WAIT_NOR: u32 = 3;
const WAIT_FLUSH: u32 = 1 << 30;

/// An attribute the test device keeps (those of a stream; a kernel node
/// takes the same ones).
fn known_attribute(attr: u32) -> BResult<()> {
    if STREAM_ATTRIBUTES.contains(&attr) {
        Ok(())
    } else {
        Err(err(CuError::INVALID_VALUE, format!("attribute {attr} is not one the emulated device keeps")))
    }
}

impl Emulated {
    /// Peer access refused as the driver refuses it between contexts of
    /// one device.
    fn no_peer(&self, ctx: u64, peer: u64) -> BResult<()> {
        let mut s = self.state();
        s.ctx(Obj(ctx))?;
        s.ctx(Obj(peer))?;
        Err(err(CuError::PEER_ACCESS_UNSUPPORTED, "the emulated device has no peers"))
    }

    /// An event record (or, with `wait`, event wait) node's event.
    fn node_event(&self, node: u64, wait: bool) -> BResult<u64> {
        match self.state().graphs.node_work(Obj(node))? {
            Work::Event { event, wait: w } if *w == wait => Ok(*event),
            _ => Err(err(CuError::INVALID_VALUE, "not an event node of that kind")),
        }
    }

    fn write_value(&self, ctx: u64, stream: u64, addr: u64, bytes: &[u8]) -> BResult<()> {
        let mut s = self.state();
        s.stream(Obj(ctx), Obj(stream))?;
        s.graphs.refuse(Obj(stream), CuError::NOT_SUPPORTED, "the emulated device captures no memory operations")?;
        s.memory.write(addr, bytes).map_err(|e| err(e, format!("{addr:#x} is no memory of the device")))
    }

    /// The device runs every stream's work as it comes, so a wait is met
    /// now or never: one that is not is refused rather than hanging.
    fn wait_value(&self, ctx: u64, stream: u64, addr: u64, value: u64, flags: u32, size: usize) -> BResult<()> {
        let mut s = self.state();
        s.stream(Obj(ctx), Obj(stream))?;
        s.graphs.refuse(Obj(stream), CuError::NOT_SUPPORTED, "the emulated device captures no memory operations")?;
        let mut bytes = [0u8; 8];
        s.memory.read(addr, &mut bytes[..size]).map_err(|e| err(e, format!("{addr:#x} is no memory of the device")))?;
        let now = u64::from_le_bytes(bytes);
        let met = match flags & !WAIT_FLUSH {
            WAIT_GEQ if size == 4 => (now as u32).wrapping_sub(value as u32) as i32 >= 0,
            WAIT_GEQ => now.wrapping_sub(value) as i64 >= 0,
            WAIT_EQ => now == value,
            WAIT_AND => now & value != 0,
            WAIT_NOR => !(now | value) & (u64::MAX >> (64 - 8 * size)) != 0,
            _ => return Err(err(CuError::INVALID_VALUE, format!("wait flags {flags:#x}"))),
        };
        if !met {
            return Err(err(CuError::NOT_SUPPORTED, "a wait the emulated device's memory does not meet yet"));
        }
        Ok(())
    }
}

/// `CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE`.
const SHARED_MEM_FOUR_BYTE_BANKS: i32 = 1;

/// A bank size a program may ask for: default, four or eight bytes.
fn bank_config(config: i32) -> BResult<()> {
    match config {
        0..=2 => Ok(()),
        _ => Err(err(CuError::INVALID_VALUE, "unknown shared memory bank size")),
    }
}
