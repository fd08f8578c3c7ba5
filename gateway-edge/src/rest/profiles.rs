//! `/v1/mcp/profiles…`: profiles (issue 36 §1; the store's `Profiles`,
//! `proto/store_profiles.proto`) — named views of the vault for a kind of client. CRUD with
//! versions and `If-Match` like the server registry; the bodies are `coffer_api::profiles`
//! types. A spec is checked here in full ([`check_spec`]: globs compile, override names and
//! keys, sizes) before the store sees it; the store checks the name rule and versions.
//!
//! `default` (what a session naming no profile gets) always exists: never written it reads as
//! `{}` at version 0 (everything, full mode); `PUT` writes it, `DELETE` is refused (409
//! `CONFLICT` naming it). Which profile a session uses and what it filters is the MCP side's
//! (`mcp/session`), which reads the profiles from the snapshot ([`crate::snapshot::Snapshot::profiles`]).
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use coffer_api::Page;
use coffer_api::profiles::{self as api, ProfileSpec, Selection};
use coffer_proto::store::{
    DeleteProfileRequest, GetProfileRequest, ListProfilesRequest, PutProfileRequest, StoredProfile,
};
use serde_json::json;

use crate::error::{ApiError, JsonBody};
use crate::rest::servers::{actor, etag, parse_if_match, settle, version_conflict};
use crate::state::AppState;

/// Most globs in one selection list, and most overrides in one profile.
pub const MAX_ENTRIES: usize = 256;
/// Longest glob (bytes).
pub const MAX_GLOB_BYTES: usize = 256;
/// Longest description, replaced description or appended description (bytes): 4 KiB.
pub const MAX_DESCRIPTION_BYTES: usize = 4096;
/// Longest override key (an exposed name, bytes).
pub const MAX_TOOL_KEY_BYTES: usize = 256;
/// Most hidden parameters of one override.
pub const MAX_HIDDEN_PARAMS: usize = 256;

/// Profile routes.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/mcp/profiles", get(list).post(create))
        .route("/v1/mcp/profiles/{name}", get(get_one).put(put).delete(delete))
}

/// A stored profile as REST answers it. A spec the store holds always parsed when written; one
/// that does not (a newer daemon wrote it) reads as the default view, logged.
pub fn profile_view(p: &StoredProfile) -> api::Profile {
    let spec = serde_json::from_str::<ProfileSpec>(&p.spec_json).unwrap_or_else(|e| {
        tracing::warn!(profile = %p.name, error = %e, "A stored profile spec does not parse; reading it as the default view.");
        ProfileSpec::default()
    });
    api::Profile { name: p.name.clone(), spec, version: p.version.max(0) as u64, updated_at: p.updated_at.clone() }
}

/// Every profile the store lists, by name (`default` included), for the snapshot.
pub fn by_name(list: &[StoredProfile]) -> HashMap<String, api::Profile> {
    list.iter().map(|p| (p.name.clone(), profile_view(p))).collect()
}

fn invalid(field: String, message: String) -> ApiError {
    ApiError::invalid(message).with_details(json!({"field": field}))
}

fn shown(s: &str) -> String {
    let cut: String = s.chars().take(60).collect();
    if cut.len() < s.len() { format!("{cut}…") } else { cut }
}

fn check_name(name: &str) -> Result<(), ApiError> {
    api::check_profile_name(name).map_err(|m| invalid("name".into(), m))
}

fn check_description(field: &str, d: &str) -> Result<(), ApiError> {
    if d.len() > MAX_DESCRIPTION_BYTES {
        return Err(invalid(
            field.to_owned(),
            format!("{field} is {} bytes; at most {MAX_DESCRIPTION_BYTES}", d.len()),
        ));
    }
    Ok(())
}

fn check_selection(field: &str, sel: &Selection) -> Result<(), ApiError> {
    for (list, globs) in [("include", &sel.include), ("exclude", &sel.exclude)] {
        if globs.len() > MAX_ENTRIES {
            return Err(invalid(
                format!("{field}.{list}"),
                format!("{field}.{list} has {} globs; at most {MAX_ENTRIES}", globs.len()),
            ));
        }
        for (i, g) in globs.iter().enumerate() {
            let at = format!("{field}.{list}[{i}]");
            if g.is_empty() || g.len() > MAX_GLOB_BYTES {
                return Err(invalid(at.clone(), format!("{at} must be 1 to {MAX_GLOB_BYTES} bytes")));
            }
            if let Err(e) = globset::Glob::new(g) {
                return Err(invalid(at.clone(), format!("{at} {:?} is not a glob: {}", shown(g), e.kind())));
            }
        }
    }
    Ok(())
}

