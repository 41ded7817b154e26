//! Receipt ids: UUID v7 strings (RFC 9562) made from a wall-clock reading the caller already
//! has, a process-wide counter and a random per-process salt.
//!
//! `Uuid::now_v7()` reads the clock itself, takes a lock-guarded shared context and draws
//! fresh random bytes for every id: with the text formatting, a quarter of what making a
//! receipt cost (bench query, `tool, receipt made`). Here the receipt's own clock reading
//! gives the milliseconds, one atomic gives the order, and the random part is drawn once.
//!
//! Layout (the uuid crate's `Builder::from_unix_timestamp_millis` sets version and variant):
//! 48 bits of Unix milliseconds, then an 18-bit counter (12 bits of `rand_a`, the first 6 of
//! `rand_b`), then 56 random bits fixed for the process. Ids of one process sort in the order
//! they were made, also when the wall clock steps back (the milliseconds never go below the
//! last id's) or more than 2^18 ids are made in one millisecond (the counter carries into
//! the milliseconds, as if the id were made a millisecond later). Ids of two processes differ
//! in their salt (or their milliseconds): two processes collide only if their 56-bit salts
//! are equal.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Bits of the counter within a millisecond.
const COUNTER_BITS: u32 = 18;

/// The largest millisecond value the packed state holds (year 4199).
const MAX_MILLIS: u64 = (1 << (64 - COUNTER_BITS)) - 1;

/// The last id's milliseconds and counter, packed as `millis << COUNTER_BITS | counter`: one
/// number that only grows, so that one compare-and-swap orders ids across threads.
static LAST: AtomicU64 = AtomicU64::new(0);

/// The random part of this process's ids.
fn salt() -> &'static [u8; 7] {
    static SALT: OnceLock<[u8; 7]> = OnceLock::new();
    SALT.get_or_init(|| {
        let mut salt = [0u8; 7];
        if getrandom::fill(&mut salt).is_err() {
            // No OS randomness (it does not fail on Linux after boot): the process id and
            // the start time's nanoseconds still tell this process's ids from another's.
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or(Duration::ZERO)
                .subsec_nanos();
            salt[..4].copy_from_slice(&std::process::id().to_le_bytes());
            salt[4..].copy_from_slice(&nanos.to_le_bytes()[..3]);
        }
        salt
    })
}

/// The packed (milliseconds, counter) of the next id after `last`'s, at wall-clock time
/// `millis`.
fn next_packed(last_id: &AtomicU64, millis: u64) -> u64 {
    let floor = millis.min(MAX_MILLIS) << COUNTER_BITS;
    let mut last = last_id.load(Ordering::Relaxed);
    loop {
        // A later millisecond starts its counter at 0; the same or an earlier one (a clock
        // stepped back) continues after the last id. At the counter's end the addition
        // carries into the milliseconds. Past the last millisecond of the range (2^18 ids
        // in the last millisecond of year 4199) the last id repeats rather than wrap to 1970.
        let next = if floor > last {
            floor
        } else {
            last.saturating_add(1)
        };
        match last_id.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(current) => last = current,
        }
    }
}

/// A new receipt id for a receipt made at `now` (hyphenated lowercase UUID v7 text).
pub(crate) fn receipt_id(now: SystemTime) -> super::ShortText {
    let millis = now
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis();
    let packed = next_packed(&LAST, u64::try_from(millis).unwrap_or(MAX_MILLIS));
    id_text(packed, salt())
}

