//! The head's side: a node listening for hosts, and the host registry, the one actor of the
//! head that other nodes reach. The registry keeps every host that joined (name, address,
//! slots, workdir, joined, lost or left), refuses what must not join, and reports each
//! change as a [`HostEvent`] (the run records them).
//!
//! Where ractor_cluster is weak, the registry guards:
//! - a connection that does not join within `lost_after` of opening (no handshake, a
//!   handshake left half way, a node that proved the secret and never asked to join) is
//!   closed and reported refused: ractor_cluster itself waits forever; and at most
//!   [`MAX_WAITING`] connections wait at once;
//! - a joined host is pinged every quarter of `lost_after` and taken for lost when it has
//!   not answered for `lost_after`: ractor_cluster pings too, but never looks at the
//!   answers, so a cut link (no FIN, no RST) keeps a session "up" until TCP gives up,
//!   ~15 minutes later. Losing a host closes its session, which fails every question
//!   still waiting on it at once;
//! - a session closed (process killed, connection reset) loses its host at once.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use ractor::message::{BoxedDowncastErr, SerializedMessage};
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use ractor_cluster::NodeServerMessage;
use serde::{Deserialize, Serialize};

use crate::host::AgentMsg;
use crate::node::{self, Node, NodeError, NodeOptions, SessionEvent, SessionInfo};
use crate::protocol::{
    CHUNK_BYTES, CoordRequest, FromHost, HEAD_GROUP, HEAD_NAME, HOST_NAME_RULE, HOSTS_GROUP,
    Joined, MAX_NAME_LEN, PROTOCOL, SCOPE, ToHead, ToHost, valid_host_name,
};
use crate::secret::ClusterSecret;
use crate::wire::{self, AskError, Reply, WireMsg};

/// A joined host's request about one of its loops, for the run to answer.
#[derive(Debug)]
pub struct HostRequest {
    /// The host that asked (its token checked).
    pub host: String,
    /// The placement of the loop it asks about, as the host says (the run checks it).
    pub attempt: u64,
    /// What it asks.
    pub request: FromHost,
    /// Where the answer goes.
    pub reply: Reply,
}

/// The agents of the joined hosts, by host name: kept by the registry, read by every
/// [`HostAsker`] without a round trip through the registry's mailbox (each question to a
/// host paid one, two task switches on the head, per hop of a cross-host query).
type Agents = Arc<RwLock<HashMap<String, ActorRef<AgentMsg>>>>;

/// Where the registry hands host requests about loops.
pub type RequestSink = Arc<dyn Fn(HostRequest) + Send + Sync>;

/// Why host name `name` may not join now (loops of an earlier host of that name have not
/// ended: a new process under the name would be taken for theirs), or `None`.
pub type BusyCheck = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// A random token (32 hex digits) that proves a host's later requests are its own.
fn new_token() -> String {
    let mut bytes = [0u8; 16];
    // Without randomness the node-unique name generator's fallback is as good as it gets.
    if getrandom::fill(&mut bytes).is_err() {
        return node::unique_node_name("t");
    }
    hex::encode(bytes)
}

/// The most slots a host may offer.
pub const MAX_SLOTS: u32 = 4096;

/// The most bytes of a refused host name that the registry records (in [`HostEvent::Refused`]
/// and its reason). A peer that proved the secret names itself as it likes, up to a frame of
/// 4 MiB and with no limit on how often it is refused, and every refusal lands in the run's
/// events, its summary and `taskdaemon status`: a name is shown long enough to tell which,
/// no longer. Above [`MAX_NAME_LEN`], so that a valid name is never cut.
pub const MAX_SHOWN_NAME: usize = 96;

// A valid name has nothing to escape: it is shown whole.
const _: () = assert!(MAX_NAME_LEN <= MAX_SHOWN_NAME);

/// The most bytes of any other text of a host's that the registry records: a joined host's
/// workdir and version, its reason for leaving, the node a refused join named. Real ones are
/// a path, a version number, a sentence; a host that proved the secret could otherwise write
/// megabytes of them into every event it causes (see [`MAX_SHOWN_NAME`]).
pub const MAX_SHOWN_TEXT: usize = 512;

/// `text` from a host (or about one) as the registry records and shows it: every character
/// a terminal acts on or a reader could be misled by (control characters, line and paragraph
/// separators, bidi and zero-width ones) escaped as `char::escape_debug` escapes them (as
/// `shown_kind` in the binary's `run/hosts/remote.rs` does; quotes stay as they are), and cut
/// to at most `max` bytes, ending with how long it was (a `max` under the 40 bytes kept for
/// that note keeps only the note; the registry's limits are far above it).
pub fn shown(text: &str, max: usize) -> String {
    let mut out = String::new();
    // Where `out` ended, at an escape's boundary, while there was room left for the note.
    let mut kept = 0;
    let mut note = None;
    for c in text.chars() {
        match c {
            // Printable: escaped, they would only garble a sentence.
            '"' | '\'' => out.push(c),
            _ => out.extend(c.escape_debug()),
        }
        if out.len() > max {
            let cut = format!("… ({} bytes in all)", text.len());
            out.truncate(kept);
            note = Some(cut);
            break;
        }
        // The note never takes more than this: "… (" and " bytes in all)" and 20 digits.
        if out.len() + 40 <= max {
            kept = out.len();
        }
    }
    if let Some(note) = note {
        out.push_str(&note);
    }
    out
}

/// The most refused connections the registry reports one by one in a [`REFUSALS_WINDOW`];
/// past it they are counted, and the count reported when the window ends. Anyone who can
/// reach the head's port is refused (no secret needed), and each refusal is a line of the
/// run's events and of its terminal: a loop of connect-and-close would otherwise fill the
/// disk.
pub const MAX_REFUSALS_SHOWN: u32 = 20;

/// See [`MAX_REFUSALS_SHOWN`].
pub const REFUSALS_WINDOW: Duration = Duration::from_secs(60);

