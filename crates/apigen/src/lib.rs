//! Code generation from the API table (`crates/protocol/calls.api`).
//!
//! One table, three consumers: the protocol gets the opcodes, messages,
//! server trait and dispatcher ([`protocol_code`]); the front-end gets a C
//! export per remoted function and a NOT_SUPPORTED stub for every other
//! symbol of the real driver ([`frontend_code`]). Build scripts call these,
//! so adding a row is all it takes to remote another call.
//!
//! The generator is deliberately plain string building: the table is small,
//! the output is read by `rustc` and by people chasing a compile error, and a
//! parse error names the offending line.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// One parsed table.
#[derive(Debug)]
pub struct Table {
    pub rows: Vec<Row>,
    /// Exports implemented by hand in the front-end.
    pub handwritten: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A frame about the connection itself.
    Control,
    /// A C export generated from the row.
    Export,
    /// As `Export`, plus a `_ptsz` variant.
    Ptsz,
    /// A message only.
    Wire,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    In,
    Out,
    OptOut,
}

#[derive(Debug, Clone)]
pub struct Param {
    pub dir: Dir,
    pub name: String,
    pub ty: String,
}

#[derive(Debug, Clone)]
pub struct Row {
    pub opcode: u16,
    pub kind: Kind,
    pub name: String,
    pub params: Vec<Param>,
    pub aliases: Vec<String>,
    /// Sent without waiting for the reply.
    pub posted: bool,
    /// How the front-end's memos take part in the call.
    pub memo: Option<MemoUse>,
    /// Queues work on a device or waits for it.
    pub device: bool,
}

/// A row's part in one of the front-end's memos (`crate::memo`), named in
/// lower case in the table and in upper case in the front-end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemoUse {
    /// `memo(NAME)`: a query whose answer the memo keeps. Its first handle
    /// parameter names the group the answer belongs to, and a handle it
    /// returns joins that group.
    Keeps(String),
    /// `changes(NAME)`: a call that changes what the memo knows of its
    /// first handle parameter's group.
    Changes(String),
    /// `forgets(NAME)`: a call after which the memo forgets everything.
    Forgets(String),
}

impl MemoUse {
    fn parse(word: &str) -> Option<MemoUse> {
        let (what, rest) = word.split_once('(')?;
        let name = rest.strip_suffix(')').filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_lowercase()))?;
        let name = name.to_owned();
        match what {
            "memo" => Some(MemoUse::Keeps(name)),
            "changes" => Some(MemoUse::Changes(name)),
            "forgets" => Some(MemoUse::Forgets(name)),
            _ => None,
        }
    }
}

/// Handle types that name a memo group: what a function's answers may
/// change with.
const GROUP_TYPES: [&str; 4] = ["Func", "Kernel", "Module", "Library"];

impl Row {
    /// The parameter naming the row's memo group: its first handle of a
    /// [`GROUP_TYPES`] type.
    fn group_param(&self) -> Option<&Param> {
        self.params.iter().find(|p| p.dir == Dir::In && GROUP_TYPES.contains(&p.ty.as_str()))
    }

    /// Every symbol this row exports.
    pub fn exports(&self) -> Vec<String> {
        let mut names = match self.kind {
            Kind::Export => vec![self.name.clone()],
            Kind::Ptsz => vec![self.name.clone(), format!("{}_ptsz", self.name)],
            Kind::Wire | Kind::Control => vec![],
        };
        names.extend(self.aliases.iter().cloned());
        names
    }
}

