//! DWARF call frame information, as the loader maps it (`.eh_frame_hdr` and `.eh_frame`): the
//! rules to find a frame's caller on x86-64, for the agent's own unwinder (`crate::unwind`).
//!
//! Only what compilers emit for ordinary code is followed: the canonical frame address as a
//! register plus an offset, and registers saved at an offset from it, in themselves, or in
//! another register. An expression (glibc's signal trampoline, stack realignment) ends the
//! walk there. Every read of the unwinding tables stays inside the object they belong to; the
//! tables are the loaded program's own, read in place, never copied.

use std::mem::MaybeUninit;

/// The return address column (DWARF register 16 on x86-64).
pub const RA: usize = 16;
/// The registers whose rules are kept: the general ones and the return address.
pub const REGS: usize = 17;

/// Where a register of the caller is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Not said: the same as in this frame.
    Same,
    /// Lost (the return address: the outermost frame).
    Undefined,
    /// Saved at the canonical frame address plus this.
    At(i64),
    /// The canonical frame address plus this.
    ValueAt(i64),
    /// In this other register of this frame.
    In(u16),
    /// Given by an expression: not followed.
    Unknown,
}

/// The canonical frame address: a register plus an offset, or not followed (an expression).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cfa {
    At(u16, i64),
    Unknown,
}

/// The rules at one instruction address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    pub cfa: Cfa,
    pub regs: [Rule; REGS],
}

const EMPTY: Row = Row {
    cfa: Cfa::Unknown,
    regs: [Rule::Same; REGS],
};

/// Reads bytes in `[at, end)` of memory known to be mapped and readable (an object's tables).
struct Cursor {
    at: usize,
    end: usize,
}

impl Cursor {
    fn bytes<const N: usize>(&mut self) -> Option<[u8; N]> {
        if self.at.checked_add(N)? > self.end {
            return None;
        }
        // SAFETY: `[at, at + N)` lies in `[start, end)`, which the caller vouched for (see
        // `Object`).
        let b = unsafe { std::ptr::read_unaligned(self.at as *const [u8; N]) };
        self.at += N;
        Some(b)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.bytes::<1>()?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.bytes().map(u16::from_le_bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        self.bytes().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.bytes().map(u64::from_le_bytes)
    }
    /// A LEB128 number's bits (those past 64 dropped), how many bits it had and its last byte.
    fn leb(&mut self) -> Option<(u64, u32, u8)> {
        let (mut v, mut shift) = (0u64, 0u32);
        loop {
            let b = self.u8()?;
            if shift < 64 {
                v |= u64::from(b & 0x7f) << shift;
            }
            shift += 7;
            if b & 0x80 == 0 {
                return Some((v, shift, b));
            }
        }
    }
    fn uleb(&mut self) -> Option<u64> {
        self.leb().map(|(v, _, _)| v)
    }
    fn sleb(&mut self) -> Option<i64> {
        let (v, shift, last) = self.leb()?;
        let mut v = v as i64;
        if shift < 64 && last & 0x40 != 0 {
            v |= -1i64 << shift;
        }
        Some(v)
    }
    fn skip(&mut self, n: u64) -> Option<()> {
        let n = usize::try_from(n).ok()?;
        if self.at.checked_add(n)? > self.end {
            return None;
        }
        self.at += n;
        Some(())
    }
    /// A pointer in the `DW_EH_PE_*` encoding `enc`; `data` is the base of `datarel`. An
    /// indirect pointer is not followed (only the personality routine's is, which is
    /// skipped).
    fn pointer(&mut self, enc: u8, data: usize) -> Option<usize> {
        if enc == 0xff {
            return None;
        }
        let field = self.at;
        let raw = match enc & 0x0f {
            0x00 => self.u64()?,
            0x01 => self.uleb()?,
            0x02 => u64::from(self.u16()?),
            0x03 => u64::from(self.u32()?),
            0x04 => self.u64()?,
            0x09 => self.sleb()? as u64,
            0x0a => self.u16()? as i16 as i64 as u64,
            0x0b => self.u32()? as i32 as i64 as u64,
            0x0c => self.u64()?,
            _ => return None,
        };
        let base = match enc & 0x70 {
            0x00 => 0,
            0x10 => field,
            0x30 => data,
            _ => return None,
        };
        Some((base as u64).wrapping_add(raw) as usize)
    }
}

/// A loaded object's unwinding tables: its `PT_GNU_EH_FRAME` segment (`.eh_frame_hdr`) and the
/// extent of loaded memory that holds them (the object's mapping, or the segment of the tables),
/// which every read stays in.
pub struct Object {
    pub eh_frame_hdr: usize,
    pub start: usize,
    pub end: usize,
}

/// What a CIE says for the FDEs that point to it.
struct Cie {
    code_align: u64,
    data_align: i64,
    fde_enc: u8,
    augmented: bool,
    program: (usize, usize),
}

impl Object {
    fn cursor(&self, at: usize) -> Option<Cursor> {
        (self.start <= at && at < self.end).then_some(Cursor { at, end: self.end })
    }

