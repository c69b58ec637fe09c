//! `mprof diff BASE NEW`: per site the change in estimated bytes between two captures, with
//! the standard error of the change, largest growth first.
//!
//! The two captures are independent samplings, so the variance of a change is the sum of the
//! two variances: `σ = √(σ_base² + σ_new²)`. A change within 2σ of zero is marked as noise: at
//! that size, sampling alone would produce it about one time in twenty.
//!
//! A side's variance is estimated from its samples, which says nothing when it has few or
//! none: a site that happened to get no sample in a sampled capture reads 0 ± 0, and beside an
//! exact capture (`--rate 1`) of the same program its whole size read as a real change. So the
//! variance of a sampled side with fewer than [`FLOOR_SAMPLES`] samples at a site is at least
//! what it would be if the site held, on both sides, the bytes the two sides hold on average
//! (the question the test asks: could there be no change at all?), in blocks of their average
//! size: `B·s/(e^(s/rate) − 1)`, the variance of the estimate of `B` bytes in blocks of `s`
//! bytes (at most `B·rate`, for small blocks). A side with more samples keeps its own
//! variance: the average block size of a site that mixes many small blocks with a few large
//! ones (a whole program's total) overstates the variance many times (a total of ± 1.5 MiB
//! against an exact capture read ± 3.9 MiB), and an exact side has none. The output says
//! which changes the floor raised (`[floor]`).

use crate::analysis::estimate::Estimate;
use crate::analysis::grouping::Grouping;
use crate::analysis::profile::{Lens, Profile, View};
use crate::analysis::sites::{rows, whole};
use crate::base::text::printable;
use crate::base::units::human_bytes;
use crate::views::about::{header_lines, plus_minus, view_title};
use crate::views::formats::write_stdout;
use anyhow::Result;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// How many standard errors a change must exceed not to be noise.
pub const NOISE_SIGMAS: f64 = 2.0;

/// A sampled side with fewer samples than this at a site has its variance raised to the
/// floor (see the module's doc); with more, its own estimate stands.
pub const FLOOR_SAMPLES: u64 = 10;

/// One site in both captures.
#[derive(Clone, Debug)]
pub struct Change {
    /// The site, as the text report labels it.
    pub label: String,
    pub base: Estimate,
    pub new: Estimate,
    /// The sampling rates of the two captures (0: every allocation recorded).
    pub rates: (f64, f64),
}

impl Change {
    fn new(label: String, base: Estimate, new: Estimate, rates: (f64, f64)) -> Change {
        Change {
            label,
            base,
            new,
            rates,
        }
    }

    /// New bytes minus base bytes.
    pub fn bytes(&self) -> f64 {
        self.new.bytes - self.base.bytes
    }

    /// The standard error of the change: `√(σ_base² + σ_new²)`, a side's variance raised to
    /// the floor when it has few samples (see the module's doc).
    pub fn stderr(&self) -> f64 {
        let (base, _) = self.side_variance(&self.base, self.rates.0);
        let (new, _) = self.side_variance(&self.new, self.rates.1);
        (base + new).sqrt()
    }

    /// Whether the floor raised either side's variance.
    pub fn floored(&self) -> bool {
        self.side_variance(&self.base, self.rates.0).1
            || self.side_variance(&self.new, self.rates.1).1
    }

    /// A side's variance in the change, and whether the floor raised it.
    fn side_variance(&self, side: &Estimate, rate: f64) -> (f64, bool) {
        if side.samples >= FLOOR_SAMPLES {
            return (side.variance, false);
        }
        let bytes = (self.base.bytes + self.new.bytes) / 2.0;
        let count = (self.base.count + self.new.count) / 2.0;
        let floor = no_change_variance(rate, bytes, count);
        match floor > side.variance {
            true => (floor, true),
            false => (side.variance, false),
        }
    }

