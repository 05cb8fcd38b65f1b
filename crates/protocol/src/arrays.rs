//! Arrays, texture and surface objects, and the copies that reach them (and
//! pitched memory) as they travel.

crate::wire_struct! {
    /// `CUDA_ARRAY3D_DESCRIPTOR`; a 2D or 1D array has `depth` 0 (and a 1D
    /// one `height` 0), as `cuArrayCreate` makes them.
    pub struct ArrayDesc {
        pub width: u64,
        pub height: u64,
        pub depth: u64,
        pub format: u32,
        pub channels: u32,
        pub flags: u32,
    }
}

/// `CUDA_ARRAY3D_LAYERED` and `CUDA_ARRAY3D_CUBEMAP`: arrays whose depth
/// counts layers or faces, which a mipmap's levels keep.
pub const ARRAY_LAYERED: u32 = 0x01;
pub const ARRAY_CUBEMAP: u32 = 0x04;

/// The most levels a mipmapped array may have: one per halving of the
/// largest extent the driver takes.
pub const MAX_MIP_LEVELS: u32 = 32;

impl ArrayDesc {
    /// Level `level` of a mipmapped array of this shape: each extent halved
    /// `level` times, down to 1 (an absent height or depth stays absent,
    /// layers and cubemap faces stay as many).
    pub fn mip_level(&self, level: u32) -> ArrayDesc {
        let halve = |n: u64| if n == 0 { 0 } else { (n >> level.min(63)).max(1) };
        let keeps_depth = self.flags & (ARRAY_LAYERED | ARRAY_CUBEMAP) != 0;
        ArrayDesc {
            width: halve(self.width),
            height: halve(self.height),
            depth: if keeps_depth { self.depth } else { halve(self.depth) },
            ..self.clone()
        }
    }
}

/// A copy side's host bytes travel in the request or the reply, rows packed
/// one after another.
pub const SIDE_INLINE: u32 = 0;
/// A copy side in device memory, `at` its address.
pub const SIDE_DEVICE: u32 = 1;
/// A copy side in an array, `at` its handle.
pub const SIDE_ARRAY: u32 = 2;
/// A copy side in a host block shared with the server, `block` the block
/// and `at` the offset in it.
pub const SIDE_BLOCK: u32 = 3;

crate::wire_struct! {
    /// One side of a copy: `CUDA_MEMCPY3D`'s source or destination fields.
    /// `pitch` and `height` (of a slice) are ignored for arrays and for
    /// inline bytes, whose rows are packed.
    pub struct CopySide {
        pub kind: u32,
        pub at: u64,
        pub block: u64,
        pub x: u64,
        pub y: u64,
        pub z: u64,
        pub pitch: u64,
        pub height: u64,
    }
}

/// The driver function a copy came from, which the server calls in turn,
/// so that it is judged as it is natively: `cuMemcpy3D`, ...
pub const COPY_3D: u32 = 0;
/// ... `cuMemcpy2D`, ...
pub const COPY_2D: u32 = 1;
/// ... `cuMemcpy2DUnaligned` (always synchronous), ...
pub const COPY_2D_UNALIGNED: u32 = 2;
/// ... or one of the linear array copies (`cuMemcpyHtoA`, `AtoH`, `DtoA`,
/// `AtoD`, `AtoA`), offsets in bytes in `x`, the byte count in `width`.
pub const COPY_ARRAY_LINEAR: u32 = 3;

crate::wire_struct! {
    /// A copy of `depth` slices of `height` rows of `width` bytes.
    pub struct Copy3D {
        pub shape: u32,
        pub src: CopySide,
        pub dst: CopySide,
        pub width: u64,
        pub height: u64,
        pub depth: u64,
    }
}

impl Copy3D {
    /// Bytes the copy moves, `None` if that overflows.
    pub fn bytes(&self) -> Option<u64> {
        self.width.checked_mul(self.height)?.checked_mul(self.depth)
    }
}

/// `CU_RESOURCE_TYPE_ARRAY`, `_MIPMAPPED_ARRAY`, `_LINEAR`, `_PITCH2D`.
pub const RESOURCE_ARRAY: u32 = 0;
pub const RESOURCE_MIPMAPPED_ARRAY: u32 = 1;
pub const RESOURCE_LINEAR: u32 = 2;
pub const RESOURCE_PITCH2D: u32 = 3;

crate::wire_struct! {
    /// `CUDA_RESOURCE_DESC`: what a texture or surface object reads. `at` is
    /// the array handle, or the device address of linear and pitched memory;
    /// `format`, `channels`, `width`, `height`, `pitch` and `size` are
    /// those of linear (`size`) and pitched (the rest) memory.
    pub struct ResourceDesc {
        pub kind: u32,
        pub at: u64,
        pub format: u32,
        pub channels: u32,
        pub width: u64,
        pub height: u64,
        pub pitch: u64,
        pub size: u64,
        pub flags: u32,
    }
}

/// Bytes of one element of `channels` channels in array format `format`.
/// `CUDA_ERROR_INVALID_VALUE` for a channel count the format does not
/// take; `CUDA_ERROR_NOT_SUPPORTED` for the formats whose elements are not
/// whole bytes (block-compressed and video formats) and unknown ones.
pub fn element_bytes(format: u32, channels: u32) -> Result<u64, crate::CuError> {
    let (per_channel, fixed) = match format {
        0x01 | 0x08 => (1, None),
        0x02 | 0x09 | 0x10 => (2, None),
        0x03 | 0x0a | 0x20 => (4, None),
        // UNORM and SNORM formats name their channels.
        0xc0 | 0xc6 => (1, Some(1)),
        0xc1 | 0xc7 => (1, Some(2)),
        0xc2 | 0xc8 => (1, Some(4)),
        0xc3 | 0xc9 => (2, Some(1)),
        0xc4 | 0xca => (2, Some(2)),
        0xc5 | 0xcb => (2, Some(4)),
        // R10G10B10A2: four channels in 32 bits.
        0x50 => (1, Some(4)),
        _ => return Err(crate::CuError::NOT_SUPPORTED),
    };
    if !matches!(channels, 1 | 2 | 4) || fixed.is_some_and(|n| n != channels) {
        return Err(crate::CuError::INVALID_VALUE);
    }
    Ok(per_channel * u64::from(channels))
}

/// Bytes of `CUDA_TEXTURE_DESC` and of `CUDA_RESOURCE_VIEW_DESC`, which
/// travel as they are.
pub const TEXTURE_DESC_BYTES: usize = 104;
pub const RESOURCE_VIEW_DESC_BYTES: usize = 112;
