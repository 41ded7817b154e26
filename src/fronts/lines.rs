//! Line framing with a length cap for the two stdin fronts (`tool exec` and `mcp`).
//!
//! Both protocols are one JSON document per line. Reading a line as a `String` has two
//! failure modes that a hostile or broken caller can trigger: one invalid UTF-8 byte makes
//! the read an I/O error (the stream ends with no answer), and a line without a newline grows
//! the buffer without bound. This reader returns raw bytes (the caller decides what a bad
//! byte means for its protocol) and never holds more than [`MAX_LINE_BYTES`] of one line:
//! the rest of an over-long line is read and dropped in `fill_buf`-sized chunks, keeping only
//! its first [`KEPT_HEAD_BYTES`] so that the caller can still find the request's id.

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// The longest request line either stdin front accepts: 16 MiB, newline excluded. The same
/// figure as rmcp's own stdio cap, so a message either front accepts is accepted by both.
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// How much of an over-long line is kept for the caller to find the request's id in. An id
/// written before a large `input` is found; one written after it is not.
pub const KEPT_HEAD_BYTES: usize = 64 * 1024;

/// Buffer size for reading stdin: large enough that an over-long line is discarded in few
/// reads, small next to the line cap.
pub const READ_BUFFER_BYTES: usize = 64 * 1024;

/// One line read from the input.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A whole line, without its `\n` (or `\r\n`); at most the reader's cap.
    Complete(Vec<u8>),
    /// A line longer than the cap. It has been read to its end and dropped.
    TooLong {
        /// The first [`KEPT_HEAD_BYTES`] of the line (fewer if the cap is smaller).
        head: Vec<u8>,
        /// The line's length in bytes, newline excluded.
        len: u64,
    },
}

/// Reads lines of at most `max` bytes from `input`; see the module documentation.
pub struct LineReader<R> {
    input: R,
    max: usize,
}

impl<R: AsyncBufRead + Unpin> LineReader<R> {
    /// A reader that refuses lines longer than `max` bytes.
    pub fn new(input: R, max: usize) -> Self {
        Self { input, max }
    }

    /// The next line, or `None` at the end of the input. A last line without a newline is
    /// still returned. Only I/O errors of the input are errors; bad bytes are the caller's.
    ///
    /// Not cancel-safe: a dropped call loses the part of the line read so far. Both fronts
    /// await it to completion (the MCP front in a task of its own).
    pub async fn next_line(&mut self) -> std::io::Result<Option<Line>> {
        let mut kept: Vec<u8> = Vec::new();
        let mut len: u64 = 0;
        let mut over = false;
        let mut read_any = false;
        loop {
            let available = self.input.fill_buf().await?;
            if available.is_empty() {
                if !read_any {
                    return Ok(None);
                }
                break;
            }
            read_any = true;
            let newline = available.iter().position(|&b| b == b'\n');
            let content = &available[..newline.unwrap_or(available.len())];
            len = len.saturating_add(content.len() as u64);
            if !over && kept.len().saturating_add(content.len()) > self.max {
                // From here on nothing more is stored: drop what the cap allowed beyond the
                // head, and give the memory back.
                over = true;
                let head = KEPT_HEAD_BYTES.min(self.max);
                if kept.len() < head {
                    let missing = (head - kept.len()).min(content.len());
                    kept.extend_from_slice(&content[..missing]);
                }
                kept.truncate(head);
                kept.shrink_to_fit();
            } else if !over {
                kept.extend_from_slice(content);
            }
            let consumed = newline.map_or(available.len(), |i| i + 1);
            self.input.consume(consumed);
            if newline.is_some() {
                break;
            }
        }
        if over {
            return Ok(Some(Line::TooLong { head: kept, len }));
        }
        if kept.last() == Some(&b'\r') {
            kept.pop();
        }
        Ok(Some(Line::Complete(kept)))
    }
}

