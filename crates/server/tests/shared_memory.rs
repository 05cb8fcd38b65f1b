//! Shared memory against a live server on the emulated backend: rings,
//! staging slots and pinned host blocks, copies at and past their edges,
//! a client vanishing with frames on the rings, and a peer that lies on
//! the rings' counters.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

use gpuplex_protocol::calls::*;
use gpuplex_protocol::{CuError, DevPtr, Header, Opcode, SharedLayout, Stream};
use gpuplex_transport::shm::Region;
use proptest::prelude::*;

mod common;

use common::*;

#[test]
fn calls_and_staged_copies_work_over_shared_memory() {
    let address = start_server("shared");
    let mut c = Client::connect(&address);
    let (region, layout) = c.share_memory();
    let slot_bytes = layout.slot_bytes;
    assert!(layout.slots >= 4 && slot_bytes >= 4096);
    assert!(ring_layout(&layout).total() <= region.len());

    // Plain calls through the rings, larger than one ring for the read.
    let p = c.alloc(8 << 20);
    let inline = pattern(1000, 1);
    c.write(p, &inline);
    assert_eq!(c.read(p, 1000), inline);
    let big = c.read(p, layout.ring_bytes + 4096);
    assert_eq!(big.len() as u64, layout.ring_bytes + 4096);

    // Staged: slot 3, not at its start.
    let (slot, n) = (3u64, 100_000usize);
    let offset = slot * slot_bytes + 16;
    let staged = pattern(n, 7);
    poke(&region, ring_layout(&layout).staging_offset() + offset as usize, &staged);
    let dst = DevPtr(p.0 + 4096);
    let copy = |block: u64, offset: u64, size: u64| MemcpyHtoDShared::Request {
        dst,
        block,
        offset,
        size,
        stream: Stream::NULL,
        sync: false,
    };
    c.call(copy(0, offset, n as u64)).unwrap();
    c.call(StagingWait::Request { slot: slot as u32 }).unwrap();
    assert_eq!(c.read(dst, n as u64), staged);

    // And back out through slot 5.
    let back = 5 * slot_bytes;
    c.call(MemcpyDtoHShared::Request {
        src: dst,
        block: 0,
        offset: back,
        size: n as u64,
        stream: Stream::NULL,
        sync: false,
    })
    .unwrap();
    c.call(StagingWait::Request { slot: 5 }).unwrap();
    assert_eq!(peek(&region, ring_layout(&layout).staging_offset() + back as usize, n), staged);

    // Ranges the client may not name.
    let staging = slot_bytes * layout.slots as u64;
    assert_eq!(err(c.call(copy(0, slot_bytes - 8, 16))), CuError::INVALID_VALUE, "across a slot boundary");
    assert_eq!(err(c.call(copy(0, staging, 1))), CuError::INVALID_VALUE, "past the staging area");
    assert_eq!(err(c.call(copy(0, u64::MAX - 4, 16))), CuError::INVALID_VALUE, "offset + size overflows");
    assert_eq!(err(c.call(copy(0, u64::MAX, 1))), CuError::INVALID_VALUE, "offset + size overflows");
    assert_eq!(err(c.call(copy(77, 0, 16))), CuError::INVALID_VALUE, "an unknown block");
    assert_eq!(err(c.call(StagingWait::Request { slot: layout.slots })), CuError::INVALID_VALUE);
    let twice = Header::request(Opcode::SharedMemory, 1000, c.ctx.0, 0);
    c.carrier.send(&twice, &[]).unwrap();
    let h = c.carrier.recv(&mut Vec::new()).unwrap();
    assert_eq!((h.request_id.get(), h.status.get()), (1000, CuError::INVALID_VALUE.0), "shared twice");

    // Refusals end nothing.
    assert_eq!(c.read(p, 1000), inline);
}

#[test]
fn staging_needs_shared_memory() {
    let address = start_server("no-staging");
    let mut c = Client::connect(&address);
    let p = c.alloc(64);
    let copy = MemcpyHtoDShared::Request { dst: p, block: 0, offset: 0, size: 8, stream: Stream::NULL, sync: true };
    assert_eq!(err(c.call(copy)), CuError::INVALID_VALUE);
    assert_eq!(err(c.call(StagingWait::Request { slot: 0 })), CuError::INVALID_VALUE);
}

