//! Property tests of the file tools through the public call path (`ToolSet::call`): what
//! write_file stores is what read_file shows, an edit and its reverse restore the file byte
//! for byte, and no input whatsoever makes a file tool panic.

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::{Value, json};
use td_toolkit::context::ToolContext;
use td_toolkit::registry::{CallOutcome, ToolSet};

const FILE_TOOLS: [&str; 4] = ["read_file", "write_file", "edit_file", "list_directory"];

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn call(
    rt: &tokio::runtime::Runtime,
    set: &ToolSet,
    ctx: &ToolContext,
    name: &str,
    input: Value,
) -> CallOutcome {
    rt.block_on(set.call(ctx, None, name, input))
}

/// Text with plenty of line breaks (`\n`, `\r\n`, lone `\r`) and any other char but NUL
/// (a NUL makes the file binary, which read_file rightly refuses to show).
fn text() -> impl Strategy<Value = String> {
    let ch = prop_oneof![
        6 => any::<char>().prop_filter("no NUL", |c| *c != '\0'),
        2 => Just('\n'),
        1 => Just('\r'),
        1 => Just(' '),
    ];
    prop::collection::vec(ch, 0..300).prop_map(|v| v.into_iter().collect())
}

/// Like `text`, without the bracket chars the edit property uses as unique markers.
fn plain_text() -> impl Strategy<Value = String> {
    text().prop_map(|s| s.chars().filter(|c| !"⟦⟧⟪⟫".contains(*c)).collect())
}

/// The lines of read_file's output, without their numbers; notes are skipped.
fn unnumbered(output: &str) -> Vec<String> {
    output
        .split('\n')
        .filter_map(|l| {
            let (num, rest) = l.split_once('\t')?;
            let num = num.trim_start_matches(' ');
            (!num.is_empty() && num.bytes().all(|b| b.is_ascii_digit())).then(|| rest.to_string())
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn what_write_file_stores_read_file_shows(content in text()) {
        let rt = runtime();
        let set = td_tools::all_tools();
        let dir = tempfile::tempdir().expect("tempdir");
        let ctx = ToolContext::new(dir.path(), "prop").expect("ctx");

        let out = call(&rt, &set, &ctx, "write_file", json!({"path": "d/f.txt", "content": content}));
        prop_assert!(!out.is_error, "{}", out.content);
        let on_disk = std::fs::read(dir.path().join("d/f.txt")).expect("written");
        prop_assert_eq!(&on_disk, content.as_bytes());

        let out = call(&rt, &set, &ctx, "read_file", json!({"path": "d/f.txt"}));
        prop_assert!(!out.is_error, "{}", out.content);
        if content.is_empty() {
            prop_assert!(out.content.contains("is empty"));
        }
        // read_file splits lines as `str::lines` does: at `\n`, dropping a `\r` before it.
        let expected: Vec<&str> = content.lines().collect();
        prop_assert_eq!(unnumbered(&out.content), expected);
    }

    #[test]
    fn an_edit_and_its_reverse_restore_the_file(
        prefix in plain_text(),
        suffix in plain_text(),
        old_inner in plain_text(),
        new_inner in plain_text(),
        replace_all in any::<bool>(),
    ) {
        // The brackets occur nowhere else, so each marker is a unique substring.
        let old = format!("⟦{old_inner}⟧");
        let new = format!("⟪{new_inner}⟫");
        let original = format!("{prefix}{old}{suffix}");
        let rt = runtime();
        let set = td_tools::all_tools();
        let dir = tempfile::tempdir().expect("tempdir");
        let ctx = ToolContext::new(dir.path(), "prop").expect("ctx");
        let path = dir.path().join("f.txt");

        let out = call(&rt, &set, &ctx, "write_file", json!({"path": "f.txt", "content": original}));
        prop_assert!(!out.is_error, "{}", out.content);
        let out = call(&rt, &set, &ctx, "edit_file",
            json!({"path": "f.txt", "old_string": old, "new_string": new, "replace_all": replace_all}));
        prop_assert!(!out.is_error, "{}", out.content);
        let edited = std::fs::read(&path).expect("read");
        prop_assert_eq!(edited, format!("{prefix}{new}{suffix}").into_bytes());

        let out = call(&rt, &set, &ctx, "edit_file",
            json!({"path": "f.txt", "edits": [{"old_string": new, "new_string": old}]}));
        prop_assert!(!out.is_error, "{}", out.content);
        let restored = std::fs::read(&path).expect("read");
        prop_assert_eq!(restored, original.into_bytes());
    }

    #[test]
    fn no_input_makes_a_file_tool_panic(
        inputs in (
            tool_input("read_file"),
            tool_input("write_file"),
            prop_oneof![tool_input("edit_file/single"), tool_input("edit_file/list"), tool_input("edit_file")],
            tool_input("list_directory"),
        ),
        anything in json_value(),
    ) {
        let rt = runtime();
        let set = td_tools::all_tools();
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("a.txt"), "alpha\nbeta\n").expect("seed");
        std::fs::create_dir(dir.path().join("sub")).expect("seed dir");
        let ctx = ToolContext::new(dir.path(), "prop").expect("ctx");
        // Stamp the seed file so edit_file gets past the read check.
        let out = call(&rt, &set, &ctx, "read_file", json!({"path": "a.txt"}));
        prop_assert!(!out.is_error);

        let (r, w, e, l) = inputs;
        let calls = [
            ("read_file", r),
            ("write_file", w),
            ("edit_file", e),
            ("list_directory", l),
        ];
        let odd = FILE_TOOLS.iter().map(|name| (*name, anything.clone()));
        for (name, input) in calls.into_iter().chain(odd) {
            let out = call(&rt, &set, &ctx, name, input.clone());
            prop_assert!(!out.content.is_empty(), "{name} {input}");
            prop_assert!(!out.content.contains("panicked"), "{name} {input}: {}", out.content);
            prop_assert!(out.receipt.error_kind.as_deref() != Some("timeout"), "{name} {input}");
        }
    }
}

/// The properties of each file tool's schema.
fn keys_of(tool: &str) -> &'static [&'static str] {
    match tool {
        "read_file" => &["path", "offset", "limit"],
        "write_file" => &["path", "content"],
        "edit_file" => &["path", "old_string", "new_string", "replace_all", "edits"],
        "edit_file/single" => &["path", "old_string", "new_string", "replace_all"],
        "edit_file/list" => &["path", "edits"],
        _ => &["path", "recursive", "max_depth", "include_hidden"],
    }
}

