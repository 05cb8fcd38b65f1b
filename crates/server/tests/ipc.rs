//! Interprocess handles through a live server on the emulated backend: a
//! session opens only handles its own tenant's sessions gave out. (The
//! emulated device of one worker cannot map another's memory, so opening
//! stops there with NOT_SUPPORTED; the GPU suite's `rt/ipc` maps it.)

use std::sync::Arc;

use gpuplex_protocol::calls::*;
use gpuplex_protocol::{CuError, DevPtr, Event};
use gpuplex_server::backend::emulated::Emulated;
use gpuplex_server::config::Config;
use gpuplex_server::{Placement, Supervisor};
use gpuplex_transport::Address;

mod common;

use common::*;

/// `CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING`.
const SHAREABLE: u32 = 0x4 | 0x2;

fn mem_handle(c: &mut Client, dptr: DevPtr) -> Result<Vec<u8>, CuError> {
    c.call(IpcGetMemHandle::Request { dptr }).map(|r| r.handle)
}

fn open(c: &mut Client, handle: &[u8]) -> Result<DevPtr, CuError> {
    c.call(IpcOpenMemHandle::Request { handle: handle.to_vec(), flags: 1 }).map(|r| r.dptr)
}

/// A server over loopback TCP whose two tenants are told apart by token.
fn two_tenants(dir: &std::path::Path) -> (Address, gpuplex_transport::Token, gpuplex_transport::Token) {
    let (a, b) = ("tenant a's token, thirty-two b..", "tenant b's token, thirty-two b..");
    for (name, secret) in [("a.token", a), ("b.token", b)] {
        let path = dir.join(name);
        std::fs::write(&path, secret).unwrap();
        // A token file others can read is refused.
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    }
    let text = "[tenants.a]\ntoken_file = \"a.token\"\n\n[tenants.b]\ntoken_file = \"b.token\"\n";
    let config = Config::parse(text, &dir.join("gpuplex.toml")).unwrap();
    let server = Supervisor::start(Placement::InProcess(Arc::new(Emulated::new())), config, None).unwrap();
    let listener = gpuplex_transport::listen_with_keys(&"tcp:127.0.0.1:0".parse().unwrap(), server.keys()).unwrap();
    let address = listener.address();
    std::thread::spawn(move || server.serve(listener.as_ref()));
    (address, token(a), token(b))
}

#[test]
fn a_tenant_opens_only_its_own_handles() {
    within_30_s(|| {
        let dir = std::env::temp_dir().join(format!("gpuplex-ipc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (address, a_token, b_token) = two_tenants(&dir);
        let mut a = Client::connect_with(&address, Some(&a_token));
        let mut a2 = Client::connect_with(&address, Some(&a_token));
        let mut b = Client::connect_with(&address, Some(&b_token));

        let p = a.alloc(4096);
        let handle = mem_handle(&mut a, p).unwrap();
        assert_eq!(handle.len(), 64);
        assert_eq!(err(mem_handle(&mut a, DevPtr(p.0 + 16))), CuError::INVALID_VALUE, "not an allocation's base");
        assert_eq!(err(mem_handle(&mut b, p)), CuError::INVALID_VALUE, "another session's memory");

        // The tenant's other session reaches the device with it; the other
        // tenant, and a handle nobody gave out, stop at the ledger.
        assert_eq!(err(open(&mut a2, &handle)), CuError::NOT_SUPPORTED);
        assert_eq!(err(open(&mut b, &handle)), CuError::INVALID_VALUE);
        assert_eq!(err(open(&mut a2, &[7; 64])), CuError::INVALID_VALUE);
        assert_eq!(err(open(&mut a2, &[0; 64])), CuError::INVALID_VALUE);
        assert_eq!(err(open(&mut a2, &handle[..32])), CuError::INVALID_VALUE, "a short handle");
        let close = cuIpcCloseMemHandle::Request { dptr: p };
        assert_eq!(err(a.call(close)), CuError::INVALID_VALUE, "memory not opened from a handle");

        let plain = a.call(cuEventCreate::Request { flags: 0 }).unwrap().phEvent;
        assert_eq!(err(a.call(IpcGetEventHandle::Request { event: plain })), CuError::INVALID_VALUE);
        let shared = a.call(cuEventCreate::Request { flags: SHAREABLE }).unwrap().phEvent;
        let handle = a.call(IpcGetEventHandle::Request { event: shared }).unwrap().handle;
        let open_event = |c: &mut Client| c.call(IpcOpenEventHandle::Request { handle: handle.clone() });
        assert_eq!(err(open_event(&mut a2)), CuError::NOT_SUPPORTED);
        assert_eq!(err(open_event(&mut b)), CuError::INVALID_VALUE);
        assert_eq!(err(b.call(IpcGetEventHandle::Request { event: Event(shared.0) })), CuError::INVALID_HANDLE);
        let _ = std::fs::remove_dir_all(&dir);
    });
}
