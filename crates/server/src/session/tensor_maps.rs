//! Tensor maps: the guest's parameters checked for length against the
//! rank, since the driver reads as many entries as the rank says.

use gpuplex_protocol::calls::{TensorMapEncode, TensorMapReplaceAddress};
use gpuplex_protocol::{CallError, CuError, TensorMapsCalls};

use super::{invalid, Session};
use crate::backend::{TensorMap, TensorWindow};

type R<T> = Result<T, CallError>;

/// The most dimensions a tensor map has.
const MAX_RANK: usize = 5;

impl Session {
    pub(super) fn tensor_map_encode(&mut self, req: TensorMapEncode::Request) -> R<TensorMapEncode::Reply> {
        let rank = req.rank as usize;
        if !(1..=MAX_RANK).contains(&rank) {
            return Err(invalid(format!("a tensor map of rank {rank}")));
        }
        let spatial = rank.saturating_sub(2);
        let lengths_fit = req.dims.0.len() == rank
            && req.strides.0.len() == rank - 1
            && req.elementStrides.0.len() == rank
            && if req.im2col {
                req.lower.0.len() == spatial && req.upper.0.len() == spatial && req.window.0.is_empty()
            } else {
                req.window.0.len() == rank && req.lower.0.is_empty() && req.upper.0.is_empty()
            };
        if !lengths_fit {
            return Err(invalid("a tensor map's lists do not match its rank"));
        }
        let corners = |c: Vec<u32>| c.into_iter().map(|v| v as i32).collect();
        let window = if req.im2col {
            TensorWindow::Im2col {
                lower: corners(req.lower.0),
                upper: corners(req.upper.0),
                channels: req.channels,
                pixels: req.pixels,
            }
        } else {
            TensorWindow::Tiled(req.window.0)
        };
        let map = TensorMap {
            data_type: req.dataType,
            address: req.address.0,
            dims: req.dims.0,
            strides: req.strides.0,
            element_strides: req.elementStrides.0,
            window,
            interleave: req.interleave,
            swizzle: req.swizzle,
            l2_promotion: req.l2Promotion,
            oob_fill: req.oobFill,
        };
        Ok(TensorMapEncode::Reply { map: self.backend.tensor_map_encode(&map)?.to_vec() })
    }

    pub(super) fn tensor_map_replace_address(
        &mut self,
        req: TensorMapReplaceAddress::Request,
    ) -> R<TensorMapReplaceAddress::Reply> {
        let map = req
            .map
            .as_slice()
            .try_into()
            .map_err(|_| CallError::new(CuError::INVALID_VALUE, "a tensor map is 128 bytes"))?;
        Ok(TensorMapReplaceAddress::Reply {
            map: self.backend.tensor_map_replace_address(&map, req.address.0)?.to_vec(),
        })
    }
}

#[allow(non_snake_case)]
impl TensorMapsCalls for Session {
    fn TensorMapEncode(&mut self, req: TensorMapEncode::Request) -> R<TensorMapEncode::Reply> {
        self.tensor_map_encode(req)
    }

    fn TensorMapReplaceAddress(&mut self, req: TensorMapReplaceAddress::Request) -> R<TensorMapReplaceAddress::Reply> {
        self.tensor_map_replace_address(req)
    }
}