/// How many refused connections were reported one by one in the current window, and how
/// many more were only counted.
#[derive(Debug)]
struct RefusalLimit {
    since: Instant,
    shown: u32,
    held: u32,
}

impl RefusalLimit {
    fn new(now: Instant) -> RefusalLimit {
        RefusalLimit {
            since: now,
            shown: 0,
            held: 0,
        }
    }

    /// Starts a new window when the current one is over at `now`: the refusals the one
    /// that ended only counted, if any.
    fn roll(&mut self, now: Instant) -> Option<u32> {
        if now.saturating_duration_since(self.since) < REFUSALS_WINDOW {
            return None;
        }
        let held = std::mem::take(&mut self.held);
        *self = RefusalLimit::new(now);
        (held > 0).then_some(held)
    }

    /// Whether a refusal (in the current window) is reported one by one; if not, it is
    /// counted.
    fn admit(&mut self) -> bool {
        if self.shown < MAX_REFUSALS_SHOWN {
            self.shown += 1;
            true
        } else {
            self.held = self.held.saturating_add(1);
            false
        }
    }
}

/// The event that reports `held` refusals that were only counted.
fn refusals_held(held: u32) -> HostEvent {
    HostEvent::Refused {
        address: "(many)".to_string(),
        name: None,
        reason: format!(
            "{held} more connection(s) were refused within {} s and not reported one by one (the head reports at most {MAX_REFUSALS_SHOWN} in that time)",
            REFUSALS_WINDOW.as_secs()
        ),
    }
}

/// The most connections that may wait to join at once; more are closed at once (each one
/// holds three actors of ractor_cluster's until its deadline).
pub const MAX_WAITING: usize = 64;

/// How long a session that closed before joining waits for the reason its actor stopped
/// with (which comes on another path) before it is reported without one. 300 ms, then 1 s,
/// were each passed once on 2 cores busy with the whole test suite, and a wrong secret was
/// then reported as "its connection closed before it joined" (`tests/join.rs`). The reason
/// reports the refusal as soon as it comes, so the wait only delays the report of a
/// connection whose reason never comes.
const SETTLE: Duration = Duration::from_secs(5);

/// How to start the head's side.
#[derive(Debug, Clone)]
pub struct HeadOptions {
    /// Where hosts connect.
    pub listen: SocketAddr,
    /// The shared secret.
    pub secret: ClusterSecret,
    /// How long a host may stay silent before it is lost, and a connection may take to join.
    pub lost_after: Duration,
    /// The slots of a host that offers none, and the most a host may offer.
    pub default_slots: u32,
    /// The most model calls and queries one host may have waiting for the head's answers at
    /// once (`hosts.max-requests-in-flight`; at least [`IN_FLIGHT_PER_SLOT`] a slot of the
    /// host); see [`MAX_BYTES_IN_FLIGHT`].
    pub max_requests_in_flight: usize,
}

/// The most bytes of requests about its loops one host may have waiting for the head's
/// answers at once (64 of the largest frames a node reads). Past it, or past
/// [`HeadOptions::max_requests_in_flight`] model calls and queries, the next request is
/// refused at once, saying why: a host that proved the secret could otherwise hold any
/// number of the head's tasks, and of its memory.
pub const MAX_BYTES_IN_FLIGHT: usize = 256 * 1024 * 1024;

/// The least bound on a host's model calls and queries in flight, per slot it offers: a
/// loop waits on one model call and one query at a time, and answers others' questions
/// with a model call each.
pub const IN_FLIGHT_PER_SLOT: usize = 4;

/// What a host's request of `body` bytes holds of [`MAX_BYTES_IN_FLIGHT`] until it is
/// answered: its body, or for a chunk of a file (a request of ~150 bytes) the answer it
/// brings, a chunk in hex (~2 MiB), so that a host asking for many at once is bounded by
/// what the head holds for it.
fn held_bytes(request: &FromHost, body: usize) -> usize {
    match request {
        FromHost::BaseChunk { .. } | FromHost::BaseLfsChunk { .. } => {
            body.max(CHUNK_BYTES.saturating_mul(2).saturating_add(1024))
        }
        _ => body,
    }
}

/// What one host's requests hold of the head until they are answered: kept by the host's
/// name, so that a host joining again does not start from nothing while its earlier
/// session's requests are still being answered.
#[derive(Debug, Default)]
struct InFlight {
    /// Requests that wait on a model or on another loop (model calls, queries): the ones
    /// that can hold the head for minutes. The others (records, checkpoints, chunks, an
    /// end, registration...) are answered as fast as the head works, and are refused
    /// only by bytes: a loop's end or records are never turned away for its own model
    /// calls in flight.
    waiting: AtomicUsize,
    bytes: AtomicUsize,
}

impl InFlight {
    /// Counts a request of `bytes` in (`waits`: a model call or a query), or says why it is
    /// refused. Only the registry's actor takes (one at a time); answers only give back, so
    /// a check passed stays true.
    fn take(&self, host: &str, bytes: usize, waits: bool, most: usize) -> Result<(), String> {
        let (waiting, held) = (
            self.waiting.load(Ordering::SeqCst),
            self.bytes.load(Ordering::SeqCst),
        );
        if (waits && waiting >= most) || held.saturating_add(bytes) > MAX_BYTES_IN_FLIGHT {
            return Err(format!(
                "host {host} has {waiting} model calls and queries ({} KiB of requests) waiting for the head's answers, the most one host may have ({most}, hosts.max-requests-in-flight; {} MiB): ask again once one is answered",
                held / 1024,
                MAX_BYTES_IN_FLIGHT / (1024 * 1024)
            ));
        }
        if waits {
            self.waiting.fetch_add(1, Ordering::SeqCst);
        }
        self.bytes.fetch_add(bytes, Ordering::SeqCst);
        Ok(())
    }