    /// Whether the change is within [`NOISE_SIGMAS`] standard errors of zero.
    pub fn is_noise(&self) -> bool {
        self.bytes().abs() <= NOISE_SIGMAS * self.stderr()
    }
}

/// The variance of a capture's estimate of `bytes` bytes in `count` blocks sampled at `rate`
/// (0: recorded exactly): `bytes·s/(e^(s/rate) − 1)` for blocks of `s = bytes/count` bytes.
fn no_change_variance(rate: f64, bytes: f64, count: f64) -> f64 {
    if rate <= 1.0 || bytes <= 0.0 || count <= 0.0 {
        return 0.0;
    }
    let block = bytes / count;
    bytes * block / (block / rate).exp_m1()
}

/// The sampling rate of a capture as [`Change::rates`] takes it.
fn rate_of(p: &Profile) -> f64 {
    if p.rate > 1 {
        p.rate as f64
    } else {
        0.0
    }
}

/// The change of the whole view.
fn total(base: &Profile, new: &Profile, view: View, label: &str) -> Change {
    Change::new(
        label.into(),
        *base.totals().get(view),
        *new.totals().get(view),
        (rate_of(base), rate_of(new)),
    )
}

/// Every site of either capture, largest growth first (ties by label).
pub fn changes(base: &Profile, new: &Profile, view: View, by: Grouping) -> Vec<Change> {
    let mut sites: BTreeMap<String, Change> = BTreeMap::new();
    let rates = (rate_of(base), rate_of(new));
    for (p, is_new) in [(base, false), (new, true)] {
        for row in rows(p, view, by) {
            let entry = sites.entry(row.key()).or_insert_with(|| {
                Change::new(
                    printable(&row.label_in(p)).into_owned(),
                    Estimate::default(),
                    Estimate::default(),
                    rates,
                )
            });
            // By stack, the same frames can be a row per allocator: they add up.
            let e = row.figures.get(view);
            if is_new {
                entry.new.merge(e);
            } else {
                entry.base.merge(e);
            }
        }
    }
    let mut out: Vec<Change> = sites.into_values().collect();
    out.sort_by(|a, b| {
        b.bytes()
            .round()
            .total_cmp(&a.bytes().round())
            .then_with(|| a.label.cmp(&b.label))
    });
    out
}

/// `+1.50 MiB` / `-512 B`.
fn signed(bytes: f64) -> String {
    if bytes >= 0.0 {
        format!("+{}", human_bytes(bytes))
    } else {
        human_bytes(bytes)
    }
}

/// The text of a diff.
pub fn text(base: &Profile, new: &Profile, view: View, by: Grouping, top: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "mprof diff: {}, by {}", view_title(view), by.title());
    for (name, p) in [("base", base), ("new", new)] {
        for line in header_lines(p) {
            let _ = writeln!(out, "{name}: {line}");
        }
    }
    let total = total(base, new, view, "");
    let _ = writeln!(
        out,
        "total {}: {} → {}, change {} ± {}{}",
        view.name(),
        plus_minus(total.base.bytes, total.base.stderr()),
        plus_minus(total.new.bytes, total.new.stderr()),
        signed(total.bytes()),
        human_bytes(total.stderr()),
        marks(&total, " (", ")")
    );
    out.push('\n');
    let all = changes(base, new, view, by);
    let shown: Vec<&Change> = all.iter().filter(|c| whole(c.bytes().abs()) > 0).collect();
    if shown.is_empty() {
        let _ = writeln!(out, "no change in this view");
        return out;
    }
    let limit = if top == 0 { shown.len() } else { top };
    let _ = writeln!(
        out,
        "{:>12} {:>11} {:>11} {:>11} {:>15}  location",
        "change", "± stderr", "base", "new", "samples"
    );
    for c in shown.iter().take(limit) {
        let _ = writeln!(
            out,
            "{:>12} {:>11} {:>11} {:>11} {:>15}  {}{}",
            signed(c.bytes()),
            human_bytes(c.stderr()),
            human_bytes(c.base.bytes),
            human_bytes(c.new.bytes),
            format!("{} → {}", c.base.samples, c.new.samples),
            c.label,
            marks(c, "  [", "]")
        );
    }
    if shown.len() > limit {
        let _ = writeln!(
            out,
            "... {} more sites (--top 0 shows all)",
            shown.len() - limit
        );
    }
    let _ = writeln!(
        out,
        "[noise]: the change is within {NOISE_SIGMAS} standard errors of zero"
    );
    out.push_str(&error_note());
    out
}

