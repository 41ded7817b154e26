//! The dashboard in a real browser (issue 17): `taskdaemon run --ui` on a scripted run, Debian's
//! headless Chromium driven through chromedriver, and what a user sees and does checked on
//! the page itself: the loops, a question with its answer and a share in the timeline, a
//! loop's transcript, and a loop stopped from its row's button (which the run record then
//! shows as `stop_requested` by the dashboard, followed by `loop_stopped`).
//!
//! Without `/usr/bin/chromium` and `/usr/bin/chromedriver` the test fails, saying to install
//! Debian's `chromium chromium-driver` (CI's `.ci/run` does): a dashboard nobody looked at
//! in a browser is not tested.

mod common;

use std::time::{Duration, Instant};

use common::browser::{Driver, UiRun, page_errors, require_browser, text_of, until, wait_line};
use common::fixture_project::{Project, path_arg, read_jsonl};
use fantoccini::Locator;
use serde_json::Value;

/// Longest any one step may take (a guard, not an expectation).
const STEP: Duration = Duration::from_secs(30);

fn events_named(project: &Project, name: &str) -> Vec<Value> {
    let path = project.run_dir().join("events.jsonl");
    if !path.exists() {
        return Vec::new();
    }
    read_jsonl(&path)
        .into_iter()
        .filter(|e| e["event"] == name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_the_loops_their_messages_and_a_transcript_and_stops_a_loop() {
    require_browser();
    let project = Project::new("dashboard-browser", &[]);
    let (config, run_dir) = (path_arg(&project.config()), path_arg(&project.run_dir()));
    let cmd = project.taskdaemon(&[
        "run",
        "-c",
        &config,
        "--run-dir",
        &run_dir,
        "--ui",
        "--ui-port",
        "0",
    ]);
    let mut run = UiRun::start(cmd, STEP);
    assert!(
        run.url.starts_with("http://127.0.0.1:"),
        "a loopback dashboard needs no token: {}",
        run.url
    );

    let driver = Driver::start();
    let client = driver.session().await;
    client.goto(&run.url).await.expect("the dashboard loads");

    // The loops, with their live state: `asker` completes, `answerer` runs its long command.
    let status = |name: &str| format!("#loops tr[data-loop=\"{name}\"] [data-col=\"status\"]");
    text_of(&client, &status("asker"), STEP, |t| t == "completed").await;
    text_of(&client, &status("answerer"), STEP, |t| t == "running").await;
    let tool = text_of(
        &client,
        "#loops tr[data-loop=\"answerer\"] [data-col=\"tool\"]",
        STEP,
        |t| t.starts_with("run_command"),
    )
    .await;
    assert!(tool.starts_with("run_command"), "{tool}");

    // The dependency graph: `later` waits for `asker`, and is drawn after it.
    text_of(&client, &status("later"), STEP, |t| t == "completed").await;
    let edges = client
        .find_all(Locator::Css("#graph .edges path"))
        .await
        .expect("the graph's edges");
    assert_eq!(edges.len(), 1, "one dependency, one edge");
    client
        .find(Locator::Css(
            "#graph [data-node=\"later\"][data-status=\"completed\"]",
        ))
        .await
        .expect("later's node, coloured by its status");

    // The question, its answer and how long it took; the share.
    let query = text_of(&client, "#timeline [data-kind=\"query\"]", STEP, |t| {
        t.contains("port 8080")
    })
    .await;
    for part in [
        "asker",
        "answerer",
        "Which port will you serve on?",
        "answered in",
    ] {
        assert!(
            query.contains(part),
            "the query item lacks {part:?}: {query}"
        );
    }
    let share = text_of(&client, "#timeline [data-kind=\"share\"]", STEP, |t| {
        t.contains("api_info")
    })
    .await;
    for part in ["answerer", "asker", "v2"] {
        assert!(
            share.contains(part),
            "the share item lacks {part:?}: {share}"
        );
    }

    // A loop's transcript opens from its row, turn by turn.
    client
        .find(Locator::Css(
            "#loops tr[data-loop=\"asker\"] [data-col=\"name\"]",
        ))
        .await
        .expect("asker's row")
        .click()
        .await
        .expect("asker's row can be clicked");
    text_of(&client, "#detail-name", STEP, |t| t == "asker").await;
    let response = text_of(
        &client,
        "#transcript .t-entry[data-entry=\"response\"]",
        STEP,
        |t| t.contains("query_loop"),
    )
    .await;
    assert!(
        response.contains("Asking answerer which port it serves."),
        "the model's text is in its turn: {response}"
    );
    let results = client
        .find_all(Locator::Css(
            "#transcript .t-entry[data-entry=\"tool_result\"]",
        ))
        .await
        .expect("tool results");
    assert!(
        results.len() >= 3,
        "query_loop, write_file and complete_task results are shown: {}",
        results.len()
    );
    client
        .find(Locator::Css("#detail-close"))
        .await
        .expect("the close button")
        .click()
        .await
        .expect("the detail closes");

    // Stop `answerer` from its row: its command (`sleep 600`) is cancelled, the row says so.
    let clicked = Instant::now();
    client
        .find(Locator::Css("button[data-stop-loop=\"answerer\"]"))
        .await
        .expect("answerer's stop button (it is running)")
        .click()
        .await
        .expect("the stop button can be clicked");
    text_of(&client, &status("answerer"), STEP, |t| t == "stopped").await;
    assert!(
        clicked.elapsed() < Duration::from_secs(20),
        "the stop took {:?}: the command in flight was not cancelled promptly",
        clicked.elapsed()
    );
    text_of(&client, "#timeline [data-kind=\"control\"]", STEP, |t| {
        t.contains("answerer")
    })
    .await;

    // The run record says what the dashboard did, before the loop's end.
    let requested = until("stop_requested in events.jsonl", STEP, || async {
        events_named(&project, "stop_requested").into_iter().next()
    })
    .await;
    assert_eq!(requested["loop_name"], "answerer", "{requested}");
    assert_eq!(requested["by"], "dashboard", "{requested}");
    let stopped = until("loop_stopped in events.jsonl", STEP, || async {
        events_named(&project, "loop_stopped")
            .into_iter()
            .find(|e| e["loop_name"] == "answerer")
    })
    .await;
    assert!(
        stopped["seq"].as_u64() > requested["seq"].as_u64(),
        "stop_requested {requested} comes before loop_stopped {stopped}"
    );

    // The run ends; the dashboard stays, now showing a finished run without controls.
    let finished = wait_line(&run.stdout, STEP, |l| {
        l.starts_with("run finished").then(|| l.to_string())
    });
    assert!(finished.is_some(), "the run did not say it finished");
    until("the page to show the run finished", STEP, || async {
        let stop_run = client.find(Locator::Css("#stop-run")).await.ok()?;
        let shown = stop_run.is_displayed().await.ok()?;
        let buttons = client
            .find_all(Locator::Css("button[data-stop-loop]"))
            .await
            .ok()?;
        (!shown && buttons.is_empty()).then_some(())
    })
    .await;
    assert_eq!(project.summary()["loops"]["answerer"]["status"], "stopped");

    let errors = page_errors(&client).await;
    assert!(errors.is_empty(), "the page threw: {errors:?}");
    client.close().await.expect("the browser session ends");
    drop(driver);
    run.terminate(STEP);
}
