//! The return addresses on a stopped thread's stack, found with the call frame information
//! (`.eh_frame`) of the objects the target has mapped, as a debugger finds them.
//!
//! A safe point is judged by what runs below a thread (a signal handler, the loader, the agent,
//! the function that waits on a lock). Reading every word of the live stack for a return
//! address into such code also finds old ones: a deep call of long ago leaves its return
//! addresses in the uninitialised locals of the frames that run now (`select` keeps kilobytes
//! of them), and a thread that once ran a signal handler or the agent's slow path deeper down
//! was refused for good. Unwinding steps from frame to frame by the rules the compiler wrote
//! for each instruction and reads only the slots that hold return addresses and saved
//! registers.
//!
//! Everything is read from the target's memory: the ELF header of each object, its
//! `PT_GNU_EH_FRAME` segment (`.eh_frame_hdr`, whose sorted table finds an address's rules) and
//! `.eh_frame` itself. No file is opened, so a deleted library, the agent's memfd and the vDSO
//! unwind alike, and nothing a target's files say can make mprof open anything. What the
//! target's memory says is untrusted: every read is bounded, every step must move up the
//! stack, and a walk that cannot go on says where it stopped, for the caller to judge the rest
//! of the stack the careful way.

use crate::ptrace::Regs;
use crate::remote::Mem;
use crate::target::Process;
use gimli::{
    BaseAddresses, CfaRule, EhFrame, EhFrameHdr, EndianSlice, LittleEndian, ParsedEhFrameHdr,
    Register, RegisterRule, UnwindContext, UnwindSection,
};
use std::collections::HashMap;
use std::rc::Rc;

/// Most frames walked: deeper than any real stack of a thread mprof may choose.
const MAX_FRAMES: usize = 4096;
/// Most bytes of `.eh_frame` read for one object (libpython's is about half a megabyte).
const MAX_EH_FRAME: u64 = 32 << 20;
/// Most bytes of an object's `.eh_frame_hdr` (8 bytes a function).
const MAX_EH_FRAME_HDR: u64 = 4 << 20;
const PT_LOAD: u32 = 1;
const PT_GNU_EH_FRAME: u32 = 0x6474_e550;

/// DWARF's numbers of the x86-64 registers an unwind reads (rax..r15, then the return address).
const REGISTERS: usize = 17;
const RSP: u16 = 7;
const RA: u16 = 16;
/// rbx, rbp and r12–r15: what a function must give back to its caller as it found them.
const CALLEE_SAVED: [u16; 6] = [3, 6, 12, 13, 14, 15];

/// What a walk found.
#[derive(Debug, Default)]
pub struct Frames {
    /// The return addresses of the frames outside the innermost, innermost first.
    pub returns: Vec<u64>,
    /// Where the walk stopped before the outermost frame (code with no rules, rules it does not
    /// follow, a step that did not move up the stack, an unreadable slot): the stack pointer of
    /// the frame it could not step out of. What lies above it is not known.
    pub stopped_at: Option<u64>,
}

impl Frames {
    /// Whether a return address lies in one of `ranges`.
    pub fn any_in(&self, ranges: &[(u64, u64)]) -> bool {
        self.returns
            .iter()
            .any(|&ra| ranges.iter().any(|&(lo, hi)| lo <= ra && ra < hi))
    }
}

/// The unwind tables of one mapped object, read from the target.
pub struct Tables {
    /// `.eh_frame_hdr` and `.eh_frame` as read, and the addresses they were read at.
    hdr: Vec<u8>,
    hdr_at: u64,
    frame: Vec<u8>,
    frame_at: u64,
}

/// The unwind tables of the objects walks met, by the address of their ELF header and the
/// inode of their file (another object mapped there since is another key; `None`: the object
/// has none that could be read).
pub type Cache = HashMap<(u64, u64), Option<Rc<Tables>>>;

