//! What `create_plan`, `create_spec` and `create_phase` share: artifact names, argument
//! checks that a JSON Schema cannot express, and writing an artifact as a JSON file plus a
//! readable Markdown file under `taskdaemon-artifacts/` in the worktree (an ordinary folder,
//! committed with the loop's work: see `td_toolkit::artifact_files`).

use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::files::access::replace_error;
use td_base::hash::sha256_hex;
use td_toolkit::args;
pub use td_toolkit::artifact_files::{ARTIFACT_DIR, NAME_PATTERN, is_valid_name};
use td_toolkit::context::ToolContext;
use td_toolkit::error::{ArgumentProblem, ToolError, ToolResult};
use td_toolkit::receipts::SideEffect;
use td_toolkit::tool::ToolOutput;
use td_toolkit::worktree_fs::replace::Expect;

/// Schema of a name property.
pub fn name_schema(what: &str) -> Value {
    json!({
        "type": "string",
        "pattern": NAME_PATTERN,
        "description": format!("{what}: 1 to 64 of a-z, 0-9, '_' and '-', starting with a letter or digit (e.g. \"auth-api\"). Required, no default.")
    })
}

/// Schema of a required, non-empty text property.
pub fn text_schema(description: &str) -> Value {
    json!({
        "type": "string",
        "minLength": 1,
        "description": format!("{description} Required, no default.")
    })
}

/// Collects every problem of one input, so the model can fix them all in one retry.
#[derive(Debug)]
pub struct Problems {
    tool: &'static str,
    list: Vec<ArgumentProblem>,
}

impl Problems {
    /// No problems yet, for `tool`.
    pub fn new(tool: &'static str) -> Self {
        Self {
            tool,
            list: Vec::new(),
        }
    }

    /// Records a problem at `pointer`.
    pub fn push(&mut self, pointer: impl Into<String>, message: impl Into<String>) {
        self.list.push(ArgumentProblem {
            pointer: pointer.into(),
            message: message.into(),
        });
    }

    /// Checks a name against [`NAME_PATTERN`].
    pub fn name(&mut self, pointer: impl Into<String>, name: &str) {
        if !is_valid_name(name) {
            self.push(
                pointer,
                format!("'{name}' is not a valid name; use 1 to 64 of a-z, 0-9, '_' and '-', starting with a letter or digit"),
            );
        }
    }

    /// Checks that a text is not blank.
    pub fn text(&mut self, pointer: impl Into<String>, value: &str, what: &str) {
        if value.trim().is_empty() {
            self.push(pointer, format!("{what} is blank; write it out"));
        }
    }

    /// Checks one item of a list (a plan's spec, a spec's phase) at `at`, e.g. `/specs/0`:
    /// its name is valid and its title and description are not blank.
    pub fn item(&mut self, at: &str, name: &str, title: &str, description: &str) {
        self.name(format!("{at}/name"), name);
        self.text(format!("{at}/title"), title, "the title");
        self.text(format!("{at}/description"), description, "the description");
    }

    /// Checks that names are unique within a list; `pointer_of(i)` points at item `i`'s name.
    pub fn unique_names<'a>(
        &mut self,
        names: impl IntoIterator<Item = &'a str>,
        pointer_of: impl Fn(usize) -> String,
        what: &str,
    ) {
        let mut seen: Vec<&str> = Vec::new();
        for (i, name) in names.into_iter().enumerate() {
            if seen.contains(&name) {
                self.push(
                    pointer_of(i),
                    format!("{what} name '{name}' is used twice; give each {what} its own name"),
                );
            } else {
                seen.push(name);
            }
        }
    }

    /// `Ok` when nothing was found, else `InvalidArguments` listing everything.
    pub fn finish(self) -> ToolResult<()> {
        if self.list.is_empty() {
            Ok(())
        } else {
            Err(ToolError::InvalidArguments {
                tool: self.tool.to_string(),
                problems: self.list,
            })
        }
    }
}

