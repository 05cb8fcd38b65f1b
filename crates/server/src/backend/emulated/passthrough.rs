//! The API table's `pass` rows the test device models. The rest answer
//! CUDA_ERROR_NOT_SUPPORTED (`Passthrough`'s defaults).

use gpuplex_protocol::{CuError, Passthrough};

use super::graph::Work;
use super::{err, BResult, Emulated, Obj};

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

    /// The test device instantiates with no flags only.
    fn cuGraphExecGetFlags(&self, _ctx: u64, exec: u64) -> BResult<u64> {
        self.state().graphs.exec_work(Obj(exec)).map(|_| 0)
    }
}
