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
