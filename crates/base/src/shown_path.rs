//! How a path is written for a model, and read back from one.
//!
//! File names are bytes. A name holding a newline would split a listing into fake result
//! lines, and a name that is not UTF-8 can be listed (lossily) but never named again in a
//! JSON string; a name holding `:12:` could forge a grep match, and invisible characters
//! (bidi controls, line separators) can disguise a name. So each name (path component) whose
//! text is not plain is shown as an *escaped name*: between double quotes, with `\\`, `\"`, `\n`, `\r`, `\t` and `\xNN` (any
//! other control byte, and every byte that is not part of valid UTF-8). Plain names are
//! shown as they are: `src/"a\nb.rs"` is the file `a<newline>b.rs` in `src`.
//!
//! A component of a path the model gives that starts and ends with `"` is read as an escaped
//! name (so what a listing shows can be passed back exactly, alone or after its directory);
//! one that looks like it but does not parse is refused with the reason. A name starting
//! with `"` is therefore always shown escaped, so that the two readings never meet.

use std::borrow::Cow;
use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};

/// `path` as shown to a model: each of its names as it is when plain, else escaped.
pub fn show(path: &OsStr) -> Cow<'_, str> {
    let bytes = path.as_bytes();
    if let Ok(text) = std::str::from_utf8(bytes)
        && text.split('/').all(is_plain)
    {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    for (i, name) in bytes.split(|&b| b == b'/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        match std::str::from_utf8(name) {
            Ok(text) if is_plain(text) => out.push_str(text),
            _ => out.push_str(&escape(name)),
        }
    }
    Cow::Owned(out)
}

/// Whether the name `text` can be shown without escaping: not starting with `"`, without
/// `:` (grep prints `path:line:text`, so a name holding `:12:` could forge a match), and
/// without characters that break or disguise a line ([`needs_escape`]).
fn is_plain(text: &str) -> bool {
    !text.starts_with('"') && !text.contains(':') && !text.chars().any(needs_escape)
}

/// Characters a name never shows raw: control characters, and the invisible ones that end a
/// line for some readers (U+2028, U+2029) or reorder or hide text (bidi controls, zero-width
/// characters, the byte order mark).
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061C}'
                | '\u{180E}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{206F}'
                | '\u{FEFF}'
        )
}

/// The escaped form of `bytes`, quotes included.
fn escape(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() + 2);
    out.push('"');
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c if needs_escape(c) && c.is_ascii() => {
                    let _ = write!(out, "\\x{:02x}", c as u32);
                }
                c if needs_escape(c) => {
                    // Beyond ASCII (C1 controls, invisible characters): its UTF-8 bytes,
                    // escaped, so that the form reads back as the same bytes.
                    let mut buf = [0u8; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        let _ = write!(out, "\\x{b:02x}");
                    }
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out.push('"');
    out
}

/// Why an escaped name in a path is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EscapedNameError {
    /// `""`: names no file.
    #[error("the escaped name \"\" is empty")]
    Empty,
    /// The bytes would name more than one component (or hold NUL).
    #[error(
        "in {name}: a name cannot hold '/' or NUL (write the path's separators outside the quotes)"
    )]
    HoldsSeparator {
        /// The escaped form, quotes included.
        name: String,
    },
    /// The bytes are `.` or `..`.
    #[error("in {name}: '.' and '..' are not names; write them without quotes")]
    DotName {
        /// The escaped form, quotes included.
        name: String,
    },
    /// The escaped form does not parse.
    #[error("in {name}: {why}")]
    Malformed {
        /// The escaped form, quotes included.
        name: String,
        /// What is wrong inside the quotes.
        why: Malformed,
    },
}

/// What is wrong inside the quotes of an escaped name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    /// `\/`.
    #[error("a name cannot hold '/'")]
    EscapedSlash,
    /// `\x` without two hex digits.
    #[error("'\\x' at byte {at} must be followed by two hex digits")]
    BadHex {
        /// Byte offset of the backslash inside the quotes.
        at: usize,
    },
    /// A backslash before anything but the escapes listed.
    #[error("unknown escape '\\{escape}' at byte {at} (use \\\\ \\\" \\n \\r \\t or \\xNN)")]
    UnknownEscape {
        /// The character after the backslash.
        escape: char,
        /// Byte offset of the backslash inside the quotes.
        at: usize,
    },
    /// The form ends in the middle of an escape.
    #[error("the escaped form ends with a lone '\\'")]
    LoneBackslash,
    /// A `"` that is not escaped.
    #[error("an unescaped '\"' at byte {at} (write it as \\\" inside the quotes)")]
    UnescapedQuote {
        /// Byte offset of the quote inside the quotes.
        at: usize,
    },
}