/// The input of a `create_*` tool: an artifact with a name and a title, plus what makes
/// each kind different (its checks, its Markdown, its summary).
pub trait Body: DeserializeOwned + Serialize {
    /// The tool that creates this kind of artifact.
    const TOOL: &'static str;
    /// `plan`, `spec` or `phase`: the JSON's `kind` and the files' prefix.
    const KIND: &'static str;
    /// The artifact's name (checked against [`NAME_PATTERN`] by [`create`]).
    fn name(&self) -> &str;
    /// The artifact's title (checked for blankness by [`create`]).
    fn title(&self) -> &str;
    /// Records every problem the schema cannot express beyond name and title.
    fn check(&self, ctx: &ToolContext, problems: &mut Problems);
    /// The artifact as readable Markdown.
    fn markdown(&self) -> String;
    /// A few words on the content for the output, e.g. "3 specs".
    fn summary(&self) -> String;
}

/// The whole `execute` of a `create_*` tool: parse, check everything (reporting all
/// problems at once, writing nothing on error), then save the JSON and Markdown files.
pub async fn create<B: Body>(input: Value, ctx: &ToolContext) -> ToolResult<ToolOutput> {
    let body: B = args::parse(B::TOOL, input)?;
    let mut problems = Problems::new(B::TOOL);
    problems.name("/name", body.name());
    problems.text("/title", body.title(), "the title");
    body.check(ctx, &mut problems);
    problems.finish()?;
    let artifact = Artifact {
        tool: B::TOOL,
        kind: B::KIND,
        name: body.name(),
        json: artifact_json(B::KIND, &body)?,
        markdown: body.markdown(),
        summary: body.summary(),
    };
    save(ctx, &artifact).await
}

/// The top of an artifact's Markdown, the same for every kind: the heading, the name, how
/// many `items` it has, its main text under `## {section}`, then the `## {items}` heading.
pub fn markdown_head(
    kind: &str,
    title: &str,
    name: &str,
    (section, text): (&str, &str),
    (items, count): (&str, usize),
) -> String {
    format!(
        "# {}: {}\n\n- Name: {}\n- {items}: {count}\n\n## {section}\n\n{}\n\n## {items}\n",
        capitalized(kind),
        one_line(title),
        inline_code(name),
        text.trim()
    )
}

/// `kind` with its first letter in upper case ("plan" -> "Plan").
fn capitalized(kind: &str) -> String {
    let mut title = kind.to_string();
    if let Some(first) = title.get_mut(0..1) {
        first.make_ascii_uppercase();
    }
    title
}

/// The JSON written for an artifact: its kind, then the validated input.
#[derive(Serialize)]
struct Stored<'a, T: Serialize> {
    kind: &'a str,
    #[serde(flatten)]
    body: &'a T,
}

/// The pretty JSON of an artifact of `kind`.
pub fn artifact_json<T: Serialize>(kind: &str, body: &T) -> ToolResult<String> {
    serde_json::to_string_pretty(&Stored { kind, body })
        .map(|mut s| {
            s.push('\n');
            s
        })
        .map_err(|e| {
            ToolError::failed(
                format!("serializing the {kind}"),
                e,
                "This is a bug in the tool; report it and continue.",
            )
        })
}

/// An artifact ready to be written.
#[derive(Debug)]
pub struct Artifact<'a> {
    /// The tool writing it (for error messages).
    pub tool: &'static str,
    /// `plan`, `spec` or `phase`.
    pub kind: &'static str,
    /// Its name (checked against [`NAME_PATTERN`] again before it becomes a path).
    pub name: &'a str,
    /// The JSON file's content.
    pub json: String,
    /// The Markdown file's content.
    pub markdown: String,
    /// A few words on its content for the output, e.g. "3 specs".
    pub summary: String,
}