/// A staged copy of no bytes where the staging area ends (block 0, offset
/// 16 MiB) once indexed a ninth slot of eight and killed its session. It
/// is an empty range, copied as nothing; a byte there, offsets past it and
/// slots that do not exist are CUDA errors; the session and the server go on.
#[test]
fn staged_copies_at_and_past_the_staging_area_s_end_are_answered_cleanly() {
    let address = start_server("staged-edges");
    let mut bystander = Client::connect(&address);
    let q = bystander.alloc(64);
    let mut c = Client::connect(&address);
    let (_region, layout) = c.share_memory();
    let staging = layout.slot_bytes * layout.slots as u64;
    let p = c.alloc(64);
    let dtoh = |src: DevPtr, offset: u64, size: u64| MemcpyDtoHShared::Request {
        block: 0,
        offset,
        src,
        size,
        stream: Stream::NULL,
        sync: true,
    };
    let htod = |dst: DevPtr, offset: u64, size: u64| MemcpyHtoDShared::Request {
        dst,
        block: 0,
        offset,
        size,
        stream: Stream::NULL,
        sync: true,
    };
    c.call(dtoh(p, staging, 0)).unwrap();
    c.call(htod(p, staging, 0)).unwrap();
    for (offset, size) in [(staging, 1), (staging - 1, 2), (staging + 1, 0), (u64::MAX, 0), (u64::MAX, 1)] {
        assert_eq!(err(c.call(dtoh(p, offset, size))), CuError::INVALID_VALUE, "{size} bytes at {offset}");
        assert_eq!(err(c.call(htod(p, offset, size))), CuError::INVALID_VALUE, "{size} bytes at {offset}");
    }
    for slot in [layout.slots, u32::MAX] {
        assert_eq!(err(c.call(StagingWait::Request { slot })), CuError::INVALID_VALUE, "slot {slot}");
    }
    // No bytes, but to and from memory the session does not hold.
    assert_eq!(err(c.call(dtoh(q, 0, 0))), CuError::INVALID_VALUE);
    assert_eq!(err(c.call(htod(DevPtr(0x1234), 0, 0))), CuError::INVALID_VALUE);
    c.write(p, &[6; 64]);
    assert_eq!(c.read(p, 64), vec![6; 64]);
    bystander.alloc(64);
}

/// Random blocks, offsets, sizes and slots for the shared-memory copies
/// and `StagingWait`, weighted towards the edges of slots, of the staging
/// area and of a host block: each call is answered, with success or
/// INVALID_VALUE, and the session goes on.
#[test]
fn random_shared_copies_never_hurt_the_server() {
    let address = start_server("shared-fuzz");
    let mut c = Client::connect(&address);
    let (_region, layout) = c.share_memory();
    let host = c.call(HostAlloc::Request { size: 1 << 16, flags: 0, at: 0, mirror: false }).unwrap();
    let _block = Region::open(c.carrier.recv_fd().unwrap()).unwrap();
    let (slot, slots) = (layout.slot_bytes, layout.slots);
    let staging = slot * slots as u64;
    // Room for any staged copy and a host block's, so that the device
    // range passes and the host range is what is checked.
    let p = c.alloc(2 * staging);
    let block = prop_oneof![Just(0), Just(host.block), Just(host.block + 1), any::<u64>()];
    let edge = (0..=slots as u64 + 1, -2i64..=2).prop_map(move |(k, d)| (k * slot).wrapping_add_signed(d));
    let offset = prop_oneof![edge, Just(staging), Just(1 << 16), 0..=staging + 2, any::<u64>()];
    let size = prop_oneof![Just(0), Just(1), Just(slot), 0..=2 * slot, Just(1 << 16), any::<u64>()];
    let wait = prop_oneof![0..=slots + 1, any::<u32>()];
    let cases = (block, offset, size, wait, any::<bool>());
    let c = std::cell::RefCell::new(c);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig { cases: 256, ..ProptestConfig::default() });
    let outcome = runner.run(&cases, |(block, offset, size, slot, to_device)| {
        let mut c = c.borrow_mut();
        let stream = Stream::NULL;
        let copied = if to_device {
            let req = MemcpyHtoDShared::Request { dst: p, block, offset, size, stream, sync: false };
            c.call(req).map(|_| ())
        } else {
            let req = MemcpyDtoHShared::Request { block, offset, src: p, size, stream, sync: false };
            c.call(req).map(|_| ())
        };
        prop_assert!(matches!(copied, Ok(()) | Err(CuError::INVALID_VALUE)), "{copied:?}");
        let waited = c.call(StagingWait::Request { slot }).map(|_| ());
        prop_assert!(matches!(waited, Ok(()) | Err(CuError::INVALID_VALUE)), "{waited:?}");
        prop_assert!(c.free_memory() > 0);
        Ok(())
    });
    if let Err(e) = outcome {
        panic!("{e}");
    }
}

