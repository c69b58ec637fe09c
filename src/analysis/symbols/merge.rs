//! Merging a sample's Python frames into its native stack, as py-spy does.
//!
//! Walking the native stack from the innermost frame out, each activation of the bytecode
//! loop ([`Class::Eval`]: `_PyEval_EvalFrameDefault` on 3.8–3.13) is replaced by the Python
//! frames it was running. Before 3.11 that is one frame per activation; from 3.11 on, Python
//! calls Python without a new C activation, so one activation runs a run of frames: the agent
//! marks the outermost frame of each run (its *entry* frame, the one C called), and an
//! activation takes the frames up to and including the next entry frame. Native frames below
//! the innermost Python frame (an extension calling malloc) and between Python frames (a C
//! callback calling Python) stay where they are.
//!
//! Hidden unless interpreter frames are asked for: the interpreter's own frames
//! ([`Class::Interpreter`], and the bytecode loop itself once replaced), mprof's agent, the C
//! library's allocator under the allocation and its process and thread start-up frames.
//!
//! Python frames left over when the native stack ends early (cut, or an activation the
//! unwinder could not name) go on the outer end, in order: no Python frame is ever lost or
//! reordered.

use super::symbolizer::Class;
use mprof_common::record::NativeStack;

/// One native address, resolved: its frames (innermost first, as ids) and its class.
#[derive(Clone, Copy, Debug)]
pub struct Native<'a> {
    pub frames: &'a [u32],
    pub class: Class,
}

/// The merged stack, innermost first: `python` are the sample's Python frames (innermost
/// first), `entries` marks their entry frames, `native` the resolved native stack.
pub fn merge(
    python: &[u32],
    entries: &NativeStack,
    native: &[Native],
    show_internal: bool,
) -> Vec<u32> {
    let mut out = Vec::with_capacity(python.len() + native.len());
    let mut next = 0;
    let mut at_leaf = true;
    for n in native {
        let shown = match n.class {
            Class::Eval => {
                if next < python.len() {
                    let last = (next..python.len())
                        .find(|&i| entries.is_entry(i))
                        .unwrap_or(python.len() - 1);
                    out.extend_from_slice(&python[next..=last]);
                    next = last + 1;
                }
                show_internal
            }
            Class::AllocInternal => show_internal || !at_leaf,
            Class::Interpreter | Class::Agent | Class::Start => show_internal,
            Class::Other => true,
        };
        if shown {
            out.extend_from_slice(n.frames);
        }
        at_leaf &= n.class == Class::AllocInternal
            || (!shown && matches!(n.class, Class::Agent | Class::Interpreter));
    }
    out.extend_from_slice(&python[next..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Python frames are 100+, native ones their own numbers.
    fn n(frames: &[u32], class: Class) -> Native<'_> {
        Native { frames, class }
    }

    fn entries(bits: u64) -> NativeStack {
        NativeStack {
            addrs: vec![],
            entries: vec![bits],
        }
    }

    #[test]
    fn an_extension_under_python_before_3_11() {
        // level2 ← level1 ← entry ← interpreter glue ← eval[f] ← eval[<module>] ← main
        let native = [
            n(&[1], Class::Other),
            n(&[2], Class::Other),
            n(&[3], Class::Other),
            n(&[4], Class::Interpreter),
            n(&[5], Class::Eval),
            n(&[6], Class::Interpreter),
            n(&[5], Class::Eval),
            n(&[7], Class::Interpreter),
            n(&[8], Class::Start),
        ];
        let python = [100, 101];
        assert_eq!(
            merge(&python, &entries(0b11), &native, false),
            [1, 2, 3, 100, 101]
        );
        assert_eq!(
            merge(&python, &entries(0b11), &native, true),
            [1, 2, 3, 4, 100, 5, 6, 101, 5, 7, 8]
        );
    }

    #[test]
    fn one_activation_runs_several_frames_from_3_11_on() {
        // A C callback between Python frames: inner is an entry frame (C called it), outer
        // was called inline by <module>, which is the entry frame of the outer activation.
        let native = [
            n(&[9], Class::Interpreter),
            n(&[5], Class::Eval),
            n(&[4], Class::Interpreter),
            n(&[2], Class::Other),
            n(&[3], Class::Other),
            n(&[4], Class::Interpreter),
            n(&[5], Class::Eval),
        ];
        let python = [100, 101, 102];
        assert_eq!(
            merge(&python, &entries(0b101), &native, false),
            [100, 2, 3, 101, 102]
        );
    }

    #[test]
    fn leftovers_go_outside_and_allocator_internals_hide_only_at_the_leaf() {
        let native = [
            n(&[10], Class::AllocInternal),
            n(&[11], Class::Agent),
            n(&[1], Class::Other),
            n(&[10], Class::AllocInternal),
        ];
        let python = [100, 101];
        assert_eq!(
            merge(&python, &entries(0), &native, false),
            [1, 10, 100, 101]
        );
        assert_eq!(
            merge(&python, &entries(0), &native, true),
            [10, 11, 1, 10, 100, 101]
        );
        // More activations than Python frames (a stack cut at --max-depth): the extra ones
        // are interpreter frames.
        let native = [n(&[5], Class::Eval), n(&[5], Class::Eval)];
        assert_eq!(merge(&[100], &entries(1), &native, false), [100]);
        assert_eq!(merge(&[100], &entries(1), &native, true), [100, 5, 5]);
        assert_eq!(merge(&[], &entries(0), &[], false), Vec::<u32>::new());
    }
}
