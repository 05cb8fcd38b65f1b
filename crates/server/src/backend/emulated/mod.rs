//! A host-memory test device.