/// Lines (no newline in them) made of request-like fragments, bad bytes and anything else,
/// for the property tests of both fronts.
#[cfg(test)]
pub(crate) fn hostile_line() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
    use proptest::prelude::*;
    const FRAGMENTS: &[&[u8]] = &[
        b"{",
        b"}",
        b"[",
        b"]",
        b",",
        b":",
        b"\"",
        b"\\",
        b" ",
        b"\r",
        b"7",
        b"null",
        b"\"id\"",
        b"\"x\"",
        b"\"name\"",
        b"\"glob\"",
        b"\"input\"",
        b"{\"pattern\":\"*\"}",
        b"\"jsonrpc\"",
        b"\"2.0\"",
        b"\"method\"",
        b"\"tools/list\"",
        b"\"params\"",
        b"\"result\"",
        b"\\u00e9",
        b"\xff",
        b"\xc3",
        b"\xef\xbb\xbf",
    ];
    let part = prop_oneof![
        proptest::sample::select(FRAGMENTS).prop_map(<[u8]>::to_vec),
        any::<u8>()
            .prop_filter("no newline", |b| *b != b'\n')
            .prop_map(|b| vec![b]),
    ];
    proptest::collection::vec(part, 0..24).prop_map(|parts| parts.concat())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every line of `input`, read through a buffer of `capacity` bytes so that lines cross
    /// `fill_buf` boundaries.
    async fn lines(input: &[u8], capacity: usize, max: usize) -> Vec<Line> {
        let reader = tokio::io::BufReader::with_capacity(capacity, input);
        let mut lines = LineReader::new(reader, max);
        let mut out = Vec::new();
        while let Some(line) = lines.next_line().await.unwrap() {
            out.push(line);
        }
        out
    }

    fn complete(s: &[u8]) -> Line {
        Line::Complete(s.to_vec())
    }

    #[tokio::test]
    async fn splits_on_newlines_across_buffer_boundaries() {
        for capacity in [1, 2, 3, 7, 64] {
            let got = lines(b"one\r\ntwo\n\n\xff\xfe\nlast", capacity, 100).await;
            assert_eq!(
                got,
                [
                    complete(b"one"),
                    complete(b"two"),
                    complete(b""),
                    complete(b"\xff\xfe"),
                    complete(b"last"),
                ],
                "capacity {capacity}"
            );
        }
    }

    #[tokio::test]
    async fn a_line_of_exactly_the_cap_is_complete_and_one_more_byte_is_too_long() {
        for capacity in [1, 4, 64] {
            let got = lines(b"abcd\nabcde\nok\n", capacity, 4).await;
            assert_eq!(
                got,
                [
                    complete(b"abcd"),
                    Line::TooLong {
                        head: b"abcd".to_vec(),
                        len: 5
                    },
                    complete(b"ok"),
                ],
                "capacity {capacity}"
            );
        }
    }

    #[tokio::test]
    async fn an_over_long_line_keeps_only_its_head_and_counts_every_byte() {
        let mut input = vec![b'x'; KEPT_HEAD_BYTES * 3 + 17];
        input[0] = b'{';
        input.extend_from_slice(b"\nnext\n");
        let got = lines(&input, 1000, KEPT_HEAD_BYTES * 2).await;
        let [Line::TooLong { head, len }, next] = &got[..] else {
            panic!("{got:?}");
        };
        assert_eq!(*len, (KEPT_HEAD_BYTES * 3 + 17) as u64);
        assert_eq!(head.len(), KEPT_HEAD_BYTES);
        assert_eq!(head[0], b'{');
        assert!(head.capacity() <= KEPT_HEAD_BYTES, "{}", head.capacity());
        assert_eq!(*next, complete(b"next"));
    }

    #[tokio::test]
    async fn an_over_long_last_line_without_newline_is_reported() {
        let got = lines(b"ok\n123456789", 3, 4).await;
        assert_eq!(
            got,
            [
                complete(b"ok"),
                Line::TooLong {
                    head: b"1234".to_vec(),
                    len: 9
                }
            ]
        );
    }

    #[tokio::test]
    async fn empty_input_has_no_lines() {
        assert!(lines(b"", 8, 8).await.is_empty());
        assert_eq!(lines(b"\n", 8, 8).await, [complete(b"")]);
    }
}
