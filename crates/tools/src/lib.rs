//! The built-in tools, grouped by family (one tool per file), and the tool box that makes
//! tool sets of them by name. What a tool is, and the one path every call takes, live in
//! `td_toolkit`; this crate only adds tools, so editing one rebuilds this crate and the
//! binary, not the runtime below it.

use std::sync::{Arc, OnceLock};

use td_toolkit::registry::{RegistryError, ToolBox, ToolSet};
use td_toolkit::tool::Tool;

pub mod artifacts;
pub mod commands;
pub mod coordination;
pub mod files;
pub mod search;
#[cfg(test)]
pub(crate) mod test_support;
pub mod web;

/// Every built-in tool, in a stable order.
pub fn builtin_tools() -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(files::read_file::ReadFile),
        Arc::new(files::write_file::WriteFile),
        Arc::new(files::edit_file::EditFile),
        Arc::new(files::list_directory::ListDirectory),
        Arc::new(search::glob::Glob),
        Arc::new(search::grep::Grep),
        Arc::new(search::symbols::Symbols),
        Arc::new(commands::run_command::RunCommand),
        Arc::new(commands::run_command_isolated::RunCommandIsolated),
        Arc::new(commands::build::Build),
        Arc::new(commands::test::Test),
        Arc::new(commands::validate::Validate),
        Arc::new(web::web_fetch::WebFetch),
        Arc::new(web::web_search::WebSearch),
        Arc::new(coordination::complete_task::CompleteTask),
        Arc::new(artifacts::create_plan::CreatePlan),
        Arc::new(artifacts::create_spec::CreateSpec),
        Arc::new(artifacts::create_phase::CreatePhase),
        Arc::new(coordination::query_loop::QueryLoop),
        Arc::new(coordination::share_data::ShareData),
        Arc::new(coordination::broadcast_alert::BroadcastAlert),
        Arc::new(coordination::list_loops::ListLoops),
    ]
}

/// The built-in tools with their compiled validators, made once per process.
pub fn builtin() -> &'static ToolBox {
    static BUILTIN: OnceLock<ToolBox> = OnceLock::new();
    BUILTIN.get_or_init(|| ToolBox::new(builtin_tools()))
}

/// The built-in tools named in `names`, in that order; an unknown or repeated name is an
/// error naming the closest valid tool.
pub fn tool_set<S: AsRef<str>>(names: &[S]) -> Result<ToolSet, RegistryError> {
    builtin().set(names)
}