/// Walks the stack of a thread stopped with `regs`. `stop_in`: code that ends the walk when a
/// return address lies in it (a signal frame's trampoline, the agent: the caller's answer is
/// known then, and their frames have rules this walk does not follow).
pub fn walk(
    t: &Process,
    mem: &Mem,
    regs: &Regs,
    stop_in: &[(u64, u64)],
    cache: &mut Cache,
) -> Frames {
    let mut r = [None; REGISTERS];
    for (n, v) in [
        regs.rax, regs.rdx, regs.rcx, regs.rbx, regs.rsi, regs.rdi, regs.rbp, regs.rsp, regs.r8,
        regs.r9, regs.r10, regs.r11, regs.r12, regs.r13, regs.r14, regs.r15, regs.rip,
    ]
    .into_iter()
    .enumerate()
    {
        r[n] = Some(v);
    }
    let Some(stack) = t.mapping_now(regs.rsp).map(|m| (m.start, m.end)) else {
        return Frames {
            returns: Vec::new(),
            stopped_at: Some(regs.rsp),
        };
    };
    let mut walker = Walker {
        t,
        mem,
        stack,
        ctx: UnwindContext::new(),
        cache,
    };
    let mut frames = Frames::default();
    let mut pc = regs.rip;
    for depth in 0..MAX_FRAMES {
        let sp = r[RSP as usize].unwrap_or(0);
        // A return address is the instruction after a call: its rules are those of the call.
        let lookup = if depth == 0 { pc } else { pc.wrapping_sub(1) };
        let mut next = r;
        match walker.step(&r, &mut next, lookup) {
            None => {
                frames.stopped_at = Some(sp);
                return frames;
            }
            Some(Step::Outermost) => return frames, // nothing called it
            Some(Step::Caller) => {}
        }
        let Some(ra) = next[RA as usize] else {
            frames.stopped_at = Some(sp);
            return frames;
        };
        if ra == 0 {
            return frames;
        }
        frames.returns.push(ra);
        if stop_in.iter().any(|&(lo, hi)| lo <= ra && ra < hi) {
            frames.stopped_at = next[RSP as usize];
            return frames;
        }
        r = next;
        pc = ra;
    }
    frames.stopped_at = r[RSP as usize];
    frames
}

enum Step {
    /// The caller's registers were found (its return address as register 16).
    Caller,
    /// The rules say the return address is undefined: the thread's first frame.
    Outermost,
}

/// What a walk reads with: the target, the stack it walks (a caller's frame is never outside
/// it) and the tables read so far.
struct Walker<'a> {
    t: &'a Process,
    mem: &'a Mem,
    stack: (u64, u64),
    ctx: UnwindContext<usize>,
    cache: &'a mut Cache,
}

impl Walker<'_> {
    /// One step out of the frame running `pc` with registers `r`: the caller's go to `next`.
    /// `None` where it cannot be taken (or must not be trusted).
    fn step(
        &mut self,
        r: &[Option<u64>; REGISTERS],
        next: &mut [Option<u64>; REGISTERS],
        pc: u64,
    ) -> Option<Step> {
        let (t, mem, (lo, hi)) = (self.t, self.mem, self.stack);
        let tables = tables_for(t, mem, pc, self.cache)?;
        let bases = BaseAddresses::default()
            .set_eh_frame_hdr(tables.hdr_at)
            .set_eh_frame(tables.frame_at);
        let hdr: ParsedEhFrameHdr<EndianSlice<LittleEndian>> =
            EhFrameHdr::new(&tables.hdr, LittleEndian)
                .parse(&bases, 8)
                .ok()?;
        let table = hdr.table()?;
        let eh_frame = EhFrame::new(&tables.frame, LittleEndian);
        let row = table
            .unwind_info_for_address(
                &eh_frame,
                &bases,
                &mut self.ctx,
                pc,
                EhFrame::cie_from_offset,
            )
            .ok()?;
        let cfa = match *row.cfa() {
            CfaRule::RegisterAndOffset { register, offset } => r
                .get(register.0 as usize)
                .copied()
                .flatten()?
                .checked_add_signed(offset)?,
            CfaRule::Expression(_) => return None,
        };
        // Every caller's frame lies above its callee's, on the same stack.
        let sp = r[RSP as usize]?;
        if cfa <= sp || cfa < lo || cfa > hi {
            return None;
        }
        let read = |at: u64| -> Option<u64> {
            if at < lo || at.checked_add(8)? > hi {
                return None;
            }
            mem.read_u64(at).ok()
        };
        next[RSP as usize] = Some(cfa);
        for n in 0..REGISTERS as u16 {
            if n == RSP {
                continue;
            }
            let value = match row.register(Register(n)) {
                // Not mentioned: a callee-saved register the function left alone; a register
                // the callee may clobber is not known (no rule should need it); the return
                // address always has one (every x86-64 CIE gives it).
                None if n == RA => return None,
                None if CALLEE_SAVED.contains(&n) => r[n as usize],
                None => None,
                Some(RegisterRule::Undefined) if n == RA => return Some(Step::Outermost),
                Some(RegisterRule::Undefined) => None,
                Some(RegisterRule::SameValue) => r[n as usize],
                Some(RegisterRule::Offset(off)) => read(cfa.checked_add_signed(off)?),
                Some(RegisterRule::ValOffset(off)) => cfa.checked_add_signed(off),
                Some(RegisterRule::Register(o)) => r.get(o.0 as usize).copied().flatten(),
                // Expressions (signal frames, PLT stubs) and the rest: the value is not known.
                Some(_) => None,
            };
            next[n as usize] = value;
        }
        Some(Step::Caller)
    }
}

