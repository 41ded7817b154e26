//! The tool catalog: for each tool its route (a worker lane, or the coordinator for the
//! coordination tools), timeout and output cap, and the default tool sets of the built-in
//! loop types. Defaults follow the loopr catalog; `taskdaemon.yml` may override the limits of
//! any tool and the lane of any tool but the coordination tools.

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
    /// A lane for a coordination tool, which runs in the calling loop and talks to the
    /// coordinator: in a worker lane it would hold the worker while it waits for an answer
    /// whose own tool calls need one.
    #[error(
        "catalog override for '{tool}': a coordination tool runs in the calling loop and talks to the coordinator, never in a worker lane; remove its `lane`"
    )]
    CoordinatorLane {
        /// The tool.
        tool: String,
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

/// A worker lane: a pool of tool workers that runs calls of the tools the catalog puts
/// there (the pools themselves are `td_runtime::tool_lanes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum Lane {
    /// Local work with no network: file tools, search, isolated commands.
    NoNet,
    /// Calls that may use the network: web tools, plain commands.
    Net,
    /// Builds, tests and validation: few workers so that loops don't start a compiler each.
    Heavy,
}

impl Lane {
    /// Every lane, in the order the runtime starts them.
    pub const ALL: [Lane; 3] = [Lane::NoNet, Lane::Net, Lane::Heavy];

    /// The lane's name as written in configs and definitions.
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::NoNet => "no-net",
            Lane::Net => "net",
            Lane::Heavy => "heavy",
        }
    }
}

/// Where the calls of a tool go: the one routing decision, which every caller takes from
/// the catalog ([`Catalog::route`]).
///
/// Coordination tools are fixed to [`Route::Coordinator`] and every other tool to a lane: a
/// configuration can move a tool from lane to lane, never into or out of the coordinator.
/// That is what keeps answering a query free of deadlocks: a loop waiting for an answer
/// holds no worker, so the tool calls of the answer always find one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Route {
    /// A worker of this lane runs the call.
    Lane(Lane),
    /// Coordination tools: the call runs in the calling loop's task and talks to the
    /// coordinator, which bounds it (see `td_toolkit::coordination::Coordination`); it never
    /// takes a worker.
    Coordinator,
}

impl Route {
    /// The name shown as a tool's `lane` in definitions and configs (`coordinator` for
    /// coordination tools).
    pub fn as_str(self) -> &'static str {
        match self {
            Route::Lane(lane) => lane.as_str(),
            Route::Coordinator => "coordinator",
        }
    }

    /// The worker lane, unless the call goes to the coordinator.
    pub fn lane(self) -> Option<Lane> {
        match self {
            Route::Lane(lane) => Some(lane),
            Route::Coordinator => None,
        }
    }
}

impl Serialize for Route {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Route {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        if name == Route::Coordinator.as_str() {
            return Ok(Route::Coordinator);
        }
        Lane::ALL
            .into_iter()
            .find(|lane| lane.as_str() == name)
            .map(Route::Lane)
            .ok_or_else(|| {
                serde::de::Error::unknown_variant(&name, &["no-net", "net", "heavy", "coordinator"])
            })
    }
}

/// Limits of one tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Where its calls go (shown as `lane`: a worker lane, or `coordinator`).
    pub lane: Route,
    /// Default and maximum duration of one call, in milliseconds.
    pub timeout_ms: u64,
    /// Cap on the text returned to the model, in bytes.
    pub max_output_bytes: usize,
}

