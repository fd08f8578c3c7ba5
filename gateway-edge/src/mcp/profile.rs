//! A session's profile (issue 36 §1 and §3): which profile a client names, and what that
//! profile makes of the session's lists and calls. The rules are the contract's
//! (`coffer_api::profiles`); this module applies them to one snapshot.
//!
//! - **Choosing** ([`requested`], [`choose`]): a client names a profile by the `Coffer-Profile`
//!   header (the shim's `--profile NAME` / `COFFER_PROFILE`) or the path `/mcp/p/{name}`; naming
//!   none is `default`. A malformed name, or one the snapshot does not hold (`default` always
//!   exists: absent from the store it selects everything), is a [`ProfileError`] at the
//!   session's start. The profile is fixed for the session's life; its *content* is read from
//!   the current snapshot on every list and call, so an edit reaches live sessions (their
//!   lists change, `list_changed` follows like a preference change). A session whose profile
//!   was removed meanwhile sees nothing and is refused everything ([`View::of`]).
//! - **Selecting** ([`View::selects`]): servers by `servers`, upstream tools by `tools` (their
//!   exposed name before any override), Coffer's own tools by `builtins`; prompts and resources
//!   by `servers` only. A profile only narrows: what the vault disables stays disabled (the
//!   policy checks that apart), and an unselected tool is refused exactly like a disabled one.
//! - **Overrides** ([`View::shape`] out, [`View::inbound`] in): `default`'s overrides apply in
//!   every profile and the session's own win field by field ([`merge`]). On the way out a tool
//!   may be renamed (a name valid for strict clients, `^[a-zA-Z0-9_-]+$` and no longer than
//!   the gateway's longest exposed name, `gateway.max_tool_name_len`, that collides with no
//!   other listed name: else skipped, with a warning logged once, and the original name kept), re-described (replaced and/or appended on a new paragraph), have optional
//!   parameters hidden (a required one never: skipped with a warning), and get annotations set.
//!   On the way in a renamed name resolves to the tool's original exposed name (the upstream
//!   gets its own name, as for every call), and a hidden parameter in the arguments is
//!   refused ([`hidden_param_error`]): the upstream applies its own default, never the client's.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use coffer_api::profiles::{DEFAULT_PROFILE, Selection, ToolOverride, check_profile_name};
use coffer_types::BUILTIN_SERVER;
use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use serde_json::{Value, json};

use crate::mcp::answer::RpcError;
use crate::mcp::catalog::{ListKind, Listed};
use crate::mcp::jsonrpc::INVALID_PARAMS;
use crate::snapshot::Snapshot;

/// Longest exposed name a rename may give (the strictest clients' limit).
pub const MAX_RENAME_LEN: usize = 64;

/// Why the profile a client named cannot be used: refused at the session's start (a JSON-RPC
/// error to `initialize`; HTTP 404 on `/mcp`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    /// The name breaks the profile-name rule (the message says which).
    #[error("{0}; `coffer profile list` shows the profiles")]
    Malformed(String),
    /// No profile of that name.
    #[error("Unknown profile {0:?}: `coffer profile list` shows the profiles")]
    Unknown(String),
    /// The path and the header name different profiles.
    #[error(
        "Two profiles named: {path:?} by the path /mcp/p/{path} and {header:?} by the Coffer-Profile header; name one"
    )]
    Conflict { path: String, header: String },
}

impl From<ProfileError> for RpcError {
    fn from(e: ProfileError) -> Self {
        let name = match &e {
            ProfileError::Malformed(_) => None,
            ProfileError::Unknown(n) => Some(n.clone()),
            ProfileError::Conflict { path, .. } => Some(path.clone()),
        };
        let mut err = RpcError::new(INVALID_PARAMS, e.to_string());
        if let Some(n) = name {
            err = err.with_data(json!({"profile": n}));
        }
        err
    }
}

