//! User objects: a program's object with a destructor, kept alive by the
//! references the program and its graphs hold, which the driver counts.
//! The destructor is a host function of the guest's; when the driver
//! destroys the object, it calls [`destroyed`] on a thread of its own,
//! which marks the object gone and posts the guest its destructor without
//! waiting (the driver's thread must not block).
//!
//! The session names each object by a handle of its own. Once the object is
//! gone the handle names nothing: a call naming it is refused instead of
//! reaching the driver with a freed object.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use gpuplex_protocol::calls::UserObjectCreate;
use gpuplex_protocol::{CallError, CuError, UserObject as Handle};

use super::host_calls::{self, HostCalls};
use super::Session;
use crate::backend::{HostFn, Obj};

/// User objects one session may make.
const MAX_USER_OBJECTS: usize = 1 << 16;

/// A user object of the session's.
pub struct UserObject {
    obj: Obj,
    calls: Arc<HostCalls>,
    /// The guest's number for its destructor.
    destroy: u64,
    alive: AtomicBool,
}

/// What the driver calls when it destroys a user object.
///
/// # Safety
/// `data` is a [`UserObject`] that outlives the call: the session keeps
/// every one it made for its whole life, and longer where the driver may
/// still hold them.
unsafe extern "C" fn destroyed(data: *mut c_void) {
    // SAFETY: per this function's contract.
    let object = unsafe { &*data.cast::<UserObject>() };
    object.alive.store(false, Ordering::Release);
    object.calls.post(object.destroy);
}

impl Session {
    pub(super) fn user_object_create(
        &mut self,
        req: UserObjectCreate::Request,
    ) -> Result<UserObjectCreate::Reply, CallError> {
        let calls = self.host_calls.clone().filter(|c| c.connected()).ok_or_else(host_calls::not_connected)?;
        if self.user_objects.len() >= MAX_USER_OBJECTS {
            return Err(CallError::new(CuError::OUT_OF_MEMORY, "too many user objects in one session"));
        }
        // Boxed in an Arc before the driver sees it, so its address holds.
        let mut object =
            Arc::new(UserObject { obj: Obj(0), calls, destroy: req.destroy, alive: AtomicBool::new(true) });
        let f = HostFn { run: destroyed, data: Arc::as_ptr(&object).cast_mut().cast() };
        let obj = self.backend.user_object_create(f, req.initialRefcount, req.flags)?;
        Arc::get_mut(&mut object).expect("not shared yet").obj = obj;
        let handle = self.tables.issue();
        self.user_objects.insert(handle, object);
        Ok(UserObjectCreate::Reply { object: Handle(handle) })
    }

    /// The driver's object a guest's handle names, while it lives.
    pub(super) fn user_object(&self, handle: u64) -> Result<Obj, CallError> {
        match self.user_objects.get(&handle) {
            Some(o) if o.alive.load(Ordering::Acquire) => Ok(o.obj),
            Some(_) => Err(CallError::new(CuError::INVALID_VALUE, "the user object was destroyed")),
            None => Err(CallError::new(CuError::INVALID_VALUE, format!("unknown user object {handle:#x}"))),
        }
    }
}
