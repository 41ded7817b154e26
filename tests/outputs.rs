//! What the model sees: snapshots of representative tool answers, taken through
//! `ToolSet::call` (schema validation, output cap and error texts included) on a fixed
//! worktree. The worktree's temporary path is written as `[WT]` so snapshots do not depend
//! on the machine. Review a changed snapshot as a model would read it.
//!
//! Regenerate with `INSTA_UPDATE=always cargo test --test outputs`, then read every diff.

use serde_json::{Value, json};
use td_toolkit::context::ToolContext;

const LIB_RS: &str = r#"//! A tiny library for the snapshot tests.

/// Greets someone.
pub fn greet(name: &str) -> String {
    format!("Hello, {name}!")
}

/// A point in the plane.
pub struct Point {
    pub x: i32,
    pub y: i32,
}

impl Point {
    /// The origin.
    pub fn origin() -> Self {
        Point { x: 0, y: 0 }
    }

    /// Distance squared from the origin.
    pub fn norm2(&self) -> i32 {
        self.x * self.x + self.y * self.y
    }
}

pub const LIMIT: usize = 10;
"#;

/// The fixed worktree every snapshot is taken in.
fn fixture() -> (tempfile::TempDir, ToolContext) {
    let dir = tempfile::tempdir().unwrap();
    let notes: String = (1..=30)
        .map(|i| format!("note {i}: keep going\n"))
        .collect();
    let wide = format!("short line\n{}\nlast line\n", "w".repeat(2100));
    let files: Vec<(&str, Vec<u8>)> =
        vec![
        ("src/lib.rs", LIB_RS.into()),
        ("src/util.rs", b"pub fn helper() -> u32 {\n    42\n}\n".to_vec()),
        (
            "tests/it.rs",
            b"#[test]\nfn it_greets() {\n    assert_eq!(demo::greet(\"a\"), \"Hello, a!\");\n}\n"
                .to_vec(),
        ),
        ("docs/guide.md", b"# Guide\n\nRead the notes.\n".to_vec()),
        ("notes.txt", notes.into_bytes()),
        ("wide.txt", wide.into_bytes()),
        (
            "logo.png",
            vec![0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A, 0, 0, 0, 0x0D],
        ),
        (".gitignore", b"target/\n*.log\n".to_vec()),
        ("build.log", b"ignored\n".to_vec()),
        ("target/debug/out.rs", b"fn ignored() {}\n".to_vec()),
    ];
    for (rel, bytes) in files {
        let path = dir.path().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
    let ctx = ToolContext::new(dir.path(), "snapshots").unwrap();
    (dir, ctx)
}

/// Calls `tool` as a loop would and returns what the model sees: the error flag, then the
/// content, with the worktree's path replaced by `[WT]`.
async fn call(ctx: &ToolContext, tool: &str, input: Value) -> String {
    let out = td_tools::all_tools().call(ctx, None, tool, input).await;
    let root = ctx.root().display().to_string();
    format!(
        "is_error: {}\n---\n{}",
        out.is_error,
        out.content.replace(&root, "[WT]")
    )
}

fn snap(name: &str, text: &str) {
    insta::with_settings!({snapshot_path => "../snapshots", prepend_module_to_snapshot => false}, {
        insta::assert_snapshot!(name, text);
    });
}

#[tokio::test]
async fn read_file_outputs() {
    let (_d, ctx) = fixture();
    let window = call(
        &ctx,
        "read_file",
        json!({"path": "notes.txt", "offset": 5, "limit": 4}),
    )
    .await;
    snap("read_file_window", &window);
    snap(
        "read_file_long_line",
        &call(&ctx, "read_file", json!({"path": "wide.txt"})).await,
    );
    snap(
        "read_file_binary",
        &call(&ctx, "read_file", json!({"path": "logo.png"})).await,
    );
    snap(
        "read_file_missing",
        &call(&ctx, "read_file", json!({"path": "src/lbi.rs"})).await,
    );
}

#[tokio::test]
async fn write_file_output() {
    let (_d, ctx) = fixture();
    snap(
        "write_file_created",
        &call(
            &ctx,
            "write_file",
            json!({"path": "src/new/mod.rs", "content": "pub mod a;\npub mod b;\n"}),
        )
        .await,
    );
    snap(
        "write_file_overwrote",
        &call(
            &ctx,
            "write_file",
            json!({"path": "docs/guide.md", "content": "# Guide\n"}),
        )
        .await,
    );
}

#[tokio::test]
async fn edit_file_outputs() {
    let (_d, ctx) = fixture();
    call(&ctx, "read_file", json!({"path": "src/lib.rs"})).await;
    snap(
        "edit_file_success",
        &call(
            &ctx,
            "edit_file",
            json!({
                "path": "src/lib.rs",
                "old_string": "    pub fn origin() -> Self {\n        Point { x: 0, y: 0 }\n    }",
                "new_string": "    pub fn origin() -> Self {\n        Self::new(0, 0)\n    }\n\n    /// A point at `x`, `y`.\n    pub fn new(x: i32, y: i32) -> Self {\n        Point { x, y }\n    }"
            }),
        )
        .await,
    );
    snap(
        "edit_file_not_found_with_hint",
        &call(
            &ctx,
            "edit_file",
            json!({
                "path": "src/lib.rs",
                "old_string": "pub fn norm2(&self) -> i32 {\n    self.x * self.x + self.y * self.y\n}",
                "new_string": "pub fn norm2(&self) -> i64 {}"
            }),
        )
        .await,
    );
    snap(
        "edit_file_not_unique",
        &call(
            &ctx,
            "edit_file",
            json!({"path": "src/lib.rs", "old_string": "pub fn", "new_string": "pub(crate) fn"}),
        )
        .await,
    );
    // Now the file changes behind the loop's back.
    std::fs::write(
        ctx.root().join("src/lib.rs"),
        "// rewritten by someone else\n",
    )
    .unwrap();
    snap(
        "edit_file_stale_read",
        &call(
            &ctx,
            "edit_file",
            json!({"path": "src/lib.rs", "old_string": "someone", "new_string": "a person"}),
        )
        .await,
    );
    snap(
        "edit_file_without_read",
        &call(
            &ctx,
            "edit_file",
            json!({"path": "src/util.rs", "old_string": "42", "new_string": "43"}),
        )
        .await,
    );
}

#[tokio::test]
async fn argument_and_sandbox_errors() {
    let (_d, ctx) = fixture();
    snap(
        "invalid_arguments",
        &call(
            &ctx,
            "read_file",
            json!({"path": 7, "offset": 0, "lines": 3}),
        )
        .await,
    );
    snap(
        "invalid_arguments_nested",
        &call(
            &ctx,
            "create_phase",
            json!({
                "name": "Bad Name",
                "title": "T",
                "objective": "O",
                "tasks": [{"description": "d", "action": "rename"}],
                "validation_command": ""
            }),
        )
        .await,
    );
    snap(
        "sandbox_violation",
        &call(&ctx, "read_file", json!({"path": "../outside/secret.txt"})).await,
    );
}

#[tokio::test]
async fn listing_and_search_outputs() {
    let (_d, ctx) = fixture();
    snap(
        "list_directory_recursive",
        &call(&ctx, "list_directory", json!({"recursive": true})).await,
    );
    snap(
        "glob",
        &call(&ctx, "glob", json!({"pattern": "**/*.rs"})).await,
    );
    snap(
        "grep_context_and_cap",
        &call(
            &ctx,
            "grep",
            json!({"pattern": "pub fn", "context": 1, "max_results": 3}),
        )
        .await,
    );
    snap(
        "symbols",
        &call(&ctx, "symbols", json!({"path": "src/lib.rs"})).await,
    );
}

#[tokio::test]
async fn run_command_outputs() {
    let (_d, ctx) = fixture();
    snap(
        "run_command_success",
        &call(
            &ctx,
            "run_command",
            json!({"command": "ls src; echo 'a warning' >&2"}),
        )
        .await,
    );
    snap(
        "run_command_failure",
        &call(
            &ctx,
            "run_command",
            json!({"command": "echo compiling; echo 'error: no such file' >&2; exit 3"}),
        )
        .await,
    );
    snap(
        "run_command_timeout",
        &call(
            &ctx,
            "run_command",
            json!({"command": "echo started; sleep 5", "timeout_ms": 1000}),
        )
        .await,
    );
}

#[tokio::test]
async fn create_phase_output() {
    let (_d, ctx) = fixture();
    let out = call(
        &ctx,
        "create_phase",
        json!({
            "name": "points",
            "title": "Constructors for Point",
            "objective": "Points can be built from coordinates.",
            "tasks": [
                {"description": "Add Point::new.", "file": "src/lib.rs", "action": "modify"},
                {"description": "Test it.\nCover the origin too.", "file": "tests/it.rs"}
            ],
            "validation_command": "cargo test"
        }),
    )
    .await;
    snap("create_phase", &out);
    let md =
        std::fs::read_to_string(ctx.root().join("taskdaemon-artifacts/phase-points.md")).unwrap();
    snap("create_phase_markdown", &md);
}
