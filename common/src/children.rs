//! How a child process hands its ring to mprof (`record --follow-children`).
//!
//! mprof listens on an abstract Unix socket (`SOCK_SEQPACKET`) whose name it writes into the
//! ring header's `rendezvous` (forked children inherit it) and into the environment
//! (`MPROF_FOLLOW`, for Pythons started by exec with the agent preloaded). A child makes a
//! ring of its own, sealed against resizing, connects, and sends one message: a [`Hello`] and
//! the ring's descriptor (`SCM_RIGHTS`). mprof takes the sender's pid from the kernel
//! (`SO_PEERCRED`), not from the message, and accepts only descendants of the program it
//! started.
//!
//! `MPROF_FOLLOW` is `NAME;DATA_SIZE;RATE;SEED;MAX_DEPTH;CONFIG_FLAGS`.

/// Environment variable that tells an exec'd Python to follow (see the module docs).
pub const ENV_FOLLOW: &str = "MPROF_FOLLOW";

/// Magic of a [`Hello`].
pub const HELLO_MAGIC: u32 = 0x4352_504d; // "MPRC"

/// How the child came to be.
pub const BORN_FORKED: u32 = 1;
pub const BORN_EXECED: u32 = 2;

/// The message a child sends with its ring's descriptor.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hello {
    pub magic: u32,
    /// [`BORN_FORKED`] or [`BORN_EXECED`].
    pub born: u32,
    /// The parent's pid as the child saw it (`getppid`), for the record.
    pub ppid: u32,
    pub reserved: u32,
}

impl Hello {
    pub fn as_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..4].copy_from_slice(&self.magic.to_le_bytes());
        b[4..8].copy_from_slice(&self.born.to_le_bytes());
        b[8..12].copy_from_slice(&self.ppid.to_le_bytes());
        b[12..16].copy_from_slice(&self.reserved.to_le_bytes());
        b
    }

    /// Parses a message; None unless it is exactly a well-formed Hello.
    pub fn parse(b: &[u8]) -> Option<Hello> {
        if b.len() != 16 {
            return None;
        }
        let u = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let h = Hello {
            magic: u(0),
            born: u(4),
            ppid: u(8),
            reserved: u(12),
        };
        (h.magic == HELLO_MAGIC && (h.born == BORN_FORKED || h.born == BORN_EXECED)).then_some(h)
    }
}

/// The settings a child's ring is made with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChildRing {
    pub data_size: u64,
    pub rate: u64,
    pub seed: u64,
    pub max_depth: u32,
    pub config_flags: u32,
}

/// Formats `MPROF_FOLLOW`.
pub fn follow_env(name: &str, ring: &ChildRing) -> String {
    format!(
        "{name};{};{};{};{};{}",
        ring.data_size, ring.rate, ring.seed, ring.max_depth, ring.config_flags
    )
}

/// Parses `MPROF_FOLLOW` into the rendezvous name and the ring settings.
pub fn parse_follow_env(text: &str) -> Option<(&str, ChildRing)> {
    let mut it = text.split(';');
    let name = it.next().filter(|n| !n.is_empty() && n.len() < 64)?;
    let ring = ChildRing {
        data_size: it.next()?.parse().ok()?,
        rate: it.next()?.parse().ok()?,
        seed: it.next()?.parse().ok()?,
        max_depth: it.next()?.parse().ok()?,
        config_flags: it.next()?.parse().ok()?,
    };
    (it.next().is_none() && ring.data_size.is_power_of_two() && ring.data_size >= 4096)
        .then_some((name, ring))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follow_env_round_trips_and_rejects_nonsense() {
        let ring = ChildRing {
            data_size: 1 << 24,
            rate: 131072,
            seed: 7,
            max_depth: 128,
            config_flags: 1,
        };
        let text = follow_env("mprof-123-abc", &ring);
        assert_eq!(parse_follow_env(&text), Some(("mprof-123-abc", ring)));
        assert_eq!(parse_follow_env("x;3;1;1;1;1"), None, "not a power of two");
        assert_eq!(parse_follow_env(";4096;1;1;1;1"), None, "no name");
        assert_eq!(parse_follow_env("x;4096;1;1;1;1;extra"), None);
        let hello = Hello {
            magic: HELLO_MAGIC,
            born: BORN_FORKED,
            ppid: 42,
            reserved: 0,
        };
        assert_eq!(Hello::parse(&hello.as_bytes()), Some(hello));
        assert_eq!(Hello::parse(&[0; 16]), None);
    }
}
