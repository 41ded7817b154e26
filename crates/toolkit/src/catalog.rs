//! The tool catalog: for each tool its lane, timeout and output cap, and the default tool
//! sets of the built-in loop types. Defaults follow the loopr catalog; `taskdaemon.yml` may
//! override any field of any tool.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Why catalog overrides were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    /// An override names a tool the catalog does not know (a typo would otherwise be
    /// silently ignored).
    #[error("catalog override for unknown tool '{name}'; known tools: {}", known.join(", "))]
    UnknownTool {
        /// The name in the override.
        name: String,
        /// Every tool the catalog knows, sorted.
        known: Vec<String>,
    },
    /// A limit set to zero, which no call could meet.
    #[error("catalog override for '{tool}': {field} must be > 0")]
    Zero {
        /// The tool.
        tool: String,
        /// The field (`timeout-ms`, `max-output-bytes`).
        field: &'static str,
    },
}

/// Where a tool call executes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum Lane {
    /// Local work with no network: file tools, search, isolated commands.
    NoNet,
    /// Calls that may use the network: web tools, plain commands.
    Net,
    /// Builds, tests and validation: few workers so that loops don't start a compiler each.
    Heavy,
    /// Coordination tools: routed to the coordinator, never to a worker lane.
    Coordinator,
}

impl Lane {
    /// The lane's name as written in configs and definitions.
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::NoNet => "no-net",
            Lane::Net => "net",
            Lane::Heavy => "heavy",
            Lane::Coordinator => "coordinator",
        }
    }
}

/// Limits of one tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Lane the call runs in.
    pub lane: Lane,
    /// Default and maximum duration of one call, in milliseconds.
    pub timeout_ms: u64,
    /// Cap on the text returned to the model, in bytes.
    pub max_output_bytes: usize,
}

/// A partial override of a tool's limits, as written in `taskdaemon.yml`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ToolSpecOverride {
    /// New lane.
    pub lane: Option<Lane>,
    /// New timeout in milliseconds.
    pub timeout_ms: Option<u64>,
    /// New output cap in bytes.
    pub max_output_bytes: Option<usize>,
}

/// Output cap for tools whose catalog entry names none.
pub const DEFAULT_OUTPUT_BYTES: usize = 100_000;

/// Per-tool limits for every known tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Catalog {
    specs: BTreeMap<String, ToolSpec>,
}

impl Default for Catalog {
    fn default() -> Self {
        use Lane::*;
        let entries: &[(&str, Lane, u64, usize)] = &[
            ("read_file", NoNet, 10_000, 100_000),
            ("write_file", NoNet, 10_000, DEFAULT_OUTPUT_BYTES),
            ("edit_file", NoNet, 10_000, DEFAULT_OUTPUT_BYTES),
            ("list_directory", NoNet, 5_000, DEFAULT_OUTPUT_BYTES),
            ("glob", NoNet, 30_000, 50_000),
            ("grep", NoNet, 60_000, 100_000),
            ("symbols", NoNet, 30_000, 100_000),
            ("run_command", Net, 120_000, 100_000),
            ("run_command_isolated", NoNet, 120_000, 100_000),
            ("web_fetch", Net, 30_000, 500_000),
            ("web_search", Net, 30_000, 50_000),
            ("build", Heavy, 600_000, 1_000_000),
            ("test", Heavy, 600_000, 1_000_000),
            ("validate", Heavy, 600_000, 500_000),
            ("complete_task", NoNet, 1_000, DEFAULT_OUTPUT_BYTES),
            ("create_plan", NoNet, 5_000, DEFAULT_OUTPUT_BYTES),
            ("create_spec", NoNet, 5_000, DEFAULT_OUTPUT_BYTES),
            ("create_phase", NoNet, 5_000, DEFAULT_OUTPUT_BYTES),
            ("query_loop", Coordinator, 300_000, DEFAULT_OUTPUT_BYTES),
            ("share_data", Coordinator, 5_000, DEFAULT_OUTPUT_BYTES),
            ("broadcast_alert", Coordinator, 5_000, DEFAULT_OUTPUT_BYTES),
            ("list_loops", Coordinator, 5_000, DEFAULT_OUTPUT_BYTES),
        ];
        let specs = entries
            .iter()
            .map(|&(name, lane, timeout_ms, max_output_bytes)| {
                (
                    name.to_string(),
                    ToolSpec {
                        lane,
                        timeout_ms,
                        max_output_bytes,
                    },
                )
            })
            .collect();
        Catalog { specs }
    }
}

impl Catalog {
    /// Limits of `tool`; an unknown tool gets no-net, 30 s and the default cap.
    pub fn spec(&self, tool: &str) -> ToolSpec {
        self.specs.get(tool).copied().unwrap_or(ToolSpec {
            lane: Lane::NoNet,
            timeout_ms: 30_000,
            max_output_bytes: DEFAULT_OUTPUT_BYTES,
        })
    }

