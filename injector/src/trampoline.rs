//! The trampoline: position-independent code that a hijacked thread of the target runs by
//! itself, so that nothing has to be undone if mprof dies once the thread was sent there.
//!
//! It switches to a stack of its own, saves the vector state (`xsave64` with every feature, or
//! `fxsave64`) and `errno`, calls `dlopen(path, RTLD_NOW)` (unless the agent is already loaded),
//! computes `mprof_agent_start` from the handle's `l_addr`, calls it with the ring's descriptor,
//! closes the descriptors the target no longer needs, writes its results, restores `errno`, the
//! vector state, the flags and every general register that mprof saved, sets `done`, and jumps
//! back to where the thread was (or to its `syscall` instruction, to re-issue an interrupted
//! system call).
//!
//! The region (`REGION_SIZE`, read-write-execute, anonymous) holds two slots used in turn, so a
//! thread still on the last two instructions of one slot is never overwritten by the next
//! attach. A slot:
//!
//! ```text
//!  0            CODE_MAX (0x800)     0x1000                                 SLOT_SIZE
//!  +------------+--------------------+--------------------------- ... ------+
//!  | code       | Data (inputs,      | stack (grows down from the slot's end)  |
//!  |            | results, done)     |                                         |
//!  +------------+--------------------+--------------------------- ... ------+
//! ```

use crate::ptrace::Regs;
use crate::remote::Mem;
use std::io;
use std::mem::offset_of;

pub const SLOT_SIZE: usize = 256 << 10;
pub const REGION_SIZE: usize = 2 * SLOT_SIZE;
pub const CODE_MAX: usize = 0x800;
/// Where a slot's stack starts (its top, 16-byte aligned).
pub const STACK_TOP: usize = SLOT_SIZE;

/// Marks a region as mprof's (in the `Data` of slot 0).
pub const MAGIC: [u8; 16] = *b"mprof-trampoline";

/// The general registers the trampoline restores, in this order.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct Gprs {
    pub rax: u64,
    pub rbx: u64,
    pub rcx: u64,
    pub rdx: u64,
    pub rsi: u64,
    pub rdi: u64,
    pub rbp: u64,
    pub rsp: u64,
    pub r8: u64,
    pub r9: u64,
    pub r10: u64,
    pub r11: u64,
    pub r12: u64,
    pub r13: u64,
    pub r14: u64,
    pub r15: u64,
}

/// A slot's data, written by mprof before the thread enters the slot.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Data {
    pub magic: [u8; 16],
    /// Incremented per attach: the older slot is the one to reuse.
    pub generation: u64,
    pub gprs: Gprs,
    pub rflags: u64,
    pub resume_rip: u64,
    /// `dlopen` (or `__libc_dlopen_mode`); 0 when the agent is already loaded.
    pub dlopen: u64,
    pub dlopen_flags: u64,
    /// `dlerror`, 0 if unknown.
    pub dlerror: u64,
    /// `__errno_location`, 0 if unknown.
    pub errno_location: u64,
    /// Offset of `mprof_agent_start` in the agent image, or its address when `dlopen` is 0.
    pub start: u64,
    /// Descriptor of the agent image, closed after `dlopen` (-1: none).
    pub agent_fd: i64,
    /// Descriptor of the ring, passed to the agent then closed.
    pub ring_fd: i64,
    /// Size of the XSAVE area (CPUID 0xD), 0 to use FXSAVE.
    pub xsave_size: u64,
    /// NUL-terminated path of the agent image, as the target sees it.
    pub path: [u8; 64],
    /// Scratch for the names of the memory files mprof creates in the target.
    pub scratch: [u8; 64],
    // Results.
    /// 0 not entered, 1 entered, 2 dlopen returned, 3 agent start returned, 4 restoring.
    pub stage: u64,
    pub handle: u64,
    pub start_ret: i64,
    pub error: [u8; 256],
    /// Set last, two instructions before the jump back.
    pub done: u64,
}

const _: () = assert!(std::mem::size_of::<Data>() <= 0x1000 - CODE_MAX);

