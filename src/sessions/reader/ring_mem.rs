//! The ring's memory on the CLI's side: how big to make it (the sampling rate, the target's
//! address-space limit), the sealed memory file it lives in, and its mapping here.

use super::*;

/// Largest ring data area: at `--rate 1` it rides out the reader's stalls (a slow disk). It
/// costs memory only while full, because the reader gives drained pages back
/// (`RingMem::release`), but its mapping counts against the target's address-space limit.
const MAX_RING: usize = 256 << 20;
/// Smallest ring mprof makes.
const MIN_RING: usize = 1 << 20;
/// Address space mprof adds to a target besides the ring: the agent image and its data, the
/// trampoline region.
const AGENT_SPACE: u64 = 16 << 20;

/// The data size of the ring for sampling at `rate` in a process that has `headroom` bytes of
/// address space left under its limit (`None`: no limit): big enough for the sample rate
/// (samples of `--rate 1` arrive a thousand times faster than at the default rate), and at most
/// a quarter of the headroom.
pub fn ring_data_size(rate: u64, headroom: Option<u64>) -> Result<usize, String> {
    let wanted = match rate {
        0..=4096 => MAX_RING,
        4097..=16384 => 64 << 20,
        _ => 16 << 20,
    };
    let Some(headroom) = headroom else {
        return Ok(wanted);
    };
    let allowed = headroom.saturating_sub(AGENT_SPACE) / 4;
    if allowed < MIN_RING as u64 {
        return Err(format!(
            "only {} MiB of address space are left under its limit (ulimit -v), too little for \
             mprof's agent and ring (at least {} MiB)",
            headroom >> 20,
            (AGENT_SPACE + 4 * MIN_RING as u64) >> 20
        ));
    }
    let fit = 1usize << (63 - allowed.leading_zeros());
    Ok(wanted.min(fit))
}

/// Address space `pid` has left under its `RLIMIT_AS` (`None`: unlimited or unknown).
pub fn address_space_headroom(pid: u32) -> Option<u64> {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))?;
    let soft: u64 = line["Max address space".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let size_kb: u64 = status
        .lines()
        .find(|l| l.starts_with("VmSize:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(soft.saturating_sub(size_kb * 1024))
}

/// For `record`: the headroom to size the ring by when the child inherits an `RLIMIT_AS` from
/// mprof. The program needs most of its limit, so only half of it counts (the ring then takes
/// at most an eighth).
pub fn inherited_headroom() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into `lim`, a live local.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) } != 0
        || lim.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    Some(lim.rlim_cur / 2)
}

/// A ring in an anonymous memory file, mapped here. Everything in it is written by the target
/// too, which may be hostile: the ring is read only through [`RingReader`], which trusts
/// nothing in it, and the memory file is sealed against resizing, so the target cannot make
/// this mapping fault (SIGBUS) by truncating it.
pub struct RingMem {
    fd: OwnedFd,
    base: *mut u8,
    len: usize,
    reader: RingReader,
}

/// The seals that keep the ring's size fixed.
const SIZE_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;

/// Why the ring could not be set up in its memory file.
#[derive(Debug)]
pub enum RingSetupError {
    /// A system call on the memory file failed.
    Io(&'static str, std::io::Error),
    /// The memory file is not the size it was just given (someone else resized it).
    Resized { expected: u64, found: u64 },
    /// The seals that fix the size are not in place.
    Unsealed(libc::c_int),
}

impl std::fmt::Display for RingSetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RingSetupError::Io(what, e) => write!(f, "{what}: {e}"),
            RingSetupError::Resized { expected, found } => write!(
                f,
                "the ring's memory file is {found} bytes instead of {expected}: \
                 the target resized it"
            ),
            RingSetupError::Unsealed(seals) => write!(
                f,
                "the ring's memory file is not sealed against resizing (seals {seals:#x})"
            ),
        }
    }
}

impl std::error::Error for RingSetupError {}

fn last_os(what: &'static str) -> RingSetupError {
    RingSetupError::Io(what, std::io::Error::last_os_error())
}

