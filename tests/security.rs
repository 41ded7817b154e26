//! The sandbox, attacked from every tool that takes a path: each escape class must be
//! refused as a sandbox violation, leak nothing from outside, and create nothing outside.
//!
//! Layout of every case:
//!   tmp/wt/            the worktree (inside.txt, symlinks below)
//!   tmp/outside/       secret.txt  ("TOP-SECRET")
//!   tmp/wt-evil/       secret.txt  (a sibling whose name starts with the worktree's)

use std::os::unix::fs::symlink;
use std::path::PathBuf;

use serde_json::{Value, json};
use td_toolkit::context::ToolContext;

const SECRET: &str = "TOP-SECRET";

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    wt: PathBuf,
    outside: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let wt = root.join("wt");
    let outside = root.join("outside");
    let evil = root.join("wt-evil");
    for d in [&wt, &outside, &evil] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(wt.join("inside.txt"), "inside\n").unwrap();
    std::fs::write(outside.join("secret.txt"), format!("{SECRET}\n")).unwrap();
    std::fs::write(evil.join("secret.txt"), format!("{SECRET}\n")).unwrap();
    symlink(outside.join("secret.txt"), wt.join("link_file")).unwrap();
    symlink(&outside, wt.join("link_dir")).unwrap();
    symlink("../outside", wt.join("rel_link_dir")).unwrap();
    symlink(outside.join("new.txt"), wt.join("dangling")).unwrap();
    std::fs::create_dir_all(wt.join("sub")).unwrap();
    symlink("../../outside/secret.txt", wt.join("sub/deep_link")).unwrap();
    Fixture {
        _dir: dir,
        root,
        wt,
        outside,
    }
}

/// Every escaping path, named by its class.
fn escapes(f: &Fixture) -> Vec<(&'static str, String)> {
    vec![
        ("lexical ..", "../outside/secret.txt".into()),
        ("lexical .. deep", "sub/../../outside/secret.txt".into()),
        (
            "absolute outside",
            f.outside.join("secret.txt").display().to_string(),
        ),
        ("absolute system file", "/etc/passwd".into()),
        ("symlinked file", "link_file".into()),
        (
            "symlinked directory on the way",
            "link_dir/secret.txt".into(),
        ),
        (
            "relative symlinked directory",
            "rel_link_dir/secret.txt".into(),
        ),
        ("nested relative symlink", "sub/deep_link".into()),
        ("dangling symlink", "dangling".into()),
        ("NUL byte", "inside.txt\0../../outside/secret.txt".into()),
        ("sibling prefix, relative", "../wt-evil/secret.txt".into()),
        (
            "sibling prefix, absolute",
            f.root.join("wt-evil/secret.txt").display().to_string(),
        ),
    ]
}

/// Directory-shaped escapes (for list, glob, grep, symbols and command cwd).
fn dir_escapes(f: &Fixture) -> Vec<(&'static str, String)> {
    vec![
        ("lexical ..", "..".into()),
        ("lexical .. to sibling", "../outside".into()),
        ("absolute outside", f.outside.display().to_string()),
        ("absolute root", "/".into()),
        ("symlinked directory", "link_dir".into()),
        ("relative symlinked directory", "rel_link_dir".into()),
        ("NUL byte", "sub\0".into()),
        ("sibling prefix, relative", "../wt-evil".into()),
        (
            "sibling prefix, absolute",
            f.root.join("wt-evil").display().to_string(),
        ),
    ]
}

async fn call(ctx: &ToolContext, tool: &str, input: Value) -> (bool, String) {
    let out = td_tools::all_tools().call(ctx, None, tool, input).await;
    (out.is_error, out.content)
}

fn assert_refused(class: &str, tool: &str, (is_error, content): (bool, String)) {
    assert!(is_error, "{tool} / {class}: not refused: {content}");
    assert!(
        content.contains("sandbox violation"),
        "{tool} / {class}: refused for the wrong reason: {content}"
    );
    assert!(
        !content.contains(SECRET),
        "{tool} / {class}: leaked outside content: {content}"
    );
}

fn outside_untouched(f: &Fixture) {
    let names: Vec<String> = std::fs::read_dir(&f.outside)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        vec!["secret.txt".to_string()],
        "something was created outside"
    );
    assert_eq!(
        std::fs::read_to_string(f.outside.join("secret.txt")).unwrap(),
        format!("{SECRET}\n"),
        "the outside file was changed"
    );
}

fn ctx(f: &Fixture) -> ToolContext {
    ToolContext::new(&f.wt, "security").unwrap()
}

#[tokio::test]
async fn read_file_refuses_every_escape() {
    let f = fixture();
    let c = ctx(&f);
    for (class, path) in escapes(&f) {
        assert_refused(
            class,
            "read_file",
            call(&c, "read_file", json!({"path": path})).await,
        );
    }
}

