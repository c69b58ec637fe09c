//! Interning: strings, code objects, frames and the trie of stacks, and the resolution of the
//! agent's raw frames (code addresses) into stacks.
//!
//! Stacks are interned in a trie (outermost frame at the root), so a stack is one node id and
//! shared prefixes are stored once. A `Code` record applies to the allocations after it, so a
//! reused code address gets its new meaning. Frames whose code was never announced are
//! `<unknown>`; an allocation with no frames at all is attributed to the pseudo-frame
//! `<no Python frame>`. A stack the agent cut at `max_depth` gets the pseudo-frame
//! `<truncated stack>` as its outermost frame, so it does not pass for a whole stack.
//!
//! A sample of a thread whose creation is known (`analysis::origins`) is grafted onto the
//! stack that created the thread: the creator's frames, then the pseudo-frame [`NEW_THREAD`],
//! then the thread's own ([`StackResolver::graft`]).
//!
//! Each allocator (see [`crate::analysis::allocators`]) has its own root, so a stack also says
//! which allocator its blocks came from: the same Python frames calling `malloc` and making
//! Python objects are two stacks with the same frames. The roots are no frames:
//! [`Names::frames`] stops at them.
//!
//! A capture is untrusted input: every string enters through [`Names::string`], which keeps
//! it exact but cuts it to [`MAX_NAME`] bytes ([`crate::base::text::elide`]); the views make names
//! printable when they show them ([`crate::base::text::printable`]). A stack deeper than
//! [`MAX_DEPTH`] keeps its innermost frames and counts as truncated, and the memo of raw
//! stacks is bounded (`CACHE_FRAMES`).

pub(crate) mod native;

use mprof_common::record::{Allocator, Frame, Module, NativeStack};
use native::NativeResolver;
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hash, Hasher};

/// File name of the pseudo-frame for allocations made while no Python code ran.
pub const NO_PYTHON_FRAME: &str = "<no Python frame>";
/// File and function name of a frame whose code object was never announced.
pub const UNKNOWN: &str = "<unknown>";
/// The outermost pseudo-frame of stacks the agent cut at `max_depth`.
pub const TRUNCATED: &str = "<truncated stack>";

/// The pseudo-frame between a thread's own frames and the frames of the stack that created it.
pub const NEW_THREAD: &str = "<new thread>";
/// The function of a row grouped at a line that started the thread the bytes were allocated
/// on ([`crate::analysis::grouping`]): shown as `thread started at file:line`.
pub const THREAD_STARTED_AT: &str = "thread started at";

/// Deepest stack kept (the agent records at most `--max-depth` 256 frames); a deeper stack in
/// a capture keeps its innermost frames and counts as truncated.
pub const MAX_DEPTH: usize = 256;
/// Longest name (file, function) kept, in bytes; a longer one keeps its start and its end
/// around an ellipsis.
pub const MAX_NAME: usize = 256;
/// Raw stacks remembered for reuse at most (in frames); the memo is cleared beyond that.
const CACHE_FRAMES: usize = 1 << 20;

/// A stack: a node of the trie, named by its innermost frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackId(pub(crate) u32);

/// One resolved frame of a stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Location<'a> {
    pub file: &'a str,
    pub function: &'a str,
    /// The line running in this frame (0 for the pseudo-frame).
    pub line: u32,
    /// The first line of the function.
    pub firstline: u32,
    /// For a native frame (`--native`), the path of its module (executable or library);
    /// `None` for Python frames and pseudo-frames.
    pub module: Option<&'a str>,
}

impl Location<'_> {
    /// Whether this is a native (C) frame.
    pub fn is_native(&self) -> bool {
        self.module.is_some()
    }
}

