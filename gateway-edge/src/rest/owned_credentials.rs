//! The credentials Coffer keeps on a resource's behalf (an LLM connection's `api_key` as
//! `llm-<name>`, a channel's secrets as `channel-<name>-…`): written from a write-once body
//! field, and deleted once nothing references them any more. Shared by `rest::llm` and
//! `rest::channels`; "nothing references it" (no channel, no LLM connection and no MCP server's
//! `env` or `headers`) is the store's rule, checked in the transaction that deletes
//! (`DeleteCredentialIfUnused`).
use std::collections::BTreeSet;

use axum::http::HeaderMap;
use coffer_proto::store::{DeleteCredentialRequest, ListCredentialsRequest, SetCredentialRequest};

use crate::error::ApiError;
use crate::rest::servers::{actor, settle};
use crate::state::AppState;

/// The names of every credential that has a value.
pub(crate) async fn credential_names(st: &AppState) -> Result<BTreeSet<String>, ApiError> {
    let items = st.store.credentials.clone().list_credentials(ListCredentialsRequest {}).await?.into_inner().items;
    Ok(items.into_iter().map(|c| c.name).collect())
}

/// Deletes credential `name` when nothing references it any more (an absent one is fine): one
/// store transaction checks and deletes.
pub(crate) async fn drop_if_unused(st: &AppState, name: &str, headers: &HeaderMap) -> Result<(), ApiError> {
    let req = DeleteCredentialRequest { name: name.to_owned(), actor: actor(headers) };
    let r = st.store.credentials.clone().delete_credential_if_unused(req).await?.into_inner();
    if r.deleted {
        settle(st, r.seq).await;
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
    let req = SetCredentialRequest { name: name.to_owned(), value, actor: actor(headers), create_only: false };
    let seq = st.store.credentials.clone().set_credential(req).await?.into_inner().seq;
    settle(st, seq).await;
    Ok(())
}
