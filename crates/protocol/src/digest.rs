//! The digest that names a module image, so that an image the server already
//! holds for a session is not sent again.
//!
//! Computed by the client only: the server takes it as the image's name.
//! Not cryptographic: images are cached per session, so a collision (or a
//! client lying about its digest) could only confuse that client's own
//! loads; a guest can forge a collision at will, so nothing the server
//! charges is taken from the digest (`session/images.rs`).

/// FNV-1a over 8-byte words in four interleaved lanes (every fourth word to
/// each), mixed with the length: the lanes' multiplies overlap instead of
/// each waiting for the one before. Only the client computes it, so it may
/// change from one release to the next.
pub fn image_digest(image: &[u8]) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let seed = 0xcbf2_9ce4_8422_2325 ^ image.len() as u64;
    let mut lanes = [seed, seed.rotate_left(16), seed.rotate_left(32), seed.rotate_left(48)];
    let mut blocks = image.chunks_exact(32);
    for block in &mut blocks {
        for (lane, word) in lanes.iter_mut().zip(block.chunks_exact(8)) {
            *lane = (*lane ^ u64::from_le_bytes(word.try_into().expect("8-byte chunk"))).wrapping_mul(PRIME);
            *lane ^= *lane >> 29;
        }
    }
    let mut h = lanes[0] ^ lanes[1].rotate_left(17) ^ lanes[2].rotate_left(31) ^ lanes[3].rotate_left(47);
    for &b in blocks.remainder() {
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
        // A change in any lane's word, or in the bytes after the last block.
        for at in [0, 8, 16, 24, 32, 995] {
            let mut c = a.clone();
            c[at] ^= 1;
            assert_ne!(image_digest(&a), image_digest(&c), "a change at {at}");
        }
    }
}