    /// Gives back what a request of `bytes` held (once it is answered).
    fn give_back(&self, bytes: usize, waits: bool) {
        let less = |by: usize| move |n: usize| Some(n.saturating_sub(by));
        if waits {
            let _ = self
                .waiting
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, less(1));
        }
        let _ = self
            .bytes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, less(bytes));
    }
}

/// A change of the registry, for the run's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostEvent {
    /// A host joined.
    Joined {
        /// Its name.
        name: String,
        /// Where it connected from.
        address: String,
        /// Loops it runs at once.
        slots: u32,
        /// Where it keeps its worktrees, as the host says ([`shown`], at most
        /// [`MAX_SHOWN_TEXT`] bytes).
        workdir: String,
        /// Its taskdaemon version, as the host says ([`shown`], at most [`MAX_SHOWN_TEXT`]
        /// bytes).
        version: String,
    },
    /// A joined host was lost: its connection closed, or it stopped answering.
    Lost {
        /// Its name.
        name: String,
        /// Where it was connected from.
        address: String,
        /// Why, in words.
        reason: String,
    },
    /// A joined host left: its user stopped it, or the run ended.
    Left {
        /// Its name.
        name: String,
        /// Why, in words (the host's own, when it left: [`shown`], at most
        /// [`MAX_SHOWN_TEXT`] bytes).
        reason: String,
    },
    /// A connection did not join: no or a wrong secret, no join in time, or a join the
    /// head refused.
    Refused {
        /// Where it came from.
        address: String,
        /// The name it asked to join as, if it got that far ([`shown`], at most
        /// [`MAX_SHOWN_NAME`] bytes: a refused name may be anything).
        name: Option<String>,
        /// Why, in words.
        reason: String,
    },
}

/// Where a host stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostState {
    /// Joined and answering.
    Joined,
    /// Its connection closed or it stopped answering.
    Lost,
    /// It left.
    Left,
}

/// A host as the registry knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostInfo {
    /// Its name.
    pub name: String,
    /// Where it connected from.
    pub address: String,
    /// Loops it runs at once.
    pub slots: u32,
    /// Where it keeps its worktrees, as the host says ([`shown`], at most [`MAX_SHOWN_TEXT`]
    /// bytes).
    pub workdir: String,
    /// Where it stands.
    pub state: HostState,
}

/// Messages of the host registry: from hosts (over the wire), and from this process.
#[derive(Debug)]
pub enum RegistryMsg {
    /// A request of a host ([`ToHead`]).
    Wire(WireMsg),
    /// A session event of the node.
    Session(SessionEvent),
    /// A connection's time to join is up.
    Deadline(ActorId),
    /// A session that closed before joining is reported now, with or without its reason.
    Settle(ActorId),
    /// Time to check heartbeats.
    Tick,
    /// A heartbeat came back (`ok`) or failed.
    PingDone {
        /// The host.
        name: String,
        /// Its session when the ping went out.
        session: ActorId,
        /// Whether it answered.
        ok: bool,
    },
    /// The hosts, in name order.
    Hosts(RpcReplyPort<Vec<HostInfo>>),
    /// The run ends: tell every joined host, and record them as left.
    Shutdown {
        /// Why, in words.
        reason: String,
        /// Answered once every host was told.
        reply: RpcReplyPort<()>,
    },
}

impl ractor::Message for RegistryMsg {
    fn serializable() -> bool {
        true
    }

    fn serialize(self) -> Result<SerializedMessage, BoxedDowncastErr> {
        match self {
            RegistryMsg::Wire(msg) => Ok(msg.serialize()),
            // The others never leave this process.
            _ => Err(BoxedDowncastErr),
        }
    }

    fn deserialize(message: SerializedMessage) -> Result<Self, BoxedDowncastErr> {
        WireMsg::deserialize(message).map(RegistryMsg::Wire)
    }
}

/// The head's side, running.
#[derive(Debug)]
pub struct Head {
    registry: ActorRef<RegistryMsg>,
    agents: Agents,
    node: Node,
    listen: SocketAddr,
}

impl Head {
    /// Starts the registry and the node listening on `options.listen`; `on_event` gets every
    /// [`HostEvent`], in order, from inside the registry (it must not block).
    pub async fn start(
        options: HeadOptions,
        on_event: impl Fn(HostEvent) + Send + Sync + 'static,
    ) -> Result<Head, NodeError> {
        Head::start_with(
            options,
            on_event,
            Arc::new(|request: HostRequest| {
                request
                    .reply
                    .send(Err::<(), _>("this head runs no loops on hosts".to_string()))
            }),
            Arc::new(|_: &str| None),
        )
        .await
    }

    /// [`Head::start`], with `on_request` getting every request of a joined host about its
    /// loops (from inside the registry: it must not block; the reply may come later), and
    /// `busy` saying why a host name may not join now.
    pub async fn start_with(
        options: HeadOptions,
        on_event: impl Fn(HostEvent) + Send + Sync + 'static,
        on_request: RequestSink,
        busy: BusyCheck,
    ) -> Result<Head, NodeError> {
        let listen = options.listen;
        let agents = Agents::default();
        let (registry, _) = Actor::spawn(
            None,
            Registry {
                agents: agents.clone(),
                lost_after: options.lost_after,
                default_slots: options.default_slots,
                max_requests_in_flight: options.max_requests_in_flight.max(1),
                sink: Arc::new(on_event),
                requests: on_request,
                busy,
            },
            (),
        )
        .await
        .map_err(|e| NodeError::Start(e.to_string()))?;
        let events = registry.clone();
        let started = node::start(
            NodeOptions {
                name: node::unique_node_name("head"),
                host_part: "head".to_string(),
                listen,
                secret: options.secret,
            },
            move |event| {
                let _ = events.cast(RegistryMsg::Session(event));
            },
        )
        .await;
        match started {
            Ok(node) => Ok(Head {
                registry,
                agents,
                node,
                listen,
            }),
            Err(e) => {
                registry.stop(None);
                Err(e)
            }
        }
    }

