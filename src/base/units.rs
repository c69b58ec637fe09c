//! Byte sizes: parsing `512KiB` on the command line and printing `1.50 MiB` in reports.
//!
//! Every unit is 1024-based, whatever its spelling: `k`, `KB` and `KiB` all mean 1024 bytes
//! (as in tcmalloc's and the JVM's flags). A sampling rate is a rough knob, and one meaning per
//! letter is easier to remember than two.

/// Units accepted by [`parse_size`], by exponent of 1024. Matched case-insensitively, with an
/// optional `B`/`iB` after the letter.
const PREFIXES: [char; 5] = ['k', 'm', 'g', 't', 'p'];

/// Parses a byte size such as `4096`, `512KiB`, `64kb`, `1.5 MiB` or `2G`.
///
/// The number may have a fractional part; the result is rounded to whole bytes and must be at
/// least 1. Meant as a clap `value_parser`: the error is a one-line message.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let text = s.trim();
    if text.is_empty() {
        return Err("empty size; expected e.g. 512KiB, 1MiB or 4096".into());
    }
    if text.starts_with('-') {
        return Err(format!("`{s}`: a size cannot be negative"));
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = (&text[..split], text[split..].trim_start());
    let multiplier = unit_multiplier(unit)
        .ok_or_else(|| format!("`{s}`: unknown unit `{unit}` (use B, KiB, MiB, GiB or TiB)"))?;
    let bytes = scaled(number, multiplier).map_err(|why| format!("`{s}`: {why}"))?;
    if bytes == 0 {
        return Err(format!("`{s}`: a size must be at least 1 byte"));
    }
    Ok(bytes)
}

/// Bytes per unit, or `None` for an unknown unit. The empty unit and `b` are bytes.
fn unit_multiplier(unit: &str) -> Option<u64> {
    let lower = unit.to_ascii_lowercase();
    if lower.is_empty() || lower == "b" {
        return Some(1);
    }
    let mut chars = lower.chars();
    let prefix = chars.next()?;
    let rest = chars.as_str();
    let power = PREFIXES.iter().position(|&p| p == prefix)? as u32 + 1;
    matches!(rest, "" | "b" | "ib").then(|| 1024u64.pow(power))
}

/// `number × multiplier`, rounded to whole bytes, computed exactly in integers.
fn scaled(number: &str, multiplier: u64) -> Result<u64, String> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return Err("expected a number".into());
    }
    if !whole
        .bytes()
        .chain(fraction.bytes())
        .all(|c| c.is_ascii_digit())
    {
        return Err("not a number".into());
    }
    if fraction.len() > 18 {
        return Err("too many decimal places".into());
    }
    let too_large = || "too large".to_string();
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| too_large())?
    };
    let denominator = 10u128.pow(fraction.len() as u32);
    let fraction: u128 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().map_err(|_| too_large())?
    };
    let multiplier = u128::from(multiplier);
    let exact = whole.checked_mul(multiplier).ok_or_else(too_large)?;
    let part = (fraction * multiplier + denominator / 2) / denominator;
    let total = exact.checked_add(part).ok_or_else(too_large)?;
    u64::try_from(total).map_err(|_| too_large())
}

/// The binary units above the byte, each 1024 of the one before.
const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];

/// The largest binary unit that `b` bytes hold at least once (the byte below 1 KiB, PiB at
/// most): its size in bytes and its name. An axis counts in it, so that its ticks fall on
/// round numbers of the unit.
pub fn binary_unit(b: f64) -> (f64, &'static str) {
    let mut unit = (1.0, "B");
    for (i, name) in UNITS.into_iter().enumerate() {
        let size = 1024f64.powi(i as i32 + 1);
        if b >= size {
            unit = (size, name);
        }
    }
    unit
}

/// Formats bytes for people: `512 B`, `1.50 KiB`, `1.50 MiB`, `2.00 GiB`, up to PiB.
pub fn human_bytes(b: f64) -> String {
    if !b.is_finite() {
        return format!("{b} B");
    }
    let magnitude = b.abs();
    if magnitude < 1024.0 {
        return format!("{:.0} B", b);
    }
    let mut value = b / 1024.0;
    let mut unit = 0;
    while value.abs() >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    // 1023.999 KiB would print as "1024.00 KiB": move it up a unit instead.
    if (value.abs() * 100.0).round() >= 102_400.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binary_unit_is_the_largest_held_once() {
        assert_eq!(binary_unit(500.0), (1.0, "B"));
        assert_eq!(binary_unit(1024.0), (1024.0, "KiB"));
        assert_eq!(binary_unit(50e6), (1024.0 * 1024.0, "MiB"));
        assert_eq!(binary_unit(3.0 * 1024f64.powi(3)).1, "GiB");
        assert_eq!(binary_unit(2.0 * 1024f64.powi(5)).1, "PiB");
        assert_eq!(binary_unit(5000.0 * 1024f64.powi(5)).1, "PiB");
    }

    #[test]
    fn parses_plain_bytes_and_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1"), Ok(1));
        assert_eq!(parse_size("512KiB"), Ok(512 * 1024));
        assert_eq!(parse_size("512kib"), Ok(512 * 1024));
        assert_eq!(parse_size("64KB"), Ok(64 * 1024));
        assert_eq!(parse_size("64k"), Ok(64 * 1024));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("1 MiB"), Ok(1 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("1TiB"), Ok(1 << 40));
        assert_eq!(parse_size("100b"), Ok(100));
        assert_eq!(parse_size(" 8 "), Ok(8));
    }

    #[test]
    fn parses_fractions_exactly_and_rounds_to_bytes() {
        assert_eq!(parse_size("1.5MiB"), Ok(3 << 19));
        assert_eq!(parse_size("0.5KiB"), Ok(512));
        assert_eq!(parse_size(".5k"), Ok(512));
        assert_eq!(parse_size("1.3KiB"), Ok(1331)); // 1331.2
        assert_eq!(parse_size("2."), Ok(2));
    }

    #[test]
    fn rejects_zero_negative_garbage_and_overflow() {
        for bad in [
            "",
            "0",
            "0KiB",
            "0.0001",
            "-1",
            "-1KiB",
            "abc",
            "KiB",
            "12XB",
            "1.2.3",
            "1e6",
            "1 M iB",
            ".",
            "99999999999999999999999",
            "16777216TiB",
            "18446744073709551616",
        ] {
            let err = parse_size(bad).expect_err(bad);
            assert!(!err.contains('\n'), "{err}");
        }
        assert!(parse_size("0").unwrap_err().contains("at least 1 byte"));
        assert!(parse_size("-5").unwrap_err().contains("negative"));
        assert!(parse_size("1ZiB").unwrap_err().contains("unknown unit"));
        assert!(parse_size("99999999999TiB")
            .unwrap_err()
            .contains("too large"));
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
    }

    #[test]
    fn prints_human_sizes() {
        assert_eq!(human_bytes(0.0), "0 B");
        assert_eq!(human_bytes(512.0), "512 B");
        assert_eq!(human_bytes(1023.4), "1023 B");
        assert_eq!(human_bytes(1024.0), "1.00 KiB");
        assert_eq!(human_bytes(1.5 * 1024.0 * 1024.0), "1.50 MiB");
        assert_eq!(human_bytes(2.0 * 1024.0 * 1024.0 * 1024.0), "2.00 GiB");
        assert_eq!(human_bytes(1024.0 * 1024.0 - 1.0), "1.00 MiB");
        assert_eq!(human_bytes(-2048.0), "-2.00 KiB");
        assert_eq!(human_bytes(f64::NAN), "NaN B");
    }
}
