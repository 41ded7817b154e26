//! A finished run told as text for a snapshot: each loop's end and what happened to it, in
//! its own order (loops run concurrently, so events are grouped by loop, never interleaved),
//! the inbox texts the model was shown, and the integration branch's history and files.
//! Times, event numbers, the run id, commit ids and temporary paths are replaced by
//! placeholders, so the text is the same on every run of a deterministic scenario.

use std::path::Path;

use serde_json::Value;

use super::git;

/// What to tell of a run.
pub struct Story<'a> {
    /// The run directory.
    pub run_dir: &'a Path,
    /// The repository the run integrated into (git runs there).
    pub repo: &'a Path,
    /// Branches whose first-parent history and files are shown (`{run}` is the run id).
    pub branches: &'a [&'a str],
    /// Paths that stand for themselves in the text: each replaced by its placeholder.
    pub paths: &'a [(&'a Path, &'a str)],
    /// Loops whose first prompt (the user text of their first model request) is shown.
    pub first_prompts: &'a [&'a str],
}

impl Story<'_> {
    /// The text.
    pub fn text(&self) -> String {
        let summary: Value = serde_json::from_str(
            &std::fs::read_to_string(self.run_dir.join("summary.json")).unwrap(),
        )
        .unwrap();
        let run_id = summary["run_id"].as_str().unwrap().to_string();
        let events: Vec<Value> = std::fs::read_to_string(self.run_dir.join("events.jsonl"))
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let mut out = format!("run: {}\n", summary["status"].as_str().unwrap_or("?"));
        let loops = summary["loops"].as_object().unwrap();
        for (name, entry) in loops {
            out.push_str(&format!(
                "\n## {name}: {} after {} iteration(s){}\n",
                entry["status"].as_str().unwrap_or("?"),
                entry["iterations"],
                match &entry["merge"] {
                    Value::Null => String::new(),
                    m => format!(
                        "; merge: merged={} into={} attempts={}",
                        m["merged"],
                        m["into"].as_str().unwrap_or("-"),
                        m["attempts"]
                    ),
                }
            ));
            if let Some(reason) = entry["reason"].as_str() {
                out.push_str(&format!("reason: {reason}\n"));
            }
            for e in &events {
                if let Some(line) = event_line(name, e) {
                    out.push_str(&format!("- {line}\n"));
                }
            }
            if self.first_prompts.contains(&name.as_str()) {
                out.push_str("first prompt:\n");
                for l in first_prompt(&self.run_dir.join("loops").join(name)).lines() {
                    out.push_str(&format!("  | {l}\n"));
                }
            }
            for shown in inbox_texts(&self.run_dir.join("loops").join(name)) {
                out.push_str("inbox shown:\n");
                for l in shown.lines() {
                    out.push_str(&format!("  | {l}\n"));
                }
            }
        }
        for branch in self.branches {
            let branch = branch.replace("{run}", &run_id);
            out.push_str(&format!("\n## branch {branch}\n"));
            out.push_str(&git(
                self.repo,
                &["log", "--first-parent", "--format=%s", &branch],
            ));
            out.push_str("files:\n");
            for file in git(self.repo, &["ls-tree", "-r", "--name-only", &branch]).lines() {
                let content = git(self.repo, &["show", &format!("{branch}:{file}")]);
                let shown = if content.len() > 200 {
                    format!("({} bytes)", content.len())
                } else {
                    content.trim_end().replace('\n', "\\n")
                };
                out.push_str(&format!("  {file}: {shown}\n"));
            }
        }
        self.normalise(&out, &run_id)
    }

    fn normalise(&self, text: &str, run_id: &str) -> String {
        let mut text = text.replace(run_id, "<run>");
        for (path, name) in self.paths {
            text = text.replace(&path.display().to_string(), name);
        }
        text = text.replace(&self.run_dir.display().to_string(), "<run-dir>");
        hide_commit_ids(&text)
    }
}

