//! The built library must look like NVIDIA's to the dynamic linker: every
//! symbol driver 580 exports, no others but gpuplex's marker, and the SONAME
//! programs link to.

use std::collections::BTreeSet;

use object::{Object, ObjectSymbol};

fn library() -> Vec<u8> {
    // Integration tests run from target/<profile>/deps.
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().unwrap().parent().unwrap().join("libcuda.so");
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn exports_exactly_the_real_driver_s_symbols() {
    let bytes = library();
    let file = object::File::parse(&*bytes).unwrap();
    let ours: BTreeSet<String> = file
        .dynamic_symbols()
        .filter(|s| s.is_definition() && s.is_global())
        .map(|s| s.name().unwrap().to_owned())
        .collect();
    let theirs: BTreeSet<String> = include_str!("../data/libcuda-580-exports.txt").lines().map(str::to_owned).collect();
    assert_eq!(theirs.len(), 707);
    let missing: Vec<_> = theirs.difference(&ours).collect();
    let extra: Vec<_> = ours.difference(&theirs).filter(|s| *s != "gpuplex_frontend").collect();
    assert!(ours.contains("gpuplex_frontend"), "the marker a server checks for");
    assert!(missing.is_empty() && extra.is_empty(), "missing {missing:?}, extra {extra:?}");
}

#[test]
fn soname_is_libcuda_so_1() {
    use object::read::elf::{Dyn, FileHeader};
    let bytes = library();
    let header = object::elf::FileHeader64::<object::Endianness>::parse(&*bytes).unwrap();
    let endian = header.endian().unwrap();
    let sections = header.sections(endian, &*bytes).unwrap();
    let (dynamic, strtab) = sections.dynamic(endian, &*bytes).unwrap().expect("a dynamic section");
    let strings = sections.strings(endian, &*bytes, strtab).unwrap();
    let soname = dynamic
        .iter()
        .find(|d| d.tag32(endian) == Some(object::elf::DT_SONAME))
        .map(|d| d.string(endian, strings).unwrap());
    assert_eq!(soname, Some(&b"libcuda.so.1"[..]));
}
