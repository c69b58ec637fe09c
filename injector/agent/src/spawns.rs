//! Where threads come from (`mprof_common::record::threads`): the hook of `pthread_create`
//! (`native`) writes a SPAWN with the creating thread's Python stack before the real call and
//! a SPAWNED with the new thread's `pthread_t` after it; each thread writes a HANDLE, its
//! kernel id beside its own `pthread_self()`, before its first sample of a session
//! (`sampling::announce_thread`). mprof
//! pairs them (a thread may sample before its creator returns, and a `pthread_t` is reused
//! after a join: the serials let the reader tell).
//!
//! The start routine is never wrapped (the agent may be unloaded from the GOT while the
//! thread runs), and no lock of the agent's is held across the real call (`locks`, rule 2):
//! `SESSION` is taken before it, for the SPAWN, and again after it, for the SPAWNED. None of
//! this is on the allocation hooks' fast path; a sample's slow path pays one compare.

use crate::lifecycle::{Session, ENABLED, SESSION};
use crate::sample_stack::{Announcer, Stack};
use crate::sampler::{ThreadState, THREAD};
use crate::sampling;
use mprof_common::record::threads::{
    write_handle, write_spawn, KIND_SPAWN, KIND_SPAWNED, SPAWN_TRUNCATED, THREAD_BODY,
};
use std::sync::atomic::{AtomicU32, Ordering};

/// The last creation's serial (0: none yet).
static SERIAL: AtomicU32 = AtomicU32::new(0);

/// Before the real `pthread_create`: the SPAWN of the calling thread's stack, while a session
/// runs, and the creation noted as under way with the caller's `pthread_t` word (`word`; see
/// `sampling::UnderWay`). Returns its serial, or 0 when nothing was written (no session, the
/// ring full, or a call the agent itself made).
///
/// # Safety
/// From the hook of `pthread_create`, on the creating thread (its Python frames are walked
/// with plain loads, as a sample's are: only this thread changes them, and it is in the call).
pub unsafe fn before_create(word: *mut usize) -> u32 {
    if !ENABLED.load(Ordering::Acquire) {
        return 0;
    }
    THREAD.with(|t| {
        if t.busy.replace(true) {
            return 0;
        }
        let serial = match SESSION.lock_unless_mine() {
            Some(mut shared) => {
                // SAFETY: on the creating thread, in the hook (contract).
                let serial = unsafe { write_spawn_locked(&mut shared, t) };
                if serial != 0 {
                    sampling::UNDER_WAY.add(serial, word as usize);
                }
                serial
            }
            None => 0,
        };
        t.busy.set(false);
        serial
    })
}

/// [`before_create`] under the session lock.
///
/// # Safety
/// As for [`before_create`].
unsafe fn write_spawn_locked(shared: &mut Session, t: &ThreadState) -> u32 {
    let Session {
        mapped: Some(mapped),
        caches,
        stacks,
        max_depth,
        this_thread,
        ..
    } = shared
    else {
        return 0;
    };
    if !ENABLED.load(Ordering::Relaxed) {
        return 0;
    }
    let tid = sampling::tid(t);
    let (api, layout) = (mapped.api, mapped.layout);
    let mut announcer = Announcer {
        api,
        layout,
        ring: &mut mapped.ring,
        caches,
        stacks,
        max_depth: *max_depth,
        // As the session's samples name their nodes (see `sampling`).
        entries: crate::unwind::on(),
    };
    // SAFETY: the session's `api` and `this_thread` were made for this interpreter at its
    // start; `t` is the calling thread's own.
    let stack = match unsafe { sampling::this_thread_state(api, this_thread.as_ref(), &t.key_slot) }
    {
        None => Stack::NONE,
        // SAFETY: the calling thread's own thread state, whose frames only this thread
        // changes, and it is in the call of `pthread_create` (contract).
        Some(tstate) => match unsafe { announcer.this_thread(tid, tstate) } {
            Some(stack) => stack,
            None => return 0,
        },
    };
    let serial = match SERIAL.fetch_add(1, Ordering::Relaxed).wrapping_add(1) {
        0 => SERIAL.fetch_add(1, Ordering::Relaxed).wrapping_add(1),
        serial => serial,
    };
    let flags = if stack.truncated() {
        SPAWN_TRUNCATED
    } else {
        0
    };
    let written = mapped
        .ring
        .try_write(KIND_SPAWN, stack.depth() as u16, THREAD_BODY, |b| {
            write_spawn(b, serial, tid, stack.node(), flags)
        });
    if written {
        serial
    } else {
        0
    }
}

/// After the real `pthread_create` of creation `serial` (not 0): the SPAWNED with the new
/// thread's `handle` (0: the call failed), if the session still runs.
pub fn after_create(serial: u32, handle: u64) {
    THREAD.with(|t| {
        if t.busy.replace(true) {
            return;
        }
        if let Some(mut shared) = SESSION.lock_unless_mine() {
            // Before the caller may use its word again.
            sampling::UNDER_WAY.remove(serial);
            if let Some(mapped) = &mut shared.mapped {
                mapped.ring.try_write(KIND_SPAWNED, 0, THREAD_BODY, |b| {
                    write_handle(b, serial, handle)
                });
            }
        }
        t.busy.set(false);
    })
}
