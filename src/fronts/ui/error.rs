//! The API's errors: a status and `{"error": "what is wrong", "hint": "what to do"}`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// An API error answered as JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What is wrong.
    pub error: String,
    /// What to do.
    pub hint: String,
}

impl ApiError {
    /// An error of `status`.
    pub fn new(status: StatusCode, error: impl Into<String>, hint: impl Into<String>) -> Self {
        ApiError {
            status,
            error: error.into(),
            hint: hint.into(),
        }
    }

    /// 400: the request cannot be served as asked.
    pub fn bad_request(error: impl Into<String>, hint: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, error, hint)
    }

    /// 404: nothing of that name.
    pub fn not_found(error: impl Into<String>, hint: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, error, hint)
    }

    /// 500: the server could not do it.
    pub fn internal(error: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            error,
            "see the message; the dashboard's terminal may say more",
        )
    }

    /// 404 for a loop the run does not have. The name is not repeated (it may be anything).
    pub fn no_such_loop() -> Self {
        Self::not_found(
            "the run has no loop of that name",
            "GET /api/run lists the run's loops",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error": self.error, "hint": self.hint});
        (self.status, Json(body)).into_response()
    }
}
