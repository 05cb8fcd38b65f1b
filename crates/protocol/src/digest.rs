//! The digest that names a module image, so that an image the server already
//! holds for a session is not sent again.
//!
//! Computed by the client only: the server takes it as the image's name.
//! Not cryptographic: images are cached per session, so a collision (or a
//! client lying about its digest) could only confuse that client's own
//! loads; a guest can forge a collision at will, so nothing the server
//! charges is taken from the digest (`session/images.rs`).

/// FNV-1a over 8-byte words, mixed with the length.
pub fn image_digest(image: &[u8]) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ image.len() as u64;
    let mut words = image.chunks_exact(8);
    for w in &mut words {
        h = (h ^ u64::from_le_bytes(w.try_into().expect("8-byte chunk"))).wrapping_mul(PRIME);
        h ^= h >> 29;
    }
    for &b in words.remainder() {
        h = (h ^ b as u64).wrapping_mul(PRIME);
    }
    h ^ (h >> 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differs_for_small_changes_and_lengths() {
        let a = vec![7u8; 1000];
        let mut b = a.clone();
        b[999] = 8;
        assert_ne!(image_digest(&a), image_digest(&b));
        assert_ne!(image_digest(&a[..999]), image_digest(&a));
        assert_ne!(image_digest(&[]), image_digest(&[0]));
        assert_eq!(image_digest(&a), image_digest(&a.clone()));
    }
}
