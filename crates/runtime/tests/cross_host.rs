//! Coordination across processes: a "head" runtime and a "host" runtime in one process,
//! joined by the test's own in-memory `Upstream` (the head, as the host sees it) and
//! `RemoteLoop` links (the host's loops, as the head sees them), which call the other
//! side's coordinator as the cluster agents will, and which the test can cut.
//!
//! Real actors on both sides (coordinators, loop actors, lanes); the loops' model is a stub
//! that answers questions with who asked what, and records the prompts of their iterations,
//! so that what reached each loop's inbox is counted where the model sees it.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{Value, json};

use td_engine::budget::{Budgets, Carried, Limits, Pricing};
use td_llm::{Block, LlmClient, LlmError, LlmRequest, LlmResponse, Purpose, StopReason, Usage};
use td_protocol::events::{EventKind, EventLog};
use td_protocol::inbox::InboxItem;
use td_runtime::coordinator::CoordinatorPort;
use td_runtime::coordinator_handle::CoordinatorHandle;
use td_runtime::daemon::{Runtime, RuntimeConfig};
use td_runtime::remote_loop::RemoteLoop;
use td_runtime::upstream::Upstream;
use td_toolkit::coordination::{Coordination, Delivery, LoopInfo};
use td_toolkit::error::ToolError;
use td_toolkit::registry::ToolSet;

mod common;

/// Failure guard: nothing here should take more than a moment.
const GUARD: Duration = Duration::from_secs(20);
/// The askers' timeout: long, so that an error well before it is not a timeout.
const ASK: Duration = Duration::from_secs(30);

/// The loops' model: answers a question with who asked what; an iteration turn records its
/// prompt (the inbox is in it) and ends.
#[derive(Default)]
struct Stub {
    prompts: Mutex<BTreeMap<String, Vec<String>>>,
}

#[async_trait]
impl LlmClient for Stub {
    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
        let text = match &request.purpose {
            Purpose::QueryAnswer { from, question } => {
                format!("{} answers {from}: {question}", request.loop_name)
            }
            Purpose::Iteration => {
                let prompt: Vec<&str> = request
                    .messages
                    .iter()
                    .flat_map(|m| &m.content)
                    .filter_map(|b| match b {
                        Block::Text { text } => Some(text.as_str()),
                        _ => None,
                    })
                    .collect();
                self.prompts
                    .lock()
                    .unwrap()
                    .entry(request.loop_name.to_string())
                    .or_default()
                    .push(prompt.join("\n"));
                "done".to_string()
            }
        };
        Ok(LlmResponse {
            text: Some(text),
            tool_calls: Vec::new(),
            stop_reason: StopReason::EndTurn,
            usage: Usage {
                input_tokens: 5,
                output_tokens: 5,
                ..Usage::default()
            },
        })
    }
}

impl Stub {
    /// How many times `needle` appears in what loop `name`'s model was shown.
    fn seen(&self, name: &str, needle: &str) -> usize {
        self.prompts
            .lock()
            .unwrap()
            .get(name)
            .map_or(0, |ps| ps.iter().map(|p| p.matches(needle).count()).sum())
    }
}

/// The network between the head and the host.
#[derive(Default)]
struct Net(AtomicU8);

const UP: u8 = 0;
/// Cut, and the link knows it: deliveries are refused at once, questions fail at once.
const REFUSED: u8 = 1;
/// Cut silently: nothing comes back (a cable pulled), until the head drops the host.
const SILENT: u8 = 2;

impl Net {
    fn set(&self, state: u8) {
        self.0.store(state, Ordering::SeqCst);
    }
    fn state(&self) -> u8 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A host loop as the head sees it: calls the host runtime's coordinator.
struct Link {
    host: CoordinatorHandle,
    name: String,
    net: Arc<Net>,
}

#[async_trait]
impl RemoteLoop for Link {
    async fn deliver(&self, delivery: u64, item: Arc<InboxItem>) -> bool {
        match self.net.state() {
            UP => {
                self.host
                    .deliver_local(&self.name, Some(delivery), item)
                    .await
            }
            REFUSED => false,
            _ => std::future::pending().await,
        }
    }

