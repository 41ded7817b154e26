//! The scope stack that applies a language's grammar to a file's text: indentation stands
//! in for nesting, so a function indented under a `class`/`impl`/`trait` is a method.

use regex::Regex;
use td_base::text::floor_char_boundary;

use crate::search::symbols::grammars::Grammar;

/// Longest signature shown.
const MAX_SIGNATURE_BYTES: usize = 160;

/// Words that look like a call or a definition to a line regex but never name a symbol.
const KEYWORDS: &[&str] = &[
    "if", "else", "for", "while", "switch", "catch", "return", "do", "throw", "sizeof", "typeof",
    "case", "try", "foreach", "elif", "when", "using", "lock", "defined",
];

/// One symbol found.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Symbol {
    pub(super) line: usize,
    pub(super) kind: &'static str,
    pub(super) name: String,
    pub(super) signature: String,
}

/// Filters applied while outlining.
pub(super) struct Filter {
    pub(super) name: Option<Regex>,
    pub(super) kind: Option<String>,
}

impl Filter {
    fn keeps(&self, kind: &str, name: &str) -> bool {
        self.kind.as_deref().is_none_or(|k| k == kind)
            && self.name.as_ref().is_none_or(|re| re.is_match(name))
    }
}

fn indent_width(line: &str) -> usize {
    line.chars()
        .take_while(|c| c.is_whitespace())
        .map(|c| if c == '\t' { 4 } else { 1 })
        .sum()
}

fn signature(line: &str) -> String {
    let s = line.trim();
    let s = s.strip_suffix('{').unwrap_or(s).trim_end();
    if s.len() <= MAX_SIGNATURE_BYTES {
        s.to_string()
    } else {
        format!("{}...", &s[..floor_char_boundary(s, MAX_SIGNATURE_BYTES)])
    }
}

/// The symbols of `text` written in the language of `g`, in line order.
pub(super) fn outline(text: &str, g: &Grammar, filter: &Filter) -> Vec<Symbol> {
    let mut out = Vec::new();
    let mut scopes: Vec<(usize, &'static str)> = Vec::new();
    for (idx, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || g.comments.iter().any(|c| trimmed.starts_with(c)) {
            continue;
        }
        let indent = indent_width(line);
        if !g.keep_scope.iter().any(|k| trimmed.starts_with(k)) {
            while scopes.last().is_some_and(|&(i, _)| i >= indent) {
                scopes.pop();
            }
        }
        if !g.set.is_match(line) {
            continue;
        }
        let inside = scopes.last().map(|&(_, k)| k);
        for rule_idx in g.set.matches(line).iter() {
            let Some(rule) = g.rules.get(rule_idx) else {
                continue;
            };
            if !rule.only_in.is_empty() && !inside.is_some_and(|k| rule.only_in.contains(&k)) {
                continue;
            }
            let Some(name) = rule
                .re
                .captures(line)
                .and_then(|c| c.name("name"))
                .map(|m| m.as_str())
            else {
                continue;
            };
            if KEYWORDS.contains(&name) {
                continue;
            }
            let kind = if rule.kind == "function"
                && (inside.is_some_and(|k| g.method_scopes.contains(&k)) || name.contains("::"))
            {
                "method"
            } else {
                rule.kind
            };
            if rule.scope {
                scopes.push((indent, kind));
            }
            if filter.keeps(kind, name) {
                out.push(Symbol {
                    line: idx + 1,
                    kind,
                    name: name.to_string(),
                    signature: signature(line),
                });
            }
            break;
        }
    }
    out
}
