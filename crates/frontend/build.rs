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
    let out = env::var("OUT_DIR").unwrap();
    fs::write(Path::new(&out).join("exports.rs"), code).unwrap();
    fs::write(Path::new(&out).join("proc_address.rs"), proc_address_table(&exports)).unwrap();
}

/// `data/proc_address.tsv` (what driver 580's cuGetProcAddress_v2 answers,
/// from tools/driver-facts/probe.py) as a table sorted by name and flags:
/// `(name, flags, from_version, answer)`.
fn proc_address_table(exports: &[String]) -> String {
    let path = "data/proc_address.tsv";
    println!("cargo:rerun-if-changed={path}");
    let mut rows: Vec<(String, u8, u32, String)> = Vec::new();
    for line in fs::read_to_string(path).unwrap().lines() {
        let f: Vec<&str> = line.split('\t').collect();
        let answer = match f[3].strip_prefix("rc=") {
            Some(rest) => {
                let (rc, status) = rest.split_once(",status=").expect("rc=R,status=S");
                format!("Answer::Status {{ rc: {rc}, status: {status} }}")
            }
            None => {
                assert!(exports.iter().any(|e| e == f[3]), "{} is not an export", f[3]);
                format!("Answer::Symbol({:?})", f[3])
            }
        };
        rows.push((f[0].to_owned(), f[1].parse().unwrap(), f[2].parse().unwrap(), answer));
    }
    rows.sort_by(|a, b| (&a.0, a.1, a.2).cmp(&(&b.0, b.1, b.2)));
    let mut s = String::from("&[\n");
    for (name, flags, version, answer) in rows {
        s += &format!("    ({name:?}, {flags}, {version}, {answer}),\n");
    }
    s + "]\n"
}