/// Writes `<kind>-<name>.json` and `<kind>-<name>.md` under [`ARTIFACT_DIR`], refreshes the
/// read stamps of both and reports them; says "replacing" when one of them existed.
pub async fn save(ctx: &ToolContext, artifact: &Artifact<'_>) -> ToolResult<ToolOutput> {
    let Artifact {
        tool, kind, name, ..
    } = *artifact;
    if !is_valid_name(name) {
        // Callers check first; this keeps a bad name from ever becoming a path.
        return Err(ToolError::invalid(
            tool,
            "/name",
            format!("'{name}' is not a valid name; use 1 to 64 of a-z, 0-9, '_' and '-'"),
        ));
    }
    let what = &artifact.summary;
    let mut replaced = false;
    let mut written = Vec::new();
    for (ext, content) in [("json", &artifact.json), ("md", &artifact.markdown)] {
        let rel = td_toolkit::artifact_files::worktree_path(
            &td_toolkit::artifact_files::file_name(kind, name, ext),
        );
        // Only to the real file of that name. A symlink on the way (a command may have
        // planted `taskdaemon-artifacts` as one, or a link in it) would otherwise send the
        // write wherever it points in the worktree, `.git/hooks` included; and what is
        // committed, listed in the next stage's prompt and copied into the run record is
        // only ever the folder's own regular files. The write rules of the loop's own writes
        // (no `.git`, no run record) hold here too.
        let path = ctx.root().join(&rel);
        if ctx.resolve(&rel)? != path {
            return Err(ToolError::ProtectedPath {
                path: rel,
                reason: format!(
                    "a symlink stands where the artifact goes (the path or a directory on the way); artifacts are written only as real files under {ARTIFACT_DIR}/. Remove the link with run_command, then try again."
                ),
            });
        }
        ctx.resolve_for_write(&rel)?;
        let shown = ctx.display(&path);
        // The loop writes it, so it may edit it next without reading it first; stamped
        // before the write so the watcher sees the loop's own bytes.
        let previous = ctx.stamp_own_write(&path, content.as_bytes());
        // Beneath the root and atomic, like write_file: the daemon writes here for the loop.
        let job = {
            let files = Arc::clone(ctx.files());
            let (path, shown, bytes) = (path.clone(), shown.clone(), content.as_bytes().to_vec());
            tokio::task::spawn_blocking(move || {
                let how = Expect::Anything {
                    create_parents: true,
                };
                files
                    .replace(&path, &bytes, how)
                    .map_err(|e| replace_error(&files, e, "writing", &path, &shown))
            })
        };
        let done = job
            .await
            .map_err(|e| ToolError::failed(format!("writing '{shown}'"), e, "Try the call again."))
            .and_then(|r| r);
        match done {
            Ok(done) => replaced |= done.before.is_some(),
            Err(e) => {
                ctx.undo_write_stamp(&path, previous);
                return Err(e);
            }
        }
        ctx.finish_own_write(&path);
        written.push((shown, sha256_hex(content.as_bytes())));
    }
    let title = capitalized(kind);
    let verb = if replaced {
        "saved, replacing the earlier one of that name"
    } else {
        "created"
    };
    let mut out = ToolOutput::text(String::new());
    out.content = format!("{title} '{name}' {verb} ({what}).\n");
    for (path, hash) in written {
        out.content.push_str(&format!("Wrote {path}\n"));
        out = out.with_effect(SideEffect::FileWritten { path, hash });
    }
    Ok(out)
}

/// `text` on one line (titles go into Markdown headings).
pub fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `text` as a fenced code block whose fence no backtick run inside can close.
pub fn code_block(text: &str, lang: &str) -> String {
    let mut longest = 0;
    let mut run = 0;
    for c in text.chars() {
        if c == '`' {
            run += 1;
            longest = longest.max(run);
        } else {
            run = 0;
        }
    }
    let fence = "`".repeat(longest.max(2) + 1);
    format!("{fence}{lang}\n{}\n{fence}\n", text.trim_end())
}