    /// Where hosts connect.
    pub fn listen(&self) -> SocketAddr {
        self.listen
    }

    /// The hosts the registry knows, in name order (empty once it stopped).
    pub async fn hosts(&self) -> Vec<HostInfo> {
        ractor::call_t!(self.registry, RegistryMsg::Hosts, 5_000).unwrap_or_default()
    }

    /// A handle that asks joined hosts (cheap to clone, usable after the head moved).
    pub fn asker(&self) -> HostAsker {
        HostAsker {
            agents: self.agents.clone(),
        }
    }

    /// Tells every joined host that the run ended (`reason`), records them as left, waits up
    /// to `grace` for their connections to close (the hosts close them, so that their side
    /// and not the head's port keeps the closed connections' TIME_WAIT), then stops.
    pub async fn shutdown(self, reason: &str, grace: Duration) {
        let reason = reason.to_string();
        let _ = self
            .registry
            .call(
                |reply| RegistryMsg::Shutdown { reason, reply },
                Some(Duration::from_secs(5)),
            )
            .await;
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            let open = ractor::call_t!(self.node.server, NodeServerMessage::GetSessions, 1_000)
                .map(|s| s.len())
                .unwrap_or(0);
            if open == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = self
            .node
            .server
            .stop_and_wait(None, Some(Duration::from_secs(5)))
            .await;
        let _ = self
            .registry
            .stop_and_wait(None, Some(Duration::from_secs(5)))
            .await;
    }
}

/// Asks joined hosts: what the run sends to the hosts its loops run on.
#[derive(Debug, Clone)]
pub struct HostAsker {
    agents: Agents,
}

impl HostAsker {
    /// Asks host `host` `request` and waits at most `timeout`: an answer or an explicit
    /// error, never a hang (a host lost meanwhile fails the question at once).
    pub async fn ask<Resp: serde::de::DeserializeOwned>(
        &self,
        host: &str,
        request: &ToHost,
        timeout: Duration,
    ) -> Result<Resp, AskError> {
        let agent = agent_of(&self.agents, host)
            .ok_or_else(|| AskError::Gone(format!("host {host} is not joined")))?;
        wire::ask(&agent, AgentMsg::Wire, request, timeout).await
    }
}

impl Drop for Head {
    fn drop(&mut self) {
        // A head dropped without `shutdown` (an error path) still stops listening.
        self.node.server.stop(None);
        self.registry.stop(None);
    }
}

/// The agent of `host` while it is joined.
fn agent_of(agents: &Agents, host: &str) -> Option<ActorRef<AgentMsg>> {
    agents
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(host)
        .cloned()
}

/// Sets (`Some`) or removes the agent of `host` in `agents`.
fn set_agent(agents: &Agents, host: &str, agent: Option<ActorRef<AgentMsg>>) {
    let mut map = agents
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match agent {
        Some(agent) => map.insert(host.to_string(), agent),
        None => map.remove(host),
    };
}

struct Registry {
    /// The joined hosts' agents, for [`HostAsker`]: in step with `hosts` (a host's agent is
    /// there exactly while it is joined).
    agents: Agents,
    lost_after: Duration,
    default_slots: u32,
    max_requests_in_flight: usize,
    sink: Arc<dyn Fn(HostEvent) + Send + Sync>,
    requests: RequestSink,
    busy: BusyCheck,
}

/// A connection, from its opening to its close.
struct Session {
    info: SessionInfo,
    authenticated: bool,
    /// The host that joined through it.
    host: Option<String>,
    /// Why its actor stopped (from the monitor), in words.
    end: Option<String>,
    disconnected: bool,
    /// Its refusal was reported.
    reported: bool,
}

struct HostEntry {
    info: HostInfo,
    session: ActorId,
    session_ref: ActorRef<ractor_cluster::NodeSessionMessage>,
    agent: ActorRef<AgentMsg>,
    /// What its loop requests must carry.
    token: String,
    last_answer: Instant,
    pinging: bool,
}

/// The registry's state.
pub struct RegistryState {
    sessions: HashMap<ActorId, Session>,
    hosts: BTreeMap<String, HostEntry>,
    /// What each host's requests hold of the head, by its name (across its sessions).
    in_flight: HashMap<String, Arc<InFlight>>,
    ticker: Option<tokio::task::JoinHandle<()>>,
    /// The refusals reported in this window ([`MAX_REFUSALS_SHOWN`]).
    refusals: RefusalLimit,
}

impl Registry {
    fn emit(&self, event: HostEvent) {
        (self.sink)(event);
    }

    /// Reports a refused connection, within [`MAX_REFUSALS_SHOWN`] a window.
    fn refused(&self, state: &mut RegistryState, event: HostEvent) {
        self.refusals_rolled(state);
        if state.refusals.admit() {
            self.emit(event);
        }
    }

    /// Reports the refusals the window that ended only counted, once it ended.
    fn refusals_rolled(&self, state: &mut RegistryState) {
        if let Some(held) = state.refusals.roll(Instant::now()) {
            self.emit(refusals_held(held));
        }
    }

    fn lost_after_ms(&self) -> u128 {
        self.lost_after.as_millis()
    }

    /// Words for the reason ractor_cluster (or we) stopped a session with.
    fn reason_words(&self, reason: Option<&str>) -> String {
        match reason {
            Some("auth_fail") => {
                "it did not prove the shared secret (its secret differs from the head's)".into()
            }
            Some("tcp_session_closed") | Some("channel_closed") | None => {
                "its connection closed before it joined".into()
            }
            Some("join_timeout") => format!(
                "it did not join within {} ms of connecting",
                self.lost_after_ms()
            ),
            Some("session_election_lost") | Some("duplicate_connection") => {
                "another connection of the same node took its place".into()
            }
            Some("self_connection") => "it is this node itself".into(),
            // ractor_cluster's words, which may quote what the peer sent.
            Some(other) => format!("its connection closed ({})", shown(other, MAX_SHOWN_TEXT)),
        }
    }

