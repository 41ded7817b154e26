//! Snapshot tests of the tool definitions in every format `tools list` prints. A change to
//! a name, description or schema shows up here for review.

use taskdaemon::formats::{DefinitionFormat, render};
use td_toolkit::catalog::Catalog;

fn snapshot(format: DefinitionFormat, name: &str) {
    let value = render(
        &td_tools::all_tools().definitions(),
        format,
        &Catalog::default(),
    );
    insta::with_settings!({snapshot_path => "../snapshots", prepend_module_to_snapshot => false}, {
        insta::assert_json_snapshot!(name, value);
    });
}

#[test]
fn anthropic_definitions() {
    snapshot(DefinitionFormat::Anthropic, "definitions_anthropic");
}

#[test]
fn openai_definitions() {
    snapshot(DefinitionFormat::Openai, "definitions_openai");
}

#[test]
fn mcp_definitions() {
    snapshot(DefinitionFormat::Mcp, "definitions_mcp");
}

#[test]
fn json_definitions_with_catalog_limits() {
    snapshot(DefinitionFormat::Json, "definitions_json");
}

#[test]
fn every_schema_is_a_closed_object_with_described_properties() {
    for def in td_tools::all_tools().definitions() {
        let s = &def.input_schema;
        assert_eq!(s["type"], "object", "{}", def.name);
        assert_eq!(
            s["additionalProperties"], false,
            "{}: closed schema",
            def.name
        );
        if let Some(props) = s["properties"].as_object() {
            for (k, v) in props {
                assert!(
                    v["description"].as_str().is_some_and(|d| !d.is_empty()),
                    "{}.{k} has no description",
                    def.name
                );
            }
        }
        assert!(
            def.description.len() > 20,
            "{}: description too thin",
            def.name
        );
    }
}

#[test]
fn cli_prints_the_same_definitions() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_taskdaemon"))
        .args(["tools", "list", "--format", "openai", "--loop-type", "plan"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["function"]["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"create_plan"));
    assert!(
        !names.contains(&"run_command"),
        "plan loops run no commands"
    );

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_taskdaemon"))
        .args(["tools", "list", "--loop-type", "nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("built-in types"));
}

/// `tools list -c FILE --format json` with `catalog:` overrides in FILE.
fn list_with_catalog(dir: &std::path::Path, catalog: &str) -> std::process::Output {
    let config = dir.join("taskdaemon.yml");
    std::fs::write(&config, format!("catalog:\n{catalog}")).unwrap();
    std::process::Command::new(env!("CARGO_BIN_EXE_taskdaemon"))
        .args(["tools", "list", "--format", "json", "-c"])
        .arg(&config)
        .output()
        .unwrap()
}

#[test]
fn no_catalog_override_moves_a_tool_into_or_out_of_the_coordinator() {
    let dir = tempfile::tempdir().unwrap();
    // A coordination tool in a worker lane would hold the worker while it waits for an
    // answer whose own tool calls need one.
    let out = list_with_catalog(dir.path(), "  query_loop: {lane: no-net}\n");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("'query_loop'") && err.contains("remove its `lane`"),
        "{err}"
    );
    // And the coordinator is no lane for other tools.
    let out = list_with_catalog(dir.path(), "  grep: {lane: coordinator}\n");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown variant `coordinator`"), "{err}");
    // Lanes still move, and coordination tools still show as such.
    let out = list_with_catalog(
        dir.path(),
        "  grep: {lane: heavy}\n  query_loop: {timeout-ms: 1000}\n",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let lane = |name: &str| {
        v.as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == name)
            .map(|d| (d["lane"].clone(), d["timeout_ms"].clone()))
            .unwrap()
    };
    assert_eq!(lane("grep").0, "heavy");
    assert_eq!(lane("query_loop"), ("coordinator".into(), 1000.into()));
}
