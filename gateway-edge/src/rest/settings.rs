//! `/v1/settings`: the store's flat string map of settings, read and patched. A patch is checked
//! against the settings table (`coffer_types::settings`) before the store sees it.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::get;
use axum::{Json, Router};
use coffer_api::Page;
pub use coffer_api::settings::SettingsPatch;
use coffer_api::settings::{SettingInfo, SettingsValues};
use coffer_proto::store::{GetSettingsRequest, PatchSettingsRequest};
use coffer_types::settings::{self, SettingError};
use serde_json::json;

use crate::error::{ApiError, JsonBody};
use crate::rest::servers::{actor, settle};
use crate::state::AppState;

/// Longest setting key (bytes), as the store enforces.
const MAX_KEY: usize = settings::MAX_KEY_BYTES;

/// Settings routes.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/v1/settings", get(get_settings).patch(patch_settings)).route("/v1/settings/table", get(table))
}

/// One row of the settings table: `default` is the value that applies while the key is not
/// set, as the string it would be stored as (`""` for empty text); `min`/`max` bound an
/// integer's value or a text's bytes.
pub fn setting_info(s: &settings::Setting) -> SettingInfo {
    let default = match s.ty {
        settings::Type::Integer => s.default.to_string(),
        settings::Type::Text => s.default_text.to_owned(),
    };
    SettingInfo {
        key: s.key.into(),
        group: s.group.word().into(),
        group_title: s.group.title().into(),
        group_help: s.group.help().into(),
        label: s.label.into(),
        ty: s.ty.name().into(),
        default,
        min: s.min,
        max: s.max,
        unit: s.unit.into(),
        description: s.description.into(),
    }
}

/// `GET /v1/settings/table` → `{"items":[{key, group, group_title, group_help, label, type, default, min, max, unit, description}…],
/// "next_cursor":null}`: every setting Coffer reads, in display order (what a form needs to
/// show and check a value before `PATCH /v1/settings`). Touches no other service.
async fn table() -> Json<Page<SettingInfo>> {
    Json(Page::all(settings::SETTINGS.iter().map(setting_info).collect()))
}

/// Checks a patch: keys 1-128 bytes, no key both set and removed, every key set is one of the
/// settings table's (unless `force`) with a value its [`settings::Setting::parse`] accepts.
///
/// # Errors
/// `INVALID_ARGUMENT` naming the offending key; for a key or value the settings table refuses,
/// `details` is `{"key", "problem": "unknown_key" | "not_an_integer" | "out_of_range" | "bad_text" | "bad_url", "value"}`
/// plus `"known"` (every key) for an unknown key, or `"type"`, `"min"` and `"max"` for a value.
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
    for (k, v) in &p.set {
        match settings::check(k, v) {
            Ok(_) => {}
            Err(SettingError::UnknownKey { .. }) if p.force => {}
            Err(e) => return Err(setting_error(&e, v)),
        }
        // A model folder is checked on this machine: a folder without the model's files would
        // only fail later, in the retrieval service's log.
        if k == settings::EMBEDDINGS_MODEL_DIR.key
            && let Err(why) = settings::check_model_dir(v)
        {
            return Err(ApiError::invalid(format!("{k}: {why}"))
                .with_details(json!({"key": k, "problem": "bad_value", "value": v})));
        }
    }
    Ok(())
}

/// The envelope for a key or value the settings table refuses.
fn setting_error(e: &SettingError, value: &str) -> ApiError {
    let mut details = json!({"key": e.key(), "problem": e.problem(), "value": value});
    let message = match e.setting() {
        None => {
            details["known"] = json!(settings::keys().collect::<Vec<_>>());
            format!("{e}; send \"force\": true to store it anyway")
        }
        Some(s) => {
            details["type"] = json!(s.ty.name());
            details["min"] = json!(s.min);
            details["max"] = json!(s.max);
            e.to_string()
        }
    };
    ApiError::invalid(message).with_details(details)
}

async fn values(st: &AppState) -> Result<Json<SettingsValues>, ApiError> {
    let values: BTreeMap<String, String> =
        st.store.settings.clone().get_settings(GetSettingsRequest {}).await?.into_inner().values.into_iter().collect();
    Ok(Json(SettingsValues { values }))
}

/// `GET /v1/settings` → `{"values":{key: value…}}` (keys sorted).
///
/// Errors: `SERVICE_UNAVAILABLE` while the store restarts.
async fn get_settings(State(st): State<Arc<AppState>>) -> Result<Json<SettingsValues>, ApiError> {
    values(&st).await
}

