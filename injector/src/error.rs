//! Why an attach failed, each with the one-line message the user sees.

use std::fmt;
use std::time::Duration;

#[derive(Debug)]
pub enum AttachError {
    NoSuchProcess(u32),
    /// Not allowed to trace the target (or to read its memory map).
    PermissionDenied {
        pid: u32,
        owner: Option<u32>,
        /// mprof may trace any process (root, or CAP_SYS_PTRACE): the refusal is the target's
        /// or the system's, and "run as root" would not help.
        privileged: bool,
    },
    NotPython {
        pid: u32,
        exe: String,
    },
    Unsupported {
        pid: u32,
        version: (u8, u8),
    },
    /// The target is in a job-control stop (SIGSTOP) or stopped by a debugger.
    Stopped(u32),
    AlreadyTraced {
        pid: u32,
        tracer: u32,
        name: String,
    },
    /// The target exited while mprof was attaching.
    Exited(u32),
    /// The target replaced its program (`execve`) while mprof was attaching: mprof let the
    /// new program go untouched.
    Execed {
        pid: u32,
        from: String,
        to: String,
    },
    NoSafePoint {
        pid: u32,
        waited: Duration,
        /// What each thread was doing when last seen.
        threads: Vec<String>,
    },
    /// mprof was asked to stop (Ctrl-C) while it looked for a safe point.
    Interrupted(u32),
    /// The target did something no honest process does (swapped a descriptor mprof was
    /// about to write); mprof backs off.
    Hostile {
        pid: u32,
        what: String,
    },
    /// The target does not allow a writable and executable mapping.
    NoExecMemory {
        pid: u32,
        errno: i32,
    },
    /// A profiling session (attach or record) is running in the target.
    Busy(u32),
    /// An agent from another mprof build is loaded in the target.
    ForeignAgent(u32),
    /// The loader refused the agent.
    Dlopen {
        pid: u32,
        message: String,
    },
    /// The injected call did not finish in time.
    Timeout {
        pid: u32,
        stage: u64,
    },
    /// Anything else, with context.
    Other(String),
}

fn yama_scope() -> String {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .map(|s| format!("kernel.yama.ptrace_scope is {}", s.trim()))
        .unwrap_or_else(|_| "check kernel.yama.ptrace_scope if Yama is enabled".into())
}

impl fmt::Display for AttachError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use AttachError::*;
        match self {
            NoSuchProcess(pid) => write!(f, "no process with PID {pid}"),
            PermissionDenied {
                pid,
                owner,
                privileged,
            } => {
                let who = owner
                    .map(|u| format!(" (owned by uid {u})"))
                    .unwrap_or_default();
                if *privileged {
                    write!(
                        f,
                        "permission denied: the kernel will not let mprof trace PID {pid}{who}, \
                         although mprof has CAP_SYS_PTRACE: the process is protected (a security \
                         module such as SELinux or AppArmor, a container or user namespace it \
                         cannot be traced across; {})",
                        yama_scope()
                    )
                } else {
                    write!(
                        f,
                        "permission denied: cannot trace PID {pid}{who}; run mprof as root or \
                         grant it CAP_SYS_PTRACE ({})",
                        yama_scope()
                    )
                }
            }
            NotPython { pid, exe } => write!(
                f,
                "PID {pid} ({exe}) is not a Python process: no libpython is mapped and the \
                 executable does not export Py_GetVersion"
            ),
            Unsupported {
                pid,
                version: (a, b),
            } => {
                let ((a0, b0), (a1, b1)) = mprof_common::layout::supported_range();
                write!(
                    f,
                    "PID {pid} runs Python {a}.{b}; mprof supports Python {a0}.{b0} to {a1}.{b1}"
                )
            }
            Stopped(pid) => write!(
                f,
                "PID {pid} is stopped (SIGSTOP or a debugger); mprof leaves it as it is: \
                 resume it (kill -CONT {pid}) and attach again"
            ),
            AlreadyTraced { pid, tracer: 0, .. } => write!(
                f,
                "PID {pid} is being traced by another process (a debugger, or another mprof \
                 attach in progress); try again when it is done"
            ),
            AlreadyTraced { pid, tracer, name } => write!(
                f,
                "PID {pid} is already traced by PID {tracer} ({name}): a debugger or another \
                 mprof attach is in progress"
            ),
            Exited(pid) => write!(f, "PID {pid} exited during the attach"),
            Execed { pid, from, to } => write!(
                f,
                "PID {pid} replaced its program during the attach ({from} exec'd {to}); mprof \
                 let the new program go untouched"
            ),
            NoSafePoint {
                pid,
                waited,
                threads,
            } => {
                let seen = if threads.is_empty() {
                    String::new()
                } else {
                    format!("; last seen: {}", threads.join("; "))
                };
                write!(
                    f,
                    "no thread of PID {pid} reached a safe point in {:.1} s; nothing was \
                     changed: try again, or wait longer with --timeout{seen}",
                    waited.as_secs_f64()
                )
            }
            Interrupted(pid) => write!(
                f,
                "interrupted while looking for a safe point in PID {pid}; nothing was changed"
            ),
            Hostile { pid, what } => write!(
                f,
                "PID {pid} interfered with the attach ({what}); mprof wrote nothing and backed off"
            ),
            NoExecMemory { pid, errno } => write!(
                f,
                "PID {pid} refused an executable memory page ({}): it may run with \
                 MemoryDenyWriteExecute or an SELinux execmem rule",
                std::io::Error::from_raw_os_error(*errno)
            ),
            Busy(pid) => write!(
                f,
                "PID {pid} is already being profiled (by another mprof attach, mprof record, or \
                 pymprof inside the program)"
            ),
            ForeignAgent(pid) => write!(
                f,
                "PID {pid} holds an mprof agent from a different mprof build; attach with the \
                 mprof that loaded it"
            ),
            Dlopen { pid, message } => {
                write!(
                    f,
                    "the loader of PID {pid} refused the mprof agent: {message}"
                )
            }
            Timeout { pid, stage } => write!(
                f,
                "the agent of PID {pid} did not start in time (trampoline stage {stage}); \
                 it will switch itself off if it starts later"
            ),
            Other(text) => f.write_str(text),
        }
    }
}

impl std::error::Error for AttachError {}

/// Wraps an I/O error with what mprof was doing.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub fn other(what: &str, e: impl fmt::Display) -> AttachError {
    AttachError::Other(format!("{what}: {e}"))
}
