//! Web tools: `web_fetch` and `web_search`.

pub mod web_fetch;
pub mod web_search;