/// A partial override of a tool's limits, as written in `taskdaemon.yml`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ToolSpecOverride {
    /// New worker lane (coordination tools have none: they always go to the coordinator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lane: Option<Lane>,
    /// New timeout in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// New output cap in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
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
        const NO_NET: Route = Route::Lane(Lane::NoNet);
        const NET: Route = Route::Lane(Lane::Net);
        const HEAVY: Route = Route::Lane(Lane::Heavy);
        const COORDINATOR: Route = Route::Coordinator;
        let entries: &[(&str, Route, u64, usize)] = &[
            ("read_file", NO_NET, 10_000, 100_000),
            ("write_file", NO_NET, 10_000, DEFAULT_OUTPUT_BYTES),
            ("edit_file", NO_NET, 10_000, DEFAULT_OUTPUT_BYTES),
            ("list_directory", NO_NET, 5_000, DEFAULT_OUTPUT_BYTES),
            ("glob", NO_NET, 30_000, 50_000),
            ("grep", NO_NET, 60_000, 100_000),
            ("symbols", NO_NET, 30_000, 100_000),
            ("run_command", NET, 120_000, 100_000),
            ("run_command_isolated", NO_NET, 120_000, 100_000),
            ("web_fetch", NET, 30_000, 500_000),
            ("web_search", NET, 30_000, 50_000),
            ("build", HEAVY, 600_000, 1_000_000),
            ("test", HEAVY, 600_000, 1_000_000),
            ("validate", HEAVY, 600_000, 500_000),
            ("complete_task", NO_NET, 1_000, DEFAULT_OUTPUT_BYTES),
            ("create_plan", NO_NET, 5_000, DEFAULT_OUTPUT_BYTES),
            ("create_spec", NO_NET, 5_000, DEFAULT_OUTPUT_BYTES),
            ("create_phase", NO_NET, 5_000, DEFAULT_OUTPUT_BYTES),
            ("query_loop", COORDINATOR, 300_000, DEFAULT_OUTPUT_BYTES),
            ("share_data", COORDINATOR, 5_000, DEFAULT_OUTPUT_BYTES),
            ("broadcast_alert", COORDINATOR, 5_000, DEFAULT_OUTPUT_BYTES),
            ("list_loops", COORDINATOR, 5_000, DEFAULT_OUTPUT_BYTES),
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
            lane: Route::Lane(Lane::NoNet),
            timeout_ms: 30_000,
            max_output_bytes: DEFAULT_OUTPUT_BYTES,
        })
    }

    /// Where calls of `tool` go: the routing decision every caller takes from here.
    pub fn route(&self, tool: &str) -> Route {
        self.spec(tool).lane
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
                if spec.lane == Route::Coordinator {
                    return Err(CatalogError::CoordinatorLane { tool: name.clone() });
                }
                spec.lane = Route::Lane(lane);
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

/// The default tool set of a built-in loop type, or `None` for an unknown type. Each type
/// takes groups of tools in this order, then `complete_task` and the coordination tools.
pub fn default_tool_set(loop_type: &str) -> Option<Vec<&'static str>> {
    const READ_WRITE: &[&str] = &["read_file", "write_file"];
    const EDIT: &[&str] = &["read_file", "write_file", "edit_file"];
    const LOOK: &[&str] = &["list_directory", "glob", "grep", "symbols"];
    const RUN: &[&str] = &["run_command"];
    const COMMANDS: &[&str] = &[
        "run_command",
        "run_command_isolated",
        "build",
        "test",
        "validate",
    ];
    const WEB: &[&str] = &["web_fetch", "web_search"];
    let groups: &[&[&str]] = match loop_type {
        "plan" => &[READ_WRITE, LOOK, WEB, &["create_plan"]],
        "spec" => &[EDIT, LOOK, RUN, WEB, &["create_spec"]],
        "phase" => &[EDIT, LOOK, RUN, &["create_phase"]],
        "code" => &[EDIT, LOOK, COMMANDS],
        "ralph" => &[EDIT, LOOK, COMMANDS, WEB],
        _ => return None,
    };
    let mut set: Vec<&'static str> = groups.concat();
    set.push("complete_task");
    set.extend_from_slice(COORDINATION_TOOLS);
    Some(set)
}

/// Names of the built-in loop types.
pub const BUILTIN_LOOP_TYPES: &[&str] = &["plan", "spec", "phase", "code", "ralph"];