    fn refuse_session(&self, state: &mut RegistryState, id: ActorId) {
        let Some(session) = state.sessions.remove(&id) else {
            return;
        };
        if session.reported || session.host.is_some() {
            return;
        }
        let event = HostEvent::Refused {
            address: session.info.peer_addr.clone(),
            name: None,
            reason: session
                .end
                .clone()
                .unwrap_or_else(|| self.reason_words(None)),
        };
        self.refused(state, event);
    }

    fn on_session(
        &self,
        myself: &ActorRef<RegistryMsg>,
        state: &mut RegistryState,
        event: SessionEvent,
    ) {
        match event {
            SessionEvent::Opened(info) => {
                let id = info.session.get_id();
                let waiting = state.sessions.values().filter(|s| s.host.is_none()).count();
                if waiting >= MAX_WAITING {
                    info.session.stop(Some("too_many_waiting".to_string()));
                    let event = HostEvent::Refused {
                        address: info.peer_addr,
                        name: None,
                        reason: format!("{MAX_WAITING} connections were already waiting to join"),
                    };
                    self.refused(state, event);
                    return;
                }
                // Its stop reason (a wrong secret) comes to us through the monitor.
                myself.get_cell().monitor(info.session.get_cell());
                myself.send_after(self.lost_after, move || RegistryMsg::Deadline(id));
                state.sessions.insert(
                    id,
                    Session {
                        info,
                        authenticated: false,
                        host: None,
                        end: None,
                        disconnected: false,
                        reported: false,
                    },
                );
            }
            SessionEvent::Authenticated(info) | SessionEvent::Ready(info) => {
                if let Some(s) = state.sessions.get_mut(&info.session.get_id()) {
                    s.authenticated = true;
                    s.info.peer_name = info.peer_name.or(s.info.peer_name.take());
                }
            }
            SessionEvent::Disconnected(info) => {
                let id = info.session.get_id();
                let Some(session) = state.sessions.get_mut(&id) else {
                    return;
                };
                session.disconnected = true;
                if let Some(name) = session.host.clone() {
                    state.sessions.remove(&id);
                    self.lose(state, &name, id, "its connection closed".to_string());
                } else if session.reported || session.end.is_some() {
                    self.refuse_session(state, id);
                } else {
                    myself.send_after(SETTLE, move || RegistryMsg::Settle(id));
                }
            }
        }
    }

    /// Marks `name` lost when it is still joined through `session`.
    fn lose(&self, state: &mut RegistryState, name: &str, session: ActorId, reason: String) {
        let Some(host) = state.hosts.get_mut(name) else {
            return;
        };
        if host.session != session || host.info.state != HostState::Joined {
            return;
        }
        host.info.state = HostState::Lost;
        set_agent(&self.agents, name, None);
        // Closing the session fails every question still waiting on it at once.
        host.session_ref.stop(Some("lost".to_string()));
        self.emit(HostEvent::Lost {
            name: name.to_string(),
            address: host.info.address.clone(),
            reason,
        });
    }

    fn on_wire(&self, state: &mut RegistryState, msg: WireMsg) {
        let request = match msg.parse::<ToHead>() {
            Ok(r) => r,
            Err(e) => {
                let why = older_join(&msg.body).unwrap_or(e);
                msg.answer(Err::<(), _>(why));
                return;
            }
        };
        match request {
            ToHead::Join {
                protocol,
                name,
                node,
                slots,
                workdir,
                version,
            } => {
                let answer = self.join(state, protocol, &name, &node, slots, workdir, version);
                msg.answer(answer);
            }
            ToHead::Leave {
                name,
                token,
                reason,
            } => {
                // Only the host itself: every host proved the same secret, the token is its own.
                let answer = match state.hosts.get_mut(&name) {
                    Some(host)
                        if host.info.state == HostState::Joined
                            && constant_time_eq(&host.token, &token) =>
                    {
                        host.info.state = HostState::Left;
                        set_agent(&self.agents, &name, None);
                        self.emit(HostEvent::Left {
                            name,
                            reason: shown(&reason, MAX_SHOWN_TEXT),
                        });
                        Ok(())
                    }
                    _ => Err(format!(
                        "host {name} is not joined with this token; only the host itself can leave"
                    )),
                };
                msg.answer(answer);
            }
            ToHead::Loop {
                host,
                token,
                attempt,
                request,
            } => {
                let known = state
                    .hosts
                    .get(&host)
                    .filter(|h| {
                        h.info.state == HostState::Joined && constant_time_eq(&h.token, &token)
                    })
                    .map(|h| {
                        let slots = usize::try_from(h.info.slots).unwrap_or(usize::MAX);
                        self.max_requests_in_flight
                            .max(slots.saturating_mul(IN_FLIGHT_PER_SLOT))
                    });
                let Some(most) = known else {
                    msg.answer(Err::<(), _>(format!(
                        "host {host} is not joined with this token; it must join again"
                    )));
                    return;
                };
                let in_flight = state.in_flight.entry(host.clone()).or_default().clone();
                let bytes = held_bytes(&request, msg.body.len());
                let waits = matches!(
                    request,
                    FromHost::Complete { .. }
                        | FromHost::Coord {
                            request: CoordRequest::Query { .. },
                            ..
                        }
                );
                if let Err(why) = in_flight.take(&host, bytes, waits, most) {
                    msg.answer(Err::<(), _>(why));
                    return;
                }
                // Read: only its answer port is kept while it is answered.
                let mut msg = msg;
                msg.body = Vec::new();
                (self.requests)(HostRequest {
                    host,
                    attempt,
                    request,
                    reply: Reply::releasing(msg, move || in_flight.give_back(bytes, waits)),
                });
            }
        }
    }

