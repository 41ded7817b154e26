//! What the head and its hosts say to each other (the JSON bodies of [`crate::wire`]), and
//! the rule for host names.
//!
//! A host joins in two steps: its node proves the shared secret to the head's node
//! (ractor_cluster's handshake), then its agent asks the head's registry to [`ToHead::Join`]
//! with its name and slots. The head answers [`Joined`] or refuses with a reason; from then
//! on the head pings the host's agent ([`ToHost::Ping`]) and tells it when the run ends
//! ([`ToHost::Bye`]).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

// Why the enums here are externally tagged (serde's default): an internally tagged enum
// (`#[serde(tag = "type")]`) is decoded by buffering the whole object into serde's
// `Content` tree first, and a nested one (`ToHead::Loop` holding a `FromHost::Coord`
// holding a `CoordRequest`) buffered it again at each level, on every hop of every
// cross-host request (perf of the head: benches/hosts.rs, BENCHMARKS.md "hosts"). An
// externally tagged one is read in one pass from the bytes.

/// The version of these messages; a host and a head of different versions do not join.
/// 5: shares and alerts carry their per-loop delivery numbers. 6: the enums are externally
/// tagged (`{"loop": {...}}`, not `{"type": "loop", ...}`). 7: a loop's start carries the
/// run's tool catalog overrides ([`StartLoop::catalog`]): a host of 6 would run its tools
/// under the default limits without a word. 8: a loop's start carries the run's
/// `web.allow-private` ([`StartLoop::web_allow_private`]): a host of 7 would hold the loop's
/// `web_fetch` to public addresses whatever the run allows, without a word. 9: a loop's
/// start says whether the run builds through a compiler cache ([`StartLoop::compiler_cache`])
/// and what its `warm:` names ([`StartLoop::warm`]): a host of 8 would build every loop cold
/// without a word. 10: a loop's start names the commit whose `.gitattributes` the host's own
/// git reads ([`StartLoop::attributes_from`]): a host of 9 would read none, and commit what
/// the user's LFS or end-of-line rules would have changed as it is. 11: a host sends the
/// git-lfs objects its loop's branch points at ([`FromHost::LfsChunk`]): a host of 10 kept
/// them in its mirror, and the head's branch pointed at content it never had. 12: a host
/// fetches the git-lfs objects of its loop's base ([`FromHost::BaseLfs`]): a host of 11 gave
/// its loops pointers where the user's checkout has content.
pub const PROTOCOL: u32 = 12;

/// The most objects one page of [`FromHost::BaseLfs`]'s answer lists (~90 bytes each in its
/// message, well below [`crate::wire::MAX_BODY_BYTES`]).
pub const LFS_LISTING_PAGE: usize = 10_000;

/// The most bytes of LFS objects a host fetches for one loop's base; past it, objects stay
/// pointers in the loop's worktree there (the host and the head both say so).
pub const MAX_BASE_LFS_BYTES: u64 = 2 * 1024 * 1024 * 1024;

/// The most bytes of a bundle one chunk carries (hex-encoded in its message: twice this,
/// well below [`crate::wire::MAX_BODY_BYTES`]).
pub const CHUNK_BYTES: usize = 1024 * 1024;

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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
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
    /// session closes. Its loops still running are interrupted, as a lost host's are.
    Leave {
        /// The host's name.
        name: String,
        /// Its token from [`Joined`]: only the host itself can make it leave.
        token: String,
        /// Why, in words.
        reason: String,
    },
    /// A joined host's request about one of its loops (asked). `token` is the one the head
    /// gave it in [`Joined`]: every host proved the same shared secret, and the token is
    /// what keeps one host from speaking for another's loops.
    Loop {
        /// The host's name.
        host: String,
        /// Its token from [`Joined`].
        token: String,
        /// The placement of the loop the request is about ([`StartLoop::attempt`]): the
        /// head refuses a request whose attempt is not the loop's current one (a host cut
        /// off while its loop moved elsewhere must not write into the moved loop's record,
        /// charge its budget or answer as it).
        attempt: u64,
        /// What it asks.
        request: FromHost,
    },
}

