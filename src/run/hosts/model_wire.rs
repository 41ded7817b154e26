//! A remote loop's model request as it crosses from its host to the head: the loop's name,
//! purpose, system prompt and messages, written once on the host straight into the message's
//! JSON text ([`td_cluster::protocol::RawJson`]) and read once on the head. The tool
//! definitions stay behind: the head calls the model with its own copy of the loop's tools
//! (a host cannot widen them), so sending them cost a serialization on the host and a parse
//! on the head for nothing (the schemas were most of an answer's request).

use serde::{Deserialize, Serialize};
use td_llm::{LlmRequest, Message, Purpose};

/// What the host sends of a request, borrowed from it.
#[derive(Serialize)]
pub struct Outgoing<'a> {
    loop_name: &'a str,
    purpose: &'a Purpose,
    system: &'a str,
    messages: &'a [Message],
}

impl<'a> Outgoing<'a> {
    /// The parts of `request` that cross.
    pub fn of(request: &'a LlmRequest) -> Outgoing<'a> {
        Outgoing {
            loop_name: &request.loop_name,
            purpose: &request.purpose,
            system: &request.system,
            messages: &request.messages,
        }
    }
}

/// The request as the head reads it (an unknown field, such as the tools an older host
/// sends, is skipped).
#[derive(Deserialize)]
pub struct Incoming {
    /// The loop the host says the call is for (the head checks it is the one asking).
    pub loop_name: String,
    /// Iteration turn or query answer.
    pub purpose: Purpose,
    /// System prompt.
    pub system: String,
    /// The conversation so far.
    pub messages: Vec<Message>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use td_cluster::protocol::RawJson;

    #[test]
    fn a_request_crosses_without_its_tools_and_reads_back() {
        let request = LlmRequest {
            loop_name: Arc::from("answerer"),
            purpose: Purpose::Iteration,
            system: "be brief".into(),
            messages: vec![Message::user_text("why?")],
            tools: Vec::new().into(),
        };
        let raw = RawJson::to(&Outgoing::of(&request)).unwrap();
        assert!(!raw.get().contains("tools"));
        let back: Incoming = raw.parse().unwrap();
        assert_eq!(back.loop_name, "answerer");
        assert_eq!(back.system, "be brief");
        assert_eq!(back.messages, request.messages);
        // What an older host sent, tools and all, still reads.
        let old = RawJson::to(&request).unwrap();
        let back: Incoming = old.parse().unwrap();
        assert_eq!(back.messages, request.messages);
    }
}