    /// Decides a join: the answer for the host, and the event.
    #[allow(clippy::too_many_arguments)]
    fn join(
        &self,
        state: &mut RegistryState,
        protocol: u32,
        name: &str,
        node: &str,
        slots: Option<u32>,
        workdir: String,
        version: String,
    ) -> Result<Joined, String> {
        // The session this node joins through: only a node that proved the secret can send
        // anything, and its name is what the handshake told.
        let session_id = state
            .sessions
            .iter()
            .find(|(_, s)| s.authenticated && s.info.peer_name.as_deref() == Some(node))
            .map(|(id, _)| *id);
        // The name this connection joined under before, if it did (its host may have left
        // since: the connection stays its).
        let joined_as = session_id
            .and_then(|id| state.sessions.get(&id))
            .and_then(|s| s.host.clone());
        // What the peer named itself, as events and answers show it (see MAX_SHOWN_NAME).
        let shown_name = shown(name, MAX_SHOWN_NAME);
        let refusal = || -> Option<String> {
            if protocol != PROTOCOL {
                return Some(format!(
                    "this host speaks protocol {protocol} and the head {PROTOCOL}: run the same taskdaemon version on both (the head runs {})",
                    env!("CARGO_PKG_VERSION")
                ));
            }
            if !valid_host_name(name) {
                return Some(format!(
                    "the host name \"{shown_name}\" is not {HOST_NAME_RULE}"
                ));
            }
            if name == HEAD_NAME {
                return Some(format!(
                    "the name `{HEAD_NAME}` stands for the head itself (in placement rules); give this host another --name"
                ));
            }
            if let Some(n) = slots
                && !(1..=MAX_SLOTS).contains(&n)
            {
                return Some(format!(
                    "--slots {n}: a host runs 1 to {MAX_SLOTS} loops at once"
                ));
            }
            // One process, one name: the head's slots are per host, and every other name
            // would take as many again (and, its connection's close losing only one name,
            // stay joined until its heartbeats were missed).
            if let Some(first) = &joined_as
                && first != name
            {
                return Some(format!(
                    "this connection already joined as {first}; a host process joins under one name (start another `taskdaemon host` for another)"
                ));
            }
            if let Some(h) = state.hosts.get(name)
                && h.info.state == HostState::Joined
            {
                return Some(format!(
                    "a host named {name} is already joined (from {}); give this one another --name",
                    h.info.address
                ));
            }
            if let Some(why) = (self.busy)(name) {
                return Some(format!(
                    "the host {name} that was here before has loops that have not ended ({why}); join again once they have, or under another --name"
                ));
            }
            if session_id.is_none() {
                return Some(format!(
                    "no authenticated connection of node {} is known here; join again",
                    shown(node, MAX_SHOWN_TEXT)
                ));
            }
            None
        };
        let reason = refusal();
        let session_id = match (reason, session_id) {
            (None, Some(id)) => id,
            (reason, id) => {
                let reason = reason.unwrap_or_default();
                let address = id
                    .and_then(|id| state.sessions.get_mut(&id))
                    .map(|s| {
                        s.reported = true;
                        s.info.peer_addr.clone()
                    })
                    .unwrap_or_else(|| "?".to_string());
                let event = HostEvent::Refused {
                    address,
                    name: Some(shown_name),
                    reason: reason.clone(),
                };
                self.refused(state, event);
                // Its connection closes at its deadline, should it not close it itself.
                return Err(format!("the head refused this host: {reason}"));
            }
        };
        let Some(session) = state.sessions.get_mut(&session_id) else {
            return Err("the connection closed while joining".to_string());
        };
        // The host's agent, as the session's process-group sync made it known here (the
        // sync happened before the session was ready, hence before this request).
        let agent = ractor::pg::get_scoped_members(&SCOPE.to_string(), &HOSTS_GROUP.to_string())
            .into_iter()
            .find(|cell| {
                matches!(cell.get_id(), ActorId::Remote { node_id, .. } if node_id == session.info.node_id)
            });
        let Some(agent) = agent else {
            let reason = "its agent is not known here (its node advertised none)".to_string();
            session.reported = true;
            let event = HostEvent::Refused {
                address: session.info.peer_addr.clone(),
                name: Some(shown_name),
                reason: reason.clone(),
            };
            self.refused(state, event);
            return Err(format!("the head refused this host: {reason}"));
        };
        session.host = Some(name.to_string());
        // The head's slots are the most a host may offer: a host does not choose how many
        // loops it is sent (it would attract every loop waiting for a place).
        let slots = slots.map_or(self.default_slots, |n| n.min(self.default_slots));
        let (workdir, version) = (
            shown(&workdir, MAX_SHOWN_TEXT),
            shown(&version, MAX_SHOWN_TEXT),
        );
        let info = HostInfo {
            name: name.to_string(),
            address: session.info.peer_addr.clone(),
            slots,
            workdir: workdir.clone(),
            state: HostState::Joined,
        };
        let token = new_token();
        let agent: ActorRef<AgentMsg> = agent.into();
        set_agent(&self.agents, name, Some(agent.clone()));
        state.hosts.insert(
            name.to_string(),
            HostEntry {
                info: info.clone(),
                session: session_id,
                session_ref: session.info.session.clone(),
                agent,
                token: token.clone(),
                last_answer: Instant::now(),
                pinging: false,
            },
        );
        self.emit(HostEvent::Joined {
            name: name.to_string(),
            address: info.address,
            slots,
            workdir,
            version,
        });
        Ok(Joined {
            token,
            slots,
            lost_after_ms: u64::try_from(self.lost_after.as_millis()).unwrap_or(u64::MAX),
        })
    }