    /// The rules at `pc` (an address in the object's code): `None` when the tables do not
    /// cover it or say something not followed (a signal frame's, among others).
    pub fn row(&self, pc: usize) -> Option<Row> {
        let mut c = self.record(self.find_fde(pc)?)?;
        let id_at = c.at;
        let cie_ptr = c.u32()? as usize;
        let cie = self.cie(id_at.checked_sub(cie_ptr)?)?;
        let begin = c.pointer(cie.fde_enc, 0)?;
        let range = c.pointer(cie.fde_enc & 0x0f, 0)?;
        if pc < begin || pc - begin >= range {
            return None;
        }
        if cie.augmented {
            let n = c.uleb()?;
            c.skip(n)?;
        }
        let mut row = EMPTY;
        let mut run = Run {
            cie: &cie,
            initial: EMPTY,
            stack: [const { MaybeUninit::uninit() }; STATES],
            depth: 0,
        };
        let (p, e) = cie.program;
        run.exec(&mut row, Cursor { at: p, end: e }, usize::MAX, begin)?;
        run.initial = row;
        run.exec(&mut row, c, pc, begin)?;
        Some(row)
    }

    /// The FDE covering `pc`, by the binary search table of `.eh_frame_hdr`.
    fn find_fde(&self, pc: usize) -> Option<usize> {
        let hdr = self.eh_frame_hdr;
        let mut c = self.cursor(hdr)?;
        let [version, ptr_enc, count_enc, table_enc] = c.bytes::<4>()?;
        // Only the sorted table of 32-bit offsets from the header is searched, as the linkers
        // write it.
        if version != 1 || table_enc != 0x3b {
            return None;
        }
        c.pointer(ptr_enc, hdr)?;
        let count = c.pointer(count_enc, hdr)?;
        let table = c.at;
        if count == 0 || count > (self.end - table) / 8 {
            return None;
        }
        let entry = |i: usize| -> Option<(usize, usize)> {
            let mut e = self.cursor(table + 8 * i)?;
            let loc = hdr.wrapping_add(e.u32()? as i32 as isize as usize);
            let fde = hdr.wrapping_add(e.u32()? as i32 as isize as usize);
            Some((loc, fde))
        };
        // The last entry starting at or before `pc`.
        let (mut lo, mut hi) = (0usize, count);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if entry(mid)?.0 <= pc {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let (loc, fde) = entry(lo)?;
        (loc <= pc).then_some(fde)
    }

    /// The body of the CIE or FDE at `at` (after its 32-bit length), within the object: 64-bit
    /// records and the terminator are not followed.
    fn record(&self, at: usize) -> Option<Cursor> {
        let mut c = self.cursor(at)?;
        let len = c.u32()?;
        if len == 0 || len == 0xffff_ffff {
            return None;
        }
        let end = at.checked_add(4)?.checked_add(len as usize)?;
        if end > self.end {
            return None;
        }
        c.end = end;
        Some(c)
    }

    fn cie(&self, at: usize) -> Option<Cie> {
        let mut c = self.record(at)?;
        let end = c.end;
        if c.u32()? != 0 {
            return None;
        }
        let version = c.u8()?;
        if version != 1 && version != 3 {
            return None;
        }
        let mut aug = [0u8; 8];
        let mut n = 0;
        loop {
            let b = c.u8()?;
            if b == 0 {
                break;
            }
            *aug.get_mut(n)? = b;
            n += 1;
        }
        let aug = &aug[..n];
        if aug.windows(2).any(|w| w == b"eh") {
            return None;
        }
        let code_align = c.uleb()?;
        let data_align = c.sleb()?;
        let ra = if version == 1 {
            u64::from(c.u8()?)
        } else {
            c.uleb()?
        };
        if ra != RA as u64 {
            return None;
        }
        let mut cie = Cie {
            code_align,
            data_align,
            fde_enc: 0,
            augmented: aug.first() == Some(&b'z'),
            program: (0, 0),
        };
        if cie.augmented {
            let len = c.uleb()?;
            let data_end = c.at.checked_add(usize::try_from(len).ok()?)?;
            for &ch in &aug[1..] {
                match ch {
                    b'R' => cie.fde_enc = c.u8()?,
                    b'L' => {
                        c.u8()?;
                    }
                    b'P' => {
                        let enc = c.u8()?;
                        c.pointer(enc & 0x7f, 0)?;
                    }
                    // A signal frame's caller is found by expressions: not followed.
                    b'S' => return None,
                    _ => break,
                }
            }
            if data_end > end {
                return None;
            }
            c.at = data_end;
        } else if !aug.is_empty() {
            return None;
        }
        cie.program = (c.at, end);
        Some(cie)
    }
}

/// How deep `DW_CFA_remember_state` may nest.
const STATES: usize = 8;

/// A call frame program being run.
struct Run<'a> {
    cie: &'a Cie,
    /// The row after the CIE's instructions, for `DW_CFA_restore`.
    initial: Row,
    /// Rows remembered: the first `depth` are written.
    stack: [MaybeUninit<Row>; STATES],
    depth: usize,
}

impl Run<'_> {
    /// Runs `c` on `row` from `loc` until the instructions for addresses after `pc`.
    fn exec(&mut self, row: &mut Row, mut c: Cursor, pc: usize, mut loc: usize) -> Option<()> {
        let data = |v: i64| v.checked_mul(self.cie.data_align);
        let udata = |v: u64| i64::try_from(v).ok()?.checked_mul(self.cie.data_align);
        while c.at < c.end {
            let op = c.u8()?;
            let advance = match op >> 6 {
                1 => Some(u64::from(op & 0x3f)),
                2 => {
                    let off = udata(c.uleb()?)?;
                    set(row, u64::from(op & 0x3f), Rule::At(off));
                    None
                }
                3 => {
                    let reg = usize::from(op & 0x3f);
                    if reg < REGS {
                        row.regs[reg] = self.initial.regs[reg];
                    }
                    None
                }
                _ => match op {
                    0x00 | 0x2e => {
                        if op == 0x2e {
                            c.uleb()?;
                        }
                        None
                    }
                    0x01 => {
                        let to = c.pointer(self.cie.fde_enc, 0)?;
                        if to > pc {
                            return Some(());
                        }
                        loc = to;
                        None
                    }
                    0x02 => Some(u64::from(c.u8()?)),
                    0x03 => Some(u64::from(c.u16()?)),
                    0x04 => Some(u64::from(c.u32()?)),
                    0x05 => {
                        let reg = c.uleb()?;
                        set(row, reg, Rule::At(udata(c.uleb()?)?));
                        None
                    }
                    0x06 => {
                        let reg = c.uleb()?;
                        if let Some(r) = usize::try_from(reg).ok().filter(|r| *r < REGS) {
                            row.regs[r] = self.initial.regs[r];
                        }
                        None
                    }
                    0x07 => {
                        set(row, c.uleb()?, Rule::Undefined);
                        None
                    }
                    0x08 => {
                        set(row, c.uleb()?, Rule::Same);
                        None
                    }
                    0x09 => {
                        let reg = c.uleb()?;
                        let from = c.uleb()?;
                        let rule = match u16::try_from(from) {
                            Ok(f) if usize::from(f) < REGS => Rule::In(f),
                            _ => Rule::Unknown,
                        };
                        set(row, reg, rule);
                        None
                    }
                    0x0a => {
                        self.stack.get_mut(self.depth)?.write(*row);
                        self.depth += 1;
                        None
                    }
                    0x0b => {
                        self.depth = self.depth.checked_sub(1)?;
                        // SAFETY: rows below `depth` were written by `DW_CFA_remember_state`.
                        *row = unsafe { self.stack[self.depth].assume_init() };
                        None
                    }
                    0x0c => {
                        let reg = c.uleb()?;
                        let off = i64::try_from(c.uleb()?).ok()?;
                        row.cfa = cfa(reg, off);
                        None
                    }
                    0x0d => {
                        let reg = c.uleb()?;
                        let off = match row.cfa {
                            Cfa::At(_, off) => off,
                            Cfa::Unknown => 0,
                        };
                        row.cfa = cfa(reg, off);
                        None
                    }
                    0x0e => {
                        let off = i64::try_from(c.uleb()?).ok()?;
                        if let Cfa::At(reg, _) = row.cfa {
                            row.cfa = Cfa::At(reg, off);
                        }
                        None
                    }
                    0x0f => {
                        let n = c.uleb()?;
                        c.skip(n)?;
                        row.cfa = Cfa::Unknown;
                        None
                    }
                    0x10 | 0x16 => {
                        let reg = c.uleb()?;
                        let n = c.uleb()?;
                        c.skip(n)?;
                        set(row, reg, Rule::Unknown);
                        None
                    }
                    0x11 => {
                        let reg = c.uleb()?;
                        set(row, reg, Rule::At(data(c.sleb()?)?));
                        None
                    }
                    0x12 => {
                        let reg = c.uleb()?;
                        row.cfa = cfa(reg, data(c.sleb()?)?);
                        None
                    }
                    0x13 => {
                        let off = data(c.sleb()?)?;
                        if let Cfa::At(reg, _) = row.cfa {
                            row.cfa = Cfa::At(reg, off);
                        }
                        None
                    }
                    0x14 => {
                        let reg = c.uleb()?;
                        set(row, reg, Rule::ValueAt(udata(c.uleb()?)?));
                        None
                    }
                    0x15 => {
                        let reg = c.uleb()?;
                        set(row, reg, Rule::ValueAt(data(c.sleb()?)?));
                        None
                    }
                    0x2f => {
                        let reg = c.uleb()?;
                        let off = udata(c.uleb()?)?.checked_neg()?;
                        set(row, reg, Rule::At(off));
                        None
                    }
                    _ => return None,
                },
            };
            if let Some(delta) = advance {
                let to = loc
                    .checked_add(usize::try_from(delta.checked_mul(self.cie.code_align)?).ok()?)?;
                if to > pc {
                    return Some(());
                }
                loc = to;
            }
        }
        Some(())
    }
}