/// What a host asks the head about one of its loops (inside [`ToHead::Loop`]). The loop's
/// own types (model requests, events, transcript entries, receipts) travel as JSON values:
/// this crate knows nothing of them, the head reads each one itself and refuses what does
/// not read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FromHost {
    /// The host names the commits its mirror has (`have`); the head bundles the loop's base
    /// commit without what they reach and answers the bundle's size, `None` when the host
    /// has the base already (then no chunk is fetched).
    PrepareBase {
        /// The loop.
        loop_name: String,
        /// Commits the host's mirror has.
        have: Vec<String>,
    },
    /// A chunk of the bundle of the loop's base commit, from `offset` (answered with a
    /// [`Chunk`]).
    BaseChunk {
        /// The loop.
        loop_name: String,
        /// Where the chunk starts.
        offset: u64,
    },
    /// The git-lfs objects the tree of the loop's base commit points at which the head
    /// holds (answered with a list of [`LfsObjectName`]): the host fetches those its mirror
    /// lacks ([`FromHost::BaseLfsChunk`]) before it checks the loop's worktree out, so that
    /// git-lfs fills the worktree as it fills the user's checkout.
    BaseLfs {
        /// The loop.
        loop_name: String,
        /// The listing is in pages of at most [`LFS_LISTING_PAGE`] objects, by id: the page
        /// after this id (`None`: the first). A page shorter than that is the last.
        after: Option<String>,
    },
    /// A chunk of one of the objects [`FromHost::BaseLfs`] listed, from `offset` (answered
    /// with a [`Chunk`]); the host keeps the object only when its bytes hash to `oid`.
    BaseLfsChunk {
        /// The loop.
        loop_name: String,
        /// The object's id (SHA-256, lowercase hex).
        oid: String,
        /// Where the chunk starts.
        offset: u64,
    },
    /// One model call of the loop (answered with a [`CompleteAnswer`]): the host has no
    /// keys; the head calls its own model client and charges the loop's budget.
    Complete {
        /// The loop.
        loop_name: String,
        /// The request (`td_llm::LlmRequest` less its tools, which are the head's), as
        /// written on the host.
        request: RawJson,
    },
    /// What the loop recorded since the last batch (answered `()`): the head appends them to
    /// the run's record. `batch` counts from 1; a batch the head has (a retry whose answer
    /// was lost) is answered without being appended twice.
    Records {
        /// The loop.
        loop_name: String,
        /// Its number.
        batch: u64,
        /// Events (`td_protocol::events::EventKind`), in order.
        events: Vec<RawJson>,
        /// Transcript entries (`td_engine::transcript::TranscriptEntry`), in order.
        transcript: Vec<RawJson>,
        /// Receipts (`td_toolkit::receipts::Receipt`), in order.
        receipts: Vec<RawJson>,
    },
    /// A chunk of the bundle of the loop's branch, at `offset` (answered `()`).
    BranchChunk {
        /// The loop.
        loop_name: String,
        /// Where the chunk goes.
        offset: u64,
        /// The bytes, hex.
        data: String,
    },
    /// A chunk of a git-lfs object the loop's branch points at, at `offset` (answered with
    /// `None` once the head holds the whole object, when no more of it is to be sent; else
    /// the offset the head stands at, to send from). A chunk at 0 starts the object again;
    /// an empty one there asks. Sent after the branch's chunks and before its
    /// [`FromHost::Checkpoint`] or [`FromHost::Ended`]; the head keeps the object only when
    /// its bytes hash to `oid`.
    LfsChunk {
        /// The loop.
        loop_name: String,
        /// The object's id (SHA-256, lowercase hex), as its pointer names it.
        oid: String,
        /// Its size, as its pointer names it.
        size: u64,
        /// Where the chunk goes.
        offset: u64,
        /// The bytes, hex.
        data: String,
    },
    /// What the host's runtime tells or asks the head's coordinator about the loop
    /// (answered as [`CoordRequest`] says): the head routes, limits and records every
    /// query, share and alert, also between two loops of one host.
    Coord {
        /// The loop it is about (the asker, the sender, or the loop a system alert is about).
        loop_name: String,
        /// What.
        request: CoordRequest,
    },
    /// The loop's work at the end of a failed iteration (answered `()`), sent before that
    /// iteration's progress note and before the loop's next model call: the bundle of the
    /// commits since the last tip the head took ([`FromHost::BranchChunk`]s first), so that
    /// the head holds every finished iteration's commit and can resume the loop elsewhere
    /// from it when its host is lost.
    Checkpoint {
        /// The loop.
        loop_name: String,
        /// The iteration whose work it is.
        iteration: u32,
        /// The bundle: its tip and size.
        branch: BranchBundle,
    },
    /// The loop ended (answered `()`), after its last records and its branch's chunks.
    Ended {
        /// The loop.
        loop_name: String,
        /// How (`td_engine::LoopEnd`).
        end: Value,
        /// Its branch's bundle, when the host made one: its tip and size.
        branch: Option<BranchBundle>,
        /// Why the host could not send its work, when it could not.
        problem: Option<String>,
    },
}

