//! Reading the run record's JSONL files a line at a time without ever holding more than a
//! cap of one line: a hostile or damaged file may hold a line of any length.

use std::io::BufRead;

/// One line read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// Its bytes (without the newline), at most the cap; empty when it was longer.
    pub bytes: Vec<u8>,
    /// Its whole length, without the newline.
    pub len: u64,
    /// Whether a newline ended it (a last line without one may still be growing).
    pub complete: bool,
}

impl Line {
    /// Whether it was longer than the cap (its bytes were not kept).
    pub fn too_long(&self, cap: usize) -> bool {
        usize::try_from(self.len).map_or(true, |n| n > cap)
    }

    /// Its length with the newline, when it had one: how far the file was read.
    pub fn consumed(&self) -> u64 {
        self.len.saturating_add(u64::from(self.complete))
    }
}

/// The next line of `reader`, keeping at most `cap` bytes of it (a longer line is read to
/// its end and returned empty, with its length); `None` at the end of the input.
pub fn read_line(reader: &mut impl BufRead, cap: usize) -> std::io::Result<Option<Line>> {
    let mut bytes = Vec::new();
    let mut len: u64 = 0;
    let mut over = false;
    loop {
        let chunk = match reader.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            if len == 0 {
                return Ok(None);
            }
            return Ok(Some(Line {
                bytes: if over { Vec::new() } else { bytes },
                len,
                complete: false,
            }));
        }
        let (part, ended) = match chunk.iter().position(|b| *b == b'\n') {
            Some(i) => (&chunk[..i], true),
            None => (chunk, false),
        };
        len = len.saturating_add(part.len() as u64);
        if !over {
            if bytes.len() + part.len() > cap {
                over = true;
                bytes = Vec::new();
            } else {
                bytes.extend_from_slice(part);
            }
        }
        let used = part.len() + usize::from(ended);
        reader.consume(used);
        if ended {
            return Ok(Some(Line {
                bytes: if over { Vec::new() } else { bytes },
                len,
                complete: true,
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_capped_and_the_last_may_be_torn() {
        let text = format!("ab\n{}\ncd", "x".repeat(100));
        let mut r = std::io::BufReader::with_capacity(7, text.as_bytes());
        let a = read_line(&mut r, 10).unwrap().unwrap();
        assert_eq!(
            (a.bytes.as_slice(), a.len, a.complete),
            (&b"ab"[..], 2, true)
        );
        let long = read_line(&mut r, 10).unwrap().unwrap();
        assert!(long.bytes.is_empty() && long.len == 100 && long.complete);
        assert!(long.too_long(10));
        let torn = read_line(&mut r, 10).unwrap().unwrap();
        assert_eq!((torn.bytes.as_slice(), torn.complete), (&b"cd"[..], false));
        assert_eq!(torn.consumed(), 2);
        assert_eq!(read_line(&mut r, 10).unwrap(), None);
    }
}
