//! The dashboard's JSON API: the run, one loop, its transcript, receipts and diff, and the
//! stop buttons (`GET /api/events`, the stream, is `events.rs`).
//!
//! - `GET /api/run` → `{run_id, dir, live, summary, config}`: `live` whether a process owns
//!   the run now, `summary` the shape of `summary.json` rebuilt from the events
//!   ([`run_summary`]), `config` the config file's text when it can be read;
//! - `GET /api/loops/NAME` → the loop's summary entry with `depends_on`, `base` (from the
//!   config, when readable) and `tool` (its current tool);
//! - `GET /api/loops/NAME/transcript?after=N&limit=M` and `.../receipts` → `{entries: [{n,
//!   entry}], next}` (lines numbered from 1; `limit` 200 by default, at most 1000);
//! - `GET /api/loops/NAME/diff` → `{base, branch, diff, truncated}`;
//! - `POST /api/loops/NAME/stop`, `POST /api/run/stop` → `{ok: true}`, through the run's
//!   control socket; 409 when the run is not live or refuses.
//!
//! Errors are `{error, hint}` with 400 (unreadable names or queries, unknown query
//! parameters), 403 (see `auth.rs`), 404 (no such loop or address), 405, 409 or 500. A loop
//! name from a URL is matched exactly against the loops the run's events name before it is
//! used for anything; every answer's JSON passes `redact_json`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::ApiError;
use super::feed::Feed;
use super::lines::read_line;
use super::project::Project;
use crate::run::control::{self, Command, SendError};
use crate::run::record::{
    LoopSummary, RECEIPTS_FILE, RunStatus, RunSummary, TRANSCRIPT_FILE, read_summary,
};

/// Most entries of one transcript or receipts page.
pub const MAX_PAGE: u64 = 1000;
/// Entries of a page when not asked.
pub const DEFAULT_PAGE: u64 = 200;
/// Longest transcript or receipt line returned as it is; a longer one is named only.
pub const MAX_ENTRY_BYTES: usize = 1024 * 1024;

/// What every handler shares.
pub struct App {
    /// The run directory.
    pub run_dir: PathBuf,
    /// The record's follower.
    pub feed: Feed,
    /// What the run's config says.
    pub project: Project,
}

/// The handlers' state.
pub type AppState = Arc<App>;

/// A JSON answer, redacted.
fn json_answer(status: StatusCode, value: &Value) -> Response {
    let text = serde_json::to_string(value).unwrap_or_else(|_| "null".to_string());
    let text = td_base::secrets::redact_json(&text).into_owned();
    (
        status,
        [(header::CONTENT_TYPE, "application/json; charset=utf-8")],
        text,
    )
        .into_response()
}

/// The loop a URL names, when the run has it.
fn loop_name(app: &App, path: Result<UrlPath<String>, PathRejection>) -> Result<String, ApiError> {
    let UrlPath(name) = path.map_err(|e| {
        ApiError::bad_request(
            format!("the loop name in the address cannot be read: {e}"),
            "use a loop name from GET /api/run",
        )
    })?;
    if app.feed.has_loop(&name) {
        Ok(name)
    } else {
        Err(ApiError::no_such_loop())
    }
}

/// The run's summary, rebuilt from its events and transcripts (`run/rebuild.rs`, the rule
/// the live record keeps), with what only `summary.json` holds (branches, worktrees, why a
/// loop never started, and how) taken from it when it reads; `interrupted` for a run recorded
/// running whose owner is gone, as `status` shows it.
pub fn run_summary(run_dir: &Path) -> Result<RunSummary, String> {
    let (mut summary, _notes) = crate::run::rebuild::rebuild(run_dir)?;
    if let Ok(written) = read_summary(run_dir) {
        for (name, kept) in written.loops {
            let entry = summary
                .loops
                .entry(name.clone())
                .or_insert_with(|| LoopSummary::pending(&name, &kept.loop_type));
            entry.branch = entry.branch.take().or(kept.branch);
            entry.worktree = entry.worktree.take().or(kept.worktree);
            entry.reason = entry.reason.take().or(kept.reason);
            // A loop that never started has no event of its end (stopped or blocked by the
            // run's end): only the summary says it.
            if entry.status == crate::run::record::LoopStatus::Pending {
                entry.status = kept.status;
            }
        }
        if written.status != RunStatus::Running {
            summary.status = written.status;
            summary.ended_at = written.ended_at;
        }
    }
    if summary.status == RunStatus::Running && !crate::run::owner::is_owned(run_dir) {
        summary.status = RunStatus::Interrupted;
    }
    Ok(summary)
}

