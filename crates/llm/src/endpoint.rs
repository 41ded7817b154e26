//! What the two network providers share: the settings every model API takes whatever its
//! format ([`EndpointSettings`], with [`ToolChoice`]), and the one way a call goes
//! ([`ApiClient`]): the provider's [`WireFormat`] makes the body, the [`HttpTransport`] posts
//! it (retries, the in-flight limit, each retry reported to the call's observer), and the
//! format reads the reply, whole or, when the client streams ([`ApiClient::with_streaming`],
//! see [`crate::stream`]), rebuilt from the events by the format's assembler. A provider
//! module is its wire format and a constructor.

use std::fmt;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::http::HttpTransport;
use super::stream::{Assembler, StreamSettings, Streaming};
use super::{CallObserver, LlmClient, LlmError, LlmRequest, LlmResponse, NoObserver};

/// Whether the model may, must or must not call a tool: sent as `tool_choice` with every
/// request that offers tools (`llm.tool-choice`).
///
/// Sent even as `auto`, the APIs' documented default, because servers differ:
/// llama-cpp-python's server leaves out the tools of a request that has no `tool_choice`.
/// `omit` sends nothing, for a server that refuses the field.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolChoice {
    /// The model decides (OpenAI `"auto"`, Anthropic `{"type": "auto"}`).
    #[default]
    Auto,
    /// The model must call a tool every turn (OpenAI `"required"`, Anthropic
    /// `{"type": "any"}`): a loop then ends only through `complete_task` or its limits.
    /// Not every server has it: llama-cpp-python's (0.3.36, chatml-function-calling)
    /// answers HTTP 500 with an empty message.
    Required,
    /// The model may not call tools (OpenAI `"none"`, Anthropic `{"type": "none"}`).
    None,
    /// No `tool_choice` is sent: the server's own default applies.
    Omit,
}

/// The settings of a model endpoint that do not depend on its API.
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointSettings {
    /// API root, without the API's own path (a trailing slash is ignored).
    pub base_url: String,
    /// Model name.
    pub model: String,
    /// Sampling temperature; the server's default when `None`.
    pub temperature: Option<f64>,
    /// What `tool_choice` says when tools are sent.
    pub tool_choice: ToolChoice,
}

impl EndpointSettings {
    /// Settings for `model` at `base_url`: the server's temperature, `tool_choice: auto`.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        EndpointSettings {
            base_url: base_url.into(),
            model: model.into(),
            temperature: None,
            tool_choice: ToolChoice::default(),
        }
    }
}

/// What one API's JSON looks like: the parts of a request body it spells its own way, and
/// how a reply is read. The fields every API spells alike (`model`, `temperature`) and the
/// rule for `tool_choice` (sent only with tools) are [`ApiClient`]'s.
pub trait WireFormat: fmt::Debug + Send + Sync {
    /// Adds the conversation, the tools and the output limit of `request` to `body`.
    fn add_request(&self, request: &LlmRequest, body: &mut Map<String, Value>);

    /// Last changes to a body once every key is in it (Anthropic's prompt-cache
    /// breakpoints); none by default.
    fn finish_body(&self, _body: &mut Map<String, Value>) {}

    /// `tool_choice` as this API spells `choice`; `None` sends no `tool_choice`.
    fn tool_choice(choice: ToolChoice) -> Option<Value>;

    /// Reads a successful (2xx) reply.
    fn parse_response(reply: &Value) -> Result<LlmResponse, LlmError>;

    /// Rebuilds a reply from this API's stream events (then read by `parse_response`).
    type Assembler: Assembler;

    /// Adds to a request body what asks this API for a streamed reply.
    fn add_stream_fields(body: &mut Map<String, Value>);
}

/// A client of one model API: its wire format `F` over an HTTP transport.
// Debug is derived: the transport's own Debug leaves out the headers, which hold the key,
// and neither the settings nor a format keep one.
#[derive(Debug)]
pub struct ApiClient<F> {
    transport: HttpTransport,
    endpoint: EndpointSettings,
    /// The provider module sets its format's own options through it.
    pub(crate) format: F,
    streaming: Streaming,
}

impl<F: WireFormat> ApiClient<F> {
    /// A client posting `format`'s bodies for `endpoint` through `transport`.
    pub(crate) fn with_format(
        transport: HttpTransport,
        endpoint: EndpointSettings,
        format: F,
    ) -> Self {
        ApiClient {
            transport,
            endpoint,
            format,
            streaming: Streaming::new(StreamSettings::off()),
        }
    }

    /// The client, streaming as `settings` say (a client made by a provider's `new` does
    /// not stream; `taskdaemon.yml`'s default is `auto`, see [`crate::stream`]).
    pub fn with_streaming(mut self, settings: StreamSettings) -> Self {
        self.streaming = Streaming::new(settings);
        self
    }

    /// The JSON body sent for `request`.
    pub fn request_body(&self, request: &LlmRequest) -> Value {
        let mut body = Map::new();
        body.insert("model".into(), json!(self.endpoint.model));
        self.format.add_request(request, &mut body);
        // OpenAI refuses `tool_choice` without tools; there is nothing to choose from then.
        if !request.tools.is_empty()
            && let Some(choice) = F::tool_choice(self.endpoint.tool_choice)
        {
            body.insert("tool_choice".into(), choice);
        }
        if let Some(t) = self.endpoint.temperature {
            body.insert("temperature".into(), json!(t));
        }
        self.format.finish_body(&mut body);
        Value::Object(body)
    }
}

#[async_trait]
impl<F: WireFormat> LlmClient for ApiClient<F> {
    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
        self.complete_observed(request, &NoObserver).await
    }

    async fn complete_observed(
        &self,
        request: &LlmRequest,
        observer: &dyn CallObserver,
    ) -> Result<LlmResponse, LlmError> {
        self.streaming
            .call::<F>(&self.transport, self.request_body(request), observer)
            .await
    }
}

/// A token count of a reply at the JSON `pointer` (e.g. `/usage/input_tokens`): a count that
/// is missing or not a whole number is 0, so a server that reports no usage costs nothing
/// to read rather than failing the call.
pub(crate) fn token_count(reply: &Value, pointer: &str) -> u64 {
    reply.pointer(pointer).and_then(Value::as_u64).unwrap_or(0)
}
