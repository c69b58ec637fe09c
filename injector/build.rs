//! Builds the agent library with a bare `rustc` and leaves it in OUT_DIR for `include_bytes!`.
//!
//! Cargo cannot depend on a cdylib's artifact on stable, and a nested `cargo build` fights over
//! locks, so the agent (which depends on nothing but `mprof-common`) is compiled directly: first
//! `mprof-common` as an rlib, then the agent as a cdylib linked against it.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs the compiler; what it printed goes into the build script's stderr, and is returned.
fn rustc(args: &[&str]) -> String {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(&rustc)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {rustc}: {e}"));
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    eprint!("{said}");
    assert!(
        out.status.success(),
        "building the agent failed: {rustc} {args:?}"
    );
    said
}

/// How the agent uses its profile (`injector/agent.profdata`, made by `tools/agent-pgo.sh`
/// from the benchmarks' workloads): the compiler lays out the slow paths' code by how often
/// each part ran, so that a sample touches fewer lines of it. `MPROF_AGENT_PGO=off` builds
/// without it; `MPROF_AGENT_PGO=generate=DIR` builds an agent that counts, into DIR, what its
/// code ran (for the script).
enum Pgo {
    /// Why not: "off" (asked), "no profile" (none, or not for this target).
    Off(&'static str),
    Generate(String),
    Use(PathBuf),
}

fn pgo(here: &Path, target: &str) -> Pgo {
    println!("cargo:rerun-if-env-changed=MPROF_AGENT_PGO");
    let profile = here.join("agent.profdata");
    println!("cargo:rerun-if-changed={}", profile.display());
    match env::var("MPROF_AGENT_PGO").as_deref() {
        Ok("off") => Pgo::Off("off"),
        Ok(v) if v.starts_with("generate=") => Pgo::Generate(v["generate=".len()..].to_string()),
        // The profile was made on x86-64 Linux: elsewhere the code differs too much for it.
        _ if target == "x86_64-unknown-linux-gnu" && profile.exists() => Pgo::Use(profile),
        _ => Pgo::Off("no profile"),
    }
}

fn main() {
    let here = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let common = here.join("../common/src/lib.rs");
    let agent = here.join("agent/src/lib.rs");
    for dir in ["../common/src", "agent/src"] {
        println!("cargo:rerun-if-changed={}", here.join(dir).display());
    }
    // The diagnostic build that counts the slow paths' cycles (agent/src/cycles.rs).
    println!("cargo:rerun-if-env-changed=MPROF_AGENT_CYCLES");
    let cycles = env::var_os("MPROF_AGENT_CYCLES").is_some_and(|v| v == "1");
    let out_s = out.to_str().unwrap();
    let common_rlib = out.join("libmprof_common.rlib");
    // The agent is built for the same target as the CLI that carries it.
    let target = env::var("TARGET").unwrap();
    let target_arg = format!("--target={target}");
    let opt = [
        "-C",
        "opt-level=3",
        "-C",
        "panic=abort",
        "-C",
        "debuginfo=1",
        // Native stacks (`--native`) unwind through the agent's own frames first.
        "-C",
        "force-unwind-tables=yes",
        "-C",
        "codegen-units=1",
    ];
    let mut opt = opt.to_vec();
    if target.starts_with("x86_64") {
        // The agent's thread-locals through TLS descriptors: where the loader finds room in
        // the static TLS block (as it does for a small dlopen'ed module), a hook's access is a
        // call of a two-instruction function and a load at the thread pointer, where
        // `__tls_get_addr` read the thread's vector of modules (about ten instructions, and
        // two or three data lines the interpreter's own work evicts between calls). Elsewhere
        // the descriptor's function looks the block up as `__tls_get_addr` did.
        opt.extend(["-C", "llvm-args=-enable-tlsdesc"]);
        // Every function starts on a cache line of its own. The hooks' fast paths are a few
        // dozen bytes each, run at every allocation and are evicted by the interpreter's own
        // code between calls: at the compiler's 16 bytes the OBJ domain's malloc hook straddled
        // two lines, each fetched again after an eviction. On the web server (callgrind, hooks
        // alone) the agent's I1 misses went from 263 to 160 a request and the whole program's
        // from 24,208 to 23,954, for 16 KiB of padding.
        opt.extend(["-C", "llvm-args=-align-all-functions=6"]);
    }
    let mut args = vec![
        "--edition=2021",
        &target_arg,
        "--crate-type=rlib",
        "--crate-name=mprof_common",
    ];
    args.extend(&opt);
    args.extend([
        "-o",
        common_rlib.to_str().unwrap(),
        common.to_str().unwrap(),
    ]);
    rustc(&args);
    let extern_arg = format!("mprof_common={}", common_rlib.display());
    let so = out.join("libmprof_agent.so");
    let mut args = vec![
        "--edition=2021",
        &target_arg,
        "--crate-type=cdylib",
        "--crate-name=mprof_agent",
    ];
    args.extend(&opt);
    if cycles {
        args.extend(["--cfg", "mprof_cycles"]);
    }
    let pgo = pgo(&here, &target);
    let pgo_arg = match &pgo {
        Pgo::Off(_) => None,
        Pgo::Generate(dir) => Some(format!("-Cprofile-generate={dir}")),
        // Functions changed since the profile was made are compiled as without one.
        Pgo::Use(profile) => Some(format!("-Cprofile-use={}", profile.display())),
    };
    // The linker cargo picked for the target (set for cross builds in .cargo/config.toml).
    let linker = env::var("RUSTC_LINKER").map(|l| format!("linker={l}"));
    if let Ok(linker) = &linker {
        args.extend(["-C", linker]);
    }
    args.extend([
        "-C",
        "lto=fat",
        "-C",
        "link-arg=-Wl,-z,nodelete",
        "-L",
        out_s,
        "--extern",
        &extern_arg,
        "-o",
        so.to_str().unwrap(),
        agent.to_str().unwrap(),
    ]);
    let with_pgo: Vec<&str> = args.iter().copied().chain(pgo_arg.as_deref()).collect();
    // How the agent was laid out, for `mprof_injector::agent::AGENT_LAYOUT`.
    let layout = match &pgo {
        Pgo::Use(profile) => {
            // The compiler warns, and goes on without it, when it cannot read the profile
            // (another LLVM's format); it warns of each function changed since the profile
            // was made ("hash mismatch"), which it compiles as without one.
            let said = rustc(&with_pgo);
            let path = profile.display().to_string();
            let stale = said.lines().filter(|l| l.contains("hash mismatch")).count();
            let unreadable = said
                .lines()
                .any(|l| l.starts_with("warning") && l.contains(&path));
            if unreadable {
                println!(
                    "cargo:warning=the agent was built without its profile ({path}): this \
                     compiler cannot read it (tools/agent-pgo.sh makes it again)"
                );
                "unreadable"
            } else {
                if stale > 0 {
                    println!(
                        "cargo:warning=the agent's profile ({path}) is out of date for {stale} \
                         function(s), compiled as without it (tools/agent-pgo.sh makes it again)"
                    );
                }
                "profile"
            }
        }
        Pgo::Generate(_) => {
            rustc(&with_pgo);
            "instrumented"
        }
        Pgo::Off(why) => {
            rustc(&args);
            why
        }
    };
    println!("cargo:rustc-env=MPROF_AGENT_LAYOUT={layout}");
    assert!(Path::new(&so).exists());
}
