//! What the generated server side of the API table's `pass` rows asks of a
//! session: each handle, device and address a guest names, resolved or
//! checked as every hand-written call does, and the context the call runs
//! in (its first handle's, as the hand-written calls take it, else the
//! guest's current one).

use gpuplex_protocol::{CallError, CuError, Event, Func, Handle, MemPool, Passthrough, Resolver, Stream};

use crate::backend::Obj;

use super::resolve::plain_attribute;
use super::tables::Kind;
use super::Session;

/// A result naming an object the session does not hold: one made behind its
/// back cannot be given to the guest, which could not be held to account for it.
fn not_held(what: &str) -> CallError {
    CallError::new(
        CuError::NOT_SUPPORTED,
        format!("the driver answered with a handle ({what}) the session does not hold"),
    )
}

/// The session's table a kind of handle lives in; contexts, pools and user
/// objects are kept apart.
fn table_kind(kind: Handle) -> Option<Kind> {
    Some(match kind {
        Handle::Stream => Kind::Stream,
        Handle::Event => Kind::Event,
        Handle::Func => Kind::Func,
        Handle::Module => Kind::Module,
        Handle::Library => Kind::Library,
        Handle::Kernel => Kind::Kernel,
        Handle::Graph => Kind::Graph,
        Handle::GraphExec => Kind::GraphExec,
        Handle::GraphNode => Kind::GraphNode,
        Handle::Array => Kind::Array,
        Handle::Ctx | Handle::MemPool | Handle::UserObject => return None,
    })
}

impl Resolver for Session {
    fn pass_context(&mut self) -> Result<u64, CallError> {
        if self.current.0 == 0 {
            return Ok(0);
        }
        Ok(self.current_ctx()?.1 .0)
    }

    fn resolve(&mut self, kind: Handle, handle: u64, ctx: &mut u64) -> Result<u64, CallError> {
        // Objects of a context (executable graphs) run in it; the rest in none.
        let table = |kind| -> Result<(Obj, Obj), CallError> {
            let entry = self.tables.get(kind, handle)?;
            Ok((if entry.ctx == 0 { Obj(0) } else { self.ctx_of(&entry)? }, entry.obj))
        };
        let (in_ctx, obj) = match (kind, table_kind(kind)) {
            (Handle::Ctx, _) => (Obj(0), self.resolve_ctx(handle)?.1),
            (Handle::Stream, _) => self.stream(Stream(handle))?,
            (Handle::Event, _) => self.event(Event(handle))?,
            (Handle::Func, _) => self.func(Func(handle))?,
            (Handle::Module, _) => {
                let (c, entry) = self.module(handle)?;
                (c, entry.obj)
            }
            (Handle::MemPool, _) => (Obj(0), self.pool_obj(MemPool(handle))?),
            (Handle::UserObject, _) => (Obj(0), self.user_object(handle)?),
            (_, Some(k)) => table(k)?,
            (_, None) => unreachable!("every handle outside the tables is matched above"),
        };
        if *ctx == 0 {
            *ctx = in_ctx.0;
        }
        Ok(obj.0)
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

    fn resolve_launch_attr(&mut self, attr: u32) -> Result<u32, CallError> {
        plain_attribute(attr)
    }

    fn known(&mut self, kind: Handle, obj: u64) -> Result<u64, CallError> {
        let found = match (kind, table_kind(kind)) {
            (Handle::Ctx, _) => self.tables.contexts.iter().find(|(_, c)| c.obj == Some(Obj(obj))).map(|(h, _)| *h),
            (_, Some(k)) => self.tables.handle_of(k, Obj(obj)),
            // Pools and user objects are kept apart from the tables, and
            // no row answers with one.
            (_, None) => None,
        };
        found.ok_or_else(|| not_held(&format!("{kind:?}")))
    }

    fn passthrough(&self) -> &dyn Passthrough {
        self.backend.passthrough()
    }
}