impl fmt::Display for Location<'_> {
    /// `function (file:line)`, or `function (file)` without a line (a native function known
    /// by its symbol only: the file is its module); the pseudo-frames (`<unknown>`, `<no
    /// Python frame>`) and native frames known by an offset only show their name alone, with
    /// the line when there is one.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.function == THREAD_STARTED_AT {
            return write!(f, "{THREAD_STARTED_AT} {}:{}", self.file, self.line);
        }
        match (self.file == self.function, self.line) {
            (true, 0) => write!(f, "{}", self.function),
            (true, line) => write!(f, "{}:{line}", self.function),
            (false, 0) => write!(f, "{} ({})", self.function, self.file),
            (false, line) => write!(f, "{} ({}:{line})", self.function, self.file),
        }
    }
}

/// A fast hasher for integer keys and frame slices (addresses are not attacker-chosen).
#[derive(Default, Clone, Copy)]
pub struct FastHasher(u64);

impl FastHasher {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    fn mix(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(Self::K);
    }
}

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.mix(u64::from_le_bytes(word));
        }
    }
    fn write_u8(&mut self, n: u8) {
        self.mix(n.into());
    }
    fn write_u32(&mut self, n: u32) {
        self.mix(n.into());
    }
    fn write_u64(&mut self, n: u64) {
        self.mix(n);
    }
    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }
    fn finish(&self) -> u64 {
        // The multiply leaves its best bits at the top; hash tables index with the bottom ones.
        self.0.rotate_left(26)
    }
}

/// A hash map with [`FastHasher`], for integer keys.
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// A name of the profile as a key, known by where its bytes are rather than by the bytes:
/// [`Names`] keeps one copy of each, so a look-up hashes two words, not a path, for every
/// frame of every stack. The same text at two places is two keys (with the same answer).
#[derive(Clone, Copy, Debug)]
pub struct Named<'a>(pub &'a str);

impl PartialEq for Named<'_> {
    fn eq(&self, other: &Named<'_>) -> bool {
        std::ptr::eq(self.0, other.0)
    }
}

impl Eq for Named<'_> {}

impl Hash for Named<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_usize(self.0.as_ptr() as usize);
        state.write_usize(self.0.len());
    }
}

/// Interned strings, code objects, frames and the stack trie.
#[derive(Default)]
pub(crate) struct Names {
    strings: Vec<String>,
    string_ids: HashMap<String, u32>,
    /// (file, name, firstline, module) string ids; the module is [`NOT_NATIVE`] for Python.
    codes: Vec<(u32, u32, u32, u32)>,
    code_ids: FastMap<(u32, u32, u32, u32), u32>,
    /// (code id, line).
    frames: Vec<(u32, u32)>,
    frame_ids: FastMap<(u32, u32), u32>,
    /// Trie nodes: (parent node, frame id). Nodes `0..ROOTS` are the allocators' roots and no
    /// stack.
    pub(crate) nodes: Vec<(u32, u32)>,
    node_ids: FastMap<(u32, u32), u32>,
    /// The allocator of each node's stack (its root's), as its wire value.
    allocators: Vec<u8>,
    /// The frame of the [`NEW_THREAD`] pseudo-frame.
    new_thread: u32,
}

/// The module id of Python frames and pseudo-frames.
const NOT_NATIVE: u32 = u32::MAX;

/// The roots of the trie: node `i` is the root of the stacks of allocator `i`.
const ROOTS: u32 = Allocator::ALL.len() as u32;

impl Names {
    pub(crate) fn new() -> Names {
        let mut names = Names::default();
        for a in Allocator::ALL {
            names.nodes.push((0, u32::MAX));
            names.allocators.push(a as u8);
        }
        let new_thread = names.code(NEW_THREAD, NEW_THREAD, 0);
        names.new_thread = names.frame(new_thread, 0);
        names
    }

    /// The root of the stacks of allocator `a`.
    fn root(a: Allocator) -> u32 {
        a as u32
    }

    /// The allocator the blocks of the stack ending at `node` came from.
    #[inline(always)]
    pub(crate) fn allocator(&self, node: u32) -> Allocator {
        Allocator::ALL[self.allocators[node as usize] as usize]
    }

