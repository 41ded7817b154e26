//! A light, linear HTML scanner both web tools use: `web_search` strips the markup from
//! result snippets, `web_fetch` estimates how deeply a page nests (html5ever's time grows
//! with the square of the depth) and strips the tags of pages too deep to lay out.

use td_base::text::floor_char_boundary;

/// Elements that never hold content or whose end tag may be left out; they do not add to
/// the nesting depth estimate.
const FLAT_ELEMENTS: &[&str] = &[
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track",
    "wbr", "p", "li", "dt", "dd", "tr", "td", "th", "option", "optgroup", "thead", "tbody",
    "tfoot", "colgroup", "rb", "rt", "rp", "html", "head", "body", "!doctype",
];

/// Elements whose content is not text for a reader.
const HIDDEN_ELEMENTS: &[&str] = &["script", "style", "noscript", "template"];

/// One piece of an HTML byte stream, as the light scanner sees it.
enum Piece<'a> {
    Text(&'a [u8]),
    Open(String),
    Close(String),
}

/// A linear, forgiving HTML scanner: text runs and tag names, comments dropped, the content
/// of hidden elements skipped. Good enough to estimate depth and strip tags.
fn scan_html(html: &[u8], mut on: impl FnMut(Piece<'_>)) {
    let find = |from: usize, needle: &[u8]| {
        html.get(from..)
            .and_then(|rest| {
                rest.windows(needle.len())
                    .position(|w| w.eq_ignore_ascii_case(needle))
            })
            .map(|p| from + p)
    };
    let mut i = 0;
    while i < html.len() {
        let Some(lt) = html[i..].iter().position(|&b| b == b'<').map(|p| i + p) else {
            on(Piece::Text(&html[i..]));
            break;
        };
        if lt > i {
            on(Piece::Text(&html[i..lt]));
        }
        if html[lt..].starts_with(b"<!--") {
            i = find(lt + 4, b"-->").map_or(html.len(), |p| p + 3);
            continue;
        }
        let closing = html.get(lt + 1) == Some(&b'/');
        let name_start = (lt + 1 + usize::from(closing)).min(html.len());
        let name_len = html[name_start..]
            .iter()
            .take_while(|b| b.is_ascii_alphanumeric() || **b == b'!' || **b == b'-')
            .count();
        if name_len == 0 {
            on(Piece::Text(&html[lt..lt + 1]));
            i = lt + 1;
            continue;
        }
        let name =
            String::from_utf8_lossy(&html[name_start..name_start + name_len]).to_ascii_lowercase();
        let gt = html[name_start..]
            .iter()
            .position(|&b| b == b'>')
            .map_or(html.len(), |p| name_start + p);
        let self_closing = html.get(gt.wrapping_sub(1)) == Some(&b'/');
        i = (gt + 1).min(html.len());
        if closing {
            on(Piece::Close(name));
        } else if HIDDEN_ELEMENTS.contains(&name.as_str()) {
            let end = format!("</{name}");
            i = find(i, end.as_bytes())
                .and_then(|p| html[p..].iter().position(|&b| b == b'>').map(|q| p + q + 1))
                .unwrap_or(html.len());
        } else if self_closing {
            on(Piece::Open(name.clone()));
            on(Piece::Close(name));
        } else {
            on(Piece::Open(name));
        }
    }
}

/// An estimate of the deepest element nesting in `html` (unclosed elements count).
pub(crate) fn nesting_depth(html: &[u8]) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    scan_html(html, |piece| match piece {
        Piece::Open(name) if !FLAT_ELEMENTS.contains(&name.as_str()) => {
            depth += 1;
            max = max.max(depth);
        }
        Piece::Close(name) if !FLAT_ELEMENTS.contains(&name.as_str()) => {
            depth = depth.saturating_sub(1);
        }
        _ => {}
    });
    max
}

/// The text of `html` without tags: block elements start new lines, entities are decoded,
/// runs of spaces are collapsed.
pub(crate) fn strip_tags(html: &str) -> String {
    const BLOCKS: &[&str] = &[
        "p",
        "div",
        "br",
        "li",
        "tr",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "pre",
        "table",
        "ul",
        "ol",
        "section",
        "article",
        "header",
        "footer",
        "blockquote",
        "hr",
        "dt",
        "dd",
    ];
    let mut raw = String::with_capacity(html.len() / 2);
    scan_html(html.as_bytes(), |piece| match piece {
        Piece::Text(t) => raw.push_str(&String::from_utf8_lossy(t)),
        Piece::Open(name) | Piece::Close(name) => {
            if BLOCKS.contains(&name.as_str()) {
                raw.push('\n');
            }
        }
    });
    let decoded = decode_entities(&raw);
    let mut out = String::with_capacity(decoded.len());
    for line in decoded.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if !words.is_empty() {
            out.push_str(&words.join(" "));
            out.push('\n');
        }
    }
    out
}

/// Decodes the character references that matter for reading (named basics and numeric).
pub(crate) fn decode_entities(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        rest = &rest[amp..];
        let window = &rest[..floor_char_boundary(rest, 12)];
        let decoded = window.find(';').and_then(|end| {
            let entity = &rest[1..end];
            let ch = match entity {
                "amp" => Some('&'),
                "lt" => Some('<'),
                "gt" => Some('>'),
                "quot" => Some('"'),
                "apos" => Some('\''),
                "nbsp" => Some(' '),
                _ => {
                    let num = entity.strip_prefix('#')?;
                    let code = match num.strip_prefix(['x', 'X']) {
                        Some(hex) => u32::from_str_radix(hex, 16).ok(),
                        None => num.parse::<u32>().ok(),
                    };
                    code.and_then(char::from_u32)
                }
            };
            ch.map(|c| (c, end + 1))
        });
        match decoded {
            Some((c, len)) => {
                out.push(c);
                rest = &rest[len..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_estimate_ignores_flat_elements_and_hidden_content() {
        assert_eq!(
            nesting_depth(b"<div><div><p>a<p>b<br><img src=x></div></div>"),
            2
        );
        assert_eq!(
            nesting_depth(b"<script>if (a<b) { '<div><div><div>' }</script><span/>"),
            1
        );
        assert_eq!(nesting_depth(b"<!-- <div><div> --><b>x</b>"), 1);
        assert_eq!(nesting_depth(b"<b><b><b>"), 3);
        assert_eq!(nesting_depth(b"a < b and <> and <"), 0);
        assert_eq!(nesting_depth(b"<div"), 1);
        assert_eq!(nesting_depth(b"</"), 0);
    }

    #[test]
    fn strip_tags_keeps_text_and_lines() {
        let html = "<h1>Title</h1><p>One &amp; <b>two</b>&#33; &#x263A;</p>\
                    <style>p{}</style><ul><li>x</li><li>y &unknown; z &#xFFFFFFFF; &é;</li></ul>";
        assert_eq!(
            strip_tags(html),
            "Title\nOne & two! \u{263A}\nx\ny &unknown; z &#xFFFFFFFF; &é;\n"
        );
    }
}
