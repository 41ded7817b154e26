//! `write_file`: creates or replaces a whole file (creating missing parent directories
//! inside the worktree), then refreshes the read stamp, because the loop's own write is not
//! a change made underneath it.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::context::{ToolContext, sha256_hex};
use crate::error::{ToolError, ToolResult};
use crate::receipts::SideEffect;
use crate::tools::{Tool, ToolOutput, args};

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
                "path": {
                    "type": "string",
                    "description": "Path of the file, relative to the worktree root (required). Missing parent directories are created."
                },
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
        let real = ctx.resolve(&args.path)?;
        let shown = ctx.display(&real);
        let job = {
            let real = real.clone();
            let shown = shown.clone();
            tokio::task::spawn_blocking(move || write_new(&real, &shown, args.content))
        };
        let (content, before) = job.await.map_err(|e| {
            ToolError::failed(format!("writing '{shown}'"), e, "Try the call again.")
        })??;
        let bytes = content.as_bytes();
        ctx.record_stamp(&real, bytes);
        let lines = content.lines().count();
        let size = bytes.len();
        let text = match before {
            Before::Nothing {
                parent_created: false,
            } => format!(
                "Created '{shown}' ({size} bytes, {lines} line{}).",
                plural(lines)
            ),
            Before::Nothing {
                parent_created: true,
            } => format!(
                "Created '{shown}' ({size} bytes, {lines} line{}) and its missing parent directories.",
                plural(lines)
            ),
            Before::File { size: old } => {
                format!(
                    "Overwrote '{shown}' ({size} bytes, {lines} line{}; it had {old} bytes).",
                    plural(lines)
                )
            }
        };
        Ok(ToolOutput::text(text).with_effect(SideEffect::FileWritten {
            path: shown,
            hash: sha256_hex(bytes),
        }))
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// Checks what is at `real`, creates missing parents and writes. Takes and gives back the
/// content so a large write is never copied.
fn write_new(real: &Path, shown: &str, content: String) -> ToolResult<(String, Before)> {
    let before = match std::fs::metadata(real) {
        Ok(meta) if meta.is_dir() => {
            return Err(ToolError::failed(
                format!("writing '{shown}'"),
                "it is a directory",
                format!(
                    "Choose a file path, e.g. '{}/name.ext', or use list_directory to see what is inside.",
                    shown.trim_end_matches('/')
                ),
            ));
        }
        Ok(meta) if !meta.is_file() => {
            return Err(ToolError::failed(
                format!("writing '{shown}'"),
                "it is not a regular file (a FIFO, socket or device)",
                "Choose another path.",
            ));
        }
        Ok(meta) => Before::File { size: meta.len() },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // `real` is already resolved inside the worktree (every existing symlink on the
            // way followed), so creating its parent cannot step outside.
            let parent: Option<PathBuf> = real.parent().map(Path::to_path_buf);
            let parent_created = match parent {
                Some(p) if !p.is_dir() => {
                    std::fs::create_dir_all(&p).map_err(|e| {
                        ToolError::failed(
                            format!("creating the parent directories of '{shown}'"),
                            e,
                            "A file may be in the way where a directory is needed; choose another path or check it with list_directory.",
                        )
                    })?;
                    true
                }
                _ => false,
            };
            Before::Nothing { parent_created }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {
            return Err(ToolError::failed(
                format!("writing '{shown}'"),
                "a part of the path before the file name is a file, not a directory",
                "Choose another path, or check the parts with list_directory.",
            ));
        }
        Err(e) => return Err(ToolError::from_io("checking", shown, &e)),
    };
    write_in_place(real, shown, content).map(|c| (c, before))
}

/// Writes `content` to `real` in place (keeping the inode, so permissions and hard links
/// survive) and hands the content back. Shared with `edit_file`.
pub(crate) fn write_in_place(real: &Path, shown: &str, content: String) -> ToolResult<String> {
    std::fs::write(real, content.as_bytes())
        .map_err(|e| ToolError::from_io("writing", shown, &e))?;
    Ok(content)
}
