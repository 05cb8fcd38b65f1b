//! The gpuplex server.

pub mod backend;