    /// The id of `s`, cut to [`MAX_NAME`] bytes first: the capture's names are untrusted.
    pub(crate) fn string(&mut self, s: &str) -> u32 {
        let s = &*crate::base::text::elide(s, MAX_NAME);
        if let Some(&id) = self.string_ids.get(s) {
            return id;
        }
        let id = self.strings.len() as u32;
        self.strings.push(s.to_owned());
        self.string_ids.insert(s.to_owned(), id);
        id
    }

    fn code(&mut self, file: &str, name: &str, firstline: u32) -> u32 {
        let key = (self.string(file), self.string(name), firstline, NOT_NATIVE);
        self.code_of(key)
    }

    fn code_of(&mut self, key: (u32, u32, u32, u32)) -> u32 {
        let next = self.codes.len() as u32;
        let id = *self.code_ids.entry(key).or_insert(next);
        if id == next {
            self.codes.push(key);
        }
        id
    }

    /// The frame id of a native frame: `function` at `file:line` (the module's path when
    /// there is no source file) in `module`.
    pub(crate) fn native_frame(
        &mut self,
        function: &str,
        file: &str,
        line: u32,
        module: &str,
    ) -> u32 {
        let key = (
            self.string(file),
            self.string(function),
            0,
            self.string(module),
        );
        let code = self.code_of(key);
        self.frame(code, line)
    }

    fn frame(&mut self, code: u32, line: u32) -> u32 {
        let next = self.frames.len() as u32;
        let id = *self.frame_ids.entry((code, line)).or_insert(next);
        if id == next {
            self.frames.push((code, line));
        }
        id
    }

    /// The frame id of a Python frame (or a pseudo-frame, its file and function the same
    /// name): `function` of `file`, starting at `firstline`, running `line`.
    pub(crate) fn python_frame(
        &mut self,
        file: &str,
        function: &str,
        line: u32,
        firstline: u32,
    ) -> u32 {
        let code = self.code(file, function, firstline);
        self.frame(code, line)
    }

    /// The stack of `frames` (frame ids, innermost first) under the root of `allocator`, as
    /// [`StackResolver`] makes them: a stack deeper than [`MAX_DEPTH`] keeps its innermost
    /// frames under [`TRUNCATED`], a stack without frames is [`NO_PYTHON_FRAME`].
    pub(crate) fn stack_of(&mut self, allocator: Allocator, frames: &[u32]) -> u32 {
        let mut node = Names::root(allocator);
        let pseudo = match frames.len() {
            0 => Some(NO_PYTHON_FRAME),
            n if n > MAX_DEPTH => Some(TRUNCATED),
            _ => None,
        };
        if let Some(name) = pseudo {
            let frame = self.python_frame(name, name, 0, 0);
            node = self.child(node, frame);
        }
        for &frame in frames[..frames.len().min(MAX_DEPTH)].iter().rev() {
            node = self.child(node, frame);
        }
        node
    }

    /// The trie node for `frame` called from `parent`.
    fn child(&mut self, parent: u32, frame: u32) -> u32 {
        let next = self.nodes.len() as u32;
        let id = *self.node_ids.entry((parent, frame)).or_insert(next);
        if id == next {
            self.nodes.push((parent, frame));
            self.allocators.push(self.allocators[parent as usize]);
        }
        id
    }

    /// The frames of the stack ending at `node`, innermost first: the thread's own, up to
    /// the [`NEW_THREAD`] pseudo-frame of a grafted stack.
    pub(crate) fn frames(&self, node: u32) -> impl Iterator<Item = Location<'_>> + '_ {
        self.frame_ids(node).map(|frame| self.location(frame))
    }

