//! The second pass over a capture: which sampled blocks were live at a given point (the
//! peak), reusing the stacks the first pass found.

use super::LoadError;
use crate::analysis::aggregate::Block;
use crate::analysis::names::{FastMap, StackId};
use crate::capture::meta::{ended_by_exec, meta_rate};
use mprof_common::record::Record;

/// Replays records to find which sampled blocks were live at a given point, reusing the stack
/// of each Alloc found by the first pass (`stacks`, one per Alloc, in order).
pub(super) struct Replay<'a> {
    /// Per process, by address.
    pub(super) live: Vec<FastMap<u64, Block>>,
    /// The rate of each process, as last announced.
    rates: Vec<u64>,
    allocs: std::slice::Iter<'a, u32>,
}

impl<'a> Replay<'a> {
    pub(super) fn new(stacks: &'a [u32], first_rate: u64) -> Replay<'a> {
        Replay {
            live: vec![FastMap::default()],
            rates: vec![first_rate],
            allocs: stacks.iter(),
        }
    }

    /// The rate of `process`, as the aggregator keeps it (a process without an announcement
    /// takes the first rate of process 0).
    fn rate(&mut self, process: u32) -> &mut u64 {
        let process = process.min(crate::analysis::aggregate::MAX_PROCESSES as u32 - 1) as usize;
        if self.rates.len() <= process {
            let rate = self.rates[0];
            self.rates.resize(process + 1, rate);
            self.live.resize_with(process + 1, FastMap::default);
        }
        &mut self.rates[process]
    }

    /// Applies the next record of `process`; an Alloc the first pass did not see means the
    /// file changed.
    pub(super) fn apply(&mut self, process: u32, record: &Record) -> Result<(), LoadError> {
        let process = process.min(crate::analysis::aggregate::MAX_PROCESSES as u32 - 1);
        match record {
            Record::Meta { text } => {
                let rate = self.rate(process);
                *rate = meta_rate(text).unwrap_or(*rate);
                // It ran a new program by exec: its blocks are gone (`Aggregator::apply`).
                if ended_by_exec(text) {
                    self.live[process as usize] = FastMap::default();
                }
            }
            Record::Alloc {
                addr, size, tid, ..
            } => {
                let stack = *self.allocs.next().ok_or(LoadError::Changed)?;
                let block = Block {
                    stack: StackId(stack),
                    tid: *tid,
                    size: *size,
                    rate: *self.rate(process),
                };
                self.live[process as usize].insert(*addr, block);
            }
            Record::Free { addr } => {
                if let Some(live) = self.live.get_mut(process as usize) {
                    live.remove(addr);
                }
            }
            // A child's records ended: its blocks are not in the heap after it (see
            // `Aggregator::leave`).
            Record::Stats { .. } if process != 0 => {
                if let Some(live) = self.live.get_mut(process as usize) {
                    *live = FastMap::default();
                }
            }
            _ => {}
        }
        Ok(())
    }
}
