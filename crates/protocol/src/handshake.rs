//! The opening exchange, the server's status for `gpuplex status`, and the
//! frames a server sends unasked.

use crate::codec::Seq;
use crate::wire_struct;
use crate::Ctx;

wire_struct! {
    /// First frame of every connection (opcode `Hello`).
    pub struct Hello {
        pub pid: u32,
        /// The client program's name, for `gpuplex info` and logs.
        pub program: String,
    }
}

wire_struct! {
    /// One device attribute as the driver answered it: `status` is the
    /// CUresult of `cuDeviceGetAttribute`, `value` valid when it is 0.
    pub struct Attribute {
        pub status: u32,
        pub value: i32,
    }
}

wire_struct! {
    /// Everything the client answers locally about one device, fetched once.
    pub struct DeviceInfo {
        pub name: String,
        pub uuid: [u8; 16],
        pub total_mem: u64,
        pub pci_bus_id: String,
        /// Indexed by `CUdevice_attribute`, from 0 to `CU_DEVICE_ATTRIBUTE_MAX - 1`.
        pub attributes: Seq<Attribute>,
    }
}

wire_struct! {
    /// The server's answer to `Hello`.
    pub struct Welcome {
        pub session: u64,
        /// `cuda` or `emulated`.
        pub backend: String,
        pub driver_version: i32,
        pub devices: Seq<DeviceInfo>,
        /// The session's primary context handle for each device; valid
        /// (though not retained) from the start, as the driver's are.
        pub primary_contexts: Seq<Ctx>,
    }
}

wire_struct! {
    /// The reply to `SharedMemory`: how the region passed after it is laid
    /// out. Staging is `slots` slots of `slot_bytes`, for pageable copies.
    pub struct SharedLayout {
        pub ring_bytes: u64,
        pub slot_bytes: u64,
        pub slots: u32,
    }
}

wire_struct! {
    /// A VM guest's `ShareInPlace`: its staging area, `bytes` at `offset` of
    /// the region's heap, which it claimed.
    pub struct InPlace {
        pub offset: u64,
        pub bytes: u64,
    }
}

wire_struct! {
    /// Bytes one side of a mapped host block (`HostMirror`) changed since
    /// both sides last agreed: `data` at `offset` of block `block`.
    pub struct MappedRun {
        pub block: u64,
        pub offset: u64,
        pub data: Vec<u8>,
    }
}

wire_struct! {
    /// The reply to `OpenLanes`: how many lane connections to open, the key
    /// each presents in its `JoinLane`, and the bytes per chunk.
    pub struct LaneOffer {
        pub key: [u8; 32],
        pub lanes: u32,
        pub chunk_bytes: u64,
    }
}

wire_struct! {
    /// The first frame of a lane connection (opcode `JoinLane`).
    pub struct LaneJoin {
        pub key: [u8; 32],
        pub index: u32,
    }
}

/// The lane index under which a session's host-call connection joins.
pub const HOST_CALLS_LANE: u32 = u32::MAX;

wire_struct! {
    /// The reply to `OpenHostCalls`: the key the host-call connection
    /// presents in its `JoinLane`.
    pub struct HostCallsOffer {
        pub key: [u8; 32],
    }
}

wire_struct! {
    /// A `HostCall` frame: run the host function the guest registered as `id`.
    pub struct HostCallRun {
        pub id: u64,
    }
}

wire_struct! {
    /// One live session, as `gpuplex info` lists it.
    pub struct SessionSummary {
        pub id: u64,
        /// As the kernel reports them for a local peer; a remote peer has
        /// none ([`SessionSummary::NO_PID`], [`SessionSummary::NO_UID`]).
        pub pid: u32,
        pub uid: u32,
        pub program: String,
        pub contexts: u32,
        pub device_bytes: u64,
        pub calls: u64,
        pub seconds: u64,
    }
}

impl SessionSummary {
    /// The `pid` of a remote session (no process has pid 0).
    pub const NO_PID: u32 = 0;
    /// The `uid` of a remote session (`(uid_t)-1`, never a user).
    pub const NO_UID: u32 = u32::MAX;
}

wire_struct! {
    /// The reply to `ServerInfo`.
    pub struct ServerSummary {
        pub backend: String,
        pub driver_version: i32,
        pub devices: Seq<DeviceInfo>,
        pub sessions: Seq<SessionSummary>,
    }
}

wire_struct! {
    /// The reply to `Status`: the server and its tenants and sessions as the
    /// asker may see them (all of them for the server's owner, else only the
    /// asker's own tenant).
    pub struct ServerStatus {
        pub backend: String,
        pub driver_version: i32,
        pub devices: Seq<DeviceInfo>,
        /// Whether this is the whole server or one tenant's view of it.
        pub full: bool,
        pub uptime_seconds: u64,
        /// Worker processes started and ready for the next guest.
        pub idle_workers: u32,
        /// Seconds over which the rates below are measured.
        pub interval_seconds: f32,
        pub tenants: Seq<TenantStatus>,
        pub sessions: Seq<SessionStatus>,
        /// How GPU time is divided: `fair`, `fifo`, `band` or `none`.
        pub policy: String,
    }
}