/// Where the error of a change comes from, under every text diff.
pub fn error_note() -> String {
    format!(
        "± stderr of a change: √(base² + new²) of the two sides' own standard errors (a \
         --rate 1 side has none); [floor]: a sampled side with fewer than {FLOOR_SAMPLES} \
         samples there counts at least the error of the two sides' average bytes sampled at \
         its rate, so that a site it missed is not a change by itself\n"
    )
}

/// `[noise]`, `[floor]`, both (`[noise, floor]`) or nothing, between `open` and `close`.
fn marks(c: &Change, open: &str, close: &str) -> String {
    let marks: Vec<&str> = [(c.is_noise(), "noise"), (c.floored(), "floor")]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect();
    match marks.is_empty() {
        true => String::new(),
        false => format!("{open}{}{close}", marks.join(", ")),
    }
}

#[derive(Serialize)]
struct JsonDiff {
    view: &'static str,
    by: &'static str,
    allocators: Vec<&'static str>,
    noise_sigmas: f64,
    total: JsonChange,
    sites: Vec<JsonChange>,
}

#[derive(Serialize)]
struct JsonChange {
    label: String,
    base_bytes: u64,
    base_stderr: u64,
    base_samples: u64,
    new_bytes: u64,
    new_stderr: u64,
    new_samples: u64,
    change_bytes: i64,
    change_stderr: u64,
    noise: bool,
    /// Whether a side with few samples had its error raised to the floor.
    floor: bool,
}

impl From<&Change> for JsonChange {
    fn from(c: &Change) -> JsonChange {
        JsonChange {
            label: c.label.clone(),
            base_bytes: whole(c.base.bytes),
            base_stderr: whole(c.base.stderr()),
            base_samples: c.base.samples,
            new_bytes: whole(c.new.bytes),
            new_stderr: whole(c.new.stderr()),
            new_samples: c.new.samples,
            change_bytes: c.bytes().round() as i64,
            change_stderr: whole(c.stderr()),
            noise: c.is_noise(),
            floor: c.floored(),
        }
    }
}

/// The JSON of a diff.
pub fn json(base: &Profile, new: &Profile, view: View, by: Grouping, top: usize) -> Result<String> {
    let all = changes(base, new, view, by);
    let limit = if top == 0 { all.len() } else { top };
    let total = total(base, new, view, "total");
    let doc = JsonDiff {
        view: view.name(),
        by: by.name(),
        allocators: new.selection().iter().map(|a| a.name()).collect(),
        noise_sigmas: NOISE_SIGMAS,
        total: (&total).into(),
        sites: all.iter().take(limit).map(JsonChange::from).collect(),
    };
    let mut s = serde_json::to_string_pretty(&doc)?;
    s.push('\n');
    Ok(s)
}