/// `PATCH /v1/settings` with `{"set":{key: "value"…}, "remove":[key…]}` → `{"values":{…}}`
/// after the change is in the gateway's snapshot. An empty patch changes nothing.
///
/// Errors: `INVALID_ARGUMENT` (a key of the wrong length, a key both set and removed, a value
/// that is not a string, a key the settings table does not have without `force`, a value it
/// refuses), `UNKNOWN_FIELD`.
async fn patch_settings(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    JsonBody(p): JsonBody<SettingsPatch>,
) -> Result<Json<SettingsValues>, ApiError> {
    check_patch(&p)?;
    if !p.set.is_empty() || !p.remove.is_empty() {
        let keys: Vec<&String> = p.set.keys().chain(p.remove.iter()).collect();
        tracing::info!(keys = ?keys, "Settings patched.");
        let SettingsPatch { set, remove, .. } = p;
        let req = PatchSettingsRequest { set: set.into_iter().collect(), remove, actor: actor(&headers) };
        let seq = st.store.settings.clone().patch_settings(req).await?.into_inner().seq;
        settle(&st, seq).await;
    }
    values(&st).await
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::error::{Code, parse_json};

    fn patch(v: Value) -> Result<SettingsPatch, ApiError> {
        parse_json(v.to_string().as_bytes())
    }

    #[test]
    fn the_table_lists_every_setting_with_its_default() {
        let rows: Vec<Value> =
            settings::SETTINGS.iter().map(|s| serde_json::to_value(setting_info(s)).unwrap()).collect();
        assert_eq!(rows.len(), settings::SETTINGS.len());
        let call = rows.iter().find(|r| r["key"] == "gateway.call_timeout_ms").expect("call timeout row");
        assert_eq!(call["type"], "integer");
        assert_eq!(call["default"], "60000");
        assert_eq!((&call["min"], &call["max"]), (&json!(1), &json!(86_400_000)));
        let url = rows.iter().find(|r| r["key"] == "retrieval.embeddings.url").expect("embeddings url row");
        assert_eq!((&url["type"], &url["default"]), (&json!("text"), &json!("")));
        // Every default shown is a value the daemon accepts.
        for r in &rows {
            settings::check(r["key"].as_str().unwrap(), r["default"].as_str().unwrap()).unwrap();
        }
    }

    #[test]
    fn patches() {
        check_patch(&patch(json!({"set": {"a": "1"}, "remove": ["b"], "force": true})).unwrap()).unwrap();
        check_patch(&patch(json!({})).unwrap()).unwrap();
        assert!(check_patch(&patch(json!({"set": {"a": "1"}, "remove": ["a"]})).unwrap()).is_err());
        assert!(check_patch(&patch(json!({"set": {"": "1"}})).unwrap()).is_err());
        assert!(check_patch(&patch(json!({"remove": ["k".repeat(129)]})).unwrap()).is_err());
        assert_eq!(patch(json!({"set": {"a": 1}})).unwrap_err().code, Code::InvalidArgument);
        let e = patch(json!({"sett": {}})).unwrap_err();
        assert_eq!(e.code, Code::UnknownField);
        assert_eq!(e.details["field"], "sett");
    }

    #[test]
    fn a_model_folder_without_the_model_files_is_refused_naming_the_missing_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().display().to_string();
        let set = |v: &str| check_patch(&patch(json!({"set": {"retrieval.embeddings.model_dir": v}})).unwrap());
        std::fs::write(dir.path().join("config.json"), "{}").unwrap();
        let e = set(&path).unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        assert_eq!(
            (&e.details["key"], &e.details["problem"]),
            (&json!("retrieval.embeddings.model_dir"), &json!("bad_value"))
        );
        assert!(e.message.contains("has no tokenizer.json"), "{}", e.message);
        std::fs::write(dir.path().join("tokenizer.json"), "{}").unwrap();
        assert!(set(&path).unwrap_err().message.contains("has no model.safetensors"));
        std::fs::write(dir.path().join("model.safetensors"), "x").unwrap();
        set(&path).unwrap();
        // Empty: the default folder. Relative or absent: refused.
        set("").unwrap();
        assert!(set("models/minilm").unwrap_err().message.contains("not an absolute path"));
        assert!(set(&format!("{path}/nowhere")).unwrap_err().message.contains("is not a folder"));
    }

    #[test]
    fn unknown_keys_are_refused_unless_forced() {
        let e = check_patch(&patch(json!({"set": {"gateway.call_timout_ms": "5"}})).unwrap()).unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        assert_eq!(
            (&e.details["key"], &e.details["problem"]),
            (&json!("gateway.call_timout_ms"), &json!("unknown_key"))
        );
        assert!(e.details["known"].as_array().unwrap().contains(&json!("gateway.call_timeout_ms")), "{}", e.details);
        assert!(e.message.contains("force"), "{}", e.message);
        check_patch(&patch(json!({"set": {"my.own.key": "x"}, "force": true})).unwrap()).unwrap();
        // Removing any key is allowed: it is how a forced key goes away.
        check_patch(&patch(json!({"remove": ["my.own.key"]})).unwrap()).unwrap();
    }

    #[test]
    fn values_are_checked_against_the_table_even_when_forced() {
        for (value, problem) in
            [("soon", "not_an_integer"), ("-1", "not_an_integer"), (" 5", "not_an_integer"), ("0", "out_of_range")]
        {
            for force in [false, true] {
                let body = json!({"set": {"gateway.call_timeout_ms": value}, "force": force});
                let e = check_patch(&patch(body).unwrap()).unwrap_err();
                assert_eq!(e.code, Code::InvalidArgument);
                assert_eq!(e.details["key"], "gateway.call_timeout_ms", "{}", e.details);
                assert_eq!(e.details["problem"], problem, "{value}: {}", e.details);
                assert_eq!(e.details["value"], value);
                assert_eq!((&e.details["min"], &e.details["max"]), (&json!(1), &json!(86_400_000)));
                assert!(e.message.contains("gateway.call_timeout_ms"), "{}", e.message);
            }
        }
        let e = check_patch(&patch(json!({"set": {"gateway.max_tool_name_len": "65"}})).unwrap()).unwrap_err();
        assert_eq!(e.message, "gateway.max_tool_name_len must be an integer from 40 to 64 (characters); got \"65\"");
        // Every default is a valid value.
        for s in settings::SETTINGS {
            check_patch(&patch(json!({"set": {s.key: s.default_value()}})).unwrap()).unwrap();
        }
    }
}