#[cfg(test)]
mod tests {
    use super::*;

    /// The lists as they were spelled out in full: their order is the order of the tool
    /// definitions in every request (a prompt-cache prefix), so it must not move.
    #[test]
    fn default_tool_sets_keep_their_order() {
        let files = "read_file write_file edit_file list_directory glob grep symbols";
        let commands = "run_command run_command_isolated build test validate";
        let coordination = "complete_task query_loop share_data broadcast_alert list_loops";
        for (loop_type, tools) in [
            ("plan", "read_file write_file list_directory glob grep symbols web_fetch web_search create_plan".to_string()),
            ("spec", format!("{files} run_command web_fetch web_search create_spec")),
            ("phase", format!("{files} run_command create_phase")),
            ("code", format!("{files} {commands}")),
            ("ralph", format!("{files} {commands} web_fetch web_search")),
        ] {
            let set = default_tool_set(loop_type).map(|s| s.join(" "));
            assert_eq!(set, Some(format!("{tools} {coordination}")), "{loop_type}");
        }
        assert_eq!(default_tool_set("other"), None);
    }

    #[test]
    fn defaults_follow_the_loopr_catalog() {
        let c = Catalog::default();
        assert_eq!(c.spec("read_file").timeout_ms, 10_000);
        assert_eq!(c.spec("read_file").max_output_bytes, 100_000);
        assert_eq!(c.spec("run_command").timeout_ms, 120_000);
        assert_eq!(c.spec("build").timeout_ms, 600_000);
        assert_eq!(c.spec("test").max_output_bytes, 1_000_000);
        assert_eq!(c.spec("build").lane, Route::Lane(Lane::Heavy));
        assert_eq!(c.spec("web_fetch").lane, Route::Lane(Lane::Net));
        assert_eq!(c.route("query_loop"), Route::Coordinator);
        assert_eq!(c.route("no_such_tool"), Route::Lane(Lane::NoNet));
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
                lane: Route::Lane(Lane::Heavy),
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
    fn no_override_moves_a_tool_into_or_out_of_the_coordinator() {
        let mut c = Catalog::default();
        let mut o = BTreeMap::new();
        o.insert(
            "query_loop".to_string(),
            ToolSpecOverride {
                lane: Some(Lane::NoNet),
                ..Default::default()
            },
        );
        let err = c.apply_overrides(&o).unwrap_err();
        assert_eq!(
            err,
            CatalogError::CoordinatorLane {
                tool: "query_loop".into()
            }
        );
        let err = err.to_string();
        assert!(
            err.contains("'query_loop'") && err.contains("remove its `lane`"),
            "{err}"
        );
        assert_eq!(c.route("query_loop"), Route::Coordinator);
        // Its other limits may still change.
        o.insert(
            "query_loop".to_string(),
            ToolSpecOverride {
                timeout_ms: Some(9),
                ..Default::default()
            },
        );
        c.apply_overrides(&o).unwrap();
        assert_eq!(c.spec("query_loop").timeout_ms, 9);
        // `coordinator` is no lane a tool can be put in.
        let err = serde_json::from_str::<ToolSpecOverride>(r#"{"lane": "coordinator"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown variant `coordinator`"), "{err}");
    }

    #[test]
    fn routes_are_named_as_before_in_definitions_and_configs() {
        for (route, name) in [
            (Route::Lane(Lane::NoNet), "\"no-net\""),
            (Route::Lane(Lane::Net), "\"net\""),
            (Route::Lane(Lane::Heavy), "\"heavy\""),
            (Route::Coordinator, "\"coordinator\""),
        ] {
            assert_eq!(serde_json::to_string(&route).unwrap(), name);
            assert_eq!(serde_json::from_str::<Route>(name).unwrap(), route);
        }
        assert!(serde_json::from_str::<Route>("\"fast\"").is_err());
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
