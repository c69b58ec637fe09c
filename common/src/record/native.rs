//! The native section of an ALLOC record (`--native`, flag bit 3): the sample's native stack,
//! after the Python frames.
//!
//! ```text
//!  native section (after the Python frames, 8-aligned):
//!  +-------------+-------------+---------------------------+------------------------------+
//!  | nnative u32 | nwords u32  | entry bitmap: nwords u64  | return addresses: nnative u64 |
//!  +-------------+-------------+---------------------------+------------------------------+
//! ```
//! Bit i of the bitmap is set when Python frame i (innermost first) was the first frame a new
//! C-level call of the bytecode loop ran (an "entry" frame: the native stack's eval-loop frames
//! match the entry frames one to one). The addresses are innermost first; all but the first
//! are return addresses (one past the call). Readers that do not know the section ignore it, as
//! any trailing bytes of a body.

use super::{ALLOC_FIXED, ALLOC_NATIVE_STACK, FRAME_SIZE};

/// Most native frames a sample carries.
pub const MAX_NATIVE_FRAMES: usize = 128;

/// The native stack of a sample, decoded from an ALLOC body's native section.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NativeStack {
    /// Instruction addresses, innermost first (all but the first are return addresses).
    pub addrs: Vec<u64>,
    /// Bit i set: Python frame i was an entry frame of the bytecode loop.
    pub entries: Vec<u64>,
}

impl NativeStack {
    /// Whether Python frame `i` (innermost first) was an entry frame.
    pub fn is_entry(&self, i: usize) -> bool {
        self.entries
            .get(i / 64)
            .is_some_and(|w| w >> (i % 64) & 1 == 1)
    }

    /// The section's bytes, as the agent writes them.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(8 + 8 * (self.entries.len() + self.addrs.len()));
        b.extend_from_slice(&(self.addrs.len() as u32).to_le_bytes());
        b.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for w in self.entries.iter().chain(&self.addrs) {
            b.extend_from_slice(&w.to_le_bytes());
        }
        b
    }
}

/// The native stack of an ALLOC body (`frames` Python frames long), if its flags say one
/// follows; bounded: a section claiming more than the body holds is ignored.
pub fn native_stack(body: &[u8], frames: usize, flags: u32) -> Option<NativeStack> {
    if flags & ALLOC_NATIVE_STACK == 0 {
        return None;
    }
    let at = ALLOC_FIXED + frames * FRAME_SIZE;
    let head = body.get(at..at + 8)?;
    let n = u32::from_le_bytes(head[0..4].try_into().ok()?) as usize;
    let words = u32::from_le_bytes(head[4..8].try_into().ok()?) as usize;
    if n > MAX_NATIVE_FRAMES || words > 4 {
        return None;
    }
    let data = body.get(at + 8..at + 8 + 8 * (words + n))?;
    let u64s: Vec<u64> = data
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    Some(NativeStack {
        entries: u64s[..words].to_vec(),
        addrs: u64s[words..].to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_native_section_round_trips_and_lies_are_ignored() {
        let stack = NativeStack {
            addrs: vec![0x1000, 0x2000, 0x3000],
            entries: vec![0b101],
        };
        let mut body = vec![0u8; ALLOC_FIXED + 2 * FRAME_SIZE];
        body.extend_from_slice(&stack.encode());
        assert_eq!(
            native_stack(&body, 2, ALLOC_NATIVE_STACK),
            Some(stack.clone())
        );
        assert!(stack.is_entry(0) && !stack.is_entry(1) && stack.is_entry(2));
        assert_eq!(native_stack(&body, 2, 0), None, "no flag, no section");
        let mut lying = body.clone();
        let at = ALLOC_FIXED + 2 * FRAME_SIZE;
        lying[at..at + 4].copy_from_slice(&1000u32.to_le_bytes());
        assert_eq!(native_stack(&lying, 2, ALLOC_NATIVE_STACK), None);
        assert_eq!(native_stack(&body[..at + 12], 2, ALLOC_NATIVE_STACK), None);
    }
}