async fn summary_of(app: &App) -> Result<RunSummary, ApiError> {
    let dir = app.run_dir.clone();
    tokio::task::spawn_blocking(move || run_summary(&dir))
        .await
        .map_err(|e| ApiError::internal(format!("reading the record failed: {e}")))?
        .map_err(ApiError::internal)
}

/// `GET /api/run`.
pub async fn run(State(app): State<AppState>) -> Result<Response, ApiError> {
    let summary = summary_of(&app).await?;
    let mut value = serde_json::to_value(&summary)
        .map_err(|e| ApiError::internal(format!("cannot write the run's summary: {e}")))?;
    // What the summary does not hold and the page draws (the dependency graph, `n/max`):
    // each loop's `depends_on` and its type's `max_iterations`, from the run's config.
    if let Some(loops) = value.get_mut("loops").and_then(Value::as_object_mut) {
        for (name, entry) in loops.iter_mut() {
            let info = app.project.loops.get(name).cloned().unwrap_or_default();
            if let Some(map) = entry.as_object_mut() {
                map.insert("depends_on".into(), json!(info.depends_on));
                map.insert("max_iterations".into(), json!(info.max_iterations));
            }
        }
    }
    Ok(json_answer(
        StatusCode::OK,
        &json!({
            "run_id": summary.run_id,
            "dir": app.run_dir.display().to_string(),
            "live": crate::run::owner::is_owned(&app.run_dir),
            "summary": value,
            "config": app.project.config_text,
        }),
    ))
}

/// `GET /api/loops/{name}`.
pub async fn one_loop(
    State(app): State<AppState>,
    path: Result<UrlPath<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let name = loop_name(&app, path)?;
    let summary = summary_of(&app).await?;
    let entry = summary
        .loops
        .get(&name)
        .cloned()
        .unwrap_or_else(|| LoopSummary::pending(&name, ""));
    let mut value = serde_json::to_value(&entry)
        .map_err(|e| ApiError::internal(format!("cannot write the loop's entry: {e}")))?;
    let info = app.project.loops.get(&name).cloned().unwrap_or_default();
    if let Some(map) = value.as_object_mut() {
        map.insert("depends_on".into(), json!(info.depends_on));
        map.insert("base".into(), json!(info.base));
        map.insert("max_iterations".into(), json!(info.max_iterations));
        map.insert("tool".into(), json!(app.feed.tool_of(&name)));
        map.entry("branch").or_insert(Value::Null);
        map.entry("worktree").or_insert(Value::Null);
    }
    Ok(json_answer(StatusCode::OK, &value))
}

/// `?after=N&limit=M` of a page.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    after: Option<u64>,
    limit: Option<u64>,
    /// The access token (checked by the guard; allowed here so that it may ride along).
    #[serde(default)]
    #[allow(dead_code)]
    token: Option<String>,
}

/// `GET /api/loops/{name}/transcript`.
pub async fn transcript(
    State(app): State<AppState>,
    path: Result<UrlPath<String>, PathRejection>,
    query: Result<Query<PageQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    loop_page(&app, path, query, TRANSCRIPT_FILE).await
}

/// `GET /api/loops/{name}/receipts`.
pub async fn receipts(
    State(app): State<AppState>,
    path: Result<UrlPath<String>, PathRejection>,
    query: Result<Query<PageQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    loop_page(&app, path, query, RECEIPTS_FILE).await
}