/// Whether `key` looks like an exposed tool name: `<server>__<tool>` with a server name
/// (`coffer_types::check_server_name`, or `coffer` for the built-ins) and a tool name of
/// printable characters without spaces.
fn looks_like_exposed_name(key: &str) -> bool {
    let Some((server, tool)) = key.split_once("__") else { return false };
    let server_ok = server == coffer_types::BUILTIN_SERVER || coffer_types::check_server_name(server).is_ok();
    server_ok
        && !tool.is_empty()
        && key.len() <= MAX_TOOL_KEY_BYTES
        && tool.chars().all(|c| !c.is_control() && !c.is_whitespace())
}

/// Whether `name` is a valid override name: `^[a-zA-Z0-9_-]{1,64}$`.
fn valid_override_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Checks a spec in full; the error names the field (`details.field`, a path like
/// `tools.exclude[2]` or `overrides["git__git_log"].name`).
///
/// # Errors
/// `INVALID_ARGUMENT`: a description over 4 KiB, a selection over [`MAX_ENTRIES`] globs or with a
/// glob that does not compile (globset), more than [`MAX_ENTRIES`] overrides, an override key that
/// is not an exposed name, an override name outside `^[a-zA-Z0-9_-]{1,64}$` or given to two tools
/// (or taking another overridden tool's own name), an empty or repeated hidden parameter.
pub fn check_spec(spec: &ProfileSpec) -> Result<(), ApiError> {
    check_description("description", &spec.description)?;
    check_selection("servers", &spec.servers)?;
    check_selection("tools", &spec.tools)?;
    check_selection("builtins", &spec.builtins)?;
    if spec.overrides.len() > MAX_ENTRIES {
        return Err(invalid(
            "overrides".into(),
            format!("overrides has {} tools; at most {MAX_ENTRIES}", spec.overrides.len()),
        ));
    }
    let mut renamed: BTreeMap<&str, &str> = BTreeMap::new();
    for (key, o) in &spec.overrides {
        let at = format!("overrides[{key:?}]");
        if !looks_like_exposed_name(key) {
            return Err(invalid(
                at.clone(),
                format!(
                    "override key {:?} is not an exposed tool name (<server>__<tool>, as tools/list shows it before overrides)",
                    shown(key)
                ),
            ));
        }
        if let Some(name) = &o.name {
            let f = format!("{at}.name");
            if !valid_override_name(name) {
                return Err(invalid(f, format!("{at}.name {:?} must match ^[a-zA-Z0-9_-]{{1,64}}$", shown(name))));
            }
            // Coffer's own tools keep their names: a rename onto one would be shadowed by it.
            if name.starts_with("coffer__") {
                return Err(invalid(
                    f,
                    format!("{at}.name {name:?} is reserved: names starting with coffer__ are Coffer's own tools"),
                ));
            }
            if let Some(other) = renamed.insert(name, key) {
                return Err(invalid(
                    f,
                    format!("{at}.name {name:?} is also the new name of {other:?}; names must be unique"),
                ));
            }
        }
        check_description(&format!("{at}.description"), o.description.as_deref().unwrap_or_default())?;
        check_description(&format!("{at}.description_append"), o.description_append.as_deref().unwrap_or_default())?;
        if o.hide_params.len() > MAX_HIDDEN_PARAMS {
            return Err(invalid(
                format!("{at}.hide_params"),
                format!("{at}.hide_params has {} entries; at most {MAX_HIDDEN_PARAMS}", o.hide_params.len()),
            ));
        }
        for (i, p) in o.hide_params.iter().enumerate() {
            let f = format!("{at}.hide_params[{i}]");
            if p.trim().is_empty() || p.len() > 256 {
                return Err(invalid(f.clone(), format!("{f} must be a parameter name (1 to 256 bytes, not blank)")));
            }
            if o.hide_params[..i].contains(p) {
                return Err(invalid(f.clone(), format!("{f} {:?} is listed twice", shown(p))));
            }
        }
    }
    // A new name may not be the exposed name of another overridden tool that keeps its own.
    for (name, key) in &renamed {
        if *name != *key && spec.overrides.get(*name).is_some_and(|o| o.name.is_none()) {
            return Err(invalid(
                format!("overrides[{key:?}].name"),
                format!("overrides[{key:?}].name {name:?} is the name of another tool of this profile"),
            ));
        }
    }
    Ok(())
}

/// How long a write waits for the tool lists [`check_required_not_hidden`] reads (the gateway's
/// cached lists answer at once; a server that cannot be listed in time is not checked).
const LIST_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Refuses an override that hides a parameter its tool requires (`inputSchema.required`, as the
/// tool is listed now): such a parameter is never hidden (a client must set it), so the setting
/// would be accepted and silently not applied; and one that hides a parameter the tool does not
/// have (`inputSchema.properties`; a typo hides nothing). Tools not listed now are not checked
/// (their server may be down or not added yet); the listing still skips a required parameter.
///
/// Errors: `INVALID_ARGUMENT` naming `overrides["<tool>"].hide_params[i]`, the parameter and the tool.
async fn check_required_not_hidden(st: &AppState, headers: &HeaderMap, spec: &ProfileSpec) -> Result<(), ApiError> {
    if spec.overrides.values().all(|o| o.hide_params.is_empty()) {
        return Ok(());
    }
    let session = crate::rest::tools::rest_session(st, headers)?;
    let Ok(listed) = tokio::time::timeout(LIST_WAIT, session.list_all(crate::mcp::session::ListKind::Tools)).await
    else {
        return Ok(());
    };
    for (key, o) in &spec.overrides {
        let Some(tool) = listed.iter().find(|l| l.item["name"] == key.as_str()) else { continue };
        let required: Vec<&str> = tool
            .item
            .pointer("/inputSchema/required")
            .and_then(serde_json::Value::as_array)
            .map(|r| r.iter().filter_map(serde_json::Value::as_str).collect())
            .unwrap_or_default();
        if let Some((i, p)) = o.hide_params.iter().enumerate().find(|(_, p)| required.contains(&p.as_str())) {
            let f = format!("overrides[{key:?}].hide_params[{i}]");
            return Err(invalid(
                f.clone(),
                format!(
                    "{f} {:?} is a required parameter of {key}: a client must set it, so it cannot be hidden",
                    shown(p)
                ),
            ));
        }
        // A name the tool does not have hides nothing: most likely a typo of one it has.
        let properties = tool.item.pointer("/inputSchema/properties").and_then(serde_json::Value::as_object);
        if let Some(props) = properties
            && let Some((i, p)) = o.hide_params.iter().enumerate().find(|(_, p)| !props.contains_key(p.as_str()))
        {
            let f = format!("overrides[{key:?}].hide_params[{i}]");
            let mut have: Vec<&str> = props.keys().map(String::as_str).collect();
            have.sort_unstable();
            let have = if have.is_empty() { "none".to_owned() } else { have.join(", ") };
            return Err(invalid(
                f.clone(),
                format!("{f} {:?} is not a parameter of {key} (its parameters: {})", shown(p), shown(&have)),
            ));
        }
    }
    Ok(())
}

/// A single-profile response with its `ETag`.
fn with_etag(status: StatusCode, p: &StoredProfile) -> Response {
    let mut r = (status, Json(profile_view(p))).into_response();
    r.headers_mut().insert(header::ETAG, etag(p.version));
    r
}

async fn fetch(st: &AppState, name: &str) -> Result<StoredProfile, ApiError> {
    Ok(st.store.profiles.clone().get_profile(GetProfileRequest { name: name.to_owned() }).await?.into_inner())
}

/// `GET /v1/mcp/profiles` → `{"items":[profile…],"next_cursor":null}`, sorted by name,
/// `default` included.
async fn list(State(st): State<Arc<AppState>>) -> Result<Json<Page<api::Profile>>, ApiError> {
    let list = st.store.profiles.clone().list_profiles(ListProfilesRequest {}).await?.into_inner().profiles;
    Ok(Json(Page::all(list.iter().map(profile_view).collect())))
}

/// `GET /v1/mcp/profiles/{name}` → the profile with its `ETag`.
///
/// Errors: `NOT_FOUND`.
async fn get_one(State(st): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Response, ApiError> {
    Ok(with_etag(StatusCode::OK, &fetch(&st, &name).await?))
}

/// `POST /v1/mcp/profiles` with [`api::NewProfile`] → 201 with the profile, `ETag` and
/// `Location`.
///
/// Errors: `INVALID_ARGUMENT` (naming the field), `UNKNOWN_FIELD`, `BAD_REQUEST`,
/// `ALREADY_EXISTS` (409: the name is taken, `default` included).
async fn create(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<api::NewProfile>,
) -> Result<Response, ApiError> {
    let (name, spec) = body.split();
    check_name(&name)?;
    check_spec(&spec)?;
    check_required_not_hidden(&st, &headers, &spec).await?;
    let req = PutProfileRequest {
        name: name.clone(),
        spec_json: serde_json::to_string(&spec).expect("a spec serializes"),
        expected_version: None,
        create_only: true,
        actor: actor(&headers),
    };
    let w = st.store.profiles.clone().put_profile(req).await?.into_inner();
    settle(&st, w.seq).await;
    let p = w.profile.unwrap_or_default();
    tracing::info!(profile = %p.name, "Profile created.");
    let mut r = with_etag(StatusCode::CREATED, &p);
    if let Ok(loc) = header::HeaderValue::from_str(&format!("/v1/mcp/profiles/{}", p.name)) {
        r.headers_mut().insert(header::LOCATION, loc);
    }
    Ok(r)
}

/// `PUT /v1/mcp/profiles/{name}` with a whole [`ProfileSpec`] → the profile after the write,
/// with its new `ETag`. With `If-Match: "<version>"` the write happens only at that version
/// (a never-written `default` is at version 0).
///
/// Errors: `NOT_FOUND` (only `default` may be written before it exists), `CONFLICT` (stale
/// `If-Match`; details carry both versions), `INVALID_ARGUMENT`, `UNKNOWN_FIELD`, `BAD_REQUEST`.
async fn put(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    JsonBody(spec): JsonBody<ProfileSpec>,
) -> Result<Response, ApiError> {
    let expected = parse_if_match(&headers)?;
    check_spec(&spec)?;
    check_required_not_hidden(&st, &headers, &spec).await?;
    let mut store = st.store.profiles.clone();
    if let Some(e) = expected {
        // Checked here too only for a helpful answer; the store checks again atomically.
        let cur = fetch(&st, &name).await?;
        if cur.version != e {
            return Err(version_conflict("profile", &name, e, cur.version));
        }
    }
    let req = PutProfileRequest {
        name: name.clone(),
        spec_json: serde_json::to_string(&spec).expect("a spec serializes"),
        expected_version: expected,
        create_only: false,
        actor: actor(&headers),
    };
    let w = store.put_profile(req).await?.into_inner();
    settle(&st, w.seq).await;
    let p = w.profile.unwrap_or_default();
    tracing::info!(profile = %p.name, version = p.version, "Profile written.");
    Ok(with_etag(StatusCode::OK, &p))
}

/// `DELETE /v1/mcp/profiles/{name}` → 204. Honours `If-Match`.
///
/// Errors: `NOT_FOUND`, `CONFLICT` (stale `If-Match`; `default`, which cannot be removed).
async fn delete(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let expected = parse_if_match(&headers)?;
    if let Some(e) = expected {
        let cur = fetch(&st, &name).await?;
        if cur.version != e {
            return Err(version_conflict("profile", &name, e, cur.version));
        }
    }
    let req = DeleteProfileRequest { name: name.clone(), expected_version: expected, actor: actor(&headers) };
    let seq = st.store.profiles.clone().delete_profile(req).await?.into_inner().seq;
    settle(&st, seq).await;
    tracing::info!(profile = %name, "Profile removed.");
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use coffer_api::profiles::ToolOverride;

    fn field(e: ApiError) -> (String, String) {
        let f = e.details["field"].as_str().unwrap_or_default().to_owned();
        (f, e.message)
    }

    fn spec(json: serde_json::Value) -> ProfileSpec {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_good_spec_passes() {
        check_spec(&spec(json!({
            "description": "work",
            "servers": {"include": ["git", "time*"], "exclude": ["t?me-old"]},
            "tools": {"exclude": ["git__git_push", "*__delete_*"]},
            "builtins": {"include": ["coffer__search_*"]},
            "mode": "lazy",
            "overrides": {
                "time__get_current_time": {"name": "now", "description_append": "Use for clocks.", "hide_params": ["timezone"]},
                "coffer__search_tools": {"annotations": {"read_only": true}},
                "git__git_log": {"name": "git__git_log"}
            }
        })))
        .unwrap();
    }

    #[test]
    fn each_bad_part_is_named() {
        let cases: Vec<(serde_json::Value, &str, &str)> = vec![
            (json!({"servers": {"include": ["a[b"]}}), "servers.include[0]", "is not a glob"),
            (json!({"tools": {"exclude": ["ok", ""]}}), "tools.exclude[1]", "must be 1 to 256 bytes"),
            (json!({"builtins": {"include": ["x".repeat(300)]}}), "builtins.include[0]", "must be 1 to 256"),
            (json!({"tools": {"include": vec!["a"; 257]}}), "tools.include", "257 globs; at most 256"),
            (json!({"description": "d".repeat(4097)}), "description", "4097 bytes; at most 4096"),
            (
                json!({"overrides": {"nounderscores": {}}}),
                "overrides[\"nounderscores\"]",
                "is not an exposed tool name",
            ),
            (json!({"overrides": {"Bad__x": {}}}), "overrides[\"Bad__x\"]", "is not an exposed tool name"),
            (json!({"overrides": {"git__a b": {}}}), "overrides[\"git__a b\"]", "not an exposed"),
            (json!({"overrides": {"git__log": {"name": "has space"}}}), "overrides[\"git__log\"].name", "must match"),
            (
                json!({"overrides": {"git__log": {"name": "x".repeat(65)}}}),
                "overrides[\"git__log\"].name",
                "must match",
            ),
            (
                json!({"overrides": {"git__a": {"name": "same"}, "git__b": {"name": "same"}}}),
                "overrides[\"git__b\"].name",
                "is also the new name of \"git__a\"",
            ),
            (
                json!({"overrides": {"git__a": {"name": "git__b"}, "git__b": {"description": "x"}}}),
                "overrides[\"git__a\"].name",
                "name of another tool",
            ),
            (
                json!({"overrides": {"git__show": {"name": "coffer__search_tools"}}}),
                "overrides[\"git__show\"].name",
                "is reserved",
            ),
            (
                json!({"overrides": {"git__a": {"hide_params": ["ok", " "]}}}),
                "overrides[\"git__a\"].hide_params[1]",
                "not blank",
            ),
            (
                json!({"overrides": {"git__a": {"hide_params": ["p", "p"]}}}),
                "overrides[\"git__a\"].hide_params[1]",
                "listed twice",
            ),
            (
                json!({"overrides": {"git__a": {"description": "d".repeat(5000)}}}),
                "overrides[\"git__a\"].description",
                "5000 bytes",
            ),
            (
                json!({"overrides": {"git__a": {"description_append": "d".repeat(5000)}}}),
                "overrides[\"git__a\"].description_append",
                "5000 bytes",
            ),
        ];
        for (body, want_field, says) in cases {
            let (f, m) = field(check_spec(&spec(body.clone())).unwrap_err());
            assert_eq!(f, want_field, "{m}");
            assert!(m.contains(says), "{want_field}: {m}");
        }
        let many: BTreeMap<String, ToolOverride> =
            (0..257).map(|i| (format!("s__t{i}"), ToolOverride::default())).collect();
        let (f, m) = field(check_spec(&ProfileSpec { overrides: many, ..Default::default() }).unwrap_err());
        assert_eq!((f.as_str(), m.as_str()), ("overrides", "overrides has 257 tools; at most 256"));
    }

    #[test]
    fn a_stored_profile_reads_back_as_its_spec() {
        let p = StoredProfile {
            name: "work".into(),
            spec_json: r#"{"mode":"lazy","tools":{"exclude":["git__*"]}}"#.into(),
            version: 2,
            created_at: "t".into(),
            updated_at: "u".into(),
        };
        let v = profile_view(&p);
        assert_eq!((v.version, v.spec.mode, v.spec.tools.exclude.len()), (2, api::ToolMode::Lazy, 1));
        let text = serde_json::to_value(&v).unwrap();
        assert_eq!(text["tools"]["exclude"][0], "git__*");
        assert_eq!(text["name"], "work");
        let broken = profile_view(&StoredProfile { spec_json: "{\"future\":1}".into(), ..p });
        assert_eq!(broken.spec, ProfileSpec::default());
    }
}
