//! Estimates: what one sampled block stands for, and sums of them with their standard errors.
//!
//! # Estimating bytes
//! A block of `s` bytes is sampled with probability `p = 1 − exp(−s/rate)`, so each sample stands
//! for `w = s/p` bytes and `1/p` allocations (a Horvitz–Thompson estimator, unbiased). Its
//! contribution to the variance of a sum is `(1 − p)·w²`, also unbiased; a standard error is the
//! square root of the summed contributions. With `rate <= 1` every allocation is recorded and
//! the figures are exact (`p = 1`). A zero-byte block holds no memory and stands for 0 bytes.

/// Which bytes a view counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum View {
    /// Every byte allocated during the capture, freed or not.
    Allocated,
    /// Bytes still live when the capture ended (also `leaks`).
    #[value(alias = "leaks")]
    Live,
    /// Bytes live at the moment the whole live heap was highest.
    Peak,
}

impl View {
    /// All views, in the order reports list them.
    pub const ALL: [View; 3] = [View::Allocated, View::Live, View::Peak];

    /// The name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            View::Allocated => "allocated",
            View::Live => "live",
            View::Peak => "peak",
        }
    }
}

/// An estimate of bytes (and allocations) from a set of samples.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Estimate {
    /// Estimated bytes.
    pub bytes: f64,
    /// Estimated number of allocations.
    pub count: f64,
    /// Estimated variance of `bytes`.
    pub variance: f64,
    /// How many samples the estimate rests on.
    pub samples: u64,
}

impl Estimate {
    /// Standard error of `bytes`.
    pub fn stderr(&self) -> f64 {
        self.variance.sqrt()
    }

    /// Counts one more sample.
    #[inline(always)]
    pub(crate) fn add(&mut self, s: &Sample) {
        self.bytes += s.bytes;
        self.count += s.count;
        self.variance += s.variance;
        self.samples += 1;
    }

    /// Takes back a sample counted before (a live block that was freed). The sums are exactly
    /// zero again once the last sample is gone, so no rounding residue is left behind.
    #[inline(always)]
    pub(crate) fn remove(&mut self, s: &Sample) {
        self.samples = self.samples.saturating_sub(1);
        if self.samples == 0 {
            *self = Estimate::default();
            return;
        }
        self.bytes -= s.bytes;
        self.count -= s.count;
        self.variance -= s.variance;
    }

    /// Adds another estimate (of disjoint samples) to this one.
    pub fn merge(&mut self, other: &Estimate) {
        self.bytes += other.bytes;
        self.count += other.count;
        self.variance += other.variance;
        self.samples += other.samples;
    }
}

/// The figures of one stack, one estimate per view.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Figures {
    pub allocated: Estimate,
    pub live: Estimate,
    pub peak: Estimate,
}

impl Figures {
    /// The estimate for one view.
    pub fn get(&self, view: View) -> &Estimate {
        match view {
            View::Allocated => &self.allocated,
            View::Live => &self.live,
            View::Peak => &self.peak,
        }
    }

    /// Whether any view rests on a sample. (In a capture, a live block was allocated during
    /// it; in interval profiles, blocks live at the end of a range may have been allocated
    /// before it.)
    pub fn sampled(&self) -> bool {
        self.allocated.samples > 0 || self.live.samples > 0 || self.peak.samples > 0
    }

    /// Adds another set of figures (of disjoint samples) to this one.
    pub fn merge(&mut self, other: &Figures) {
        self.allocated.merge(&other.allocated);
        self.live.merge(&other.live);
        self.peak.merge(&other.peak);
    }
}

/// What one sample stands for (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    pub(crate) bytes: f64,
    pub(crate) count: f64,
    pub(crate) variance: f64,
}

impl Sample {
    /// The bytes the sample stands for.
    pub fn bytes(&self) -> f64 {
        self.bytes
    }

    /// What a sample that stands for `weight` blocks like its own says of `bytes` measured
    /// for its block alone (the resident part of a sampled mapping).
    pub fn scaled(bytes: f64, weight: f64) -> Sample {
        Sample {
            bytes: bytes * weight,
            count: weight,
            // As for a block's own bytes: a block taken with chance 1/weight stands for
            // weight times itself, a variance of (weight - 1) times its square.
            variance: bytes * bytes * (weight - 1.0).max(0.0),
        }
    }

    /// The sample of a block of `size` bytes taken at mean distance `rate`.
    pub fn new(size: u64, rate: u64) -> Sample {
        if size == 0 {
            return Sample {
                bytes: 0.0,
                count: 1.0,
                variance: 0.0,
            };
        }
        if rate <= 1 {
            return Sample {
                bytes: size as f64,
                count: 1.0,
                variance: 0.0,
            };
        }
        let s = size as f64;
        let x = s / rate as f64;
        let p = -(-x).exp_m1();
        let w = s / p;
        Sample {
            bytes: w,
            count: 1.0 / p,
            variance: (-x).exp() * w * w,
        }
    }
}
