//! Web tools: `web_fetch` and `web_search`, and what both use: the HTTP side
//! ([`fetching`], over td-http) and a light HTML scanner ([`html`]). Neither tool file
//! imports from the other.

mod fetching;
mod html;
pub mod web_fetch;
pub mod web_search;
