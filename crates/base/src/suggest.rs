//! "Did you mean" suggestions for names given by users and models.

/// The candidate closest to `wrong` by edit distance, when it is close enough to be a typo.
pub fn closest<'a>(wrong: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (wrong.chars().count() / 3).max(2);
    candidates
        .into_iter()
        .map(|c| (strsim::damerau_levenshtein(wrong, c), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Adds "did you mean" to serde's "unknown field `x`, expected one of `a`, `b`" messages
/// (and to its "unknown variant `x`, ..." ones, a value not among those allowed), and drops
/// the trailing "at line L column C" that the caller already shows as a prefix.
pub fn serde_with_suggestion(message: &str) -> String {
    let message = match message.rfind(" at line ") {
        Some(i) => &message[..i],
        None => message,
    };
    let Some((start, marker)) = ["unknown field `", "unknown variant `"]
        .into_iter()
        .find_map(|marker| message.find(marker).map(|i| (i, marker)))
    else {
        return message.to_string();
    };
    let rest = &message[start + marker.len()..];
    let Some((wrong, tail)) = rest.split_once('`') else {
        return message.to_string();
    };
    let expected: Vec<&str> = tail.split('`').skip(1).step_by(2).collect();
    match closest(wrong, expected.iter().copied()) {
        Some(s) => format!("{message} (did you mean `{s}`?)"),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_typos_and_ignores_strangers() {
        let names = ["read_file", "grep", "glob"];
        assert_eq!(closest("raed_file", names), Some("read_file"));
        assert_eq!(closest("gerp", names), Some("grep"));
        assert_eq!(closest("completely_else", names), None);
    }

    #[test]
    fn unknown_fields_and_values_get_a_suggestion() {
        assert_eq!(
            serde_with_suggestion(
                "llm: unknown field `modle`, expected one of `model`, `script` at line 2 column 3"
            ),
            "llm: unknown field `modle`, expected one of `model`, `script` (did you mean `model`?)"
        );
        assert_eq!(
            serde_with_suggestion(
                "llm.tool-choice: unknown variant `requierd`, expected one of `auto`, `required`, `none`, `omit`"
            ),
            "llm.tool-choice: unknown variant `requierd`, expected one of `auto`, `required`, \
             `none`, `omit` (did you mean `required`?)"
        );
        assert_eq!(
            serde_with_suggestion("unknown variant `zzzzzz`, expected `auto` or `none`"),
            "unknown variant `zzzzzz`, expected `auto` or `none`"
        );
    }
}
