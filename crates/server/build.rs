//! Generates the CUDA backend's side of the API table's `pass` rows: their
//! driver entry points and the `Passthrough` implementation calling them.

use std::{env, fs, path::Path};

fn main() {
    let table_path = "../protocol/calls.api";
    println!("cargo:rerun-if-changed={table_path}");
    let table = gpuplex_apigen::parse(&fs::read_to_string(table_path).unwrap()).unwrap_or_else(|e| panic!("{e}"));
    let (bindings, implementation) = gpuplex_apigen::cuda_passthrough_code(&table);
    let out = env::var("OUT_DIR").unwrap();
    fs::write(Path::new(&out).join("cuda_bindings.rs"), bindings).unwrap();
    fs::write(Path::new(&out).join("cuda_passthrough.rs"), implementation).unwrap();
}
