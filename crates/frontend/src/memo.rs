//! Answers the client keeps instead of asking the server again.
//!
//! The runtime and frameworks ask some questions thousands of times per
//! training step (which device a context is on, whether a primary context
//! is active, a kernel's attributes and occupancy), and each answer stays
//! true until a call that this same library forwards changes it. So the
//! first answer is kept here, and the calls that change answers forget
//! them; the API table marks which rows keep, change or forget which memo.
//!
//! Answers are kept per *group*: a library or a module and every kernel,
//! module and function obtained from it. Setting an attribute of one
//! function can change what is answered about its aliases (the kernel it
//! came from, the same function reached through the library's module), and
//! those are all in its group; other groups keep their answers. A call
//! that changes a group is itself remembered, so that setting the same
//! attribute to the same value again (as some libraries do before every
//! launch) is answered here while nothing has changed since.
//!
//! Keys are the call's opcode, the calling thread's current context and the
//! request's bytes, so an answer is reused only for the very same question
//! in the same context. An answer fetched while a forget happened is not
//! kept (a generation count tells), so a racing thread cannot reinstate a
//! stale one.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use gpuplex_protocol::codec::{self, Wire};
use gpuplex_protocol::{Call, CuError};

use crate::{client, context};

/// Which device each context is on.
pub static CONTEXTS: Memo = Memo::new(0);
/// Primary contexts' flags and state, kept only while active.
pub static PRIMARY: Memo = Memo::new(1);
/// What is known about modules, libraries, kernels and functions.
pub static FUNCTIONS: Memo = Memo::new(2);
/// Streams that do not capture, kept only while no stream captures
/// (`graph::is_capturing_query`).
pub static CAPTURES: Memo = Memo::new(3);
/// Child graphs set into executable graphs' nodes, kept while no graph is
/// edited (`graph::nodes`).
pub static GRAPH_SETS: Memo = Memo::new(4);
/// Tensor maps encoded, a pure function of their parameters (`tensor_map`).
pub static TENSOR_MAPS: Memo = Memo::new(5);
const MEMOS: usize = 6;

/// One kind of answers: kept here for every thread, and copied into each
/// thread that reads them, so that a repeated question takes no lock.
pub struct Memo {
    /// Its place in each thread's copies.
    id: usize,
    /// Bumped by every forget; a thread's copy made before is stale.
    generation: AtomicU64,
    groups: Mutex<Option<FastMap<u64, Answers>>>,
}

type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;
/// Answers by key, as encoded replies.
type Answers = FastMap<Box<[u8]>, Box<[u8]>>;

/// Rotates, mixes in and multiplies a word at a time (as rustc's own maps
/// do): keys are short and come from this process, which has no reason to
/// collide its own lookups, and a repeated question must cost little.
#[derive(Default)]
struct FastHasher(u64);