    /// The frames of [`Names::frames`] as frame ids ([`Names::location`] names them), each
    /// below [`Names::frame_count`].
    pub(crate) fn frame_ids(&self, node: u32) -> impl Iterator<Item = u32> + '_ {
        let mut node = node;
        std::iter::from_fn(move || {
            if node < ROOTS {
                return None;
            }
            let (parent, frame) = self.nodes[node as usize];
            if frame == self.new_thread {
                return None;
            }
            node = parent;
            Some(frame)
        })
    }

    /// How many distinct frames there are (one per code and line).
    pub(crate) fn frame_count(&self) -> usize {
        self.frames.len()
    }

    /// The frames of the stack ending at `node`, innermost first, and for a grafted stack
    /// [`NEW_THREAD`] and the frames of the stack that created the thread after them.
    pub(crate) fn frames_with_origin(&self, node: u32) -> impl Iterator<Item = Location<'_>> + '_ {
        let mut node = node;
        std::iter::from_fn(move || {
            if node < ROOTS {
                return None;
            }
            let (parent, frame) = self.nodes[node as usize];
            node = parent;
            Some(self.location(frame))
        })
    }

    /// The node's caller (its parent in the trie) and its frame; None for a root.
    #[inline]
    pub(crate) fn link(&self, node: u32) -> Option<(u32, u32)> {
        (node >= ROOTS).then(|| self.nodes[node as usize])
    }

    /// Whether `frame` is the [`NEW_THREAD`] pseudo-frame where [`Names::frames`] stops.
    #[inline]
    pub(crate) fn is_new_thread(&self, frame: u32) -> bool {
        frame == self.new_thread
    }

    /// The innermost frame of the stack ending at `node`.
    pub(crate) fn innermost(&self, node: u32) -> Location<'_> {
        self.location(self.nodes[node as usize].1)
    }

    pub(crate) fn location(&self, frame: u32) -> Location<'_> {
        let (code, line) = self.frames[frame as usize];
        let (file, name, firstline, module) = self.codes[code as usize];
        Location {
            file: &self.strings[file as usize],
            function: &self.strings[name as usize],
            line,
            firstline,
            module: (module != NOT_NATIVE).then(|| self.strings[module as usize].as_str()),
        }
    }
}

/// A value per node of the stack trie that follows from its caller's and its own frame, each
/// node worked out once: the stacks that share their callers share the work (a deep server's
/// stacks, most of them), instead of each walking all its frames.
#[derive(Default)]
pub(crate) struct TrieMemo {
    /// Per node: its value, once worked out.
    at: Vec<Option<(u32, bool)>>,
    /// The nodes being worked out, innermost first.
    walk: Vec<u32>,
}

impl TrieMemo {
    /// Nothing worked out yet, for the nodes of `names`.
    pub(crate) fn new(names: &Names) -> TrieMemo {
        TrieMemo {
            at: vec![None; names.nodes.len()],
            walk: Vec::new(),
        }
    }

    /// The value of `node`: `top` above the outermost frame, or above a frame where `stop`
    /// says the walk ends; below it, each node's from its caller's value and its frame by
    /// `step`.
    pub(crate) fn get(
        &mut self,
        names: &Names,
        node: u32,
        top: (u32, bool),
        stop: impl Fn(u32) -> bool,
        mut step: impl FnMut((u32, bool), u32) -> (u32, bool),
    ) -> (u32, bool) {
        self.walk.clear();
        let mut value = top;
        let mut n = node;
        while let Some((parent, frame)) = names.link(n) {
            if stop(frame) {
                break;
            }
            if let Some(Some(known)) = self.at.get(n as usize) {
                value = *known;
                break;
            }
            self.walk.push(n);
            n = parent;
        }
        for &n in self.walk.iter().rev() {
            value = step(value, names.nodes[n as usize].1);
            if let Some(at) = self.at.get_mut(n as usize) {
                *at = Some(value);
            }
        }
        value
    }
}