    fn tick(&self, myself: &ActorRef<RegistryMsg>, state: &mut RegistryState) {
        self.refusals_rolled(state);
        let mut silent = Vec::new();
        for (name, host) in state.hosts.iter_mut() {
            if host.info.state != HostState::Joined {
                continue;
            }
            let quiet = host.last_answer.elapsed();
            if quiet > self.lost_after {
                silent.push((name.clone(), host.session, quiet));
                continue;
            }
            if host.pinging {
                continue;
            }
            host.pinging = true;
            let (agent, me, name, session) = (
                host.agent.clone(),
                myself.clone(),
                name.clone(),
                host.session,
            );
            let timeout = self.lost_after;
            tokio::spawn(async move {
                let ok = wire::ask::<AgentMsg, ToHost, ()>(
                    &agent,
                    AgentMsg::Wire,
                    &ToHost::Ping,
                    timeout,
                )
                .await
                .is_ok();
                let _ = me.cast(RegistryMsg::PingDone { name, session, ok });
            });
        }
        for (name, session, quiet) in silent {
            self.lose(
                state,
                &name,
                session,
                format!(
                    "no answer to the head's heartbeat for {} ms (the limit is {} ms)",
                    quiet.as_millis(),
                    self.lost_after_ms()
                ),
            );
        }
    }
}

/// The refusal of a join in the form of an earlier protocol (up to 5 the messages were
/// internally tagged: `{"type": "join", "protocol": 5, ...}`), which protocol 6 does not
/// read: such a host hears which protocols differ, not that its request did not read.
fn older_join(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    if value.get("type")?.as_str()? != "join" {
        return None;
    }
    let protocol = value.get("protocol")?.as_u64()?;
    Some(format!(
        "the head refused this host: this host speaks protocol {protocol} and the head {PROTOCOL}: run the same taskdaemon version on both (the head runs {})",
        env!("CARGO_PKG_VERSION")
    ))
}

