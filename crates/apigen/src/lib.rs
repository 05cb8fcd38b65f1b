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
    /// The server's side is generated too (for the types in `PASS_TYPES`).
    pub pass: bool,
    /// The table's section: its calls are one trait of the server's `Api`.
    pub section: String,
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
        self.variants().into_iter().map(|(name, _)| name).collect()
    }

    /// Each C export of the row, and whether it is a `_ptsz` one: the name,
    /// its aliases, and for a ptsz row each of those with `_ptsz`.
    pub fn variants(&self) -> Vec<(String, bool)> {
        if !matches!(self.kind, Kind::Export | Kind::Ptsz) {
            return Vec::new();
        }
        let names = std::iter::once(&self.name).chain(&self.aliases);
        let mut variants: Vec<(String, bool)> = names.clone().map(|n| (n.clone(), false)).collect();
        if self.kind == Kind::Ptsz {
            variants.extend(names.map(|n| (format!("{n}_ptsz"), true)));
        }
        variants
    }
}

/// Parses the table; errors name the line.
pub fn parse(text: &str) -> Result<Table, String> {
    let mut table = Table { rows: Vec::new(), handwritten: Vec::new() };
    let mut section = None;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        let fail = |why: &str| format!("calls.api line {}: {why}: {line}", i + 1);
        if let Some(header) = line.strip_prefix('[') {
            let name = header.split([':', ']']).next().unwrap_or_default();
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                return Err(fail("a section starts [name: ...], the name in snake_case"));
            }
            section = Some(name.to_owned());
            continue;
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
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
        let (mut posted, mut memo, mut device, mut pass) = (false, None, false, false);
        loop {
            let (word, after) = rest.split_once(' ').unwrap_or((rest, ""));
            if word == "posted" {
                posted = true;
            } else if word == "device" {
                device = true;
            } else if word == "pass" {
                pass = true;
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
        let section = section.clone().ok_or_else(|| fail("a row before any [section]"))?;
        if kind == Kind::Control {
            let row = Row {
                opcode,
                kind,
                name: rest.to_owned(),
                params: vec![],
                aliases: vec![],
                posted,
                memo,
                device,
                pass,
                section,
            };
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
        if pass && !matches!(kind, Kind::Export | Kind::Ptsz) {
            return Err(fail("only export and ptsz rows pass through"));
        }
        if let Some(p) = params.iter().find(|p| pass && pass_type(p).is_none()) {
            return Err(fail(&format!("{} {}: not a type that passes through", p.name, p.ty)));
        }
        let row = Row { opcode, kind, name, params, aliases, posted, memo, device, pass, section };
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
    Type { name: "Mipmap", wire: "Mipmap", c: "*mut c_void", from_c: "Mipmap({} as u64)", to_c: "{}.0 as *mut c_void" },
    Type {
        name: "UserObject",
        wire: "UserObject",
        c: "*mut c_void",
        from_c: "UserObject({} as u64)",
        to_c: "{}.0 as *mut c_void",
    },
    Type { name: "Name", wire: "String", c: "*const c_char", from_c: "crate::ffi::c_name({})?", to_c: "" },
    Type { name: "LaunchAttr", wire: "u32", c: "u32", from_c: "{}", to_c: "{}" },
    Type { name: "AttrValue", wire: "[u8; 64]", c: "[u8; 64]", from_c: "crate::ffi::read_in({})?", to_c: "{}" },
    Type { name: "Bytes", wire: "Vec<u8>", c: "", from_c: "", to_c: "" },
    Type { name: "Seq<u32>", wire: "Seq<u32>", c: "", from_c: "", to_c: "" },
    Type { name: "Seq<u64>", wire: "Seq<u64>", c: "", from_c: "", to_c: "" },
    Type { name: "AllocProp", wire: "AllocProp", c: "", from_c: "", to_c: "" },
    Type { name: "Seq<AccessDesc>", wire: "Seq<AccessDesc>", c: "", from_c: "", to_c: "" },
    Type { name: "Seq<MappedRun>", wire: "Seq<MappedRun>", c: "", from_c: "", to_c: "" },
    Type { name: "PoolProps", wire: "PoolProps", c: "", from_c: "", to_c: "" },
    Type { name: "ArrayDesc", wire: "ArrayDesc", c: "", from_c: "", to_c: "" },
    Type { name: "Copy3D", wire: "Copy3D", c: "", from_c: "", to_c: "" },
    Type { name: "ResourceDesc", wire: "ResourceDesc", c: "", from_c: "", to_c: "" },
];

/// Types the C caller passes by pointer even as inputs (unions it fills in).
const BY_POINTER: &[&str] = &["AttrValue"];

fn by_pointer(ty: &str) -> bool {
    BY_POINTER.contains(&ty)
}

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
    s += "    /// The table's section the call is in (`graphs`, `memory`...).\n    pub fn section(self) -> &'static str {\n        match self {\n";
    for row in &table.rows {
        writeln!(s, "            Opcode::{} => \"{}\",", row.name, row.section).unwrap();
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

    // One trait per section of the table, so that a server implements each
    // section's calls where it keeps what they deal in.
    let mut sections: Vec<&str> = Vec::new();
    for row in &calls {
        if !sections.contains(&row.section.as_str()) {
            sections.push(&row.section);
        }
    }
    for section in &sections {
        writeln!(
            s,
            "/// The server side of the table's `{section}` calls; a `pass` row's is\n/// generated ([`pass`]).\n#[allow(non_snake_case)]\npub trait {}: Resolver {{",
            section_trait(section)
        )
        .unwrap();
        for row in calls.iter().filter(|r| r.section == *section) {
            if row.pass {
                writeln!(
                    s,
                    "    fn {0}(&mut self, req: calls::{0}::Request) -> Result<calls::{0}::Reply, CallError> {{\n        pass::{0}(self, req)\n    }}",
                    row.name
                )
                .unwrap();
            } else {
                writeln!(
                    s,
                    "    fn {0}(&mut self, req: calls::{0}::Request) -> Result<calls::{0}::Reply, CallError>;",
                    row.name
                )
                .unwrap();
            }
        }
        s += "}\n\n";
    }
    let all: Vec<String> = sections.iter().map(|n| section_trait(n)).collect();
    writeln!(
        s,
        "/// The server side of every call: the traits of all sections.\npub trait Api: {0} {{}}\n\nimpl<T: {0}> Api for T {{}}\n",
        all.join(" + ")
    )
    .unwrap();
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
    s += &passthrough_code(table);
    s
}

/// The `Api` trait of a section's calls: `host_memory` as `HostMemoryCalls`.
fn section_trait(section: &str) -> String {
    let camel: String = section
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next().map(|f| f.to_ascii_uppercase().to_string() + c.as_str()).unwrap_or_default()
        })
        .collect();
    camel + "Calls"
}

/// How a parameter of a `pass` row reaches the driver: in the message,
/// through the `Passthrough` trait and at the C call.
struct PassType {
    name: &'static str,
    /// The `Passthrough` parameter (and result) type.
    rust: &'static str,
    /// The C type.
    c: &'static str,
    /// How the server resolves an input: a handle kind, or a check.
    resolve: Resolve,
}

#[derive(Clone, Copy, PartialEq)]
enum Resolve {
    /// Sent as is.
    Value,
    /// A guest device, numbered as the backend's.
    Device,
    /// A device address inside one of the session's regions.
    Pointer,
    /// A handle of this kind in the session's tables; as a result, the
    /// object must be one the session already holds.
    Handle(&'static str),
    /// A launch (or stream, or kernel node) attribute id, checked to carry
    /// only plain values.
    LaunchAttr,
}

/// The types a `pass` row may have.
const PASS_TYPES: &[PassType] = &[
    PassType { name: "u32", rust: "u32", c: "c_uint", resolve: Resolve::Value },
    PassType { name: "i32", rust: "i32", c: "c_int", resolve: Resolve::Value },
    PassType { name: "u64", rust: "u64", c: "u64", resolve: Resolve::Value },
    PassType { name: "usize", rust: "u64", c: "usize", resolve: Resolve::Value },
    PassType { name: "f32", rust: "f32", c: "f32", resolve: Resolve::Value },
    PassType { name: "Device", rust: "i32", c: "c_int", resolve: Resolve::Device },
    PassType { name: "DevPtr", rust: "u64", c: "u64", resolve: Resolve::Pointer },
    PassType { name: "Ctx", rust: "u64", c: "*mut c_void", resolve: Resolve::Handle("Ctx") },
    PassType { name: "Module", rust: "u64", c: "*mut c_void", resolve: Resolve::Handle("Module") },
    PassType { name: "Func", rust: "u64", c: "*mut c_void", resolve: Resolve::Handle("Func") },
    PassType { name: "Stream", rust: "u64", c: "*mut c_void", resolve: Resolve::Handle("Stream") },
    PassType { name: "Event", rust: "u64", c: "*mut c_void", resolve: Resolve::Handle("Event") },
    PassType { name: "Library", rust: "u64", c: "*mut c_void", resolve: Resolve::Handle("Library") },
    PassType { name: "Kernel", rust: "u64", c: "*mut c_void", resolve: Resolve::Handle("Kernel") },
    PassType { name: "Graph", rust: "u64", c: "*mut c_void", resolve: Resolve::Handle("Graph") },
    PassType { name: "GraphExec", rust: "u64", c: "*mut c_void", resolve: Resolve::Handle("GraphExec") },
    PassType { name: "GraphNode", rust: "u64", c: "*mut c_void", resolve: Resolve::Handle("GraphNode") },
    PassType { name: "MemPool", rust: "u64", c: "*mut c_void", resolve: Resolve::Handle("MemPool") },
    PassType { name: "Array", rust: "u64", c: "*mut c_void", resolve: Resolve::Handle("Array") },
    PassType { name: "UserObject", rust: "u64", c: "*mut c_void", resolve: Resolve::Handle("UserObject") },
    PassType { name: "LaunchAttr", rust: "u32", c: "c_uint", resolve: Resolve::LaunchAttr },
    PassType { name: "AttrValue", rust: "[u8; 64]", c: "[u8; 64]", resolve: Resolve::Value },
];

/// A parameter's pass type, where it may pass through.
fn pass_type(p: &Param) -> Option<&'static PassType> {
    let t = PASS_TYPES.iter().find(|t| t.name == p.ty)?;
    let result_ok = matches!(t.resolve, Resolve::Value | Resolve::Pointer | Resolve::Handle(_));
    (p.dir == Dir::In || (p.dir == Dir::Out && result_ok)).then_some(t)
}

fn pass_rows(table: &Table) -> impl Iterator<Item = &Row> {
    table.rows.iter().filter(|r| r.pass)
}

/// A `pass` row's parameters, each with its pass type.
type Typed<'a> = Vec<(&'a Param, &'static PassType)>;

/// A `pass` row's inputs and results.
fn pass_split(row: &Row) -> (Typed<'_>, Typed<'_>) {
    let typed = row.params.iter().map(|p| (p, pass_type(p).expect("checked at parse time")));
    typed.partition(|(p, _)| p.dir == Dir::In)
}

/// The `Passthrough` method's result type.
fn pass_result(outs: &[(&Param, &PassType)]) -> String {
    match outs {
        [] => "()".into(),
        [(_, t)] => t.rust.into(),
        many => format!("({})", many.iter().map(|(_, t)| t.rust).collect::<Vec<_>>().join(", ")),
    }
}

/// The `Handle` kinds, the `Passthrough` trait (each method answering
/// NOT_SUPPORTED unless a backend implements it) and the server-side
/// default of every `pass` row's `Api` method, which resolves each
/// parameter through the `Resolver` and calls the backend.
fn passthrough_code(table: &Table) -> String {
    let mut s = String::new();
    let kinds: BTreeSet<&str> =
        PASS_TYPES.iter().filter_map(|t| if let Resolve::Handle(k) = t.resolve { Some(k) } else { None }).collect();
    s += "\n/// The kinds of handle a passed-through call may name.\n#[derive(Clone, Copy, Debug, PartialEq, Eq)]\npub enum Handle {\n";
    for k in &kinds {
        writeln!(s, "    {k},").unwrap();
    }
    s += "}\n\n";
    s += "/// The backend's side of every `pass` row: the driver called with the\n/// session's resolved arguments, `call_ctx` (0 for none) current. A backend\n/// that does not implement a call answers CUDA_ERROR_NOT_SUPPORTED.\n#[allow(non_snake_case, unused_variables)]\npub trait Passthrough {\n";
    for row in pass_rows(table) {
        let (ins, outs) = pass_split(row);
        let args: Vec<String> = ins.iter().map(|(p, t)| format!("{}: {}", p.name, t.rust)).collect();
        writeln!(
            s,
            "    fn {0}(&self, call_ctx: u64, {1}) -> Result<{2}, CallError> {{\n        Err(CallError::new(CuError::NOT_SUPPORTED, \"{0} is not supported by this backend\"))\n    }}",
            row.name,
            args.join(", "),
            pass_result(&outs)
        )
        .unwrap();
    }
    s += "}\n\n";
    s += "/// What the generated server side of a `pass` row asks of the session.\npub trait Resolver {\n";
    s += "    /// The backend context a call naming no handle of a context runs in:\n    /// the guest's current one, or 0.\n    fn pass_context(&mut self) -> Result<u64, CallError>;\n";
    s += "    /// The backend object a guest's handle names; where `ctx` is still 0,\n    /// it becomes the object's context (the first such handle's is the call's).\n    fn resolve(&mut self, kind: Handle, handle: u64, ctx: &mut u64) -> Result<u64, CallError>;\n";
    s += "    /// The backend's number for a guest's device.\n    fn resolve_device(&mut self, device: i32) -> Result<i32, CallError>;\n";
    s += "    /// A device address, checked to lie in memory the session holds.\n    fn resolve_pointer(&mut self, ptr: u64) -> Result<u64, CallError>;\n";
    s += "    /// A launch attribute id, checked to carry only plain values.\n    fn resolve_launch_attr(&mut self, attr: u32) -> Result<u32, CallError>;\n";
    s += "    /// The guest's handle for an object the backend answered with, which\n    /// must be one the session already holds.\n    fn known(&mut self, kind: Handle, obj: u64) -> Result<u64, CallError>;\n";
    s += "    fn passthrough(&self) -> &dyn Passthrough;\n}\n\n";
    s += "/// The server side of every `pass` row, for any [`Resolver`].\n#[allow(non_snake_case, unused_variables)]\npub mod pass {\n    use crate::*;\n";
    for row in pass_rows(table) {
        let (ins, outs) = pass_split(row);
        writeln!(
            s,
            "    pub fn {0}<R: Resolver + ?Sized>(r: &mut R, req: calls::{0}::Request) -> Result<calls::{0}::Reply, CallError> {{",
            row.name
        )
        .unwrap();
        let handles = ins.iter().any(|(_, t)| matches!(t.resolve, Resolve::Handle(_)));
        if handles {
            s += "        let mut call_ctx = 0;\n";
        }
        for (p, t) in &ins {
            let value = match t.resolve {
                Resolve::Value => format!("req.{}", p.name),
                Resolve::Device => format!("r.resolve_device(req.{})?", p.name),
                Resolve::Pointer => format!("r.resolve_pointer(req.{}.0)?", p.name),
                Resolve::Handle(k) => format!("r.resolve(Handle::{k}, req.{}.0, &mut call_ctx)?", p.name),
                Resolve::LaunchAttr => format!("r.resolve_launch_attr(req.{})?", p.name),
            };
            writeln!(s, "        let {} = {value};", p.name).unwrap();
        }
        s += if handles {
            "        let call_ctx = if call_ctx == 0 { r.pass_context()? } else { call_ctx };\n"
        } else {
            "        let call_ctx = r.pass_context()?;\n"
        };
        let names: Vec<&str> = ins.iter().map(|(p, _)| p.name.as_str()).collect();
        let bound = match outs.as_slice() {
            [] => "()".to_owned(),
            [(p, _)] => p.name.clone(),
            many => format!("({})", many.iter().map(|(p, _)| p.name.as_str()).collect::<Vec<_>>().join(", ")),
        };
        writeln!(s, "        let {bound} = r.passthrough().{}(call_ctx, {})?;", row.name, names.join(", ")).unwrap();
        let fields: Vec<String> = outs
            .iter()
            .map(|(p, t)| match t.resolve {
                Resolve::Pointer => format!("{0}: DevPtr({0})", p.name),
                Resolve::Handle(k) => format!("{0}: {k}(r.known(Handle::{k}, {0})?)", p.name),
                _ => p.name.clone(),
            })
            .collect();
        writeln!(s, "        Ok(calls::{}::Reply {{ {} }})\n    }}", row.name, fields.join(", ")).unwrap();
    }
    s += "}\n";
    s
}

/// A C type named from anywhere (`c_uint` as `std::ffi::c_uint`).
fn qualified(c: &str) -> String {
    c.replace("c_", "std::ffi::c_")
}

/// For the server's CUDA backend: the driver entry point of every `pass`
/// row (for its `driver_api!`) and the `Passthrough` implementation that
/// calls them, as `(bindings, implementation)`.
pub fn cuda_passthrough_code(table: &Table) -> (String, String) {
    let (mut bindings, mut imp) = (String::from("driver_api! {\n"), String::new());
    imp += "// The table keeps CUDA's parameter names.\n#[allow(non_snake_case)]\nimpl gpuplex_protocol::Passthrough for Cuda {\n";
    for row in pass_rows(table) {
        let (ins, outs) = pass_split(row);
        let mut c_params: Vec<String> = Vec::new();
        let mut args: Vec<String> = Vec::new();
        let mut prelude = String::new();
        for p in &row.params {
            let t = pass_type(p).expect("checked at parse time");
            if p.dir == Dir::In && by_pointer(&p.ty) {
                c_params.push(format!("{}: *const {}", p.name, t.c));
                args.push(format!("&{}", p.name));
            } else if p.dir == Dir::In {
                c_params.push(format!("{}: {}", p.name, t.c));
                args.push(match t.c {
                    "*mut c_void" => format!("{} as usize as *mut std::ffi::c_void", p.name),
                    "usize" => format!("{} as usize", p.name),
                    _ => p.name.clone(),
                });
            } else {
                c_params.push(format!("{}: *mut {}", p.name, t.c));
                let init = match t.c {
                    "*mut c_void" => "std::ptr::null_mut()".to_owned(),
                    array if array.starts_with("[u8; ") => array.replacen("u8", "0", 1),
                    _ => "Default::default()".to_owned(),
                };
                writeln!(prelude, "        let mut {}: {} = {init};", p.name, qualified(t.c)).unwrap();
                args.push(format!("&mut {}", p.name));
            }
        }
        writeln!(bindings, "    {}({});", row.name, c_params.join(", ")).unwrap();
        let params: Vec<String> = ins.iter().map(|(p, t)| format!("{}: {}", p.name, t.rust)).collect();
        writeln!(
            imp,
            "    fn {}(&self, call_ctx: u64, {}) -> BResult<{}> {{",
            row.name,
            params.join(", "),
            pass_result(&outs)
        )
        .unwrap();
        imp += "        enter(Obj(call_ctx))?;\n";
        imp += &prelude;
        writeln!(
            imp,
            "        // SAFETY: the entry point's prototype in cuda.h; every handle and\n        // address is the session's, resolved and checked by it; results go\n        // to locals.\n        api::check(unsafe {{ api::{}({}) }})?;",
            row.name,
            args.join(", ")
        )
        .unwrap();
        let results: Vec<String> = outs
            .iter()
            .map(|(p, t)| match t.c {
                "usize" | "*mut c_void" => format!("{} as u64", p.name),
                _ => p.name.clone(),
            })
            .collect();
        match results.as_slice() {
            [] => imp += "        Ok(())\n",
            [one] => writeln!(imp, "        Ok({one})").unwrap(),
            many => writeln!(imp, "        Ok(({}))", many.join(", ")).unwrap(),
        }
        imp += "    }\n";
    }
    bindings += "}\n";
    imp += "}\n";
    (bindings, imp)
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
        for (export, ptsz) in row.variants() {
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
                Dir::In if by_pointer(&p.ty) => format!("{}: *const {c}", p.name),
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
0x0117 export pass cuThingQuery(node: GraphNode, dev: Device, p: DevPtr, out value: u64, out at: DevPtr)
0x0118 export pass cuThingAttr(node: GraphNode, attr: LaunchAttr, value: AttrValue, out event: Event, out old: AttrValue)
";

    #[test]
    fn parses_rows() {
        let t = parse(SAMPLE).unwrap();
        assert_eq!(t.rows.len(), 10);
        assert!(t.rows[7].device && !t.rows[6].device);
        assert!(protocol_code(&t).contains("matches!(self, Opcode::Run)"));
        assert_eq!(t.rows[4].memo, Some(MemoUse::Keeps("things".into())));
        assert_eq!(t.rows[5].memo, Some(MemoUse::Changes("things".into())));
        assert_eq!(t.rows[1].params[0].dir, Dir::Out);
        assert_eq!(
            t.rows[2].exports(),
            ["cuStreamQuery", "cuStreamQueryAlias", "cuStreamQuery_ptsz", "cuStreamQueryAlias_ptsz"]
        );
        assert_eq!(t.rows[3].params[2].dir, Dir::Out);
        assert!(t.implemented().contains("cuInit"));
    }

    #[test]
    fn refuses_mistakes() {
        let in_section = |rows: &str| parse(&format!("[s: a section]\n{rows}"));
        assert!(parse("0x0001 export a(x: u32)").unwrap_err().contains("before any [section]"));
        assert!(parse("[Streams: no]\n0x0001 export a(x: u32)").unwrap_err().contains("snake_case"));
        assert!(in_section("0x0001 export a(x: u32)\n0x0001 export b(x: u32)").unwrap_err().contains("used twice"));
        assert!(in_section("0x0001 export a(x: Banana)").unwrap_err().contains("unknown type"));
        assert!(in_section("0x0001 export a(x: Bytes)").unwrap_err().contains("no C form"));
        assert!(in_section("0x0001 wire a(x: u32)").unwrap_err().contains("->"));
        assert!(in_section("0x0000 export a()").unwrap_err().contains("reserved"));
        assert!(in_section("handwritten a\n0x0001 export a()").unwrap_err().contains("twice"));
        assert!(in_section("0x0001 export posted memo(x) a(v: u32)").unwrap_err().contains("waits for nothing"));
        assert!(in_section("0x0001 wire memo(x) a(v: u32) -> ()").unwrap_err().contains("only export"));
        assert!(in_section("0x0001 export changes(x) a(v: u32)").unwrap_err().contains("handle parameter"));
        assert!(in_section("0x0001 export memo(x) forgets(x) a(v: u32)").unwrap_err().contains("one memo"));
        assert!(in_section("0x0001 export device memo(x) a(v: u32)").unwrap_err().contains("reach a device"));
        assert!(in_section("0x0001 wire pass a(v: u32) -> ()").unwrap_err().contains("only export and ptsz"));
        assert!(in_section("0x0001 export pass a(v: Name)").unwrap_err().contains("passes through"));
        assert!(in_section("0x0001 export pass a(out m: Mipmap)").unwrap_err().contains("passes through"));
    }

    #[test]
    fn pass_rows_are_generated_for_both_sides() {
        let t = parse(SAMPLE).unwrap();
        let protocol = protocol_code(&t);
        assert!(protocol.contains("let node = r.resolve(Handle::GraphNode, req.node.0, &mut call_ctx)?;"));
        assert!(protocol.contains("let call_ctx = if call_ctx == 0 { r.pass_context()? } else { call_ctx };"));
        assert!(protocol.contains("let dev = r.resolve_device(req.dev)?;"));
        assert!(protocol.contains("let p = r.resolve_pointer(req.p.0)?;"));
        assert!(protocol.contains("let (value, at) = r.passthrough().cuThingQuery(call_ctx, node, dev, p)?;"));
        assert!(protocol.contains("Ok(calls::cuThingQuery::Reply { value, at: DevPtr(at) })"));
        assert!(protocol.contains(
            "fn cuThingQuery(&self, call_ctx: u64, node: u64, dev: i32, p: u64) -> Result<(u64, u64), CallError>"
        ));
        let (bindings, imp) = cuda_passthrough_code(&t);
        assert!(
            bindings.contains("cuThingQuery(node: *mut c_void, dev: c_int, p: u64, value: *mut u64, at: *mut u64);")
        );
        assert!(imp.contains("api::cuThingQuery(node as usize as *mut std::ffi::c_void, dev, p, &mut value, &mut at)"));
        assert!(imp.contains("Ok((value, at))"));
    }

    #[test]
    fn each_section_is_a_trait_of_the_api() {
        let t =
            parse("[host_memory: one]\n0x0001 export a(v: u32)\n[graphs: two]\n0x0002 export pass b(v: u32)").unwrap();
        let protocol = protocol_code(&t);
        assert!(protocol.contains("pub trait HostMemoryCalls: Resolver {\n    fn a("));
        assert!(protocol.contains("pub trait GraphsCalls: Resolver {\n    fn b("));
        assert!(protocol.contains("pub trait Api: HostMemoryCalls + GraphsCalls {}"));
    }

    #[test]
    fn pass_rows_take_attributes_by_pointer_and_return_held_handles() {
        let t = parse(SAMPLE).unwrap();
        let protocol = protocol_code(&t);
        assert!(protocol.contains("let attr = r.resolve_launch_attr(req.attr)?;"));
        assert!(
            protocol.contains("Ok(calls::cuThingAttr::Reply { event: Event(r.known(Handle::Event, event)?), old })")
        );
        let (bindings, imp) = cuda_passthrough_code(&t);
        assert!(bindings.contains(
            "cuThingAttr(node: *mut c_void, attr: c_uint, value: *const [u8; 64], event: *mut *mut c_void, old: *mut [u8; 64]);"
        ));
        assert!(imp.contains("let mut event: *mut std::ffi::c_void = std::ptr::null_mut();"));
        assert!(imp.contains("let mut old: [u8; 64] = [0; 64];"));
        assert!(imp.contains("Ok((event as u64, old))"));
        let all: Vec<String> = t.implemented().into_iter().collect();
        let code = frontend_code(&t, &all).unwrap();
        assert!(code.contains("value: *const [u8; 64], event: *mut *mut c_void, old: *mut [u8; 64]"));
        assert!(code.contains("value: crate::ffi::read_in(value)?,"));
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
            "cuStreamQueryAlias_ptsz",
            "cuThingGetFunction",
            "cuThingSet",
            "cuThingUnload",
            "cuThingQuery",
            "cuThingAttr",
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