/// A value for property `key`: usually of the right type (so the call reaches the tool's
/// own code), sometimes anything.
fn typed_value(key: &'static str) -> BoxedStrategy<Value> {
    let typed: BoxedStrategy<Value> = match key {
        "offset" | "limit" | "max_depth" => prop_oneof![
            (0u64..6).prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
        ]
        .boxed(),
        "replace_all" | "recursive" | "include_hidden" => {
            any::<bool>().prop_map(Value::from).boxed()
        }
        "edits" => prop::collection::vec(edit_value(), 0..3)
            .prop_map(Value::Array)
            .boxed(),
        _ => string_value().prop_map(Value::from).boxed(),
    };
    prop_oneof![9 => typed, 1 => json_value()].boxed()
}

/// One entry of edit_file's `edits`, fields present or not.
fn edit_value() -> impl Strategy<Value = Value> {
    (
        prop::option::weighted(0.9, string_value()),
        prop::option::weighted(0.9, string_value()),
        prop::option::of(any::<bool>()),
    )
        .prop_map(|(old, new, all)| {
            let mut m = serde_json::Map::new();
            if let Some(o) = old {
                m.insert("old_string".into(), o.into());
            }
            if let Some(n) = new {
                m.insert("new_string".into(), n.into());
            }
            if let Some(a) = all {
                m.insert("replace_all".into(), a.into());
            }
            Value::Object(m)
        })
}

/// An input object for `tool`: each of its properties present or not, now and then an
/// unknown one.
fn tool_input(tool: &'static str) -> impl Strategy<Value = Value> {
    let fields: Vec<BoxedStrategy<Option<(&'static str, Value)>>> = keys_of(tool)
        .iter()
        .map(|&k| {
            let present = if k == "path" { 0.95 } else { 0.75 };
            prop::option::weighted(present, typed_value(k).prop_map(move |v| (k, v))).boxed()
        })
        .collect();
    (
        fields,
        prop::option::weighted(0.05, (".{0,6}", json_value())),
    )
        .prop_map(|(fields, extra)| {
            let mut m = serde_json::Map::new();
            for (k, v) in fields.into_iter().flatten() {
                m.insert(k.to_string(), v);
            }
            if let Some((k, v)) = extra {
                m.insert(k, v);
            }
            Value::Object(m)
        })
}

/// Strings that are often meaningful paths or text of the seeded worktree.
fn string_value() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "a.txt",
            "sub",
            ".",
            "..",
            "/",
            "/etc/passwd",
            "sub/new.txt",
            "alpha",
            "beta\n",
            "",
            "a.txt/",
            "\0",
            "../a.txt",
            "sub/../a.txt",
        ])
        .prop_map(str::to_string),
        ".{0,12}",
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (0u64..30).prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        string_value().prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(".{0,6}", inner, 0..4)
                .prop_map(|m: BTreeMap<String, Value>| Value::Object(m.into_iter().collect())),
        ]
    })
}
