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
    use std::time::{Duration, Instant, SystemTime};
    thread_local! {
        static PAIR: Cell<Option<(Instant, SystemTime)>> = const { Cell::new(None) };
    }
    // The wall time `instant` is from a pairing `at`/`wall`, or `None` when it is out of the
    // pairing's reach. One subtraction of instants in the common case (an instant after its
    // thread's pairing): this runs for every receipt and most events.
    let from_pair =
        |at: Instant, wall: SystemTime, reach: Duration| match instant.checked_duration_since(at) {
            Some(after) if after <= reach => Some(wall.checked_add(after).unwrap_or(wall)),
            Some(_) => None,
            None => match at.checked_duration_since(instant) {
                Some(before) if before <= reach => Some(wall.checked_sub(before).unwrap_or(wall)),
                _ => None,
            },
        };
    PAIR.with(|pair| {
        if let Some((at, wall)) = pair.get()
            && let Some(time) = from_pair(at, wall, CLOCK_PAIR_REACH)
        {
            return time;
        }
        let (at, wall) = (Instant::now(), SystemTime::now());
        pair.set(Some((at, wall)));
        from_pair(at, wall, Duration::MAX).unwrap_or(wall)
    })
}

/// `time` as RFC 3339 with milliseconds, UTC: what [`timestamp_now`] gives at that time (a
/// receipt reads the clock when its call starts and writes the date when it is made).
pub fn timestamp_at(time: std::time::SystemTime) -> String {
    with_timestamp_at(time, str::to_string)
}

/// What `f` makes of `time`'s text as [`timestamp_at`] writes it, without a copy of the text
/// (an event's time is kept as a clock value and written as text only where it is written).
///
/// Formatting a date costs more than recording an event; within one millisecond the text is
/// the same, so each thread keeps the last one it formatted, and only a new millisecond is
/// turned into a date (every tool call and event asks for the time).
pub fn with_timestamp_at<R>(time: std::time::SystemTime, f: impl FnOnce(&str) -> R) -> R {
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
    let format = |millis: i128| {
        i64::try_from(millis)
            .ok()
            .and_then(chrono::DateTime::from_timestamp_millis)
            .unwrap_or_default()
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    };
    LAST.with(|last| match last.try_borrow_mut() {
        Ok(mut last) => {
            if last.0 != millis {
                *last = (millis, format(millis));
            }
            f(&last.1)
        }
        // Asked again from inside `f` on this thread: formatted apart, never a panic.
        Err(_) => f(&format(millis)),
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

    #[test]
    fn a_timestamp_asked_for_inside_another_is_written_apart() {
        use std::time::{Duration, UNIX_EPOCH};
        let outer = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        let inner = UNIX_EPOCH + Duration::from_millis(1_700_000_000_456);
        let both = with_timestamp_at(outer, |o| format!("{o} {}", timestamp_at(inner)));
        assert_eq!(both, "2023-11-14T22:13:20.123Z 2023-11-14T22:13:20.456Z");
        // The cache still serves the outer one afterwards.
        assert_eq!(timestamp_at(outer), "2023-11-14T22:13:20.123Z");
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
