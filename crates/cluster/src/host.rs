//! A worker host's side: its node, its agent (the one actor of the host that the head
//! reaches: heartbeats now, the loops it will run later), joining the head, and staying
//! joined until the run ends, the head is lost, or the host is stopped.
//!
//! A host takes the head for lost when its connection closes, or when no heartbeat came
//! for the `lost_after` the head named when the host joined (a cut link closes nothing).

use std::time::{Duration, Instant};

use ractor::message::{BoxedDowncastErr, SerializedMessage};
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef};
use tokio::sync::mpsc;

use crate::head::RegistryMsg;
use crate::node::{self, Node, NodeError, NodeOptions, SessionEvent, SessionInfo};
use crate::protocol::{FromHost, HEAD_GROUP, HOSTS_GROUP, Joined, PROTOCOL, SCOPE, ToHead, ToHost};
use crate::secret::ClusterSecret;
use crate::wire::{self, AskError, Reply, WireMsg};

/// A request of the head about this host's loops ([`ToHost::StartLoop`],
/// [`ToHost::StopLoop`]), for the host to answer.
#[derive(Debug)]
pub struct HeadRequest {
    /// What the head asks.
    pub request: ToHost,
    /// Where the answer goes.
    pub reply: Reply,
}

/// Asks the head about this host's loops (cheap to clone).
#[derive(Debug, Clone)]
pub struct HeadLink {
    head: ActorRef<RegistryMsg>,
    name: String,
    token: String,
    /// The placement of the loop this link asks about (0: none yet).
    attempt: u64,
}

impl HeadLink {
    /// This link, asking about the loop placed here as `attempt` ([`ToHead::Loop`]).
    pub fn for_attempt(&self, attempt: u64) -> HeadLink {
        HeadLink {
            attempt,
            ..self.clone()
        }
    }

    /// The placement this link asks about.
    pub fn attempt(&self) -> u64 {
        self.attempt
    }

    /// Asks the head `request` and waits at most `timeout`: an answer or an explicit error,
    /// never a hang (a lost head fails the question at once).
    pub async fn ask<Resp: serde::de::DeserializeOwned>(
        &self,
        request: FromHost,
        timeout: Duration,
    ) -> Result<Resp, AskError> {
        let request = ToHead::Loop {
            host: self.name.clone(),
            token: self.token.clone(),
            attempt: self.attempt,
            request,
        };
        wire::ask(&self.head, RegistryMsg::Wire, &request, timeout).await
    }

    /// Sends `request` to the head's registry as it is, not wrapped in this host's name and
    /// token: whatever a host that proved the secret can send (tests of the head's checks
    /// play a hostile host with it).
    pub async fn ask_head<Req: serde::Serialize, Resp: serde::de::DeserializeOwned>(
        &self,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, AskError> {
        wire::ask(&self.head, RegistryMsg::Wire, request, timeout).await
    }
}

/// The shortest and longest heartbeat limit a host accepts from a head.
const LOST_AFTER_RANGE: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(3600));

/// Messages of a host's agent: only what the head sends.
#[derive(Debug)]
pub enum AgentMsg {
    /// A request of the head ([`ToHost`]).
    Wire(WireMsg),
}

impl ractor::Message for AgentMsg {
    fn serializable() -> bool {
        true
    }

    fn serialize(self) -> Result<SerializedMessage, BoxedDowncastErr> {
        match self {
            AgentMsg::Wire(msg) => Ok(msg.serialize()),
        }
    }

    fn deserialize(message: SerializedMessage) -> Result<Self, BoxedDowncastErr> {
        WireMsg::deserialize(message).map(AgentMsg::Wire)
    }
}

/// What the agent passes on to the host's loop.
#[derive(Debug)]
enum Note {
    Ping,
    Bye(String),
}

struct Agent {
    notes: mpsc::UnboundedSender<Note>,
    requests: Option<mpsc::UnboundedSender<HeadRequest>>,
}

impl Actor for Agent {
    type Msg = AgentMsg;
    type State = ();
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (): (),
    ) -> Result<(), ActorProcessingErr> {
        // Before the node connects: the session's first sync advertises the group's members.
        ractor::pg::join_scoped(
            SCOPE.to_string(),
            HOSTS_GROUP.to_string(),
            vec![myself.get_cell()],
        );
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        (): &mut (),
    ) -> Result<(), ActorProcessingErr> {
        let AgentMsg::Wire(msg) = message;
        match msg.parse::<ToHost>() {
            Ok(ToHost::Ping) => {
                msg.answer(Ok(()));
                let _ = self.notes.send(Note::Ping);
            }
            Ok(ToHost::Bye { reason }) => {
                msg.answer(Ok(()));
                let _ = self.notes.send(Note::Bye(reason));
            }
            Ok(
                request @ (ToHost::StartLoop(_)
                | ToHost::StopLoop { .. }
                | ToHost::Deliver { .. }
                | ToHost::Answer { .. }),
            ) => {
                match &self.requests {
                    // A receiver gone drops the request, whose reply then says so.
                    Some(tx) => {
                        let _ = tx.send(HeadRequest {
                            request,
                            reply: Reply::new(msg),
                        });
                    }
                    None => msg.answer(Err::<(), _>("this host runs no loops".to_string())),
                }
            }
            Err(e) => msg.answer(Err::<(), _>(e)),
        }
        Ok(())
    }
}

