//! `/mcp`: MCP Streamable HTTP (2025-11-25).
use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::any;

use crate::state::AppState;

/// The `/mcp` route.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/mcp", any(handle))
}

async fn handle() -> Response {
    super::jsonrpc::http_error(StatusCode::NOT_IMPLEMENTED, super::jsonrpc::METHOD_NOT_FOUND, "not yet")
}
