//! The dashboard's server through the real binary: `taskdaemon ui` on a finished run and
//! `taskdaemon run --ui` on a live one (the `dashboard` fixture: `asker` queries `worker`
//! and shares a note with it, `worker` runs a command the test chooses, `later` waits for
//! `worker`), the stop buttons through the run's control socket, and bad input of every
//! kind: unknown runs and loops, malformed paths, foreign hosts and origins, tokens, a second
//! client, a client that goes away mid-stream, garbage on the control socket.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Child;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};

mod common;

use common::fixture_project::{Project, RUN_GUARD, finish, path_arg, read_jsonl};

/// The `dashboard` fixture and the directory its command signals through (`started`,
/// touched before `work` runs; the test's flags; `{sync}` in `work` stands for it).
fn project(work: &str) -> (Project, tempfile::TempDir) {
    let sync = tempfile::tempdir().unwrap();
    let project = Project::new(
        "dashboard",
        &[
            ("STARTED", path_arg(&sync.path().join("started"))),
            ("WORK", work.replace("{sync}", &path_arg(sync.path()))),
            ("SYNC", path_arg(sync.path())),
        ],
    );
    (project, sync)
}

/// A running `taskdaemon` whose stdout lines arrive on a channel.
struct Served {
    child: Option<Child>,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
    url: String,
}

impl Served {
    fn start(mut child: Child) -> Served {
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut served = Served {
            child: Some(child),
            lines,
            seen: Vec::new(),
            url: String::new(),
        };
        let first = served.line_with("dashboard: ", RUN_GUARD);
        served.url = first.trim_start_matches("dashboard: ").trim().to_string();
        served
    }

    /// Waits for a stdout line containing `needle`.
    fn line_with(&mut self, needle: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => {
                    let child = self.child.as_mut().unwrap();
                    let status = child.try_wait().unwrap();
                    panic!(
                        "no line with {needle:?} (exited: {status:?}); stdout:\n{}",
                        self.seen.join("\n")
                    );
                }
            }
        }
    }

    /// `PATH` on the server, without the page's trailing slash.
    fn at(&self, path: &str) -> String {
        format!("{}{}", self.url.trim_end_matches('/'), path)
    }

    fn pid(&self) -> i32 {
        i32::try_from(self.child.as_ref().unwrap().id()).unwrap()
    }

    /// Sends SIGTERM and waits for the exit.
    fn terminate(mut self) -> common::fixture_project::Outcome {
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.pid(), libc::SIGTERM) }, 0);
        finish(self.child.take().unwrap(), Duration::from_secs(20))
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One server-sent event.
#[derive(Debug, Clone, Default, PartialEq)]
struct Sse {
    id: Option<String>,
    event: Option<String>,
    data: String,
}

/// Reads server-sent events from `url` until `done` says so, the stream ends, or `limit`.
async fn read_sse(
    client: &reqwest::Client,
    url: &str,
    headers: &[(&str, &str)],
    limit: Duration,
    mut done: impl FnMut(&[Sse]) -> bool,
) -> Vec<Sse> {
    let mut request = client.get(url);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let mut body = response.bytes_stream();
    let mut text = String::new();
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if done(&events) {
            return events;
        }
        let chunk = match tokio::time::timeout_at(deadline, body.next()).await {
            Ok(Some(chunk)) => chunk.unwrap(),
            Ok(None) => return events,
            Err(_) => panic!("the stream did not finish in {limit:?}: {events:#?}"),
        };
        text.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = text.find("\n\n") {
            let block: String = text.drain(..end + 2).collect();
            let mut event = Sse::default();
            let mut any = false;
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    event.id = Some(v.to_string());
                    any = true;
                } else if let Some(v) = line.strip_prefix("event: ") {
                    event.event = Some(v.to_string());
                    any = true;
                } else if let Some(v) = line.strip_prefix("data: ") {
                    event.data.push_str(v);
                    any = true;
                }
            }
            if any {
                events.push(event);
            }
        }
    }
}

fn record_events(events: &[Sse]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e.event.is_none())
        .map(|e| serde_json::from_str(&e.data).unwrap())
        .collect()
}