impl Data {
    pub fn zeroed() -> Data {
        // SAFETY: every field is an integer or an array of them.
        unsafe { std::mem::zeroed() }
    }

    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: repr(C), no padding-dependent reads on the other side.
        unsafe {
            std::slice::from_raw_parts(
                self as *const Data as *const u8,
                std::mem::size_of::<Data>(),
            )
        }
    }
}

/// The address of slot `i`'s code, data and stack top in a region at `base`.
pub fn slot_code(base: u64, i: usize) -> u64 {
    base + (i * SLOT_SIZE) as u64
}

pub fn slot_data(base: u64, i: usize) -> u64 {
    slot_code(base, i) + CODE_MAX as u64
}

pub fn slot_stack(base: u64, i: usize) -> u64 {
    slot_code(base, i) + STACK_TOP as u64
}

/// Address of a field of slot `i`'s data.
pub fn field(base: u64, i: usize, offset: usize) -> u64 {
    slot_data(base, i) + offset as u64
}

pub const OFF_MAGIC: usize = offset_of!(Data, magic);
pub const OFF_GENERATION: usize = offset_of!(Data, generation);
pub const OFF_STAGE: usize = offset_of!(Data, stage);
pub const OFF_DONE: usize = offset_of!(Data, done);
pub const OFF_SCRATCH: usize = offset_of!(Data, scratch);

/// Whether the region at `base` is an mprof trampoline region.
pub fn is_region(mem: &Mem, base: u64) -> bool {
    let mut magic = [0u8; 16];
    mem.read(field(base, 0, OFF_MAGIC), &mut magic).is_ok() && magic == MAGIC
}

/// The state of one slot as mprof reads it back.
#[derive(Clone, Copy, Debug)]
pub struct SlotState {
    pub generation: u64,
    pub stage: u64,
    pub done: bool,
}

impl SlotState {
    /// Free to overwrite: never entered, or finished.
    pub fn free(&self) -> bool {
        self.stage == 0 || self.done
    }
}

pub fn slot_state(mem: &Mem, base: u64, i: usize) -> io::Result<SlotState> {
    Ok(SlotState {
        generation: mem.read_u64(field(base, i, OFF_GENERATION))?,
        stage: mem.read_u64(field(base, i, OFF_STAGE))?,
        done: mem.read_u64(field(base, i, OFF_DONE))? != 0,
    })
}

/// The results a finished trampoline left in its slot.
pub fn read_data(mem: &Mem, base: u64, i: usize) -> io::Result<Data> {
    let mut data = Data::zeroed();
    // SAFETY: Data is plain integers; any byte pattern is a valid value.
    let bytes = unsafe {
        std::slice::from_raw_parts_mut(
            &mut data as *mut Data as *mut u8,
            std::mem::size_of::<Data>(),
        )
    };
    mem.read(slot_data(base, i), bytes)?;
    Ok(data)
}

/// The saved registers of an interrupted thread, as the trampoline restores them.
pub fn gprs_of(r: &Regs) -> Gprs {
    Gprs {
        rax: r.rax,
        rbx: r.rbx,
        rcx: r.rcx,
        rdx: r.rdx,
        rsi: r.rsi,
        rdi: r.rdi,
        rbp: r.rbp,
        rsp: r.rsp,
        r8: r.r8,
        r9: r.r9,
        r10: r.r10,
        r11: r.r11,
        r12: r.r12,
        r13: r.r13,
        r14: r.r14,
        r15: r.r15,
    }
}

/// Size of the XSAVE area for the features enabled in XCR0, or 0 when the OS does not enable
/// XSAVE (the trampoline then uses FXSAVE's 512 bytes).
pub fn xsave_size() -> u64 {
    use std::arch::x86_64::__cpuid_count;
    let leaf1 = __cpuid_count(1, 0);
    let osxsave = leaf1.ecx & (1 << 27) != 0;
    if !osxsave {
        return 0;
    }
    // Leaf 0xD exists when OSXSAVE is set.
    let size = __cpuid_count(0xd, 0).ebx as u64;
    (size + 63) & !63
}