/// A host's runtime to the head's coordinator (`td_runtime::upstream::Upstream`), for one
/// of the host's loops.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CoordRequest {
    /// The loop joins the run's coordination (answered `()`).
    Register {
        /// Its type.
        loop_type: String,
        /// Its task.
        task: String,
        /// The alert types it hears.
        subscriptions: Option<Vec<String>>,
    },
    /// Its status changed (answered `()`).
    SetStatus {
        /// The new status.
        status: String,
    },
    /// It asks `target` (answered with the answer's text).
    Query {
        /// The loop asked.
        target: String,
        /// The question.
        question: String,
        /// The asker's timeout, in milliseconds.
        timeout_ms: u64,
    },
    /// It shares `data` (answered with each target's delivery).
    Share {
        /// The loops it shares with.
        targets: Vec<String>,
        /// What kind of data.
        data_type: String,
        /// The data.
        data: Value,
    },
    /// It alerts, or (`system`) the host's runtime announces its start or end (answered
    /// with how many loops the alert reached).
    Alert {
        /// Whether the host's runtime sends it about the loop (not the loop itself).
        system: bool,
        /// The alert's type.
        event_type: String,
        /// Its message.
        message: String,
        /// Its data.
        data: Option<Value>,
    },
    /// The run's other loops (answered with their list).
    List,
    /// The loop left the run (answered `()`).
    Unregister,
}

/// A JSON value carried as its text: written once where it is made (`to`) and read once
/// into its own type where it is used (`parse`), where a [`Value`] was built, written,
/// parsed into a `Value` again and then read (the model requests, responses and records of
/// every remote loop). Its wire form is the JSON itself, as a `Value`'s was.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RawJson(Box<RawValue>);

impl RawJson {
    /// `value` written as JSON.
    pub fn to<T: Serialize + ?Sized>(value: &T) -> Result<RawJson, serde_json::Error> {
        serde_json::value::to_raw_value(value).map(RawJson)
    }

    /// `text`, which must be one JSON value (it is checked, not trusted).
    pub fn from_text(text: String) -> Result<RawJson, serde_json::Error> {
        RawValue::from_string(text).map(RawJson)
    }

    /// Reads the text as a `T`.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.0.get())
    }

    /// The JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }
}

impl PartialEq for RawJson {
    fn eq(&self, other: &RawJson) -> bool {
        self.get() == other.get()
    }
}

/// The head's answer to [`FromHost::Complete`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompleteAnswer {
    /// The model's response (`td_llm::LlmResponse`).
    Response {
        /// The response.
        response: RawJson,
    },
    /// The loop's budget or the run's has no room for the call: the loop pauses.
    OverBudget {
        /// Which limit, and what to do.
        reason: String,
    },
    /// The model call failed (after the head's client retried), or the head gave it up.
    Failed {
        /// `transport`, `api`, `bad_reply` or `script`; or [`GIVEN_UP_STOPPING`].
        kind: String,
        /// The HTTP status of an `api` error.
        status: Option<u16>,
        /// What it said.
        message: String,
    },
}

/// The [`CompleteAnswer::Failed`] kind of an iteration's model call the head gave up
/// because the run asked the loop's host to stop the loop (said only once the host took
/// the stop): the host ends the call with the loop's stop, not as a model error.
pub const GIVEN_UP_STOPPING: &str = "given_up_stopping";

/// A loop's branch as a host sent it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BranchBundle {
    /// The commit its branch ends at.
    pub tip: String,
    /// The bundle's size in bytes (all of it was sent in chunks).
    pub bytes: u64,
}

/// A git-lfs object, as its pointer names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LfsObjectName {
    /// Its id: the SHA-256 of its content, lowercase hex.
    pub oid: String,
    /// Its size in bytes.
    pub size: u64,
}

/// A piece of a file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    /// The bytes, hex.
    pub data: String,
    /// The whole file's size.
    pub total: u64,
}