/// Reads a path the model gave: `None` when no name in it is escaped (use it as it is),
/// `Some(Ok(bytes))` when its escaped names are well formed, `Some(Err(why))` when one is
/// broken.
pub fn parse(input: &str) -> Option<Result<OsString, EscapedNameError>> {
    let escaped = |name: &str| name.len() >= 2 && name.starts_with('"') && name.ends_with('"');
    if !input.split('/').any(escaped) {
        return None;
    }
    let mut out = Vec::with_capacity(input.len());
    for (i, name) in input.split('/').enumerate() {
        if i > 0 {
            out.push(b'/');
        }
        if escaped(name) {
            match unescape(&name[1..name.len() - 1]) {
                Ok(bytes) if bytes.is_empty() => return Some(Err(EscapedNameError::Empty)),
                // An escape names one file, never a path: no `/`, no NUL, not `.` or `..`.
                Ok(bytes) if bytes.contains(&b'/') || bytes.contains(&0) => {
                    return Some(Err(EscapedNameError::HoldsSeparator {
                        name: name.to_string(),
                    }));
                }
                Ok(bytes) if bytes == b"." || bytes == b".." => {
                    return Some(Err(EscapedNameError::DotName {
                        name: name.to_string(),
                    }));
                }
                Ok(bytes) => out.extend_from_slice(&bytes),
                Err(why) => {
                    return Some(Err(EscapedNameError::Malformed {
                        name: name.to_string(),
                        why,
                    }));
                }
            }
        } else {
            out.extend_from_slice(name.as_bytes());
        }
    }
    Some(Ok(OsString::from_vec(out)))
}

