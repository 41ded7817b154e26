//! Wall-clock time as records write it.

/// The current time as RFC 3339 with milliseconds, UTC (the `time` of events and receipts).
pub fn timestamp_now() -> String {
    timestamp_at(std::time::SystemTime::now())
}

/// `time` as RFC 3339 with milliseconds, UTC: what [`timestamp_now`] gives at that time (a
/// receipt reads the clock when its call starts and writes the date when it is made).
///
/// Formatting a date costs more than recording an event; within one millisecond the text is
/// the same, so each thread keeps the last one it formatted, and only a new millisecond is
/// turned into a date (every tool call and event asks for the time).
pub fn timestamp_at(time: std::time::SystemTime) -> String {
    use std::cell::RefCell;
    use std::time::UNIX_EPOCH;
    thread_local! {
        static LAST: RefCell<(i128, String)> = const { RefCell::new((i128::MIN, String::new())) };
    }
    // Milliseconds since the epoch, negative before it (a clock set before 1970).
    let millis: i128 = match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i128::try_from(after.as_millis()).unwrap_or(i128::MAX),
        Err(before) => -i128::try_from(before.duration().as_millis()).unwrap_or(i128::MAX),
    };
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        if last.0 != millis {
            let date = i64::try_from(millis)
                .ok()
                .and_then(chrono::DateTime::from_timestamp_millis)
                .unwrap_or_default();
            *last = (
                millis,
                date.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
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

    #[test]
    fn a_given_time_is_written_to_the_millisecond_whatever_came_before() {
        use std::time::{Duration, UNIX_EPOCH};
        let at = |ms: u64| timestamp_at(UNIX_EPOCH + Duration::from_millis(ms));
        assert_eq!(at(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        // The same thread's cache holds another millisecond now: it is not reused.
        assert_eq!(at(1_700_000_000_124), "2023-11-14T22:13:20.124Z");
        assert_eq!(at(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(at(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            timestamp_at(UNIX_EPOCH - Duration::from_millis(1)),
            "1969-12-31T23:59:59.999Z"
        );
    }
}