/// How a host joins.
#[derive(Debug, Clone)]
pub struct HostOptions {
    /// The head's address (`host:port`).
    pub head: String,
    /// The host's name.
    pub name: String,
    /// Loops it offers to run at once (`None`: the head's default).
    pub slots: Option<u32>,
    /// Where it keeps its worktrees.
    pub workdir: String,
    /// The shared secret.
    pub secret: ClusterSecret,
    /// How long connecting, the handshake and the join may take, each.
    pub timeout: Duration,
    /// Where the head's requests about loops go (`None`: they are refused).
    pub requests: Option<mpsc::UnboundedSender<HeadRequest>>,
}

/// Why a host did not join.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// Its own node did not start.
    #[error("{0}")]
    Node(#[from] NodeError),
    /// No connection to the head.
    #[error("cannot reach the head at {head}: {why}")]
    Unreachable {
        /// The head's address.
        head: String,
        /// What went wrong.
        why: String,
    },
    /// The head refused it.
    #[error("the head at {head} refused this host: {why}")]
    Refused {
        /// The head's address.
        head: String,
        /// Why.
        why: String,
    },
    /// The head did not answer in time.
    #[error("the head at {head} did not answer: {why}")]
    NoAnswer {
        /// The head's address.
        head: String,
        /// What was missing.
        why: String,
    },
}

/// How a joined host's time ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostEnd {
    /// The head said the run ended.
    RunEnded(String),
    /// The head was lost.
    HeadLost(String),
    /// The host was stopped (its user), after telling the head.
    Stopped,
}

/// A host that joined the head.
pub struct HostSession {
    node: Node,
    agent: ActorRef<AgentMsg>,
    head: ActorRef<RegistryMsg>,
    head_session: SessionInfo,
    events: mpsc::UnboundedReceiver<SessionEvent>,
    notes: mpsc::UnboundedReceiver<Note>,
    name: String,
    /// What the head said when it took the host.
    pub joined: Joined,
    /// The head's address.
    pub head_addr: String,
}

impl std::fmt::Debug for HostSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostSession")
            .field("name", &self.name)
            .field("head", &self.head_addr)
            .field("joined", &self.joined)
            .finish_non_exhaustive()
    }
}

/// Waits for the session to the head to be ready, or for why it will not be.
async fn ready_session(
    events: &mut mpsc::UnboundedReceiver<SessionEvent>,
    head: &str,
    timeout: Duration,
) -> Result<SessionInfo, JoinError> {
    let wait = async {
        while let Some(event) = events.recv().await {
            match event {
                SessionEvent::Ready(info) => return Ok(info),
                SessionEvent::Disconnected(_) => {
                    return Err(JoinError::Refused {
                        head: head.to_string(),
                        why: "it closed the connection during the handshake, as it does when \
                              this host's secret differs from its own (the host's \
                              --secret-file or --secret-env must hold the head's \
                              hosts.secret-file or hosts.secret-env)"
                            .to_string(),
                    });
                }
                SessionEvent::Opened(_) | SessionEvent::Authenticated(_) => {}
            }
        }
        Err(JoinError::NoAnswer {
            head: head.to_string(),
            why: "the node stopped".to_string(),
        })
    };
    tokio::time::timeout(timeout, wait)
        .await
        .unwrap_or_else(|_| {
            Err(JoinError::NoAnswer {
                head: head.to_string(),
                why: format!("no handshake within {} ms", timeout.as_millis()),
            })
        })
}