/// Every built-in tool.
pub fn all_tools() -> ToolSet {
    builtin().all().unwrap_or_else(|e| {
        // The built-in schemas are ours and covered by tests; reaching this is a bug.
        panic!("a built-in tool schema does not compile: {e}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_schema_compiles_and_names_are_unique() {
        let set = builtin().all().unwrap();
        assert_eq!(set.names().len(), builtin_tools().len());
    }

    #[test]
    fn builtin_sets_share_compiled_tools_and_suggest_names() {
        let err = tool_set(&["read_file", "grpe"]).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("unknown tool 'grpe' (did you mean 'grep'?); known tools: "),
            "{err}"
        );
        let err = tool_set(&["grep", "grep"]).unwrap_err();
        assert_eq!(err.to_string(), "tool 'grep' is listed twice");
        let a = tool_set(&["grep", "read_file"]).unwrap();
        let b = tool_set(&["grep", "read_file"]).unwrap();
        assert!(Arc::ptr_eq(
            &a.shared_definitions(),
            &b.shared_definitions()
        ));
    }

    mod quick_schemas {
        use proptest::prelude::*;
        use serde_json::{Value, json};
        use td_toolkit::quick_schema::QuickSchema;

        use super::*;

        /// Every string an `enum` of a built-in schema allows, so that generated inputs hit
        /// them.
        fn enum_strings() -> Vec<String> {
            fn collect(v: &Value, out: &mut Vec<String>) {
                match v {
                    Value::Object(m) => {
                        if let Some(Value::Array(values)) = m.get("enum") {
                            out.extend(values.iter().filter_map(|s| s.as_str().map(String::from)));
                        }
                        m.values().for_each(|v| collect(v, out));
                    }
                    Value::Array(a) => a.iter().for_each(|v| collect(v, out)),
                    _ => {}
                }
            }
            let mut out = vec!["x".to_string()];
            builtin_tools()
                .iter()
                .for_each(|t| collect(&t.input_schema(), &mut out));
            out
        }

        /// Values of every kind tool inputs hold, odd ones included.
        fn any_value() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::from),
                (-3i64..300_001).prop_map(Value::from),
                any::<i64>().prop_map(Value::from),
                any::<u64>().prop_map(Value::from),
                (-2i64..4).prop_map(|n| json!(n as f64 + 0.5)),
                (0i64..4).prop_map(|n| json!(n as f64)),
                "[a-zé\u{1F600} ./]{0,7}".prop_map(Value::from),
                proptest::sample::select(enum_strings()).prop_map(Value::from),
            ];
            leaf.prop_recursive(2, 8, 3, |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
                    proptest::collection::btree_map("[a-z]{1,3}", inner, 0..3)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        /// Values for a property of schema `p`: mostly near its bounds (one inside, one
        /// outside), strings of one- to four-byte characters, its enum's members, and values
        /// of every other kind.
        fn value_for(p: &Value) -> BoxedStrategy<Value> {
            let n = |k: &str| p.get(k).and_then(Value::as_i64);
            let near = match p.get("type").and_then(Value::as_str) {
                Some("string") => {
                    let low = n("minLength").unwrap_or(0).max(1) - 1;
                    let high = n("maxLength").unwrap_or(low + 3) + 1;
                    let chars = proptest::collection::vec(
                        prop_oneof![Just('a'), Just('é'), Just('\u{1F600}'), Just(' ')],
                        low as usize..=high as usize,
                    )
                    .prop_map(|c| Value::from(c.into_iter().collect::<String>()));
                    match p.get("enum").and_then(Value::as_array) {
                        Some(e) => {
                            let e = e.clone();
                            prop_oneof![proptest::sample::select(e), chars].boxed()
                        }
                        None => chars.boxed(),
                    }
                }
                Some("integer") => {
                    let mut edges = vec![0i64, 1, -1, i64::MAX];
                    for b in [n("minimum"), n("maximum")].into_iter().flatten() {
                        edges.extend([b - 1, b, b + 1]);
                    }
                    let edges: Vec<Value> = edges.into_iter().map(Value::from).collect();
                    prop_oneof![
                        proptest::sample::select(edges.clone()),
                        proptest::sample::select(edges).prop_map(|v| json!(v.as_f64())),
                    ]
                    .boxed()
                }
                Some("boolean") => any::<bool>().prop_map(Value::from).boxed(),
                _ => any_value().boxed(),
            };
            prop_oneof![4 => near, 1 => any_value()].boxed()
        }

        /// Inputs for the schema of a tool: each property present (mostly) with a value from
        /// [`value_for`], sometimes one the schema does not name.
        fn input_for(schema: &Value) -> BoxedStrategy<Value> {
            let properties: Vec<(String, Value)> = schema["properties"]
                .as_object()
                .map(|p| p.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .unwrap_or_default();
            let members: Vec<BoxedStrategy<Option<(String, Value)>>> = properties
                .into_iter()
                .map(|(name, p)| {
                    proptest::option::weighted(0.8, value_for(&p))
                        .prop_map(move |v| v.map(|v| (name.clone(), v)))
                        .boxed()
                })
                .collect();
            (members, proptest::option::weighted(0.1, any_value()))
                .prop_map(|(members, extra)| {
                    let mut input: serde_json::Map<String, Value> =
                        members.into_iter().flatten().collect();
                    if let Some(v) = extra {
                        input.insert("other".into(), v);
                    }
                    Value::Object(input)
                })
                .boxed()
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(3_000))]

            /// The quick check never accepts an input the validator refuses, for any
            /// built-in tool whose schema it checks; and it does accept some (it is used).
            #[test]
            fn the_quick_check_accepts_nothing_the_validator_refuses(
                (tool, input) in (0..builtin_tools().len()).prop_flat_map(|i| {
                    let schema = builtin_tools()[i].input_schema();
                    (Just(i), input_for(&schema))
                }),
            ) {
                let tool = &builtin_tools()[tool];
                if let Some(quick) = QuickSchema::compile(&tool.input_schema()) {
                    let set = tool_set(&[tool.name()]).unwrap();
                    let valid = set.validate(tool.name(), &input).is_ok();
                    prop_assert!(!quick.accepts(&input) || valid, "{} accepted {input}", tool.name());
                }
            }
        }

        #[test]
        fn the_coordination_tools_inputs_are_checked_quickly() {
            for (tool, input) in [
                (
                    "query_loop",
                    json!({"target_exec_id": "b", "question": "Which port?"}),
                ),
                ("list_loops", json!({})),
                ("complete_task", json!({"summary": "done"})),
            ] {
                let schema = builtin_tools()
                    .into_iter()
                    .find(|t| t.name() == tool)
                    .unwrap()
                    .input_schema();
                let quick = QuickSchema::compile(&schema).unwrap_or_else(|| panic!("{tool}"));
                assert!(quick.accepts(&input), "{tool}: {input}");
            }
        }
    }
}