    /// Every entry, sorted by tool name.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &ToolSpec)> {
        self.specs.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Applies overrides; an override for a tool the catalog does not know is an error
    /// (a typo would otherwise be silently ignored).
    pub fn apply_overrides(
        &mut self,
        overrides: &BTreeMap<String, ToolSpecOverride>,
    ) -> Result<(), CatalogError> {
        let zero = |tool: &str, field| CatalogError::Zero {
            tool: tool.to_string(),
            field,
        };
        for (name, o) in overrides {
            let Some(spec) = self.specs.get_mut(name) else {
                return Err(CatalogError::UnknownTool {
                    name: name.clone(),
                    known: self.specs.keys().cloned().collect(),
                });
            };
            if let Some(lane) = o.lane {
                spec.lane = lane;
            }
            if let Some(t) = o.timeout_ms {
                if t == 0 {
                    return Err(zero(name, "timeout-ms"));
                }
                spec.timeout_ms = t;
            }
            if let Some(b) = o.max_output_bytes {
                if b == 0 {
                    return Err(zero(name, "max-output-bytes"));
                }
                spec.max_output_bytes = b;
            }
        }
        Ok(())
    }
}

const COORDINATION_TOOLS: &[&str] = &["query_loop", "share_data", "broadcast_alert", "list_loops"];

/// The default tool set of a built-in loop type, or `None` for an unknown type.
pub fn default_tool_set(loop_type: &str) -> Option<Vec<&'static str>> {
    let base: &[&str] = match loop_type {
        "plan" => &[
            "read_file",
            "write_file",
            "list_directory",
            "glob",
            "grep",
            "symbols",
            "web_fetch",
            "web_search",
            "create_plan",
            "complete_task",
        ],
        "spec" => &[
            "read_file",
            "write_file",
            "edit_file",
            "list_directory",
            "glob",
            "grep",
            "symbols",
            "run_command",
            "web_fetch",
            "web_search",
            "create_spec",
            "complete_task",
        ],
        "phase" => &[
            "read_file",
            "write_file",
            "edit_file",
            "list_directory",
            "glob",
            "grep",
            "symbols",
            "run_command",
            "create_phase",
            "complete_task",
        ],
        "code" => &[
            "read_file",
            "write_file",
            "edit_file",
            "list_directory",
            "glob",
            "grep",
            "symbols",
            "run_command",
            "run_command_isolated",
            "build",
            "test",
            "validate",
            "complete_task",
        ],
        "ralph" => &[
            "read_file",
            "write_file",
            "edit_file",
            "list_directory",
            "glob",
            "grep",
            "symbols",
            "run_command",
            "run_command_isolated",
            "build",
            "test",
            "validate",
            "web_fetch",
            "web_search",
            "complete_task",
        ],
        _ => return None,
    };
    let mut set: Vec<&'static str> = base.to_vec();
    set.extend_from_slice(COORDINATION_TOOLS);
    Some(set)
}

/// Names of the built-in loop types.
pub const BUILTIN_LOOP_TYPES: &[&str] = &["plan", "spec", "phase", "code", "ralph"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_loopr_catalog() {
        let c = Catalog::default();
        assert_eq!(c.spec("read_file").timeout_ms, 10_000);
        assert_eq!(c.spec("read_file").max_output_bytes, 100_000);
        assert_eq!(c.spec("run_command").timeout_ms, 120_000);
        assert_eq!(c.spec("build").timeout_ms, 600_000);
        assert_eq!(c.spec("test").max_output_bytes, 1_000_000);
        assert_eq!(c.spec("build").lane, Lane::Heavy);
        assert_eq!(c.spec("web_fetch").lane, Lane::Net);
        assert_eq!(c.spec("query_loop").lane, Lane::Coordinator);
    }

    #[test]
    fn overrides_apply_and_typos_are_refused() {
        let mut c = Catalog::default();
        let mut o = BTreeMap::new();
        o.insert(
            "grep".to_string(),
            ToolSpecOverride {
                timeout_ms: Some(5),
                max_output_bytes: Some(7),
                lane: Some(Lane::Heavy),
            },
        );
        c.apply_overrides(&o).unwrap();
        assert_eq!(
            c.spec("grep"),
            ToolSpec {
                lane: Lane::Heavy,
                timeout_ms: 5,
                max_output_bytes: 7
            }
        );
        let mut bad = BTreeMap::new();
        bad.insert("grpe".to_string(), ToolSpecOverride::default());
        let err = c.apply_overrides(&bad).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("catalog override for unknown tool 'grpe'; known tools: bro"),
            "{err}"
        );
        let mut zero = BTreeMap::new();
        zero.insert(
            "grep".to_string(),
            ToolSpecOverride {
                timeout_ms: Some(0),
                ..Default::default()
            },
        );
        assert_eq!(
            c.apply_overrides(&zero).unwrap_err().to_string(),
            "catalog override for 'grep': timeout-ms must be > 0"
        );
    }

    #[test]
    fn builtin_types_have_sets_and_only_known_tools() {
        let c = Catalog::default();
        for t in BUILTIN_LOOP_TYPES {
            let set = default_tool_set(t).unwrap();
            assert!(set.contains(&"complete_task"));
            for name in set {
                assert!(c.specs.contains_key(name), "{t}: {name} not in catalog");
            }
        }
        assert!(default_tool_set("nope").is_none());
        assert!(!default_tool_set("plan").unwrap().contains(&"run_command"));
    }
}
