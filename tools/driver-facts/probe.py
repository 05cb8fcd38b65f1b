#!/usr/bin/env python3
"""Asks the real libcuda.so.1 (on the GPU machine) for facts gpuplex must
reproduce exactly, and writes them as data files for the front-end:

  error_strings.tsv   code, cuGetErrorName, cuGetErrorString for every code
  proc_address.tsv    for every exported base name and flag (0 default,
                      1 legacy stream, 2 per-thread stream): each CUDA version
                      at which cuGetProcAddress_v2's answer changes, and the
                      exported symbol (or status) it answers with
  export_tables.tsv   for each private table id (cuGetExportTable): the
                      status, slot 0 (the size in bytes for most tables), and
                      which of the first slots are non-NULL

Usage: probe.py EXPORTS_TXT CUDA_TYPEDEFS_H OUT_DIR

Run on the GPU machine; the outputs are committed as
crates/protocol/data/error_strings.tsv and
crates/frontend/data/{proc_address,export_tables}.tsv.
"""
import ctypes, re, sys, os

exports_path, typedefs_path, out_dir = sys.argv[1:4]
cuda = ctypes.CDLL("libcuda.so.1")
libdl = ctypes.CDLL("libdl.so.2")


def error_strings():
    rows = []
    get_name, get_str = cuda.cuGetErrorName, cuda.cuGetErrorString
    for code in range(0, 1100):
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        if get_name(code, ctypes.byref(name)) != 0:
            continue
        assert get_str(code, ctypes.byref(text)) == 0
        rows.append(f"{code}\t{name.value.decode()}\t{text.value.decode()}")
    return rows


class DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def symbol_of(ptr):
    info = DlInfo()
    if libdl.dladdr(ctypes.c_void_p(ptr), ctypes.byref(info)) == 0 or not info.dli_sname:
        return f"?{ptr:#x}"
    if info.dli_saddr != ptr:
        return f"?{info.dli_sname.decode()}+{ptr - info.dli_saddr:#x}"
    return info.dli_sname.decode()


def proc_addresses():
    names = [l.strip() for l in open(exports_path) if l.strip()]
    bases = sorted({re.sub(r"(_v\d+)?(_ptsz|_ptds)?$", "", n) for n in names})
    versions = sorted({int(v) for v in re.findall(r"PFN_cu\w+?_v(\d+)\b", open(typedefs_path).read())})
    versions = sorted(set(versions) | {13010, 13020, 14000})
    fn = cuda.cuGetProcAddress_v2
    fn.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                   ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
    rows = []
    for base in bases:
        for flags in (0, 1, 2):
            last = None
            for v in versions:
                p, status = ctypes.c_void_p(), ctypes.c_int(-1)
                rc = fn(base.encode(), ctypes.byref(p), v, flags, ctypes.byref(status))
                answer = symbol_of(p.value) if rc == 0 and p.value else f"rc={rc},status={status.value}"
                if answer != last:
                    rows.append(f"{base}\t{flags}\t{v}\t{answer}")
                    last = answer
    return rows


# Ids as the 16 bytes in memory order: those the CUDA 12/13 runtime asks
# for, and those seen asked for by cuBLAS, cuFFT and tools.
EXPORT_TABLE_IDS = """
6bd5fb6c5bf4e74a8987d93912fd9df9 42d85a8123f6cb478298f6e78a3aecdc a094798c2e742e7493f20800200c0a66
c693336e1121df11a8c368f355d89593 0ca50b8c1004929a89a7d0df10e77286 195bcbf4d67d024aacc51d29cea631ae
b10541e1f7c7c74a9f64f223be99f1e2 d4082055bde6704b8d34ba123c66e1f2 263e88607cd2614392f6bbd5006dfa7e
21318c60971432488ca641ff7324c8f2 6e163fbeb958444d835ce182aff1991e f8cff95121468b4eb9e2fb469e7c0dd9
bfdb432dbf3c5a4a945eb34029e81e75 a6b1ff99ecc4c94f92f91928663d5585 cc529e945c4e9d46837c9625868334e4
""".split()


def export_tables():
    assert cuda.cuInit(0) == 0
    rows = []
    get = cuda.cuGetExportTable
    get.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
    for hexid in EXPORT_TABLE_IDS:
        table = ctypes.c_void_p()
        rc = get(ctypes.byref(table), bytes.fromhex(hexid))
        if rc != 0 or not table.value:
            rows.append(f"{hexid}\t{rc}\t-\t-")
            continue
        slot0 = ctypes.c_uint64.from_address(table.value).value
        count = slot0 // 8 if 8 <= slot0 <= 8 * 512 and slot0 % 8 == 0 else 16
        slots = (ctypes.c_uint64 * count).from_address(table.value)
        nonnull = "".join("1" if slots[i] else "0" for i in range(count))
        rows.append(f"{hexid}\t{rc}\t{slot0}\t{nonnull}")
    return rows


os.makedirs(out_dir, exist_ok=True)
for name, rows in (
    ("error_strings.tsv", error_strings()),
    ("proc_address.tsv", proc_addresses()),
    ("export_tables.tsv", export_tables()),
):
    with open(os.path.join(out_dir, name), "w") as f:
        f.write("\n".join(rows) + "\n")
    print(name, len(rows), "rows")
