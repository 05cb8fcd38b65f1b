//! The backend's streams and events.

use gpuplex_protocol::{CallError, CuError};

use super::{api, check, enter, graph, handle, or_older, query, raw, sync_stream, Cuda};
use crate::backend::{BResult, HostFn, Obj, Streams};

impl Streams for Cuda {
    fn stream_create(&self, ctx: Obj, flags: u32, priority: i32) -> BResult<Obj> {
        enter(ctx)?;
        // SAFETY: out-pointer to a local; plain values.
        handle(|s| unsafe { api::cuStreamCreateWithPriority(s, flags, priority) })
    }

    fn stream_destroy(&self, ctx: Obj, stream: Obj) -> BResult<()> {
        enter(ctx)?;
        // SAFETY: the stream is live.
        check(unsafe { api::cuStreamDestroy_v2(raw(stream)) })
    }

    fn stream_synchronize(&self, ctx: Obj, stream: Obj) -> BResult<()> {
        enter(ctx)?;
        sync_stream(stream)
    }

    fn stream_query(&self, ctx: Obj, stream: Obj) -> BResult<()> {
        enter(ctx)?;
        // SAFETY: the stream is live or special.
        check(unsafe { api::cuStreamQuery(raw(stream)) })
    }

    fn stream_wait_event(&self, ctx: Obj, stream: Obj, event: Obj, flags: u32) -> BResult<()> {
        enter(ctx)?;
        // SAFETY: the stream is live or special; the event is live.
        check(unsafe { api::cuStreamWaitEvent(raw(stream), raw(event), flags) })
    }

    fn stream_capture_status(&self, ctx: Obj, stream: Obj) -> BResult<u32> {
        enter(ctx)?;
        // SAFETY: the stream is live or special; out-pointer to a local (the
        // status is a C enum, an int).
        query(|p| unsafe { api::cuStreamIsCapturing(raw(stream), p) })
    }

    fn refuse_in_capture(&self, ctx: Obj, stream: Obj, what: &str) -> BResult<()> {
        match self.stream_capture_status(ctx, stream)? {
            0 => Ok(()),
            1 => {
                // Waiting for a capturing stream is refused and invalidates
                // its capture: the driver's own way to end one as failed.
                let _ = sync_stream(stream);
                Err(CallError::new(
                    CuError::STREAM_CAPTURE_UNSUPPORTED,
                    format!("{what} while the stream is capturing"),
                ))
            }
            _ => Err(CuError::STREAM_CAPTURE_INVALIDATED.into()),
        }
    }

    fn stream_id(&self, ctx: Obj, stream: Obj) -> BResult<u64> {
        enter(ctx)?;
        // SAFETY: the stream is live or special; out-pointer to a local.
        query(|id| unsafe { api::cuStreamGetId(raw(stream), id) })
    }

    fn event_create(&self, ctx: Obj, flags: u32) -> BResult<Obj> {
        enter(ctx)?;
        // SAFETY: out-pointer to a local; plain value.
        handle(|e| unsafe { api::cuEventCreate(e, flags) })
    }

    fn event_destroy(&self, ctx: Obj, event: Obj) -> BResult<()> {
        enter(ctx)?;
        // SAFETY: the event is live.
        check(unsafe { api::cuEventDestroy_v2(raw(event)) })
    }

    fn event_record(&self, ctx: Obj, event: Obj, stream: Obj, flags: u32) -> BResult<()> {
        enter(ctx)?;
        let (e, s) = (raw(event), raw(stream));
        // SAFETY: the event is live; the stream is live or special.
        check(unsafe {
            if flags == 0 {
                api::cuEventRecord(e, s)
            } else {
                api::cuEventRecordWithFlags(e, s, flags)
            }
        })
    }

    fn event_synchronize(&self, ctx: Obj, event: Obj) -> BResult<()> {
        enter(ctx)?;
        // SAFETY: the event is live.
        check(unsafe { api::cuEventSynchronize(raw(event)) })
    }

    fn event_query(&self, ctx: Obj, event: Obj) -> BResult<()> {
        enter(ctx)?;
        // SAFETY: the event is live.
        check(unsafe { api::cuEventQuery(raw(event)) })
    }

    fn event_elapsed(&self, ctx: Obj, start: Obj, end: Obj) -> BResult<f32> {
        enter(ctx)?;
        let (a, b) = (raw(start), raw(end));
        let mut ms = 0f32;
        // SAFETY: out-pointer to a local; both events are live.
        let r = unsafe { api::cuEventElapsedTime_v2(&mut ms, a, b) };
        // SAFETY: as above (`_v2` is new in driver 12.8).
        check(or_older(r, || unsafe { api::cuEventElapsedTime(&mut ms, a, b) }))?;
        Ok(ms)
    }

    fn launch_host_func(&self, ctx: Obj, stream: Obj, f: HostFn) -> BResult<()> {
        graph::launch_host_func(ctx, stream, f)
    }
}
