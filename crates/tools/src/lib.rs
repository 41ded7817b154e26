//! The built-in tools, grouped by family (one tool per file), and the tool box that makes
//! tool sets of them by name. What a tool is, and the one path every call takes, live in
//! `td_toolkit`; this crate only adds tools, so editing one rebuilds this crate and the
//! binary, not the runtime below it.

use std::sync::{Arc, OnceLock};

use td_toolkit::registry::{RegistryError, ToolBox, ToolSet};
use td_toolkit::tool::Tool;

pub mod artifacts;
pub mod commands;
pub mod coordination;
pub mod files;
pub mod search;
#[cfg(test)]
pub(crate) mod test_support;
pub mod web;

/// Every built-in tool, in a stable order.
pub fn builtin_tools() -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(files::read_file::ReadFile),
        Arc::new(files::write_file::WriteFile),
        Arc::new(files::edit_file::EditFile),
        Arc::new(files::list_directory::ListDirectory),
        Arc::new(search::glob::Glob),
        Arc::new(search::grep::Grep),
        Arc::new(search::symbols::Symbols),
        Arc::new(commands::run_command::RunCommand),
        Arc::new(commands::run_command_isolated::RunCommandIsolated),
        Arc::new(commands::build::Build),
        Arc::new(commands::test::Test),
        Arc::new(commands::validate::Validate),
        Arc::new(web::web_fetch::WebFetch),
        Arc::new(web::web_search::WebSearch),
        Arc::new(coordination::complete_task::CompleteTask),
        Arc::new(artifacts::create_plan::CreatePlan),
        Arc::new(artifacts::create_spec::CreateSpec),
        Arc::new(artifacts::create_phase::CreatePhase),
        Arc::new(coordination::query_loop::QueryLoop),
        Arc::new(coordination::share_data::ShareData),
        Arc::new(coordination::broadcast_alert::BroadcastAlert),
        Arc::new(coordination::list_loops::ListLoops),
    ]
}

/// The built-in tools with their compiled validators, made once per process.
pub fn builtin() -> &'static ToolBox {
    static BUILTIN: OnceLock<ToolBox> = OnceLock::new();
    BUILTIN.get_or_init(|| ToolBox::new(builtin_tools()))
}

/// The built-in tools named in `names`, in that order; an unknown or repeated name is an
/// error naming the closest valid tool.
pub fn tool_set<S: AsRef<str>>(names: &[S]) -> Result<ToolSet, RegistryError> {
    builtin().set(names)
}

/// Every built-in tool.
pub fn all_tools() -> ToolSet {
    builtin().all().unwrap_or_else(|e| {
        // The built-in schemas are ours and covered by tests; reaching this is a bug.
        panic!("a built-in tool schema does not compile: {e}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_schema_compiles_and_names_are_unique() {
        let set = builtin().all().unwrap();
        assert_eq!(set.names().len(), builtin_tools().len());
    }

    #[test]
    fn builtin_sets_share_compiled_tools_and_suggest_names() {
        let err = tool_set(&["read_file", "grpe"]).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("unknown tool 'grpe' (did you mean 'grep'?); known tools: "),
            "{err}"
        );
        let err = tool_set(&["grep", "grep"]).unwrap_err();
        assert_eq!(err.to_string(), "tool 'grep' is listed twice");
        let a = tool_set(&["grep", "read_file"]).unwrap();
        let b = tool_set(&["grep", "read_file"]).unwrap();
        assert!(Arc::ptr_eq(
            &a.shared_definitions(),
            &b.shared_definitions()
        ));
    }
}
