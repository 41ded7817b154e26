//! Text cutting that never splits a UTF-8 sequence, and a bounded head+tail byte buffer
//! for streams whose interesting part is usually at the end.

/// The largest index `<= max` that is a char boundary of `s`.
pub fn floor_char_boundary(s: &str, max: usize) -> usize {
    if max >= s.len() {
        return s.len();
    }
    let mut i = max;
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The smallest index `>= min` that is a char boundary of `s`.
pub fn ceil_char_boundary(s: &str, min: usize) -> usize {
    if min >= s.len() {
        return s.len();
    }
    let mut i = min;
    while i < s.len() && !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

/// `s` cut to at most `max_bytes` bytes on a char boundary; `None` when it already fits.
pub fn truncate_to(s: &str, max_bytes: usize) -> Option<&str> {
    if s.len() <= max_bytes {
        None
    } else {
        Some(&s[..floor_char_boundary(s, max_bytes)])
    }
}

/// Keeps the first and last parts of `s` within `max_bytes` in all, with a marker in the
/// middle that says how much was left out. Returns `s` unchanged when it fits.
pub fn head_tail(s: &str, max_bytes: usize) -> String {
    if s.len() <= max_bytes {
        return s.to_string();
    }
    let marker_room = 80.min(max_bytes / 2);
    let budget = max_bytes.saturating_sub(marker_room);
    let head_end = floor_char_boundary(s, budget / 2);
    let tail_start = ceil_char_boundary(s, s.len() - (budget - budget / 2));
    let omitted = tail_start - head_end;
    format!(
        "{}\n[... {} bytes omitted ...]\n{}",
        &s[..head_end],
        omitted,
        &s[tail_start..]
    )
}

/// A count with its noun, plural unless it is one: `count(3, "file")` is "3 files",
/// `count(1, "file")` is "1 file". For nouns whose plural adds an "s".
pub fn count(n: impl Into<u64>, noun: &str) -> String {
    match n.into() {
        1 => format!("1 {noun}"),
        n => format!("{n} {noun}s"),
    }
}

/// A byte sink that keeps the first `cap/2` bytes and the last `cap/2` bytes of everything
/// written to it, so memory stays bounded whatever the producer prints.
#[derive(Debug)]
pub struct HeadTailBuffer {
    head: Vec<u8>,
    tail: std::collections::VecDeque<u8>,
    head_cap: usize,
    tail_cap: usize,
    total: u64,
}

impl HeadTailBuffer {
    /// A buffer that retains at most `cap` bytes.
    pub fn new(cap: usize) -> Self {
        let head_cap = cap / 2;
        Self {
            head: Vec::new(),
            tail: std::collections::VecDeque::new(),
            head_cap,
            tail_cap: cap - head_cap,
            total: 0,
        }
    }

    /// Appends bytes, discarding the middle once the buffer is full.
    pub fn push(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len() as u64;
        if self.head.len() < self.head_cap {
            let take = (self.head_cap - self.head.len()).min(bytes.len());
            self.head.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
        }
        if bytes.is_empty() || self.tail_cap == 0 {
            return;
        }
        if bytes.len() >= self.tail_cap {
            self.tail.clear();
            self.tail
                .extend(bytes[bytes.len() - self.tail_cap..].iter().copied());
            return;
        }
        let overflow = (self.tail.len() + bytes.len()).saturating_sub(self.tail_cap);
        self.tail.drain(..overflow);
        self.tail.extend(bytes.iter().copied());
    }

    /// Total bytes ever pushed.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Whether anything was discarded.
    pub fn truncated(&self) -> bool {
        self.total > (self.head.len() + self.tail.len()) as u64
    }

    /// The retained text (lossy UTF-8, cut on char boundaries) with an omission marker.
    pub fn render(&self) -> String {
        let head = String::from_utf8_lossy(&self.head);
        let tail_bytes: Vec<u8> = self.tail.iter().copied().collect();
        if !self.truncated() {
            let mut all = self.head.clone();
            all.extend_from_slice(&tail_bytes);
            return String::from_utf8_lossy(&all).into_owned();
        }
        // A multi-byte char may straddle either cut; drop partial sequences at the edges.
        let head = trim_partial_end(&head);
        let tail = String::from_utf8_lossy(skip_partial_start(&tail_bytes));
        let omitted = self.total - (self.head.len() + self.tail.len()) as u64;
        format!("{head}\n[... {omitted} bytes omitted ...]\n{tail}")
    }
}

fn trim_partial_end(s: &str) -> &str {
    s.strip_suffix('\u{FFFD}').unwrap_or(s)
}

fn skip_partial_start(bytes: &[u8]) -> &[u8] {
    let mut i = 0;
    // UTF-8 continuation bytes look like 0b10xxxxxx.
    while i < bytes.len() && i < 4 && (bytes[i] & 0b1100_0000) == 0b1000_0000 {
        i += 1;
    }
    &bytes[i..]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn truncate_never_splits_a_char() {
        let s = "héllo wörld ✓";
        for max in 0..s.len() + 2 {
            if let Some(cut) = truncate_to(s, max) {
                assert!(cut.len() <= max);
                assert!(s.starts_with(cut));
            }
        }
    }

    #[test]
    fn counts_are_plural_unless_one() {
        assert_eq!(count(1u32, "spec"), "1 spec");
        assert_eq!(count(0u32, "task"), "0 tasks");
        assert_eq!(count(u64::MAX, "byte"), format!("{} bytes", u64::MAX));
    }

    #[test]
    fn head_tail_keeps_both_ends() {
        let s = format!("START{}END", "x".repeat(10_000));
        let out = head_tail(&s, 200);
        assert!(out.starts_with("START"));
        assert!(out.ends_with("END"));
        assert!(out.contains("bytes omitted"));
        assert!(out.len() <= 260);
    }

    #[test]
    fn buffer_keeps_head_and_tail_and_counts_everything() {
        let mut b = HeadTailBuffer::new(10);
        for _ in 0..1000 {
            b.push(b"0123456789");
        }
        b.push(b"THE-END");
        assert_eq!(b.total(), 10_007);
        assert!(b.truncated());
        let r = b.render();
        assert!(r.starts_with("01234"));
        assert!(r.ends_with("E-END"), "{r}");
    }

    #[test]
    fn buffer_untruncated_is_exact() {
        let mut b = HeadTailBuffer::new(100);
        b.push("añb".as_bytes());
        b.push(b"c");
        assert!(!b.truncated());
        assert_eq!(b.render(), "añbc");
    }

    proptest! {
        #[test]
        fn head_tail_is_valid_and_bounded(s in "\\PC{0,300}", max in 0usize..400) {
            let out = head_tail(&s, max);
            if s.len() <= max { prop_assert_eq!(out, s); }
            else { prop_assert!(out.len() <= max + 60); }
        }

        #[test]
        fn buffer_render_never_panics(chunks in proptest::collection::vec("\\PC{0,40}", 0..40), cap in 0usize..64) {
            let mut b = HeadTailBuffer::new(cap);
            let mut total = 0;
            for c in &chunks { b.push(c.as_bytes()); total += c.len(); }
            prop_assert_eq!(b.total(), total as u64);
            let _ = b.render();
        }
    }
}
