//! Module images a session has sent, by digest, so that loading the same
//! image again (the CUDA runtime and libraries reload theirs often) costs
//! no second transfer. Per session: one tenant cannot learn what another
//! loaded.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use gpuplex_protocol::{image_digest, CallError, CuError};

/// Bytes of images kept per session; the oldest go first.
const BUDGET: usize = 1 << 30;

#[derive(Default)]
pub struct Images {
    by_digest: HashMap<u64, Arc<Vec<u8>>>,
    order: VecDeque<u64>,
    bytes: usize,
    /// What each image takes on the device, once measured.
    footprints: HashMap<u64, u64>,
}

impl Images {
    /// What the image `digest` takes on the device, if measured before.
    pub fn footprint(&self, digest: u64) -> Option<u64> {
        self.footprints.get(&digest).copied()
    }

    pub fn set_footprint(&mut self, digest: u64, bytes: u64) {
        self.footprints.insert(digest, bytes);
    }

    /// The image a load names: the bytes sent, remembered under their
    /// digest, or for an empty image the bytes sent before under `digest`.
    pub fn resolve(&mut self, digest: u64, image: Vec<u8>) -> Result<Arc<Vec<u8>>, CallError> {
        if image.is_empty() {
            return self
                .by_digest
                .get(&digest)
                .cloned()
                .ok_or_else(|| CallError::new(CuError::NOT_FOUND, format!("no image {digest:#018x} in this session")));
        }
        if image_digest(&image) != digest {
            return Err(CallError::new(CuError::INVALID_VALUE, "image does not match its digest"));
        }
        let image = Arc::new(image);
        if self.by_digest.insert(digest, image.clone()).is_none() {
            self.order.push_back(digest);
            self.bytes += image.len();
        }
        while self.bytes > BUDGET && self.order.len() > 1 {
            if let Some(old) = self.order.pop_front().and_then(|d| self.by_digest.remove(&d)) {
                self.bytes -= old.len();
            }
        }
        Ok(image)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_load_needs_only_the_digest() {
        let mut images = Images::default();
        let bytes = b"fatbin bytes".to_vec();
        let d = image_digest(&bytes);
        assert_eq!(images.resolve(d, Vec::new()).unwrap_err().code, CuError::NOT_FOUND);
        assert_eq!(*images.resolve(d, bytes.clone()).unwrap(), bytes);
        assert_eq!(*images.resolve(d, Vec::new()).unwrap(), bytes);
        assert_eq!(images.resolve(d ^ 1, bytes).unwrap_err().code, CuError::INVALID_VALUE);
    }
}
