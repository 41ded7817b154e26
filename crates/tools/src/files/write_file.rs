//! `write_file`: creates or replaces a whole file (creating missing parent directories
//! inside the worktree), then refreshes the read stamp, because the loop's own write is not
//! a change made underneath it.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::files::access::replace_error;
use td_base::hash::sha256_hex;
use td_base::text::count;
use td_toolkit::args;
use td_toolkit::context::ToolContext;
use td_toolkit::error::{ToolError, ToolResult};
use td_toolkit::receipts::SideEffect;
use td_toolkit::tool::{Tool, ToolOutput};
use td_toolkit::worktree_fs::WorktreeFs;
use td_toolkit::worktree_fs::replace::Expect;

const NAME: &str = "write_file";

/// The `write_file` tool.
pub struct WriteFile;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    path: String,
    content: String,
}

/// What was at the path before the write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Before {
    Nothing { parent_created: bool },
    File { size: u64 },
}

#[async_trait]
impl Tool for WriteFile {
    fn name(&self) -> &'static str {
        NAME
    }

    fn description(&self) -> &'static str {
        "Write a whole file: creates it (and any missing parent directories) or replaces its entire content. To change part of an existing file, prefer edit_file. A file you wrote can be edited without reading it first."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": super::path_schema(&format!("{} Missing parent directories are created.", super::FILE_PATH)),
                "content": {
                    "type": "string",
                    "description": "The complete new content of the file (required; may be empty)."
                }
            },
            "required": ["path", "content"],
            "additionalProperties": false
        })
    }

    async fn execute(&self, input: Value, ctx: &ToolContext) -> ToolResult<ToolOutput> {
        let args: WriteArgs = args::parse(NAME, input)?;
        if args.path.ends_with('/') {
            return Err(ToolError::invalid(
                NAME,
                "/path",
                format!(
                    "'{}' ends with '/', which names a directory. Give the path of a file, e.g. '{}file.txt'.",
                    args.path, args.path
                ),
            ));
        }
        let real = ctx.resolve_for_write(&args.path)?;
        let shown = ctx.display(&real);
        let previous = ctx.stamp_own_write(&real, args.content.as_bytes());
        let job = {
            let real = real.clone();
            let shown = shown.clone();
            let files = Arc::clone(ctx.files());
            tokio::task::spawn_blocking(move || write_new(&files, &real, &shown, args.content))
        };
        let written = job
            .await
            .map_err(|e| ToolError::failed(format!("writing '{shown}'"), e, "Try the call again."))
            .and_then(|r| r);
        let (content, before) = match written {
            Ok(w) => w,
            Err(e) => {
                ctx.undo_write_stamp(&real, previous);
                return Err(e);
            }
        };
        ctx.finish_own_write(&real);
        let bytes = content.as_bytes();
        let lines = content.lines().count() as u64;
        let size = bytes.len() as u64;
        let what = format!(
            "'{shown}' ({}, {})",
            count(size, "byte"),
            count(lines, "line")
        );
        let text = match before {
            Before::Nothing {
                parent_created: false,
            } => format!("Created {what}."),
            Before::Nothing {
                parent_created: true,
            } => format!("Created {what} and its missing parent directories."),
            Before::File { size: old } => {
                format!("Overwrote {what}; it had {}.", count(old, "byte"))
            }
        };
        Ok(ToolOutput::text(text).with_effect(SideEffect::FileWritten {
            path: shown,
            hash: sha256_hex(bytes),
        }))
    }
}

