//! A head and one host in this process, over loopback: joining, refusals, leaving and the
//! end of the run, as the registry reports them. (ractor's process groups are global to a
//! process, so more than one host per process would see each other's agents; the tests of
//! several hosts run the real binary in network namespaces: tests/hosts.rs at the root.)

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use td_cluster::{
    ClusterSecret, Head, HeadOptions, HostEnd, HostEvent, HostOptions, HostState, JoinError,
};

/// One test at a time: actor ids of other nodes are numbered per node (`Remote { node_id,
/// .. }` from 0 in each), so two tests' hosts in this one process would take each other's
/// head for theirs. (A real process runs one node.)
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn secret(text: &str) -> ClusterSecret {
    ClusterSecret::checked(text, "test".into()).unwrap()
}

fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

async fn head(lost_after: Duration) -> (Head, Arc<Mutex<Vec<HostEvent>>>) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    let head = Head::start(
        HeadOptions {
            listen: free_addr(),
            secret: secret("the-head-secret-0123456789"),
            lost_after,
            default_slots: 3,
            max_requests_in_flight: 1024,
        },
        move |e| sink.lock().unwrap().push(e),
    )
    .await
    .unwrap();
    (head, events)
}

fn host(head: &Head, name: &str, secret_text: &str) -> HostOptions {
    HostOptions {
        head: head.listen().to_string(),
        name: name.into(),
        slots: None,
        workdir: "/w".into(),
        secret: secret(secret_text),
        timeout: Duration::from_secs(5),
        requests: None,
    }
}