/// How a loop runs on a host: everything its engine, tools and budget need, and where its
/// work starts. Never the head's secrets, keys or paths.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StartLoop {
    /// The loop's name.
    pub loop_name: String,
    /// This placement of the loop, fresh for each start (a loop moved from a lost host
    /// gets a new one): every request about it carries it ([`ToHead::Loop`]).
    pub attempt: u64,
    /// Its type.
    pub loop_type: String,
    /// Its task.
    pub task: String,
    /// Iterations before it fails.
    pub max_iterations: u32,
    /// Model turns per iteration.
    pub max_turns: u32,
    /// The limit of one iteration's model turns, in milliseconds.
    pub iteration_timeout_ms: Option<u64>,
    /// The validation exit code that means success.
    pub success_code: i32,
    /// The system prompt template.
    pub system_template: String,
    /// The iteration prompt template.
    pub iteration_template: String,
    /// The run's other loops.
    pub peers: Vec<String>,
    /// The first iteration to run (above 1 when resumed).
    pub first_iteration: u32,
    /// The tools its model sees.
    pub tools: Vec<String>,
    /// The run's `catalog:` overrides (lanes, timeouts, output caps per tool, in the form
    /// taskdaemon.yml uses), applied on the host to the default catalog as on the head.
    pub catalog: Value,
    /// Its `build` command.
    pub build: Option<String>,
    /// Its `test` command.
    pub test: Option<String>,
    /// Its validation command.
    pub validate: Option<String>,
    /// Alert types it hears (`None`: every loop's).
    pub subscriptions: Option<Vec<String>>,
    /// Inbox items it had not seen, with their delivery numbers
    /// (`td_protocol::inbox::Delivered`; a resumed or moved loop), in the order to show.
    pub initial_inbox: Vec<Value>,
    /// Its progress notes (a resumed loop).
    pub initial_progress: Vec<String>,
    /// Whether an earlier process announced it.
    pub announced: bool,
    /// Its limits the host checks: iterations and wall time (money and tokens are checked
    /// by the head at each model call, with the run's).
    pub limits: HostLimits,
    /// How the head prices calls, so that what the host records as spent is what the head
    /// charges.
    pub pricing: WirePricing,
    /// The commit its work starts from (for a resumed or moved loop, the last commit of its
    /// branch the head holds). Its branch's bundles are made from the last tip the head
    /// took, at first this one.
    pub base_commit: String,
    /// The commit whose `.gitattributes` the host's own git reads in its mirror and the
    /// loop's worktree (the run's, a commit the user made; never one of a loop's, as
    /// `base_commit` may be): `None` for none.
    #[serde(default)]
    pub attributes_from: Option<String>,
    /// The branch its worktree is on (the head's name for it).
    pub branch: String,
    /// The run's command confinement, without paths of the head's machine: `mode`, `read`,
    /// `unix-sockets` and `env` of `sandbox:` (the form taskdaemon.yml uses).
    pub sandbox: Value,
    /// The run's `web.allow-private` as taskdaemon.yml writes it (`true`, `false` or a list
    /// of host names and IP addresses): what `web_fetch` may reach besides the public
    /// internet, at most; the host allows no more than its own `--web-allow-private`.
    #[serde(default)]
    pub web_allow_private: Value,
    /// Whether the run builds through a compiler cache (`compiler-cache: sccache`): the
    /// loop's `build`, `test` and `validate` commands then run through a confined sccache
    /// server of the host's own (its binary and cache directory are the host's: paths of the
    /// head's machine mean nothing there), shared by the host's loops.
    #[serde(default)]
    pub compiler_cache: bool,
    /// The build state the loop's new worktree is seeded with (its `warm:` paths, relative
    /// to the repository root, presets named by their paths): the host copies them from its
    /// own checkout (`taskdaemon host --warm-from DIR`), checking each path as the config
    /// is checked, and says what it could not copy.
    #[serde(default)]
    pub warm: Vec<String>,
}

/// A loop's limits that its host checks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostLimits {
    /// Iterations it may start.
    pub iterations: Option<u64>,
    /// Wall time of its iterations, in milliseconds.
    pub wall_ms: Option<u64>,
    /// Iterations it started before (a resumed loop).
    pub carried_iterations: u64,
    /// Wall time it took before, in milliseconds.
    pub carried_wall_ms: u64,
    /// Percent of a limit past which the model is told what is left.
    pub soft_percent: u8,
}

/// How calls are priced, as the head prices them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WirePricing {
    /// The model's name.
    pub model: String,
    /// Its price per token in nano-dollars: input, output, cache read, cache write
    /// (`None`: unknown).
    pub price: Option<[u64; 4]>,
    /// The output limit of one call.
    pub max_output_tokens: u64,
}

