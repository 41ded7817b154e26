//! One ractor_cluster node of this process: its `NodeServer` (which listens, and owns one
//! `NodeSession` actor per connection) and the node events it reports, handed to a callback
//! as [`SessionEvent`]s.
//!
//! Every node listens, also a worker host's (ractor_cluster has no node without a
//! listener): a host's node listens on 127.0.0.1 at a port the kernel picks, and takes only
//! peers that prove the same secret, as the head's does. Nodes run in `Isolated` mode: a
//! host never connects to the other hosts the head knows.

use std::net::{IpAddr, SocketAddr};

use ractor::{Actor, ActorRef};
use ractor_cluster::node::{NodeConnectionMode, NodeServerSessionInformation};
use ractor_cluster::{NodeEventSubscription, NodeServer, NodeServerMessage, NodeSessionMessage};

use crate::secret::ClusterSecret;
use crate::wire::MAX_FRAME_BYTES;

/// One session (a connection to another node) as the node's events show it.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    /// The session's actor: stopping it closes the connection.
    pub session: ActorRef<NodeSessionMessage>,
    /// The node's id for the peer (what `ActorId::Remote` of the peer's actors holds).
    pub node_id: u64,
    /// The peer's address (`ip:port`).
    pub peer_addr: String,
    /// The peer's node name, once the handshake told it.
    pub peer_name: Option<String>,
}

impl From<NodeServerSessionInformation> for SessionInfo {
    fn from(info: NodeServerSessionInformation) -> Self {
        SessionInfo {
            session: info.actor,
            node_id: info.node_id,
            peer_addr: info.peer_addr,
            peer_name: info.peer_name.map(|n| n.name),
        }
    }
}

/// What happened to a session.
#[derive(Debug, Clone)]
pub enum SessionEvent {
    /// A connection was opened (accepted, or made by us); nothing is proven yet.
    Opened(SessionInfo),
    /// The peer proved the shared secret.
    Authenticated(SessionInfo),
    /// Both sides exchanged their actors and process groups: messages may flow.
    Ready(SessionInfo),
    /// The session ended (closed, refused, or stopped by us).
    Disconnected(SessionInfo),
}

/// How to start a node.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// The node's name; unique per process ([`unique_node_name`]): ractor_cluster keeps one
    /// session per peer name, and a second node of the same name replaces the first one's
    /// session (after proving the secret).
    pub name: String,
    /// The name's host part (`name@host`), also the host part of the node's connection
    /// string; differs between the head and hosts so that neither is taken for the other.
    pub host_part: String,
    /// Where the node listens.
    pub listen: SocketAddr,
    /// The shared secret.
    pub secret: ClusterSecret,
}

/// A running node.
#[derive(Debug, Clone)]
pub struct Node {
    /// The node server.
    pub server: ActorRef<NodeServerMessage>,
    /// `name@host`, as peers see it.
    pub full_name: String,
}

/// Why a node did not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The address cannot be listened on.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// What the system said.
        source: std::io::Error,
    },
    /// The node server did not start.
    #[error("the cluster node did not start: {0}")]
    Start(String),
}

/// `prefix-<16 hex digits from the OS random source>`.
pub fn unique_node_name(prefix: &str) -> String {
    let mut bytes = [0u8; 8];
    // Without randomness the time is unique enough: the name only tells nodes apart.
    if getrandom::fill(&mut bytes).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        bytes = (nanos as u64 ^ u64::from(std::process::id())).to_le_bytes();
    }
    format!("{prefix}-{}", hex::encode(bytes))
}

/// Bridges ractor_cluster's node events to a callback. Its methods run inside the node
/// server's actor, so the callback must only hand the event on (a channel, a cast).
struct Subscription<F>(F);

impl<F: Fn(SessionEvent) + Send + 'static> NodeEventSubscription for Subscription<F> {
    fn node_session_opened(&self, ses: NodeServerSessionInformation) {
        (self.0)(SessionEvent::Opened(ses.into()));
    }

    fn node_session_disconnected(&self, ses: NodeServerSessionInformation) {
        (self.0)(SessionEvent::Disconnected(ses.into()));
    }

    fn node_session_authenticated(&self, ses: NodeServerSessionInformation) {
        (self.0)(SessionEvent::Authenticated(ses.into()));
    }

    fn node_session_ready(&self, ses: NodeServerSessionInformation) {
        (self.0)(SessionEvent::Ready(ses.into()));
    }
}

/// Starts a node listening on `options.listen`, and hands its session events to `on_event`
/// (from inside the node server: `on_event` must not block).
pub async fn start(
    options: NodeOptions,
    on_event: impl Fn(SessionEvent) + Send + 'static,
) -> Result<Node, NodeError> {
    // Listen once first: the library's own bind error surfaces as a startup panic of an
    // actor, without the address; this one says what and where.
    if options.listen.port() != 0 {
        std::net::TcpListener::bind(options.listen).map_err(|source| NodeError::Listen {
            addr: options.listen,
            source,
        })?;
    }
    let server = NodeServer::new(
        options.listen.port(),
        options.secret.expose().to_string(),
        options.name.clone(),
        options.host_part.clone(),
        None,
        Some(NodeConnectionMode::Isolated),
    )
    .with_listen_addr(options.listen.ip())
    .with_max_inbound_frame_size(MAX_FRAME_BYTES);
    let (server, _) = Actor::spawn(None, server, ())
        .await
        .map_err(|e| NodeError::Start(e.to_string()))?;
    server
        .cast(NodeServerMessage::SubscribeToEvents {
            id: "taskdaemon".to_string(),
            subscription: Box::new(Subscription(on_event)),
        })
        .map_err(|e| NodeError::Start(e.to_string()))?;
    Ok(Node {
        server,
        full_name: format!("{}@{}", options.name, options.host_part),
    })
}

/// The loopback address a worker host's node listens on.
pub fn loopback_any_port() -> SocketAddr {
    SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_differ_and_keep_their_prefix() {
        let a = unique_node_name("host-h1");
        let b = unique_node_name("host-h1");
        assert_ne!(a, b);
        assert!(
            a.starts_with("host-h1-") && a.len() == "host-h1-".len() + 16,
            "{a}"
        );
    }

    #[tokio::test]
    async fn a_taken_address_is_named_in_the_error() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let err = start(
            NodeOptions {
                name: unique_node_name("head"),
                host_part: "head".into(),
                listen: addr,
                secret: ClusterSecret::checked("0123456789abcdef", "test".into()).unwrap(),
            },
            |_| {},
        )
        .await
        .unwrap_err();
        let text = err.to_string();
        assert!(text.contains(&format!("cannot listen on {addr}")), "{text}");
    }
}
