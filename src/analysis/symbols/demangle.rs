//! Readable names for symbols: C++ and Rust names demangled, with the suffixes compilers add
//! to clones (`.isra.0`, `.constprop.0`, `.part.0`, `.cold`, `.lto_priv.0`…) kept as
//! `[clone .isra.0]`, as `c++filt` writes them.
//!
//! The demangler (`cpp_demangle`, through `addr2line`) refuses some real names whole, such as
//! templates with expressions in their arguments or C++20 template parameter declarations
//! (`_ZN4llvm15concat_iteratorI…TpTnmJEEEvv.cold`, from LLVM's own library). Such a name
//! still shows its qualified name, with `<…>` for template arguments and `(…)` for the
//! parameters ([`outline`]), rather than the mangled text.

/// The readable form of the symbol `name` (a C name is returned as it is).
pub fn demangle(name: &str) -> String {
    let full = addr2line::demangle_auto(name.into(), None);
    if full != name {
        return full.into_owned();
    }
    if !name.starts_with("_Z") {
        return name.to_owned();
    }
    // Mangled C++ never holds a '.': what follows the first one is clone suffixes.
    let (base, suffix) = name.split_at(name.find('.').unwrap_or(name.len()));
    let plain = addr2line::demangle_auto(base.into(), None);
    let mut out = match plain != base {
        true => plain.into_owned(),
        false => match outline(base) {
            Some(o) => o,
            None => return name.to_owned(),
        },
    };
    for clone in clones(suffix) {
        out.push_str(" [clone ");
        out.push_str(clone);
        out.push(']');
    }
    out
}

/// The clone suffixes of `.isra.0.cold`: `.isra.0`, `.cold` (a name, then its number if any).
fn clones(suffix: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let parts: Vec<(usize, &str)> = suffix
        .match_indices('.')
        .map(|(i, _)| i)
        .zip(suffix.split('.').skip(1))
        .collect();
    for (k, &(at, part)) in parts.iter().enumerate() {
        let numeric = !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
        if k > 0 && !numeric {
            out.push(&suffix[start..at]);
            start = at;
        }
    }
    if start < suffix.len() {
        out.push(&suffix[start..]);
    }
    out
}

/// The outline of a mangled C++ name that the demangler refused: its qualified name, with
/// `<…>` for template arguments and `(…)` for the parameters; None when even that cannot be
/// read (then the caller keeps the mangled name).
pub fn outline(name: &str) -> Option<String> {
    let rest = name.strip_prefix("_Z")?.as_bytes();
    let mut r = Reader { s: rest, at: 0 };
    r.eat(b'L'); // internal linkage
    let mut parts: Vec<String> = Vec::new();
    if r.eat(b'N') {
        while r.peek()? != b'E' {
            match r.peek()? {
                b'r' | b'V' | b'K' | b'R' | b'O' if parts.is_empty() => r.at += 1,
                b'S' if r.peek_at(1) == Some(b't') => {
                    r.at += 2;
                    parts.push("std".into());
                }
                b'S' => {
                    r.substitution()?;
                    parts.push("…".into());
                }
                b'I' => {
                    r.skip_group()?;
                    parts.last_mut()?.push_str("<…>");
                }
                b'C' | b'D' => {
                    let dtor = r.peek()? == b'D';
                    r.at += 2;
                    let class = parts.last()?.split('<').next()?.to_owned();
                    parts.push(if dtor { format!("~{class}") } else { class });
                }
                b'0'..=b'9' => parts.push(r.source_name()?),
                _ => return None,
            }
        }
    } else {
        parts.push(r.source_name()?);
        if r.peek() == Some(b'I') {
            r.skip_group()?;
            parts.last_mut()?.push_str("<…>");
        }
    }
    (!parts.is_empty()).then(|| format!("{}(…)", parts.join("::")))
}

