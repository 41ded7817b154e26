//! The crate graph of the workspace, as `cargo metadata` reports it, checked against the
//! layers ARCHITECTURE.md describes: acyclic, exactly the edges listed below between the
//! workspace's own crates, and none of the forbidden dependencies, direct or through other
//! crates. A new edge fails here loudly, so that it is a decision (ARCHITECTURE.md and the
//! list below change with it) and not an accident of one `use`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// Every dependency between two crates of the workspace, `(from, to)`: normal (and build)
/// dependencies, which are what the layers' code may use.
const NORMAL_EDGES: &[(&str, &str)] = &[
    ("taskdaemon", "td-base"),
    ("taskdaemon", "td-cluster"),
    ("taskdaemon", "td-confine"),
    ("taskdaemon", "td-engine"),
    ("taskdaemon", "td-git"),
    ("taskdaemon", "td-llm"),
    ("taskdaemon", "td-protocol"),
    ("taskdaemon", "td-runtime"),
    ("taskdaemon", "td-toolkit"),
    ("taskdaemon", "td-tools"),
    ("td-confine", "td-base"),
    ("td-engine", "td-base"),
    ("td-engine", "td-llm"),
    ("td-engine", "td-protocol"),
    ("td-engine", "td-toolkit"),
    ("td-git", "td-base"),
    ("td-llm", "td-base"),
    ("td-llm", "td-http"),
    ("td-llm", "td-protocol"),
    ("td-protocol", "td-base"),
    ("td-protocol", "td-confine"),
    ("td-runtime", "td-base"),
    ("td-runtime", "td-engine"),
    ("td-runtime", "td-llm"),
    ("td-runtime", "td-protocol"),
    ("td-runtime", "td-toolkit"),
    ("td-toolkit", "td-base"),
    ("td-toolkit", "td-confine"),
    ("td-toolkit", "td-git"),
    ("td-toolkit", "td-protocol"),
    ("td-tools", "td-base"),
    ("td-tools", "td-confine"),
    ("td-tools", "td-http"),
    ("td-tools", "td-toolkit"),
];

/// Every dev-dependency between two crates of the workspace (used only by tests, benches and
/// examples). Each points down the layers as the normal ones do, so a lower layer's tests
/// never build an upper layer.
const DEV_EDGES: &[(&str, &str)] = &[
    // The same crate as the normal dependency, with its canned-answer `test-server` feature.
    ("td-tools", "td-http"),
];

/// Crates (of the workspace or not) that a crate must not depend on, directly or through
/// any other crate, by its normal or build dependencies: `(crate, forbidden, why)`.
const FORBIDDEN: &[(&str, &str, &str)] = &[
    (
        "td-toolkit",
        "ractor",
        "tools run without the actor runtime",
    ),
    ("td-toolkit", "notify", "tools run without the file watcher"),
    ("td-toolkit", "td-llm", "tools know nothing of models"),
    ("td-tools", "ractor", "tools run without the actor runtime"),
    ("td-tools", "notify", "tools run without the file watcher"),
    ("td-tools", "td-llm", "tools know nothing of models"),
    ("td-llm", "td-toolkit", "providers know nothing of tools"),
    ("td-llm", "td-tools", "providers know nothing of tools"),
    ("td-llm", "td-engine", "providers know nothing of the loop"),
    (
        "td-llm",
        "td-runtime",
        "providers know nothing of the actors",
    ),
    ("td-engine", "td-runtime", "the engine runs without actors"),
    (
        "td-toolkit",
        "td-tools",
        "the toolkit is what tools build on",
    ),
    (
        "td-engine",
        "td-tools",
        "the engine gets its tools handed in",
    ),
    (
        "td-runtime",
        "td-tools",
        "the runtime gets its tools handed in",
    ),
    (
        "td-runtime",
        "ractor_cluster",
        "the actors know one node; only td-cluster talks to other nodes",
    ),
    (
        "td-engine",
        "ractor_cluster",
        "the engine runs without actors, remote ones too",
    ),
    (
        "td-tools",
        "ractor_cluster",
        "tools run without the actor runtime",
    ),
];

/// What to do when an assertion of this file fails.
const UPDATE: &str = "If the new shape is intended, change ARCHITECTURE.md (the crate graph \
                      and its reasons) and the lists in tests/crate_graph.rs together; if not, \
                      move the code so that the dependency is not needed.";

