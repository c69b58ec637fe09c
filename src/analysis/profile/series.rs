//! The timeline's series, recorded in the profile's one pass: the live heap and RSS at points
//! over the capture (with the lowest and highest live heap since the point before, so that a
//! temporary allocated and freed between two points still shows), and the live bytes of every
//! stack as a log of changes, so that the timeline can draw any top rows, grouped any way by
//! frame (your code, line, function, file), without reading the capture again
//! (`crate::views::timeline`). (Per line, the innermost frame, was not enough: one library line
//! reached from several lines of yours is several rows by your code.)
//!
//! Points are taken after a timed record at least `step` after the previous point. The step
//! starts at 1 ms and doubles whenever there are twice [`POINTS`] points (every other point is
//! dropped then, and the log merged with it), so a capture of any length ends with between
//! `POINTS` and twice as many. The log holds, per point, the stacks whose bytes changed since
//! the previous point; if it would outgrow [`MAX_LOG`] entries with few points left, the
//! series is given up and the timeline reads the capture again.

use crate::analysis::aggregate::Aggregator;
use crate::analysis::names::StackId;

/// Points kept at least (at most twice as many).
pub const POINTS: usize = 800;
/// The most entries the log holds before the series is thinned, or given up.
pub const MAX_LOG: usize = 1 << 20;
/// The first step between points.
const FIRST_STEP_NS: u64 = 1_000_000;

/// One point of a series.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SeriesPoint {
    pub time_ns: u64,
    /// The last RSS reading.
    pub rss: Option<u64>,
    /// The estimated live heap.
    pub heap: f64,
    /// The lowest and highest live heap since the point before (this one's `heap` included),
    /// and whether the highest came first.
    pub lo: f64,
    pub hi: f64,
    pub hi_first: bool,
}

/// A capture's series, as recorded.
#[derive(Clone, Debug, Default)]
pub struct Recorded {
    pub points: Vec<SeriesPoint>,
    /// The stacks of the series (a "line" of the log is an index in it).
    pub lines: Vec<StackId>,
    /// (point, line, live bytes of the line's stack from that point on), in point order.
    pub log: Vec<(u32, u32, f64)>,
}

/// A series being recorded.
#[derive(Default)]
pub(super) struct Series {
    rec: Recorded,
    /// The line of each stack (index: stack id), `u32::MAX` unknown yet.
    line_of: Vec<u32>,
    /// Live bytes per line now, and the lines changed since the last point.
    bytes: Vec<f64>,
    changed: Vec<u32>,
    is_changed: Vec<bool>,
    step_ns: u64,
    last_point_ns: Option<u64>,
    last_ns: Option<u64>,
    /// The live heap's range since the last point.
    range: HeapRange,
}

/// The live heap's lowest and highest values since a point, and the events at which each was
/// last reached (counted from the point, for the order they are drawn in): what a point says
/// of the time between it and the one before. Shared by the series and the timeline's own
/// pass (`crate::views::timeline`).
#[derive(Clone, Copy, Debug, Default)]
pub struct HeapRange {
    lo: f64,
    hi: f64,
    lo_at: i64,
    hi_at: i64,
    events: i64,
}

impl HeapRange {
    /// After every event: the live heap now.
    pub fn observe(&mut self, heap: f64) {
        let heap = heap.max(0.0);
        self.events += 1;
        if heap <= self.lo {
            (self.lo, self.lo_at) = (heap, self.events);
        }
        if heap >= self.hi {
            (self.hi, self.hi_at) = (heap, self.events);
        }
    }

    /// Whether any event was observed since the last point.
    fn observed(&self) -> bool {
        self.events != 0
    }

    /// At a point where the live heap is `heap`: the range since the one before (`heap`
    /// included) and whether its highest came first; the range starts again at `heap`.
    pub fn take(&mut self, heap: f64) -> (f64, f64, bool) {
        let taken = (
            self.lo.min(heap),
            self.hi.max(heap),
            self.hi_at < self.lo_at,
        );
        *self = HeapRange {
            lo: heap,
            hi: heap,
            ..HeapRange::default()
        };
        taken
    }

    /// Takes in the range of a point dropped just before (`lo`, `hi`, `hi_first`), reached
    /// before every event since.
    fn absorb_earlier(&mut self, lo: f64, hi: f64, hi_first: bool) {
        let (hi_at, lo_at) = if hi_first { (-2, -1) } else { (-1, -2) };
        if hi >= self.hi {
            (self.hi, self.hi_at) = (hi, hi_at);
        }
        if lo <= self.lo {
            (self.lo, self.lo_at) = (lo, lo_at);
        }
    }
}

impl Series {
    /// The live bytes of `stack` changed by `bytes`.
    #[inline(always)]
    pub(super) fn change(&mut self, stack: StackId, bytes: f64) {
        let line = match self.line_of.get(stack.0 as usize) {
            Some(&line) if line != u32::MAX => line as usize,
            _ => self.new_line(stack),
        };
        self.bytes[line] += bytes;
        if !self.is_changed[line] {
            self.is_changed[line] = true;
            self.changed.push(line as u32);
        }
    }

    /// The line of a stack met for the first time.
    #[cold]
    fn new_line(&mut self, stack: StackId) -> usize {
        let s = stack.0 as usize;
        if self.line_of.len() <= s {
            self.line_of.resize(s + 1, u32::MAX);
        }
        if self.line_of[s] == u32::MAX {
            self.line_of[s] = self.rec.lines.len() as u32;
            self.rec.lines.push(stack);
            self.bytes.push(0.0);
            self.is_changed.push(false);
        }
        self.line_of[s] as usize
    }