/// Parses the table; errors name the line.
pub fn parse(text: &str) -> Result<Table, String> {
    let mut table = Table { rows: Vec::new(), handwritten: Vec::new() };
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with('[') {
            continue;
        }
        let fail = |why: &str| format!("calls.api line {}: {why}: {line}", i + 1);
        if let Some(names) = line.strip_prefix("handwritten ") {
            table.handwritten.extend(names.split_whitespace().map(str::to_owned));
            continue;
        }
        let (opcode, rest) = line.split_once(' ').ok_or_else(|| fail("expected an opcode"))?;
        let opcode = u16::from_str_radix(opcode.trim_start_matches("0x"), 16).map_err(|_| fail("bad opcode"))?;
        let (kind, rest) = rest.trim().split_once(' ').ok_or_else(|| fail("expected a kind"))?;
        let kind = match kind {
            "control" => Kind::Control,
            "export" => Kind::Export,
            "ptsz" => Kind::Ptsz,
            "wire" => Kind::Wire,
            _ => return Err(fail("unknown kind")),
        };
        let mut rest = rest.trim();
        let (mut posted, mut memo, mut device) = (false, None, false);
        loop {
            let (word, after) = rest.split_once(' ').unwrap_or((rest, ""));
            if word == "posted" {
                posted = true;
            } else if word == "device" {
                device = true;
            } else if let Some(m) = MemoUse::parse(word) {
                if memo.replace(m).is_some() {
                    return Err(fail("a row takes part in one memo at most"));
                }
            } else {
                break;
            }
            rest = after.trim();
        }
        if (posted || memo.is_some()) && !matches!(kind, Kind::Export | Kind::Ptsz) {
            return Err(fail("only export and ptsz rows can be posted or use a memo"));
        }
        if posted && memo.is_some() {
            return Err(fail("a posted row waits for nothing a memo could keep"));
        }
        if device && (kind == Kind::Control || memo.is_some()) {
            return Err(fail("only a call that is no memo's query can reach a device"));
        }
        if kind == Kind::Control {
            let row =
                Row { opcode, kind, name: rest.to_owned(), params: vec![], aliases: vec![], posted, memo, device };
            table.rows.push(row);
            continue;
        }
        let open = rest.find('(').ok_or_else(|| fail("expected '('"))?;
        let close = rest.find(')').ok_or_else(|| fail("expected ')'"))?;
        let name = rest[..open].trim().to_owned();
        let mut params = parse_params(&rest[open + 1..close], Dir::In).map_err(|e| fail(&e))?;
        let mut tail = rest[close + 1..].trim();
        if kind == Kind::Wire {
            let results = tail.strip_prefix("->").ok_or_else(|| fail("a wire row needs '-> (...)'"))?.trim();
            let inner =
                results.strip_prefix('(').and_then(|r| r.strip_suffix(')')).ok_or_else(|| fail("bad results"))?;
            params.extend(parse_params(inner, Dir::Out).map_err(|e| fail(&e))?);
            tail = "";
        }
        let aliases = match tail.strip_prefix("also ") {
            Some(names) => names.split_whitespace().map(str::to_owned).collect(),
            None if tail.is_empty() => vec![],
            None => return Err(fail("unexpected text after the parameters")),
        };
        for p in &params {
            if !TYPES.iter().any(|t| t.name == p.ty) {
                return Err(fail(&format!("unknown type {}", p.ty)));
            }
            let ty = ty(&p.ty);
            if matches!(kind, Kind::Export | Kind::Ptsz) && ty.c.is_empty() {
                return Err(fail(&format!("type {} has no C form", p.ty)));
            }
        }
        if posted && params.iter().any(|p| p.dir != Dir::In) {
            return Err(fail("a posted row cannot have results"));
        }
        let row = Row { opcode, kind, name, params, aliases, posted, memo, device };
        if matches!(row.memo, Some(MemoUse::Changes(_))) && row.group_param().is_none() {
            return Err(fail("a row that changes a memo needs a handle parameter to name the group"));
        }
        table.rows.push(row);
    }
    table.check()?;
    Ok(table)
}

fn parse_params(text: &str, default: Dir) -> Result<Vec<Param>, String> {
    let mut params = Vec::new();
    for p in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (head, ty) = p.split_once(':').ok_or("a parameter needs ': TYPE'")?;
        let mut words = head.split_whitespace().collect::<Vec<_>>();
        let name = words.pop().ok_or("a parameter needs a name")?.to_owned();
        let dir = match words.as_slice() {
            [] => default,
            ["out"] => Dir::Out,
            ["out?"] => Dir::OptOut,
            _ => return Err(format!("bad parameter {p}")),
        };
        params.push(Param { dir, name, ty: ty.trim().to_owned() });
    }
    Ok(params)
}

