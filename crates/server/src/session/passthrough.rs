//! What the generated server side of the API table's `pass` rows asks of a
//! session: its current context, and each handle, device and address a
//! guest names, resolved or checked as every hand-written call does.

use gpuplex_protocol::{CallError, CuError, Handle, MemPool, Passthrough, Resolver, Stream};

use super::tables::Kind;
use super::Session;

impl Resolver for Session {
    fn pass_context(&mut self) -> Result<u64, CallError> {
        if self.current.0 == 0 {
            return Ok(0);
        }
        Ok(self.current_ctx()?.1 .0)
    }

    fn resolve(&mut self, kind: Handle, handle: u64) -> Result<u64, CallError> {
        let table = |kind| Ok(self.tables.get(kind, handle)?.obj.0);
        match kind {
            Handle::Ctx => Ok(self.resolve_ctx(handle)?.1 .0),
            Handle::Stream => Ok(self.stream(Stream(handle))?.1 .0),
            Handle::MemPool => Ok(self.pool_obj(MemPool(handle))?.0),
            Handle::Module => table(Kind::Module),
            Handle::Func => table(Kind::Func),
            Handle::Event => table(Kind::Event),
            Handle::Library => table(Kind::Library),
            Handle::Kernel => table(Kind::Kernel),
            Handle::Graph => table(Kind::Graph),
            Handle::GraphExec => table(Kind::GraphExec),
            Handle::GraphNode => table(Kind::GraphNode),
            Handle::Array => table(Kind::Array),
        }
    }

    fn resolve_device(&mut self, device: i32) -> Result<i32, CallError> {
        self.backend_device(device)
    }

    fn resolve_pointer(&mut self, ptr: u64) -> Result<u64, CallError> {
        match self.tables.region_containing(ptr) {
            Some(_) => Ok(ptr),
            None => Err(CallError::new(CuError::INVALID_VALUE, format!("{ptr:#x} is no memory of the session's"))),
        }
    }

    fn passthrough(&self) -> &dyn Passthrough {
        self.backend.passthrough()
    }
}