/// Turns raw frames (code addresses) into stacks, following the Code records seen so far.
pub(crate) struct StackResolver {
    pub(crate) names: Names,
    unknown_code: u32,
    /// Per allocator: the stack of an allocation with no frame.
    empty_stack: [u32; 3],
    /// Per allocator: the pseudo-frame node under which stacks cut at `max_depth` start.
    truncated_root: [u32; 3],
    /// (stack, origin) → the grafted stack ([`StackResolver::graft`]).
    grafts: FastMap<(u32, u32), u32>,
    /// What is known of the process whose records are read now, and of the other processes
    /// (each process has its own code addresses and its own module map: see
    /// [`StackResolver::switch_process`]).
    here: Codes,
    process: u32,
    stashed: Vec<Codes>,
}

/// What the resolver knows of one process: code addresses → code, its modules, and the memos.
struct Codes {
    code_at: FastMap<u64, u32>,
    /// Raw frames → stack, per allocator for whole and for truncated stacks (`cache_slot`);
    /// valid until an address changes meaning.
    cache: [FastMap<Vec<Frame>, u32>; 6],
    cache_has_unknown: bool,
    /// Frames held by `cache`.
    cached_frames: usize,
    /// Native stacks (`--native`): the capture's modules and their symbols.
    native: NativeResolver,
    /// Mixed stacks → stack, per allocator and truncation (`cache_slot`): the key is the Python
    /// frames, then the native addresses and entry marks. Cleared with `cache`, and when a
    /// module record changes what addresses mean.
    mixed: [FastMap<Box<[u64]>, u32>; 6],
    mixed_words: usize,
    mixed_generation: u64,
    /// Moves on whenever a code address gets another meaning (see
    /// [`StackResolver::generation`]).
    generation: u64,
}

impl Default for Codes {
    fn default() -> Codes {
        Codes {
            code_at: Default::default(),
            cache: Default::default(),
            cache_has_unknown: false,
            cached_frames: 0,
            native: NativeResolver::new(crate::analysis::symbols::show_interpreter_frames()),
            mixed: Default::default(),
            mixed_words: 0,
            mixed_generation: 0,
            generation: 0,
        }
    }
}

/// The memo of raw stacks of `allocator`, whole or `truncated`.
fn cache_slot(allocator: Allocator, truncated: bool) -> usize {
    2 * allocator as usize + truncated as usize
}

impl StackResolver {
    pub(crate) fn new() -> StackResolver {
        let mut names = Names::new();
        let unknown_code = names.code(UNKNOWN, UNKNOWN, 0);
        let no_python = names.code(NO_PYTHON_FRAME, NO_PYTHON_FRAME, 0);
        let no_python = names.frame(no_python, 0);
        let truncated = names.code(TRUNCATED, TRUNCATED, 0);
        let truncated = names.frame(truncated, 0);
        let (mut empty_stack, mut truncated_root) = ([0; 3], [0; 3]);
        for a in Allocator::ALL {
            let root = Names::root(a);
            empty_stack[a as usize] = names.child(root, no_python);
            truncated_root[a as usize] = names.child(root, truncated);
        }
        StackResolver {
            names,
            unknown_code,
            empty_stack,
            truncated_root,
            grafts: FastMap::default(),
            here: Codes::default(),
            process: 0,
            stashed: Vec::new(),
        }
    }

    /// The frames resolved from now on are process `process`'s: its own Code records give
    /// its code addresses their meaning (an address in one process says nothing of another).
    pub(crate) fn switch_process(&mut self, process: u32) {
        if process == self.process {
            return;
        }
        let needed = process.max(self.process) as usize + 1;
        if self.stashed.len() < needed {
            self.stashed.resize_with(needed, Codes::default);
        }
        let next = std::mem::take(&mut self.stashed[process as usize]);
        self.stashed[self.process as usize] = std::mem::replace(&mut self.here, next);
        self.process = process;
    }

    fn clear_cache(&mut self) {
        self.here.cache = Default::default();
        self.here.cache_has_unknown = false;
        self.here.cached_frames = 0;
        self.here.mixed = Default::default();
        self.here.mixed_words = 0;
    }

    /// A MODULE record (`--native`).
    pub(crate) fn add_module(&mut self, module: Module) {
        self.here.native.add_module(module);
    }

