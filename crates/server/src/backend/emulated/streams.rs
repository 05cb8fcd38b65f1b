//! The backend's streams and events.

use std::collections::HashMap;
use std::time::Instant;

use gpuplex_protocol::CuError;

use super::{device, err, Emulated, EventState, StreamState, Work};
use crate::backend::{BResult, HostFn, Obj, Streams, CU_EVENT_DISABLE_TIMING};

impl Streams for Emulated {
    fn stream_create(&self, ctx: Obj, flags: u32, priority: i32) -> BResult<Obj> {
        let mut s = self.state();
        s.ctx(ctx)?;
        if flags > 1 {
            return Err(CuError::INVALID_VALUE.into());
        }
        let (least, greatest) = device::PRIORITY_RANGE;
        let priority = priority.clamp(greatest, least);
        let id = s.id();
        s.streams.insert(id, StreamState { ctx: ctx.0, flags, priority, attributes: HashMap::new() });
        Ok(Obj(id))
    }

    fn stream_destroy(&self, ctx: Obj, stream: Obj) -> BResult<()> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        s.streams.remove(&stream.0).map(|_| ()).ok_or_else(|| CuError::INVALID_HANDLE.into())
    }

    fn stream_synchronize(&self, ctx: Obj, stream: Obj) -> BResult<()> {
        let s = &mut *self.state();
        s.stream(ctx, stream)?;
        s.graphs.refuse(stream, CuError::STREAM_CAPTURE_UNSUPPORTED, "a wait for the stream")?;
        s.pools.release(&mut s.memory);
        Ok(())
    }

    fn stream_query(&self, ctx: Obj, stream: Obj) -> BResult<()> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        s.graphs.refuse(stream, CuError::STREAM_CAPTURE_UNSUPPORTED, "a query of the stream")
    }

    fn stream_wait_event(&self, ctx: Obj, stream: Obj, event: Obj, _flags: u32) -> BResult<()> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        s.event(event)?;
        s.graphs.refuse(stream, CuError::NOT_SUPPORTED, "the emulated device captures no event waits")
    }

    /// The stream attributes a device takes: an access policy window, a
    /// synchronization policy, a priority and memory synchronization domains.
    fn stream_id(&self, ctx: Obj, stream: Obj) -> BResult<u64> {
        self.state().stream(ctx, stream).map(|_| stream.0)
    }

    fn stream_capture_status(&self, ctx: Obj, stream: Obj) -> BResult<u32> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        Ok(s.graphs.info(stream).status)
    }

    fn refuse_in_capture(&self, ctx: Obj, stream: Obj, what: &str) -> BResult<()> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        s.graphs.refuse(stream, CuError::STREAM_CAPTURE_UNSUPPORTED, what)
    }

    fn event_create(&self, ctx: Obj, flags: u32) -> BResult<Obj> {
        let mut s = self.state();
        s.ctx(ctx)?;
        if flags & !0xf != 0 {
            return Err(CuError::INVALID_VALUE.into());
        }
        let id = s.id();
        s.events.insert(id, EventState { ctx: ctx.0, flags, recorded: None });
        Ok(Obj(id))
    }

    fn event_destroy(&self, _ctx: Obj, event: Obj) -> BResult<()> {
        self.state().events.remove(&event.0).map(|_| ()).ok_or_else(|| CuError::INVALID_HANDLE.into())
    }

    fn event_record(&self, ctx: Obj, event: Obj, stream: Obj, _flags: u32) -> BResult<()> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        s.event(event)?;
        s.graphs.refuse(stream, CuError::NOT_SUPPORTED, "the emulated device captures no event records")?;
        s.event(event)?.recorded = Some(Instant::now());
        Ok(())
    }

    fn event_synchronize(&self, ctx: Obj, event: Obj) -> BResult<()> {
        let s = &mut *self.state();
        s.ctx(ctx)?;
        s.event(event)?;
        s.pools.release(&mut s.memory);
        Ok(())
    }

    fn event_query(&self, ctx: Obj, event: Obj) -> BResult<()> {
        let mut s = self.state();
        s.ctx(ctx)?;
        s.event(event).map(|_| ())
    }

    fn event_elapsed(&self, ctx: Obj, start: Obj, end: Obj) -> BResult<f32> {
        let mut s = self.state();
        s.ctx(ctx)?;
        let timed = |e: &EventState| match e.recorded {
            Some(t) if e.flags & CU_EVENT_DISABLE_TIMING == 0 => Ok(t),
            _ => Err(err(CuError::INVALID_HANDLE, "event was not recorded with timing")),
        };
        let a = timed(s.event(start)?)?;
        let b = timed(s.event(end)?)?;
        let ms = if b >= a { (b - a).as_secs_f64() * 1e3 } else { -((a - b).as_secs_f64() * 1e3) };
        Ok(ms as f32)
    }

    fn launch_host_func(&self, ctx: Obj, stream: Obj, f: HostFn) -> BResult<()> {
        let mut s = self.state();
        s.stream(ctx, stream)?;
        if let Some(recorded) = s.graphs.record(stream, Work::Host(f)) {
            return recorded;
        }
        // The stream's earlier work has run: every call runs at once here.
        // The device stays locked while the guest runs the function, as it
        // is for a kernel.
        // SAFETY: the session's function and data.
        unsafe { (f.run)(f.data) };
        Ok(())
    }
}