/// The profile a request names: the `/mcp/p/{name}` segment (`path`) and the `Coffer-Profile`
/// header's value (`header`, raw bytes), which must agree when both are sent; `None` when it
/// names none. The name is not checked against the snapshot here ([`choose`] does).
///
/// # Errors
/// [`ProfileError::Malformed`] for a header that is not text or a name breaking the rule;
/// [`ProfileError::Conflict`] when path and header differ.
pub fn requested(path: Option<&str>, header: Option<&[u8]>) -> Result<Option<String>, ProfileError> {
    let header = match header {
        None => None,
        Some(h) => Some(
            std::str::from_utf8(h)
                .map_err(|_| ProfileError::Malformed("the Coffer-Profile header is not UTF-8 text".into()))?
                .trim()
                .to_owned(),
        ),
    };
    let name = match (path, header) {
        (Some(p), Some(h)) if p != h => return Err(ProfileError::Conflict { path: p.to_owned(), header: h }),
        (Some(p), _) => Some(p.to_owned()),
        (None, h) => h,
    };
    if let Some(n) = &name {
        check_profile_name(n).map_err(ProfileError::Malformed)?;
    }
    Ok(name)
}

/// The profile a new session gets: `name` when `snap` holds it (`default` always: absent from
/// the store it selects everything), `default` when the client named none.
///
/// # Errors
/// [`ProfileError::Malformed`] or [`ProfileError::Unknown`].
pub fn choose(snap: &Snapshot, name: Option<&str>) -> Result<Arc<str>, ProfileError> {
    let Some(name) = name else { return Ok(Arc::from(DEFAULT_PROFILE)) };
    check_profile_name(name).map_err(ProfileError::Malformed)?;
    if name == DEFAULT_PROFILE || snap.profiles.contains_key(name) {
        Ok(Arc::from(name))
    } else {
        Err(ProfileError::Unknown(name.to_owned()))
    }
}

/// One compiled [`Selection`]: `include` globs (none: every name) minus `exclude` globs.
#[derive(Debug, Clone)]
struct Matcher {
    include: Option<GlobSet>,
    exclude: Option<GlobSet>,
}

impl Matcher {
    fn of(sel: &Selection) -> Self {
        Self { include: globs(&sel.include), exclude: globs(&sel.exclude) }
    }

    fn matches(&self, name: &str) -> bool {
        self.include.as_ref().is_none_or(|g| g.is_match(name))
            && !self.exclude.as_ref().is_some_and(|g| g.is_match(name))
    }
}

/// The contract's globs (`*` any run, `?` one character, whole name, case-sensitive) as one
/// set; every other character is literal. `None` for an empty list. A pattern globset cannot
/// take (none should remain once escaped) matches nothing, with a warning logged once.
fn globs(patterns: &[String]) -> Option<GlobSet> {
    if patterns.is_empty() {
        return None;
    }
    let mut b = GlobSetBuilder::new();
    for p in patterns {
        let escaped: String = p
            .chars()
            .flat_map(|c| {
                let special = matches!(c, '[' | ']' | '{' | '}' | '\\' | '!');
                special.then_some('\\').into_iter().chain(std::iter::once(c))
            })
            .collect();
        match GlobBuilder::new(&escaped).literal_separator(false).backslash_escape(true).build() {
            Ok(g) => {
                b.add(g);
            }
            Err(e) => warn_once(
                &format!("glob {p:?}"),
                &format!("A profile's glob {p:?} is not usable ({e}); it matches nothing."),
            ),
        }
    }
    b.build().ok()
}

/// What one profile selects.
#[derive(Debug, Clone)]
struct Selects {
    servers: Matcher,
    tools: Matcher,
    builtins: Matcher,
}

/// A session's profile over one snapshot: what it selects and how its tools are shown.
#[derive(Debug, Clone)]
pub struct View {
    /// The profile's name.
    pub name: Arc<str>,
    /// `None`: every name (the `default` profile absent from the store).
    selects: Option<Selects>,
    /// The profile was removed after the session started: nothing is selected.
    removed: bool,
    /// `default`'s overrides with the profile's own merged over them, by original exposed name.
    overrides: BTreeMap<String, ToolOverride>,
    /// Valid rename targets → original exposed name (the first in key order wins a target two
    /// overrides name; the other is skipped with a warning).
    renames: HashMap<String, String>,
}

