//! Where threads come from: the Python stack that created each thread, so that work done on a
//! thread pool's or a library's own threads can be shown under the line of the user's code
//! that started them.
//!
//! ```text
//!  SPAWN (kind 22), aux = Python frames in the stack; written by the creating thread just
//!  before it calls pthread_create
//!  0        4      8        12      16
//!  +--------+------+--------+-------+
//!  | serial | tid  | stack  | flags |
//!  +--------+------+--------+-------+
//!
//!  SPAWNED (kind 23): how that call ended, written once it returned
//!  0        4      8
//!  +--------+------+--------------+
//!  | serial | pad  | handle u64   |
//!  +--------+------+--------------+
//!
//!  HANDLE (kind 24): written by a thread before its first sample of a session
//!  0      4        8
//!  +------+--------+--------------+
//!  | tid  | serial | handle u64   |
//!  +------+--------+--------------+
//! ```
//! `serial` numbers the creations of a process (from 1); `tid` in SPAWN is the creating
//! thread's kernel id, `stack` its innermost interned node (0: no Python frame; see
//! [`crate::stacks`]) and `flags` bit 0 says the stack was cut. `handle` is the new thread's
//! `pthread_t`, 0 when the call failed. HANDLE pairs a thread's kernel id with its own
//! `pthread_self()`, and the serial of its creation when the agent could tell (the one
//! creation under way whose caller's `pthread_t` word holds the handle already), else 0.
//!
//! Pairing them (the reader's part): a thread's HANDLE can come before the SPAWNED of its own
//! creation (the new thread may run, and sample, before its creator returns), and a `pthread_t`
//! is reused once its thread is joined. So a thread whose HANDLE comes while creations are
//! under way (a SPAWN without its SPAWNED yet) waits for them: it is the one a creation of those
//! returned its handle to, if one did; otherwise the latest creation that returned its handle
//! before (mprof's `analysis::origins` does that).

pub const KIND_SPAWN: u16 = 22;
pub const KIND_SPAWNED: u16 = 23;
pub const KIND_HANDLE: u16 = 24;
/// Size of a SPAWN, SPAWNED and HANDLE body.
pub const THREAD_BODY: usize = 16;
/// SPAWN flag: the creating thread's stack was cut at `max_depth`.
pub const SPAWN_TRUNCATED: u32 = 1;

/// Writes a SPAWN body (16 bytes).
pub fn write_spawn(b: &mut [u8], serial: u32, tid: u32, stack: u32, flags: u32) {
    b[0..4].copy_from_slice(&serial.to_le_bytes());
    b[4..8].copy_from_slice(&tid.to_le_bytes());
    b[8..12].copy_from_slice(&stack.to_le_bytes());
    b[12..16].copy_from_slice(&flags.to_le_bytes());
}

/// Writes a SPAWNED or HANDLE body (16 bytes): `id` is the serial or the thread id.
pub fn write_handle(b: &mut [u8], id: u32, handle: u64) {
    b[0..4].copy_from_slice(&id.to_le_bytes());
    b[4..8].copy_from_slice(&0u32.to_le_bytes());
    b[8..16].copy_from_slice(&handle.to_le_bytes());
}

/// A SPAWN body: (serial, tid, stack, flags).
pub fn read_spawn(body: &[u8]) -> Option<(u32, u32, u32, u32)> {
    let b = body.get(..THREAD_BODY)?;
    let word = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    Some((word(0), word(4), word(8), word(12)))
}

/// A SPAWNED or HANDLE body: (serial or tid, handle); a HANDLE's serial is [`handle_serial`].
pub fn read_handle(body: &[u8]) -> Option<(u32, u64)> {
    let b = body.get(..THREAD_BODY)?;
    Some((
        u32::from_le_bytes(b[0..4].try_into().unwrap()),
        u64::from_le_bytes(b[8..16].try_into().unwrap()),
    ))
}

/// A HANDLE body's serial of the thread's creation (0: not known).
pub fn handle_serial(body: &[u8]) -> u32 {
    body.get(4..8)
        .map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_round_trip() {
        let mut b = [0u8; THREAD_BODY];
        write_spawn(&mut b, 7, 42, 9, SPAWN_TRUNCATED);
        assert_eq!(read_spawn(&b), Some((7, 42, 9, 1)));
        write_handle(&mut b, 42, 0x7f00_1234_5678);
        assert_eq!(read_handle(&b), Some((42, 0x7f00_1234_5678)));
        assert_eq!(read_handle(&b[..15]), None);
        assert_eq!(read_spawn(&b[..3]), None);
    }
}