/// Whether two tokens are equal, in a time that does not tell how much of them matched.
fn constant_time_eq(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

impl Actor for Registry {
    type Msg = RegistryMsg;
    type State = RegistryState;
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (): (),
    ) -> Result<Self::State, ActorProcessingErr> {
        ractor::pg::join_scoped(
            SCOPE.to_string(),
            HEAD_GROUP.to_string(),
            vec![myself.get_cell()],
        );
        let period = (self.lost_after / 4).max(Duration::from_millis(25));
        let ticker = myself.send_interval(period, || RegistryMsg::Tick);
        Ok(RegistryState {
            sessions: HashMap::new(),
            hosts: BTreeMap::new(),
            in_flight: HashMap::new(),
            ticker: Some(ticker),
            refusals: RefusalLimit::new(Instant::now()),
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(t) = state.ticker.take() {
            t.abort();
        }
        // Nothing is asked of hosts through a registry that stopped.
        self.agents
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            RegistryMsg::Wire(msg) => self.on_wire(state, msg),
            RegistryMsg::Session(event) => self.on_session(&myself, state, event),
            RegistryMsg::Deadline(id) => {
                if let Some(s) = state.sessions.get_mut(&id)
                    && s.host.is_none()
                    && !s.disconnected
                {
                    s.end = Some(self.reason_words(Some("join_timeout")));
                    s.info.session.stop(Some("join_timeout".to_string()));
                }
            }
            RegistryMsg::Settle(id) => self.refuse_session(state, id),
            RegistryMsg::Tick => self.tick(&myself, state),
            RegistryMsg::PingDone { name, session, ok } => {
                if let Some(host) = state.hosts.get_mut(&name)
                    && host.session == session
                {
                    host.pinging = false;
                    if ok {
                        host.last_answer = Instant::now();
                    }
                }
            }
            RegistryMsg::Hosts(reply) => {
                let _ = reply.send(state.hosts.values().map(|h| h.info.clone()).collect());
            }
            RegistryMsg::Shutdown { reason, reply } => {
                for (name, host) in state.hosts.iter_mut() {
                    if host.info.state != HostState::Joined {
                        continue;
                    }
                    // Told, not asked: a host that does not hear it loses the head at its
                    // next missed heartbeat instead.
                    let _ = wire::tell(
                        &host.agent,
                        AgentMsg::Wire,
                        &ToHost::Bye {
                            reason: reason.clone(),
                        },
                    );
                    host.info.state = HostState::Left;
                    set_agent(&self.agents, name, None);
                    self.emit(HostEvent::Left {
                        name: name.clone(),
                        reason: reason.clone(),
                    });
                }
                let _ = reply.send(());
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // Only monitored sessions send these; a session ending is no reason for the
        // registry to stop (the default would).
        let (id, reason) = match &message {
            SupervisionEvent::ActorTerminated(cell, _, reason) => (cell.get_id(), reason.clone()),
            SupervisionEvent::ActorFailed(cell, err) => (cell.get_id(), Some(err.to_string())),
            _ => return Ok(()),
        };
        let words = self.reason_words(reason.as_deref());
        if let Some(s) = state.sessions.get_mut(&id) {
            s.end.get_or_insert(words);
            if s.disconnected && s.host.is_none() {
                self.refuse_session(state, id);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hosts_requests_in_flight_are_bounded_by_count_and_bytes_and_given_back() {
        let held = InFlight::default();
        held.take("h", MAX_BYTES_IN_FLIGHT - 10, true, 3).unwrap();
        // Past the bytes, though under the count: any request.
        for waits in [true, false] {
            let why = held.take("h", 11, waits, 3).unwrap_err();
            assert!(
                why.starts_with("host h has 1 model calls and queries (262143 KiB of requests) waiting for the head's answers"),
                "{why}"
            );
        }
        held.take("h", 10, true, 3).unwrap();
        held.take("h", 0, true, 3).unwrap();
        // Past the count: a model call or a query is refused, anything else goes on.
        let why = held.take("h", 0, true, 3).unwrap_err();
        assert!(
            why.contains("(3, hosts.max-requests-in-flight; 256 MiB)"),
            "{why}"
        );
        held.take("h", 0, false, 3).unwrap();
        held.give_back(0, false);
        held.give_back(0, true);
        held.take("h", 0, true, 3).unwrap();
        for bytes in [0, 10, MAX_BYTES_IN_FLIGHT - 10] {
            held.give_back(bytes, true);
        }
        assert_eq!(held.waiting.load(Ordering::SeqCst), 0);
        assert_eq!(held.bytes.load(Ordering::SeqCst), 0);
        // Never below nothing, whatever is given back.
        held.give_back(5, true);
        assert_eq!(held.bytes.load(Ordering::SeqCst), 0);
        assert_eq!(held.waiting.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_chunk_request_holds_the_answer_it_brings() {
        let chunk = FromHost::BaseLfsChunk {
            loop_name: "a".into(),
            oid: "ab".into(),
            offset: 0,
        };
        let base = FromHost::BaseChunk {
            loop_name: "a".into(),
            offset: 0,
        };
        let ended = FromHost::Ended {
            loop_name: "a".into(),
            end: serde_json::json!({}),
            branch: None,
            problem: None,
        };
        for request in [&chunk, &base] {
            assert_eq!(held_bytes(request, 150), 2 * CHUNK_BYTES + 1024);
        }
        assert_eq!(held_bytes(&ended, 150), 150);
        // So a host asking for many at once is refused past the bound, not held in memory.
        let held = InFlight::default();
        let fit = MAX_BYTES_IN_FLIGHT / held_bytes(&chunk, 150);
        for _ in 0..fit {
            held.take("h", held_bytes(&chunk, 150), false, 3).unwrap();
        }
        assert!(held.take("h", held_bytes(&chunk, 150), false, 3).is_err());
    }

    #[test]
    fn refusals_past_the_bound_are_counted_and_reported_when_the_window_ends() {
        let start = Instant::now();
        let mut limit = RefusalLimit::new(start);
        for _ in 0..MAX_REFUSALS_SHOWN {
            assert!(limit.admit());
        }
        assert!(!limit.admit());
        assert!(!limit.admit());
        // Within the window: nothing to report yet.
        assert_eq!(limit.roll(start + REFUSALS_WINDOW / 2), None);
        assert!(!limit.admit());
        // Its end: the three counted, and a new window reports one by one again.
        let later = start + REFUSALS_WINDOW;
        assert_eq!(limit.roll(later), Some(3));
        assert!(limit.admit());
        // A window that counted none reports nothing.
        assert_eq!(limit.roll(later + REFUSALS_WINDOW), None);
        match refusals_held(3) {
            HostEvent::Refused { name, reason, .. } => {
                assert_eq!(name, None);
                assert!(
                    reason.starts_with("3 more connection(s) were refused within 60 s"),
                    "{reason}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_hosts_text_is_shown_escaped_and_cut_to_its_limit() {
        // What a host normally says is shown as it is.
        for plain in [
            "h1",
            "gpu.box_2",
            "/home/ci/work dir",
            "0.1.0",
            "stopped by its user's \"host\" (SIGTERM)",
            "héllo wörld",
        ] {
            assert_eq!(shown(plain, MAX_SHOWN_TEXT), plain);
        }
        let longest = "a".repeat(MAX_NAME_LEN);
        assert_eq!(shown(&longest, MAX_SHOWN_NAME), longest);
        // Nothing a terminal acts on, nor text that reads otherwise than it is.
        for (raw, escaped) in [
            ("\u{1b}[2J", "\\u{1b}[2J"),
            ("a\r\nb\tc", "a\\r\\nb\\tc"),
            ("\u{7}\u{7f}\u{9b}", "\\u{7}\\u{7f}\\u{9b}"),
            (
                "\u{202e}\u{2028}\u{2029}\u{200b}",
                "\\u{202e}\\u{2028}\\u{2029}\\u{200b}",
            ),
            ("a\\b", "a\\\\b"),
        ] {
            assert_eq!(shown(raw, MAX_SHOWN_TEXT), escaped);
        }
        // Cut at its limit, never inside an escape or a character, saying how long it was.
        for (raw, max) in [
            ("x".repeat(1 << 20), MAX_SHOWN_TEXT),
            ("\u{1b}".repeat(100_000), MAX_SHOWN_TEXT),
            ("é".repeat(100_000), MAX_SHOWN_NAME),
            (
                format!("{}\u{1b}", "y".repeat(MAX_SHOWN_NAME)),
                MAX_SHOWN_NAME,
            ),
        ] {
            let text = shown(&raw, max);
            assert!(text.len() <= max, "{} bytes: {text}", text.len());
            let note = format!("… ({} bytes in all)", raw.len());
            let Some(kept) = text.strip_suffix(&note) else {
                panic!("{text}");
            };
            // As much as leaves room for the note (40 bytes), less one escape at most.
            assert!(kept.len() + 40 + "\\u{10ffff}".len() >= max, "{text}");
            assert!(
                shown(&raw, usize::MAX).starts_with(kept),
                "{kept} is not the start of the whole"
            );
            assert!(!text.chars().any(char::is_control), "{text}");
        }
        let escapes = shown(&"\u{1b}".repeat(100_000), MAX_SHOWN_TEXT);
        assert!(escapes.replace("\\u{1b}", "").starts_with('…'), "{escapes}");
    }

    #[test]
    fn a_join_of_an_earlier_protocol_is_told_the_protocols() {
        let old = br#"{"type":"join","protocol":5,"name":"h1","node":"n","slots":null,"workdir":"/w","version":"0"}"#;
        let why = older_join(old).unwrap();
        assert!(
            why.contains(&format!("speaks protocol 5 and the head {PROTOCOL}")),
            "{why}"
        );
        assert!(serde_json::from_slice::<ToHead>(old).is_err());
        // Anything else that does not read stays "cannot read the request".
        assert_eq!(older_join(br#"{"type":"leave"}"#), None);
        assert_eq!(older_join(b"not json"), None);
    }
}