async fn wait_for(events: &Arc<Mutex<Vec<HostEvent>>>, what: impl Fn(&HostEvent) -> bool) {
    // Past the head's 5 s wait for a closed session's reason (a loaded machine's spell).
    for _ in 0..1000 {
        if events.lock().unwrap().iter().any(&what) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no such event in {:?}", events.lock().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_joins_with_the_default_slots_and_leaves_when_stopped() {
    let _serial = SERIAL.lock().await;
    let (head, events) = head(Duration::from_secs(5)).await;
    let session = td_cluster::host::join(host(&head, "h1", "the-head-secret-0123456789"))
        .await
        .unwrap();
    assert_eq!(session.joined.slots, 3);
    assert_eq!(session.joined.lost_after_ms, 5000);
    let hosts = head.hosts().await;
    assert_eq!(hosts.len(), 1);
    assert_eq!(hosts[0].name, "h1");
    assert_eq!(hosts[0].state, HostState::Joined);
    assert!(hosts[0].address.starts_with("127.0.0.1:"), "{hosts:?}");
    let end = session
        .run(async { "stopped by its user".to_string() })
        .await;
    assert_eq!(end, HostEnd::Stopped);
    wait_for(&events, |e| matches!(e, HostEvent::Left { name, reason } if name == "h1" && reason == "stopped by its user")).await;
    // Leaving is not losing: the connection that closes next is no news.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !events
            .lock()
            .unwrap()
            .iter()
            .any(|e| matches!(e, HostEvent::Lost { .. })),
        "{:?}",
        events.lock().unwrap()
    );
    head.shutdown("done", Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_secret_is_refused_on_both_sides() {
    let _serial = SERIAL.lock().await;
    let (head, events) = head(Duration::from_secs(5)).await;
    let err = td_cluster::host::join(host(&head, "h1", "another-secret-0123456789"))
        .await
        .unwrap_err();
    assert!(matches!(err, JoinError::Refused { .. }), "{err}");
    assert!(err.to_string().contains("refused this host"), "{err}");
    wait_for(&events, |e| {
        matches!(e, HostEvent::Refused { reason, name: None, .. } if reason.contains("did not prove the shared secret"))
    })
    .await;
    assert!(head.hosts().await.is_empty());
    head.shutdown("done", Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_host_of_the_same_name_is_refused_and_the_first_stays() {
    let _serial = SERIAL.lock().await;
    let (head, events) = head(Duration::from_secs(5)).await;
    let first = td_cluster::host::join(host(&head, "h1", "the-head-secret-0123456789"))
        .await
        .unwrap();
    // The second one in another process would be the usual case; here its node (another
    // unique node name) joins from this one.
    let err = td_cluster::host::join(host(&head, "h1", "the-head-secret-0123456789"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("already joined"), "{err}");
    wait_for(
        &events,
        |e| matches!(e, HostEvent::Refused { name: Some(n), .. } if n == "h1"),
    )
    .await;
    let hosts = head.hosts().await;
    assert_eq!(hosts.len(), 1);
    assert_eq!(hosts[0].state, HostState::Joined);
    drop(first);
    head.shutdown("done", Duration::from_secs(1)).await;
}

/// Review #9b: a host does not choose how many loops it is sent: the head's `slots` is the
/// most it may offer (more, and it joins with the head's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_offering_more_slots_than_the_head_allows_gets_the_heads() {
    let _serial = SERIAL.lock().await;
    let (head, events) = head(Duration::from_secs(5)).await;
    let mut options = host(&head, "h1", "the-head-secret-0123456789");
    options.slots = Some(4096);
    let session = td_cluster::host::join(options).await.unwrap();
    assert_eq!(session.joined.slots, 3);
    assert_eq!(head.hosts().await[0].slots, 3);
    wait_for(
        &events,
        |e| matches!(e, HostEvent::Joined { name, slots: 3, .. } if name == "h1"),
    )
    .await;
    drop(session);
    head.shutdown("done", Duration::from_secs(1)).await;
}

/// Review #1: a host that leaves or is lost while its loops have not ended frees its name
/// only once they have: a new process joining under it would be taken for theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_under_the_name_of_a_host_whose_loops_run_is_refused() {
    let _serial = SERIAL.lock().await;
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    let busy = Arc::new(Mutex::new(true));
    let busy_now = busy.clone();
    let head = Head::start_with(
        HeadOptions {
            listen: free_addr(),
            secret: secret("the-head-secret-0123456789"),
            lost_after: Duration::from_secs(5),
            default_slots: 3,
            max_requests_in_flight: 1024,
        },
        move |e| sink.lock().unwrap().push(e),
        Arc::new(|r: td_cluster::HostRequest| r.reply.send(Err::<(), _>("no".to_string()))),
        Arc::new(move |name: &str| {
            (name == "h1" && *busy_now.lock().unwrap()).then(|| "its loops w".to_string())
        }),
    )
    .await
    .unwrap();
    let err = td_cluster::host::join(host(&head, "h1", "the-head-secret-0123456789"))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("has loops that have not ended (its loops w)"),
        "{err}"
    );
    wait_for(
        &events,
        |e| matches!(e, HostEvent::Refused { name: Some(n), reason, .. } if n == "h1" && reason.contains("have not ended")),
    )
    .await;
    assert!(head.hosts().await.is_empty());
    // Once they ended, the name is free again.
    *busy.lock().unwrap() = false;
    let session = td_cluster::host::join(host(&head, "h1", "the-head-secret-0123456789"))
        .await
        .unwrap();
    assert_eq!(head.hosts().await[0].state, HostState::Joined);
    drop(session);
    head.shutdown("done", Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_end_of_the_run_is_told_to_the_host() {
    let _serial = SERIAL.lock().await;
    let (head, events) = head(Duration::from_secs(5)).await;
    let session = td_cluster::host::join(host(&head, "h1", "the-head-secret-0123456789"))
        .await
        .unwrap();
    let running = tokio::spawn(session.run(std::future::pending()));
    head.shutdown("the run ended", Duration::from_secs(2)).await;
    let end = tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(end, HostEnd::RunEnded("the run ended".into()));
    wait_for(
        &events,
        |e| matches!(e, HostEvent::Left { name, .. } if name == "h1"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_never_joins_is_closed_at_its_deadline() {
    let _serial = SERIAL.lock().await;
    let (head, events) = head(Duration::from_millis(400)).await;
    let mut idle = tokio::net::TcpStream::connect(head.listen()).await.unwrap();
    let start = std::time::Instant::now();
    wait_for(&events, |e| {
        matches!(e, HostEvent::Refused { reason, .. } if reason.contains("did not join within 400 ms"))
    })
    .await;
    // The head closed it: the read ends.
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(2), idle.read(&mut buf))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(n, 0);
    assert!(start.elapsed() < Duration::from_secs(3));
    head.shutdown("done", Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_waiting_limit_are_closed_at_once() {
    let _serial = SERIAL.lock().await;
    let (head, events) = head(Duration::from_secs(30)).await;
    let extra = 3;
    let mut idle = Vec::new();
    for _ in 0..(td_cluster::head::MAX_WAITING + extra) {
        idle.push(tokio::net::TcpStream::connect(head.listen()).await.unwrap());
    }
    let too_many = |e: &HostEvent| matches!(e, HostEvent::Refused { reason, .. } if reason.contains("connections were already waiting"));
    wait_for(&events, too_many).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Long before their deadline: only the ones past the limit.
    assert_eq!(
        events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| too_many(e))
            .count(),
        extra
    );
    // And a host still joins once they are gone.
    drop(idle);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let session = td_cluster::host::join(host(&head, "h1", "the-head-secret-0123456789"))
        .await
        .unwrap();
    drop(session);
    head.shutdown("done", Duration::from_secs(1)).await;
}

/// Anyone who reaches the head's port is refused without a secret, and every refusal is a
/// line of the run's events: past `MAX_REFUSALS_SHOWN` a window, refusals are only counted
/// (and the count reported when the window ends), so a loop of connect-and-close cannot
/// fill the disk (second review of the hosts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connections_are_reported_one_by_one_only_up_to_a_bound() {
    let _serial = SERIAL.lock().await;
    let (head, events) = head(Duration::from_secs(30)).await;
    let most = td_cluster::head::MAX_REFUSALS_SHOWN as usize;
    for _ in 0..(most * 2) {
        let stream = tokio::net::TcpStream::connect(head.listen()).await.unwrap();
        drop(stream);
    }
    let refused = |e: &HostEvent| matches!(e, HostEvent::Refused { .. });
    wait_for(&events, refused).await;
    // A closed connection is reported once its reason had time to come (5 s at most).
    tokio::time::sleep(Duration::from_secs(7)).await;
    let count = events.lock().unwrap().iter().filter(|e| refused(e)).count();
    assert_eq!(count, most, "{:?}", events.lock().unwrap());
    // And a host still joins.
    let session = td_cluster::host::join(host(&head, "h1", "the-head-secret-0123456789"))
        .await
        .unwrap();
    drop(session);
    head.shutdown("done", Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loop_requests_cross_both_ways_and_a_wrong_token_is_refused() {
    use td_cluster::protocol::{FromHost, ToHost};
    let _serial = SERIAL.lock().await;
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    // The head answers a host's model call with the loop's name, and keeps the request.
    let asked = Arc::new(Mutex::new(Vec::new()));
    let seen = asked.clone();
    let head = Head::start_with(
        HeadOptions {
            listen: free_addr(),
            secret: secret("the-head-secret-0123456789"),
            lost_after: Duration::from_secs(5),
            default_slots: 3,
            max_requests_in_flight: 1024,
        },
        move |e| sink.lock().unwrap().push(e),
        Arc::new(move |r: td_cluster::HostRequest| {
            seen.lock()
                .unwrap()
                .push((r.host.clone(), r.request.clone()));
            match r.request {
                // The placement the host named comes with the request.
                FromHost::Complete { loop_name, .. } => {
                    r.reply.send(Ok(format!("{loop_name}@{}", r.attempt)))
                }
                _ => r.reply.send(Err::<(), _>("not this".to_string())),
            }
        }),
        Arc::new(|_: &str| None),
    )
    .await
    .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut options = host(&head, "h1", "the-head-secret-0123456789");
    options.requests = Some(tx);
    let session = td_cluster::host::join(options).await.unwrap();
    assert_eq!(session.joined.token.len(), 32);
    let link = session.link();
    let running = tokio::spawn(session.run(std::future::pending()));

    let answer: String = link
        .for_attempt(7)
        .ask(
            FromHost::Complete {
                loop_name: "a".into(),
                request: td_cluster::protocol::RawJson::to(&serde_json::json!({})).unwrap(),
            },
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(answer, "a@7");
    assert_eq!(asked.lock().unwrap()[0].0, "h1");

    // Another token (a host speaking for h1) is refused before the run sees it.
    let forged = serde_json::json!({"loop": {
        "host": "h1", "token": "0".repeat(32), "attempt": 7,
        "request": {"complete": {"loop_name": "a", "request": {}}}
    }});
    let registry = ractor::pg::get_scoped_members(
        &td_cluster::protocol::SCOPE.to_string(),
        &td_cluster::protocol::HEAD_GROUP.to_string(),
    );
    let registry: ractor::ActorRef<td_cluster::head::RegistryMsg> = registry[0].clone().into();
    let err = td_cluster::wire::ask::<_, _, String>(
        &registry,
        td_cluster::head::RegistryMsg::Wire,
        &forged,
        Duration::from_secs(5),
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains("is not joined with this token"),
        "{err}"
    );
    assert_eq!(asked.lock().unwrap().len(), 1);

    // The head's request reaches the host's receiver, and its answer comes back.
    let asker = head.asker();
    let stop = tokio::spawn(async move {
        asker
            .ask::<()>(
                "h1",
                &ToHost::StopLoop {
                    loop_name: "a".into(),
                    now: true,
                },
                Duration::from_secs(5),
            )
            .await
    });
    let got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        got.request,
        ToHost::StopLoop {
            loop_name: "a".into(),
            now: true
        }
    );
    got.reply.send(Ok(()));
    stop.await.unwrap().unwrap();
    // A request the host drops unanswered is answered for it, not waited out.
    let asker = head.asker();
    let dropped = tokio::spawn(async move {
        asker
            .ask::<()>(
                "h1",
                &ToHost::StopLoop {
                    loop_name: "b".into(),
                    now: false,
                },
                Duration::from_secs(30),
            )
            .await
    });
    drop(rx.recv().await.unwrap());
    let err = tokio::time::timeout(Duration::from_secs(5), dropped)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(err.to_string().contains("dropped unanswered"), "{err}");
    // An unknown host is an error at once.
    let err = head
        .asker()
        .ask::<()>("h9", &ToHost::Ping, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("host h9 is not joined"), "{err}");

    // An asker kept past the run's end finds no host: a host recorded left is asked nothing.
    let asker = head.asker();
    head.shutdown("done", Duration::from_secs(2)).await;
    let err = asker
        .ask::<()>("h1", &ToHost::Ping, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("host h1 is not joined"), "{err}");
    let _ = tokio::time::timeout(Duration::from_secs(5), running).await;
}

/// The head's registry, as this process has it (its own actor, not a host node's proxy).
fn local_registry() -> ractor::ActorRef<td_cluster::head::RegistryMsg> {
    ractor::pg::get_scoped_members(
        &td_cluster::protocol::SCOPE.to_string(),
        &td_cluster::protocol::HEAD_GROUP.to_string(),
    )
    .into_iter()
    .find(|cell| cell.get_id().is_local())
    .unwrap()
    .into()
}

/// Asks the registry `request` raw, as a host that proved the secret may.
async fn ask_raw<T: serde::de::DeserializeOwned>(
    request: &td_cluster::protocol::ToHead,
) -> Result<T, td_cluster::wire::AskError> {
    td_cluster::wire::ask(
        &local_registry(),
        td_cluster::head::RegistryMsg::Wire,
        request,
        Duration::from_secs(10),
    )
    .await
}

fn raw_join(name: &str, node: &str, workdir: &str, version: &str) -> td_cluster::protocol::ToHead {
    td_cluster::protocol::ToHead::Join {
        protocol: td_cluster::protocol::PROTOCOL,
        name: name.into(),
        node: node.into(),
        slots: None,
        workdir: workdir.into(),
        version: version.into(),
    }
}

/// A megabyte of text that clears a terminal, retitles it, rings, turns text around and
/// starts lines of its own.
fn hostile() -> String {
    format!(
        "\u{1b}[2J\u{1b}]0;pwned\u{7}\u{202e}\u{2028}\r\n{}",
        "x".repeat(1 << 20)
    )
}

/// Text a host sent, as the events carry it: short, and nothing a terminal acts on.
fn assert_tame(what: &str, text: &str) {
    assert!(
        text.len() <= 1024,
        "{what}: {} bytes: {}…",
        text.len(),
        text.chars().take(80).collect::<String>().escape_debug()
    );
    assert!(
        !text
            .chars()
            .any(|c| c.is_control() || matches!(c, '\u{202e}' | '\u{2028}')),
        "{what}: {}",
        text.escape_debug()
    );
}

/// A host process joins under one name: the slots the head gives are per host, and a
/// second name on the same connection would take as many again (and outlive its close).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_joined_under_one_name_cannot_join_under_another() {
    let _serial = SERIAL.lock().await;
    let (head, events) = head(Duration::from_secs(5)).await;
    let session = td_cluster::host::join(host(&head, "h1", "the-head-secret-0123456789"))
        .await
        .unwrap();
    let node = session.node_name().to_string();
    for name in ["h2", "h3"] {
        let err = ask_raw::<td_cluster::protocol::Joined>(&raw_join(name, &node, "/w", "0"))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("already joined as h1"), "{err}");
    }
    let hosts = head.hosts().await;
    assert_eq!(
        hosts.iter().map(|h| h.name.as_str()).collect::<Vec<_>>(),
        ["h1"]
    );
    wait_for(&events, |e| {
        matches!(e, HostEvent::Refused { name: Some(n), reason, .. } if n == "h3" && reason.contains("already joined as h1"))
    })
    .await;
    // Its own name again while joined: refused as before.
    let err = ask_raw::<td_cluster::protocol::Joined>(&raw_join("h1", &node, "/w", "0"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("already joined"), "{err}");
    // Having left, the connection still joins under no other name.
    ask_raw::<()>(&td_cluster::protocol::ToHead::Leave {
        name: "h1".into(),
        token: session.joined.token.clone(),
        reason: "bye".into(),
    })
    .await
    .unwrap();
    let err = ask_raw::<td_cluster::protocol::Joined>(&raw_join("h2", &node, "/w", "0"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("already joined as h1"), "{err}");
    assert_eq!(head.hosts().await.len(), 1);
    assert!(
        !events
            .lock()
            .unwrap()
            .iter()
            .any(|e| matches!(e, HostEvent::Joined { name, .. } if name != "h1")),
        "{:?}",
        events.lock().unwrap()
    );
    drop(session);
    head.shutdown("done", Duration::from_secs(1)).await;
}

/// A peer that proved the secret writes what it likes in a join: a refused name or node
/// reaches the events (and the run's record and `status`) cut short and escaped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_joins_name_and_node_reach_the_events_cut_and_escaped() {
    let _serial = SERIAL.lock().await;
    let (head, events) = head(Duration::from_secs(5)).await;
    let bad = hostile();
    let err = ask_raw::<td_cluster::protocol::Joined>(&raw_join(&bad, "n@h", "/w", "0"))
        .await
        .unwrap_err();
    assert_tame("the answer", &err.to_string());
    let err = ask_raw::<td_cluster::protocol::Joined>(&raw_join("h9", &bad, "/w", "0"))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("no authenticated connection"),
        "{err}"
    );
    assert_tame("the answer", &err.to_string());
    wait_for(
        &events,
        |e| matches!(e, HostEvent::Refused { name: Some(n), .. } if n == "h9"),
    )
    .await;
    let refused: Vec<(String, String)> = events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            HostEvent::Refused { name, reason, .. } => {
                Some((name.clone().unwrap_or_default(), reason.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(refused.len(), 2);
    for (name, reason) in &refused {
        assert_tame("a refused name", name);
        assert_tame("a refusal's reason", reason);
    }
    // What it was is still told, escaped.
    assert!(refused[0].0.starts_with("\\u{1b}[2J"), "{}", refused[0].0);
    assert!(refused[0].1.contains("\\u{1b}[2J"), "{}", refused[0].1);
    assert!(refused[1].1.contains("\\u{1b}[2J"), "{}", refused[1].1);
    assert!(head.hosts().await.is_empty());
    head.shutdown("done", Duration::from_secs(1)).await;
}

/// A joined host's workdir, version and reason for leaving reach the events and the
/// registry's list cut short and escaped; and a host that left joins again under its own
/// name on the same connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joined_hosts_workdir_version_and_reason_to_leave_reach_the_events_cut_and_escaped() {
    let _serial = SERIAL.lock().await;
    let (head, events) = head(Duration::from_secs(5)).await;
    let bad = hostile();
    let mut options = host(&head, "h1", "the-head-secret-0123456789");
    options.workdir = bad.clone();
    let session = td_cluster::host::join(options).await.unwrap();
    assert_tame("the listed workdir", &head.hosts().await[0].workdir);
    ask_raw::<()>(&td_cluster::protocol::ToHead::Leave {
        name: "h1".into(),
        token: session.joined.token.clone(),
        reason: bad.clone(),
    })
    .await
    .unwrap();
    let joined: td_cluster::protocol::Joined =
        ask_raw(&raw_join("h1", session.node_name(), &bad, &bad))
            .await
            .unwrap();
    assert_eq!(joined.slots, 3);
    assert_eq!(head.hosts().await[0].state, HostState::Joined);
    let seen = events.lock().unwrap().clone();
    let mut checked = 0;
    for event in &seen {
        match event {
            HostEvent::Joined {
                workdir, version, ..
            } => {
                assert_tame("a workdir", workdir);
                assert_tame("a version", version);
                assert!(workdir.starts_with("\\u{1b}[2J"), "{workdir}");
                checked += 1;
            }
            HostEvent::Left { reason, .. } => {
                assert_tame("a reason to leave", reason);
                checked += 1;
            }
            _ => {}
        }
    }
    assert_eq!(checked, 3);
    drop(session);
    head.shutdown("done", Duration::from_secs(1)).await;
}