/// `cargo metadata --format-version 1` for this workspace, with `extra` arguments.
fn metadata(extra: &[&str]) -> Value {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let out = Command::new(&cargo)
        .args(["metadata", "--format-version", "1"])
        .args(extra)
        .arg("--manifest-path")
        .arg(&manifest)
        .output()
        .unwrap_or_else(|e| panic!("running {cargo:?} metadata: {e}"));
    assert!(
        out.status.success(),
        "cargo metadata failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("cargo metadata printed no JSON: {e}"))
}

/// A string field of a metadata object.
fn text<'a>(value: &'a Value, field: &str) -> &'a str {
    value[field]
        .as_str()
        .unwrap_or_else(|| panic!("metadata has no string `{field}` in {value}"))
}

/// An array field of a metadata object.
fn list<'a>(value: &'a Value, field: &str) -> &'a [Value] {
    value[field]
        .as_array()
        .unwrap_or_else(|| panic!("metadata has no array `{field}`"))
}

/// Whether a dependency kind (`null` for normal, "dev" or "build") is the code's own.
fn is_normal(kind: &Value) -> bool {
    kind.as_str() != Some("dev")
}

/// Dependencies between crates, `(from, to)`.
type Edges = BTreeSet<(String, String)>;

/// The workspace's crates and the edges between them, `(members, normal, dev)`, from
/// `--no-deps` metadata (which lists the workspace's packages and their declared
/// dependencies).
fn workspace_edges() -> (BTreeSet<String>, Edges, Edges) {
    let meta = metadata(&["--no-deps"]);
    let packages = list(&meta, "packages");
    let members: BTreeSet<String> = packages.iter().map(|p| text(p, "name").into()).collect();
    let (mut normal, mut dev) = (Edges::new(), Edges::new());
    for package in packages {
        let from = text(package, "name");
        for dep in list(package, "dependencies") {
            // `name` is the package's own name even when the dependency is renamed; only a
            // path dependency can be a member of this workspace.
            let to = text(dep, "name");
            if !members.contains(to) || dep["path"].is_null() {
                continue;
            }
            let edge = (from.to_string(), to.to_string());
            if is_normal(&dep["kind"]) {
                normal.insert(edge);
            } else {
                dev.insert(edge);
            }
        }
    }
    (members, normal, dev)
}

