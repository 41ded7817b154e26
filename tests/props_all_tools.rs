//! No input makes any tool panic: arbitrary JSON goes through the full call path (schema
//! check, argument parsing, execution) of every tool that is safe to execute with random
//! input, and through schema validation for the rest (commands and network tools are not
//! executed with random strings: they would run random shell text or reach for the network).

use std::sync::OnceLock;

use proptest::prelude::*;
use serde_json::Value;
use td_toolkit::catalog::{Catalog, Lane, Route};
use td_toolkit::context::ToolContext;

mod props_support;

fn arb_json() -> impl Strategy<Value = Value> {
    let paths =
        prop::sample::select(vec!["..", "/", "", "a\0b", "../x", "*"]).prop_map(str::to_string);
    props_support::arb_json(3, key().boxed(), paths.boxed())
}

/// Keys that are real argument names of our tools half of the time, so inputs get past the
/// schema often enough to exercise parsing and execution.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "path",
            "content",
            "old_string",
            "new_string",
            "replace_all",
            "edits",
            "offset",
            "limit",
            "pattern",
            "file_pattern",
            "context",
            "case_insensitive",
            "max_results",
            "recursive",
            "max_depth",
            "include_hidden",
            "name",
            "kind",
            "summary",
            "title",
            "overview",
            "specs",
            "phases",
            "tasks",
            "objective",
            "validation_command",
        ])
        .prop_map(str::to_string),
        "[a-z_]{1,8}",
    ]
}

fn executes_safely(tool: &str, catalog: &Catalog) -> bool {
    !matches!(
        catalog.route(tool),
        Route::Lane(Lane::Net) | Route::Lane(Lane::Heavy)
    ) && !matches!(tool, "run_command" | "run_command_isolated")
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, .. ProptestConfig::default() })]

    #[test]
    fn no_tool_panics_on_any_input(input in arb_json()) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "alpha\nbeta\n").unwrap();
        let ctx = ToolContext::new(dir.path(), "prop").unwrap();
        let set = td_tools::all_tools();
        let catalog = Catalog::default();
        for name in set.names().to_vec() {
            if executes_safely(&name, &catalog) {
                let out = runtime().block_on(set.call(&ctx, None, &name, input.clone()));
                prop_assert!(
                    !out.content.contains("panicked"),
                    "{name} panicked on {input}: {}", out.content
                );
            } else {
                let _ = set.validate(&name, &input);
            }
        }
    }
}
