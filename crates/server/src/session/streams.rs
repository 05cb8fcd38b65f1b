//! The session's side of streams and events.

use gpuplex_protocol::{calls, CallError, Ctx, CuError, Event, Stream, StreamsCalls};

use super::tables::{Entry, Kind, Owner};
use super::Session;

type R<T> = Result<T, CallError>;

#[allow(non_snake_case)]
impl StreamsCalls for Session {
    fn cuStreamCreate(&mut self, req: calls::cuStreamCreate::Request) -> R<calls::cuStreamCreate::Reply> {
        let (h, ctx) = self.current_ctx()?;
        let obj = self.backend.stream_create(ctx, req.flags, 0)?;
        self.seat.stream(ctx, obj);
        Ok(calls::cuStreamCreate::Reply {
            phStream: Stream(self.tables.add(Kind::Stream, Entry { obj, ctx: h, owner: Owner::Ctx(h) })),
        })
    }

    fn cuStreamCreateWithPriority(
        &mut self,
        req: calls::cuStreamCreateWithPriority::Request,
    ) -> R<calls::cuStreamCreateWithPriority::Reply> {
        let (h, ctx) = self.current_ctx()?;
        let obj = self.backend.stream_create(ctx, req.flags, req.priority)?;
        self.seat.stream(ctx, obj);
        let s = self.tables.add(Kind::Stream, Entry { obj, ctx: h, owner: Owner::Ctx(h) });
        Ok(calls::cuStreamCreateWithPriority::Reply { phStream: Stream(s) })
    }

    fn cuStreamDestroy_v2(&mut self, req: calls::cuStreamDestroy_v2::Request) -> R<calls::cuStreamDestroy_v2::Reply> {
        if req.hStream.is_default() {
            return Err(CallError::new(CuError::INVALID_HANDLE, "a default stream cannot be destroyed"));
        }
        let (ctx, stream) = self.stream(req.hStream)?;
        self.seat.stream_gone(ctx, stream);
        self.backend.stream_destroy(ctx, stream)?;
        self.capture_gone(|c| c == (ctx, stream));
        self.tables.remove(Kind::Stream, req.hStream.0)?;
        Ok(calls::cuStreamDestroy_v2::Reply {})
    }

    fn cuStreamSynchronize(
        &mut self,
        req: calls::cuStreamSynchronize::Request,
    ) -> R<calls::cuStreamSynchronize::Reply> {
        let (ctx, stream) = self.stream(req.hStream)?;
        self.backend.stream_synchronize(ctx, stream)?;
        Ok(calls::cuStreamSynchronize::Reply {})
    }

    fn cuStreamQuery(&mut self, req: calls::cuStreamQuery::Request) -> R<calls::cuStreamQuery::Reply> {
        let (ctx, stream) = self.stream(req.hStream)?;
        self.backend.stream_query(ctx, stream)?;
        Ok(calls::cuStreamQuery::Reply {})
    }

    fn cuStreamWaitEvent(&mut self, req: calls::cuStreamWaitEvent::Request) -> R<calls::cuStreamWaitEvent::Reply> {
        let (ctx, stream) = self.stream(req.hStream)?;
        let (_, event) = self.event(req.hEvent)?;
        self.backend.stream_wait_event(ctx, stream, event, req.flags)?;
        Ok(calls::cuStreamWaitEvent::Reply {})
    }

    fn cuStreamIsCapturing(
        &mut self,
        req: calls::cuStreamIsCapturing::Request,
    ) -> R<calls::cuStreamIsCapturing::Reply> {
        let (ctx, stream) = self.stream(req.hStream)?;
        Ok(calls::cuStreamIsCapturing::Reply { captureStatus: self.backend.stream_capture_status(ctx, stream)? })
    }

    fn cuStreamGetId(&mut self, req: calls::cuStreamGetId::Request) -> R<calls::cuStreamGetId::Reply> {
        let (ctx, stream) = self.stream(req.hStream)?;
        Ok(calls::cuStreamGetId::Reply { streamId: self.backend.stream_id(ctx, stream)? })
    }

    fn cuStreamGetCtx(&mut self, req: calls::cuStreamGetCtx::Request) -> R<calls::cuStreamGetCtx::Reply> {
        let h = if req.hStream.is_default() {
            self.current_ctx()?.0
        } else {
            self.tables.get(Kind::Stream, req.hStream.0)?.ctx
        };
        Ok(calls::cuStreamGetCtx::Reply { pctx: Ctx(h) })
    }

    fn cuStreamGetDevice(&mut self, req: calls::cuStreamGetDevice::Request) -> R<calls::cuStreamGetDevice::Reply> {
        let h = self.cuStreamGetCtx(calls::cuStreamGetCtx::Request { hStream: req.hStream })?.pctx.0;
        Ok(calls::cuStreamGetDevice::Reply { device: self.tables.ctx(h)?.device })
    }

    fn cuEventCreate(&mut self, req: calls::cuEventCreate::Request) -> R<calls::cuEventCreate::Reply> {
        let (h, ctx) = self.current_ctx()?;
        let obj = self.backend.event_create(ctx, req.flags)?;
        Ok(calls::cuEventCreate::Reply {
            phEvent: Event(self.tables.add(Kind::Event, Entry { obj, ctx: h, owner: Owner::Ctx(h) })),
        })
    }

    fn cuEventDestroy_v2(&mut self, req: calls::cuEventDestroy_v2::Request) -> R<calls::cuEventDestroy_v2::Reply> {
        let (ctx, event) = self.event(req.hEvent)?;
        self.backend.event_destroy(ctx, event)?;
        self.tables.remove(Kind::Event, req.hEvent.0)?;
        Ok(calls::cuEventDestroy_v2::Reply {})
    }

    fn cuEventRecord(&mut self, req: calls::cuEventRecord::Request) -> R<calls::cuEventRecord::Reply> {
        let (ctx, event) = self.event(req.hEvent)?;
        let (_, stream) = self.stream(req.hStream)?;
        self.backend.event_record(ctx, event, stream, 0)?;
        Ok(calls::cuEventRecord::Reply {})
    }

    fn cuEventRecordWithFlags(
        &mut self,
        req: calls::cuEventRecordWithFlags::Request,
    ) -> R<calls::cuEventRecordWithFlags::Reply> {
        let (ctx, event) = self.event(req.hEvent)?;
        let (_, stream) = self.stream(req.hStream)?;
        self.backend.event_record(ctx, event, stream, req.flags)?;
        Ok(calls::cuEventRecordWithFlags::Reply {})
    }

    fn cuEventSynchronize(&mut self, req: calls::cuEventSynchronize::Request) -> R<calls::cuEventSynchronize::Reply> {
        let (ctx, event) = self.event(req.hEvent)?;
        self.backend.event_synchronize(ctx, event)?;
        Ok(calls::cuEventSynchronize::Reply {})
    }

    fn cuEventQuery(&mut self, req: calls::cuEventQuery::Request) -> R<calls::cuEventQuery::Reply> {
        let (ctx, event) = self.event(req.hEvent)?;
        self.backend.event_query(ctx, event)?;
        Ok(calls::cuEventQuery::Reply {})
    }

    fn cuEventElapsedTime_v2(
        &mut self,
        req: calls::cuEventElapsedTime_v2::Request,
    ) -> R<calls::cuEventElapsedTime_v2::Reply> {
        let (ctx, start) = self.event(req.hStart)?;
        let (_, end) = self.event(req.hEnd)?;
        Ok(calls::cuEventElapsedTime_v2::Reply { pMilliseconds: self.backend.event_elapsed(ctx, start, end)? })
    }
}