/// The bytes of the inside of an escaped form.
fn unescape(inner: &str) -> Result<Vec<u8>, Malformed> {
    let mut out = Vec::with_capacity(inner.len());
    let mut chars = inner.char_indices();
    while let Some((at, c)) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some((_, '\\')) => out.push(b'\\'),
                Some((_, '"')) => out.push(b'"'),
                Some((_, 'n')) => out.push(b'\n'),
                Some((_, 'r')) => out.push(b'\r'),
                Some((_, 't')) => out.push(b'\t'),
                Some((_, '/')) => return Err(Malformed::EscapedSlash),
                Some((_, 'x')) => {
                    let hex: String = chars.by_ref().take(2).map(|(_, h)| h).collect();
                    let byte = (hex.len() == 2)
                        .then(|| u8::from_str_radix(&hex, 16).ok())
                        .flatten()
                        .ok_or(Malformed::BadHex { at })?;
                    out.push(byte);
                }
                Some((_, escape)) => return Err(Malformed::UnknownEscape { escape, at }),
                None => return Err(Malformed::LoneBackslash),
            },
            '"' => return Err(Malformed::UnescapedQuote { at }),
            c => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn plain_paths_are_shown_as_they_are() {
        for p in [
            "src/lib.rs",
            "a b/ü.txt",
            "with\\backslash",
            "quote\"inside",
        ] {
            assert_eq!(show(OsStr::new(p)), p);
            assert_eq!(parse(p), None);
        }
    }

    #[test]
    fn names_that_would_break_a_listing_are_escaped() {
        assert_eq!(show(OsStr::new("a\nb.txt")), "\"a\\nb.txt\"");
        assert_eq!(show(OsStr::new("tab\there")), "\"tab\\there\"");
        assert_eq!(show(OsStr::from_bytes(b"bad\xffname")), "\"bad\\xffname\"");
        assert_eq!(show(OsStr::new("\"quoted\"")), "\"\\\"quoted\\\"\"");
        assert_eq!(show(OsStr::new("bell\x07\\")), "\"bell\\x07\\\\\"");
        assert_eq!(show(OsStr::new("src/a\nb/c.rs")), "src/\"a\\nb\"/c.rs");
    }

    #[test]
    fn escaped_names_read_back_alone_or_after_their_directory() {
        let read = |p: &str| parse(p).unwrap().unwrap();
        assert_eq!(read("\"a\\nb\""), OsStr::new("a\nb"));
        assert_eq!(read("src/\"a\\nb\"/c.rs"), OsStr::new("src/a\nb/c.rs"));
        assert_eq!(read("\"bad\\xffname\""), OsStr::from_bytes(b"bad\xffname"));
    }

    #[test]
    fn names_that_could_forge_or_hide_text_are_escaped() {
        assert_eq!(show(OsStr::new("x:99:FAKE.rs")), "\"x:99:FAKE.rs\"");
        assert_eq!(show(OsStr::new("a\u{2028}b")), "\"a\\xe2\\x80\\xa8b\"");
        assert_eq!(
            show(OsStr::new("evil\u{202E}sr.exe")),
            "\"evil\\xe2\\x80\\xaesr.exe\""
        );
        assert_eq!(show(OsStr::new("ü and 日本.txt")), "ü and 日本.txt");
    }

    #[test]
    fn broken_escaped_forms_are_refused_with_the_reason() {
        for (bad, why) in [
            ("\"a\\q\"", "unknown escape"),
            ("\"a\\x4\"", "two hex digits"),
            ("\"a\\xzz\"", "two hex digits"),
            ("\"a\"b\"", "unescaped"),
            ("\"a\\\"", "lone"),
            ("d/\"\"", "empty"),
            ("\"a\\x2fb\"", "cannot hold '/'"),
            ("\"a\\x00\"", "cannot hold '/' or NUL"),
            ("\"\\x2e\\x2e\"/etc", "not names"),
            ("\"\\x2e\"", "not names"),
        ] {
            let err = parse(bad).unwrap().unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn refusals_say_exactly_what_is_wrong() {
        for (bad, message) in [
            (
                r#""a\q""#,
                r#"in "a\q": unknown escape '\q' at byte 1 (use \\ \" \n \r \t or \xNN)"#,
            ),
            (
                r#""a\x4""#,
                r#"in "a\x4": '\x' at byte 1 must be followed by two hex digits"#,
            ),
            (
                r#""a"b""#,
                r#"in "a"b": an unescaped '"' at byte 1 (write it as \" inside the quotes)"#,
            ),
            (
                r#""a\""#,
                r#"in "a\": the escaped form ends with a lone '\'"#,
            ),
            (r#"d/"""#, r#"the escaped name "" is empty"#),
            (
                r#""a\x2fb""#,
                r#"in "a\x2fb": a name cannot hold '/' or NUL (write the path's separators outside the quotes)"#,
            ),
            (
                r#""\x2e""#,
                r#"in "\x2e": '.' and '..' are not names; write them without quotes"#,
            ),
        ] {
            let err = parse(bad).unwrap().unwrap_err();
            assert_eq!(err.to_string(), message, "{bad}");
        }
        assert_eq!(
            parse(r#"x/"a\q""#).unwrap().unwrap_err(),
            EscapedNameError::Malformed {
                name: r#""a\q""#.to_string(),
                why: Malformed::UnknownEscape { escape: 'q', at: 1 },
            }
        );
    }

    proptest! {
        #[test]
        fn every_path_shown_reads_back_as_itself(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            // Paths as the tools show them: names of real files (no NUL; not empty, `.` or
            // `..`).
            let bytes: Vec<u8> = bytes.into_iter().filter(|&b| b != 0).collect();
            let joined: Vec<&[u8]> = bytes
                .split(|&b| b == b'/')
                .filter(|n| !n.is_empty() && *n != b"." && *n != b"..")
                .collect();
            let bytes = joined.join(&b'/');
            let name = OsStr::from_bytes(&bytes);
            let shown = show(name);
            prop_assert!(!shown.contains('\n') && !shown.contains('\r'));
            match parse(&shown) {
                Some(parsed) => prop_assert_eq!(parsed.unwrap(), name.to_os_string()),
                None => prop_assert_eq!(shown.as_bytes(), &bytes[..]),
            }
        }
    }
}
