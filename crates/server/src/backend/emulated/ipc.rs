//! Memory and events shared between processes by handle.

use gpuplex_protocol::CuError;

use super::{err, ipc_handle, Emulated, Owner, CU_EVENT_INTERPROCESS};
use crate::backend::{BResult, Ipc, Obj};
use crate::ledger::IpcHandle;

impl Ipc for Emulated {
    /// An allocation's handle names it by address; opening one is another
    /// worker's business, which the test device of one worker cannot do.
    fn ipc_get_mem_handle(&self, ctx: Obj, dptr: u64) -> BResult<IpcHandle> {
        let mut s = self.state();
        s.ctx(ctx)?;
        if !matches!(s.memory.owner(dptr), Some(Owner::Alloc { .. })) {
            return Err(err(CuError::INVALID_VALUE, "not the base of an allocation"));
        }
        Ok(ipc_handle(1, dptr))
    }

    fn ipc_open_mem_handle(&self, _ctx: Obj, _handle: &IpcHandle, _flags: u32) -> BResult<(u64, u64)> {
        Err(err(CuError::NOT_SUPPORTED, "the emulated device of one worker cannot map another's memory"))
    }

    fn ipc_close_mem_handle(&self, _ctx: Obj, _dptr: u64) -> BResult<()> {
        Err(err(CuError::NOT_SUPPORTED, "the emulated device opens no IPC memory"))
    }

    fn ipc_get_event_handle(&self, ctx: Obj, event: Obj) -> BResult<IpcHandle> {
        let mut s = self.state();
        s.ctx(ctx)?;
        match s.events.get(&event.0) {
            Some(e) if e.flags & CU_EVENT_INTERPROCESS != 0 => Ok(ipc_handle(2, event.0)),
            _ => Err(err(CuError::INVALID_VALUE, "not an event made for interprocess use")),
        }
    }

    fn ipc_open_event_handle(&self, _ctx: Obj, _handle: &IpcHandle) -> BResult<Obj> {
        Err(err(CuError::NOT_SUPPORTED, "the emulated device of one worker cannot reach another's events"))
    }
}
