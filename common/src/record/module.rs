//! The MODULE record (kind 9): one loaded object of the target (an executable or a shared
//! library) and where its code is mapped, so that native return addresses can be symbolized
//! after the process is gone. mprof writes it from `/proc/PID/maps` when a sample first shows
//! an address in a mapping it has not described yet, and again when the mapping changes.
//!
//! ```text
//!  0            8              16          20          22           24          26    32
//!  +------------+--------------+-----------+-----------+------------+-----------+-----+
//!  | bias u64   | file_size u64| flags u32 | nranges   | build_id   | path_len  | pad |
//!  |            |              |           | u16       | _len u16   | u16       |     |
//!  +------------+--------------+-----------+-----------+------------+-----------+-----+
//!  | ranges: nranges × (start u64, end u64, file offset u64)                           |
//!  +-----------------------------------------------------------------------------------+
//!  | build id bytes (build_id_len) | path bytes (path_len, UTF-8 as the kernel shows it) |
//!  +-----------------------------------------------------------------------------------+
//! ```
//! `bias` is what is added to an address of the file (an ELF virtual address) to get the
//! address in the process. The ranges are the executable mappings of the file; a later MODULE
//! record whose ranges overlap an earlier one's replaces it (the object was unloaded and
//! another one loaded there). Everything in it came from the target: readers bound it
//! ([`MAX_RANGES`], [`MAX_BUILD_ID`], [`MAX_PATH`]) and never trust the path to name the file
//! that was mapped (the build id and size say whether it still is).

/// Size of the fixed part of a MODULE body.
pub const MODULE_FIXED: usize = 32;
/// Size of one range in a MODULE body.
pub const RANGE_SIZE: usize = 24;
/// Most ranges a MODULE record carries.
pub const MAX_RANGES: usize = 64;
/// Longest build id kept, in bytes (GNU build ids are 20).
pub const MAX_BUILD_ID: usize = 64;
/// Longest path kept, in bytes (the kernel's PATH_MAX).
pub const MAX_PATH: usize = 4096;

/// MODULE flag: the object is the process's main executable.
pub const MODULE_MAIN: u32 = 1;
/// MODULE flag: `bias` was computed from the file's program headers (otherwise it is the
/// address of the file's first mapping, which is right for usual shared libraries).
pub const MODULE_BIAS_FROM_ELF: u32 = 2;
/// MODULE flag: the file had been deleted (or replaced) when mprof read the map.
pub const MODULE_DELETED: u32 = 4;

/// One executable mapping of a module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModuleRange {
    pub start: u64,
    pub end: u64,
    /// The file offset mapped at `start`.
    pub offset: u64,
}

/// A loaded object, as a MODULE record describes it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Module {
    /// Address in the process minus ELF virtual address.
    pub bias: u64,
    /// The file's size when mprof read it (0 when it could not be read).
    pub file_size: u64,
    /// `MODULE_*` flags.
    pub flags: u32,
    /// The GNU build id, empty when the file has none or could not be read.
    pub build_id: Vec<u8>,
    /// The path as `/proc/PID/maps` shows it, without a ` (deleted)` suffix.
    pub path: String,
    /// The executable mappings, in address order.
    pub ranges: Vec<ModuleRange>,
}

