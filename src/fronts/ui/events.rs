//! `GET /api/events`: the run's events as server-sent events, past and future.
//!
//! Each line of `events.jsonl` is an event with `id: SEQ` and `data:` the line as written
//! (lines that are not events are skipped); `?after=SEQ` or a `Last-Event-ID` header skips
//! those up to SEQ. A loop's current tool comes as `event: tool` with `data: {"loop_name",
//! "tool": NAME or null, "time"}`; once the run is not live and everything was sent, `event:
//! end` (`data: {}`) and the stream closes. An idle stream gets a `: keepalive` comment
//! every 15 s.
//!
//! Each stream has a task of its own: it joins the shared feed, reads the events published
//! before it joined from `events.jsonl` itself (on a blocking thread, a line at a time,
//! held back by the client's pace), then passes on what the feed broadcasts. A client that
//! disconnects ends its task at the next event or keepalive; nothing else notices.

use std::convert::Infallible;
use std::io::{BufReader, Seek, SeekFrom};
use std::path::PathBuf;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tokio::sync::{broadcast, mpsc};

use super::api::AppState;
use super::error::ApiError;
use super::feed::{Feed, Item, MAX_LINE, event_item};
use super::lines::read_line;
use crate::run::record::EVENTS_FILE;

/// How often an idle stream sends a comment, so that proxies and browsers keep it.
const KEEPALIVE: Duration = Duration::from_secs(15);
/// Events queued for a slow client before its task waits.
const QUEUED: usize = 256;

/// `?after=SEQ`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    after: Option<u64>,
    #[serde(default)]
    #[allow(dead_code)]
    token: Option<String>,
}

/// `GET /api/events`.
pub async fn stream(
    State(app): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| {
        ApiError::bad_request(format!("bad query: {e}"), "after is an event number")
    })?;
    let last_id = match headers.get("last-event-id") {
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "Last-Event-ID is not an event number",
                        "reconnect without it to get every event",
                    )
                })?,
        ),
        None => None,
    };
    let after = last_id.or(query.after).unwrap_or(0);
    let (tx, rx) = mpsc::channel::<Event>(QUEUED);
    tokio::spawn(feed_client(
        app.feed.clone(),
        app.run_dir.clone(),
        after,
        tx,
    ));
    let events = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx))
    });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::new().interval(KEEPALIVE).text("keepalive"))
        .into_response())
}

/// Feeds one client until the run's stream ends or the client goes.
async fn feed_client(feed: Feed, run_dir: PathBuf, after: u64, tx: mpsc::Sender<Event>) {
    let mut pos: u64 = 0;
    loop {
        let join = feed.join();
        let upto = join.events_end;
        if upto > pos {
            let (dir, client) = (run_dir.clone(), tx.clone());
            let replayed =
                tokio::task::spawn_blocking(move || replay(&dir, pos, upto, after, &client)).await;
            match replayed {
                Ok(Some(end)) => pos = end,
                // The client went, or the file could not be read.
                _ => return,
            }
        }
        for tool in &join.tools {
            if tx.send(sse_of(tool)).await.is_err() {
                return;
            }
        }
        if join.ended {
            let _ = tx.send(end_event()).await;
            return;
        }
        let mut rx = join.rx;
        loop {
            let item = match rx.recv().await {
                Ok(item) => item,
                // Behind: read what was missed from the file, and join again.
                Err(broadcast::error::RecvError::Lagged(_)) => break,
                Err(broadcast::error::RecvError::Closed) => return,
            };
            match &*item {
                Item::Event { start, end, .. } => {
                    if *start < pos {
                        continue;
                    }
                    pos = *end;
                }
                Item::End => {
                    let _ = tx.send(end_event()).await;
                    return;
                }
                Item::Tool { .. } => {}
            }
            if let Item::Event { seq, .. } = &*item
                && *seq <= after
            {
                continue;
            }
            if tx.send(sse_of(&item)).await.is_err() {
                return;
            }
        }
    }
}

/// Sends the events of `events.jsonl` between byte offsets `from` and `upto` (whole lines)
/// with a number above `after`; returns where it stopped, `None` when the client went or the
/// file could not be read.
fn replay(
    dir: &std::path::Path,
    from: u64,
    upto: u64,
    after: u64,
    tx: &mpsc::Sender<Event>,
) -> Option<u64> {
    let mut file = std::fs::File::open(dir.join(EVENTS_FILE)).ok()?;
    file.seek(SeekFrom::Start(from)).ok()?;
    let mut reader = BufReader::new(file);
    let mut pos = from;
    while pos < upto {
        let line = read_line(&mut reader, MAX_LINE).ok()??;
        if !line.complete {
            break;
        }
        let start = pos;
        pos = pos.saturating_add(line.consumed());
        if let Some(super::feed::EventLine { item, .. }) = event_item(&line, start, pos)
            && matches!(&item, Item::Event { seq, .. } if *seq > after)
            && tx.blocking_send(sse_of(&item)).is_err()
        {
            return None;
        }
    }
    Some(pos)
}

fn end_event() -> Event {
    Event::default().event("end").data("{}")
}

/// The server-sent event of an item.
fn sse_of(item: &Item) -> Event {
    match item {
        Item::Event { seq, data, .. } => Event::default().id(seq.to_string()).data(&**data),
        Item::Tool { data, .. } => Event::default().event("tool").data(&**data),
        Item::End => end_event(),
    }
}
