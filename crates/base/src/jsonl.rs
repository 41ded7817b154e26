//! The one tolerant reader of JSONL files (one JSON value a line): the run record's events
//! and transcripts, and the receipt logs.
//!
//! Those files are append-only and each line is one write, so a crash can leave the last
//! line torn, and a hand edit can break any line. A reader therefore keeps every line that
//! parses and reports each other one with its 1-based line number and why (a torn last line
//! is named as such), instead of failing the whole file. Blank lines are skipped but counted,
//! so the numbers are the ones an editor shows. Lines are read one at a time: memory stays
//! bounded by the longest line (plus what the caller keeps).

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

/// What reading a JSONL file found.
#[derive(Debug)]
pub struct JsonlRead<T> {
    /// The lines that parsed, in file order.
    pub items: Vec<T>,
    /// Lines that did not: (1-based line number, what was wrong). A line torn by a crash
    /// (the last one, without its newline) shows up here.
    pub bad_lines: Vec<(usize, String)>,
}

impl<T> Default for JsonlRead<T> {
    fn default() -> Self {
        JsonlRead {
            items: Vec::new(),
            bad_lines: Vec::new(),
        }
    }
}

/// The file could not be opened or read (as opposed to a line of it being bad). The I/O
/// error is shown in the message, so it is not also given as `source()`.
#[derive(Debug, thiserror::Error)]
#[error("cannot read {}: {error}", .path.display())]
pub struct ReadError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    pub error: std::io::Error,
}

impl ReadError {
    /// Whether the file does not exist (a log not written yet, say).
    pub fn is_not_found(&self) -> bool {
        self.error.kind() == std::io::ErrorKind::NotFound
    }
}

/// Why one line was not read.
#[derive(Debug, thiserror::Error)]
pub enum BadLine {
    /// A whole line that is not the JSON expected.
    #[error("invalid line: {0}")]
    Invalid(serde_json::Error),
    /// The last line, without its newline, that does not parse: the writer stopped in the
    /// middle of it.
    #[error("incomplete last line (the writer stopped in the middle of it): {0}")]
    Incomplete(serde_json::Error),
}

/// Calls `each` with every non-blank line of the JSONL file at `path`, parsed, in order:
/// (1-based line number, the value or why the line is unreadable).
pub fn for_each<T: DeserializeOwned>(
    path: &Path,
    mut each: impl FnMut(usize, Result<T, BadLine>),
) -> Result<(), ReadError> {
    let failed = |error| ReadError {
        path: path.to_path_buf(),
        error,
    };
    let mut reader = BufReader::new(File::open(path).map_err(failed)?);
    let mut line = Vec::new();
    let mut number = 0usize;
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line).map_err(failed)? == 0 {
            return Ok(());
        }
        number = number.saturating_add(1);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let complete = line.last() == Some(&b'\n');
        let parsed = serde_json::from_slice::<T>(&line).map_err(|e| {
            if complete {
                BadLine::Invalid(e)
            } else {
                BadLine::Incomplete(e)
            }
        });
        each(number, parsed);
    }
}

/// Reads a whole JSONL file, keeping the lines that parse and reporting the others.
pub fn read<T: DeserializeOwned>(path: &Path) -> Result<JsonlRead<T>, ReadError> {
    let mut out = JsonlRead::default();
    for_each(path, |number, parsed| match parsed {
        Ok(item) => out.items.push(item),
        Err(why) => out.bad_lines.push((number, why.to_string())),
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Deserialize)]
    struct Entry {
        n: u32,
    }

    fn file(content: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        std::fs::write(&path, content).unwrap();
        (dir, path)
    }

    #[test]
    fn good_lines_are_kept_and_bad_ones_reported_by_number() {
        let (_dir, path) =
            file(b"{\"n\":1}\n\n  \n{\"n\":\"two\"}\nnot json\n{\"n\":3}\r\n{\"n\":");
        let read = read::<Entry>(&path).unwrap();
        assert_eq!(read.items, vec![Entry { n: 1 }, Entry { n: 3 }]);
        let numbers: Vec<usize> = read.bad_lines.iter().map(|(n, _)| *n).collect();
        // Blank lines 2 and 3 are skipped but counted.
        assert_eq!(numbers, vec![4, 5, 7]);
        assert!(
            read.bad_lines[0].1.starts_with("invalid line: "),
            "{:?}",
            read.bad_lines
        );
        assert!(read.bad_lines[1].1.starts_with("invalid line: "));
        assert!(
            read.bad_lines[2]
                .1
                .starts_with("incomplete last line (the writer stopped in the middle of it): "),
            "{:?}",
            read.bad_lines
        );
    }

    #[test]
    fn a_bad_complete_last_line_is_invalid_not_torn() {
        let (_dir, path) = file(b"{\"n\":1}\n{oops}\n");
        let mut seen = Vec::new();
        for_each::<Entry>(&path, |n, parsed| seen.push((n, parsed))).unwrap();
        assert!(matches!(seen[0], (1, Ok(Entry { n: 1 }))));
        assert!(matches!(seen[1], (2, Err(BadLine::Invalid(_)))));
        assert_eq!(seen.len(), 2);
    }

    #[test]
    fn bytes_that_are_not_utf8_spoil_only_their_line() {
        let (_dir, path) = file(b"{\"n\":1}\n\"\xff\xfe\"\n{\"n\":2}\n");
        let read = read::<Entry>(&path).unwrap();
        assert_eq!(read.items, vec![Entry { n: 1 }, Entry { n: 2 }]);
        assert_eq!(read.bad_lines.len(), 1);
        assert_eq!(read.bad_lines[0].0, 2);
    }

    #[test]
    fn an_empty_file_has_no_lines() {
        let (_dir, path) = file(b"");
        let read = read::<Entry>(&path).unwrap();
        assert!(read.items.is_empty() && read.bad_lines.is_empty());
    }

    #[test]
    fn a_missing_file_is_an_error_that_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("none.jsonl");
        let err = read::<Entry>(&path).unwrap_err();
        assert!(err.is_not_found());
        assert_eq!(err.path, path);
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("cannot read {}: ", path.display())),
            "{text}"
        );
        // A directory opens but cannot be read: an error too, and not "not found".
        let err = read::<Entry>(dir.path()).unwrap_err();
        assert!(!err.is_not_found(), "{err}");
    }
}