    async fn answer(
        &self,
        from: &str,
        question: &str,
        timeout: Duration,
        // The host's own answerer settles its calls here, in one process: nothing to add.
        _spent: &Arc<std::sync::Mutex<td_protocol::spend::Spend>>,
    ) -> Result<String, ToolError> {
        match self.net.state() {
            UP => {
                self.host
                    .answer_local(&self.name, from, question, timeout)
                    .await
            }
            REFUSED => Err(ToolError::Unavailable {
                message: format!("the host of loop '{}' cannot be reached", self.name),
            }),
            _ => std::future::pending().await,
        }
    }
}

/// The head as the host sees it: calls the head runtime's coordinator.
struct Head {
    head: CoordinatorHandle,
    port: CoordinatorPort,
    /// The host's coordinator, for the links (set once the host runtime started).
    host: OnceLock<CoordinatorHandle>,
    net: Arc<Net>,
}

fn refused(e: impl std::fmt::Display) -> ToolError {
    ToolError::Unavailable {
        message: e.to_string(),
    }
}

#[async_trait]
impl Upstream for Head {
    async fn register(
        &self,
        name: &str,
        loop_type: &str,
        task: &str,
        subscriptions: Option<&[String]>,
    ) -> Result<(), ToolError> {
        if name.starts_with("refused") {
            return Err(refused(format!("the head refused loop {name}")));
        }
        let host = self.host.get().ok_or_else(|| refused("no host yet"))?;
        let link = Arc::new(Link {
            host: host.clone(),
            name: name.to_string(),
            net: self.net.clone(),
        });
        self.head
            .register_remote(
                name,
                loop_type,
                task,
                subscriptions.map(<[_]>::to_vec),
                link,
            )
            .await
            .map_err(refused)
    }

    async fn set_status(&self, name: &str, status: &str) -> Result<(), ToolError> {
        self.head.set_remote_status(name, status);
        Ok(())
    }

    async fn query(
        &self,
        from: &str,
        target: &str,
        question: &str,
        timeout: Duration,
    ) -> Result<String, ToolError> {
        self.port
            .query(&Arc::from(from), target, question, timeout)
            .await
    }

    async fn share(
        &self,
        from: &str,
        targets: &[String],
        data_type: &str,
        data: Value,
    ) -> Result<Vec<Delivery>, ToolError> {
        self.port.share(from, targets, data_type, data).await
    }

    async fn alert(
        &self,
        from: &str,
        event_type: &str,
        message: &str,
        data: Option<Value>,
        about: Option<&str>,
    ) -> Result<usize, ToolError> {
        self.head
            .alert(from, event_type, message, data, about)
            .await
    }

    async fn list_loops(&self, from: &str) -> Result<Vec<LoopInfo>, ToolError> {
        self.port.list_loops(from).await
    }

    async fn unregister(&self, name: &str) -> Result<(), ToolError> {
        self.head.unregister_remote(name).await;
        Ok(())
    }
}

/// A head and a host runtime joined in memory, with loops on each.
struct Pair {
    _dir: tempfile::TempDir,
    head: Runtime,
    host: Runtime,
    head_events: Arc<EventLog>,
    host_events: Arc<EventLog>,
    llm: Arc<Stub>,
    net: Arc<Net>,
    /// The host's loops' budgets.
    host_budgets: Arc<Budgets>,
}

fn config() -> RuntimeConfig {
    RuntimeConfig {
        watch_files: false,
        ..RuntimeConfig::default()
    }
}

/// Starts both runtimes, `head_loops` on the head and `host_loops` on the host, each
/// listening to `subscriptions`; their engines wait for [`Pair::release`].
async fn pair(head_loops: &[&str], host_loops: &[&str], subscriptions: &[&str]) -> Pair {
    let dir = tempfile::tempdir().unwrap();
    let head_events = Arc::new(EventLog::in_memory());
    let host_events = Arc::new(EventLog::in_memory());
    let net = Arc::new(Net::default());
    let mut head = Runtime::start(config(), head_events.clone()).await.unwrap();
    let upstream = Arc::new(Head {
        head: head.handle(),
        port: CoordinatorPort::new(head.coordinator.clone()),
        host: OnceLock::new(),
        net: net.clone(),
    });
    let mut host = Runtime::start(
        RuntimeConfig {
            upstream: Some(upstream.clone()),
            ..config()
        },
        host_events.clone(),
    )
    .await
    .unwrap();
    let _ = upstream.host.set(host.handle());
    let llm = Arc::new(Stub::default());
    // The host's budgets: no loop of the head is known there.
    let host_budgets = Budgets::new(Limits::default(), Pricing::default(), Carried::default());
    let subscriptions: Vec<String> = subscriptions.iter().map(|s| s.to_string()).collect();
    for (rt, events, names, budgets) in [
        (&mut head, &head_events, head_loops, Budgets::unlimited()),
        (&mut host, &host_events, host_loops, host_budgets.clone()),
    ] {
        for name in names {
            let spec = loop_on(rt, events, dir.path(), name, &llm, &subscriptions, &budgets);
            rt.spawn_loop(spec).await.unwrap();
        }
    }
    host.flush().await;
    head.flush().await;
    Pair {
        _dir: dir,
        head,
        host,
        head_events,
        host_events,
        llm,
        net,
        host_budgets,
    }
}

fn loop_on(
    rt: &Runtime,
    events: &Arc<EventLog>,
    dir: &Path,
    name: &str,
    llm: &Arc<Stub>,
    subscriptions: &[String],
    budgets: &Arc<Budgets>,
) -> td_runtime::loop_actor::LoopSpec {
    let worktree = dir.join(name);
    std::fs::create_dir_all(&worktree).unwrap();
    let ctx = Arc::new(rt.context(&worktree, name).unwrap());
    let tools = Arc::new(ToolSet::from_tools(Vec::new()).unwrap());
    let mut spec = common::loop_spec(rt, events, ctx, name, tools, llm.clone());
    spec.config.task = format!("the task of {name}");
    spec.subscriptions = Some(subscriptions.to_vec());
    spec.budgets = budgets.clone();
    spec
}

impl Pair {
    /// The coordination port of loop `name`'s tools, as its runtime gives it.
    fn port(&self, name: &str) -> Arc<dyn Coordination> {
        let rt = if self.is_host_loop(name) {
            &self.host
        } else {
            &self.head
        };
        let ctx = rt.context(self._dir.path(), name).unwrap();
        ctx.coordination().unwrap().clone()
    }