/// Sizes the memory file `fd` to `len` bytes and seals its size; checks the result, as the
/// target may hold the same file and race us.
fn size_and_seal(fd: &OwnedFd, len: usize) -> Result<(), RingSetupError> {
    let raw = fd.as_raw_fd();
    // SAFETY: `raw` is the descriptor `fd` owns, open for the call; ftruncate and fcntl take
    // only integers and touch no memory of ours.
    if unsafe { libc::ftruncate(raw, len as libc::off_t) } != 0 {
        return Err(last_os("sizing the ring"));
    }
    // SAFETY: as above; F_ADD_SEALS takes an int argument.
    if unsafe { libc::fcntl(raw, libc::F_ADD_SEALS, SIZE_SEALS) } != 0 {
        return Err(last_os("sealing the ring's size"));
    }
    check_sealed(fd, len)
}

/// Checks that the memory file `fd` is `len` bytes and sealed against resizing, so that its
/// mapping cannot fault under mprof.
fn check_sealed(fd: &OwnedFd, len: usize) -> Result<(), RingSetupError> {
    let raw = fd.as_raw_fd();
    // SAFETY: `raw` is the descriptor `fd` owns, open for the call; F_GET_SEALS takes no
    // argument and touches no memory of ours.
    let seals = unsafe { libc::fcntl(raw, libc::F_GET_SEALS) };
    if seals < 0 {
        return Err(last_os("reading the ring's seals"));
    }
    if seals & SIZE_SEALS != SIZE_SEALS {
        return Err(RingSetupError::Unsealed(seals));
    }
    // SAFETY: libc::stat is a C struct of integers only; all zeroes is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `raw` is open (owned by `fd`) and fstat fills `st`, a live local.
    if unsafe { libc::fstat(raw, &mut st) } != 0 {
        return Err(last_os("fstat on the ring"));
    }
    if st.st_size as u64 != len as u64 {
        return Err(RingSetupError::Resized {
            expected: len as u64,
            found: st.st_size as u64,
        });
    }
    Ok(())
}

impl RingMem {
    /// Makes a ring configured for `sampling`. The memory file is inheritable (no CLOEXEC) when
    /// `inheritable` is set, so that a child can map it.
    pub fn create(sampling: &SamplingArgs, inheritable: bool, data_size: usize) -> Result<RingMem> {
        let mut flags = libc::MFD_ALLOW_SEALING;
        if !inheritable {
            flags |= libc::MFD_CLOEXEC;
        }
        // SAFETY: the name is a NUL-ended static string; the flags are plain integers.
        let fd = unsafe { libc::memfd_create(c"mprof-ring".as_ptr(), flags) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("memfd_create for the ring");
        }
        // SAFETY: memfd_create just returned `fd`, open and owned by nothing else.
        RingMem::from_fd(unsafe { OwnedFd::from_raw_fd(fd) }, sampling, data_size)
    }

    /// Makes a ring in the memory file `fd` (for attach: the target's own memfd, made with
    /// `MFD_ALLOW_SEALING`): sizes and seals it, maps it and writes a fresh header.
    pub fn from_fd(fd: OwnedFd, sampling: &SamplingArgs, data_size: usize) -> Result<RingMem> {
        let len = ring::region_size(data_size);
        size_and_seal(&fd, len).context("cannot set up the ring")?;
        let ring = RingMem::map(fd, data_size)?;
        // SAFETY: our own fresh mapping of `len` bytes, zeroed by ftruncate.
        unsafe {
            Ring::init(
                ring.base,
                data_size,
                sampling.rate,
                sampling.seed,
                sampling.max_depth,
                sampling.config_flags(),
            )
        };
        Ok(ring)
    }

