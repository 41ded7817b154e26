//! A client around every model client a run builds that redacts known secrets from what the
//! model and the provider say: the text of each response (a model that echoes a key it was
//! shown elsewhere) and every error message (a provider that quotes the key it was sent).
//! Both go on into the transcript, the events, the summary, progress and the next request, so
//! this is the one place where they are redacted at the source.
//!
//! Tool call inputs are left as the model wrote them: they are what the tools run with. Where
//! they are recorded (receipts, transcripts) their writers redact them.

use std::sync::Arc;

use async_trait::async_trait;

use super::{CallObserver, LlmClient, LlmError, LlmRequest, LlmResponse, NoObserver};
use td_base::secrets::redact_owned;

/// An [`LlmClient`] whose responses and errors carry no registered secret.
pub struct RedactingClient {
    inner: Arc<dyn LlmClient>,
}

impl RedactingClient {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn LlmClient>) -> Self {
        RedactingClient { inner }
    }
}

#[async_trait]
impl LlmClient for RedactingClient {
    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
        self.complete_observed(request, &NoObserver).await
    }

    async fn complete_observed(
        &self,
        request: &LlmRequest,
        observer: &dyn CallObserver,
    ) -> Result<LlmResponse, LlmError> {
        match self.inner.complete_observed(request, observer).await {
            Ok(mut response) => {
                response.text = response.text.map(redact_owned);
                Ok(response)
            }
            Err(error) => Err(redact_error(error)),
        }
    }

    fn resume(&self, loop_name: &str, responses_seen: usize) {
        self.inner.resume(loop_name, responses_seen);
    }
}

/// `error` with every registered secret redacted from its message.
pub fn redact_error(error: LlmError) -> LlmError {
    match error {
        LlmError::Transport(m) => LlmError::Transport(redact_owned(m)),
        LlmError::Api { status, message } => LlmError::Api {
            status,
            message: redact_owned(message),
        },
        LlmError::BadReply(m) => LlmError::BadReply(redact_owned(m)),
        LlmError::Script(m) => LlmError::Script(redact_owned(m)),
        LlmError::OverBudget(m) => LlmError::OverBudget(redact_owned(m)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Purpose, StopReason, Usage};
    use std::sync::Mutex;

    /// Answers each call with the next of its results.
    struct Canned(Mutex<Vec<Result<LlmResponse, LlmError>>>);

    #[async_trait]
    impl LlmClient for Canned {
        async fn complete(&self, _request: &LlmRequest) -> Result<LlmResponse, LlmError> {
            self.0.lock().unwrap().remove(0)
        }
    }

    fn request() -> LlmRequest {
        LlmRequest {
            loop_name: "l".into(),
            purpose: Purpose::Iteration,
            system: String::new(),
            messages: Vec::new(),
            tools: Arc::from(Vec::new()),
        }
    }

    #[tokio::test]
    async fn response_text_and_errors_are_redacted_and_tool_inputs_kept() {
        td_base::secrets::register("TEST_LLM_KEY", "sk-llm-test-l6l6l6");
        let marker = "[REDACTED:TEST_LLM_KEY]";
        let call = crate::ToolCall {
            id: "1".into(),
            name: "write_file".into(),
            input: serde_json::json!({"content": "sk-llm-test-l6l6l6"}).into(),
        };
        let canned = Canned(Mutex::new(vec![
            Ok(LlmResponse {
                text: Some("your key is sk-llm-test-l6l6l6".into()),
                tool_calls: vec![call.clone()],
                stop_reason: StopReason::ToolUse,
                usage: Usage::default(),
            }),
            Err(LlmError::Api {
                status: 401,
                message: "invalid key sk-llm-test-l6l6l6".into(),
            }),
            Err(LlmError::Transport("sk-llm-test-l6l6l6".into())),
        ]));
        let client = RedactingClient::new(Arc::new(canned));
        let response = client.complete(&request()).await.unwrap();
        assert_eq!(response.text.unwrap(), format!("your key is {marker}"));
        assert_eq!(response.tool_calls, vec![call]);
        let error = client.complete(&request()).await.unwrap_err();
        assert_eq!(
            error,
            LlmError::Api {
                status: 401,
                message: format!("invalid key {marker}")
            }
        );
        let error = client.complete(&request()).await.unwrap_err();
        assert_eq!(error, LlmError::Transport(marker.into()));
    }
}
