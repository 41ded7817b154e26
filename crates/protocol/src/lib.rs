//! The types the layers pass each other: tool definitions (what a model is shown), inbox
//! items (what one loop sends another) and run events (what the run record holds). Data
//! only: no tools, actors or providers.

pub mod delivery;
pub mod events;
pub mod inbox;
pub mod spend;
pub mod tool_definition;