impl Table {
    fn check(&self) -> Result<(), String> {
        let mut opcodes = BTreeSet::new();
        let mut names = BTreeSet::new();
        for row in &self.rows {
            if row.opcode == 0 {
                return Err(format!("{}: opcode 0 is reserved", row.name));
            }
            if !opcodes.insert(row.opcode) {
                return Err(format!("{}: opcode {:#06x} used twice", row.name, row.opcode));
            }
            if !names.insert(row.name.clone()) {
                return Err(format!("{} appears twice", row.name));
            }
        }
        let mut exported = BTreeSet::new();
        for name in self.rows.iter().flat_map(Row::exports).chain(self.handwritten.iter().cloned()) {
            if !exported.insert(name.clone()) {
                return Err(format!("{name} is exported twice"));
            }
        }
        Ok(())
    }

    /// Every symbol the front-end implements, generated or by hand.
    pub fn implemented(&self) -> BTreeSet<String> {
        self.rows.iter().flat_map(Row::exports).chain(self.handwritten.iter().cloned()).collect()
    }
}

/// How a table type appears in Rust messages and at the C boundary.
struct Type {
    name: &'static str,
    /// The message field type.
    wire: &'static str,
    /// The C parameter type; empty for message-only types.
    c: &'static str,
    /// Expression turning C parameter `{}` into the message field.
    from_c: &'static str,
    /// Expression turning message value `{}` into the C out-value.
    to_c: &'static str,
}

const TYPES: &[Type] = &[
    Type { name: "u32", wire: "u32", c: "u32", from_c: "{}", to_c: "{}" },
    Type { name: "i32", wire: "i32", c: "i32", from_c: "{}", to_c: "{}" },
    Type { name: "u64", wire: "u64", c: "u64", from_c: "{}", to_c: "{}" },
    Type { name: "usize", wire: "u64", c: "usize", from_c: "{} as u64", to_c: "{} as usize" },
    Type { name: "f32", wire: "f32", c: "f32", from_c: "{}", to_c: "{}" },
    Type { name: "bool", wire: "bool", c: "", from_c: "", to_c: "" },
    Type { name: "Device", wire: "i32", c: "i32", from_c: "{}", to_c: "{}" },
    Type { name: "DevPtr", wire: "DevPtr", c: "u64", from_c: "DevPtr({})", to_c: "{}.0" },
    Type { name: "Ctx", wire: "Ctx", c: "*mut c_void", from_c: "Ctx({} as u64)", to_c: "{}.0 as *mut c_void" },
    Type { name: "Module", wire: "Module", c: "*mut c_void", from_c: "Module({} as u64)", to_c: "{}.0 as *mut c_void" },
    Type { name: "Func", wire: "Func", c: "*mut c_void", from_c: "Func({} as u64)", to_c: "{}.0 as *mut c_void" },
    Type { name: "Stream", wire: "Stream", c: "*mut c_void", from_c: "Stream({} as u64)", to_c: "{}.0 as *mut c_void" },
    Type { name: "Event", wire: "Event", c: "*mut c_void", from_c: "Event({} as u64)", to_c: "{}.0 as *mut c_void" },
    Type {
        name: "Library",
        wire: "Library",
        c: "*mut c_void",
        from_c: "Library({} as u64)",
        to_c: "{}.0 as *mut c_void",
    },
    Type { name: "Kernel", wire: "Kernel", c: "*mut c_void", from_c: "Kernel({} as u64)", to_c: "{}.0 as *mut c_void" },
    Type { name: "Graph", wire: "Graph", c: "*mut c_void", from_c: "Graph({} as u64)", to_c: "{}.0 as *mut c_void" },
    Type {
        name: "GraphExec",
        wire: "GraphExec",
        c: "*mut c_void",
        from_c: "GraphExec({} as u64)",
        to_c: "{}.0 as *mut c_void",
    },
    Type {
        name: "GraphNode",
        wire: "GraphNode",
        c: "*mut c_void",
        from_c: "GraphNode({} as u64)",
        to_c: "{}.0 as *mut c_void",
    },
    Type {
        name: "MemPool",
        wire: "MemPool",
        c: "*mut c_void",
        from_c: "MemPool({} as u64)",
        to_c: "{}.0 as *mut c_void",
    },
    Type { name: "Array", wire: "Array", c: "*mut c_void", from_c: "Array({} as u64)", to_c: "{}.0 as *mut c_void" },
    Type { name: "Name", wire: "String", c: "*const c_char", from_c: "crate::ffi::c_name({})?", to_c: "" },
    Type { name: "Bytes", wire: "Vec<u8>", c: "", from_c: "", to_c: "" },
    Type { name: "Seq<u32>", wire: "Seq<u32>", c: "", from_c: "", to_c: "" },
    Type { name: "Seq<u64>", wire: "Seq<u64>", c: "", from_c: "", to_c: "" },
    Type { name: "AllocProp", wire: "AllocProp", c: "", from_c: "", to_c: "" },
    Type { name: "Seq<AccessDesc>", wire: "Seq<AccessDesc>", c: "", from_c: "", to_c: "" },
    Type { name: "PoolProps", wire: "PoolProps", c: "", from_c: "", to_c: "" },
    Type { name: "ArrayDesc", wire: "ArrayDesc", c: "", from_c: "", to_c: "" },
    Type { name: "Copy3D", wire: "Copy3D", c: "", from_c: "", to_c: "" },
    Type { name: "ResourceDesc", wire: "ResourceDesc", c: "", from_c: "", to_c: "" },
];

