//! Worker hosts of a run (issue 18). On the head (`taskdaemon run` with a `hosts:`
//! section): the secret is read and checked before anything is written ([`prepare`]), then
//! the head listens while the run goes ([`Prepared::start`]), records every host that
//! joins, is lost, leaves or is refused as a `host_*` event (`summary.json`'s `hosts` and
//! `status` show them: [`summary`]), and tells the hosts when the run ends. A worker host is
//! `taskdaemon host --join` ([`worker`]).
//!
//! Where each loop runs is decided by [`placement`] when it is ready to start.

pub mod base_lfs;
pub mod branch_budget;
pub mod host_loops;
pub mod model_wire;
pub mod moves;
pub mod placement;
pub mod remote;
pub mod shown;
pub mod summary;
pub mod worker;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use td_cluster::{Head, HeadOptions, HostEvent, HostState};
use td_protocol::events::{EventKind, EventLog};
use tokio::sync::Notify;

use crate::config::hosts::HostsConfig;
use summary::{HostStatus, HostsSummary};

/// Whose an event is and its kind, read from its JSON text before (or instead of) the rest
/// of it: by a host, to stream only its own loops' events, and by the head, to check a
/// host's events before it reads them whole.
#[derive(serde::Deserialize)]
pub(crate) struct EventAbout<'a> {
    /// The event's kind (its `event` tag).
    #[serde(borrow)]
    pub event: std::borrow::Cow<'a, str>,
    /// The loop it is about, when it names one.
    #[serde(borrow, default)]
    pub loop_name: Option<std::borrow::Cow<'a, str>>,
}

/// How long the head waits at the run's end for the hosts it told to close their
/// connections.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// The head's side, checked and ready to listen.
#[derive(Debug)]
pub struct Prepared {
    options: HeadOptions,
    placement: Vec<String>,
    /// `hosts.max-record-bytes`.
    max_record_bytes: u64,
}

/// The head's side, listening.
#[derive(Debug)]
pub struct HeadHosts {
    head: Head,
    /// Woken when a host joins, is lost or leaves: loops waiting for a host look again.
    changed: Arc<Notify>,
}

/// Reads the hosts' secret of `config` (`base_dir`: the config file's directory) and checks
/// that its address can be listened on; `None` without a `hosts:` section. From here on the
/// secret is redacted from everything the run writes, and kept out of commands' environment.
pub fn prepare(config: Option<&HostsConfig>, base_dir: &Path) -> Result<Option<Prepared>, String> {
    let Some(config) = config else {
        return Ok(None);
    };
    let options = config.head_options(base_dir)?;
    td_base::secrets::register("hosts secret", options.secret.expose());
    // Before the record is made: an address in use is a startup error, not a broken run.
    std::net::TcpListener::bind(options.listen)
        .map_err(|e| format!("hosts: cannot listen on {}: {e}", options.listen))?;
    Ok(Some(Prepared {
        options,
        placement: config.placement_lines(),
        max_record_bytes: config.max_record_bytes,
    }))
}

impl Prepared {
    /// The most bytes of records one placement of a loop on a host may send
    /// (`hosts.max-record-bytes`).
    pub fn max_record_bytes(&self) -> u64 {
        self.max_record_bytes
    }

