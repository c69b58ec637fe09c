//! `mprof attach` on a processor other than x86-64: the injection (registers, the signal
//! frame, the trampoline) is written for x86-64 only, so every entry point says so. The types
//! mirror `attach.rs`; those that only a successful step creates are uninhabited.

use crate::error::AttachError;
use std::convert::Infallible;
use std::os::fd::OwnedFd;
use std::time::Duration;

fn unsupported() -> AttachError {
    AttachError::Other(format!(
        "mprof attach supports x86-64 only (this is {}); mprof record works here",
        std::env::consts::ARCH
    ))
}

/// Never made on this processor.
pub struct Injector(Infallible);

impl Injector {
    pub fn new(_pid: u32) -> Result<Injector, AttachError> {
        Err(unsupported())
    }
    pub fn for_stop(_pid: u32) -> Result<Injector, AttachError> {
        Err(unsupported())
    }
    pub fn python_version(&self) -> Option<(u8, u8)> {
        match self.0 {}
    }
    pub fn agent_loaded(&self) -> bool {
        match self.0 {}
    }
    pub fn pid(&self) -> u32 {
        match self.0 {}
    }
    pub fn liveness(&self) -> Liveness {
        match self.0 {}
    }
    pub fn prepare(
        self,
        _deadline: Duration,
        _cancelled: &dyn Fn() -> bool,
    ) -> Result<Prepared, AttachError> {
        match self.0 {}
    }
}

pub struct Prepared(Infallible);

impl Prepared {
    pub fn take_ring_fd(&mut self) -> Option<OwnedFd> {
        match self.0 {}
    }
    pub fn chosen(&self) -> (u32, Duration) {
        match self.0 {}
    }
    pub fn chosen_in_syscall(&self) -> Option<String> {
        match self.0 {}
    }
    pub fn launch(self) -> Result<Launched, AttachError> {
        match self.0 {}
    }
}

pub struct Launched(Infallible);

#[derive(Debug)]
pub struct Outcome {
    pub start_ret: i64,
}

impl Launched {
    pub fn poll(&self) -> Result<Option<Outcome>, AttachError> {
        match self.0 {}
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Liveness(Infallible);

impl Liveness {
    pub fn alive(&self) -> bool {
        match self.0 {}
    }
}
