//! Generates the call table and the driver's error strings.

use std::{env, fs, path::Path};

fn main() {
    let out = env::var("OUT_DIR").unwrap();
    println!("cargo:rerun-if-changed=calls.api");
    println!("cargo:rerun-if-changed=data/error_strings.tsv");

    let table = gpuplex_apigen::parse(&fs::read_to_string("calls.api").unwrap()).unwrap_or_else(|e| panic!("{e}"));
    fs::write(Path::new(&out).join("calls.rs"), gpuplex_apigen::protocol_code(&table)).unwrap();

    let mut rows = String::from("&[\n");
    for line in fs::read_to_string("data/error_strings.tsv").unwrap().lines() {
        let mut cols = line.split('\t');
        let (code, name, text) = (cols.next().unwrap(), cols.next().unwrap(), cols.next().unwrap());
        rows += &format!("    ({code}, {name:?}, {text:?}),\n");
    }
    rows += "]\n";
    fs::write(Path::new(&out).join("error_strings.rs"), rows).unwrap();
}
