//! Wall-clock time as records write it.

/// The current time as RFC 3339 with milliseconds, UTC (the `time` of events and receipts).
///
/// Formatting a date costs more than recording an event; within one millisecond the text is
/// the same, so each thread keeps the last one it formatted.
pub fn timestamp_now() -> String {
    use std::cell::RefCell;
    thread_local! {
        static LAST: RefCell<(i64, String)> = const { RefCell::new((i64::MIN, String::new())) };
    }
    let now = chrono::Utc::now();
    let millis = now.timestamp_millis();
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        if last.0 != millis {
            *last = (
                millis,
                now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            );
        }
        last.1.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_millis_and_advance() {
        let a = timestamp_now();
        assert_eq!(a.len(), "2024-01-01T00:00:00.000Z".len(), "{a}");
        assert!(chrono::DateTime::parse_from_rfc3339(&a).is_ok(), "{a}");
        std::thread::sleep(std::time::Duration::from_millis(3));
        let b = timestamp_now();
        assert!(b > a, "{a} then {b}");
    }
}
