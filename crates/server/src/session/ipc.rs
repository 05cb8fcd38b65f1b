//! Interprocess (IPC) handles: device memory and events one process of a
//! tenant shares with another. A handle is the driver's own; each one a
//! session gives out is recorded in its tenant's ledger, and a session opens
//! only handles recorded there, so no tenant reaches another's memory or
//! events through a handle it learned or made up. Opened memory is a region
//! of the session's, charged to the tenant that allocated it; the session
//! closes what it still has open when it ends.

use gpuplex_protocol::calls::*;
use gpuplex_protocol::{calls, CallError, DevPtr, Event, IpcCalls};

use super::tables::{Entry, Kind, Owner, Region};
use super::{invalid, Session};
use crate::ledger::IpcHandle;

type R<T> = Result<T, CallError>;

fn handle_of(bytes: &[u8]) -> R<IpcHandle> {
    bytes.try_into().map_err(|_| invalid("an IPC handle is 64 bytes"))
}

impl Session {
    /// A tenant's handle, or the error the driver gives one it does not know.
    fn tenants_handle(&self, bytes: &[u8]) -> R<IpcHandle> {
        let handle = handle_of(bytes)?;
        if !self.account.ledger().gave_ipc(&handle) {
            return Err(invalid("not an IPC handle this tenant's sessions gave out"));
        }
        Ok(handle)
    }

    pub(super) fn ipc_get_mem_handle(&mut self, req: IpcGetMemHandle::Request) -> R<IpcGetMemHandle::Reply> {
        // The base of one of the session's own allocations, as the driver requires.
        let region = self.tables.region_at(req.dptr.0).filter(|r| r.owner.is_none());
        let region = region.ok_or_else(|| invalid("not the base of an allocation of the session's"))?;
        let ctx = self.ctx_obj(region.ctx)?;
        let handle = self.backend.ipc_get_mem_handle(ctx, req.dptr.0)?;
        self.account.ledger().record_ipc(&handle);
        Ok(IpcGetMemHandle::Reply { handle: handle.to_vec() })
    }

    pub(super) fn ipc_open_mem_handle(&mut self, req: IpcOpenMemHandle::Request) -> R<IpcOpenMemHandle::Reply> {
        let handle = self.tenants_handle(&req.handle)?;
        let (h, ctx) = self.current_ctx()?;
        let (dptr, size) = self.backend.ipc_open_mem_handle(ctx, &handle, req.flags)?;
        self.tables.add_region(dptr, Region { size, ctx: h, owner: Some(Owner::Ipc) });
        Ok(IpcOpenMemHandle::Reply { dptr: DevPtr(dptr) })
    }

    pub(super) fn ipc_close_mem_handle(&mut self, req: cuIpcCloseMemHandle::Request) -> R<cuIpcCloseMemHandle::Reply> {
        let region = self.tables.region_at(req.dptr.0).filter(|r| r.owner == Some(Owner::Ipc));
        let region = region.ok_or_else(|| invalid("not memory the session opened from an IPC handle"))?;
        let ctx = self.ctx_obj(region.ctx)?;
        self.backend.ipc_close_mem_handle(ctx, req.dptr.0)?;
        self.tables.remove_region(req.dptr.0);
        Ok(cuIpcCloseMemHandle::Reply {})
    }

    pub(super) fn ipc_get_event_handle(&mut self, req: IpcGetEventHandle::Request) -> R<IpcGetEventHandle::Reply> {
        let (ctx, event) = self.event(req.event)?;
        let handle = self.backend.ipc_get_event_handle(ctx, event)?;
        self.account.ledger().record_ipc(&handle);
        Ok(IpcGetEventHandle::Reply { handle: handle.to_vec() })
    }

    pub(super) fn ipc_open_event_handle(&mut self, req: IpcOpenEventHandle::Request) -> R<IpcOpenEventHandle::Reply> {
        let handle = self.tenants_handle(&req.handle)?;
        let (h, ctx) = self.current_ctx()?;
        let event = self.backend.ipc_open_event_handle(ctx, &handle)?;
        let event = self.tables.add(Kind::Event, Entry { obj: event, ctx: h, owner: Owner::Ctx(h) });
        Ok(IpcOpenEventHandle::Reply { event: Event(event) })
    }

    /// Closes the memory the session still has open, before its contexts go.
    pub(super) fn close_ipc(&mut self) {
        for (base, region) in self.tables.regions_owned_by(Owner::Ipc) {
            match self.ctx_obj(region.ctx) {
                Ok(ctx) => {
                    if let Err(e) = self.backend.ipc_close_mem_handle(ctx, base) {
                        tracing::debug!("teardown: IPC memory at {base:#x} not closed: {e}");
                    }
                }
                Err(_) => continue,
            }
            self.tables.remove_region(base);
        }
    }
}

#[allow(non_snake_case)]
impl IpcCalls for Session {
    fn IpcGetMemHandle(&mut self, req: calls::IpcGetMemHandle::Request) -> R<calls::IpcGetMemHandle::Reply> {
        self.ipc_get_mem_handle(req)
    }

    fn IpcOpenMemHandle(&mut self, req: calls::IpcOpenMemHandle::Request) -> R<calls::IpcOpenMemHandle::Reply> {
        self.ipc_open_mem_handle(req)
    }

    fn cuIpcCloseMemHandle(
        &mut self,
        req: calls::cuIpcCloseMemHandle::Request,
    ) -> R<calls::cuIpcCloseMemHandle::Reply> {
        self.ipc_close_mem_handle(req)
    }

    fn IpcGetEventHandle(&mut self, req: calls::IpcGetEventHandle::Request) -> R<calls::IpcGetEventHandle::Reply> {
        self.ipc_get_event_handle(req)
    }

    fn IpcOpenEventHandle(&mut self, req: calls::IpcOpenEventHandle::Request) -> R<calls::IpcOpenEventHandle::Reply> {
        self.ipc_open_event_handle(req)
    }
}