/// Replaces (or creates, with its missing parents) the file at `real` beneath the root, and
/// gives the content back so that a large write is never copied.
fn write_new(
    files: &WorktreeFs,
    real: &Path,
    shown: &str,
    content: String,
) -> ToolResult<(String, Before)> {
    let how = Expect::Anything {
        create_parents: true,
    };
    let done = files
        .replace(real, content.as_bytes(), how)
        .map_err(|e| replace_error(files, e, "writing", real, shown))?;
    let before = match done.before {
        Some(size) => Before::File { size },
        None => Before::Nothing {
            parent_created: done.made_parents,
        },
    };
    Ok((content, before))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{assert_set_refuses, worktree as setup};
    use std::os::unix::fs::symlink;
    use td_toolkit::context::StampCheck;

    async fn write(ctx: &ToolContext, path: &str, content: &str) -> ToolResult<ToolOutput> {
        WriteFile
            .execute(json!({"path": path, "content": content}), ctx)
            .await
    }

    #[tokio::test]
    async fn creates_a_file_and_its_parents_and_reports_the_effect() {
        let (_d, ctx) = setup();
        let out = write(&ctx, "a/b/c.txt", "one\ntwo\n").await.unwrap();
        assert_eq!(
            out.content,
            "Created 'a/b/c.txt' (8 bytes, 2 lines) and its missing parent directories."
        );
        let real = ctx.root().join("a/b/c.txt");
        assert_eq!(std::fs::read(&real).unwrap(), b"one\ntwo\n");
        assert_eq!(
            out.effects,
            vec![SideEffect::FileWritten {
                path: "a/b/c.txt".into(),
                hash: sha256_hex(b"one\ntwo\n"),
            }]
        );
        assert!(!out.is_error);
        assert!(!WriteFile.read_only());
    }

    #[tokio::test]
    async fn creating_beside_existing_files_and_overwriting_say_which() {
        let (_d, ctx) = setup();
        let out = write(&ctx, "x.txt", "1").await.unwrap();
        assert_eq!(out.content, "Created 'x.txt' (1 byte, 1 line).");
        let out = write(&ctx, "x.txt", "").await.unwrap();
        assert_eq!(
            out.content,
            "Overwrote 'x.txt' (0 bytes, 0 lines); it had 1 byte."
        );
        assert_eq!(std::fs::read(ctx.root().join("x.txt")).unwrap(), b"");
    }

    #[tokio::test]
    async fn its_own_write_refreshes_the_stamp() {
        let (_d, ctx) = setup();
        write(&ctx, "s.txt", "content\n").await.unwrap();
        let real = ctx.root().join("s.txt");
        assert_eq!(ctx.check_stamp(&real, b"content\n"), StampCheck::Current);
        // Overwriting a file that was stamped with older content refreshes it too.
        write(&ctx, "s.txt", "newer\n").await.unwrap();
        assert_eq!(ctx.check_stamp(&real, b"newer\n"), StampCheck::Current);
    }

    #[tokio::test]
    async fn directories_are_refused_clearly() {
        let (_d, ctx) = setup();
        std::fs::create_dir(ctx.root().join("src")).unwrap();
        for path in ["src", ".", "src/.."] {
            let err = write(&ctx, path, "x").await.unwrap_err();
            assert_eq!(err.kind(), "failed", "{path}");
            assert!(err.to_string().contains("it is a directory"), "{err}");
        }
        let err = write(&ctx, "newdir/", "x").await.unwrap_err();
        assert_eq!(err.kind(), "invalid_arguments");
        assert!(err.to_string().contains("at /path"), "{err}");
        assert!(!ctx.root().join("newdir").exists());
    }

    #[tokio::test]
    async fn a_file_in_the_way_of_a_parent_is_a_clear_error() {
        let (_d, ctx) = setup();
        std::fs::write(ctx.root().join("f"), "x").unwrap();
        let err = write(&ctx, "f/g.txt", "y").await.unwrap_err();
        assert_eq!(err.kind(), "failed");
        assert!(
            err.to_string().contains("is a file, not a directory"),
            "{err}"
        );
        let err = write(&ctx, "f/h/g.txt", "y").await.unwrap_err();
        assert!(err.to_string().contains("not a directory"), "{err}");
    }

    #[tokio::test]
    async fn escapes_are_refused_and_nothing_is_created_outside() {
        let (_d, ctx) = setup();
        let outside = tempfile::tempdir().unwrap();
        let o = outside.path();
        std::fs::write(o.join("existing.txt"), "keep").unwrap();
        symlink(o.join("existing.txt"), ctx.root().join("link")).unwrap();
        symlink(o.join("new.txt"), ctx.root().join("dangling")).unwrap();
        symlink(o, ctx.root().join("dirlink")).unwrap();
        let abs = o.join("abs.txt");
        for path in [
            "../x.txt",
            "/etc/passwd",
            abs.to_str().unwrap(),
            "link",
            "dangling",
            "dirlink/sub/file.txt",
            "dirlink/file.txt",
        ] {
            let err = write(&ctx, path, "pwned").await.unwrap_err();
            assert_eq!(err.kind(), "sandbox_violation", "{path}");
        }
        assert_eq!(
            std::fs::read_to_string(o.join("existing.txt")).unwrap(),
            "keep"
        );
        let mut left: Vec<String> = std::fs::read_dir(o)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, vec!["existing.txt".to_string()]);
        assert!(!ctx.root().parent().unwrap().join("x.txt").exists());
    }

    #[tokio::test]
    async fn a_dangling_symlink_inside_creates_its_target_inside() {
        let (_d, ctx) = setup();
        symlink("target.txt", ctx.root().join("alias.txt")).unwrap();
        let out = write(&ctx, "alias.txt", "hi").await.unwrap();
        assert_eq!(out.content, "Created 'target.txt' (2 bytes, 1 line).");
        assert_eq!(
            std::fs::read_to_string(ctx.root().join("target.txt")).unwrap(),
            "hi"
        );
    }

    #[tokio::test]
    async fn the_schema_requires_both_fields() {
        let (_d, ctx) = setup();
        let set = crate::all_tools();
        let refused = [
            json!({"path": "a.txt"}),
            json!({"content": "x"}),
            json!({"path": "a.txt", "content": 3}),
            json!({"path": "a.txt", "content": "x", "mode": "append"}),
        ];
        assert_set_refuses(&set, &ctx, NAME, &refused).await;
        assert!(!ctx.root().join("a.txt").exists());
        let out = set
            .call(&ctx, None, NAME, json!({"path": "a.txt", "content": "x"}))
            .await;
        assert!(!out.is_error);
        assert_eq!(out.receipt.side_effects.len(), 1);
    }
}