/// The trampoline's machine code.
pub fn code() -> &'static [u8] {
    extern "C" {
        static mprof_trampoline_start: u8;
        static mprof_trampoline_end: u8;
    }
    // SAFETY: both symbols are labels of the global_asm block below, in one section, in order.
    unsafe {
        let start = std::ptr::addr_of!(mprof_trampoline_start);
        let end = std::ptr::addr_of!(mprof_trampoline_end);
        std::slice::from_raw_parts(start, end as usize - start as usize)
    }
}

// All data references are RIP-relative to `D` (CODE_MAX bytes after the start), resolved by
// the assembler inside this section: the bytes between the two labels run wherever they are
// copied, as long as the slot's data follows at CODE_MAX.
std::arch::global_asm!(
    ".pushsection .text.mprof_trampoline,\"ax\",@progbits",
    ".balign 16",
    ".globl mprof_trampoline_start",
    ".hidden mprof_trampoline_start",
    ".globl mprof_trampoline_end",
    ".hidden mprof_trampoline_end",
    "mprof_trampoline_start:",
    ".set D, mprof_trampoline_start + {code_max}",
    "mov qword ptr [rip + D + {stage}], 1",
    // The stack: the slot's own (rsp was set by mprof), 64-byte aligned save area on top.
    "mov rcx, qword ptr [rip + D + {xsave_size}]",
    "test rcx, rcx",
    "jz .Lmprof_fxsave",
    "sub rsp, rcx",
    "and rsp, -64",
    // XRSTOR of the standard format needs XCOMP_BV and the reserved header bytes zeroed.
    "xor eax, eax",
    "mov qword ptr [rsp + 512], rax",
    "mov qword ptr [rsp + 520], rax",
    "mov qword ptr [rsp + 528], rax",
    "mov qword ptr [rsp + 536], rax",
    "mov qword ptr [rsp + 544], rax",
    "mov qword ptr [rsp + 552], rax",
    "mov qword ptr [rsp + 560], rax",
    "mov qword ptr [rsp + 568], rax",
    "mov eax, -1",
    "mov edx, -1",
    "xsave64 [rsp]",
    "jmp .Lmprof_saved",
    ".Lmprof_fxsave:",
    "sub rsp, 512",
    "and rsp, -64",
    "fxsave64 [rsp]",
    ".Lmprof_saved:",
    "mov r12, rsp",
    "cld",
    // errno: saved in r14d, its address in r13 (0 if unknown).
    "xor r13d, r13d",
    "mov rax, qword ptr [rip + D + {errno_location}]",
    "test rax, rax",
    "jz .Lmprof_no_errno",
    "call rax",
    "mov r13, rax",
    "mov r14d, dword ptr [rax]",
    ".Lmprof_no_errno:",
    "mov rax, qword ptr [rip + D + {dlopen}]",
    "test rax, rax",
    "jz .Lmprof_loaded_before",
    "lea rdi, [rip + D + {path}]",
    "mov rsi, qword ptr [rip + D + {dlopen_flags}]",
    "call rax",
    "mov qword ptr [rip + D + {handle}], rax",
    "mov qword ptr [rip + D + {stage}], 2",
    "test rax, rax",
    "jz .Lmprof_dlopen_failed",
    // The handle is the link_map (glibc) or dso (musl): its first word is the load bias.
    "mov rax, qword ptr [rax]",
    "add rax, qword ptr [rip + D + {start}]",
    "jmp .Lmprof_call_start",
    ".Lmprof_loaded_before:",
    "mov rax, qword ptr [rip + D + {start}]",
    ".Lmprof_call_start:",
    "mov edi, dword ptr [rip + D + {ring_fd}]",
    "call rax",
    "movsxd rax, eax",
    "mov qword ptr [rip + D + {start_ret}], rax",
    "mov qword ptr [rip + D + {stage}], 3",
    "jmp .Lmprof_close",
    ".Lmprof_dlopen_failed:",
    "mov rax, qword ptr [rip + D + {dlerror}]",
    "test rax, rax",
    "jz .Lmprof_close",
    "call rax",
    "test rax, rax",
    "jz .Lmprof_close",
    "lea rdi, [rip + D + {error}]",
    "mov ecx, 255",
    ".Lmprof_copy:",
    "mov dl, byte ptr [rax]",
    "mov byte ptr [rdi], dl",
    "test dl, dl",
    "jz .Lmprof_close",
    "inc rax",
    "inc rdi",
    "dec ecx",
    "jnz .Lmprof_copy",
    ".Lmprof_close:",
    "mov rdi, qword ptr [rip + D + {agent_fd}]",
    "test rdi, rdi",
    "js .Lmprof_close_ring",
    "mov eax, 3",
    "syscall",
    ".Lmprof_close_ring:",
    "mov rdi, qword ptr [rip + D + {ring_fd}]",
    "test rdi, rdi",
    "js .Lmprof_restore",
    "mov eax, 3",
    "syscall",
    ".Lmprof_restore:",
    "test r13, r13",
    "jz .Lmprof_errno_done",
    "mov dword ptr [r13], r14d",
    ".Lmprof_errno_done:",
    "mov qword ptr [rip + D + {stage}], 4",
    "mov rcx, qword ptr [rip + D + {xsave_size}]",
    "test rcx, rcx",
    "jz .Lmprof_fxrstor",
    "mov eax, -1",
    "mov edx, -1",
    "xrstor64 [r12]",
    "jmp .Lmprof_vector_done",
    ".Lmprof_fxrstor:",
    "fxrstor64 [r12]",
    ".Lmprof_vector_done:",
    "push qword ptr [rip + D + {rflags}]",
    "popfq",
    // From here on nothing changes the flags.
    "mov rax, qword ptr [rip + D + {gprs} + 0]",
    "mov rbx, qword ptr [rip + D + {gprs} + 8]",
    "mov rcx, qword ptr [rip + D + {gprs} + 16]",
    "mov rdx, qword ptr [rip + D + {gprs} + 24]",
    "mov rsi, qword ptr [rip + D + {gprs} + 32]",
    "mov rdi, qword ptr [rip + D + {gprs} + 40]",
    "mov rbp, qword ptr [rip + D + {gprs} + 48]",
    "mov rsp, qword ptr [rip + D + {gprs} + 56]",
    "mov r8, qword ptr [rip + D + {gprs} + 64]",
    "mov r9, qword ptr [rip + D + {gprs} + 72]",
    "mov r10, qword ptr [rip + D + {gprs} + 80]",
    "mov r11, qword ptr [rip + D + {gprs} + 88]",
    "mov r12, qword ptr [rip + D + {gprs} + 96]",
    "mov r13, qword ptr [rip + D + {gprs} + 104]",
    "mov r14, qword ptr [rip + D + {gprs} + 112]",
    "mov r15, qword ptr [rip + D + {gprs} + 120]",
    "mov qword ptr [rip + D + {done}], 1",
    "jmp qword ptr [rip + D + {resume_rip}]",
    "mprof_trampoline_end:",
    ".popsection",
    code_max = const CODE_MAX,
    stage = const offset_of!(Data, stage),
    xsave_size = const offset_of!(Data, xsave_size),
    errno_location = const offset_of!(Data, errno_location),
    dlopen = const offset_of!(Data, dlopen),
    dlopen_flags = const offset_of!(Data, dlopen_flags),
    dlerror = const offset_of!(Data, dlerror),
    path = const offset_of!(Data, path),
    handle = const offset_of!(Data, handle),
    start = const offset_of!(Data, start),
    ring_fd = const offset_of!(Data, ring_fd),
    agent_fd = const offset_of!(Data, agent_fd),
    start_ret = const offset_of!(Data, start_ret),
    error = const offset_of!(Data, error),
    rflags = const offset_of!(Data, rflags),
    gprs = const offset_of!(Data, gprs),
    done = const offset_of!(Data, done),
    resume_rip = const offset_of!(Data, resume_rip),
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_fits_before_the_data() {
        let code = code();
        assert!(
            !code.is_empty() && code.len() <= CODE_MAX,
            "{} bytes",
            code.len()
        );
    }

    #[test]
    fn gprs_are_in_the_order_the_code_restores_them() {
        assert_eq!(offset_of!(Gprs, rsp), 56);
        assert_eq!(offset_of!(Gprs, r15), 120);
    }
}