wire_struct! {
    /// One tenant: the sum of its live sessions, and its settings.
    pub struct TenantStatus {
        pub name: String,
        pub sessions: u32,
        /// Device memory its sessions hold together.
        pub memory_used: u64,
        /// 0: no limit.
        pub memory_limit: u64,
        pub weight: u32,
        /// Calls of its sessions, live and ended, since the server started.
        pub calls: u64,
        pub calls_per_second: f32,
        /// The share of the last interval its work kept a GPU busy (0 to 1
        /// per GPU, summed over its sessions).
        pub gpu_busy: f32,
        /// Its priority class: `low`, `normal` or `high`.
        pub priority: String,
        /// GPU time its work took since the server started, on each GPU it
        /// used.
        pub gpu_time: Seq<GpuTime>,
        /// `isolated` (each session in a fault domain of its own) or
        /// `spatial` (sessions side by side under MPS).
        pub sharing: String,
    }
}

wire_struct! {
    /// GPU time on one GPU, as the GPU's own clock measured it.
    pub struct GpuTime {
        /// The server's ordinal of the GPU.
        pub gpu: u32,
        /// Kernels and memsets.
        pub compute_seconds: f64,
        pub copy_seconds: f64,
    }
}

wire_struct! {
    /// One live session.
    pub struct SessionStatus {
        pub id: u64,
        pub tenant: String,
        /// As the kernel reports them for a local peer; a remote peer has
        /// none ([`SessionSummary::NO_PID`], [`SessionSummary::NO_UID`]).
        pub client_pid: u32,
        pub uid: u32,
        /// The peer as the server knows it: `pid P uid U` or an address.
        pub peer: String,
        pub program: String,
        /// The process serving it.
        pub worker_pid: u32,
        pub contexts: u32,
        pub memory_used: u64,
        pub calls: u64,
        pub calls_per_second: f32,
        pub gpu_busy: f32,
        pub seconds: u64,
        /// GPU time its kernels and memsets took, and its copies.
        pub compute_seconds: f64,
        pub copy_seconds: f64,
        /// For a spatial session, the GPU whose MPS server it shares (and
        /// so whose fatal faults it shares) with the other spatial sessions
        /// there; [`SessionStatus::OWN_FAULT_DOMAIN`] for an isolated one.
        pub mps_gpu: u32,
    }
}

impl SessionStatus {
    /// `mps_gpu` of a session whose faults are its own.
    pub const OWN_FAULT_DOMAIN: u32 = u32::MAX;
}

wire_struct! {
    /// What a guest's kernels printed (device `printf` to `stream` 1,
    /// `assert` messages to 2) while the call this frame precedes ran.
    pub struct DeviceOutput {
        pub stream: u32,
        pub bytes: Vec<u8>,
    }
}

wire_struct! {
    /// What the device wrote to a guest's mapped host blocks, as runs of
    /// bytes, while the call this frame precedes ran or before.
    pub struct MappedRuns {
        pub runs: Seq<MappedRun>,
    }
}

wire_struct! {
    /// The bytes a guest's posted copy (`MemcpyDtoHLater`) brought for its
    /// pinned memory at `dst`. Copies are numbered from 0 in the order the
    /// session got them (`seq`), failed ones too, whose `data` is empty:
    /// their error answers a later call, and no bytes come.
    pub struct CopiedToHost {
        pub seq: u64,
        pub dst: u64,
        pub data: Vec<u8>,
    }
}

/// Runs of changed bytes gathered into frames' worth, each at most
/// [`MappedFrames::BYTES`] of data; a longer run is split across frames.
#[derive(Default)]
pub struct MappedFrames {
    pub frames: Vec<Vec<MappedRun>>,
    bytes: usize,
}

impl MappedFrames {
    pub const BYTES: usize = crate::MAX_PAYLOAD / 2;

    /// Adds `data`, changed at `offset` of `block`.
    pub fn add(&mut self, block: u64, offset: u64, data: &[u8]) {
        for (i, part) in data.chunks(Self::BYTES).enumerate() {
            if self.frames.is_empty() || self.bytes + part.len() > Self::BYTES {
                self.frames.push(Vec::new());
                self.bytes = 0;
            }
            self.bytes += part.len();
            let offset = offset + (i * Self::BYTES) as u64;
            let frame = self.frames.last_mut().expect("one pushed above");
            frame.push(MappedRun { block, offset, data: part.to_vec() });
        }
    }
}

wire_struct! {
    /// The payload of a failed reply.
    pub struct ErrorDetail {
        pub detail: String,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_runs_fill_frames_and_a_long_run_is_split() {
        let max = MappedFrames::BYTES;
        let mut out = MappedFrames::default();
        out.add(1, 0, &[1; 10]);
        out.add(2, 100, &vec![2; max + 5]);
        out.add(3, 7, &[3; 4]);
        let shape: Vec<Vec<(u64, u64, usize)>> =
            out.frames.iter().map(|f| f.iter().map(|r| (r.block, r.offset, r.data.len())).collect()).collect();
        assert_eq!(shape, vec![vec![(1, 0, 10)], vec![(2, 100, max)], vec![(2, 100 + max as u64, 5), (3, 7, 4)],]);
        assert!(MappedFrames::default().frames.is_empty(), "nothing changed, no frame");
    }
}