    fn is_host_loop(&self, name: &str) -> bool {
        name.starts_with('h')
    }

    /// Lets every loop run its one iteration and waits for them all to end.
    async fn run_to_end(&mut self, head_loops: &[&str], host_loops: &[&str]) {
        self.head.release().await;
        self.host.release().await;
        let ends = self.head.wait_for(head_loops, GUARD).await;
        assert_eq!(ends.len(), head_loops.len(), "{ends:?}");
        let ends = self.host.wait_for(host_loops, GUARD).await;
        assert_eq!(ends.len(), host_loops.len(), "{ends:?}");
        self.host.flush().await;
        self.head.flush().await;
    }

    async fn shutdown(self) {
        self.host.shutdown().await;
        self.head.shutdown().await;
    }
}

fn kinds(events: &EventLog) -> Vec<EventKind> {
    events.events().into_iter().map(|e| e.kind).collect()
}

fn is_coordination(kind: &EventKind) -> bool {
    matches!(
        kind,
        EventKind::QueryAsked { .. }
            | EventKind::QueryAnswered { .. }
            | EventKind::QueryFailed { .. }
            | EventKind::Shared { .. }
    ) || matches!(kind, EventKind::Alert { from, .. } if from != "taskdaemon")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_cross_both_ways_and_are_recorded_once_on_the_head() {
    let p = pair(&["a"], &["h1", "h2"], &[]).await;

    let to_head = p
        .port("h1")
        .query(&"h1".into(), "a", "which port?", ASK)
        .await;
    assert_eq!(to_head.unwrap(), "a answers h1: which port?");
    let to_host = p
        .port("a")
        .query(&"a".into(), "h1", "which schema?", ASK)
        .await;
    assert_eq!(to_host.unwrap(), "h1 answers a: which schema?");
    // Two loops of one host: routed by the head too.
    let on_host = p
        .port("h2")
        .query(&"h2".into(), "h1", "done yet?", ASK)
        .await;
    assert_eq!(on_host.unwrap(), "h1 answers h2: done yet?");
    // The head's refusals reach a host loop as they are.
    let unknown = p.port("h1").query(&"h1".into(), "zz", "anyone?", ASK).await;
    let unknown = unknown.unwrap_err().to_string();
    assert!(
        unknown.contains("unknown loop 'zz'") && unknown.contains("a, h2"),
        "{unknown}"
    );
    p.head.flush().await;

    let asked: Vec<(String, String)> = kinds(&p.head_events)
        .into_iter()
        .filter_map(|k| match k {
            EventKind::QueryAnswered { from, to, .. } => Some((from.to_string(), to.to_string())),
            _ => None,
        })
        .collect();
    let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    assert_eq!(asked, pairs(&[("h1", "a"), ("a", "h1"), ("h2", "h1")]));
    let head_kinds = kinds(&p.head_events);
    let count = |f: fn(&EventKind) -> bool| head_kinds.iter().filter(|k| f(k)).count();
    assert_eq!(count(|k| matches!(k, EventKind::QueryAsked { .. })), 3);
    assert_eq!(count(|k| matches!(k, EventKind::QueryFailed { .. })), 1);
    let host_kinds: Vec<EventKind> = kinds(&p.host_events)
        .into_iter()
        .filter(is_coordination)
        .collect();
    assert!(
        host_kinds.is_empty(),
        "the host records none: {host_kinds:?}"
    );

    // The answer h1 gave for `a` (unknown to the host's budgets) was charged at the host's
    // run level, and nothing panicked.
    let spent = p.host_budgets.run_spent();
    assert_eq!(spent.model_calls, 2, "{spent:?}");
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_cross_both_ways_and_each_is_shown_once() {
    let mut p = pair(&["a"], &["h1"], &[]).await;
    let delivered = p
        .port("a")
        .share("a", &["h1".to_string()], "schema", json!("MARK-A-TO-H1"))
        .await
        .unwrap();
    assert_eq!(delivered[0].error, None, "{delivered:?}");
    let delivered = p
        .port("h1")
        .share("h1", &["a".to_string()], "schema", json!("MARK-H1-TO-A"))
        .await
        .unwrap();
    assert_eq!(delivered[0].error, None, "{delivered:?}");
    // Several items to one remote loop arrive in the order they were sent.
    for n in 1..=5 {
        let to = ["h1".to_string()];
        let port = p.port("a");
        let sent = port.share("a", &to, "n", json!(format!("MARK-SEQ-{n}")));
        assert_eq!(sent.await.unwrap()[0].error, None);
    }

    p.run_to_end(&["a"], &["h1"]).await;
    let prompt = p.llm.prompts.lock().unwrap()["h1"].concat();
    let at: Vec<usize> = (1..=5)
        .map(|n| prompt.find(&format!("MARK-SEQ-{n}")).unwrap())
        .collect();
    assert!(at.is_sorted(), "{at:?}");
    assert_eq!(p.llm.seen("h1", "MARK-A-TO-H1"), 1);
    assert_eq!(p.llm.seen("a", "MARK-H1-TO-A"), 1);
    assert_eq!(p.llm.seen("a", "MARK-A-TO-H1"), 0);
    assert_eq!(p.llm.seen("h1", "MARK-H1-TO-A"), 0);

    let shared: Vec<(String, String, Option<String>)> = kinds(&p.head_events)
        .into_iter()
        .filter_map(|k| match k {
            EventKind::Shared {
                from,
                to,
                error,
                data_type,
                ..
            } if data_type == "schema" => Some((from, to, error)),
            _ => None,
        })
        .collect();
    assert_eq!(
        shared,
        vec![
            ("a".to_string(), "h1".to_string(), None),
            ("h1".to_string(), "a".to_string(), None),
        ]
    );
    assert!(
        !kinds(&p.host_events).iter().any(is_coordination),
        "the host records none"
    );

    // The host loop's end reached the head's listing.
    let listed = p.port("a").list_loops("a").await.unwrap();
    let h1 = listed.iter().find(|l| l.name == "h1").unwrap();
    assert_ne!(h1.status, "running", "{listed:?}");
    assert_eq!(h1.task, "the task of h1");
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alert_from_a_host_loop_reaches_the_others_but_not_its_sender() {
    let subs = ["api_ready", "loop_started"];
    let mut p = pair(&["a"], &["h1", "h2"], &subs).await;
    let reached = p
        .port("h1")
        .alert("h1", "api_ready", "MARK-API-UP", None)
        .await
        .unwrap();
    assert_eq!(reached, 2);

    let listed: Vec<String> = p
        .port("h1")
        .list_loops("h1")
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.name)
        .collect();
    assert_eq!(listed, ["a", "h2"]);

    p.run_to_end(&["a"], &["h1", "h2"]).await;
    assert_eq!(p.llm.seen("a", "MARK-API-UP"), 1);
    assert_eq!(p.llm.seen("h2", "MARK-API-UP"), 1);
    assert_eq!(p.llm.seen("h1", "MARK-API-UP"), 0);
    // System alerts of host loops: heard by the others that listen (h2 registered after
    // h1 announced itself), never by the loop they are about.
    assert_eq!(p.llm.seen("a", "loop `h1` started"), 1);
    assert_eq!(p.llm.seen("a", "loop `h2` started"), 1);
    assert_eq!(p.llm.seen("h1", "loop `h2` started"), 1);
    assert_eq!(p.llm.seen("h1", "loop `h1` started"), 0);
    assert_eq!(p.llm.seen("h2", "loop `h2` started"), 0);

    let alerts: Vec<Vec<String>> = kinds(&p.head_events)
        .into_iter()
        .filter_map(|k| match k {
            EventKind::Alert {
                from, recipients, ..
            } if from == "h1" => Some(recipients),
            _ => None,
        })
        .collect();
    assert_eq!(alerts, vec![vec!["a".to_string(), "h2".to_string()]]);
    assert!(!kinds(&p.host_events).iter().any(is_coordination));
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_host_fails_what_waits_on_its_loops_at_once() {
    let p = pair(&["a"], &["h1"], &[]).await;
    p.net.set(SILENT);
    let port = p.port("a");
    let asking = tokio::spawn({
        let port = port.clone();
        async move { port.query(&"a".into(), "h1", "which schema?", ASK).await }
    });
    let sharing = tokio::spawn({
        let port = port.clone();
        async move {
            port.share("a", &["h1".to_string()], "schema", json!("MARK-LOST"))
                .await
        }
    });
    // Both are under way and nothing comes back.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!asking.is_finished() && !sharing.is_finished());

    let lost = Instant::now();
    assert!(
        p.head
            .drop_remote("h1", "its host hostA was lost (no heartbeat for 3 s)")
            .await
    );
    let answer = tokio::time::timeout(GUARD, asking).await.unwrap().unwrap();
    let shared = tokio::time::timeout(GUARD, sharing).await.unwrap().unwrap();
    let took = lost.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "{took:?} (the timeout is {ASK:?})"
    );
    let error = answer.unwrap_err().to_string();
    assert_eq!(
        error,
        "loop 'h1' did not answer: its host hostA was lost (no heartbeat for 3 s); ask again later or ask another loop"
    );
    let delivery = shared.unwrap();
    let why = delivery[0].error.as_deref().unwrap_or("delivered");
    assert!(
        why.starts_with("not delivered") && why.contains("hostA was lost"),
        "{why}"
    );

    // Later messages get the error of a loop that left, with why (it may be moving to
    // another host: the asker learns it can ask again).
    let again = port.query(&"a".into(), "h1", "still there?", ASK).await;
    let again = again.unwrap_err().to_string();
    assert!(
        again.contains(
            "loop 'h1' has stopped (interrupted: its host hostA was lost (no heartbeat for 3 s))"
        ),
        "{again}"
    );
    assert!(port.list_loops("a").await.unwrap().is_empty());
    assert!(!p.head.drop_remote("h1", "again").await);

    p.head.flush().await;
    let head_kinds = kinds(&p.head_events);
    let failed: Vec<&String> = head_kinds
        .iter()
        .filter_map(|k| match k {
            EventKind::QueryFailed { error, .. } => Some(error),
            _ => None,
        })
        .collect();
    assert_eq!(failed.len(), 2, "{failed:?}");
    assert!(failed[0].contains("hostA was lost"), "{failed:?}");
    let shared: Vec<&Option<String>> = head_kinds
        .iter()
        .filter_map(|k| match k {
            EventKind::Shared { error, .. } => Some(error),
            _ => None,
        })
        .collect();
    assert_eq!(shared.len(), 1, "recorded once: {shared:?}");
    assert!(shared[0].is_some(), "{shared:?}");
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_over_a_cut_link_is_reported_not_delivered() {
    let mut p = pair(&["a"], &["h1", "h2"], &["api_ready"]).await;
    p.net.set(REFUSED);
    let port = p.port("a");
    let delivered = port
        .share(
            "a",
            &["h1".to_string(), "h2".to_string()],
            "schema",
            json!("MARK-CUT"),
        )
        .await
        .unwrap();
    for d in &delivered {
        let why = d.error.as_deref().unwrap_or("delivered");
        assert!(why.starts_with("not delivered"), "{delivered:?}");
    }
    let reached = port.alert("a", "api_ready", "MARK-CUT-ALERT", None).await;
    assert_eq!(reached.unwrap(), 0);
    let answer = port.query(&"a".into(), "h1", "there?", ASK).await;
    let answer = answer.unwrap_err().to_string();
    assert!(answer.contains("cannot be reached"), "{answer}");

    // What was reported not delivered was not: the loops never see it.
    p.net.set(UP);
    p.run_to_end(&["a"], &["h1", "h2"]).await;
    for h in ["h1", "h2"] {
        assert_eq!(p.llm.seen(h, "MARK-CUT"), 0, "{h}");
    }
    let head_kinds = kinds(&p.head_events);
    let errors: Vec<&Option<String>> = head_kinds
        .iter()
        .filter_map(|k| match k {
            EventKind::Shared { error, .. } => Some(error),
            _ => None,
        })
        .collect();
    assert_eq!(errors.len(), 2);
    assert!(errors.iter().all(|e| e.is_some()), "{errors:?}");
    let recipients: Vec<&Vec<String>> = head_kinds
        .iter()
        .filter_map(|k| match k {
            EventKind::Alert {
                from, recipients, ..
            } if from == "a" => Some(recipients),
            _ => None,
        })
        .collect();
    assert_eq!(recipients, [&Vec::<String>::new()]);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_the_head_refuses_leave_nothing_behind() {
    let mut p = pair(&["a"], &[], &[]).await;
    // A host loop the head refuses does not start, and takes no deliveries.
    let host_events = p.host_events.clone();
    let spec = loop_on(
        &p.host,
        &host_events,
        p._dir.path(),
        "refused1",
        &p.llm,
        &[],
        &Budgets::unlimited(),
    );
    let started = p.host.spawn_loop(spec).await;
    let why = started.unwrap_err().to_string();
    assert!(why.contains("the head refused loop refused1"), "{why}");
    p.host.flush().await;
    let item = Arc::new(InboxItem::Share {
        from: "a".into(),
        data_type: "t".into(),
        data: json!(1),
    });
    assert!(!p.host.deliver_local("refused1", None, item.clone()).await);
    let answer = p.host.answer_local("refused1", "a", "q", ASK).await;
    assert!(answer.is_err());

    // A remote loop may not take the name of a head loop.
    let link = Arc::new(Link {
        host: p.host.handle(),
        name: "a".into(),
        net: p.net.clone(),
    });
    let taken = p.head.register_remote("a", "ralph", "t", None, link).await;
    let why = taken.unwrap_err().to_string();
    assert!(why.contains("already running on the head"), "{why}");
    // ... and a host routes nothing itself.
    let link = Arc::new(Link {
        host: p.head.handle(),
        name: "x".into(),
        net: p.net.clone(),
    });
    assert!(
        p.host
            .register_remote("x", "ralph", "t", None, link)
            .await
            .is_err()
    );
    assert!(!p.head.drop_remote("a", "not remote").await);
    let listed = p.port("a").list_loops("a").await.unwrap();
    assert!(listed.is_empty(), "{listed:?}");
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_loop_whose_actor_ends_leaves_the_heads_run() {
    let p = pair(&["a"], &["h1"], &[]).await;
    p.host.kill_loop("h1").unwrap();
    let port = p.port("a");
    let started = Instant::now();
    while !port.list_loops("a").await.unwrap().is_empty() {
        assert!(started.elapsed() < GUARD, "h1 is still listed on the head");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let asked = port.query(&"a".into(), "h1", "there?", ASK).await;
    let asked = asked.unwrap_err().to_string();
    assert!(asked.contains("loop 'h1' has stopped (stopped)"), "{asked}");
    let item = Arc::new(InboxItem::Share {
        from: "a".into(),
        data_type: "t".into(),
        data: json!(1),
    });
    assert!(!p.host.deliver_local("h1", None, item).await);
    p.shutdown().await;
}

/// A head (or a loop) that asks with a deadline past what the clock can hold: the answer is
/// given, the coordinator does not panic on the deadline's arithmetic, and it answers the
/// next question too (review of issue 18: `ToHost::Answer { timeout_ms: u64::MAX }`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_with_a_deadline_past_the_clocks_end_is_answered() {
    let p = pair(&["a"], &["h1"], &[]).await;
    let answer = p
        .host
        .answer_local("h1", "a", "forever?", Duration::MAX)
        .await;
    assert_eq!(answer.unwrap(), "h1 answers a: forever?");
    let local = p
        .port("a")
        .query(&"a".into(), "h1", "and now?", Duration::MAX)
        .await;
    assert_eq!(local.unwrap(), "h1 answers a: and now?");
    let again = p
        .port("h1")
        .query(&"h1".into(), "a", "still there?", ASK)
        .await;
    assert_eq!(again.unwrap(), "a answers h1: still there?");
    p.shutdown().await;
}

/// Issue 18: the head numbers what it delivers to each loop (per loop, in the order it
/// decides the deliveries), records each item with its number, and a host loop's
/// `inbox_shown` names the numbers it showed: what a moved or resumed loop is not shown
/// again, whatever order the items reached the record in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_head_numbers_each_loops_deliveries_and_a_host_loop_shows_them_by_number() {
    let mut p = pair(&["a"], &["h1", "h2"], &["api_ready"]).await;
    let port = p.port("a");
    let to = ["h1".to_string()];
    for mark in ["MARK-N1", "MARK-N2"] {
        let sent = port.share("a", &to, "n", json!(mark)).await.unwrap();
        assert_eq!(sent[0].error, None);
    }
    let reached = port.alert("a", "api_ready", "MARK-N3", None).await;
    assert_eq!(reached.unwrap(), 2);
    p.run_to_end(&["a"], &["h1", "h2"]).await;
    p.head.flush().await;
    let head = kinds(&p.head_events);
    let shared: Vec<Option<u64>> = head
        .iter()
        .filter_map(|k| match k {
            EventKind::Shared {
                to, delivery, from, ..
            } if from == "a" && to == "h1" => Some(*delivery),
            _ => None,
        })
        .collect();
    assert_eq!(shared, [Some(1), Some(2)]);
    let alerted: Vec<BTreeMap<String, u64>> = head
        .iter()
        .filter_map(|k| match k {
            EventKind::Alert {
                from, deliveries, ..
            } if from == "a" => Some(deliveries.clone()),
            _ => None,
        })
        .collect();
    let expected: BTreeMap<String, u64> = [("h1".to_string(), 3), ("h2".to_string(), 1)].into();
    assert_eq!(alerted, [expected]);
    // Each host loop showed its items by their numbers (taken from the head's deliveries).
    let shown: BTreeMap<String, Vec<[u64; 2]>> = kinds(&p.host_events)
        .into_iter()
        .filter_map(|k| match k {
            EventKind::InboxShown {
                loop_name,
                deliveries,
                ..
            } => Some((loop_name, deliveries)),
            _ => None,
        })
        .collect();
    assert_eq!(shown["h1"], [[1, 3]], "{shown:?}");
    assert_eq!(shown["h2"], [[1, 1]], "{shown:?}");
    p.shutdown().await;
}

/// Issue 18: an alert is recorded once all its remote deliveries settle; a lost loop's
/// record is read back only once every share and alert delivered to it is recorded
/// (`CoordinatorHandle::settled`), else an item it got could be missing where it goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_loops_deliveries_are_settled_before_its_record_is_read_back() {
    let p = pair(&["a"], &["h1", "h2"], &["api_ready"]).await;
    let head = p.head.handle();
    assert!(head.settled("h1", Duration::from_millis(100)).await);
    // Nothing comes back from the host: the alert to h1 and h2 waits.
    p.net.set(SILENT);
    let port = p.port("a");
    let alerting =
        tokio::spawn(async move { port.alert("a", "api_ready", "MARK-HELD", None).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!head.settled("h1", Duration::from_millis(200)).await);
    // h1 leaves: its delivery fails at once, but the alert is not recorded while h2's
    // delivery is under way.
    assert!(p.head.drop_remote("h1", "its host was lost").await);
    assert!(!head.settled("h1", Duration::from_millis(200)).await);
    let alert_recorded = |events: &EventLog| {
        kinds(events)
            .iter()
            .any(|k| matches!(k, EventKind::Alert { message, .. } if message == "MARK-HELD"))
    };
    assert!(!alert_recorded(&p.head_events));
    assert!(p.head.drop_remote("h2", "its host was lost").await);
    assert!(head.settled("h1", GUARD).await);
    assert!(
        alert_recorded(&p.head_events),
        "recorded before settled said so"
    );
    let reached = tokio::time::timeout(GUARD, alerting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reached.unwrap(), 0);
    p.shutdown().await;
}
