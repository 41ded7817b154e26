//! How a message crosses between nodes: a JSON body, and for a question the port its answer
//! goes back on. Both actors that take messages from another node (the head's
//! [`crate::head`] registry and a host's [`crate::host`] agent) carry a [`WireMsg`] in one
//! variant of their message type and implement `ractor::Message` through
//! [`WireMsg::serialize`] and [`WireMsg::deserialize`].
//!
//! Why JSON and one variant, not `#[derive(RactorClusterMessage)]`: the derived decoders of
//! ractor's `BytesConvertable` unwrap (`String::from_utf8(..).unwrap()`), and a message that
//! does not decode is dropped by ractor without a word, so a question sent with it is never
//! answered and its asker waits for its whole timeout. Here the body is decoded by its
//! receiver, which answers a body it cannot read with an explicit error.
//!
//! Every question has a timeout ([`ask`]): ractor_cluster answers nothing for a question
//! sent to an actor that is gone, and keeps a question on a session that stopped carrying
//! bytes (a cut link) until the session is closed.

use std::time::Duration;

use ractor::message::{BoxedDowncastErr, SerializedMessage};
use ractor::rpc::CallResult;
use ractor::{ActorRef, Message, RpcReplyPort};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The largest frame a node reads from another; a bigger one closes the session. (The
/// library's default is 16 MiB, read before the peer proved the secret.)
pub const MAX_FRAME_BYTES: u64 = 4 * 1024 * 1024;

/// The largest body [`ask`] and [`tell`] send: below [`MAX_FRAME_BYTES`] with room for the
/// frame's own fields, so that one oversized message is refused to its sender instead of
/// closing the whole session (ractor_cluster checks sizes only where it reads).
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024 - 64 * 1024;

/// A message from (or to) another node.
#[derive(Debug)]
pub struct WireMsg {
    /// The JSON of the request.
    pub body: Vec<u8>,
    /// Where the answer goes, when the sender asked (and waits).
    pub reply: Option<RpcReplyPort<Vec<u8>>>,
}

impl WireMsg {
    /// The form ractor_cluster sends (see `ractor::Message::serialize`).
    pub fn serialize(self) -> SerializedMessage {
        match self.reply {
            Some(reply) => SerializedMessage::Call {
                variant: "call".to_string(),
                args: self.body,
                reply,
                metadata: None,
            },
            None => SerializedMessage::Cast {
                variant: "cast".to_string(),
                args: self.body,
                metadata: None,
            },
        }
    }

    /// The message of what ractor_cluster received; never fails on the body (its receiver
    /// reads it, see [`WireMsg::parse`]).
    pub fn deserialize(message: SerializedMessage) -> Result<WireMsg, BoxedDowncastErr> {
        match message {
            SerializedMessage::Cast { args, .. } => Ok(WireMsg {
                body: args,
                reply: None,
            }),
            SerializedMessage::Call { args, reply, .. } => Ok(WireMsg {
                body: args,
                reply: Some(reply),
            }),
            // Answers go to ractor_cluster's own remote-actor shims, never to an actor of ours.
            SerializedMessage::CallReply(..) => Err(BoxedDowncastErr),
        }
    }

    /// The request in the body, or why it cannot be read.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, String> {
        serde_json::from_slice(&self.body).map_err(|e| format!("cannot read the request: {e}"))
    }

    /// Answers the sender, when it asked: `Ok` with a value, or `Err` with a reason it shows.
    /// An asker that stopped waiting is no error.
    pub fn answer<T: Serialize>(self, answer: Result<T, String>) {
        if let Some(port) = self.reply {
            let failed = |why: String| serde_json::to_vec(&Err::<(), _>(why)).unwrap_or_default();
            let bytes = serde_json::to_vec(&answer)
                .unwrap_or_else(|e| failed(format!("cannot write the answer: {e}")));
            // An answer past the frame the other side reads would close the whole session
            // (every loop of the host lost): the asker is told instead.
            let bytes = if bytes.len() > MAX_BODY_BYTES {
                failed(format!(
                    "the answer has {} bytes, over the {MAX_BODY_BYTES} one message carries",
                    bytes.len()
                ))
            } else {
                bytes
            };
            let _ = port.send(bytes);
        }
    }
}

/// The answer port of a request handed on to whoever answers it (`head::HostRequest`,
/// `host::HeadRequest`): answered once (dropping it unanswered answers
/// the host "no answer", so that it never waits out its timeout for nothing).
pub struct Reply(Option<WireMsg>, Option<Box<dyn FnOnce() + Send>>);

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Reply").field(&self.0).finish()
    }
}

impl Reply {
    /// The port of `msg` (which may be a tell: then answers go nowhere).
    pub fn new(msg: WireMsg) -> Reply {
        Reply(Some(msg), None)
    }

    /// The port of `msg`, calling `release` once it is answered (or dropped unanswered):
    /// what the request held is held until then.
    pub fn releasing(msg: WireMsg, release: impl FnOnce() + Send + 'static) -> Reply {
        Reply(Some(msg), Some(Box::new(release)))
    }

    /// Answers `Ok` with a value, or `Err` with a reason the host shows.
    pub fn send<T: Serialize>(mut self, answer: Result<T, String>) {
        if let Some(msg) = self.0.take() {
            msg.answer(answer);
        }
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if let Some(msg) = self.0.take() {
            msg.answer(Err::<(), _>(
                "the request was dropped unanswered (its receiver is ending)".to_string(),
            ));
        }
        if let Some(release) = self.1.take() {
            release();
        }
    }
}

