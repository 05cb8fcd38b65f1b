//! Generates the exports from the API table and sets the SONAME.

use std::{env, fs, path::Path};

fn main() {
    let table_path = "../protocol/calls.api";
    let exports_path = "data/libcuda-580-exports.txt";
    println!("cargo:rerun-if-changed={table_path}");
    println!("cargo:rerun-if-changed={exports_path}");
    // Programs link against libcuda.so but load libcuda.so.1, as with the real driver.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");

    let table = gpuplex_apigen::parse(&fs::read_to_string(table_path).unwrap()).unwrap_or_else(|e| panic!("{e}"));
    let exports: Vec<String> = fs::read_to_string(exports_path).unwrap().lines().map(str::to_owned).collect();
    let code = gpuplex_apigen::frontend_code(&table, &exports).unwrap_or_else(|e| panic!("{e}"));
    fs::write(Path::new(&env::var("OUT_DIR").unwrap()).join("exports.rs"), code).unwrap();
}