    /// After every event: the live heap now, for the range between points.
    pub(super) fn observe(&mut self, heap: f64) {
        self.range.observe(heap);
    }

    /// After a timed record at `time_ns`: takes a point if it is time. False when the series
    /// is given up.
    #[inline(always)]
    pub(super) fn at(&mut self, time_ns: u64, agg: &Aggregator) -> bool {
        self.last_ns = Some(time_ns);
        if self
            .last_point_ns
            .is_some_and(|t| time_ns.saturating_sub(t) < self.step_ns)
        {
            return true;
        }
        self.take_point(time_ns, agg)
    }

    /// [`Series::at`] when it is time for a point.
    #[inline(never)]
    fn take_point(&mut self, time_ns: u64, agg: &Aggregator) -> bool {
        if self.step_ns == 0 {
            self.step_ns = FIRST_STEP_NS;
        }
        if self
            .last_point_ns
            .is_some_and(|t| time_ns.saturating_sub(t) < self.step_ns)
        {
            return true;
        }
        self.point(time_ns, agg);
        if self.rec.points.len() >= 2 * POINTS || self.rec.log.len() >= MAX_LOG {
            self.thin();
            if self.rec.log.len() >= MAX_LOG && self.rec.points.len() <= POINTS / 4 {
                return false;
            }
        }
        true
    }

    fn point(&mut self, time_ns: u64, agg: &Aggregator) {
        self.last_point_ns = Some(time_ns);
        let index = self.rec.points.len() as u32;
        let heap = agg.live_bytes.max(0.0);
        // The first point's range starts at it.
        if self.rec.points.is_empty() && !self.range.observed() {
            self.range.take(heap);
        }
        let (lo, hi, hi_first) = self.range.take(heap);
        self.rec.points.push(SeriesPoint {
            time_ns,
            rss: agg.last_rss,
            heap,
            lo,
            hi,
            hi_first,
        });
        for line in self.changed.drain(..) {
            self.is_changed[line as usize] = false;
            self.rec.log.push((index, line, self.bytes[line as usize]));
        }
    }

    /// Drops every other point (each pair keeps its later one) and doubles the step.
    fn thin(&mut self) {
        self.step_ns = self.step_ns.saturating_mul(2);
        let points = &mut self.rec.points;
        let kept: Vec<SeriesPoint> = points
            .chunks(2)
            .map(|pair| match pair {
                [a, b] => merge(a, b),
                _ => pair[0],
            })
            .collect();
        *points = kept;
        // Per line, where its entry of the merged point being written is.
        let mut last: Vec<(u32, u32)> = vec![(u32::MAX, 0); self.rec.lines.len()];
        let mut log = Vec::with_capacity(self.rec.log.len());
        for &(point, line, bytes) in &self.rec.log {
            let merged = point / 2;
            let (at_point, at) = last[line as usize];
            if at_point == merged {
                log[at as usize] = (merged, line, bytes);
            } else {
                last[line as usize] = (merged, log.len() as u32);
                log.push((merged, line, bytes));
            }
        }
        self.rec.log = log;
    }

    /// The series, with a last point for the state after the last record.
    pub(super) fn finish(mut self, agg: &Aggregator) -> Recorded {
        if let Some(t) = self.last_ns {
            if self.last_point_ns != Some(t) || self.rec.points.is_empty() {
                self.point(t, agg);
            } else {
                // The last point was taken before the records that came after it at the same
                // time: it is the state after the last record, its range that one's too
                // (reached before every event since).
                if let Some(last) = self.rec.points.pop() {
                    self.range.absorb_earlier(last.lo, last.hi, last.hi_first);
                }
                let index = self.rec.points.len() as u32;
                self.rec.log.retain(|&(p, _, _)| p < index);
                for line in 0..self.bytes.len() {
                    self.is_changed[line] = false;
                }
                let index_lines: Vec<u32> = (0..self.bytes.len() as u32).collect();
                self.changed = index_lines;
                self.point(t, agg);
            }
        }
        self.rec
    }
}

/// Two neighbouring points as one: the later one's state, the range of both, in order.
fn merge(a: &SeriesPoint, b: &SeriesPoint) -> SeriesPoint {
    let hi_in_a = a.hi > b.hi;
    let lo_in_a = a.lo < b.lo;
    let hi_first = match (hi_in_a, lo_in_a) {
        (true, false) => true,
        (false, true) => false,
        (true, true) => a.hi_first,
        (false, false) => b.hi_first,
    };
    SeriesPoint {
        lo: a.lo.min(b.lo),
        hi: a.hi.max(b.hi),
        hi_first,
        ..*b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(lo: f64, hi: f64, hi_first: bool) -> SeriesPoint {
        SeriesPoint {
            time_ns: 0,
            rss: None,
            heap: lo,
            lo,
            hi,
            hi_first,
        }
    }

    #[test]
    fn merged_points_keep_the_range_of_both_in_order() {
        // A rise in the first, a drop in the second: the high came first.
        let m = merge(&point(10.0, 50.0, false), &point(5.0, 20.0, true));
        assert_eq!((m.lo, m.hi, m.hi_first), (5.0, 50.0, true));
        let m = merge(&point(1.0, 5.0, true), &point(3.0, 90.0, false));
        assert_eq!((m.lo, m.hi, m.hi_first), (1.0, 90.0, false));
        let m = merge(&point(1.0, 95.0, true), &point(3.0, 90.0, false));
        assert!(m.hi_first);
    }
}
