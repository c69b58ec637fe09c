//! The agent loads on glibc 2.28 and older (RHEL 8, Ubuntu 20.04), though it is linked
//! against the build machine's newer glibc.
//!
//! A reference links to the newest version of a symbol unless told otherwise: on glibc 2.34+
//! that is `dlopen@GLIBC_2.34`, `pthread_key_create@GLIBC_2.34`... which an older glibc does
//! not have, so the loader refuses the agent. Each such function still exists at its old
//! version (`GLIBC_2.2.5`, the x86-64 baseline; in `libdl` and `libpthread` before 2.34,
//! which every CPython of that era loads, and the loader resolves a versioned reference in
//! whichever loaded object defines it), and `.symver` binds the references to it. The agent
//! is one object (`lto=fat` in `injector/build.rs`), so these directives reach the standard
//! library's references too.
//!
//! Three functions have no old version: `gettid` (2.30), `stat64` and `fstat64` (2.33: before,
//! they were inline wrappers around `__xstat64` and `__fxstat64`). The standard library
//! refers to them; the agent defines them itself, hidden (never exported, so nothing else in
//! the process binds to them), as those wrappers were.
//!
//! `tests/wheel.rs` checks the result with `objdump -T`: no `GLIBC_` version above 2.28.

std::arch::global_asm!(
    ".symver dlopen, dlopen@GLIBC_2.2.5",
    ".symver dlsym, dlsym@GLIBC_2.2.5",
    ".symver dlclose, dlclose@GLIBC_2.2.5",
    ".symver dladdr1, dladdr1@GLIBC_2.3.3",
    ".symver pthread_key_create, pthread_key_create@GLIBC_2.2.5",
    ".symver pthread_create, pthread_create@GLIBC_2.2.5",
    ".symver pthread_key_delete, pthread_key_delete@GLIBC_2.2.5",
    ".symver pthread_getspecific, pthread_getspecific@GLIBC_2.2.5",
    ".symver pthread_setspecific, pthread_setspecific@GLIBC_2.2.5",
    ".symver pthread_getattr_np, pthread_getattr_np@GLIBC_2.2.5",
    ".symver pthread_attr_getstack, pthread_attr_getstack@GLIBC_2.2.5",
    ".symver __fxstat64, __fxstat64@GLIBC_2.2.5",
    ".symver __xstat64, __xstat64@GLIBC_2.2.5",
    // int fstat64(int fd, struct stat64 *buf) = __fxstat64(_STAT_VER_LINUX (1), fd, buf)
    ".globl fstat64",
    ".hidden fstat64",
    ".type fstat64, @function",
    "fstat64:",
    "    mov rdx, rsi",
    "    mov esi, edi",
    "    mov edi, 1",
    "    jmp __fxstat64@PLT",
    ".size fstat64, . - fstat64",
    // int stat64(const char *path, struct stat64 *buf) = __xstat64(1, path, buf)
    ".globl stat64",
    ".hidden stat64",
    ".type stat64, @function",
    "stat64:",
    "    mov rdx, rsi",
    "    mov rsi, rdi",
    "    mov edi, 1",
    "    jmp __xstat64@PLT",
    ".size stat64, . - stat64",
    // pid_t gettid(void): the system call (SYS_gettid = 186), which cannot fail.
    ".globl gettid",
    ".hidden gettid",
    ".type gettid, @function",
    "gettid:",
    "    mov eax, 186",
    "    syscall",
    "    ret",
    ".size gettid, . - gettid",
);