async fn loop_page(
    app: &App,
    path: Result<UrlPath<String>, PathRejection>,
    query: Result<Query<PageQuery>, QueryRejection>,
    file: &str,
) -> Result<Response, ApiError> {
    let name = loop_name(app, path)?;
    let Query(query) = query.map_err(|e| {
        ApiError::bad_request(
            format!("bad query: {e}"),
            "after and limit are whole numbers (limit at most 1000)",
        )
    })?;
    let after = query.after.unwrap_or(0);
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return Err(ApiError::bad_request(
            format!("limit {limit} is out of range"),
            format!("ask for 1 to {MAX_PAGE} entries"),
        ));
    }
    let path = crate::run::record::loop_dir(&app.run_dir, &name)
        .map_err(ApiError::internal)?
        .join(file);
    let page = tokio::task::spawn_blocking(move || page(&path, after, limit))
        .await
        .map_err(|e| ApiError::internal(format!("reading the record failed: {e}")))?
        .map_err(ApiError::internal)?;
    Ok(json_answer(StatusCode::OK, &page))
}

/// Entries of the JSONL file at `path` after line `after` (lines count from 1), at most
/// `limit`: `{"entries": [{"n", "entry"}], "next"}`. A missing file has none; a line over
/// [`MAX_ENTRY_BYTES`] is `{"kind": "too_large", "bytes"}`, one that does not parse
/// `{"kind": "unreadable", "error"}`; a torn last line is left for later.
pub fn page(path: &Path, after: u64, limit: u64) -> Result<Value, String> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(json!({"entries": [], "next": after}));
        }
        Err(e) => return Err(format!("cannot open the loop's record: {e}")),
    };
    let mut reader = std::io::BufReader::new(file);
    let mut entries = Vec::new();
    let mut n: u64 = 0;
    let mut next = after;
    while (entries.len() as u64) < limit {
        let Some(line) = read_line(&mut reader, MAX_ENTRY_BYTES)
            .map_err(|e| format!("cannot read the loop's record: {e}"))?
        else {
            break;
        };
        if !line.complete {
            break;
        }
        n = n.saturating_add(1);
        if n <= after {
            continue;
        }
        let entry = if line.too_long(MAX_ENTRY_BYTES) {
            json!({"kind": "too_large", "bytes": line.len})
        } else {
            match serde_json::from_slice::<Value>(&line.bytes) {
                Ok(v) => v,
                Err(e) => json!({"kind": "unreadable", "error": e.to_string()}),
            }
        };
        entries.push(json!({"n": n, "entry": entry}));
        next = n;
    }
    Ok(json!({"entries": entries, "next": next}))
}

/// `GET /api/loops/{name}/diff`.
pub async fn diff(
    State(app): State<AppState>,
    path: Result<UrlPath<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let name = loop_name(&app, path)?;
    let summary = summary_of(&app).await?;
    let entry = summary.loops.get(&name);
    let branch = entry
        .and_then(|e| e.branch.clone())
        .unwrap_or_else(|| td_git::worktree::loop_branch(&summary.run_id, &name));
    let worktree = entry
        .and_then(|e| e.worktree.as_deref())
        .and_then(|w| inside(Path::new(w), &app.run_dir));
    let Some(dir) = worktree.clone().or_else(|| app.project.repo.clone()) else {
        return Err(ApiError::not_found(
            "the repository of this run is not known: its config cannot be read",
            "run the dashboard from the directory the run was started in, or look with git log",
        ));
    };
    let base = match app.project.loops.get(&name).and_then(|l| l.base.clone()) {
        Some(base) => base,
        None => {
            let repo = td_git::worktree::Repo::open(app.project.repo.as_deref().unwrap_or(&dir))
                .await
                .map_err(|e| ApiError::internal(e.to_string()))?;
            repo.head_branch()
                .await
                .map_err(|e| ApiError::internal(e.to_string()))?
                .unwrap_or_else(|| "HEAD".to_string())
        }
    };
    let in_worktree = worktree.is_some();
    let found =
        tokio::task::spawn_blocking(move || super::diff::diff(&dir, &base, &branch, in_worktree))
            .await
            .map_err(|e| ApiError::internal(format!("git failed: {e}")))?;
    match found {
        Ok(diff) => Ok(json_answer(
            StatusCode::OK,
            &serde_json::to_value(diff).unwrap_or(Value::Null),
        )),
        Err(why) => Err(ApiError::new(
            StatusCode::CONFLICT,
            why,
            "the loop may not have a branch yet (it has not started)",
        )),
    }
}

