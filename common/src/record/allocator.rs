//! Which allocator an ALLOC record's block came from: bits 1–2 of its flags.

/// ALLOC flags: which allocator the block came from (`ALLOCATOR_MASK`, shifted by
/// `ALLOCATOR_SHIFT`, holds an [`Allocator`]).
pub const ALLOCATOR_SHIFT: u32 = 1;
pub const ALLOCATOR_MASK: u32 = 3 << ALLOCATOR_SHIFT;

/// Where an allocation was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum Allocator {
    /// CPython's allocators (PEP 445 RAW, MEM and OBJ domains).
    Python = 0,
    /// The C allocator family: `malloc`, `calloc`, `realloc`, `posix_memalign`...
    Native = 1,
    /// Anonymous memory mappings (`mmap`, `mremap`).
    Mmap = 2,
}

impl Allocator {
    /// Every allocator, in the order views list them.
    pub const ALL: [Allocator; 3] = [Allocator::Python, Allocator::Native, Allocator::Mmap];

    /// The allocator an ALLOC record's flags name (unknown values read as Python: an older
    /// writer never set these bits).
    pub fn of_flags(flags: u32) -> Allocator {
        match (flags & ALLOCATOR_MASK) >> ALLOCATOR_SHIFT {
            1 => Allocator::Native,
            2 => Allocator::Mmap,
            _ => Allocator::Python,
        }
    }

    /// The ALLOC flag bits for this allocator.
    pub fn flags(self) -> u32 {
        (self as u32) << ALLOCATOR_SHIFT
    }

    /// Its name in reports and options.
    pub fn name(self) -> &'static str {
        match self {
            Allocator::Python => "python",
            Allocator::Native => "native",
            Allocator::Mmap => "mmap",
        }
    }
}
