//! What the head and its hosts say to each other (the JSON bodies of [`crate::wire`]), and
//! the rule for host names.
//!
//! A host joins in two steps: its node proves the shared secret to the head's node
//! (ractor_cluster's handshake), then its agent asks the head's registry to [`ToHead::Join`]
//! with its name and slots. The head answers [`Joined`] or refuses with a reason; from then
//! on the head pings the host's agent ([`ToHost::Ping`]) and tells it when the run ends
//! ([`ToHost::Bye`]).

use serde::{Deserialize, Serialize};

/// The version of these messages; a host and a head of different versions do not join.
pub const PROTOCOL: u32 = 1;

/// The process-group scope of the actors that take messages from other nodes.
pub const SCOPE: &str = "taskdaemon";

/// The group of the head's host registry (one member, on the head).
pub const HEAD_GROUP: &str = "head";

/// The group of the hosts' agents (one member per host node).
pub const HOSTS_GROUP: &str = "hosts";

/// The name placement rules use for the head itself; no host may join with it.
pub const HEAD_NAME: &str = "head";

/// The longest host name.
pub const MAX_NAME_LEN: usize = 63;

/// Requests to the head's registry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToHead {
    /// A host asks to join (asked; the answer is [`Joined`] or a refusal).
    Join {
        /// [`PROTOCOL`] of the host.
        protocol: u32,
        /// The host's name (unique among the joined hosts).
        name: String,
        /// The name of the host's node (ractor_cluster's, `name@host`): which session is
        /// this host's.
        node: String,
        /// Loops the host offers to run at once; `None`: the head's default.
        slots: Option<u32>,
        /// Where the host keeps its worktrees (shown by `status`).
        workdir: String,
        /// The host's taskdaemon version.
        version: String,
    },
    /// A joined host leaves (its user stopped it); asked, so that it is recorded before the
    /// session closes.
    Leave {
        /// The host's name.
        name: String,
        /// Why, in words.
        reason: String,
    },
}

/// The head's answer to a [`ToHead::Join`] it accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Joined {
    /// The slots the host runs with.
    pub slots: u32,
    /// How long either side waits for the other's heartbeat before taking it for lost, in
    /// milliseconds.
    pub lost_after_ms: u64,
}

/// Requests to a host's agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToHost {
    /// The head's heartbeat (asked; the answer is `()`).
    Ping,
    /// The run ended: the host may go (told).
    Bye {
        /// Why, in words.
        reason: String,
    },
}

/// Whether `name` may name a host: 1 to [`MAX_NAME_LEN`] ASCII letters, digits, `.`, `_`
/// and `-`, starting with a letter or digit (it is shown in tables and used in paths).
pub fn valid_host_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && name.len() <= MAX_NAME_LEN
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// What [`valid_host_name`] wants, for messages.
pub const HOST_NAME_RULE: &str =
    "1 to 63 ASCII letters, digits, '.', '_' or '-', starting with a letter or digit";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_are_short_plain_words() {
        for good in ["a", "builder-1", "gpu.box_2", "0"] {
            assert!(valid_host_name(good), "{good}");
        }
        for bad in ["", "-a", ".a", "a b", "a/b", "ä", &"x".repeat(64), "a\n"] {
            assert!(!valid_host_name(bad), "{bad:?}");
        }
        assert!(valid_host_name(&"x".repeat(63)));
    }

    #[test]
    fn requests_have_a_stable_wire_form() {
        let join = ToHead::Join {
            protocol: PROTOCOL,
            name: "h1".into(),
            node: "host-h1-00@host-h1".into(),
            slots: None,
            workdir: "/w".into(),
            version: "0.1.0".into(),
        };
        let json = serde_json::to_string(&join).unwrap();
        assert_eq!(
            json,
            r#"{"type":"join","protocol":1,"name":"h1","node":"host-h1-00@host-h1","slots":null,"workdir":"/w","version":"0.1.0"}"#
        );
        assert_eq!(serde_json::from_str::<ToHead>(&json).unwrap(), join);
        assert_eq!(
            serde_json::to_string(&ToHost::Ping).unwrap(),
            r#"{"type":"ping"}"#
        );
    }
}