/// `dir` when it lies inside `run_dir` (a loop's worktree the run made) and is a directory.
fn inside(dir: &Path, run_dir: &Path) -> Option<PathBuf> {
    let real = dir.canonicalize().ok()?;
    let root = run_dir.canonicalize().ok()?;
    (real.starts_with(&root) && real != root && real.is_dir()).then_some(real)
}

/// `POST /api/loops/{name}/stop`.
pub async fn stop_loop(
    State(app): State<AppState>,
    path: Result<UrlPath<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let name = loop_name(&app, path)?;
    control_answer(&app, Command::StopLoop(name)).await
}

/// `POST /api/run/stop`.
pub async fn stop_run(State(app): State<AppState>) -> Result<Response, ApiError> {
    control_answer(&app, Command::StopRun).await
}

async fn control_answer(app: &App, command: Command) -> Result<Response, ApiError> {
    let not_live = || {
        ApiError::new(
            StatusCode::CONFLICT,
            "the run is not live",
            "only a running run can be stopped; this one has ended",
        )
    };
    if !crate::run::owner::is_owned(&app.run_dir) {
        return Err(not_live());
    }
    match control::send(&app.run_dir, &command, "dashboard").await {
        Ok(()) => Ok(json_answer(StatusCode::OK, &json!({"ok": true}))),
        // Owned, but no socket: the run could not open it (it warned when it started), or
        // it ended just now.
        Err(SendError::NotLive(why)) if crate::run::owner::is_owned(&app.run_dir) => {
            Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("the run cannot be reached: {why}"),
                "the run said why when it started (a run directory too deep for a socket); stop it with Ctrl-C",
            ))
        }
        Err(SendError::NotLive(_)) => Err(not_live()),
        Err(SendError::Refused(why)) => Err(ApiError::new(
            StatusCode::CONFLICT,
            why,
            "the run refused; reload the page to see the loop's state",
        )),
        Err(SendError::Failed(why)) => Err(ApiError::internal(why)),
    }
}

/// Any other address.
pub async fn not_found() -> ApiError {
    ApiError::not_found(
        "nothing here",
        "the page is at /, the API under /api/run, /api/events and /api/loops/NAME",
    )
}

/// A known address with another method.
pub async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "this address does not take that method",
        "reads are GET; the stop buttons are POST",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_skip_count_and_name_what_cannot_be_shown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let big = format!("{{\"x\":\"{}\"}}", "a".repeat(MAX_ENTRY_BYTES));
        std::fs::write(
            &path,
            format!("{{\"a\":1}}\nnot json\n{big}\n{{\"a\":4}}\n{{\"torn\""),
        )
        .unwrap();
        let all = page(&path, 0, 10).unwrap();
        let entries = all["entries"].as_array().unwrap();
        assert_eq!(entries.len(), 4, "{all}");
        assert_eq!(entries[0], json!({"n": 1, "entry": {"a": 1}}));
        assert_eq!(entries[1]["entry"]["kind"], "unreadable");
        assert_eq!(entries[2]["entry"]["kind"], "too_large");
        assert_eq!(entries[3]["n"], 4);
        assert_eq!(all["next"], 4);
        let later = page(&path, 2, 1).unwrap();
        assert_eq!(later["entries"][0]["n"], 3);
        assert_eq!(later["next"], 3);
        let none = page(&dir.path().join("missing"), 7, 10).unwrap();
        assert_eq!(none, json!({"entries": [], "next": 7}));
    }
}