    /// Memory held for native symbols (debug information of files on this machine), apart
    /// from the capture's allowance.
    pub(crate) fn symbol_memory(&self) -> isize {
        self.here.native.held()
    }

    /// Why some native frames are only `module+0x…`, one line per module.
    pub(crate) fn symbol_warnings(&self) -> Vec<String> {
        self.here.native.warnings().to_vec()
    }

    pub(crate) fn announce(&mut self, addr: u64, file: &str, name: &str, firstline: u32) {
        let code = self.names.code(&tidy_path(file), name, firstline);
        let changed = match self.here.code_at.insert(addr, code) {
            Some(old) => old != code,
            None => self.here.cache_has_unknown,
        };
        if changed {
            self.clear_cache();
            self.here.generation += 1;
        }
    }

    /// Moves on whenever a code address of the current process gets another meaning (a
    /// code object announced again, or announced after a stack resolved it as unknown):
    /// whatever a caller remembers of which stack raw frames are holds within a generation.
    pub(crate) fn generation(&self) -> u64 {
        self.here.generation
    }

    /// The stack of `frames` (innermost first) under `allocator`'s root, merged with the
    /// native stack when there is one (see [`crate::analysis::symbols::merge`]); `truncated`
    /// when the agent cut it. A stack deeper than [`MAX_DEPTH`] is cut here.
    pub(crate) fn stack(
        &mut self,
        frames: &[Frame],
        truncated: bool,
        allocator: Allocator,
        native: Option<&NativeStack>,
    ) -> u32 {
        match native {
            Some(native) if !native.addrs.is_empty() => {
                self.mixed_stack(frames, truncated, allocator, native)
            }
            _ => self.python_stack(frames, truncated, allocator),
        }
    }

    /// The stack of a sample taken on a thread created by the stack `origin` (a Python stack
    /// of its own, itself grafted when its thread had an origin): `origin`'s frames, then
    /// [`NEW_THREAD`], then `stack`'s, under `stack`'s root. The origin's outermost frames
    /// give way when the whole would be deeper than twice [`MAX_DEPTH`].
    pub(crate) fn graft(&mut self, stack: u32, origin: u32) -> u32 {
        if let Some(&node) = self.grafts.get(&(stack, origin)) {
            return node;
        }
        let path = |names: &Names, mut node: u32| {
            let mut frames = Vec::new();
            while node >= ROOTS {
                let (parent, frame) = names.nodes[node as usize];
                frames.push(frame);
                node = parent;
            }
            frames
        };
        let own = path(&self.names, stack);
        let mut from = path(&self.names, origin);
        from.truncate((2 * MAX_DEPTH).saturating_sub(own.len() + 1));
        let mut node = Names::root(self.names.allocator(stack));
        for &frame in from.iter().rev() {
            node = self.names.child(node, frame);
        }
        node = self.names.child(node, self.names.new_thread);
        for &frame in own.iter().rev() {
            node = self.names.child(node, frame);
        }
        if self.grafts.len() >= CACHE_FRAMES {
            self.grafts.clear();
        }
        self.grafts.insert((stack, origin), node);
        node
    }

    /// The code id of a raw frame's code address (`<unknown>` if never announced).
    fn code_of(&mut self, code: u64) -> u32 {
        match self.here.code_at.get(&code) {
            Some(&code) => code,
            None => {
                self.here.cache_has_unknown = true;
                self.unknown_code
            }
        }
    }

