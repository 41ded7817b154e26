//! Wall-clock time as records write it.

/// The current time as RFC 3339 with milliseconds, UTC (the `time` of events and receipts).
pub fn timestamp_now() -> String {
    timestamp_at(std::time::SystemTime::now())
}

/// How far from the instant it was read at a thread's pairing of the two clocks serves
/// ([`wall_time_of`]): a wall clock set (or slewed) meanwhile moves a date by at most what
/// it moved in this long.
const CLOCK_PAIR_REACH: std::time::Duration = std::time::Duration::from_secs(1);

/// When `instant` was (or will be) on the wall clock.
///
/// From a pairing of the monotonic and the wall clock that each thread reads again when
/// `instant` is more than [`CLOCK_PAIR_REACH`] from its last one: a receipt's date (when its
/// call started) then costs no clock read in the common case, where reading the wall clock
/// and the time since the start cost two (clock reads are not cheap on a virtual machine;
/// bench `query`, `tool, receipt made`). The monotonic clock is read first, so a date is not
/// before the instant's.
pub fn wall_time_of(instant: std::time::Instant) -> std::time::SystemTime {
    use std::cell::Cell;
    use std::time::{Instant, SystemTime};
    thread_local! {
        static PAIR: Cell<Option<(Instant, SystemTime)>> = const { Cell::new(None) };
    }
    PAIR.with(|pair| {
        let near = |at: Instant| {
            let apart = if instant >= at {
                instant - at
            } else {
                at - instant
            };
            apart <= CLOCK_PAIR_REACH
        };
        let (at, wall) = match pair.get() {
            Some((at, wall)) if near(at) => (at, wall),
            _ => {
                let read = (Instant::now(), SystemTime::now());
                pair.set(Some(read));
                read
            }
        };
        let moved = if instant >= at {
            wall.checked_add(instant - at)
        } else {
            wall.checked_sub(at - instant)
        };
        moved.unwrap_or(wall)
    })
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

    /// `wall_time_of(instant)` with `instant` read between two wall-clock readings: within
    /// them, give or take `slack` (the pairing's two reads are not one instant).
    fn assert_between(
        instant: std::time::Instant,
        before: std::time::SystemTime,
        after: std::time::SystemTime,
    ) {
        let slack = std::time::Duration::from_millis(20);
        let wall = wall_time_of(instant);
        assert!(wall >= before, "{wall:?} before {before:?}");
        assert!(wall <= after + slack, "{wall:?} after {after:?}");
    }

    #[test]
    fn an_instant_is_dated_by_the_wall_clock_near_or_far_past_or_future() {
        use std::time::{Duration, Instant, SystemTime};
        for offset in [0, 500, 1_500, 3_600_000] {
            let offset = Duration::from_millis(offset);
            // In the past: the first pairing on this thread, then one read for another. (The
            // monotonic clock starts at boot: a machine up for less than the offset has no
            // such instant, and the future ones below still go as far.)
            let before = SystemTime::now() - offset;
            if let Some(past) = Instant::now().checked_sub(offset) {
                let after = SystemTime::now() - offset;
                assert_between(past, before, after);
            }
            // In the future (a deadline), and the same past instant again.
            let before = SystemTime::now() + offset;
            let future = Instant::now() + offset;
            let after = SystemTime::now() + offset;
            assert_between(future, before, after);
        }
    }

    #[test]
    fn a_pairing_serves_instants_near_it_and_is_read_again_for_others() {
        use std::time::{Duration, Instant, SystemTime};
        let before = SystemTime::now();
        let start = Instant::now();
        let after = SystemTime::now();
        assert_between(start, before, after);
        // An instant read a little later is dated from the same pairing: its distance from
        // the first is kept exactly.
        std::thread::sleep(Duration::from_millis(30));
        let later = Instant::now();
        assert_eq!(
            wall_time_of(later).duration_since(wall_time_of(start)).ok(),
            Some(later - start)
        );
        // One far from it (an hour ahead) is dated from a new pairing, as is the next near one.
        let hour = Duration::from_secs(3600);
        let before = SystemTime::now() + hour;
        let ahead = Instant::now() + hour;
        let after = SystemTime::now() + hour;
        assert_between(ahead, before, after);
        let before = SystemTime::now();
        let now = Instant::now();
        let after = SystemTime::now();
        assert_between(now, before, after);
    }
}
