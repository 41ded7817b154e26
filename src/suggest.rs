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
}