/// A cursor over the bytes of a mangled name.
struct Reader<'a> {
    s: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    fn peek_at(&self, k: usize) -> Option<u8> {
        self.s.get(self.at + k).copied()
    }

    fn eat(&mut self, b: u8) -> bool {
        let yes = self.peek() == Some(b);
        self.at += usize::from(yes);
        yes
    }

    fn number(&mut self) -> Option<usize> {
        let start = self.at;
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.at += 1;
        }
        std::str::from_utf8(&self.s[start..self.at])
            .ok()?
            .parse()
            .ok()
    }

    /// Moves past the next `end`.
    fn past(&mut self, end: u8) -> Option<()> {
        while self.peek()? != end {
            self.at += 1;
        }
        self.at += 1;
        Some(())
    }

    /// `<length><identifier>`; GCC's anonymous namespace reads as `(anonymous namespace)`.
    fn source_name(&mut self) -> Option<String> {
        let len = self.number()?;
        let bytes = self.s.get(self.at..self.at.checked_add(len)?)?;
        self.at += len;
        let id = std::str::from_utf8(bytes).ok()?;
        Some(match id.starts_with("_GLOBAL__N") {
            true => "(anonymous namespace)".into(),
            false => id.into(),
        })
    }

    /// `S_`, `S<base 36>_` or one of the standard abbreviations (`Sa`, `Ss`…).
    fn substitution(&mut self) -> Option<()> {
        self.at += 1;
        match self.peek()? {
            b'a' | b'b' | b's' | b'i' | b'o' | b'd' | b't' => self.at += 1,
            _ => {
                while self.peek()?.is_ascii_alphanumeric() {
                    self.at += 1;
                }
                self.eat(b'_');
            }
        }
        Some(())
    }

    /// Skips a group that ends at its matching `E` (template arguments `I…E`, and what
    /// nests in them), reading names and numbered references whole so that their letters
    /// and digits are not taken for openers.
    fn skip_group(&mut self) -> Option<()> {
        let mut depth = 0usize;
        loop {
            let b = self.peek()?;
            match b {
                b'0'..=b'9' => {
                    self.source_name()?;
                    continue;
                }
                b'E' => {
                    self.at += 1;
                    depth = depth.checked_sub(1)?;
                    if depth == 0 {
                        return Some(());
                    }
                    continue;
                }
                b'L' if self.peek_at(1) != Some(b'_') => {
                    // A literal: L <builtin type> <value> E.
                    self.at += 2;
                    self.past(b'E')?;
                    continue;
                }
                b'T' | b'S' => {
                    // T_, T<n>_, S_, S<seq>_ and St, Sa…; Tp/Tn/Tt prefix a declaration.
                    self.at += 1;
                    if b == b'T' && matches!(self.peek()?, b'p' | b'n' | b't' | b'y') {
                        self.at += 1;
                        continue;
                    }
                    self.at -= usize::from(b == b'S');
                    match b {
                        b'S' => self.substitution()?,
                        _ => {
                            while self.peek()?.is_ascii_alphanumeric() {
                                self.at += 1;
                            }
                            self.eat(b'_');
                        }
                    }
                    continue;
                }
                b'f' if self.peek_at(1) == Some(b'p') => {
                    // A function parameter: fp <cv> <n> _.
                    self.at += 2;
                    self.past(b'_')?;
                    continue;
                }
                b'D' | b'U'
                    if matches!(
                        (b, self.peek_at(1)),
                        (b'D', Some(b't' | b'T')) | (b'U', Some(b'l'))
                    ) =>
                {
                    // decltype (Dt, DT) and a lambda's parameters (Ul) end at an E; a
                    // lambda's number follows that E (`E_`, `E0_`), and reads as names.
                    depth += 1;
                    self.at += 2;
                    continue;
                }
                b'D' => {
                    self.at += 2;
                    continue;
                }
                b'U' if self.peek_at(1) == Some(b't') => {
                    // An unnamed type: Ut [n] _.
                    self.at += 2;
                    self.past(b'_')?;
                    continue;
                }
                b'I' | b'N' | b'X' | b'J' | b'Z' | b'L' => depth += 1,
                _ => {}
            }
            self.at += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clone_suffixes_stay_readable() {
        assert_eq!(
            demangle("_Z11clone_allocm.isra.0"),
            "clone_alloc(unsigned long) [clone .isra.0]"
        );
        assert_eq!(
            demangle("_Z3fooi.constprop.0.isra.0.cold"),
            "foo(int) [clone .constprop.0] [clone .isra.0] [clone .cold]"
        );
        assert_eq!(demangle("_Z3fooi.part.0"), "foo(int) [clone .part.0]");
        assert_eq!(
            demangle("_ZN4core3ptr13drop_in_place17h0123456789abcdefE.cold"),
            "core::ptr::drop_in_place.cold"
        );
        assert_eq!(demangle("chain_level2.cold"), "chain_level2.cold");
        assert_eq!(demangle("malloc"), "malloc");
        assert_eq!(clones(".isra.0.cold"), [".isra.0", ".cold"]);
        assert_eq!(clones(".cold.12"), [".cold.12"]);
    }

    /// Real names the demangler refuses (from LLVM's library on this machine, and the pyarrow
    /// clone of the issue): their outline, never the mangled text.
    #[test]
    fn names_the_demangler_refuses_show_their_outline() {
        let llvm = "_ZN4llvm15concat_iteratorIPNS_12VPBasicBlockEJNS_15mapped_iteratorINS_20\
                    filter_iterator_implINS3_INS_11df_iteratorINS_30VPBlockShallowTraversal\
                    WrapperIPNS_11VPBlockBaseEEENS_23df_iterator_default_setIS8_Lj8EEELb0ENS_11\
                    GraphTraitsIS9_EEEEZNS_12VPBlockUtils10blocksOnlyIS1_NS_14iterator_range\
                    ISE_EEEEDaRKT0_EUlS8_E_RS7_EEZNSG_IS1_SI_EEDaSL_EUlSN_E_St20forward_\
                    iterator_tagEEZNSG_IS1_SI_EEDaSL_EUlSN_E0_S2_EEST_EE13incrementImplILm1E\
                    TpTnmJEEEvv.cold";
        assert_eq!(
            demangle(llvm),
            "llvm::concat_iterator<…>::incrementImpl<…>(…) [clone .cold]"
        );
        let arrow = "_ZN5arrow2py12_GLOBAL__N_119ObjectWriterVisitor5VisitINS_8ListTypeEEENSt9\
                     enable_ifIXoosrSt7is_sameIS5_T_E5valuesrS6_INS_13LargeListTypeES7_E5value\
                     ENS_6StatusEE4typeERKS7_.isra.0";
        assert_eq!(
            demangle(arrow),
            "arrow::py::(anonymous namespace)::ObjectWriterVisitor::Visit<…>(…) [clone .isra.0]"
        );
        assert_eq!(outline("_Zjunk"), None);
        assert_eq!(demangle("_ZN3fooIE"), "_ZN3fooIE");
    }
}