/// One event of `name`'s story, or `None` when it is not part of it.
fn event_line(name: &str, e: &Value) -> Option<String> {
    let kind = e["event"].as_str()?;
    let own = e["loop_name"].as_str() == Some(name);
    let to_me = e["recipients"]
        .as_array()
        .is_some_and(|r| r.iter().any(|x| x == name))
        || e["to"].as_str() == Some(name);
    let text = |k: &str| e[k].as_str().unwrap_or("").to_string();
    match kind {
        "loop_started" | "loop_completed" | "loop_failed" if own => Some(kind.to_string()),
        "iteration_ended" if own => Some(format!(
            "iteration {} ended, validation passed: {}",
            e["iteration"], e["validation_passed"]
        )),
        "loop_blocked" if own => Some(format!("blocked: {}", text("reason"))),
        "stop_requested" if own => Some(format!("stop requested by {}", text("by"))),
        "loop_merged" if own => Some(format!("merged into {}", text("into"))),
        "merge_handed_back" if own => Some(format!(
            "handed back (attempt {}), files {}",
            e["attempt"], e["files"]
        )),
        "alert" if to_me => Some(format!(
            "alert from {}: {}",
            text("from"),
            text("event_type")
        )),
        "shared" if to_me => Some(format!("share from {}", text("from"))),
        "conflict_predicted"
            if e["loops"]
                .as_array()
                .is_some_and(|l| l.iter().any(|x| x == name)) =>
        {
            Some(format!(
                "conflict predicted between {} in {}",
                e["loops"], e["files"]
            ))
        }
        _ => None,
    }
}

/// The user text of the loop's first model request.
fn first_prompt(loop_dir: &Path) -> String {
    let transcript = std::fs::read_to_string(loop_dir.join("transcript.jsonl")).unwrap_or_default();
    let first = transcript
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["entry"] == "request")
        .unwrap_or(Value::Null);
    let mut texts = Vec::new();
    for message in first["new_messages"].as_array().into_iter().flatten() {
        if message["role"] != "user" {
            continue;
        }
        for block in message["content"].as_array().into_iter().flatten() {
            if let Some(text) = block["text"].as_str() {
                texts.push(text.to_string());
            }
        }
    }
    texts.join("\n")
}

/// The inbox blocks the loop's model was shown, in order (each once).
fn inbox_texts(loop_dir: &Path) -> Vec<String> {
    let transcript = std::fs::read_to_string(loop_dir.join("transcript.jsonl")).unwrap_or_default();
    let mut found = Vec::new();
    for line in transcript.lines() {
        let Ok(entry) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if entry["entry"] != "request" {
            continue;
        }
        collect_inbox(&entry, &mut found);
    }
    found.dedup();
    let mut seen = Vec::new();
    for f in found {
        if !seen.contains(&f) {
            seen.push(f);
        }
    }
    seen
}

fn collect_inbox(v: &Value, found: &mut Vec<String>) {
    match v {
        Value::String(s) if s.starts_with("[inbox:") => found.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|x| collect_inbox(x, found)),
        Value::Object(o) => o.values().for_each(|x| collect_inbox(x, found)),
        _ => {}
    }
}

/// Replaces runs of 7 to 40 hex digits that hold a digit and a letter (commit ids, short or
/// whole) by `<commit>`.
fn hide_commit_ids(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        let hex = word.len() >= 7
            && word.len() <= 40
            && word
                .chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
            && word.chars().any(|c| c.is_ascii_digit())
            && word.chars().any(|c| c.is_ascii_alphabetic());
        if hex {
            out.push_str("<commit>");
        } else {
            out.push_str(word);
        }
        word.clear();
    };
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

/// Asserts the insta snapshot `name` (in `snapshots/`) of `text`.
pub fn snap(name: &str, text: &str) {
    insta::with_settings!({snapshot_path => "../../snapshots", prepend_module_to_snapshot => false}, {
        insta::assert_snapshot!(name, text);
    });
}