#[test]
fn host_blocks_are_shared_until_freed() {
    let address = start_server("host-blocks");
    let mut c = Client::connect(&address);
    let _shared = c.share_memory();
    let size = 1u64 << 16;
    let host = c.call(HostAlloc::Request { size, flags: 0, at: 0, mirror: false }).unwrap();
    assert_ne!(host.block, 0, "block 0 is the staging area");
    // The descriptor follows the reply.
    let block = Region::open(c.carrier.recv_fd().unwrap()).unwrap();
    assert_eq!(block.len() as u64, size);

    let p = c.alloc(size);
    let data = pattern(5000, 3);
    poke(&block, 4096, &data);
    let copy = |block: u64, offset: u64, len: u64| MemcpyHtoDShared::Request {
        dst: p,
        block,
        offset,
        size: len,
        stream: Stream::NULL,
        sync: true,
    };
    c.call(copy(host.block, 4096, data.len() as u64)).unwrap();
    assert_eq!(c.read(p, data.len() as u64), data, "the server sees what the client wrote");
    assert_eq!(c.read(DevPtr(host.devptr.0 + 4096), data.len() as u64), data, "through its device address");

    let out = pattern(300, 9);
    c.write(p, &out);
    c.call(MemcpyDtoHShared::Request {
        src: p,
        block: host.block,
        offset: 100,
        size: 300,
        stream: Stream::NULL,
        sync: true,
    })
    .unwrap();
    assert_eq!(peek(&block, 100, 300), out, "the client sees what the server wrote");

    assert_eq!(err(c.call(copy(host.block, size - 8, 16))), CuError::INVALID_VALUE, "past the block's end");
    assert_eq!(err(c.call(copy(host.block, u64::MAX - 4, 16))), CuError::INVALID_VALUE, "overflow");
    assert_eq!(err(c.call(HostAlloc::Request { size: 0, flags: 0, at: 0, mirror: false })), CuError::INVALID_VALUE);

    c.call(HostFree::Request { block: host.block }).unwrap();
    assert_eq!(err(c.call(copy(host.block, 4096, 16))), CuError::INVALID_VALUE, "freed");
    assert_eq!(err(c.call(HostFree::Request { block: host.block })), CuError::INVALID_VALUE, "freed twice");
    assert_eq!(
        err(c.call(MemcpyDtoH::Request { src: host.devptr, size: 16, stream: Stream::NULL, sync: true })),
        CuError::INVALID_VALUE,
        "its device address died with it"
    );
}

#[test]
fn a_client_vanishing_with_frames_on_the_rings_leaves_nothing_behind() {
    let address = start_server("vanish-rings");
    let mut observer = Client::connect(&address);
    let before = observer.free_memory();
    let mut doomed = Client::connect(&address);
    let _shared = doomed.share_memory();
    doomed.alloc(1 << 30);
    doomed.call(HostAlloc::Request { size: 1 << 16, flags: 0, at: 0, mirror: false }).unwrap();
    let _block = doomed.carrier.recv_fd().unwrap();
    assert!(observer.free_memory() <= before - (1 << 30));
    // Requests whose replies no one will read.
    for _ in 0..16 {
        doomed.send(cuMemAlloc_v2::Request { bytesize: 1 << 20 }, false);
    }
    drop(doomed);
    wait_for("the dead client's memory to be freed", || observer.free_memory() == before);
    wait_for("the session to leave the registry", || summary(&address).sessions.0.len() == 1);
}

/// Offsets in a connection region of each ring's counters (`RingControl`:
/// six 64-byte lines, head first, then tail); ring 0 runs client to server.
const CONTROL: usize = 6 * 64;