/// `mprof diff`: prints the diff of two captures, read through `lens` (the files that count
/// as your code, the allocators kept, the processes of NEW shown) and `base_pick` (the
/// processes of BASE shown).
pub fn run(
    (base, base_pick): (&Path, crate::capture::processes::Pick),
    new: &Path,
    view: View,
    by: Grouping,
    top: usize,
    as_json: bool,
    lens: &Lens,
) -> Result<()> {
    let b = Profile::load_with(
        base,
        &Lens {
            pick: base_pick,
            ..*lens
        },
    )?;
    let n = Profile::load_with(new, lens)?;
    let out = if as_json {
        json(&b, &n, view, by, top)?
    } else {
        text(&b, &n, view, by, top)
    };
    write_stdout(out.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::testing::{alloc, code, meta};

    fn profile(rate: u64, sizes: &[(u32, u64)]) -> Profile {
        let mut records = vec![meta(&format!("rate={rate}")), code(1, "a.py", "f", 1)];
        for (i, &(line, size)) in sizes.iter().enumerate() {
            records.push(alloc(1, i as u64 + 1, size, i as u64, &[(1, line)]));
        }
        Profile::from_records(&records)
    }

    #[test]
    fn changes_are_sorted_by_growth_with_combined_errors() {
        let base = profile(1, &[(2, 100), (3, 500)]);
        let new = profile(1, &[(2, 400), (3, 200), (4, 50)]);
        let c = changes(&base, &new, View::Live, Grouping::Line);
        let got: Vec<_> = c.iter().map(|c| (c.label.as_str(), c.bytes())).collect();
        assert_eq!(
            got,
            [
                ("f (a.py:2)", 300.0),
                ("f (a.py:4)", 50.0),
                ("f (a.py:3)", -300.0)
            ]
        );
        assert!(c.iter().all(|c| c.stderr() == 0.0 && !c.is_noise()));
    }

    #[test]
    fn a_change_within_two_sigma_is_noise() {
        // One sample of 1000 B at rate 4096 in each: same estimate, large error.
        let base = profile(4096, &[(2, 1000)]);
        let new = profile(4096, &[(2, 1000), (2, 1000)]);
        let c = &changes(&base, &new, View::Allocated, Grouping::Line)[0];
        let one = crate::analysis::estimate::Sample::new(1000, 4096);
        assert!((c.bytes() - one.bytes()).abs() < 1e-6);
        // Each sample's variance; the base's one sample is raised to what 1.5 samples' worth
        // of 1000-byte blocks would have (the two sides' average), the new side keeps its own.
        let v = (-1000.0f64 / 4096.0).exp() * one.bytes().powi(2);
        let floor = 1.5 * one.bytes() * 1000.0 / (1000.0f64 / 4096.0).exp_m1();
        assert!(v < floor && floor < 2.0 * v);
        assert!((c.stderr() - (floor + 2.0 * v).sqrt()).abs() < 1e-6);
        assert!(c.is_noise());
        let t = text(&base, &new, View::Allocated, Grouping::Line, 0);
        assert!(t.contains("[noise]"), "{t}");
    }

    /// A site the sampled base happened not to sample, beside an exact capture of the same
    /// program: 0 ± 0 against its real size, which read as a real change before.
    #[test]
    fn a_site_with_no_sample_on_one_side_is_not_a_change_by_itself() {
        let base = profile(32 << 10, &[(2, 100)]);
        // 480 blocks of 100 bytes, recorded exactly: 48,000 bytes at line 3.
        let new = profile(1, &vec![(3, 100); 480]);
        let c = changes(&base, &new, View::Allocated, Grouping::Line);
        let line3 = c.iter().find(|c| c.label.contains(":3")).unwrap();
        assert_eq!((line3.base.samples, line3.new.bytes), (0, 48_000.0));
        // As if 24,000 bytes of 100-byte blocks were sampled: a standard error of about √(24,000
        // · 32 Ki) ≈ 28 KiB, so +48,000 bytes is noise.
        let want = (24_000.0f64 * 100.0 / (100.0f64 / 32768.0).exp_m1()).sqrt();
        assert!((line3.stderr() - want).abs() < 1.0, "{}", line3.stderr());
        assert!(line3.is_noise());
        // Two exact captures still differ exactly.
        let exact = profile(1, &[(3, 100)]);
        let c = changes(&exact, &new, View::Allocated, Grouping::Line);
        assert!(c[0].stderr() == 0.0 && !c[0].is_noise());
    }
}