fn ty(name: &str) -> &'static Type {
    TYPES.iter().find(|t| t.name == name).expect("types are checked at parse time")
}

/// Opcodes, messages, the `Call` impls, the server's `Api` trait, its
/// dispatcher and `decode_request`, for `include!` into the protocol crate.
pub fn protocol_code(table: &Table) -> String {
    let mut s = String::new();
    let calls: Vec<&Row> = table.rows.iter().filter(|r| r.kind != Kind::Control).collect();

    s += "/// Every frame's opcode. 0 is reserved and never valid.\n";
    s += "#[repr(u16)]\n#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]\n#[allow(non_camel_case_types)]\npub enum Opcode {\n";
    for row in &table.rows {
        writeln!(s, "    {} = {:#06x},", row.name, row.opcode).unwrap();
    }
    s += "}\n\nimpl TryFrom<u16> for Opcode {\n    type Error = u16;\n    fn try_from(v: u16) -> Result<Opcode, u16> {\n        Ok(match v {\n";
    for row in &table.rows {
        writeln!(s, "            {:#06x} => Opcode::{},", row.opcode, row.name).unwrap();
    }
    s += "            _ => return Err(v),\n        })\n    }\n}\n\n";
    s += "impl Opcode {\n    /// The table's name for this opcode (the C function for exported rows).\n    pub fn name(self) -> &'static str {\n        match self {\n";
    for row in &table.rows {
        writeln!(s, "            Opcode::{0} => \"{0}\",", row.name).unwrap();
    }
    s += "        }\n    }\n\n";
    s += "    /// Whether the call queues work on a device or waits for it (`device` rows).\n    pub fn reaches_device(self) -> bool {\n        matches!(self, ";
    let device: Vec<String> = table.rows.iter().filter(|r| r.device).map(|r| format!("Opcode::{}", r.name)).collect();
    s += &if device.is_empty() { "_ if false".to_owned() } else { device.join(" | ") };
    s += ")\n    }\n}\n\n";

    s += "/// One module per call: its `Request` and `Reply`.\n#[allow(non_snake_case)]\npub mod calls {\n";
    for row in &calls {
        writeln!(s, "    pub mod {} {{\n        #[allow(unused_imports)]\n        use crate::*;", row.name).unwrap();
        for (msg, dirs) in [("Request", &[Dir::In][..]), ("Reply", &[Dir::Out, Dir::OptOut][..])] {
            writeln!(s, "        crate::wire_struct! {{\n            pub struct {msg} {{").unwrap();
            for p in row.params.iter().filter(|p| dirs.contains(&p.dir)) {
                writeln!(s, "                pub {}: {},", p.name, ty(&p.ty).wire).unwrap();
            }
            s += "            }\n        }\n";
        }
        writeln!(
            s,
            "        impl crate::Call for Request {{\n            const OPCODE: crate::Opcode = crate::Opcode::{};\n            type Reply = Reply;\n        }}\n    }}",
            row.name
        )
        .unwrap();
    }
    s += "}\n\n";

    s += "/// The server side of every call, one method per table row.\n#[allow(non_snake_case)]\npub trait Api {\n";
    for row in &calls {
        writeln!(
            s,
            "    fn {0}(&mut self, req: calls::{0}::Request) -> Result<calls::{0}::Reply, CallError>;",
            row.name
        )
        .unwrap();
    }
    s += "}\n\n";
    s += "/// Decodes a request payload, runs it on `api` and encodes the reply.\n";
    s += "/// The outer error is a payload that does not decode (the session ends);\n";
    s += "/// the inner one is the call's own CUDA error (the session goes on).\n";
    s += "pub fn dispatch<A: Api + ?Sized>(api: &mut A, opcode: Opcode, payload: &[u8]) -> Result<Result<Vec<u8>, CallError>, DecodeError> {\n    match opcode {\n";
    for row in &calls {
        writeln!(
            s,
            "        Opcode::{0} => Ok(api.{0}(codec::decode(payload)?).map(|r| codec::encode(&r))),",
            row.name
        )
        .unwrap();
    }
    let control_arms = |s: &mut String| {
        for row in table.rows.iter().filter(|r| r.kind == Kind::Control) {
            writeln!(
                s,
                "        Opcode::{} => Err(DecodeError::Invalid(\"a control frame is not a call\".into())),",
                row.name
            )
            .unwrap();
        }
    };
    control_arms(&mut s);
    s += "    }\n}\n\n";
    s += "/// Decodes a request payload as [`dispatch`] does and drops it, with no\n";
    s += "/// [`Api`] to run it on: for fuzzing the decoders a guest's frames reach.\n";
    s += "pub fn decode_request(opcode: Opcode, payload: &[u8]) -> Result<(), DecodeError> {\n    match opcode {\n";
    for row in &calls {
        writeln!(s, "        Opcode::{0} => codec::decode::<calls::{0}::Request>(payload).map(drop),", row.name)
            .unwrap();
    }
    control_arms(&mut s);
    s += "    }\n}\n";
    s
}