    /// [`StackResolver::stack`] of a sample with a native stack.
    fn mixed_stack(
        &mut self,
        frames: &[Frame],
        truncated: bool,
        allocator: Allocator,
        native: &NativeStack,
    ) -> u32 {
        if self.here.mixed_generation != self.here.native.generation {
            self.here.mixed_generation = self.here.native.generation;
            self.here.mixed = Default::default();
            self.here.mixed_words = 0;
        }
        let frames = &frames[..frames.len().min(MAX_DEPTH)];
        let key = mixed_key(frames, native);
        let slot = cache_slot(allocator, truncated);
        if let Some(&node) = self.here.mixed[slot].get(&key[..]) {
            return node;
        }
        let python: Vec<u32> = frames
            .iter()
            .map(|f| {
                let code = self.code_of(f.code);
                self.names.frame(code, f.line)
            })
            .collect();
        let merged = self.here.native.stack(&mut self.names, &python, native);
        let a = allocator as usize;
        let cut = merged.len() > MAX_DEPTH;
        let merged = &merged[..merged.len().min(MAX_DEPTH)];
        let mut node = match (truncated || cut, merged.is_empty()) {
            (_, true) => self.empty_stack[a],
            (true, false) => self.truncated_root[a],
            (false, false) => Names::root(allocator),
        };
        for &frame in merged.iter().rev() {
            node = self.names.child(node, frame);
        }
        if self.here.mixed_words + key.len() > CACHE_FRAMES {
            self.here.mixed = Default::default();
            self.here.mixed_words = 0;
        }
        self.here.mixed_words += key.len();
        self.here.mixed[slot].insert(key, node);
        node
    }

    /// [`StackResolver::stack`] of a sample with Python frames only.
    fn python_stack(&mut self, frames: &[Frame], truncated: bool, allocator: Allocator) -> u32 {
        let a = allocator as usize;
        if frames.is_empty() {
            return self.empty_stack[a];
        }
        let truncated = truncated || frames.len() > MAX_DEPTH;
        let frames = &frames[..frames.len().min(MAX_DEPTH)];
        let slot = cache_slot(allocator, truncated);
        if let Some(&node) = self.here.cache[slot].get(frames) {
            return node;
        }
        let mut node = if truncated {
            self.truncated_root[a]
        } else {
            Names::root(allocator)
        };
        for f in frames.iter().rev() {
            let code = self.code_of(f.code);
            let frame = self.names.frame(code, f.line);
            node = self.names.child(node, frame);
        }
        if self.here.cached_frames + frames.len() > CACHE_FRAMES {
            self.clear_cache();
        }
        self.here.cached_frames += frames.len();
        self.here.cache[slot].insert(frames.to_vec(), node);
        node
    }
}

/// The memo key of a mixed stack: the Python frames, the native addresses, the entry marks.
fn mixed_key(frames: &[Frame], native: &NativeStack) -> Box<[u64]> {
    let mut key =
        Vec::with_capacity(2 * frames.len() + native.addrs.len() + native.entries.len() + 2);
    key.extend(frames.iter().flat_map(|f| [f.code, u64::from(f.line)]));
    key.push(frames.len() as u64);
    key.extend_from_slice(&native.addrs);
    key.push(native.addrs.len() as u64);
    key.extend_from_slice(&native.entries);
    key.into_boxed_slice()
}

/// An absolute path as Python wrote it, without its `/./` steps: from 3.9 CPython makes the
/// main script's path absolute without normalising it (`python ./x.py` in /tmp runs
/// `/tmp/./x.py`). Nothing else changes (a `..` may cross a symbolic link).
fn tidy_path(file: &str) -> std::borrow::Cow<'_, str> {
    if !file.starts_with('/') || !file.contains("/./") {
        return file.into();
    }
    let mut tidy = file.to_owned();
    while let Some(at) = tidy.find("/./") {
        tidy.replace_range(at..at + 2, "");
    }
    tidy.into()
}

#[cfg(test)]
mod tests {
    use super::tidy_path;

    #[test]
    fn a_script_path_loses_its_dot_steps() {
        assert_eq!(tidy_path("/tmp/./x.py"), "/tmp/x.py");
        assert_eq!(tidy_path("/a/././b/./c.py"), "/a/b/c.py");
        assert_eq!(tidy_path("/a/../b.py"), "/a/../b.py");
        assert_eq!(tidy_path("./x.py"), "./x.py");
        assert_eq!(tidy_path("<frozen os>"), "<frozen os>");
    }
}