impl View {
    /// Profile `name`'s view of `snap` (see the module docs for a removed profile); renames
    /// longer than `max_len` characters (the gateway's longest exposed name, so that a client's
    /// own prefix still fits) are skipped like invalid ones.
    pub fn of(snap: &Snapshot, name: &Arc<str>, max_len: usize) -> Self {
        let own = snap.profiles.get(&**name);
        let default_overrides = snap.profiles.get(DEFAULT_PROFILE).map(|p| &p.spec.overrides);
        let removed = own.is_none() && &**name != DEFAULT_PROFILE;
        let selects = own.map(|p| Selects {
            servers: Matcher::of(&p.spec.servers),
            tools: Matcher::of(&p.spec.tools),
            builtins: Matcher::of(&p.spec.builtins),
        });
        let overrides = if removed {
            BTreeMap::new()
        } else {
            merge(default_overrides, own.map(|p| &p.spec.overrides).filter(|_| &**name != DEFAULT_PROFILE))
        };
        let mut renames = HashMap::new();
        for (original, o) in &overrides {
            let Some(new) = &o.name else { continue };
            if !valid_name(new) || new.len() > max_len {
                warn_once(
                    &format!("{name}/{original}/name"),
                    &format!(
                        "Profile {name}: the rename of {original} to {new:?} is not a valid tool name (^[a-zA-Z0-9_-]{{1,{max_len}}}$); the original name is kept."
                    ),
                );
                continue;
            }
            if new == original {
                continue;
            }
            if let Some(first) = renames.get(new) {
                warn_once(
                    &format!("{name}/{original}/name"),
                    &format!(
                        "Profile {name}: {original} and {first} are both renamed {new:?}; {original} keeps its name."
                    ),
                );
                continue;
            }
            renames.insert(new.clone(), original.clone());
        }
        Self { name: name.clone(), selects, removed, overrides, renames }
    }

    /// Whether the profile was removed after the session started.
    pub fn removed(&self) -> bool {
        self.removed
    }

    /// Whether the profile selects item `exposed` (its exposed name before any override) of
    /// `server` in a list of `kind`.
    pub fn selects(&self, kind: ListKind, server: &str, exposed: &str) -> bool {
        if self.removed {
            return false;
        }
        let Some(s) = &self.selects else { return true };
        if server == BUILTIN_SERVER {
            return s.builtins.matches(exposed);
        }
        s.servers.matches(server) && (kind != ListKind::Tools || s.tools.matches(exposed))
    }

    /// Whether a resource or completion of `server` may be reached (the `servers` selection).
    pub fn selects_server(&self, server: &str) -> bool {
        !self.removed && self.selects.as_ref().is_none_or(|s| server == BUILTIN_SERVER || s.servers.matches(server))
    }

    /// A list of `kind` as this profile shows it: unselected items left out; for tools, the
    /// overrides applied. Returns the items and, for tools, the parameters each shown tool
    /// hides (by original exposed name; see [`hidden_param_error`]).
    pub fn shape(&self, kind: ListKind, items: Vec<Listed>) -> (Vec<Listed>, HashMap<String, Vec<String>>) {
        let mut items: Vec<Listed> = items
            .into_iter()
            .filter(|l| {
                self.selects(kind, &l.server, l.item.get(kind.ident()).and_then(Value::as_str).unwrap_or_default())
            })
            .collect();
        let mut hidden = HashMap::new();
        if kind != ListKind::Tools || self.overrides.is_empty() {
            return (items, hidden);
        }
        let taken: HashSet<String> =
            items.iter().filter_map(|l| l.item.get("name").and_then(Value::as_str).map(str::to_owned)).collect();
        for l in &mut items {
            let Some(exposed) = l.item.get("name").and_then(Value::as_str).map(str::to_owned) else { continue };
            let Some(o) = self.overrides.get(&exposed) else { continue };
            if let Some(new) = &o.name
                && self.renames.get(new) == Some(&exposed)
            {
                if taken.contains(new) {
                    warn_once(
                        &format!("{}/{exposed}/name", self.name),
                        &format!(
                            "Profile {}: renaming {exposed} to {new:?} collides with a listed tool; {exposed} keeps its name.",
                            self.name
                        ),
                    );
                } else {
                    l.item["name"] = Value::String(new.clone());
                }
            }
            let desc =
                o.description.clone().or_else(|| l.item.get("description").and_then(Value::as_str).map(str::to_owned));
            let desc = match (&desc, &o.description_append) {
                (Some(d), Some(a)) if !d.is_empty() => Some(format!("{d}\n\n{a}")),
                (_, Some(a)) => Some(a.clone()),
                (d, None) => d.clone(),
            };
            if let Some(d) = desc {
                l.item["description"] = Value::String(d);
            }
            // Every tool the override names parameters of has an entry, empty when each is
            // required: a call then knows nothing is hidden, not that the tool was not listed.
            if !o.hide_params.is_empty() {
                hidden.insert(exposed.clone(), hide_params(&self.name, &exposed, &mut l.item, &o.hide_params));
            }
            if let Some(a) = &o.annotations {
                if !l.item.get("annotations").is_some_and(Value::is_object) {
                    l.item["annotations"] = json!({});
                }
                for (key, v) in [
                    ("readOnlyHint", a.read_only),
                    ("destructiveHint", a.destructive),
                    ("idempotentHint", a.idempotent),
                    ("openWorldHint", a.open_world),
                ] {
                    if let Some(v) = v {
                        l.item["annotations"][key] = Value::Bool(v);
                    }
                }
            }
        }
        (items, hidden)
    }