/// The rule for `reg` (registers past the return address, vector ones, are not kept).
fn set(row: &mut Row, reg: u64, rule: Rule) {
    if let Some(r) = usize::try_from(reg).ok().filter(|r| *r < REGS) {
        row.regs[r] = rule;
    }
}

fn cfa(reg: u64, off: i64) -> Cfa {
    match u16::try_from(reg) {
        Ok(r) if usize::from(r) < REGS => Cfa::At(r, off),
        _ => Cfa::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::Cursor;

    fn cursor(bytes: &[u8]) -> Cursor {
        let at = bytes.as_ptr() as usize;
        Cursor {
            at,
            end: at + bytes.len(),
        }
    }

    /// The numbers of DWARF's own examples, and a read past the end is no number.
    #[test]
    fn leb128_numbers() {
        assert_eq!(cursor(&[2]).uleb(), Some(2));
        assert_eq!(cursor(&[0x80, 1]).uleb(), Some(128));
        assert_eq!(cursor(&[0xe5, 0x8e, 0x26]).uleb(), Some(624_485));
        assert_eq!(cursor(&[0x7e]).sleb(), Some(-2));
        assert_eq!(cursor(&[0xff, 0x7e]).sleb(), Some(-129));
        assert_eq!(cursor(&[0x80, 0x7f]).sleb(), Some(-128));
        assert_eq!(cursor(&[0x80]).uleb(), None);
        let mut c = cursor(&[0x1b, 0xf0, 0xff, 0xff, 0xff]);
        let field = c.at + 1;
        c.u8();
        // pcrel | sdata4: -16 from the field itself.
        assert_eq!(c.pointer(0x1b, 0), Some(field - 16));
    }
}
