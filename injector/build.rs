//! Builds the agent library with a bare `rustc` and leaves it in OUT_DIR for `include_bytes!`.
//!
//! Cargo cannot depend on a cdylib's artifact on stable, and a nested `cargo build` fights over
//! locks, so the agent (which depends on nothing but `mprof-common`) is compiled directly: first
//! `mprof-common` as an rlib, then the agent as a cdylib linked against it.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn rustc(args: &[&str]) {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let status = Command::new(&rustc)
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {rustc}: {e}"));
    assert!(
        status.success(),
        "building the agent failed: {rustc} {args:?}"
    );
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
    let mut args = vec![
        "--edition=2021",
        &target_arg,
        "--crate-type=rlib",
        "--crate-name=mprof_common",
    ];
    args.extend(opt);
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
    args.extend(opt);
    if cycles {
        args.extend(["--cfg", "mprof_cycles"]);
    }
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
    rustc(&args);
    assert!(Path::new(&so).exists());
}