/// The front-end's generated exports and NOT_SUPPORTED stubs.
/// `all_exports` is the real driver's symbol list; every symbol the table
/// names must be on it.
pub fn frontend_code(table: &Table, all_exports: &[String]) -> Result<String, String> {
    let known: BTreeSet<&str> = all_exports.iter().map(String::as_str).collect();
    let implemented = table.implemented();
    if let Some(stray) = implemented.iter().find(|n| !known.contains(n.as_str())) {
        return Err(format!("{stray} is not an export of the real driver"));
    }
    let mut s = String::new();
    for row in table.rows.iter().filter(|r| matches!(r.kind, Kind::Export | Kind::Ptsz)) {
        let mut variants: Vec<(String, bool)> = vec![(row.name.clone(), false)];
        variants.extend(row.aliases.iter().map(|a| (a.clone(), false)));
        if row.kind == Kind::Ptsz {
            variants.push((format!("{}_ptsz", row.name), true));
        }
        for (export, ptsz) in variants {
            export_fn(&mut s, row, &export, ptsz);
        }
    }
    let stubs: BTreeMap<&str, ()> =
        all_exports.iter().filter(|n| !implemented.contains(*n)).map(|n| (n.as_str(), ())).collect();
    s += "\n// Not implemented yet: each answers CUDA_ERROR_NOT_SUPPORTED and logs its name once.\n";
    s += "// Declared without parameters: under the SysV x86-64 calling convention the\n";
    s += "// caller owns its arguments, so ignoring them is sound whatever the real signature.\n";
    s += "crate::ffi::unsupported_exports! {\n";
    for name in stubs.keys() {
        writeln!(s, "    {name},").unwrap();
    }
    s += "}\n";
    Ok(s)
}

