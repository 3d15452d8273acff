//! Byte sizes as people write them: `4096`, `512K`, `20G`, `10 GiB`.
//!
//! Used by the config file (`cache.disk_bytes_max`) and by the CLI (`--size 20G`), so both
//! accept exactly the same spellings. Every unit is binary: `K`, `KB` and `KiB` all mean 1024
//! bytes. Storage sizes are nearly always powers of two, and a `10GB` that silently meant
//! 10^10 bytes would not be a multiple of the extent size.

/// Units by shift, largest first. `format_size` prints these names, `parse_size` reads them.
const UNITS: [(&str, u32); 4] = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];

/// Parses a byte size: a whole number, optionally followed (with or without a space) by a
/// unit `B`, `K`, `M`, `G` or `T`, each also spelt `KB`/`KiB` and so on, in any case.
/// A size that does not fit in 64 bits is an error, never a wrapped value.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let text = s.trim();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    if digits.is_empty() {
        return Err(format!(
            "invalid size {s:?}: expected a whole number of bytes, optionally followed by \
             a unit K, M, G or T (1K = 1024), such as \"20G\""
        ));
    }
    let shift = unit_shift(unit.trim_start()).ok_or_else(|| {
        format!(
            "invalid size {s:?}: unknown unit {:?}; use B, K, M, G or T \
             (also KB/KiB, MB/MiB, GB/GiB, TB/TiB; 1K = 1024)",
            unit.trim_start()
        )
    })?;
    let too_large = || {
        format!(
            "invalid size {s:?}: larger than the maximum of {} bytes",
            u64::MAX
        )
    };
    // `digits` holds ASCII digits only, so overflow is the one way this parse can fail.
    let number: u64 = digits.parse().map_err(|_| too_large())?;
    number.checked_mul(1u64 << shift).ok_or_else(too_large)
}

/// Formats a byte size for people, exactly: the largest unit that divides it, such as
/// `20 GiB`, `1536 KiB` or `1000 B`. The result always parses back to the same value with
/// [`parse_size`].
pub fn format_size(bytes: u64) -> String {
    for (name, shift) in UNITS {
        let unit = 1u64 << shift;
        if bytes != 0 && bytes.is_multiple_of(unit) {
            return format!("{} {name}", bytes >> shift);
        }
    }
    format!("{bytes} B")
}

fn unit_shift(unit: &str) -> Option<u32> {
    match unit.to_ascii_lowercase().as_str() {
        "" | "b" => Some(0),
        "k" | "kb" | "kib" => Some(10),
        "m" | "mb" | "mib" => Some(20),
        "g" | "gb" | "gib" => Some(30),
        "t" | "tb" | "tib" => Some(40),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    const TIB: u64 = 1 << 40;

    #[test]
    fn plain_integers_are_bytes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("  4096\t"), Ok(4096));
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
    }

    #[test]
    fn every_unit_spelling_is_binary() {
        let cases: [(&[&str], u64); 5] = [
            (&["B", "b"], 1),
            (&["K", "k", "KB", "kb", "KiB", "kib", "KIB"], KIB),
            (&["M", "m", "MB", "mb", "MiB", "mib"], MIB),
            (&["G", "g", "GB", "gb", "GiB", "gib"], GIB),
            (&["T", "t", "TB", "tb", "TiB", "tib"], TIB),
        ];
        for (spellings, unit) in cases {
            for spelling in spellings {
                assert_eq!(
                    parse_size(&format!("3{spelling}")),
                    Ok(3 * unit),
                    "{spelling}"
                );
                assert_eq!(
                    parse_size(&format!("3 {spelling}")),
                    Ok(3 * unit),
                    "{spelling}"
                );
            }
        }
        assert_eq!(parse_size("20G"), Ok(20 * GIB));
        assert_eq!(parse_size("10GiB"), Ok(10 * GIB));
    }

    #[test]
    fn overflow_is_an_error_not_a_wrap() {
        // 2^24 TiB = 2^64 bytes, one more than fits.
        assert_eq!(parse_size("16777215T"), Ok(16_777_215 * TIB));
        let error = parse_size("16777216T").unwrap_err();
        assert!(error.contains("larger than the maximum"), "{error}");
        let error = parse_size("18446744073709551616").unwrap_err();
        assert!(error.contains("larger than the maximum"), "{error}");
        let error = parse_size("99999999999999999999999999G").unwrap_err();
        assert!(error.contains("larger than the maximum"), "{error}");
        assert!(parse_size("18014398509481984K").is_err()); // 2^54 KiB = 2^64
    }

    #[test]
    fn malformed_sizes_are_errors_that_quote_the_input() {
        for bad in [
            "", " ", "G", "-1", "-1G", "+1G", "1.5G", "10X", "10 G B", "0x10", "1_000", "ten",
        ] {
            let error = parse_size(bad).unwrap_err();
            assert!(
                error.starts_with(&format!("invalid size {bad:?}")),
                "{bad}: {error}"
            );
        }
        assert_eq!(
            parse_size("10X").unwrap_err(),
            "invalid size \"10X\": unknown unit \"X\"; use B, K, M, G or T \
             (also KB/KiB, MB/MiB, GB/GiB, TB/TiB; 1K = 1024)"
        );
    }

    #[test]
    fn format_uses_the_largest_exact_unit() {
        assert_eq!(format_size(0), "0 B");
        assert_eq!(format_size(1), "1 B");
        assert_eq!(format_size(1000), "1000 B");
        assert_eq!(format_size(KIB), "1 KiB");
        assert_eq!(format_size(1536), "1536 B");
        assert_eq!(format_size(3 * KIB / 2 * KIB), "1536 KiB");
        assert_eq!(format_size(20 * GIB), "20 GiB");
        assert_eq!(format_size(GIB + KIB), "1048577 KiB");
        assert_eq!(format_size(5 * TIB), "5 TiB");
        assert_eq!(format_size(1024 * TIB), "1024 TiB");
        assert_eq!(format_size(u64::MAX), "18446744073709551615 B");
    }

    #[test]
    fn format_round_trips_through_parse() {
        let values = [
            0,
            1,
            511,
            KIB,
            KIB + 1,
            4 * MIB,
            20 * GIB,
            GIB + KIB,
            16_777_215 * TIB,
            u64::MAX,
            u64::MAX - 1023,
        ];
        for value in values {
            assert_eq!(parse_size(&format_size(value)), Ok(value), "{value}");
        }
    }
}
