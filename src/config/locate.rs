//! Where a YAML path such as `loops[2].type` or `loop-types.api.tools` stands in the text of
//! a config file, so that problems found after parsing (unknown types, dependency cycles,
//! bad templates) name their line and column the way parse errors do.

use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::Marker;

/// One step of a path: a mapping key or a sequence index.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Key(String),
    Index(usize),
}

/// `loops[2].depends-on` → `loops`, 2, `depends-on`. Keys are split at dots, indices are
/// written in brackets; config keys and names contain neither.
fn steps(path: &str) -> Vec<Step> {
    let mut out = Vec::new();
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let mut rest = part;
        if let Some(open) = rest.find('[') {
            if open > 0 {
                out.push(Step::Key(rest[..open].to_string()));
            }
            rest = &rest[open..];
            while let Some(inner) = rest.strip_prefix('[') {
                let Some((n, after)) = inner.split_once(']') else {
                    break;
                };
                match n.parse() {
                    Ok(i) => out.push(Step::Index(i)),
                    Err(_) => return out,
                }
                rest = after;
            }
        } else {
            out.push(Step::Key(rest.to_string()));
        }
    }
    out
}

/// The 1-based line and column where the node at `path` is written in `text`; for a path
/// that ends in a key, where that key is. `None` when the text has no such node (or does
/// not parse, which the caller has ruled out already).
pub fn locate(text: &str, path: &str) -> Option<(usize, usize)> {
    let steps = steps(path);
    let mut parser = Parser::new_from_str(text);
    loop {
        let (event, mark) = parser.next_token().ok()?;
        match event {
            Event::StreamStart | Event::DocumentStart => continue,
            Event::StreamEnd => return None,
            node => return find(&mut parser, node, mark, &steps),
        }
    }
}

fn position(mark: Marker) -> (usize, usize) {
    (mark.line(), mark.col() + 1)
}

/// Follows `steps` from the node that starts with `event` at `mark`.
fn find<'a>(
    parser: &mut Parser<std::str::Chars<'a>>,
    event: Event,
    mark: Marker,
    steps: &[Step],
) -> Option<(usize, usize)> {
    let Some((step, rest)) = steps.split_first() else {
        // A block mapping's start is reported past its first key: point at that key.
        if let Event::MappingStart(..) = event
            && let Ok((Event::Scalar(..), first)) = parser.next_token()
        {
            return Some(position(first));
        }
        return Some(position(mark));
    };
    match (event, step) {
        (Event::MappingStart(..), Step::Key(key)) => loop {
            let (k, k_mark) = parser.next_token().ok()?;
            match k {
                Event::MappingEnd => return None,
                Event::Scalar(ref name, ..) if name == key => {
                    let (value, v_mark) = parser.next_token().ok()?;
                    if rest.is_empty() {
                        return Some(position(k_mark));
                    }
                    return find(parser, value, v_mark, rest);
                }
                other => {
                    skip(parser, &other)?;
                    let (value, _) = parser.next_token().ok()?;
                    skip(parser, &value)?;
                }
            }
        },
        (Event::SequenceStart(..), Step::Index(index)) => {
            for _ in 0..*index {
                let (item, _) = parser.next_token().ok()?;
                if item == Event::SequenceEnd {
                    return None;
                }
                skip(parser, &item)?;
            }
            let (item, i_mark) = parser.next_token().ok()?;
            if item == Event::SequenceEnd {
                return None;
            }
            find(parser, item, i_mark, rest)
        }
        _ => None,
    }
}

/// Consumes the rest of the node that started with `event`.
fn skip(parser: &mut Parser<std::str::Chars<'_>>, event: &Event) -> Option<()> {
    let mut depth = usize::from(matches!(
        event,
        Event::MappingStart(..) | Event::SequenceStart(..)
    ));
    while depth > 0 {
        match parser.next_token().ok()?.0 {
            Event::MappingStart(..) | Event::SequenceStart(..) => depth += 1,
            Event::MappingEnd | Event::SequenceEnd => depth -= 1,
            Event::StreamEnd => return None,
            _ => {}
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
llm: {provider: scripted, script: s.yml}
loop-types:
  api:
    extends: ralph
    tools: [read_file, nope]
loops:
  - name: a
    type: ralph
    task: t
  - {name: b, type: api, task: t, depends-on: [a, c]}
  - name: c
    task: |
      several
      lines
    type: ralhp
";

    #[test]
    fn paths_split_into_keys_and_indices() {
        assert_eq!(
            steps("loops[2].depends-on[1]"),
            vec![
                Step::Key("loops".into()),
                Step::Index(2),
                Step::Key("depends-on".into()),
                Step::Index(1)
            ]
        );
        assert_eq!(
            steps("loop-types.api"),
            vec![Step::Key("loop-types".into()), Step::Key("api".into())]
        );
    }

    #[test]
    fn keys_and_items_are_found_in_block_and_flow_style() {
        assert_eq!(locate(TEXT, "llm"), Some((1, 1)));
        assert_eq!(locate(TEXT, "llm.script"), Some((1, 27)));
        assert_eq!(locate(TEXT, "loop-types.api.tools"), Some((5, 5)));
        assert_eq!(locate(TEXT, "loop-types.api.tools[1]"), Some((5, 24)));
        assert_eq!(locate(TEXT, "loops[0].type"), Some((8, 5)));
        assert_eq!(locate(TEXT, "loops[1].depends-on"), Some((10, 35)));
        // After a multi-line scalar.
        assert_eq!(locate(TEXT, "loops[2].type"), Some((15, 5)));
        assert_eq!(locate(TEXT, "loops[2]"), Some((11, 5)));
    }

    #[test]
    fn what_is_not_there_is_none() {
        assert_eq!(locate(TEXT, "loops[3]"), None);
        assert_eq!(locate(TEXT, "loops[0].depends-on"), None);
        assert_eq!(locate(TEXT, "llm[0]"), None);
        assert_eq!(locate(TEXT, "nothing"), None);
        assert_eq!(locate("", "loops"), None);
        assert_eq!(locate("[unclosed", "loops"), None);
    }
}