fn export_fn(s: &mut String, row: &Row, export: &str, ptsz: bool) {
    let params: Vec<String> = row
        .params
        .iter()
        .map(|p| {
            let c = ty(&p.ty).c;
            match p.dir {
                Dir::In => format!("{}: {c}", p.name),
                Dir::Out | Dir::OptOut => format!("{}: *mut {c}", p.name),
            }
        })
        .collect();
    writeln!(s, "\n/// Remoted through `calls::{}`.", row.name).unwrap();
    *s += "///\n/// # Safety\n/// Out-parameters must be NULL or valid for a write, as the CUDA API requires.\n";
    writeln!(s, "#[no_mangle]\npub unsafe extern \"C\" fn {export}({}) -> CUresult {{", params.join(", ")).unwrap();
    writeln!(s, "    crate::ffi::entry(\"{export}\", || {{").unwrap();
    for p in row.params.iter().filter(|p| p.dir == Dir::Out) {
        writeln!(s, "        crate::ffi::check_out({})?;", p.name).unwrap();
    }
    writeln!(s, "        let req = calls::{}::Request {{", row.name).unwrap();
    for p in row.params.iter().filter(|p| p.dir == Dir::In) {
        let value = if ptsz && p.ty == "Stream" {
            format!("crate::ffi::ptsz_stream({})", p.name)
        } else {
            ty(&p.ty).from_c.replace("{}", &p.name)
        };
        if value == p.name {
            writeln!(s, "            {value},").unwrap();
        } else {
            writeln!(s, "            {}: {value},", p.name).unwrap();
        }
    }
    *s += "        };\n";
    if row.posted {
        // Nothing comes back to report a bad handle later, so NULL ones are
        // refused here, as the driver would at once.
        let handles: Vec<&str> = row
            .params
            .iter()
            .filter(|p| {
                matches!(
                    p.ty.as_str(),
                    "Ctx" | "Module" | "Func" | "Event" | "Library" | "Kernel" | "Graph" | "GraphExec" | "MemPool"
                )
            })
            .map(|p| p.name.as_str())
            .collect();
        for h in handles {
            writeln!(s, "        if req.{h}.0 == 0 {{ return Err(gpuplex_protocol::CuError::INVALID_HANDLE); }}")
                .unwrap();
        }
        *s += "        crate::client::post(req)?;\n        Ok(())\n    })\n}\n";
        return;
    }
    let outs: Vec<&Param> = row.params.iter().filter(|p| p.dir != Dir::In).collect();
    let binding = if outs.is_empty() { "_reply" } else { "reply" };
    let group = match row.group_param() {
        Some(p) => format!("crate::memo::group_of(req.{}.0)", p.name),
        None => "0".to_owned(),
    };
    match &row.memo {
        None => writeln!(s, "        let {binding} = crate::client::call(req)?;").unwrap(),
        Some(MemoUse::Keeps(m)) => {
            writeln!(s, "        let group = {group};").unwrap();
            writeln!(s, "        let {binding} = crate::memo::{}.keep(group, req)?;", m.to_uppercase()).unwrap();
            for p in outs.iter().filter(|p| GROUP_TYPES.contains(&p.ty.as_str())) {
                writeln!(s, "        crate::memo::adopt(reply.{}.0, group);", p.name).unwrap();
            }
        }
        Some(MemoUse::Changes(m)) => {
            writeln!(s, "        let {binding} = crate::memo::{}.change({group}, req)?;", m.to_uppercase()).unwrap()
        }
        Some(MemoUse::Forgets(m)) => {
            *s += "        let result = crate::client::call(req);\n";
            writeln!(s, "        crate::memo::{}.forget();", m.to_uppercase()).unwrap();
            writeln!(s, "        let {binding} = result?;").unwrap();
        }
    }
    for p in outs {
        let value = ty(&p.ty).to_c.replace("{}", &format!("reply.{}", p.name));
        writeln!(s, "        // SAFETY: NULL was refused or skipped; otherwise the caller vouches for the pointer.")
            .unwrap();
        writeln!(s, "        unsafe {{ crate::ffi::write_out({}, {value}) }};", p.name).unwrap();
    }
    *s += "        Ok(())\n    })\n}\n";
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "
# comment
[section]
handwritten cuInit
0x0001 control Hello
0x0110 export cuMemAlloc_v2(out dptr: DevPtr, bytesize: usize)
0x0111 ptsz cuStreamQuery(hStream: Stream) also cuStreamQueryAlias
0x0112 wire Copy(dst: DevPtr, data: Bytes) -> (n: u64)
0x0113 export memo(things) cuThingGetFunction(out f: Func, lib: Library, name: Name)
0x0114 export changes(things) cuThingSet(f: Func, value: i32)
0x0115 export forgets(things) cuThingUnload(lib: Library)
0x0116 wire device Run(stream: Stream) -> ()
";

    #[test]
    fn parses_rows() {
        let t = parse(SAMPLE).unwrap();
        assert_eq!(t.rows.len(), 8);
        assert!(t.rows[7].device && !t.rows[6].device);
        assert!(protocol_code(&t).contains("matches!(self, Opcode::Run)"));
        assert_eq!(t.rows[4].memo, Some(MemoUse::Keeps("things".into())));
        assert_eq!(t.rows[5].memo, Some(MemoUse::Changes("things".into())));
        assert_eq!(t.rows[1].params[0].dir, Dir::Out);
        assert_eq!(t.rows[2].exports(), ["cuStreamQuery", "cuStreamQuery_ptsz", "cuStreamQueryAlias"]);
        assert_eq!(t.rows[3].params[2].dir, Dir::Out);
        assert!(t.implemented().contains("cuInit"));
    }

    #[test]
    fn refuses_mistakes() {
        assert!(parse("0x0001 export a(x: u32)\n0x0001 export b(x: u32)").unwrap_err().contains("used twice"));
        assert!(parse("0x0001 export a(x: Banana)").unwrap_err().contains("unknown type"));
        assert!(parse("0x0001 export a(x: Bytes)").unwrap_err().contains("no C form"));
        assert!(parse("0x0001 wire a(x: u32)").unwrap_err().contains("->"));
        assert!(parse("0x0000 export a()").unwrap_err().contains("reserved"));
        assert!(parse("handwritten a\n0x0001 export a()").unwrap_err().contains("twice"));
        assert!(parse("0x0001 export posted memo(x) a(v: u32)").unwrap_err().contains("waits for nothing"));
        assert!(parse("0x0001 wire memo(x) a(v: u32) -> ()").unwrap_err().contains("only export"));
        assert!(parse("0x0001 export changes(x) a(v: u32)").unwrap_err().contains("handle parameter"));
        assert!(parse("0x0001 export memo(x) forgets(x) a(v: u32)").unwrap_err().contains("one memo"));
        assert!(parse("0x0001 export device memo(x) a(v: u32)").unwrap_err().contains("reach a device"));
    }

    #[test]
    fn frontend_stubs_everything_else() {
        let t = parse(SAMPLE).unwrap();
        let all: Vec<String> = [
            "cuInit",
            "cuMemAlloc_v2",
            "cuStreamQuery",
            "cuStreamQuery_ptsz",
            "cuStreamQueryAlias",
            "cuThingGetFunction",
            "cuThingSet",
            "cuThingUnload",
            "cuOther",
        ]
        .map(String::from)
        .to_vec();
        let code = frontend_code(&t, &all).unwrap();
        assert!(code.contains("let group = crate::memo::group_of(req.lib.0);"));
        assert!(code.contains("let reply = crate::memo::THINGS.keep(group, req)?;"));
        assert!(code.contains("crate::memo::adopt(reply.f.0, group);"));
        assert!(code.contains("let _reply = crate::memo::THINGS.change(crate::memo::group_of(req.f.0), req)?;"));
        assert!(code.contains("crate::memo::THINGS.forget();"));
        assert!(code.contains("pub unsafe extern \"C\" fn cuMemAlloc_v2(dptr: *mut u64, bytesize: usize)"));
        assert!(code.contains("crate::ffi::ptsz_stream(hStream)"));
        assert!(code.contains("    cuOther,\n"));
        assert!(!code.contains("    cuInit,\n"));
        assert!(frontend_code(&t, &all[1..]).unwrap_err().contains("cuInit"));
    }
}