/// A client that lies on a ring's counters ends its own session only.
/// `then_call`: the liar makes a call after lying (for a lie the server
/// sees only when it writes).
fn lying_on_the_rings_ends_only_the_liar(name: &str, then_call: bool, lie: impl FnOnce(&Region, &SharedLayout)) {
    let address = start_server(name);
    let mut good = Client::connect(&address);
    let p = good.alloc(64);
    let before = good.free_memory();
    let mut liar = Client::connect(&address);
    let (region, layout) = liar.share_memory();
    // Larger than a ring, so that answering it makes the server look at the
    // reader's counter again (it trusts the last one seen while it leaves room).
    let big = 2 * layout.ring_bytes;
    let src = liar.alloc(big);
    lie(&region, &layout);
    if then_call {
        liar.send(MemcpyDtoH::Request { src, size: big, stream: Stream::NULL, sync: true }, false);
    }
    // Read only once it has ended: reading would publish the true tail.
    wait_for("the liar's session to end", || summary(&address).sessions.0.len() == 1);
    let mut buf = Vec::new();
    let start = Instant::now();
    while liar.carrier.recv(&mut buf).is_ok() {
        assert!(start.elapsed() < Duration::from_secs(2), "the liar's connection stays open");
    }
    wait_for("the liar's memory to be freed", || good.free_memory() == before);
    good.write(p, &[9; 64]);
    assert_eq!(good.read(p, 64), vec![9; 64]);
    let mut newcomer = Client::connect(&address);
    newcomer.share_memory();
    newcomer.alloc(1 << 20);
}

/// The counter at `at` in the region's control page.
fn counter(region: &Region, at: usize) -> &AtomicU64 {
    assert!(at % 8 == 0 && at + 8 <= 4096 && region.len() >= 4096);
    // SAFETY: an aligned u64 in the mapped control page, which both sides
    // only ever access atomically.
    unsafe { &*region.as_ptr().add(at).cast::<AtomicU64>() }
}

#[test]
fn a_head_past_capacity_ends_only_the_liar_s_session() {
    // No call after: the liar's own writer would publish its true head.
    lying_on_the_rings_ends_only_the_liar("lying-head", false, |region, layout| {
        let head = counter(region, 0);
        head.store(head.load(SeqCst) + 3 * layout.ring_bytes, SeqCst);
    });
}

#[test]
fn a_tail_past_the_head_ends_only_the_liar_s_session() {
    lying_on_the_rings_ends_only_the_liar("lying-tail", true, |region, layout| {
        let tail = counter(region, CONTROL + 64);
        tail.store(tail.load(SeqCst).wrapping_sub(2 * layout.ring_bytes), SeqCst);
    });
}

/// Any opcode with any payload ends in an answer or a closed session,
/// and the server keeps serving others.
#[test]
fn random_frames_never_hurt_the_server() {
    let address = start_server("fuzz");
    let frames = (0u16..0x700, proptest::collection::vec(any::<u8>(), 0..256));
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig { cases: 64, ..ProptestConfig::default() });
    let outcome = runner.run(&frames, |(op, payload)| {
        let mut c = Client::connect(&address);
        let mut h = Header::request(Opcode::Hello, 9, c.ctx.0, payload.len());
        h.opcode = op.into();
        let _ = c.carrier.send(&h, &payload);
        let _ = c.carrier.recv(&mut Vec::new());
        let mut other = Client::connect(&address);
        prop_assert!(other.free_memory() > 0);
        Ok(())
    });
    if let Err(e) = outcome {
        panic!("{e}");
    }
}

/// A remote guest's mapped pinned memory: a block of the server's that the
/// guest's runs write, whose device-written bytes come before the reply to
/// the next waited device call, once, and whose bad runs are refused
/// without touching it.
#[test]
fn mapped_blocks_take_the_guests_runs_and_return_the_devices() {
    use gpuplex_protocol::{MappedRun, Seq};
    let address = start_server("mapped");
    let mut c = Client::connect(&address);
    let mapped = c.call(HostMirror::Request { size: 8192, at: 0 }).unwrap();
    let run = |offset: u64, data: &[u8]| MappedRun { block: mapped.block, offset, data: data.to_vec() };

    // The guest's bytes reach the device through the block's address.
    c.call(MappedWrite::Request { runs: Seq(vec![run(100, b"guest"), run(8190, b"!!")]) }).unwrap();
    let dev = c.alloc(8192);
    let copy =
        |dst: DevPtr, src: DevPtr| MemcpyDtoD::Request { dst, src, size: 8192, stream: Stream::NULL, sync: true };
    c.call(copy(dev, mapped.devptr)).unwrap();
    let seen = c.read(dev, 8192);
    assert_eq!((&seen[100..105], &seen[8190..]), (&b"guest"[..], &b"!!"[..]));
    assert!(c.mapped.is_empty(), "what the guest wrote is not sent back");

    // The device's bytes come back once, as runs of what changed, before
    // the reply to the call that wrote them.
    c.write(DevPtr(dev.0 + 4000), b"device");
    c.call(copy(mapped.devptr, dev)).unwrap();
    assert_eq!(std::mem::take(&mut c.mapped), vec![run(4000, b"device")]);
    c.call(cuCtxSynchronize::Request {}).unwrap();
    assert!(c.mapped.is_empty(), "agreed once sent");

    // Runs outside the block, or of a block not mapped, are refused.
    for bad in
        [run(8191, b"ab"), run(u64::MAX, b"a"), run(8193, b""), MappedRun { block: 77, offset: 0, data: vec![1] }]
    {
        assert_eq!(err(c.call(MappedWrite::Request { runs: Seq(vec![bad]) })), CuError::INVALID_VALUE);
    }
    assert_eq!(err(c.call(HostMirror::Request { size: 2 << 30, at: 0 })), CuError::OUT_OF_MEMORY, "past the budget");
    c.call(copy(dev, mapped.devptr)).unwrap();
    assert_eq!(&c.read(dev, 8192)[8190..], b"!!", "a refused run wrote nothing");

    c.call(HostFree::Request { block: mapped.block }).unwrap();
    assert_eq!(err(c.call(MappedWrite::Request { runs: Seq(vec![run(0, b"x")]) })), CuError::INVALID_VALUE, "freed");
    c.call(cuCtxSynchronize::Request {}).unwrap();
    assert!(c.mapped.is_empty());
}

