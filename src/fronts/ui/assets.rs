//! The page, embedded in the binary (no Node toolchain, no files to install): the three
//! files of `assets/ui/`, served with their content types.

use axum::http::header;
use axum::response::IntoResponse;

const INDEX_HTML: &str = include_str!("../../../assets/ui/index.html");
const APP_JS: &str = include_str!("../../../assets/ui/app.js");
const APP_CSS: &str = include_str!("../../../assets/ui/app.css");

/// `GET /`.
pub async fn index() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        INDEX_HTML,
    )
}

/// `GET /app.js`.
pub async fn app_js() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        APP_JS,
    )
}

/// `GET /app.css`.
pub async fn app_css() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], APP_CSS)
}
