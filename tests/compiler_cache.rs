//! The compiler cache (`compiler-cache: sccache`, issue 16) through the real binary, real
//! cargo and a real sccache: each loop's server is started by the run, confined as the
//! loop's commands (a proc-macro it runs cannot write outside the worktree nor reach the
//! host's network), reachable by that loop's build commands only (not over the host's
//! loopback), shared through the cache directory (a second loop's build hits what the
//! first compiled), and gone when the run ends.

use std::io::ErrorKind;
use std::net::TcpListener;
use std::path::Path;

use serde_json::Value;

mod common;

use common::flagged_run::summary;
use common::sccache::{rust_count, servers_of};

/// The proc-macro crate the shared dependency uses: at expansion it tries to write outside
/// the worktree and to connect to a listener of the host, and writes what it managed into
/// the worktree it compiles for.
fn probe_macro(outside: &Path, host: &str) -> String {
    format!(
        r#"use proc_macro::TokenStream;

#[proc_macro]
pub fn probe(_: TokenStream) -> TokenStream {{
    let wrote = std::fs::write("{outside}/pwned", "pwned").is_ok();
    let reached = std::net::TcpStream::connect("{host}").is_ok();
    if let Ok(worktree) = std::env::var("TASKDAEMON_WORKTREE") {{
        let _ = std::fs::write(
            format!("{{worktree}}/probe.txt"),
            format!("wrote={{wrote}} reached={{reached}}\n"),
        );
    }}
    "pub const PROBED: bool = true;".parse().unwrap()
}}
"#,
        outside = outside.display()
    )
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn stats(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str::<Value>(&text).unwrap_or_else(|e| panic!("{e}: {text}"))["stats"].clone()
}

#[test]
fn each_loop_builds_through_its_own_confined_server_and_the_loops_share_the_cache() {
    assert!(
        common::fully_confined(),
        "the compiler cache needs namespaces, Landlock and seccomp (CI has them)"
    );
    let sccache = common::sccache::sccache_binary();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let repo = root.join("repo");
    let shared = root.join("shared");
    let outside = root.join("outside");
    let cache = root.join("cache");
    std::fs::create_dir_all(&outside).unwrap();
    let host = TcpListener::bind("127.0.0.1:0").unwrap();
    host.set_nonblocking(true).unwrap();
    let host_addr = host.local_addr().unwrap().to_string();

    // Dependencies outside the repository, the same for every worktree (as the registry's
    // crates are): what a second worktree can take from the cache.
    write(
        &shared.join("probe_macro/Cargo.toml"),
        "[package]\nname = \"probe_macro\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[lib]\nproc-macro = true\n",
    );
    write(
        &shared.join("probe_macro/src/lib.rs"),
        &probe_macro(&outside, &host_addr),
    );
    write(
        &shared.join("dep/Cargo.toml"),
        &format!(
            "[package]\nname = \"dep\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\nprobe_macro = {{ path = \"{}\" }}\n",
            shared.join("probe_macro").display()
        ),
    );
    write(
        &shared.join("dep/src/lib.rs"),
        "probe_macro::probe!();\npub fn forty() -> u32 { 40 }\n",
    );
    std::fs::create_dir_all(repo.join("src")).unwrap();
    common::init_repo(
        &repo,
        &[
            (
                "Cargo.toml",
                &format!(
                    "[package]\nname = \"demo\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\ndep = {{ path = \"{}\" }}\n",
                    shared.join("dep").display()
                ),
            ),
            (
                "src/lib.rs",
                "pub fn answer() -> u32 { dep::forty() + 2 }\n",
            ),
            (
                ".gitignore",
                "target/\n.taskdaemon/\nCargo.lock\n*.json\nprobe.txt\n",
            ),
        ],
    );
    let bin = sccache.display();
    // `a` builds, asks its server for its figures, and tries to reach a server over the
    // host's loopback (where none of the run's servers is); `b`, after `a`, builds the same
    // dependencies in its own worktree.
    let script = format!(
        r#"
a:
  turns:
    - calls:
        - build: {{}}
        - test: {{}}
        - run_command: {{command: "SCCACHE_SERVER_PORT=4226 '{bin}' --show-stats --stats-format json > host-stats.json 2>/dev/null; true"}}
        - complete_task: {{summary: built}}
b:
  turns:
    - calls:
        - build: {{}}
        - test: {{}}
        - complete_task: {{summary: built}}
"#
    );
    write(&repo.join("script.yml"), &script);
    let config = repo.join("taskdaemon.yml");
    write(
        &config,
        &format!(
            "llm: {{provider: scripted, script: script.yml}}\nkeep-worktrees: true\ncompiler-cache: {{tool: sccache, binary: '{bin}', dir: '{}'}}\nloop-types:\n  rust: {{extends: code, build: \"cargo build --offline\", test: \"\\\"$RUSTC_WRAPPER\\\" --show-stats --stats-format json > stats.json\"}}\nloops:\n  - {{name: a, type: rust, task: t}}\n  - {{name: b, type: rust, task: t, depends-on: [a]}}\n",
            cache.display()
        ),
    );
    let run_dir = root.join("run");
    common::run_to_success(&config, &run_dir);
    let s = summary(&run_dir);
    let transcript = |name: &str| {
        std::fs::read_to_string(run_dir.join(format!("loops/{name}/transcript.jsonl")))
            .unwrap_or_default()
    };
    for name in ["a", "b"] {
        assert_eq!(s["loops"][name]["status"], "completed", "{s:#}");
        assert!(
            transcript(name).contains("build passed"),
            "{name}: {}",
            transcript(name)
        );
    }
    let wt = |name: &str| run_dir.join("worktrees").join(name);

    // `a`'s build went through its server: it compiled (and cached) the dependencies.
    let a = stats(&wt("a").join("stats.json"));
    assert!(a["requests_executed"].as_u64().unwrap_or(0) >= 2, "{a:#}");
    assert!(rust_count(&a, "cache_misses") >= 2, "{a:#}");
    // `b`'s own server found them in the shared cache.
    let b = stats(&wt("b").join("stats.json"));
    assert!(rust_count(&b, "cache_hits") >= 1, "{b:#}");

    // The proc-macro ran inside `a`'s server (the dependency's compile was a miss there),
    // confined: it wrote in the worktree, not outside, and reached nothing on the host.
    assert_eq!(
        std::fs::read_to_string(wt("a").join("probe.txt")).unwrap(),
        "wrote=false reached=false\n"
    );
    assert!(!outside.join("pwned").exists());
    match host.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("the host's listener was reached: {other:?}"),
    }

    // A command on the host's network finds no server of the run on the host's loopback
    // (whatever answered there had compiled nothing).
    let host_stats = std::fs::read_to_string(wt("a").join("host-stats.json")).unwrap_or_default();
    if let Ok(v) = serde_json::from_str::<Value>(&host_stats) {
        assert_eq!(v["stats"]["compile_requests"], 0, "{host_stats}");
    }

    // The cache is where the config said, and no server outlived the run.
    assert!(std::fs::read_dir(&cache).unwrap().next().is_some());
    let left = servers_of(&sccache);
    assert!(left.is_empty(), "servers left running: {left:?}");
}