    /// Listens for hosts, recording their events in `events`. `earlier`: the hosts of the
    /// run a resume continues; those still joined there went with its process, and are
    /// recorded lost first.
    pub async fn start(
        self,
        events: &Arc<EventLog>,
        earlier: Option<&HostsSummary>,
        remote: Option<Arc<remote::RemoteLoops>>,
    ) -> Result<HeadHosts, String> {
        for host in earlier.into_iter().flat_map(|h| h.hosts.values()) {
            if host.status == HostStatus::Joined {
                events.record(EventKind::HostLost {
                    host: host.name.clone(),
                    address: host.address.clone(),
                    reason: "the run's earlier process ended".to_string(),
                });
            }
        }
        let log = events.clone();
        let listen = self.options.listen;
        let changed = Arc::new(Notify::new());
        let wake = changed.clone();
        let lost = remote.clone();
        let serve = remote.clone();
        let running = remote.clone();
        let refuse = |request: td_cluster::HostRequest| {
            request
                .reply
                .send(Err::<(), _>("this run runs no loops on hosts".to_string()))
        };
        let head = Head::start_with(
            self.options,
            move |event| {
                // Its loops end first (marked interrupted), then the host is recorded lost or
                // left: a host that leaves with loops running takes them with it.
                match (&event, &lost) {
                    (HostEvent::Lost { name, reason, .. }, Some(lost)) => {
                        lost.host_gone(name, "was lost", reason)
                    }
                    (HostEvent::Left { name, reason }, Some(lost)) => {
                        lost.host_gone(name, "left", reason)
                    }
                    _ => {}
                }
                log.record(event_kind(event));
                wake.notify_one();
            },
            Arc::new(move |request| match &serve {
                Some(serve) => {
                    tokio::spawn(serve.clone().handle(request));
                }
                None => refuse(request),
            }),
            Arc::new(move |host: &str| {
                let loops: Vec<String> = running
                    .as_ref()?
                    .running()
                    .into_iter()
                    .filter(|(_, on)| on == host)
                    .map(|(name, _)| name)
                    .collect();
                (!loops.is_empty()).then(|| format!("its loops {}", loops.join(", ")))
            }),
        )
        .await
        .map_err(|e| format!("hosts: {e}"))?;
        if let Some(remote) = &remote {
            remote.set_asker(head.asker());
        }
        eprintln!(
            "taskdaemon: hosts join at {listen} (taskdaemon host --join THIS-MACHINE:{} --secret-file FILE)",
            listen.port()
        );
        for rule in &self.placement {
            eprintln!("taskdaemon: placement: {rule}");
        }
        Ok(HeadHosts { head, changed })
    }
}

impl HeadHosts {
    /// Where hosts connect.
    pub fn listen(&self) -> SocketAddr {
        self.head.listen()
    }

    /// The joined hosts and their slots.
    pub async fn joined(&self) -> BTreeMap<String, u32> {
        self.head
            .hosts()
            .await
            .into_iter()
            .filter(|h| h.state == HostState::Joined)
            .map(|h| (h.name, h.slots))
            .collect()
    }

    /// Returns once a host joined, was lost or left since the last call.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// Tells every joined host that the run ended (`reason`) and stops listening; each is
    /// recorded as left.
    pub async fn shutdown(self, reason: &str) {
        self.head.shutdown(reason, SHUTDOWN_GRACE).await;
    }
}

/// The run's event for a change of the head's host registry.
fn event_kind(event: HostEvent) -> EventKind {
    match event {
        HostEvent::Joined {
            name,
            address,
            slots,
            workdir,
            version,
        } => EventKind::HostJoined {
            host: name,
            address,
            slots,
            workdir,
            version,
        },
        HostEvent::Lost {
            name,
            address,
            reason,
        } => EventKind::HostLost {
            host: name,
            address,
            reason,
        },
        HostEvent::Left { name, reason } => EventKind::HostLeft { host: name, reason },
        HostEvent::Refused {
            address,
            name,
            reason,
        } => EventKind::HostRefused {
            address,
            host: name,
            reason,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use summary::HostSummary;

    #[tokio::test]
    async fn a_resumed_run_records_the_earlier_processs_hosts_lost() {
        let options = HeadOptions {
            listen: "127.0.0.1:0".parse().unwrap(),
            secret: td_cluster::ClusterSecret::checked("0123456789abcdef", "test".into()).unwrap(),
            lost_after: Duration::from_secs(5),
            default_slots: 2,
            max_requests_in_flight: 1024,
        };
        let mut earlier = HostsSummary::default();
        for (name, status) in [("b1", HostStatus::Joined), ("b2", HostStatus::Left)] {
            earlier.hosts.insert(
                name.into(),
                HostSummary {
                    name: name.into(),
                    address: "10.0.0.2:1".into(),
                    status,
                    ..HostSummary::default()
                },
            );
        }
        let events = Arc::new(EventLog::in_memory());
        let hosts = Prepared {
            options,
            placement: Vec::new(),
            max_record_bytes: crate::config::hosts::DEFAULT_MAX_RECORD_BYTES,
        }
        .start(&events, Some(&earlier), None)
        .await
        .unwrap();
        let recorded = events.events();
        assert_eq!(recorded.len(), 1, "{recorded:?}");
        assert_eq!(
            recorded[0].kind,
            EventKind::HostLost {
                host: "b1".into(),
                address: "10.0.0.2:1".into(),
                reason: "the run's earlier process ended".into(),
            }
        );
        hosts.shutdown("done").await;
    }
}
