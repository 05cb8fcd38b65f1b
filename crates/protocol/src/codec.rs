//! Payload encoding: little-endian, length-prefixed, no self-description.
//!
//! Why hand-written rather than serde: every length a peer sends is checked
//! against the bytes actually present *before* anything is allocated, and a
//! payload must be consumed exactly (trailing bytes are an error). Both
//! properties are what let the server decode untrusted frames safely.

use crate::DecodeError;

/// A value with a wire form.
pub trait Wire: Sized {
    /// The fewest bytes one encoded value occupies; lets a decoder refuse a
    /// sequence length that cannot possibly fit before allocating for it.
    const MIN_SIZE: usize;
    fn put(&self, out: &mut Vec<u8>);
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError>;
}

/// Encodes one value into a fresh buffer.
pub fn encode<T: Wire>(value: &T) -> Vec<u8> {
    // Room for most calls at once, instead of growing field by field; an
    // empty value (most replies to posted calls) allocates nothing.
    let mut out = Vec::with_capacity(if T::MIN_SIZE == 0 { 0 } else { 256 });
    value.put(&mut out);
    out
}

/// The payload of `value` with its last field, left empty, holding `bytes`,
/// less the bytes themselves: they follow it on the wire from where they
/// lie, so that an image of megabytes is not copied into a request and
/// again into its payload. Panics if `value` does not end in empty bytes.
pub fn encode_before_bytes<T: Wire>(value: &T, bytes: &[u8]) -> Vec<u8> {
    let mut head = encode(value);
    let at = head.len().checked_sub(4).expect("a value ending in bytes");
    assert_eq!(head[at..], [0; 4], "the last field is empty bytes");
    head[at..].copy_from_slice(&(bytes.len() as u32).to_le_bytes());
    head
}

/// Decodes exactly one value; bytes left over are an error.
pub fn decode<T: Wire>(bytes: &[u8]) -> Result<T, DecodeError> {
    let mut r = Reader::new(bytes);
    let value = T::take(&mut r)?;
    if r.remaining() != 0 {
        return Err(DecodeError::Trailing(r.remaining()));
    }
    Ok(value)
}

/// A cursor over a received payload.
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.buf.len() {
            return Err(DecodeError::Truncated { wanted: n, left: self.buf.len() });
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }

    /// Reads a sequence length and checks that `len` items of at least
    /// `min_item` bytes each can still be present.
    fn len_for(&mut self, min_item: usize) -> Result<usize, DecodeError> {
        let len = u32::take(self)? as usize;
        let wanted = len.saturating_mul(min_item.max(1));
        if wanted > self.buf.len() {
            return Err(DecodeError::Truncated { wanted, left: self.buf.len() });
        }
        Ok(len)
    }
}

macro_rules! wire_number {
    ($($t:ty),*) => {$(
        impl Wire for $t {
            const MIN_SIZE: usize = std::mem::size_of::<$t>();
            fn put(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
                Ok(<$t>::from_le_bytes(r.array()?))
            }
        }
    )*};
}
wire_number!(u8, u16, u32, u64, i32, i64, f32, f64);

impl Wire for bool {
    const MIN_SIZE: usize = 1;
    fn put(&self, out: &mut Vec<u8>) {
        out.push(*self as u8);
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match u8::take(r)? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(DecodeError::Invalid(format!("bool byte {b}"))),
        }
    }
}

impl<const N: usize> Wire for [u8; N] {
    const MIN_SIZE: usize = N;
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        r.array()
    }
}

/// Bulk bytes (copies, images, packed kernel parameters).
impl Wire for Vec<u8> {
    const MIN_SIZE: usize = 4;
    fn put(&self, out: &mut Vec<u8>) {
        (self.len() as u32).put(out);
        out.extend_from_slice(self);
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let len = r.len_for(1)?;
        Ok(r.bytes(len)?.to_vec())
    }
}

impl Wire for String {
    const MIN_SIZE: usize = 4;
    fn put(&self, out: &mut Vec<u8>) {
        (self.len() as u32).put(out);
        out.extend_from_slice(self.as_bytes());
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let len = r.len_for(1)?;
        let bytes = r.bytes(len)?;
        let s = std::str::from_utf8(bytes).map_err(|_| DecodeError::Invalid("string is not UTF-8".into()))?;
        Ok(s.to_owned())
    }
}

/// Sequences of anything but bytes (which have the specialised form above).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Seq<T>(pub Vec<T>);