    /// The ring a followed child made itself and handed over: sealed against resizing (so its
    /// size, read once, is the size for good) with a power-of-two data area no larger than
    /// mprof makes, of this mprof's format; mapped, never re-initialised (the child writes into
    /// it already).
    pub fn from_child(fd: OwnedFd) -> Result<RingMem> {
        // SAFETY: libc::stat is a C struct of integers only; all zeroes is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open for the call (we own it) and fstat fills `st`, a live local.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(std::io::Error::last_os_error()).context("a child's ring");
        }
        let data_size = (st.st_size as u64).saturating_sub(ring::HEADER_SIZE as u64) as usize;
        if !data_size.is_power_of_two() || !(4096..=MAX_RING).contains(&data_size) {
            anyhow::bail!(
                "a child's ring has an impossible size ({} bytes)",
                st.st_size
            );
        }
        check_sealed(&fd, ring::region_size(data_size)).context("a child's ring")?;
        let ring = RingMem::map(fd, data_size)?;
        // Made by the child's agent, which could be another mprof's: never read as ours.
        ring.reader
            .check_format()
            .map_err(|e| anyhow::anyhow!("a child's ring: {e}"))?;
        Ok(ring)
    }

    fn map(fd: OwnedFd, data_size: usize) -> Result<RingMem> {
        let len = ring::region_size(data_size);
        // SAFETY: a shared mapping of a memory file sealed at `len` bytes; failure is checked.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mapping the ring");
        }
        let base = base as *mut u8;
        // SAFETY: the mapping just made, kept as long as the RingMem.
        let reader = unsafe { RingReader::new(base, data_size) };
        Ok(RingMem {
            fd,
            base,
            len,
            reader,
        })
    }

    /// Writes where followed children hand their rings (see `crate::sessions::children`) into
    /// the header, before the agent starts.
    pub fn set_rendezvous(&self, name: &str) {
        let bytes = name.as_bytes();
        assert!(bytes.len() < 64);
        let h = self.base as *mut ring::RingHeader;
        // SAFETY: the header is ours to write before the program starts; raw writes, since the
        // target may map this memory too.
        unsafe {
            let dst = std::ptr::addr_of_mut!((*h).rendezvous) as *mut u8;
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len());
            *dst.add(bytes.len()) = 0;
        }
    }

    /// Size of the ring's data area.
    pub fn data_size(&self) -> usize {
        self.len - ring::HEADER_SIZE
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Gives the whole pages of a drained run of records (ring positions `from..to`) back to
    /// the kernel, so the ring's memory, shared with the target, stays resident only while it
    /// holds data; except the short laps' window, which the agent writes again at once (see
    /// `mprof_common::ring`). Called before the range is handed back to the producers, so
    /// nothing written after it is lost; the next write there faults in a fresh zero page.
    pub fn release(&self, from: u64, to: u64) {
        let size = self.data_size() as u64;
        let keep = ring::window(self.data_size()) as u64;
        ring_reader::pages_to_give_back(size, keep, 4096, from, to, |offset, len| {
            // SAFETY: `self.fd` is the ring's memory file, open as long as `self`; the hole
            // lies in the data area (`offset + len <= size`), in records the reader consumed,
            // and the pages stay mapped (reading them gives zeroes). Failure only keeps them
            // resident.
            unsafe {
                libc::fallocate(
                    self.fd.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    (ring::HEADER_SIZE as u64 + offset) as libc::off_t,
                    len as libc::off_t,
                );
            }
        });
    }

    /// The reader's view of the ring.
    pub fn reader(&self) -> &RingReader {
        &self.reader
    }

    /// The ring's state (see `mprof_common::ring`); an impossible value is an error that ends
    /// the session.
    pub fn state(&self) -> Result<u32> {
        self.reader
            .state()
            .map_err(|e| anyhow::anyhow!("the target damaged the ring: {e}"))
    }

    /// Tells the agent the reader is alive.
    pub fn heartbeat(&self) {
        self.reader.heartbeat(monotonic_ns());
    }

    /// The agent's message, if it wrote one (control characters escaped).
    pub fn message(&self) -> String {
        crate::base::text::printable(&self.reader.message()).into_owned()
    }

    /// The interpreter's version string as the agent read it (control characters escaped,
    /// so it cannot add lines to the capture's metadata).
    pub fn python_version(&self) -> String {
        crate::base::text::printable(&self.reader.python_version()).into_owned()
    }

    /// Processes the program forked that were not followed, as its children counted them.
    pub fn forked_unfollowed(&self) -> u32 {
        self.reader.forked_unfollowed()
    }

    /// Records the agent has dropped so far because the ring was full.
    pub fn dropped(&self) -> u64 {
        self.reader.dropped()
    }

    /// How full the ring is: 0 when the reader has taken everything, 1 when the agent drops.
    pub fn fill(&self) -> f64 {
        self.reader.fill()
    }
}

impl Drop for RingMem {
    fn drop(&mut self) {
        // SAFETY: `base..base + len` is the mapping `map` made, unmapped only here, once. The
        // reader holds the only other pointers into it, and it is dropped with `self`; nothing
        // borrowed from `self` outlives this drop.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}
