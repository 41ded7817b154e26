//! Worker hosts joined to the head over ractor_cluster (issue 18): the shared secret
//! (`secret`), the messages the head and hosts exchange (`protocol`, carried by `wire`),
//! one cluster node per process (`node`), the head's host registry (`head`) and a worker
//! host's agent and join (`host`).
//!
//! Only the binary depends on this crate; the runtime, the engine and the tools know
//! nothing of other nodes. What ractor_cluster leaves open and how each part guards it is
//! said where it is guarded (`wire`: answers and sizes; `head`: handshake deadline and
//! heartbeats; `node`: unique node names; `secret`: its length and its file's mode).

pub mod head;
pub mod host;
pub mod node;
pub mod protocol;
pub mod secret;
pub mod wire;

pub use head::{
    BusyCheck, Head, HeadOptions, HostAsker, HostEvent, HostInfo, HostRequest, HostState,
};
pub use host::{HeadLink, HeadRequest, HostEnd, HostOptions, HostSession, JoinError};
pub use secret::{ClusterSecret, SecretError};