/// Why a question to another node got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AskError {
    /// The request could not be written, or is larger than [`MAX_BODY_BYTES`].
    #[error("the request cannot be sent: {0}")]
    Unsendable(String),
    /// The actor (or the session to its node) is gone.
    #[error("the other side is gone: {0}")]
    Gone(String),
    /// No answer within the timeout.
    #[error("no answer within {} ms", .0.as_millis())]
    Timeout(Duration),
    /// The other side answered with an error.
    #[error("{0}")]
    Refused(String),
    /// The answer could not be read.
    #[error("the answer cannot be read: {0}")]
    BadAnswer(String),
}

/// The body of `request`, within the size the other side reads.
fn body_of<Req: Serialize>(request: &Req) -> Result<Vec<u8>, AskError> {
    let body = serde_json::to_vec(request).map_err(|e| AskError::Unsendable(e.to_string()))?;
    if body.len() > MAX_BODY_BYTES {
        return Err(AskError::Unsendable(format!(
            "{} bytes, over the {MAX_BODY_BYTES} a node reads",
            body.len()
        )));
    }
    Ok(body)
}

/// Asks `to` (an actor of another node, or of this one) `request` and waits at most
/// `timeout` for its answer: an answer, or an explicit [`AskError`], never a hang. When
/// the session to `to`'s node closes while the question waits, the question fails at once
/// (ractor_cluster drops its pending answers with the session).
pub async fn ask<M, Req, Resp>(
    to: &ActorRef<M>,
    wrap: fn(WireMsg) -> M,
    request: &Req,
    timeout: Duration,
) -> Result<Resp, AskError>
where
    M: Message,
    Req: Serialize,
    Resp: DeserializeOwned,
{
    let body = body_of(request)?;
    let result = to
        .call(
            move |port| {
                wrap(WireMsg {
                    body,
                    reply: Some(port),
                })
            },
            Some(timeout),
        )
        .await;
    match result {
        Ok(CallResult::Success(bytes)) => {
            match serde_json::from_slice::<Result<Resp, String>>(&bytes) {
                Ok(Ok(answer)) => Ok(answer),
                Ok(Err(reason)) => Err(AskError::Refused(reason)),
                Err(e) => Err(AskError::BadAnswer(e.to_string())),
            }
        }
        Ok(CallResult::Timeout) => Err(AskError::Timeout(timeout)),
        Ok(CallResult::SenderError) => Err(AskError::Gone(
            "the question was dropped unanswered (its session closed, or the receiver stopped)"
                .to_string(),
        )),
        Err(e) => Err(AskError::Gone(e.to_string())),
    }
}

/// Sends `request` to `to` without waiting for anything. ractor_cluster gives no receipt:
/// a message on a session that is closing is lost without a word, so only what may be lost
/// is told (a farewell); everything else is asked.
pub fn tell<M, Req>(to: &ActorRef<M>, wrap: fn(WireMsg) -> M, request: &Req) -> Result<(), AskError>
where
    M: Message,
    Req: Serialize,
{
    let body = body_of(request)?;
    to.cast(wrap(WireMsg { body, reply: None }))
        .map_err(|e| AskError::Gone(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_and_ports_survive_the_serialized_form() {
        let cast = WireMsg {
            body: b"{}".to_vec(),
            reply: None,
        }
        .serialize();
        let back = WireMsg::deserialize(cast).unwrap();
        assert_eq!(back.body, b"{}");
        assert!(back.reply.is_none());

        let (tx, rx) = tokio::sync::oneshot::channel();
        let call = WireMsg {
            body: b"[1]".to_vec(),
            reply: Some(tx.into()),
        }
        .serialize();
        let back = WireMsg::deserialize(call).unwrap();
        assert_eq!(back.body, b"[1]");
        back.answer(Ok::<u32, String>(7));
        let bytes = rx.blocking_recv().unwrap();
        assert_eq!(
            serde_json::from_slice::<Result<u32, String>>(&bytes).unwrap(),
            Ok(7)
        );
        assert!(WireMsg::deserialize(SerializedMessage::CallReply(1, vec![])).is_err());

        // An answer too big for one frame is an error answer, not a frame that closes the
        // session.
        let (tx, rx) = tokio::sync::oneshot::channel();
        WireMsg {
            body: b"[]".to_vec(),
            reply: Some(tx.into()),
        }
        .answer(Ok::<String, String>("x".repeat(MAX_BODY_BYTES)));
        let bytes = rx.blocking_recv().unwrap();
        let answer = serde_json::from_slice::<Result<String, String>>(&bytes).unwrap();
        assert!(
            answer
                .as_ref()
                .is_err_and(|e| e.contains("over the") && e.contains("one message carries")),
            "{answer:?}"
        );
    }

    #[test]
    fn an_unreadable_body_is_an_error_its_receiver_can_answer() {
        let msg = WireMsg {
            body: b"\xff not json".to_vec(),
            reply: None,
        };
        let err = msg.parse::<u32>().unwrap_err();
        assert!(err.starts_with("cannot read the request"), "{err}");
    }

    #[test]
    fn an_oversized_request_is_refused_to_its_sender() {
        let big = "x".repeat(MAX_BODY_BYTES);
        let err = body_of(&big).unwrap_err();
        assert!(matches!(err, AskError::Unsendable(_)), "{err}");
        assert!(body_of(&"small").is_ok());
    }
}
