//! `/v1/settings`: the store's flat string map of settings, read and patched.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::get;
use axum::{Json, Router};
use coffer_proto::store::{GetSettingsRequest, PatchSettingsRequest};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::{ApiError, JsonBody};
use crate::rest::servers::{actor, settle};
use crate::state::AppState;

/// Longest setting key (bytes), as the store enforces.
const MAX_KEY: usize = 128;

/// Settings routes.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/v1/settings", get(get_settings).patch(patch_settings))
}

/// Body of `PATCH /v1/settings`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettingsPatch {
    /// Keys to set, with their (string) values.
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    /// Keys to remove; removing an absent key is not an error.
    #[serde(default)]
    pub remove: Vec<String>,
}

/// Checks a patch: keys 1-128 bytes, no key both set and removed.
///
/// # Errors
/// `INVALID_ARGUMENT` naming the offending key.
pub fn check_patch(p: &SettingsPatch) -> Result<(), ApiError> {
    for k in p.set.keys().chain(p.remove.iter()) {
        if k.is_empty() || k.len() > MAX_KEY {
            let shown: String = k.chars().take(40).collect();
            return Err(ApiError::invalid(format!("setting key {shown:?} must be 1-{MAX_KEY} bytes"))
                .with_details(json!({"key": shown})));
        }
    }
    let removed: BTreeSet<&String> = p.remove.iter().collect();
    if let Some(k) = p.set.keys().find(|k| removed.contains(k)) {
        return Err(ApiError::invalid(format!("setting {k:?} is both set and removed")).with_details(json!({"key": k})));
    }
    Ok(())
}

async fn values(st: &AppState) -> Result<Json<Value>, ApiError> {
    let values: BTreeMap<String, String> =
        st.store.settings.clone().get_settings(GetSettingsRequest {}).await?.into_inner().values.into_iter().collect();
    Ok(Json(json!({"values": values})))
}

/// `GET /v1/settings` → `{"values":{key: value…}}` (keys sorted).
///
/// Errors: `SERVICE_UNAVAILABLE` while the store restarts.
async fn get_settings(State(st): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    values(&st).await
}

/// `PATCH /v1/settings` with `{"set":{key: "value"…}, "remove":[key…]}` → `{"values":{…}}`
/// after the change is in the gateway's snapshot. An empty patch changes nothing.
///
/// Errors: `INVALID_ARGUMENT` (a key of the wrong length, a key both set and removed, a value
/// that is not a string), `UNKNOWN_FIELD`.
async fn patch_settings(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    JsonBody(p): JsonBody<SettingsPatch>,
) -> Result<Json<Value>, ApiError> {
    check_patch(&p)?;
    if !p.set.is_empty() || !p.remove.is_empty() {
        let keys: Vec<&String> = p.set.keys().chain(p.remove.iter()).collect();
        tracing::info!(keys = ?keys, "Settings patched.");
        let req = PatchSettingsRequest { set: p.set.into_iter().collect(), remove: p.remove, actor: actor(&headers) };
        let seq = st.store.settings.clone().patch_settings(req).await?.into_inner().seq;
        settle(&st, seq).await;
    }
    values(&st).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Code, parse_json};

    fn patch(v: Value) -> Result<SettingsPatch, ApiError> {
        parse_json(v.to_string().as_bytes())
    }

    #[test]
    fn patches() {
        check_patch(&patch(json!({"set": {"a": "1"}, "remove": ["b"]})).unwrap()).unwrap();
        check_patch(&patch(json!({})).unwrap()).unwrap();
        assert!(check_patch(&patch(json!({"set": {"a": "1"}, "remove": ["a"]})).unwrap()).is_err());
        assert!(check_patch(&patch(json!({"set": {"": "1"}})).unwrap()).is_err());
        assert!(check_patch(&patch(json!({"remove": ["k".repeat(129)]})).unwrap()).is_err());
        assert_eq!(patch(json!({"set": {"a": 1}})).unwrap_err().code, Code::InvalidArgument);
        let e = patch(json!({"sett": {}})).unwrap_err();
        assert_eq!(e.code, Code::UnknownField);
        assert_eq!(e.details["field"], "sett");
    }
}
