//! What the end-to-end tests share: the front-end they run programs with.
//!
//! `cargo test` rebuilds the `gpuplex` binary but not the front-end, a
//! `cdylib` of another package, so a `libcuda.so` left from an older build
//! would make these tests fail for changes they do not contain.

use std::path::PathBuf;

/// The front-end's folder: the one beside the `gpuplex` binary, once it
/// holds a `libcuda.so` at least as new as every input cargo recorded for
/// it (`libcuda.d`).
pub fn frontend_dir() -> PathBuf {
    let gpuplex = PathBuf::from(env!("CARGO_BIN_EXE_gpuplex"));
    let dir = gpuplex.parent().expect("binary in a directory").to_path_buf();
    let library = dir.join("libcuda.so");
    let built = std::fs::metadata(&library).and_then(|m| m.modified());
    let built = built.unwrap_or_else(|_| panic!("{} has no libcuda.so: run cargo build first", dir.display()));
    let inputs = std::fs::read_to_string(dir.join("libcuda.d")).unwrap_or_default();
    let (_, inputs) = inputs.split_once(": ").unwrap_or_default();
    for input in inputs.split_whitespace() {
        if std::fs::metadata(input).and_then(|m| m.modified()).is_ok_and(|m| m > built) {
            panic!("{} is older than {input}: run cargo build first", library.display());
        }
    }
    dir
}