    /// The original exposed name a client's tool name stands for: a rename target of this
    /// profile that no selected tool holds as its own name (`holder`: the `(server, original
    /// exposed)` owning `exposed` as a real name, when the session knows one) resolves to the
    /// renamed tool; any other name is itself.
    pub fn inbound<'a>(&'a self, exposed: &'a str, holder: Option<&str>) -> &'a str {
        match self.renames.get(exposed) {
            Some(original) if !holder.is_some_and(|server| self.selects(ListKind::Tools, server, exposed)) => original,
            _ => exposed,
        }
    }

    /// The parameters the profile hides of tool `exposed` (original exposed name), as listed
    /// (required ones never); used when the session has not listed the tool yet.
    pub fn hide_params(&self, exposed: &str) -> &[String] {
        self.overrides.get(exposed).map(|o| o.hide_params.as_slice()).unwrap_or_default()
    }
}

/// `default`'s overrides with `own` merged over them field by field (a field `own` sets wins;
/// `hide_params` when non-empty; annotations flag by flag).
pub fn merge(
    default: Option<&BTreeMap<String, ToolOverride>>,
    own: Option<&BTreeMap<String, ToolOverride>>,
) -> BTreeMap<String, ToolOverride> {
    let mut out = default.cloned().unwrap_or_default();
    for (tool, o) in own.into_iter().flatten() {
        let d = out.remove(tool).unwrap_or_default();
        let annotations = match (d.annotations, &o.annotations) {
            (Some(d), Some(o)) => Some(coffer_api::profiles::Annotations {
                read_only: o.read_only.or(d.read_only),
                destructive: o.destructive.or(d.destructive),
                idempotent: o.idempotent.or(d.idempotent),
                open_world: o.open_world.or(d.open_world),
            }),
            (d, o) => o.clone().or(d),
        };
        out.insert(
            tool.clone(),
            ToolOverride {
                name: o.name.clone().or(d.name),
                description: o.description.clone().or(d.description),
                description_append: o.description_append.clone().or(d.description_append),
                hide_params: if o.hide_params.is_empty() { d.hide_params } else { o.hide_params.clone() },
                annotations,
            },
        );
    }
    out
}

