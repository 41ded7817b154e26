//! Byte counts shown to the model, in the units people use.

/// A byte count for people: `512 B`, `1.2 KB`, `3.4 MB` (powers of 1024).
pub(crate) fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_like_people_write_them() {
        assert_eq!(human_size(0), "0 B");
        assert_eq!(human_size(1023), "1023 B");
        assert_eq!(human_size(1024), "1.0 KB");
        assert_eq!(human_size(1300), "1.3 KB");
        assert_eq!(human_size(5 * 1024 * 1024 + 1), "5.0 MB");
        assert_eq!(human_size(3 << 30), "3.0 GB");
        assert_eq!(human_size(u64::MAX), "16777216.0 TB");
    }
}
