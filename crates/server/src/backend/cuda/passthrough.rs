//! The API table's `pass` rows on the real driver, generated from the
//! table (`build.rs`): each makes the guest's current context current (or
//! none), then calls its entry point with the arguments the session
//! resolved.

use super::{api, enter, BResult, Cuda, Obj};

include!(concat!(env!("OUT_DIR"), "/cuda_passthrough.rs"));