/// The head's registry as the session made it known (it may lag the ready event a moment).
async fn head_registry(node_id: u64) -> Option<ActorRef<RegistryMsg>> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let found = ractor::pg::get_scoped_members(&SCOPE.to_string(), &HEAD_GROUP.to_string())
            .into_iter()
            .find(
                |cell| matches!(cell.get_id(), ActorId::Remote { node_id: n, .. } if n == node_id),
            );
        if let Some(cell) = found {
            return Some(cell.into());
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Starts this host's node and agent, connects to the head, proves the secret and asks to
/// join.
pub async fn join(options: HostOptions) -> Result<HostSession, JoinError> {
    let head = options.head.clone();
    let (notes_tx, notes) = mpsc::unbounded_channel();
    let (agent, _) = Actor::spawn(
        None,
        Agent {
            notes: notes_tx,
            requests: options.requests.clone(),
        },
        (),
    )
    .await
    .map_err(|e| NodeError::Start(e.to_string()))?;
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let host_part = format!("host-{}", options.name);
    let node = match node::start(
        NodeOptions {
            name: node::unique_node_name(&host_part),
            host_part,
            listen: node::loopback_any_port(),
            secret: options.secret,
        },
        move |event| {
            let _ = events_tx.send(event);
        },
    )
    .await
    {
        Ok(node) => node,
        Err(e) => {
            agent.stop(None);
            return Err(e.into());
        }
    };
    let stop = |node: &Node, agent: &ActorRef<AgentMsg>| {
        node.server.stop(None);
        agent.stop(None);
    };
    let connected = tokio::time::timeout(
        options.timeout,
        ractor_cluster::client_connect(&node.server, head.as_str()),
    )
    .await;
    let why = match connected {
        Ok(Ok(())) => None,
        Ok(Err(ractor_cluster::ClientConnectErr::Socket(e))) => Some(e.to_string()),
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some(format!(
            "no connection within {} ms",
            options.timeout.as_millis()
        )),
    };
    if let Some(why) = why {
        stop(&node, &agent);
        return Err(JoinError::Unreachable { head, why });
    }
    let head_session = match ready_session(&mut events, &head, options.timeout).await {
        Ok(s) => s,
        Err(e) => {
            stop(&node, &agent);
            return Err(e);
        }
    };
    let Some(registry) = head_registry(head_session.node_id).await else {
        stop(&node, &agent);
        return Err(JoinError::NoAnswer {
            head,
            why: "it has no host registry (is it a taskdaemon run with a `hosts:` section?)"
                .to_string(),
        });
    };
    let request = ToHead::Join {
        protocol: PROTOCOL,
        name: options.name.clone(),
        node: node.full_name.clone(),
        slots: options.slots,
        workdir: options.workdir.clone(),
        version: env!("CARGO_PKG_VERSION").to_string(),
    };
    let joined: Joined =
        match wire::ask(&registry, RegistryMsg::Wire, &request, options.timeout).await {
            Ok(j) => j,
            Err(e) => {
                stop(&node, &agent);
                return Err(match e {
                    AskError::Refused(why) => JoinError::Refused {
                        head,
                        why: why
                            .strip_prefix("the head refused this host: ")
                            .unwrap_or(&why)
                            .to_string(),
                    },
                    other => JoinError::NoAnswer {
                        head,
                        why: other.to_string(),
                    },
                });
            }
        };
    Ok(HostSession {
        node,
        agent,
        head: registry,
        head_session,
        events,
        notes,
        name: options.name,
        joined,
        head_addr: options.head,
    })
}

impl HostSession {
    /// The name of this host's node (`name@host`), as the head's end of the handshake
    /// knows it: what a [`ToHead::Join`] names as its `node`.
    pub fn node_name(&self) -> &str {
        &self.node.full_name
    }

    /// What asks the head about this host's loops.
    pub fn link(&self) -> HeadLink {
        HeadLink {
            head: self.head.clone(),
            name: self.name.clone(),
            token: self.joined.token.clone(),
            attempt: 0,
        }
    }

    /// Stays joined until the head says the run ended, the head is lost, or `stop`
    /// completes (then the head is told that this host leaves); the node stops either way.
    pub async fn run(mut self, stop: impl std::future::Future<Output = String>) -> HostEnd {
        let lost_after = Duration::from_millis(self.joined.lost_after_ms)
            .clamp(LOST_AFTER_RANGE.0, LOST_AFTER_RANGE.1);
        let mut check = tokio::time::interval(lost_after / 4);
        let mut last_ping = Instant::now();
        let head_id = self.head_session.session.get_id();
        tokio::pin!(stop);
        let end = loop {
            tokio::select! {
                event = self.events.recv() => match event {
                    Some(SessionEvent::Disconnected(info)) if info.session.get_id() == head_id => {
                        break HostEnd::HeadLost("its connection closed".to_string());
                    }
                    Some(_) => {}
                    None => break HostEnd::HeadLost("this host's node stopped".to_string()),
                },
                note = self.notes.recv() => match note {
                    Some(Note::Ping) => last_ping = Instant::now(),
                    Some(Note::Bye(reason)) => break HostEnd::RunEnded(reason),
                    None => break HostEnd::HeadLost("this host's agent stopped".to_string()),
                },
                _ = check.tick() => {
                    let quiet = last_ping.elapsed();
                    if quiet > lost_after {
                        break HostEnd::HeadLost(format!(
                            "no heartbeat from the head for {} ms (the limit is {} ms)",
                            quiet.as_millis(),
                            lost_after.as_millis()
                        ));
                    }
                }
                reason = &mut stop => {
                    // Asked, so that the head records it before the connection closes.
                    let _ = wire::ask::<RegistryMsg, ToHead, ()>(
                        &self.head,
                        RegistryMsg::Wire,
                        &ToHead::Leave {
                            name: self.name.clone(),
                            token: self.joined.token.clone(),
                            reason,
                        },
                        Duration::from_secs(2),
                    )
                    .await;
                    break HostEnd::Stopped;
                }
            }
        };
        let _ = self
            .node
            .server
            .stop_and_wait(None, Some(Duration::from_secs(5)))
            .await;
        self.agent.stop(None);
        end
    }
}