impl FastHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            self.add(u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A thread's copy of one memo's answers, keyed by group and question, and
/// the last question it asked, compared before anything is hashed: most
/// callers ask the same thing many times in a row.
#[derive(Default)]
struct Seen {
    generation: u64,
    answers: Answers,
    last: Option<(Vec<u8>, Vec<u8>)>,
}

impl Seen {
    fn get(&mut self, key: &[u8]) -> Option<&[u8]> {
        if self.last.as_ref().is_none_or(|(k, _)| k.as_slice() != key) {
            let answer = self.answers.get(key)?;
            let (k, a) = self.last.get_or_insert_with(Default::default);
            k.clear();
            k.extend_from_slice(key);
            a.clear();
            a.extend_from_slice(answer);
        }
        self.last.as_ref().map(|(_, a)| a.as_slice())
    }
}

thread_local! {
    /// The key being looked up, built in place so a hit allocates nothing.
    static KEY: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static SEEN: RefCell<[Seen; MEMOS]> = RefCell::new(Default::default());
}

/// `f` of the key of `req` about `group`, asked in the calling thread's
/// current context: the group, the opcode, the context, the request.
fn with_key<C: Call, T>(group: u64, req: &C, f: impl Fn(&[u8]) -> T) -> T {
    let build = |key: &mut Vec<u8>| {
        key.clear();
        key.extend_from_slice(&group.to_le_bytes());
        key.extend_from_slice(&(C::OPCODE as u16).to_le_bytes());
        key.extend_from_slice(&context::current().to_le_bytes());
        req.put(key);
    };
    let in_place = KEY.try_with(|k| {
        let mut k = k.try_borrow_mut().ok()?;
        build(&mut k);
        Some(f(&k))
    });
    match in_place {
        Ok(Some(out)) => out,
        // In a thread's exit handlers, or re-entered: a key of its own.
        _ => {
            let mut key = Vec::new();
            build(&mut key);
            f(&key)
        }
    }
}

/// A question not answered yet: the generation to keep its answer at, and its key.
struct Miss {
    generation: u64,
    key: Vec<u8>,
}

impl Memo {
    pub const fn new(id: usize) -> Memo {
        Memo { id, generation: AtomicU64::new(0), groups: Mutex::new(None) }
    }

    /// The kept answer to `req`, or else what it takes to keep a fresh one.
    fn find<C: Call>(&self, group: u64, req: &C) -> Result<C::Reply, Miss> {
        with_key(group, req, |key| {
            let generation = self.generation.load(Ordering::Acquire);
            let decode = |bytes: &[u8]| codec::decode::<C::Reply>(bytes).ok();
            let seen = self.seen(generation, |seen| seen.get(key).and_then(decode)).flatten();
            seen.or_else(|| {
                let kept = self.lookup(group, key)?;
                let reply = decode(&kept);
                self.seen(generation, |seen| seen.answers.insert(key.into(), kept));
                reply
            })
            .ok_or_else(|| Miss { generation, key: key.to_vec() })
        })
    }

    /// `f` of the calling thread's copy, emptied first if older than
    /// `generation`; None in a thread's exit handlers.
    fn seen<T>(&self, generation: u64, f: impl FnOnce(&mut Seen) -> T) -> Option<T> {
        SEEN.try_with(|s| {
            let mut all = s.try_borrow_mut().ok()?;
            let seen = &mut all[self.id];
            if seen.generation != generation {
                seen.answers.clear();
                seen.last = None;
                seen.generation = generation;
            }
            Some(f(seen))
        })
        .ok()
        .flatten()
    }

    /// The answer kept for every thread.
    fn lookup(&self, group: u64, key: &[u8]) -> Option<Box<[u8]>> {
        let groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
        groups.as_ref()?.get(&group)?.get(key).cloned()
    }

    /// Keeps `reply` unless something was forgotten since the miss.
    fn keep_at<R: Wire>(&self, miss: Miss, group: u64, reply: &R) {
        let mut groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
        if self.generation.load(Ordering::Acquire) == miss.generation {
            let bytes: Box<[u8]> = codec::encode(reply).into();
            groups.get_or_insert_with(FastMap::default).entry(group).or_default().insert(miss.key.into(), bytes);
        }
    }

    /// The answer to `req`, from the memo or else from the server.
    pub fn keep<C: Call>(&self, group: u64, req: C) -> Result<C::Reply, CuError> {
        self.keep_if(group, req, |_| true)
    }

    /// As [`Memo::keep`], keeping a fresh answer only if `worth` says so.
    pub fn keep_if<C: Call>(
        &self,
        group: u64,
        req: C,
        worth: impl FnOnce(&C::Reply) -> bool,
    ) -> Result<C::Reply, CuError> {
        let miss = match self.find(group, &req) {
            Ok(reply) => return Ok(reply),
            Err(miss) => miss,
        };
        let reply = client::call(req)?;
        if worth(&reply) {
            self.keep_at(miss, group, &reply);
        }
        Ok(reply)
    }

    /// Forwards `req`, a call that changes what is known of `group`, unless
    /// the same call succeeded last with nothing changed since.
    pub fn change<C: Call>(&self, group: u64, req: C) -> Result<C::Reply, CuError> {
        let key = match self.find(group, &req) {
            Ok(reply) => return Ok(reply),
            Err(miss) => miss.key,
        };
        let result = client::call(req);
        let generation = self.forget_group(group);
        if let Ok(reply) = &result {
            self.keep_at(Miss { generation, key }, group, reply);
        }
        result
    }

    /// Sends `req`: posted where the very same call succeeded before with
    /// nothing forgotten since, for a call that then cannot fail; otherwise
    /// waited for, and kept if it succeeds.
    pub fn repeat<C: Call>(&self, group: u64, req: C) -> Result<(), CuError> {
        let miss = match self.find(group, &req) {
            Ok(_) => return client::post(req),
            Err(miss) => miss,
        };
        let reply = client::call(req)?;
        self.keep_at(miss, group, &reply);
        Ok(())
    }

    /// Forgets what is known of `group`; returns the new generation.
    fn forget_group(&self, group: u64) -> u64 {
        let mut groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(groups) = groups.as_mut() {
            groups.remove(&group);
        }
        self.generation.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// How many times anything was forgotten.
    #[cfg(test)]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Forgets everything.
    pub fn forget(&self) {
        let mut groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
        *groups = None;
        self.generation.fetch_add(1, Ordering::AcqRel);
    }
}

/// Each handle's group, where it is not its own: handles are never reused
/// within a session, so entries never go stale.
static GROUPS: Mutex<Option<FastMap<u64, u64>>> = Mutex::new(None);

/// The group `handle` belongs to.
pub fn group_of(handle: u64) -> u64 {
    let groups = GROUPS.lock().unwrap_or_else(PoisonError::into_inner);
    groups.as_ref().and_then(|g| g.get(&handle).copied()).unwrap_or(handle)
}

/// Records that `handle` (a kernel, module or function obtained from
/// something in `group`) belongs to `group`.
pub fn adopt(handle: u64, group: u64) {
    if handle != group && handle != 0 {
        GROUPS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert_with(FastMap::default)
            .insert(handle, group);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    gpuplex_protocol::wire_struct! {
        pub struct Answer { pub value: u64 }
    }

    gpuplex_protocol::wire_struct! {
        pub struct Question { pub n: u64 }
    }

    impl Call for Question {
        const OPCODE: gpuplex_protocol::Opcode = gpuplex_protocol::Opcode::cuFuncGetAttribute;
        type Reply = Answer;
    }

    /// Keeps `n`'s answer in `group` as a fetch that began now would.
    fn keep(memo: &Memo, group: u64, n: u64) {
        let miss = memo.find(group, &Question { n }).unwrap_err();
        memo.keep_at(miss, group, &Answer { value: n });
    }

    fn kept(memo: &Memo, group: u64, n: u64) -> Option<u64> {
        memo.find(group, &Question { n }).ok().map(|a| a.value)
    }

    #[test]
    fn an_answer_is_kept_per_group_and_forgotten_by_group_or_whole() {
        let memo = Memo::new(0);
        keep(&memo, 1, 1);
        keep(&memo, 2, 2);
        assert_eq!(kept(&memo, 1, 1), Some(1));
        assert_eq!(kept(&memo, 2, 1), None, "another group's question");
        memo.forget_group(1);
        assert_eq!(kept(&memo, 1, 1), None);
        assert_eq!(kept(&memo, 2, 2), Some(2));
        memo.forget();
        assert_eq!(kept(&memo, 2, 2), None);
    }

    #[test]
    fn another_thread_sees_a_kept_answer_and_its_forgetting() {
        let memo = Memo::new(1);
        keep(&memo, 1, 5);
        std::thread::scope(|s| {
            s.spawn(|| assert_eq!(kept(&memo, 1, 5), Some(5)));
        });
        assert_eq!(kept(&memo, 1, 5), Some(5));
        std::thread::scope(|s| {
            s.spawn(|| memo.forget_group(1));
        });
        assert_eq!(kept(&memo, 1, 5), None, "this thread's copy is stale after a forget elsewhere");
    }

    #[test]
    fn an_answer_fetched_across_a_forget_is_not_kept() {
        let memo = Memo::new(2);
        let miss = memo.find(7, &Question { n: 1 }).unwrap_err();
        memo.forget_group(9);
        memo.keep_at(miss, 7, &Answer { value: 1 });
        assert_eq!(kept(&memo, 7, 1), None);
    }

    #[test]
    fn adopted_handles_share_their_parent_s_group() {
        adopt(0x5010, 0x5000);
        adopt(0x5020, group_of(0x5010));
        assert_eq!(group_of(0x5020), 0x5000);
        assert_eq!(group_of(0x5030), 0x5030);
    }
}