async fn get_json(client: &reqwest::Client, url: &str) -> (u16, Value) {
    let response = client.get(url).send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{url}: {e}: {text}"));
    (status, value)
}

/// `taskdaemon run --ui` on the fixture, once its worker's command runs.
fn live_run(project: &Project, sync: &tempfile::TempDir) -> Served {
    let (config, run_dir) = (path_arg(&project.config()), path_arg(&project.run_dir()));
    let served = Served::start(
        project
            .taskdaemon(&[
                "run",
                "-c",
                &config,
                "--run-dir",
                &run_dir,
                "--ui",
                "--ui-port",
                "0",
            ])
            .spawn()
            .unwrap(),
    );
    let started = sync.path().join("started");
    common::wait_until("the worker's command", RUN_GUARD, || started.exists());
    served
}

/// A finished run of the fixture, and `taskdaemon ui` serving it.
fn finished_run() -> (Project, Served, tempfile::TempDir) {
    let (project, sync) = project("true");
    let out = project.run(&project.config(), &[]);
    assert_eq!(out.code, Some(0), "{out}");
    let run_dir = path_arg(&project.run_dir());
    let served = Served::start(
        project
            .taskdaemon(&["ui", "--dir", &run_dir, "--port", "0"])
            .spawn()
            .unwrap(),
    );
    (project, served, sync)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_run_is_served_whole_and_its_stream_replays_every_event_then_ends() {
    let (project, served, _sync) = finished_run();
    assert!(
        served.url.starts_with("http://127.0.0.1:"),
        "{}",
        served.url
    );
    let client = reqwest::Client::new();

    let (status, run) = get_json(&client, &served.at("/api/run")).await;
    assert_eq!(status, 200, "{run}");
    let summary = project.summary();
    assert_eq!(run["run_id"], summary["run_id"]);
    assert_eq!(run["live"], false);
    assert_eq!(run["summary"]["status"], "completed");
    // The built-in `code` type's iteration limit, from the run's config (for `n/max`).
    let code_max =
        taskdaemon::config::Config::default().loop_types().unwrap()["code"].max_iterations;
    for name in ["asker", "worker", "later"] {
        assert_eq!(
            run["summary"]["loops"][name]["status"], "completed",
            "{run:#}"
        );
        assert_eq!(
            run["summary"]["loops"][name]["max_iterations"], code_max,
            "{run:#}"
        );
        assert_eq!(
            run["summary"]["loops"][name]["branch"],
            summary["loops"][name]["branch"]
        );
    }
    assert!(run["config"].as_str().unwrap().contains("name: worker"));

    // Every event of the record, in order and as written, then the end.
    let events = read_sse(
        &client,
        &served.at("/api/events"),
        &[],
        Duration::from_secs(20),
        |_| false,
    )
    .await;
    assert_eq!(events.last().unwrap().event.as_deref(), Some("end"));
    let lines: Vec<String> = std::fs::read_to_string(project.run_dir().join("events.jsonl"))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let sent: Vec<&Sse> = events.iter().filter(|e| e.event.is_none()).collect();
    assert_eq!(sent.len(), lines.len());
    for (i, (event, line)) in sent.iter().zip(&lines).enumerate() {
        assert_eq!(&event.data, line);
        assert_eq!(event.id.as_deref(), Some((i + 1).to_string().as_str()));
    }
    let kinds: Vec<String> = record_events(&events)
        .iter()
        .map(|e| e["event"].as_str().unwrap().to_string())
        .collect();
    for kind in [
        "run_started",
        "query_asked",
        "query_answered",
        "shared",
        "loop_completed",
    ] {
        assert!(kinds.iter().any(|k| k == kind), "{kind} missing: {kinds:?}");
    }

    // Resuming: only what came after.
    let after = read_sse(
        &client,
        &served.at("/api/events?after=5"),
        &[],
        Duration::from_secs(20),
        |_| false,
    )
    .await;
    assert_eq!(
        after.iter().find(|e| e.id.is_some()).unwrap().id.as_deref(),
        Some("6")
    );
    let resumed = read_sse(
        &client,
        &served.at("/api/events"),
        &[("Last-Event-ID", &lines.len().to_string())],
        Duration::from_secs(20),
        |_| false,
    )
    .await;
    assert_eq!(resumed.len(), 1, "{resumed:?}");
    assert_eq!(resumed[0].event.as_deref(), Some("end"));

    // One loop, its transcript, receipts and diff.
    let (status, later) = get_json(&client, &served.at("/api/loops/later")).await;
    assert_eq!(status, 200);
    assert_eq!(later["depends_on"], json!(["worker"]));
    assert_eq!(later["max_iterations"], code_max);
    assert_eq!(later["status"], "completed");
    let (status, page) =
        get_json(&client, &served.at("/api/loops/worker/transcript?limit=3")).await;
    assert_eq!(status, 200);
    let entries = page["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 3);
    assert_eq!(entries[0]["n"], 1);
    let first = common::lines(&project.transcript("worker"))[0].clone();
    assert_eq!(
        entries[0]["entry"],
        serde_json::from_str::<Value>(&first).unwrap()
    );
    assert_eq!(page["next"], 3);
    let (_, rest) = get_json(
        &client,
        &served.at("/api/loops/worker/transcript?after=3&limit=1000"),
    )
    .await;
    assert_eq!(rest["entries"][0]["n"], 4);
    let total = common::lines(&project.transcript("worker")).len();
    assert_eq!(rest["entries"].as_array().unwrap().len(), total - 3);
    let (status, receipts) = get_json(&client, &served.at("/api/loops/worker/receipts")).await;
    assert_eq!(status, 200);
    let tools: Vec<&str> = receipts["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["entry"]["tool"].as_str().unwrap())
        .collect();
    assert_eq!(
        tools,
        ["write_file", "run_command", "complete_task", "validate"]
    );
    let (status, diff) = get_json(&client, &served.at("/api/loops/worker/diff")).await;
    assert_eq!(status, 200, "{diff}");
    assert_eq!(diff["base"], "main");
    assert_eq!(diff["truncated"], false);
    assert!(
        diff["diff"].as_str().unwrap().contains("+work in progress"),
        "{diff}"
    );

    // The page, with its headers.
    for (path, kind) in [
        ("/", "text/html"),
        ("/app.js", "text/javascript"),
        ("/app.css", "text/css"),
    ] {
        let response = client.get(served.at(path)).send().await.unwrap();
        assert_eq!(response.status(), 200);
        let headers = response.headers();
        assert!(headers["content-type"].to_str().unwrap().starts_with(kind));
        assert_eq!(headers["content-security-policy"], "default-src 'self'");
        assert_eq!(headers["x-content-type-options"], "nosniff");
        assert_eq!(headers["cache-control"], "no-cache");
    }
    let out = served.terminate();
    assert_eq!(out.code, Some(0), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_errors_and_never_a_file_outside_the_run() {
    let (project, served, _sync) = finished_run();
    let client = reqwest::Client::new();
    // Something outside the run directory that a path escape would reach.
    std::fs::create_dir_all(project.root().join("outside")).unwrap();
    std::fs::write(
        project.root().join("outside/transcript.jsonl"),
        "{\"secret\":1}\n",
    )
    .unwrap();
    let long = "a".repeat(4000);
    for path in [
        "/api/loops/nope".to_string(),
        "/api/loops/nope/transcript".to_string(),
        "/api/loops/..%2F..%2Foutside/transcript".to_string(),
        "/api/loops/..%2F..%2F..%2Fetc/transcript".to_string(),
        "/api/loops/%2E%2E/transcript".to_string(),
        "/api/loops/worker%00/transcript".to_string(),
        "/api/loops/worker%2Ftranscript".to_string(),
        format!("/api/loops/{long}/diff"),
        "/api/loops//diff".to_string(),
        "/api/loops/%FF/receipts".to_string(),
        "/api/nothing".to_string(),
    ] {
        let response = client.get(served.at(&path)).send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        assert!(status == 400 || status == 404, "{path}: {status} {text}");
        let body: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{path}: {text}"));
        assert!(
            body["error"].is_string() && body["hint"].is_string(),
            "{path}: {body}"
        );
        assert!(!text.contains("secret"), "{path}: {text}");
    }
    for query in [
        "limit=0",
        "limit=1001",
        "after=-1",
        "after=x",
        "limit=1&what=2",
    ] {
        let (status, body) = get_json(
            &client,
            &served.at(&format!("/api/loops/worker/transcript?{query}")),
        )
        .await;
        assert_eq!(status, 400, "{query}: {body}");
    }
    let response = client
        .get(served.at("/api/events"))
        .header("Last-Event-ID", "twelve")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    // Another site's name for this address (DNS rebinding), another site's page.
    let response = client
        .get(served.at("/api/run"))
        .header("Host", "evil.example:80")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
    let response = client
        .post(served.at("/api/run/stop"))
        .header("Origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
    // Stopping what has ended.
    for path in ["/api/run/stop", "/api/loops/worker/stop"] {
        let response = client.post(served.at(path)).send().await.unwrap();
        assert_eq!(response.status(), 409, "{path}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"], "the run is not live");
    }
    let response = client
        .post(served.at("/api/loops/ghost/stop"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    let response = client.delete(served.at("/api/run")).send().await.unwrap();
    assert_eq!(response.status(), 405);

    // Two clients at once get the same events; one that goes mid-stream harms nothing.
    let url = served.at("/api/events");
    let (a, b) = tokio::join!(
        read_sse(&client, &url, &[], Duration::from_secs(20), |_| false),
        read_sse(&client, &url, &[], Duration::from_secs(20), |_| false),
    );
    assert_eq!(a, b);
    let cut = read_sse(&client, &url, &[], Duration::from_secs(20), |e| {
        e.len() >= 3
    })
    .await;
    assert_eq!(cut.len(), 3);
    drop(cut);
    let again = read_sse(&client, &url, &[], Duration::from_secs(20), |_| false).await;
    assert_eq!(again, a);
    let out = served.terminate();
    assert_eq!(out.code, Some(0), "{out}");
}

#[test]
fn an_unknown_run_or_a_taken_port_is_a_clear_error() {
    let (project, _sync) = project("true");
    let root = path_arg(project.root());
    let out = finish(
        project
            .taskdaemon(&["ui", "nosuchrun", "--dir", &root, "--port", "0"])
            .spawn()
            .unwrap(),
        Duration::from_secs(20),
    );
    assert_ne!(out.code, Some(0), "{out}");
    assert!(out.stderr.contains("no run"), "{out}");
    assert!(out.stdout.is_empty(), "{out}");

    let out = project.run(&project.config(), &[]);
    assert_eq!(out.code, Some(0), "{out}");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let run_dir = path_arg(&project.run_dir());
    let out = finish(
        project
            .taskdaemon(&["ui", "--dir", &run_dir, "--port", &port])
            .spawn()
            .unwrap(),
        Duration::from_secs(20),
    );
    assert_eq!(out.code, Some(1), "{out}");
    assert!(out.stderr.contains("--port"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_loopback_every_request_needs_the_token() {
    let (project, _sync) = project("true");
    let out = project.run(&project.config(), &[]);
    assert_eq!(out.code, Some(0), "{out}");
    let run_dir = path_arg(&project.run_dir());
    let served = Served::start(
        project
            .taskdaemon(&["ui", "--dir", &run_dir, "--port", "0", "--bind", "0.0.0.0"])
            .spawn()
            .unwrap(),
    );
    let (base, token) = served.url.split_once("/?token=").unwrap();
    assert_eq!(token.len(), 64);
    let port = base.rsplit(':').next().unwrap();
    let local = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    for url in [
        format!("{local}/api/run"),
        format!("{local}/api/run?token={}", "0".repeat(64)),
        format!("{local}/"),
    ] {
        let response = client.get(&url).send().await.unwrap();
        assert_eq!(response.status(), 403, "{url}");
    }
    let response = client
        .get(format!("{local}/api/run?token={token}"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let response = client
        .get(format!("{local}/api/run"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    drop(served);
}

/// Sends one raw line to the run's control socket and reads the answer.
fn control_line(run_dir: &Path, line: &str) -> Value {
    use std::io::Write;
    let mut stream = std::os::unix::net::UnixStream::connect(run_dir.join("control.sock")).unwrap();
    stream.write_all(line.as_bytes()).unwrap();
    stream.write_all(b"\n").unwrap();
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer).unwrap();
    serde_json::from_str(&answer).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_run_streams_new_events_and_the_stop_button_stops_a_loop_at_once() {
    let marker = format!("dashboard-stop-{}", std::process::id());
    let (project, sync) = project(&format!("sleep 600; echo {marker}"));
    let mut served = live_run(&project, &sync);
    let client = reqwest::Client::new();
    let (_, run) = get_json(&client, &served.at("/api/run")).await;
    assert_eq!(run["live"], true, "{run:#}");

    // The control socket turns away a wrong key and garbage; the run goes on.
    let key = std::fs::read_to_string(project.run_dir().join("control.key")).unwrap();
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(project.run_dir().join("control.key"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    let wrong = json!({"key": "0".repeat(key.trim().len()), "op": "stop_run"}).to_string();
    for line in [wrong.as_str(), "garbage", "{}"] {
        let answer = control_line(&project.run_dir(), line);
        assert_eq!(answer["ok"], false, "{line}: {answer}");
    }
    assert!(served.child.as_mut().unwrap().try_wait().unwrap().is_none());
    assert!(
        !common::pids_with(&marker).is_empty(),
        "the command is not running"
    );

    // An open stream sees the stop's events as they come.
    let url = served.at("/api/events");
    let watcher = {
        let client = client.clone();
        tokio::spawn(async move {
            read_sse(&client, &url, &[], RUN_GUARD, |events| {
                record_events(events)
                    .iter()
                    .any(|e| e["event"] == "loop_stopped" && e["loop_name"] == "worker")
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let asked = Instant::now();
    let response = client
        .post(served.at("/api/loops/worker/stop"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.json::<Value>().await.unwrap(), json!({"ok": true}));
    let streamed = watcher.await.unwrap();
    let took = asked.elapsed();
    assert!(took < Duration::from_secs(10), "the stop took {took:?}");
    common::wait_until(
        "the command's processes to go",
        Duration::from_secs(10),
        || common::pids_with(&marker).is_empty(),
    );
    // The worker's current tool, from its transcript: the command, then none once its
    // result (cancelled) is in.
    let tools: Vec<Value> = streamed
        .iter()
        .filter(|e| e.event.as_deref() == Some("tool"))
        .map(|e| serde_json::from_str(&e.data).unwrap())
        .filter(|t: &Value| t["loop_name"] == "worker")
        .collect();
    assert_eq!(
        tools.first().map(|t| &t["tool"]),
        Some(&json!("run_command")),
        "{tools:?}"
    );
    let streamed = record_events(&streamed);
    let requested = streamed
        .iter()
        .position(|e| e["event"] == "stop_requested")
        .expect("stop_requested on the stream");
    assert_eq!(streamed[requested]["loop_name"], "worker");
    assert_eq!(streamed[requested]["by"], "dashboard");
    let stopped = streamed
        .iter()
        .position(|e| e["event"] == "loop_stopped")
        .unwrap();
    assert!(requested < stopped);

    // The run ends (later is blocked by the stopped worker) and the dashboard stays.
    served.line_with("run finished; the dashboard stays at", RUN_GUARD);
    let events = read_jsonl(&project.run_dir().join("events.jsonl"));
    let of_worker: Vec<&str> = events
        .iter()
        .filter(|e| e["loop_name"] == "worker")
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    let at = |kind: &str| of_worker.iter().position(|k| *k == kind).unwrap();
    assert!(at("stop_requested") < at("loop_stopped"), "{of_worker:?}");
    let summary = project.summary();
    assert_eq!(summary["loops"]["worker"]["status"], "stopped");
    assert_eq!(summary["loops"]["worker"]["iterations"], 1);
    assert_eq!(summary["loops"]["later"]["status"], "blocked");
    assert_eq!(summary["loops"]["asker"]["status"], "completed");
    assert!(!project.run_dir().join("control.sock").exists());
    assert!(!project.run_dir().join("control.key").exists());
    let (_, run) = get_json(&client, &served.at("/api/run")).await;
    assert_eq!(run["live"], false);
    let response = client
        .post(served.at("/api/loops/asker/stop"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 409);
    let out = served.terminate();
    assert_eq!(out.code, Some(1), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_stop_button_ends_the_run_as_sigterm_does() {
    let (project, sync) = project("until [ -e '{sync}/flag' ]; do sleep 0.05; done");
    let flag = sync.path().join("flag");
    let mut served = live_run(&project, &sync);
    let client = reqwest::Client::new();
    let response = client
        .post(served.at("/api/run/stop"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    // As after SIGTERM: the call in flight finishes first.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, run) = get_json(&client, &served.at("/api/run")).await;
    assert_eq!(run["live"], true);
    std::fs::write(&flag, "").unwrap();
    served.line_with("run finished; the dashboard stays at", RUN_GUARD);
    let summary = project.summary();
    assert_eq!(summary["status"], "stopped", "{summary:#}");
    assert_eq!(summary["loops"]["worker"]["status"], "stopped");
    assert_eq!(
        summary["loops"]["later"]["reason"],
        "never started: the run was interrupted"
    );
    let events = read_jsonl(&project.run_dir().join("events.jsonl"));
    let requested = events
        .iter()
        .position(|e| e["event"] == "stop_requested")
        .unwrap();
    assert_eq!(events[requested]["loop_name"], Value::Null);
    assert_eq!(events[requested]["by"], "dashboard");
    let stopped = events
        .iter()
        .position(|e| e["event"] == "loop_stopped" && e["loop_name"] == "worker")
        .unwrap();
    assert!(requested < stopped);
    let dashboard = dashboard_pid(served.pid());
    let out = served.terminate();
    // SIGTERM's code: the run was stopped as SIGTERM stops it.
    assert_eq!(out.code, Some(143), "{out}");
    // The dashboard's process ended with it.
    assert!(!alive(dashboard), "the dashboard outlived the run");
}

/// The dashboard process of the `taskdaemon run --ui` whose pid is `daemon`.
fn dashboard_pid(daemon: i32) -> i32 {
    let children =
        std::fs::read_to_string(format!("/proc/{daemon}/task/{daemon}/children")).unwrap();
    let found: Vec<i32> = children
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == b"--run-dir-from-stdin"))
        })
        .collect();
    assert_eq!(found.len(), 1, "the daemon's children: {children}");
    found[0]
}

/// Whether process `pid` exists and is not a zombie.
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim().to_string()))
        .is_some_and(|rest| !rest.starts_with('Z'))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_is_a_process_of_its_own_that_ends_when_the_daemon_dies() {
    let (project, sync) = project("until [ -e '{sync}/flag' ]; do sleep 0.05; done");
    let mut served = live_run(&project, &sync);
    let dashboard = dashboard_pid(served.pid());
    assert_ne!(dashboard, served.pid());
    let client = reqwest::Client::new();
    let (status, run) = get_json(&client, &served.at("/api/run")).await;
    assert_eq!((status, &run["live"]), (200, &Value::Bool(true)), "{run}");
    // Ctrl-C in the terminal goes to the daemon's process group only: the dashboard, in a
    // group of its own, stays while the run stops.
    // SAFETY: getpgid(2) on pids of our own processes.
    let (group, daemon_group) = unsafe { (libc::getpgid(dashboard), libc::getpgid(served.pid())) };
    assert_ne!(group, daemon_group);
    // The daemon killed outright: the dashboard sees its input close and ends, and its port
    // stops answering.
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(served.pid(), libc::SIGKILL) }, 0);
    // Reaped, not read to its end: the dashboard holds the daemon's stderr until it ends.
    let mut child = served.child.take().unwrap();
    child.wait().unwrap();
    common::wait_until("the dashboard's end", Duration::from_secs(10), || {
        !alive(dashboard)
    });
    assert!(
        client.get(served.at("/api/run")).send().await.is_err(),
        "the dashboard still answers"
    );
}