/// The set of `(from, to)` pairs of a list.
fn edge_set(edges: &[(&str, &str)]) -> Edges {
    edges
        .iter()
        .map(|&(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

/// The differences between `found` and `expected`, one line each, or `None` when equal.
fn difference(found: &Edges, expected: &Edges) -> Option<String> {
    let added: Vec<String> = found
        .difference(expected)
        .map(|(a, b)| format!("  new edge: {a} -> {b}"))
        .collect();
    let gone: Vec<String> = expected
        .difference(found)
        .map(|(a, b)| format!("  edge gone: {a} -> {b}"))
        .collect();
    let lines = [added, gone].concat();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// A cycle of `edges` as `a -> b -> ... -> a`, if there is one.
fn find_cycle(edges: &Edges) -> Option<String> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges {
        next.entry(a).or_default().push(b);
    }
    // Depth-first search; a node met again while still on the path closes a cycle.
    fn visit<'a>(
        node: &'a str,
        next: &BTreeMap<&'a str, Vec<&'a str>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<String> {
        if let Some(at) = path.iter().position(|&n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node);
            return Some(cycle.join(" -> "));
        }
        if done.contains(node) {
            return None;
        }
        path.push(node);
        for &to in next.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(to, next, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node);
        None
    }
    let mut done = BTreeSet::new();
    let starts: Vec<&str> = next.keys().copied().collect();
    starts
        .into_iter()
        .find_map(|start| visit(start, &next, &mut Vec::new(), &mut done))
}

/// For every package name of the resolved graph (all dependencies, `metadata` without
/// `--no-deps`), the names of the packages it depends on by normal or build dependencies.
fn resolved_graph() -> BTreeMap<String, BTreeSet<String>> {
    let meta = metadata(&[]);
    let names: BTreeMap<&str, &str> = list(&meta, "packages")
        .iter()
        .map(|p| (text(p, "id"), text(p, "name")))
        .collect();
    let name_of = |id: &str| -> String {
        names
            .get(id)
            .unwrap_or_else(|| panic!("metadata resolves unknown package {id}"))
            .to_string()
    };
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for node in list(&meta["resolve"], "nodes") {
        let deps = graph.entry(name_of(text(node, "id"))).or_default();
        for dep in list(node, "deps") {
            if list(dep, "dep_kinds").iter().any(|k| is_normal(&k["kind"])) {
                deps.insert(name_of(text(dep, "pkg")));
            }
        }
    }
    graph
}

/// The path `from -> ... -> to` in `graph`, if `from` depends on `to` at all.
fn path_to(graph: &BTreeMap<String, BTreeSet<String>>, from: &str, to: &str) -> Option<String> {
    // Breadth-first, remembering where each package was reached from, for the message.
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([from]);
    while let Some(node) = queue.pop_front() {
        for dep in graph.get(node).into_iter().flatten() {
            if dep == from || came_from.contains_key(dep.as_str()) {
                continue;
            }
            came_from.insert(dep.as_str(), node);
            if dep == to {
                let mut path = vec![to];
                let mut at = to;
                while let Some(&prev) = came_from.get(at) {
                    path.push(prev);
                    if prev == from {
                        break;
                    }
                    at = prev;
                }
                path.reverse();
                return Some(path.join(" -> "));
            }
            queue.push_back(dep);
        }
    }
    None
}

#[test]
fn workspace_crates_depend_on_each_other_exactly_as_listed() {
    let (members, normal, dev) = workspace_edges();
    for (a, b) in NORMAL_EDGES.iter().chain(DEV_EDGES) {
        for name in [a, b] {
            assert!(
                members.contains(*name),
                "{name} is listed in tests/crate_graph.rs but is not a crate of the workspace \
                 (members: {members:?}). {UPDATE}"
            );
        }
    }
    if let Some(diff) = difference(&normal, &edge_set(NORMAL_EDGES)) {
        panic!("the dependencies between workspace crates changed:\n{diff}\n{UPDATE}");
    }
    if let Some(diff) = difference(&dev, &edge_set(DEV_EDGES)) {
        panic!("the dev-dependencies between workspace crates changed:\n{diff}\n{UPDATE}");
    }
}

#[test]
fn the_workspace_crate_graph_is_acyclic() {
    let (_, normal, dev) = workspace_edges();
    if let Some(cycle) = find_cycle(&normal) {
        panic!("the workspace crates depend on each other in a circle: {cycle}. {UPDATE}");
    }
    // Cargo allows a dev-dependency to close a circle (the crate is then built twice, and
    // its types differ between the copies); the layers do not.
    let all: Edges = normal.union(&dev).cloned().collect();
    if let Some(cycle) = find_cycle(&all) {
        panic!("with dev-dependencies, the workspace crates form a circle: {cycle}. {UPDATE}");
    }
}

#[test]
fn no_crate_reaches_a_forbidden_dependency() {
    let graph = resolved_graph();
    let mut broken = Vec::new();
    for &(from, forbidden, why) in FORBIDDEN {
        assert!(
            graph.contains_key(from),
            "{from} is not in the resolved graph; fix FORBIDDEN in tests/crate_graph.rs"
        );
        if let Some(path) = path_to(&graph, from, forbidden) {
            broken.push(format!(
                "  {path} ({from} must not depend on {forbidden}: {why})"
            ));
        }
    }
    assert!(
        broken.is_empty(),
        "forbidden dependencies:\n{}\nThese edges break the layers of ARCHITECTURE.md; move \
         the code that needs them instead of adding the dependency.",
        broken.join("\n")
    );
}

#[test]
fn the_checks_see_circles_and_paths() {
    // The checks above pass on a good graph; these make sure they would not pass on a bad one.
    let edges = edge_set(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]);
    assert_eq!(find_cycle(&edges).as_deref(), Some("a -> b -> c -> a"));
    assert_eq!(
        find_cycle(&edge_set(&[("a", "b"), ("a", "c"), ("b", "c")])),
        None
    );
    let graph: BTreeMap<String, BTreeSet<String>> = [("a", "b"), ("b", "c"), ("x", "a")]
        .iter()
        .map(|&(a, b)| (a.to_string(), BTreeSet::from([b.to_string()])))
        .collect();
    assert_eq!(
        path_to(&graph, "x", "c").as_deref(),
        Some("x -> a -> b -> c")
    );
    assert_eq!(path_to(&graph, "c", "a"), None);
    let found = edge_set(&[("a", "b"), ("a", "c")]);
    let expected = edge_set(&[("a", "b"), ("b", "c")]);
    assert_eq!(
        difference(&found, &expected).as_deref(),
        Some("  new edge: a -> c\n  edge gone: b -> c")
    );
}