fn u16_at(b: &[u8], at: usize) -> usize {
    u16::from_le_bytes([b[at], b[at + 1]]) as usize
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

impl Module {
    /// Whether `flag` (a `MODULE_*` constant) is set.
    pub fn has(&self, flag: u32) -> bool {
        self.flags & flag != 0
    }

    /// Appends the body (see the module docs); fields beyond the bounds are cut.
    pub fn encode(&self, body: &mut Vec<u8>) {
        let ranges = &self.ranges[..self.ranges.len().min(MAX_RANGES)];
        let id = &self.build_id[..self.build_id.len().min(MAX_BUILD_ID)];
        let path = &self.path.as_bytes()[..self.path.len().min(MAX_PATH)];
        body.extend_from_slice(&self.bias.to_le_bytes());
        body.extend_from_slice(&self.file_size.to_le_bytes());
        body.extend_from_slice(&self.flags.to_le_bytes());
        body.extend_from_slice(&(ranges.len() as u16).to_le_bytes());
        body.extend_from_slice(&(id.len() as u16).to_le_bytes());
        body.extend_from_slice(&(path.len() as u16).to_le_bytes());
        body.extend_from_slice(&[0u8; 6]);
        for r in ranges {
            body.extend_from_slice(&r.start.to_le_bytes());
            body.extend_from_slice(&r.end.to_le_bytes());
            body.extend_from_slice(&r.offset.to_le_bytes());
        }
        body.extend_from_slice(id);
        body.extend_from_slice(path);
    }

    /// Decodes a body; lengths beyond the bounds or the body are an error.
    pub fn decode(body: &[u8]) -> Result<Module, String> {
        if body.len() < MODULE_FIXED {
            return Err(format!("module record of {} bytes", body.len()));
        }
        let (nranges, idlen, plen) = (u16_at(body, 20), u16_at(body, 22), u16_at(body, 24));
        if nranges > MAX_RANGES || idlen > MAX_BUILD_ID || plen > MAX_PATH {
            return Err(format!(
                "module record with {nranges} ranges, a {idlen}-byte build id, a \
                 {plen}-byte path"
            ));
        }
        let ids_at = MODULE_FIXED + nranges * RANGE_SIZE;
        if body.len() < ids_at + idlen + plen {
            return Err(format!("module record of {} bytes is short", body.len()));
        }
        let ranges = (0..nranges)
            .map(|i| {
                let at = MODULE_FIXED + i * RANGE_SIZE;
                ModuleRange {
                    start: u64_at(body, at),
                    end: u64_at(body, at + 8),
                    offset: u64_at(body, at + 16),
                }
            })
            .collect();
        let path = &body[ids_at + idlen..ids_at + idlen + plen];
        Ok(Module {
            bias: u64_at(body, 0),
            file_size: u64_at(body, 8),
            flags: u32::from_le_bytes(body[16..20].try_into().unwrap()),
            build_id: body[ids_at..ids_at + idlen].to_vec(),
            path: String::from_utf8_lossy(path).into_owned(),
            ranges,
        })
    }

    /// The build id in hex, as `file` and `readelf -n` show it.
    pub fn build_id_hex(&self) -> String {
        self.build_id.iter().map(|b| format!("{b:02x}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Module {
        Module {
            bias: 0x7f00_0000_0000,
            file_size: 12345,
            flags: MODULE_BIAS_FROM_ELF,
            build_id: vec![0xab; 20],
            path: "/usr/lib/libz.so.1".into(),
            ranges: vec![ModuleRange {
                start: 0x7f00_0000_2000,
                end: 0x7f00_0001_0000,
                offset: 0x2000,
            }],
        }
    }

    #[test]
    fn lies_and_short_bodies_are_errors_not_panics() {
        let mut body = Vec::new();
        sample().encode(&mut body);
        assert_eq!(Module::decode(&body).unwrap(), sample());
        for cut in 0..body.len() {
            assert!(Module::decode(&body[..cut]).is_err(), "cut {cut}");
        }
        let mut lying = body.clone();
        lying[20..22].copy_from_slice(&1000u16.to_le_bytes());
        assert!(Module::decode(&lying).is_err());
        assert_eq!(sample().build_id_hex(), "ab".repeat(20));
    }

    #[test]
    fn oversized_fields_are_cut_when_written() {
        let mut big = sample();
        big.ranges = vec![big.ranges[0]; 100];
        big.path = "x".repeat(5000);
        let mut body = Vec::new();
        big.encode(&mut body);
        let back = Module::decode(&body).unwrap();
        assert_eq!(back.ranges.len(), MAX_RANGES);
        assert_eq!(back.path.len(), MAX_PATH);
    }
}
