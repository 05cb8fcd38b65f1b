//! The API table's `pass` rows the test device models: graph memory's
//! queries, and nodes turned off in an executable graph. The rest answer
//! CUDA_ERROR_NOT_SUPPORTED (`Passthrough`'s defaults).

use gpuplex_protocol::{CuError, Passthrough};

use super::graph::Work;
use super::{err, BResult, Emulated, Obj};

#[allow(non_snake_case)]
impl Passthrough for Emulated {
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
