//! The suite's two tiers, and what a skipped test means in CI.
//!
//! - **Full tier** (the default, and what CI runs): every test on every supported interpreter
//!   the machine has, with the real consumers of mprof's outputs.
//! - **Fast tier** (`MPROF_TESTS=fast`): the unit, golden, format and fuzz-corpus tests, and
//!   the integration tests on one interpreter ([`pythons`](super::pythons) returns pyenv's 3.11,
//!   or the first one found); the tests marked [`full_tier_only`] (real consumers, races and
//!   kills repeated hundreds of times, every interpreter by design) return at once and say so.
//!
//! A test that cannot run here says why with a `SKIPPED` line. Under `MPROF_CI=1` (set by
//! `.ci/run`) the reasons split in two: what CI provides (a tool `.ci/run` installs, a package
//! `tools/test-deps.sh` installs, root) makes the test fail instead ([`skip`]); what no CI
//! script can give a machine (an interpreter it does not have, a kernel setting) stays a skip
//! ([`skip_here`]).

/// Whether the fast tier was asked for (`MPROF_TESTS=fast`). CI always runs the full tier: the
/// two together are a mistake, said at once.
pub fn fast() -> bool {
    let fast = match std::env::var("MPROF_TESTS").as_deref() {
        Ok("fast") => true,
        Ok("" | "full") | Err(_) => false,
        Ok(other) => panic!("MPROF_TESTS={other}: expected `fast` or `full`"),
    };
    assert!(
        !(fast && ci()),
        "MPROF_CI=1 runs the full tier: unset MPROF_TESTS"
    );
    fast
}

/// Whether this run is CI's (`MPROF_CI=1`, set by `.ci/run`).
pub fn ci() -> bool {
    std::env::var("MPROF_CI").is_ok_and(|v| v == "1")
}

/// `true` (after saying so) when the fast tier runs: the test belongs to the full tier only,
/// and the caller returns. `why` says what makes it full-tier (its length, a real consumer).
pub fn full_tier_only(test: &str, why: &str) -> bool {
    let fast = fast();
    if fast {
        eprintln!("FULL TIER ONLY {test}: {why} (MPROF_TESTS=fast skips it)");
    }
    fast
}

/// A test (or part of one) cannot run for want of something CI provides: a tool `.ci/run`
/// installs, a package `tools/test-deps.sh` installs, or root (`.ci/run` runs as root). Says
/// `SKIPPED` here; under `MPROF_CI=1` it fails the test instead.
pub fn skip(test: &str, why: &str) {
    assert!(
        !ci(),
        "{test} would be skipped in CI ({why}): .ci/run provides this, so a skip is a failure"
    );
    eprintln!("SKIPPED {test}: {why}");
}

/// A test (or part of one) cannot run for want of something no CI script gives a machine: an
/// interpreter it does not have, a kernel setting, a feature a Python version lacks. Says
/// `SKIPPED`, in CI too.
pub fn skip_here(test: &str, why: &str) {
    eprintln!("SKIPPED {test}: {why}");
}

/// Root, or a [`skip`] (a failure in CI, which runs as root) saying what needs it.
pub fn root(test: &str, what: &str) -> bool {
    let root = super::procs::is_root();
    if !root {
        skip(test, &format!("not root ({what})"));
    }
    root
}
