//! Module images a session has sent, by digest, so that loading the same
//! image again (the CUDA runtime and libraries reload theirs often) costs
//! no second transfer. Per session: one tenant cannot learn what another
//! loaded. The digest is the guest's name for the bytes, not checked here:
//! a wrong one confuses only the guest's own loads, and since a guest can
//! send other bytes under a name it used before, what is known of an image
//! (its footprint, its share of the budget) is taken from the bytes that
//! arrive, never from their name.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use gpuplex_protocol::{CallError, CuError};

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
        let image = Arc::new(image);
        // Measured again from these bytes, whatever came under this digest before.
        self.footprints.remove(&digest);
        match self.by_digest.insert(digest, image.clone()) {
            Some(old) => self.bytes = self.bytes - old.len() + image.len(),
            None => {
                self.order.push_back(digest);
                self.bytes += image.len();
            }
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
    use gpuplex_protocol::image_digest;

    #[test]
    fn second_load_needs_only_the_digest() {
        let mut images = Images::default();
        let bytes = b"fatbin bytes".to_vec();
        let d = image_digest(&bytes);
        assert_eq!(images.resolve(d, Vec::new()).unwrap_err().code, CuError::NOT_FOUND);
        assert_eq!(*images.resolve(d, bytes.clone()).unwrap(), bytes);
        assert_eq!(*images.resolve(d, Vec::new()).unwrap(), bytes);
        // A digest that is not the bytes' is only the guest's name for them.
        assert_eq!(*images.resolve(d ^ 1, bytes.clone()).unwrap(), bytes);
        assert_eq!(*images.resolve(d ^ 1, Vec::new()).unwrap(), bytes);
    }

    /// Other bytes under a digest the guest used before (a name it chose,
    /// or a collision it forged: each step of the digest can be inverted)
    /// are measured again and count at their own size.
    #[test]
    fn bytes_sent_again_under_a_digest_are_measured_again() {
        let mut images = Images::default();
        let (small, big) = (vec![1u8; 32], vec![2u8; 4000]);
        let d = image_digest(&small);

        images.resolve(d, small.clone()).unwrap();
        images.set_footprint(d, 32);
        images.resolve(d, Vec::new()).unwrap();
        assert_eq!(images.footprint(d), Some(32), "a load by digest alone keeps what was measured");
        images.resolve(d, big.clone()).unwrap();
        assert_eq!(images.footprint(d), None, "the new bytes are measured again, not taken as the small ones");
        assert_eq!((images.bytes, images.order.len()), (4000, 1));
        images.resolve(d, small).unwrap();
        assert_eq!((images.bytes, images.order.len()), (32, 1));
    }
}