#[tokio::test]
async fn write_file_refuses_every_escape_and_creates_nothing_outside() {
    let f = fixture();
    let c = ctx(&f);
    for (class, path) in escapes(&f) {
        let r = call(&c, "write_file", json!({"path": path, "content": "pwned"})).await;
        assert_refused(class, "write_file", r);
    }
    // New files below a symlinked directory, and new directories on the way.
    for path in [
        "link_dir/new.txt",
        "link_dir/a/b/new.txt",
        "rel_link_dir/x/new.txt",
    ] {
        let r = call(&c, "write_file", json!({"path": path, "content": "pwned"})).await;
        assert_refused(path, "write_file", r);
    }
    outside_untouched(&f);
}

#[tokio::test]
async fn edit_file_refuses_every_escape() {
    let f = fixture();
    let c = ctx(&f);
    for (class, path) in escapes(&f) {
        let r = call(
            &c,
            "edit_file",
            json!({"path": path, "old_string": SECRET, "new_string": "pwned"}),
        )
        .await;
        assert_refused(class, "edit_file", r);
    }
    outside_untouched(&f);
}

#[tokio::test]
async fn list_directory_refuses_every_escape() {
    let f = fixture();
    let c = ctx(&f);
    for (class, path) in dir_escapes(&f) {
        for recursive in [false, true] {
            let r = call(
                &c,
                "list_directory",
                json!({"path": path, "recursive": recursive}),
            )
            .await;
            assert_refused(class, "list_directory", r);
        }
    }
}

#[tokio::test]
async fn glob_refuses_escaping_bases_and_patterns() {
    let f = fixture();
    let c = ctx(&f);
    for (class, path) in dir_escapes(&f) {
        let r = call(&c, "glob", json!({"pattern": "**/*", "path": path})).await;
        assert_refused(class, "glob", r);
    }
    // Patterns that try to climb out must find nothing outside (refused or empty).
    for pattern in ["../outside/*", "../**/secret.txt", "/etc/*", "link_dir/*"] {
        let (_, content) = call(&c, "glob", json!({"pattern": pattern})).await;
        assert!(
            !content.contains("outside/")
                && !content.contains("secret.txt")
                && !content.contains("passwd"),
            "glob {pattern} leaked: {content}"
        );
    }
}

#[tokio::test]
async fn grep_refuses_escaping_paths_and_never_follows_links_out() {
    let f = fixture();
    let c = ctx(&f);
    for (class, path) in dir_escapes(&f).into_iter().chain(escapes(&f)) {
        let r = call(&c, "grep", json!({"pattern": "SECRET", "path": path})).await;
        assert_refused(class, "grep", r);
    }
    // A whole-worktree search walks past the symlinks without following them out.
    let (_, content) = call(&c, "grep", json!({"pattern": "SECRET"})).await;
    assert!(
        !content.contains(SECRET),
        "grep followed a link out: {content}"
    );
    for file_pattern in ["../outside/*", "/etc/*"] {
        let (_, content) = call(
            &c,
            "grep",
            json!({"pattern": "SECRET|root", "file_pattern": file_pattern}),
        )
        .await;
        assert!(
            !content.contains(SECRET) && !content.contains("root:"),
            "{content}"
        );
    }
}

#[tokio::test]
async fn symbols_refuses_every_escape() {
    let f = fixture();
    let c = ctx(&f);
    for (class, path) in dir_escapes(&f).into_iter().chain(escapes(&f)) {
        let r = call(&c, "symbols", json!({"path": path})).await;
        assert_refused(class, "symbols", r);
    }
}

#[tokio::test]
async fn command_working_directory_refuses_every_escape() {
    let f = fixture();
    let c = ctx(&f);
    for tool in ["run_command", "run_command_isolated"] {
        for (class, cwd) in dir_escapes(&f) {
            let r = call(
                &c,
                tool,
                json!({"command": "touch pwned-by-cwd; cat secret.txt", "cwd": cwd}),
            )
            .await;
            assert_refused(class, tool, r);
        }
    }
    outside_untouched(&f);
    assert!(!f.root.join("pwned-by-cwd").exists());
}

#[tokio::test]
async fn artifact_names_cannot_escape() {
    let f = fixture();
    let c = ctx(&f);
    let r = call(
        &c,
        "create_phase",
        json!({
            "name": "../../outside/x",
            "title": "t",
            "objective": "o",
            "tasks": [{"description": "d"}],
            "validation_command": "true"
        }),
    )
    .await;
    assert!(r.0, "{}", r.1);
    outside_untouched(&f);
}

#[tokio::test]
async fn inside_paths_still_work_through_inside_symlinks() {
    let f = fixture();
    symlink(f.wt.join("inside.txt"), f.wt.join("inside_link")).unwrap();
    let c = ctx(&f);
    let (is_error, content) = call(&c, "read_file", json!({"path": "inside_link"})).await;
    assert!(!is_error, "{content}");
    assert!(content.contains("inside"));
    let abs = f.wt.join("inside.txt").display().to_string();
    let (is_error, content) = call(&c, "read_file", json!({"path": abs})).await;
    assert!(!is_error, "{content}");
}
