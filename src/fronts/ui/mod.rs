//! The local web dashboard of a run (`taskdaemon ui`, `taskdaemon run --ui`): an HTTP
//! server (axum on tokio, in a process of its own; see `process`) that serves the embedded page and a JSON and
//! server-sent-events API over the run record, and passes the page's stop buttons to the
//! run's control socket (`run/control.rs`). It reads the record only as files, following
//! appended lines, so a finished run and a live one (in this process or another) are the
//! same code.
//!
//! - `assets`: the page's three files, embedded;
//! - `auth`: loopback `Host` check, the token of non-loopback binds, same-origin changes,
//!   the headers of every answer;
//! - `feed`: the one follower of the record, fanned out to every stream;
//! - `events`: `GET /api/events`;
//! - `api`: the JSON endpoints and the stop buttons; `error` their errors;
//! - `project`: what the run's config adds (dependencies, bases, the repository);
//! - `diff`: a loop's diff through the daemon's own git;
//! - `lines`: capped line reading of the record's files;
//! - `process`: the dashboard of `run --ui` as a process of its own.

pub mod api;
pub mod assets;
pub mod auth;
pub mod diff;
pub mod error;
pub mod events;
pub mod feed;
pub mod lines;
pub mod process;
pub mod project;

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};

use self::api::{App, AppState};
use self::auth::Access;
use self::feed::Feed;
use self::project::Project;

/// The port the dashboard listens on unless told.
pub const DEFAULT_PORT: u16 = 7420;

/// The environment variable that sets how often, in milliseconds, the follower looks at the
/// record (5 to 10,000; see [`feed::DEFAULT_POLL`]).
pub const POLL_ENV: &str = "TASKDAEMON_UI_POLL_MS";

/// A dashboard whose socket is bound: its address is known and can be printed before it
/// serves anything.
pub struct Bound {
    listener: tokio::net::TcpListener,
    access: Arc<Access>,
    url: String,
}

/// Why the dashboard could not listen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindError(pub String);

/// Binds the dashboard's socket on `bind`:`port` (`0`: any free port).
pub async fn bind(bind: IpAddr, port: u16) -> Result<Bound, BindError> {
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(bind, port))
        .await
        .map_err(|e| {
            BindError(if e.kind() == std::io::ErrorKind::AddrInUse {
                format!(
                    "port {port} of {bind} is taken ({e}); choose another with --port N (or --ui-port N), or --port 0 for any free one"
                )
            } else {
                format!("cannot listen on {bind} port {port}: {e}")
            })
        })?;
    let addr = listener
        .local_addr()
        .map_err(|e| BindError(format!("cannot read the dashboard's address: {e}")))?;
    let access = Access::for_address(addr).map_err(BindError)?;
    let url = match &access.token {
        Some(token) => format!("http://{addr}/?token={token}"),
        None => format!("http://{addr}/"),
    };
    Ok(Bound {
        listener,
        access: Arc::new(access),
        url,
    })
}

impl Bound {
    /// The page's address (with the token, when one is needed).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Serves the run in `run_dir` until `shutdown` completes (open streams are dropped
    /// then, not waited for: a stream of a live run never ends by itself).
    pub async fn serve(
        self,
        run_dir: &Path,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), String> {
        let dir = run_dir.to_path_buf();
        let app = tokio::task::spawn_blocking(move || {
            let recorded = crate::run::record::read_summary(&dir)
                .ok()
                .and_then(|s| s.config)
                .or_else(|| {
                    crate::run::rebuild::rebuild(&dir)
                        .ok()
                        .and_then(|(s, _)| s.config)
                });
            App {
                feed: Feed::start(&dir, poll_interval()),
                project: Project::load(&dir, recorded.as_deref()),
                run_dir: dir,
            }
        })
        .await
        .map_err(|e| format!("cannot read the run record: {e}"))?;
        let router = router(Arc::new(app), self.access);
        tokio::select! {
            served = axum::serve(self.listener, router) => {
                served.map_err(|e| format!("the dashboard's server failed: {e}"))
            }
            () = shutdown => Ok(()),
        }
    }
}

/// How often the record is polled: [`feed::DEFAULT_POLL`], or what [`POLL_ENV`] says.
pub fn poll_interval() -> Duration {
    match std::env::var(POLL_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        Some(ms) => Duration::from_millis(ms.clamp(5, 10_000)),
        None => feed::DEFAULT_POLL,
    }
}

/// The dashboard's routes.
pub fn router(app: AppState, access: Arc<Access>) -> Router {
    Router::new()
        .route("/", get(assets::index))
        .route("/index.html", get(assets::index))
        .route("/app.js", get(assets::app_js))
        .route("/app.css", get(assets::app_css))
        .route("/api/run", get(api::run))
        .route("/api/run/stop", post(api::stop_run))
        .route("/api/events", get(events::stream))
        .route("/api/loops/{name}", get(api::one_loop))
        .route("/api/loops/{name}/transcript", get(api::transcript))
        .route("/api/loops/{name}/receipts", get(api::receipts))
        .route("/api/loops/{name}/diff", get(api::diff))
        .route("/api/loops/{name}/stop", post(api::stop_loop))
        .fallback(api::not_found)
        .method_not_allowed_fallback(api::method_not_allowed)
        .with_state(app)
        .layer(axum::middleware::from_fn_with_state(access, auth::guard))
}
