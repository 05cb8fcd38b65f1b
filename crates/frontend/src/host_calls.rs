//! Host functions the server's driver runs in this process: a graph's host
//! nodes, and host functions launched into a capturing stream. Each is
//! registered here under a number, which is all the server holds; a thread
//! of its own answers the server's `HostCall`s, on a connection opened for
//! them at the first registration, by running the function numbered.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use gpuplex_protocol::{codec, CuError, Header, HostCallRun, Opcode};
use gpuplex_transport::Carrier;

use crate::{client, log};

pub type HostFn = unsafe extern "C" fn(*mut c_void);

/// Registered functions and their data (an address, kept as a number).
static FNS: Mutex<Option<HashMap<u64, (HostFn, usize)>>> = Mutex::new(None);
static NEXT: AtomicU64 = AtomicU64::new(1);
/// Each function and data's number.
static NUMBERS: Mutex<Option<HashMap<(usize, usize), u64>>> = Mutex::new(None);
static OPENED: OnceLock<Result<(), CuError>> = OnceLock::new();

fn fns<T>(f: impl FnOnce(&mut HashMap<u64, (HostFn, usize)>) -> T) -> T {
    f(FNS.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert_with(HashMap::new))
}

/// The number the server knows `f(data)` by: the same each time the same
/// function and data come, so that the server keeps one record for them.
pub fn register(f: HostFn, data: *mut c_void) -> Result<u64, CuError> {
    (*OPENED.get_or_init(open))?;
    let mut numbers = NUMBERS.lock().unwrap_or_else(PoisonError::into_inner);
    let id = *numbers.get_or_insert_with(HashMap::new).entry((f as usize, data as usize)).or_insert_with(|| {
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        fns(|m| m.insert(id, (f, data as usize)));
        id
    });
    Ok(id)
}

/// What number `id` runs, if registered.
pub fn registered(id: u64) -> Option<(HostFn, *mut c_void)> {
    fns(|m| m.get(&id).map(|&(f, data)| (f, data as *mut c_void)))
}

fn open() -> Result<(), CuError> {
    let carrier = client::lock()?.open_host_calls()?;
    std::thread::Builder::new().name("gpuplex-host-calls".into()).spawn(move || serve(carrier)).map(drop).map_err(|e| {
        log::warn(&format!("no thread for host functions: {e}"));
        CuError::OUT_OF_MEMORY
    })
}

/// Runs what the server asks for until the connection ends (with the session).
fn serve(mut carrier: Box<dyn Carrier>) {
    gpuplex_transport::block_sigpipe_on_this_thread();
    let mut buf = Vec::new();
    while let Ok(header) = carrier.recv(&mut buf) {
        if header.opcode.get() != Opcode::HostCall as u16 {
            return log::warn("the server sent something other than a host call; host functions end");
        }
        let Ok(call) = codec::decode::<HostCallRun>(&buf) else {
            return log::warn("an undecodable host call; host functions end");
        };
        let posted = header.is_posted();
        match registered(call.id) {
            // A user object's destructor: no stream's work is before or
            // after it, and the server waits for no answer.
            // SAFETY: the program's function and data, as it gave them.
            Some((f, data)) if posted => unsafe { f(data) },
            Some((f, data)) => {
                // The function sees what the graph's copies wrote to ordinary
                // memory, and the graph's copies after it see what it wrote.
                crate::memory::mirrors::from_device();
                // SAFETY: the program's function and data, run as CUDA runs a
                // host function: after the work before it, before the work after.
                unsafe { f(data) };
                crate::memory::mirrors::to_device();
            }
            None => {}
        }
        if !posted && carrier.send(&Header::reply(&header, 0, 0), &[]).is_err() {
            return;
        }
    }
}