/// The text of the id with this packed (milliseconds, counter) and salt.
fn id_text(packed: u64, salt: &[u8; 7]) -> super::ShortText {
    let millis = packed >> COUNTER_BITS;
    let counter = packed & ((1 << COUNTER_BITS) - 1);
    // The builder keeps the low nibble of byte 0 and the low 6 bits of byte 2 (version and
    // variant take the others): the counter's 18 bits go exactly there.
    let mut bytes = [0u8; 10];
    bytes[0] = ((counter >> 14) & 0x0F) as u8;
    bytes[1] = ((counter >> 6) & 0xFF) as u8;
    bytes[2] = (counter & 0x3F) as u8;
    bytes[3..].copy_from_slice(salt);
    let uuid = uuid::Builder::from_unix_timestamp_millis(millis, &bytes).into_uuid();
    let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
    super::ShortText::from(&*uuid.hyphenated().encode_lower(&mut text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::receipts::ShortText;

    #[test]
    fn ids_are_v7_uuids_of_their_millisecond() {
        let now = SystemTime::now();
        let id = receipt_id(now);
        let uuid = uuid::Uuid::parse_str(&id).unwrap();
        assert_eq!(uuid.get_version_num(), 7);
        assert_eq!(uuid.get_variant(), uuid::Variant::RFC4122);
        let (secs, nanos) = uuid.get_timestamp().unwrap().to_unix();
        let millis = u128::from(secs) * 1000 + u128::from(nanos / 1_000_000);
        let expected = now.duration_since(UNIX_EPOCH).unwrap().as_millis();
        // Later only if other tests made more than 2^18 ids in this millisecond.
        assert!(
            millis >= expected && millis <= expected + 1,
            "{millis} {expected}"
        );
        assert_eq!(id, id.to_lowercase());
        assert_eq!(&uuid.as_bytes()[9..], &salt()[..], "the salt ends the id");
    }

    #[test]
    fn every_counter_value_survives_the_version_and_variant_bits() {
        let salt = [0xAB; 7];
        let mut seen = std::collections::BTreeSet::new();
        let base = 1_700_000_000_000u64 << COUNTER_BITS;
        for counter in 0..(1u64 << COUNTER_BITS) {
            let text = id_text(base + counter, &salt);
            assert!(seen.insert(text), "counter {counter} gave a repeated id");
        }
        // In order of the counter, as text too (ids are compared as strings by readers).
        let texts: Vec<&ShortText> = seen.iter().collect();
        assert_eq!(
            texts.first().map(|t| t.as_str()),
            Some(id_text(base, &salt).as_str())
        );
        assert_eq!(
            texts.last().map(|t| t.as_str()),
            Some(id_text(base + (1 << COUNTER_BITS) - 1, &salt).as_str())
        );
        // The next one carries into the milliseconds and still sorts after.
        assert!(id_text(base + (1 << COUNTER_BITS), &salt) > *texts[texts.len() - 1]);
    }

    #[test]
    fn a_full_millisecond_carries_into_the_next() {
        let last = AtomicU64::new(0);
        let first = next_packed(&last, 1000);
        assert_eq!(first, 1000 << COUNTER_BITS);
        last.store(
            (1000 << COUNTER_BITS) + (1 << COUNTER_BITS) - 1,
            Ordering::Relaxed,
        );
        assert_eq!(next_packed(&last, 1000), 1001 << COUNTER_BITS);
        // The clock catching up continues after it, not at its own counter 0 again.
        assert_eq!(next_packed(&last, 1001), (1001 << COUNTER_BITS) + 1);
        assert_eq!(next_packed(&last, 1002), 1002 << COUNTER_BITS);
    }

    #[test]
    fn ids_sort_in_the_order_made_even_when_the_clock_steps_back() {
        let now = SystemTime::now();
        let before = now - Duration::from_secs(3600);
        let ids = [
            receipt_id(now),
            receipt_id(now),
            receipt_id(before),
            receipt_id(before),
            receipt_id(now + Duration::from_millis(5)),
        ];
        for pair in ids.windows(2) {
            assert!(pair[0] < pair[1], "{} then {}", pair[0], pair[1]);
        }
    }

    #[test]
    fn threads_making_ids_at_once_never_repeat_one() {
        let now = SystemTime::now();
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(move || (0..20_000).map(|_| receipt_id(now)).collect::<Vec<_>>())
            })
            .collect();
        let mut all = std::collections::HashSet::new();
        for t in threads {
            let ids = t.join().unwrap();
            // Each thread's ids in its own order.
            assert!(ids.windows(2).all(|p| p[0] < p[1]));
            for id in ids {
                assert!(all.insert(id), "a repeated id");
            }
        }
        assert_eq!(all.len(), 80_000);
    }

    #[test]
    fn a_clock_before_1970_or_past_the_range_does_not_panic() {
        let _ = receipt_id(UNIX_EPOCH - Duration::from_secs(10));
        // Its own state: the process-wide one must stay in this century for other tests.
        let last = AtomicU64::new(0);
        assert_eq!(next_packed(&last, u64::MAX), MAX_MILLIS << COUNTER_BITS);
        assert_eq!(next_packed(&last, 5), (MAX_MILLIS << COUNTER_BITS) + 1);
        last.store(u64::MAX, Ordering::Relaxed);
        assert_eq!(
            next_packed(&last, u64::MAX),
            u64::MAX,
            "stops at the end, no wrap"
        );
    }
}
