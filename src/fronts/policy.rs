//! The policy a front's tool calls run under — catalog limits, command confinement
//! (`sandbox:`), the web tools' reach — read from a `taskdaemon.yml` or the defaults. `tool
//! exec`, `mcp` and `replay verify` all build their contexts here, so a replayed command is
//! confined exactly as a command of a session with the same config (and a loop of a run:
//! [`crate::config::Config::sandbox_settings`] is what `run` uses too).

use std::path::Path;
use std::sync::Arc;

use crate::config::Config;
use td_confine::{SandboxReport, SandboxSettings};
use td_toolkit::catalog::Catalog;
use td_toolkit::context::ToolContext;
use td_toolkit::web_access::WebAccess;

/// Catalog, sandbox and web access of a front.
#[derive(Debug, Clone, Default)]
pub struct SessionPolicy {
    /// Tool timeouts, caps and lanes.
    pub catalog: Catalog,
    /// How commands are confined (the model's api-key-file is hidden).
    pub sandbox: SandboxSettings,
    /// What web_fetch may reach besides the public internet.
    pub web_access: WebAccess,
}

impl SessionPolicy {
    /// The policy of the config at `config`, or the defaults.
    pub fn load(config: Option<&Path>) -> Result<Self, String> {
        let Some(path) = config else {
            return Ok(Self::default());
        };
        let config = Config::load(path)?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Ok(SessionPolicy {
            catalog: config.catalog()?,
            sandbox: config.sandbox_settings(&base),
            web_access: config.web_access()?,
        })
    }

    /// What every front does before its first call: every secret of the environment (and
    /// the config's named ones) is redacted from then on, and a machine that lacks what
    /// `sandbox.mode: required` asks for is refused.
    pub fn start(&self) -> Result<SandboxReport, String> {
        td_base::secrets::register_environment(&[]);
        SandboxReport::at_start(&self.sandbox).map_err(|e| e.to_string())
    }

    /// A context for `worktree` under this policy.
    pub fn context(
        &self,
        worktree: &Path,
        exec_id: impl Into<String>,
    ) -> Result<ToolContext, String> {
        Ok(ToolContext::new(worktree, exec_id)
            .map_err(|e| e.to_string())?
            .with_catalog(Arc::new(self.catalog.clone()))
            .with_sandbox_settings(Arc::new(self.sandbox.clone()))
            .with_web_access(self.web_access.clone()))
    }
}
