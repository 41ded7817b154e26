//! [`ShortText`]: the text of a receipt's short fields (its id, date and hashes), kept in
//! place when it fits.
//!
//! A receipt is made for every tool call, and its id (36 bytes), date (24) and two hashes
//! (71 each) were four heap strings: four allocations of the seven that making a receipt
//! cost, on the path of every call (bench query, `tool, receipt made`). Texts that fit are
//! kept in the receipt itself; a longer one (a receipt read from a log can say anything) is
//! kept on the heap, so nothing read is refused or cut.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The longest text kept in place: a `sha256:` hash.
const INLINE: usize = 71;

/// A text of a receipt's short fields; reads as a `str` (see the module doc).
#[derive(Clone)]
pub struct ShortText(Repr);

#[derive(Clone)]
enum Repr {
    /// `bytes[..len]` is the text (always whole UTF-8: copied from a `str`).
    Inline {
        len: u8,
        bytes: [u8; INLINE],
    },
    Heap(Box<str>),
}

impl ShortText {
    /// The text.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Inline { len, bytes } => {
                // Copied whole from a `str` (`From<&str>`), so never the empty fallback.
                std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or_default()
            }
            Repr::Heap(text) => text,
        }
    }
}

impl From<&str> for ShortText {
    fn from(text: &str) -> Self {
        match u8::try_from(text.len()) {
            Ok(len) if text.len() <= INLINE => {
                let mut bytes = [0u8; INLINE];
                bytes[..text.len()].copy_from_slice(text.as_bytes());
                ShortText(Repr::Inline { len, bytes })
            }
            _ => ShortText(Repr::Heap(text.into())),
        }
    }
}

impl From<String> for ShortText {
    fn from(text: String) -> Self {
        if text.len() <= INLINE {
            ShortText::from(text.as_str())
        } else {
            ShortText(Repr::Heap(text.into_boxed_str()))
        }
    }
}

impl Default for ShortText {
    fn default() -> Self {
        ShortText::from("")
    }
}

impl Deref for ShortText {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for ShortText {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl Borrow<str> for ShortText {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Debug for ShortText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for ShortText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq for ShortText {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for ShortText {}

impl PartialEq<str> for ShortText {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for ShortText {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for ShortText {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialEq<ShortText> for str {
    fn eq(&self, other: &ShortText) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<ShortText> for &str {
    fn eq(&self, other: &ShortText) -> bool {
        *self == other.as_str()
    }
}

impl PartialEq<ShortText> for String {
    fn eq(&self, other: &ShortText) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialOrd for ShortText {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ShortText {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl Hash for ShortText {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl Serialize for ShortText {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ShortText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = ShortText;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<ShortText, E> {
                Ok(ShortText::from(text))
            }

            fn visit_string<E: serde::de::Error>(self, text: String) -> Result<ShortText, E> {
                Ok(ShortText::from(text))
            }
        }
        deserializer.deserialize_str(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_long_texts_read_back_as_they_were_given() {
        let hash = format!("sha256:{}", "ab".repeat(32));
        assert_eq!(hash.len(), INLINE);
        let long = "x".repeat(INLINE + 1);
        let multibyte = "é".repeat(35); // 70 bytes, kept in place
        for text in ["", "2026-11-26T18:00:00.000Z", &hash, &long, &multibyte] {
            let kept = ShortText::from(text);
            assert_eq!(kept.as_str(), text);
            assert_eq!(ShortText::from(text.to_string()), kept);
            assert_eq!(kept, text);
            assert_eq!(format!("{kept}"), text);
            assert_eq!(format!("{kept:?}"), format!("{text:?}"));
        }
        assert!(matches!(
            ShortText::from(hash.as_str()).0,
            Repr::Inline { .. }
        ));
        assert!(matches!(ShortText::from(long.as_str()).0, Repr::Heap(_)));
    }

    #[test]
    fn it_is_written_and_read_as_a_json_string_of_any_length() {
        let long = "y".repeat(500);
        for text in ["0196f1c2-0000-7000-8000-000000000000", long.as_str()] {
            let json = serde_json::to_string(&ShortText::from(text)).unwrap();
            assert_eq!(json, serde_json::to_string(text).unwrap());
            let back: ShortText = serde_json::from_str(&json).unwrap();
            assert_eq!(back, text);
            // Also through a buffered `Value`, as records are read.
            let value: ShortText = serde_json::from_value(serde_json::json!(text)).unwrap();
            assert_eq!(value, text);
        }
        assert!(serde_json::from_str::<ShortText>("7").is_err());
    }

    #[test]
    fn texts_order_as_strings() {
        let (a, b) = (ShortText::from("a"), ShortText::from("b".repeat(100)));
        assert!(a < b);
        assert_eq!(a.cmp(&a.clone()), std::cmp::Ordering::Equal);
    }
}