/// `text` as inline code that survives backticks inside it.
pub fn inline_code(text: &str) -> String {
    if text.contains('`') {
        format!("`` {text} ``")
    } else {
        format!("`{text}`")
    }
}

/// A multi-line `text` indented by `indent` after its first line (list item bodies).
pub fn hang(text: &str, indent: &str) -> String {
    text.trim()
        .lines()
        .enumerate()
        .map(|(i, l)| {
            if i == 0 || l.trim().is_empty() {
                l.trim_end().to_string()
            } else {
                format!("{indent}{}", l.trim_end())
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_pattern_and_the_code_check_agree() {
        let re = regex::Regex::new(NAME_PATTERN).unwrap();
        for s in [
            "a",
            "-a",
            "auth-api",
            "A",
            &"a".repeat(64),
            &"a".repeat(65),
            "a/b",
        ] {
            assert_eq!(re.is_match(s), is_valid_name(s), "{s}");
        }
    }

    #[test]
    fn problems_collect_everything() {
        let mut p = Problems::new("create_plan");
        p.name("/name", "Bad Name");
        p.text("/title", "  ", "the title");
        p.unique_names(["a", "b", "a"], |i| format!("/specs/{i}/name"), "spec");
        let text = p.finish().unwrap_err().to_string();
        assert!(
            text.contains("at /name: 'Bad Name' is not a valid name"),
            "{text}"
        );
        assert!(text.contains("at /title: the title is blank"));
        assert!(text.contains("at /specs/2/name: spec name 'a' is used twice"));
        assert!(Problems::new("t").finish().is_ok());
    }

    #[test]
    fn markdown_helpers() {
        assert_eq!(code_block("a ``` b\n", "sh"), "````sh\na ``` b\n````\n");
        assert_eq!(code_block("cargo test", ""), "```\ncargo test\n```\n");
        assert_eq!(inline_code("a`b"), "`` a`b ``");
        assert_eq!(hang("one\ntwo\n\nthree", "   "), "one\n   two\n\n   three");
        assert_eq!(one_line(" a\n b  c "), "a b c");
    }

    fn artifact<'a>(name: &'a str, markdown: &str) -> Artifact<'a> {
        Artifact {
            tool: "create_plan",
            kind: "plan",
            name,
            json: "{}\n".into(),
            markdown: markdown.into(),
            summary: "1 spec".into(),
        }
    }

    #[tokio::test]
    async fn save_writes_both_files_stamps_them_and_says_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ToolContext::new(dir.path(), "t").unwrap();
        let out = save(&ctx, &artifact("p1", "# P\n")).await.unwrap();
        assert_eq!(
            out.content,
            "Plan 'p1' created (1 spec).\nWrote taskdaemon-artifacts/plan-p1.json\nWrote taskdaemon-artifacts/plan-p1.md\n"
        );
        let json_path = dir.path().join("taskdaemon-artifacts/plan-p1.json");
        assert_eq!(std::fs::read_to_string(&json_path).unwrap(), "{}\n");
        let real = ctx.resolve("taskdaemon-artifacts/plan-p1.md").unwrap();
        assert_eq!(
            ctx.check_stamp(&real, b"# P\n"),
            td_toolkit::context::StampCheck::Current
        );
        assert_eq!(
            out.effects[1],
            SideEffect::FileWritten {
                path: "taskdaemon-artifacts/plan-p1.md".into(),
                hash: sha256_hex(b"# P\n")
            }
        );
        let again = save(&ctx, &artifact("p1", "# P2\n")).await.unwrap();
        assert!(
            again.content.contains("replacing the earlier one"),
            "{}",
            again.content
        );
        assert_eq!(std::fs::read_to_string(real).unwrap(), "# P2\n");
    }

    #[tokio::test]
    async fn save_refuses_bad_names_and_escaping_directories() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ToolContext::new(dir.path(), "t").unwrap();
        let err = save(&ctx, &artifact("../x", "#")).await.unwrap_err();
        assert_eq!(err.kind(), "invalid_arguments");
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join(ARTIFACT_DIR)).unwrap();
        let err = save(&ctx, &artifact("x", "#")).await.unwrap_err();
        assert_eq!(err.kind(), "sandbox_violation");
        assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none());
    }

    #[tokio::test]
    async fn a_folder_planted_as_a_link_into_the_worktree_is_refused() {
        // A command made `taskdaemon-artifacts` a link to `.git/hooks` (or any directory
        // of the worktree): the artifact would land there, a hook the daemon's git runs.
        let dir = tempfile::tempdir().unwrap();
        let hooks = dir.path().join(".git/hooks");
        std::fs::create_dir_all(&hooks).unwrap();
        std::fs::create_dir(dir.path().join("src")).unwrap();
        let ctx = ToolContext::new(dir.path(), "t").unwrap();
        for target in [".git/hooks", "src"] {
            let link = dir.path().join(ARTIFACT_DIR);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(target, &link).unwrap();
            let err = save(&ctx, &artifact("x", "#")).await.unwrap_err();
            assert_eq!(err.kind(), "sandbox_violation", "{target}: {err}");
            assert!(
                err.to_string().contains("taskdaemon-artifacts"),
                "{target}: {err}"
            );
        }
        assert!(std::fs::read_dir(&hooks).unwrap().next().is_none());
        assert!(
            std::fs::read_dir(dir.path().join("src"))
                .unwrap()
                .next()
                .is_none()
        );
    }

    #[tokio::test]
    async fn a_link_in_the_folder_is_not_written_through() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("README.md"), "mine\n").unwrap();
        let folder = dir.path().join(ARTIFACT_DIR);
        std::fs::create_dir(&folder).unwrap();
        std::os::unix::fs::symlink("../README.md", folder.join("plan-x.json")).unwrap();
        let ctx = ToolContext::new(dir.path(), "t").unwrap();
        let err = save(&ctx, &artifact("x", "#")).await.unwrap_err();
        assert_eq!(err.kind(), "sandbox_violation", "{err}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("README.md")).unwrap(),
            "mine\n"
        );
        // In its place, a regular file where the folder goes: refused, nothing written.
        std::fs::remove_dir_all(&folder).unwrap();
        std::fs::write(&folder, "not a folder").unwrap();
        assert!(save(&ctx, &artifact("x", "#")).await.is_err());
        assert_eq!(std::fs::read_to_string(&folder).unwrap(), "not a folder");
    }
}

/// Fixtures shared by the `create_*` tools' tests.
#[cfg(test)]
pub(crate) mod test_support {
    use std::path::Path;

    use serde_json::Value;

    use td_toolkit::context::ToolContext;
    use td_toolkit::error::ToolResult;
    use td_toolkit::tool::{Tool, ToolOutput};

    /// Runs `tool` on a fresh worktree; returns the worktree (to inspect, and to keep it
    /// alive) and the result.
    pub async fn run(tool: &dyn Tool, input: Value) -> (tempfile::TempDir, ToolResult<ToolOutput>) {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ToolContext::new(dir.path(), "t").unwrap();
        let out = tool.execute(input, &ctx).await;
        (dir, out)
    }

    /// The parsed JSON and the Markdown of the artifact `<stem>.json`/`.md` in `worktree`.
    pub fn stored(worktree: &Path, stem: &str) -> (Value, String) {
        let base = worktree.join(super::ARTIFACT_DIR);
        let json = std::fs::read_to_string(base.join(format!("{stem}.json"))).unwrap();
        let md = std::fs::read_to_string(base.join(format!("{stem}.md"))).unwrap();
        (serde_json::from_str(&json).unwrap(), md)
    }
}