impl<T: Wire> Wire for Seq<T> {
    const MIN_SIZE: usize = 4;
    fn put(&self, out: &mut Vec<u8>) {
        (self.0.len() as u32).put(out);
        for item in &self.0 {
            item.put(out);
        }
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let len = r.len_for(T::MIN_SIZE)?;
        let mut items = Vec::with_capacity(len);
        for _ in 0..len {
            items.push(T::take(r)?);
        }
        Ok(Seq(items))
    }
}

impl<T: Wire> Wire for Option<T> {
    const MIN_SIZE: usize = 1;
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            None => out.push(0),
            Some(v) => {
                out.push(1);
                v.put(out);
            }
        }
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match bool::take(r)? {
            false => Ok(None),
            true => Ok(Some(T::take(r)?)),
        }
    }
}

/// Declares a struct whose wire form is its fields in order.
#[macro_export]
macro_rules! wire_struct {
    ($(#[$meta:meta])* pub struct $name:ident { $( $(#[$fmeta:meta])* pub $field:ident : $ty:ty ),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq)]
        pub struct $name { $( $(#[$fmeta])* pub $field: $ty ),* }

        impl $crate::codec::Wire for $name {
            const MIN_SIZE: usize = 0 $( + <$ty as $crate::codec::Wire>::MIN_SIZE )*;
            #[allow(unused_variables)]
            fn put(&self, out: &mut Vec<u8>) {
                $( $crate::codec::Wire::put(&self.$field, out); )*
            }
            #[allow(unused_variables)]
            fn take(r: &mut $crate::codec::Reader<'_>) -> Result<Self, $crate::DecodeError> {
                Ok($name { $( $field: <$ty as $crate::codec::Wire>::take(r)? ),* })
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bytes_sent_after_their_request_read_as_inside_it() {
        let image = b"an image of some bytes".to_vec();
        let whole = encode(&crate::calls::LibraryLoad::Request { digest: 7, image: image.clone() });
        let head = encode_before_bytes(&crate::calls::LibraryLoad::Request { digest: 7, image: Vec::new() }, &image);
        assert_eq!([head, image.clone()].concat(), whole);
        let whole = encode(&crate::calls::ModuleLoad::Request { digest: 9, image: image.clone() });
        let head = encode_before_bytes(&crate::calls::ModuleLoad::Request { digest: 9, image: Vec::new() }, &image);
        assert_eq!([head, image].concat(), whole);
    }

    wire_struct! {
        pub struct Sample {
            pub a: u32,
            pub b: Vec<u8>,
            pub c: String,
            pub d: Seq<u64>,
            pub e: Option<i32>,
            pub f: f32,
            pub g: bool,
        }
    }

    proptest! {
        #[test]
        fn roundtrip(a: u32, b: Vec<u8>, c: String, d: Vec<u64>, e: Option<i32>, f in -1e30f32..1e30, g: bool) {
            let s = Sample { a, b, c, d: Seq(d), e, f, g };
            prop_assert_eq!(decode::<Sample>(&encode(&s)).unwrap(), s);
        }

        #[test]
        fn garbage_never_panics(bytes: Vec<u8>) {
            let _ = decode::<Sample>(&bytes);
        }

        #[test]
        fn truncation_is_an_error(a: u32, b: Vec<u8>, cut in 0usize..16) {
            let s = Sample { a, b, c: "x".into(), d: Seq(vec![1]), e: None, f: 0.0, g: true };
            let bytes = encode(&s);
            let cut = cut.min(bytes.len() - 1);
            prop_assert!(decode::<Sample>(&bytes[..bytes.len() - 1 - cut]).is_err());
        }
    }

    #[test]
    fn huge_length_is_refused_before_allocating() {
        // A sequence claiming 2^32-1 u64 items in a 12-byte payload.
        let mut bytes = u32::MAX.to_le_bytes().to_vec();
        bytes.extend_from_slice(&[0; 8]);
        assert!(matches!(decode::<Seq<u64>>(&bytes), Err(DecodeError::Truncated { .. })));
        assert!(matches!(decode::<Vec<u8>>(&bytes), Err(DecodeError::Truncated { .. })));
    }

    #[test]
    fn trailing_bytes_are_refused() {
        assert!(matches!(decode::<u32>(&[1, 0, 0, 0, 9]), Err(DecodeError::Trailing(1))));
    }
}