/// The head's answer to a [`ToHead::Join`] it accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Joined {
    /// What the host puts in each [`ToHead::Loop`]: proof that it is this host.
    pub token: String,
    /// The slots the host runs with.
    pub slots: u32,
    /// How long either side waits for the other's heartbeat before taking it for lost, in
    /// milliseconds.
    pub lost_after_ms: u64,
}

/// Requests to a host's agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToHost {
    /// The head's heartbeat (asked; the answer is `()`).
    Ping,
    /// The run ended: the host may go (told).
    Bye {
        /// Why, in words.
        reason: String,
    },
    /// Run a loop (asked; answered once the loop runs, or with why it cannot).
    StartLoop(Box<StartLoop>),
    /// Put a share or alert the head routed into a loop's inbox (asked; answered `true`
    /// once it is there).
    Deliver {
        /// The loop.
        loop_name: String,
        /// The item (`td_protocol::inbox::InboxItem`).
        item: Value,
        /// Its delivery number for the loop (`td_protocol::inbox::Delivered`): the loop's
        /// `inbox_shown` events name the numbers it showed (protocol 5).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        delivery: Option<u64>,
    },
    /// A loop's answer to another loop's question (asked; answered with the answer, or with
    /// why there is none).
    Answer {
        /// The loop asked.
        loop_name: String,
        /// The asking loop.
        from: String,
        /// The question.
        question: String,
        /// The asker's time left, in milliseconds.
        timeout_ms: u64,
    },
    /// Stop a loop (asked): after its call in flight, or at once (`now`: its calls in
    /// flight cancelled).
    StopLoop {
        /// The loop.
        loop_name: String,
        /// Whether at once.
        now: bool,
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
            r#"{"join":{"protocol":12,"name":"h1","node":"host-h1-00@host-h1","slots":null,"workdir":"/w","version":"0.1.0"}}"#
        );
        // A delivery names its number (protocol 5); one without reads as before.
        let deliver = ToHost::Deliver {
            loop_name: "m".into(),
            item: serde_json::json!({"kind": "share"}),
            delivery: Some(3),
        };
        let wire = serde_json::to_string(&deliver).unwrap();
        assert_eq!(
            wire,
            r#"{"deliver":{"loop_name":"m","item":{"kind":"share"},"delivery":3}}"#
        );
        let old: ToHost =
            serde_json::from_str(r#"{"deliver":{"loop_name":"m","item":{}}}"#).unwrap();
        assert!(matches!(old, ToHost::Deliver { delivery: None, .. }));
        assert_eq!(serde_json::from_str::<ToHead>(&json).unwrap(), join);
        assert_eq!(serde_json::to_string(&ToHost::Ping).unwrap(), r#""ping""#);
        let query = ToHead::Loop {
            host: "h1".into(),
            token: "t".into(),
            attempt: 3,
            request: FromHost::Coord {
                loop_name: "a".into(),
                request: CoordRequest::Query {
                    target: "b".into(),
                    question: "q?".into(),
                    timeout_ms: 5,
                },
            },
        };
        let json = serde_json::to_string(&query).unwrap();
        assert_eq!(
            json,
            r#"{"loop":{"host":"h1","token":"t","attempt":3,"request":{"coord":{"loop_name":"a","request":{"query":{"target":"b","question":"q?","timeout_ms":5}}}}}}"#
        );
        assert_eq!(serde_json::from_str::<ToHead>(&json).unwrap(), query);
        // A base's LFS objects (protocol 12).
        let listing = FromHost::BaseLfs {
            loop_name: "a".into(),
            after: Some("ab".into()),
        };
        assert_eq!(
            serde_json::to_string(&listing).unwrap(),
            r#"{"base_lfs":{"loop_name":"a","after":"ab"}}"#
        );
        let chunk = FromHost::BaseLfsChunk {
            loop_name: "a".into(),
            oid: "ab".into(),
            offset: 7,
        };
        let wire = serde_json::to_string(&chunk).unwrap();
        assert_eq!(
            wire,
            r#"{"base_lfs_chunk":{"loop_name":"a","oid":"ab","offset":7}}"#
        );
        assert_eq!(serde_json::from_str::<FromHost>(&wire).unwrap(), chunk);
        // The form of protocols up to 5 (internally tagged) is not read (a join of it is told the
        // protocols: `head::older_join`).
        assert!(serde_json::from_str::<ToHead>(r#"{"type":"ping"}"#).is_err());
        assert!(serde_json::from_str::<ToHost>(r#"{"type":"ping"}"#).is_err());
    }
}
