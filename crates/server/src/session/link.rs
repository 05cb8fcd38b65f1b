//! JIT linking: a guest's whole link (its options and inputs, gathered by
//! the front-end) in one call. Nothing of it stays in the session: the
//! linked image goes back to the guest, which loads it as any other.

use gpuplex_protocol::calls::Link;
use gpuplex_protocol::{CallError, LINK_INPUT_TYPES, LINK_OPTIONS};

use super::{invalid, Session};

/// The most inputs one link takes: far more than programs link.
const MAX_INPUTS: usize = 4096;

impl Session {
    pub(super) fn link(&mut self, req: Link::Request) -> Result<Link::Reply, CallError> {
        let (_, ctx) = self.current_ctx()?;
        if req.options.0.len() != req.values.0.len() || req.kinds.0.len() != req.sizes.0.len() {
            return Err(invalid("a value for every option and a size for every input"));
        }
        if let Some(o) = req.options.0.iter().find(|o| !LINK_OPTIONS.contains(o)) {
            return Err(invalid(format!("JIT option {o} is not one a link passes on")));
        }
        if req.kinds.0.is_empty()
            || req.kinds.0.len() > MAX_INPUTS
            || req.kinds.0.iter().any(|&k| k >= LINK_INPUT_TYPES)
        {
            return Err(invalid(format!("{} inputs of types {:?}", req.kinds.0.len(), req.kinds.0)));
        }
        let mut inputs = Vec::with_capacity(req.kinds.0.len());
        let mut rest = req.data.as_slice();
        for (&kind, &size) in req.kinds.0.iter().zip(&req.sizes.0) {
            let size = usize::try_from(size).ok().filter(|&n| n > 0 && n <= rest.len());
            let (input, after) = rest.split_at(size.ok_or_else(|| invalid("an input's size leaves its data"))?);
            inputs.push((kind, input));
            rest = after;
        }
        if !rest.is_empty() {
            return Err(invalid("data beyond the inputs' sizes"));
        }
        let options: Vec<(u32, u64)> = req.options.0.iter().copied().zip(req.values.0.iter().copied()).collect();
        let linked = self.backend.link(ctx, &options, &inputs)?;
        Ok(Link::Reply {
            status: linked.status,
            cubin: linked.image,
            infoLog: linked.info_log,
            errorLog: linked.error_log,
        })
    }
}
