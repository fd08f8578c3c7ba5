//! The credentials Coffer keeps on a resource's behalf (an LLM connection's `api_key` as
//! `llm-<name>`, a channel's secrets as `channel-<name>-…`): written from a write-once body
//! field, and deleted once nothing references them any more. Shared by `rest::llm` and
//! `rest::channels`, so "nothing references it" means the same everywhere: no channel, no LLM
//! connection and no MCP server's `env` or `headers`.
use std::collections::BTreeSet;

use axum::http::HeaderMap;
use coffer_proto::store::{
    DeleteCredentialRequest, ListConnectionsRequest, ListCredentialsRequest, ListServersRequest, SetCredentialRequest,
};

use crate::error::ApiError;
use crate::rest::servers::{actor, settle};
use crate::state::AppState;

/// The names of every credential that has a value.
pub(crate) async fn credential_names(st: &AppState) -> Result<BTreeSet<String>, ApiError> {
    let items = st.store.credentials.clone().list_credentials(ListCredentialsRequest {}).await?.into_inner().items;
    Ok(items.into_iter().map(|c| c.name).collect())
}

/// Whether a channel, an LLM connection or an MCP server still references credential `name`.
pub(crate) async fn credential_in_use(st: &AppState, name: &str) -> Result<bool, ApiError> {
    if crate::rest::channels::channel_refs(st).await?.contains(name) {
        return Ok(true);
    }
    let connections = st.store.llm.clone().list_connections(ListConnectionsRequest {}).await?.into_inner().connections;
    if connections.iter().any(|c| c.credential_ref == name) {
        return Ok(true);
    }
    let servers = st.store.registry.clone().list_servers(ListServersRequest {}).await?.into_inner().servers;
    Ok(crate::credentials::referenced(servers.iter().flat_map(|s| [&s.env, &s.headers])).contains(name))
}

/// Deletes credential `name` when nothing references it any more (an absent one is fine).
pub(crate) async fn drop_if_unused(st: &AppState, name: &str, headers: &HeaderMap) -> Result<(), ApiError> {
    if credential_in_use(st, name).await? {
        return Ok(());
    }
    let req = DeleteCredentialRequest { name: name.to_owned(), actor: actor(headers) };
    match st.store.credentials.clone().delete_credential(req).await {
        Ok(r) => settle(st, r.into_inner().seq).await,
        Err(e) if e.code() == tonic::Code::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

/// Stores `value` as credential `name` (created or replaced). The request's `Debug` prints no
/// value (coffer-proto).
pub(crate) async fn store_secret(
    st: &AppState,
    name: &str,
    value: String,
    headers: &HeaderMap,
) -> Result<(), ApiError> {
    let req = SetCredentialRequest { name: name.to_owned(), value, actor: actor(headers) };
    let seq = st.store.credentials.clone().set_credential(req).await?.into_inner().seq;
    settle(st, seq).await;
    Ok(())
}