/// A remote guest's posted copies into its pinned memory: made when they
/// arrive, their bytes kept and sent, numbered in order, before the reply to
/// the next waited call that reaches the device, and only then; a copy that
/// fails is sent as one with no bytes, its error answering that call; a
/// guest that never asks cannot make the server keep more than 64 MiB or
/// 65536 copies.
#[test]
fn posted_copies_to_the_host_come_before_the_next_waited_device_reply() {
    use gpuplex_protocol::CopiedToHost;
    let address = start_server("posted-reads");
    let mut c = Client::connect(&address);
    let dev = c.alloc(4096);
    c.write(dev, &pattern(4096, 3));
    let later = |dst: u64, src: DevPtr, size: u64| MemcpyDtoHLater::Request { dst, src, size, stream: Stream::NULL };
    c.post(later(0x1000, dev, 16));
    c.call(cuCtxGetFlags::Request {}).unwrap();
    assert!(c.copied.is_empty(), "a call that does not reach the device brings none");
    c.post(later(0x2000, DevPtr(dev.0 + 100), 8));
    // Made at once: the write after them does not change them, and its
    // reply, a waited device call's, brings them.
    c.write(dev, &[0; 4096]);
    let want = pattern(4096, 3);
    assert_eq!(
        std::mem::take(&mut c.copied),
        vec![
            CopiedToHost { seq: 0, dst: 0x1000, data: want[..16].to_vec() },
            CopiedToHost { seq: 1, dst: 0x2000, data: want[100..108].to_vec() },
        ]
    );
    c.call(DeliverCopies::Request {}).unwrap();
    assert!(c.copied.is_empty(), "sent once");

    // Outside the session's memory: no bytes, and the error comes next.
    c.post(later(0x3000, DevPtr(0xdead_0000), 8));
    assert_eq!(err(c.call(cuCtxSynchronize::Request {})), CuError::INVALID_VALUE);
    assert_eq!(std::mem::take(&mut c.copied), vec![CopiedToHost { seq: 2, dst: 0x3000, data: Vec::new() }]);

    // Never asked for, the bytes stop at the budget.
    let big = c.alloc(1 << 20);
    for _ in 0..64 {
        c.post(later(0x4000, big, 1 << 20));
    }
    c.post(later(0x4000, big, 1));
    assert_eq!(err(c.call(DeliverCopies::Request {})), CuError::OUT_OF_MEMORY);
    let copied = std::mem::take(&mut c.copied);
    assert_eq!(copied.len(), 65);
    assert!(copied[..64].iter().all(|c| c.data.len() == 1 << 20) && copied[64].data.is_empty());
    assert_eq!(copied.iter().map(|c| c.seq).collect::<Vec<_>>(), (3..68).collect::<Vec<_>>());
    // Nor beyond 65536 copies, however small.
    for _ in 0..=1 << 16 {
        c.post(later(0x4000, big, 1));
    }
    assert_eq!(err(c.call(DeliverCopies::Request {})), CuError::OUT_OF_MEMORY);
    let copied = std::mem::take(&mut c.copied);
    assert_eq!(copied.len(), (1 << 16) + 1);
    assert!(copied[..1 << 16].iter().all(|c| c.data.len() == 1) && copied[1 << 16].data.is_empty());
    assert!(c.free_memory() > 0, "the session carries on");
}