/// Removes `params` from `tool`'s `inputSchema.properties` (never a required one: skipped with
/// a warning); returns the ones hidden.
fn hide_params(profile: &str, exposed: &str, tool: &mut Value, params: &[String]) -> Vec<String> {
    if params.is_empty() {
        return Vec::new();
    }
    let required: HashSet<String> = tool
        .pointer("/inputSchema/required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default();
    let mut hidden = Vec::new();
    for p in params {
        if required.contains(p) {
            warn_once(
                &format!("{profile}/{exposed}/hide/{p}"),
                &format!("Profile {profile}: {exposed}'s parameter {p:?} is required and cannot be hidden; it stays."),
            );
            continue;
        }
        if let Some(props) = tool.pointer_mut("/inputSchema/properties").and_then(Value::as_object_mut) {
            props.remove(p);
        }
        hidden.push(p.clone());
    }
    hidden
}

/// The error for a call whose `arguments` (raw JSON object text) hold a parameter `hidden`
/// lists: -32602 naming the parameter, the tool (as the client named it) and the profile.
/// `None` when no hidden parameter is sent.
pub fn hidden_param_error(profile: &str, tool: &str, hidden: &[String], arguments: Option<&str>) -> Option<RpcError> {
    if hidden.is_empty() {
        return None;
    }
    let args: serde_json::Map<String, Value> = serde_json::from_str(arguments?).ok()?;
    let sent = hidden.iter().find(|p| args.contains_key(p.as_str()))?;
    Some(
        RpcError::new(
            INVALID_PARAMS,
            format!("Invalid params: {tool} has no parameter {sent:?} for this client (profile {profile} hides it)"),
        )
        .with_data(json!({"tool": tool, "param": sent, "profile": profile})),
    )
}

/// Whether `name` is a tool name every strict client takes: `^[a-zA-Z0-9_-]{1,64}$`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_RENAME_LEN
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Logs `message` as a warning the first time `key` is seen in this process.
fn warn_once(key: &str, message: &str) {
    static SEEN: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    let first = SEEN.get_or_init(Mutex::default).lock().expect("warned").insert(key.to_owned());
    if first {
        tracing::warn!("{message}");
    }
}

#[cfg(test)]
mod tests {
    use coffer_api::profiles::{Annotations, Profile, ProfileSpec};

    use super::*;

    fn profile(name: &str, spec: ProfileSpec) -> (String, Profile) {
        (name.to_owned(), Profile { name: name.into(), spec, version: 1, updated_at: "2026-12-07T00:00:00Z".into() })
    }

    fn sel(include: &[&str], exclude: &[&str]) -> Selection {
        Selection {
            include: include.iter().map(|s| (*s).to_owned()).collect(),
            exclude: exclude.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    fn tool(server: &str, name: &str, schema: Value) -> Listed {
        Listed {
            item: json!({"name": format!("{server}__{name}"), "description": "Up.", "inputSchema": schema}),
            server: server.into(),
            original: name.into(),
            enabled: true,
        }
    }

    fn names(items: &[Listed]) -> Vec<&str> {
        items.iter().map(|l| l.item["name"].as_str().unwrap()).collect()
    }

    #[test]
    fn a_profile_is_named_by_path_or_header_and_must_exist() {
        assert_eq!(requested(None, None), Ok(None));
        assert_eq!(requested(Some("work"), Some(b"work")), Ok(Some("work".into())));
        assert_eq!(requested(None, Some(b" work ")), Ok(Some("work".into())));
        assert!(matches!(requested(Some("a"), Some(b"b")), Err(ProfileError::Conflict { .. })));
        let bad = requested(None, Some(b"Work")).unwrap_err();
        assert!(bad.to_string().contains("coffer profile list"), "{bad}");
        let mut snap = Snapshot::default();
        assert_eq!(&*choose(&snap, None).unwrap(), "default");
        assert_eq!(&*choose(&snap, Some("default")).unwrap(), "default", "default exists even when not stored");
        let e = choose(&snap, Some("work")).unwrap_err();
        assert_eq!(e.to_string(), "Unknown profile \"work\": `coffer profile list` shows the profiles");
        let rpc = RpcError::from(e);
        assert_eq!((rpc.code, rpc.data), (INVALID_PARAMS, Some(json!({"profile": "work"}))));
        snap.profiles.extend([profile("work", ProfileSpec::default())]);
        assert_eq!(&*choose(&snap, Some("work")).unwrap(), "work");
    }

    #[test]
    fn selections_narrow_by_server_tool_and_builtin_globs() {
        let spec = ProfileSpec {
            servers: sel(&["fs", "t*"], &[]),
            tools: sel(&[], &["fs__write_*", "time__convert_tim?"]),
            builtins: sel(&["coffer__search_*"], &[]),
            ..Default::default()
        };
        let snap = Snapshot { profiles: [profile("work", spec)].into(), ..Default::default() };
        let v = View::of(&snap, &Arc::from("work"), 51);
        assert!(v.selects(ListKind::Tools, "fs", "fs__read_file"));
        assert!(!v.selects(ListKind::Tools, "fs", "fs__write_file"));
        assert!(!v.selects(ListKind::Tools, "git", "git__git_log"), "server not selected");
        assert!(!v.selects(ListKind::Tools, "time", "time__convert_time"));
        assert!(v.selects(ListKind::Tools, "time", "time__convert_times"), "? is one character, whole name");
        assert!(v.selects(ListKind::Tools, BUILTIN_SERVER, "coffer__search_tools"));
        assert!(!v.selects(ListKind::Tools, BUILTIN_SERVER, "coffer__memory_save"));
        assert!(v.selects(ListKind::Prompts, "fs", "fs__write_prompt"), "prompts follow servers only");
        assert!(!v.selects(ListKind::Prompts, "git", "git__p"));
        assert!(!v.selects_server("git") && v.selects_server("fs"));
        assert!(!Matcher::of(&sel(&["FS"], &[])).matches("fs"), "case-sensitive");
        assert!(Matcher::of(&sel(&["a[1]"], &[])).matches("a[1]"), "brackets are literal");
        let default = View::of(&Snapshot::default(), &Arc::from("default"), 51);
        assert!(default.selects(ListKind::Tools, "git", "git__git_log"));
        let gone = View::of(&Snapshot::default(), &Arc::from("work"), 51);
        assert!(gone.removed() && !gone.selects(ListKind::Tools, "fs", "fs__read_file"));
    }

    #[test]
    fn overrides_rename_describe_hide_and_annotate_with_default_under_the_profile() {
        let schema = json!({"type": "object", "properties": {"path": {}, "depth": {}}, "required": ["path"]});
        let mut default = ProfileSpec::default();
        default.overrides.insert(
            "fs__tree".into(),
            ToolOverride {
                name: Some("tree".into()),
                description: Some("Default words.".into()),
                annotations: Some(Annotations {
                    read_only: Some(true),
                    destructive: Some(false),
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        let mut work = ProfileSpec::default();
        work.overrides.insert(
            "fs__tree".into(),
            ToolOverride {
                description_append: Some("Use for folders.".into()),
                hide_params: vec!["depth".into(), "path".into()],
                annotations: Some(Annotations { destructive: Some(true), ..Default::default() }),
                ..Default::default()
            },
        );
        work.overrides.insert("fs__read".into(), ToolOverride { name: Some("fs__other".into()), ..Default::default() });
        work.overrides
            .insert("fs__other".into(), ToolOverride { name: Some("bad name!".into()), ..Default::default() });
        work.overrides.insert("fs__long".into(), ToolOverride { name: Some("x".repeat(52)), ..Default::default() });
        let snap =
            Snapshot { profiles: [profile("default", default), profile("work", work)].into(), ..Default::default() };
        let v = View::of(&snap, &Arc::from("work"), 51);
        let items = vec![
            tool("fs", "tree", schema.clone()),
            tool("fs", "read", json!({})),
            tool("fs", "other", json!({})),
            tool("fs", "long", json!({})),
        ];
        let (shown, hidden) = v.shape(ListKind::Tools, items);
        assert_eq!(
            names(&shown),
            ["tree", "fs__read", "fs__other", "fs__long"],
            "a colliding, an invalid and a too long rename keep the name"
        );
        let t = &shown[0].item;
        assert_eq!(t["description"], "Default words.\n\nUse for folders.");
        assert_eq!(t["inputSchema"]["properties"], json!({"path": {}}), "a required parameter is never hidden");
        assert_eq!(t["annotations"], json!({"readOnlyHint": true, "destructiveHint": true}));
        assert_eq!(hidden["fs__tree"], ["depth"]);
        assert_eq!(shown[0].original, "tree", "the upstream's name stays with the item");
        // On the way in.
        assert_eq!(v.inbound("tree", None), "fs__tree");
        assert_eq!(v.inbound("fs__other", Some("fs")), "fs__other", "a real selected tool keeps its name");
        assert_eq!(v.inbound("fs__read", Some("fs")), "fs__read");
        let e = hidden_param_error("work", "tree", &hidden["fs__tree"], Some(r#"{"path":"/","depth":2}"#)).unwrap();
        assert_eq!(e.code, INVALID_PARAMS);
        assert!(e.message.contains("\"depth\"") && e.message.contains("profile work"), "{}", e.message);
        assert!(hidden_param_error("work", "tree", &hidden["fs__tree"], Some(r#"{"path":"/"}"#)).is_none());
        // The default profile itself: only default's overrides.
        let d = View::of(&snap, &Arc::from("default"), 51);
        let (shown, _) = d.shape(ListKind::Tools, vec![tool("fs", "tree", schema)]);
        assert_eq!(shown[0].item["description"], "Default words.");
        assert_eq!(shown[0].item["name"], "tree");
    }
}