/// The unwind tables of the object whose code holds `pc`, read once per walk set (`cache`).
fn tables_for(t: &Process, mem: &Mem, pc: u64, cache: &mut Cache) -> Option<Rc<Tables>> {
    let m = t.mapping_now(pc)?;
    if !m.exec {
        return None;
    }
    // The ELF header: at the object's mapping of file offset 0 (the vDSO: its only mapping).
    let header = if m.is_file() {
        crate::procmaps::file_base(&t.maps, &m).or_else(|| {
            let maps = crate::procmaps::read(&t.proc).ok()?;
            crate::procmaps::file_base(&maps, &m)
        })?
    } else if m.offset == 0 {
        m.start
    } else {
        return None;
    };
    cache
        .entry((header, m.inode))
        .or_insert_with(|| read_tables(t, mem, header).map(Rc::new))
        .clone()
}

/// Reads an object's `.eh_frame_hdr` and `.eh_frame` from the target, from its ELF header at
/// `header`.
fn read_tables(t: &Process, mem: &Mem, header: u64) -> Option<Tables> {
    let ehdr = mem.read_vec(header, 64).ok()?;
    if ehdr[..4] != *b"\x7fELF" || ehdr[4] != 2 || ehdr[5] != 1 {
        return None; // not a little-endian 64-bit ELF image
    }
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
    let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let (phoff, phentsize, phnum) = (u64_at(&ehdr, 32), u16_at(&ehdr, 54), u16_at(&ehdr, 56));
    if phentsize != 56 || phnum == 0 || phnum > 256 {
        return None;
    }
    let phdrs = mem
        .read_vec(header.checked_add(phoff)?, 56 * phnum as usize)
        .ok()?;
    let mut first_load = None::<u64>;
    let mut eh = None;
    for ph in phdrs.chunks_exact(56) {
        let (kind, vaddr, memsz) = (u32_at(ph, 0), u64_at(ph, 16), u64_at(ph, 40));
        match kind {
            PT_LOAD => first_load = Some(first_load.map_or(vaddr, |f| f.min(vaddr))),
            PT_GNU_EH_FRAME => eh = Some((vaddr, memsz)),
            _ => {}
        }
    }
    let bias = header.checked_sub(first_load? & !0xfff)?;
    let (hdr_vaddr, hdr_len) = eh?;
    if !(12..=MAX_EH_FRAME_HDR).contains(&hdr_len) {
        return None;
    }
    let hdr_at = bias.checked_add(hdr_vaddr)?;
    let hdr = mem.read_vec(hdr_at, hdr_len as usize).ok()?;
    // Where `.eh_frame` starts, as the header says (its second field, encoded as its third
    // byte says: parsing it is gimli's); it runs at most to the end of its mapping.
    let bases = BaseAddresses::default().set_eh_frame_hdr(hdr_at);
    let frame_at = match EhFrameHdr::new(&hdr, LittleEndian)
        .parse(&bases, 8)
        .ok()?
        .eh_frame_ptr()
    {
        gimli::Pointer::Direct(at) => at,
        gimli::Pointer::Indirect(_) => return None,
    };
    let mapping = t.mapping_now(frame_at)?;
    let len = (mapping.end - frame_at).min(MAX_EH_FRAME);
    let frame = mem.read_vec(frame_at, len as usize).ok()?;
    Some(Tables {
        hdr,
        hdr_at,
        frame,
        frame_at,
    })
}
