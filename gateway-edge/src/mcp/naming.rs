//! Exposed capability names: `<server>__<name>`, rewritten so the strictest popular clients
//! accept them (`^[A-Za-z0-9_-]{1,64}$`, and by default at most 51 characters so that Claude
//! Code's own `mcp__coffer__` prefix still fits in 64).
//!
//! Rules, all deterministic: characters outside `[A-Za-z0-9_-]` become `_`; a name longer than
//! the limit keeps its `<server>__` prefix, is cut, and gets `_` + 6 hex characters of the
//! SHA-256 of the original `<server>__<name>`; names that still collide are resolved in sorted
//! order of (server, original name): the first keeps the plain name, each later one gets a hash
//! suffix. Calls resolve through the session's reverse map, never by guessing.
use std::collections::{HashMap, HashSet};

use sha2::{Digest, Sha256};

/// Default longest exposed name (characters): the settings table's default.
pub const DEFAULT_MAX_LEN: usize = coffer_types::settings::MAX_TOOL_NAME_LEN.default as usize;
/// Hard limit from the strictest clients: the settings table's bound.
pub const ABSOLUTE_MAX_LEN: usize = coffer_types::settings::MAX_TOOL_NAME_LEN.max as usize;
/// Separator between the server and the original name.
pub const SEP: &str = "__";

fn sanitize(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect()
}

fn hash6(input: &str, salt: u32) -> String {
    let mut h = Sha256::new();
    h.update(input.as_bytes());
    if salt > 0 {
        h.update(salt.to_le_bytes());
    }
    hex::encode(&h.finalize()[..3])
}

/// `base` cut to fit `max_len` with `_<hash>` appended (the hash is of `full` and `salt`).
fn with_suffix(base: &str, full: &str, max_len: usize, salt: u32) -> String {
    let suffix = format!("_{}", hash6(full, salt));
    let keep = max_len.saturating_sub(suffix.len());
    let mut cut: String = base.chars().take(keep).collect();
    cut.push_str(&suffix);
    cut
}

/// The exposed name of one capability, ignoring collisions.
pub fn expose_one(server: &str, original: &str, max_len: usize) -> String {
    let max_len = max_len.clamp(SEP.len() + 26 + 8, ABSOLUTE_MAX_LEN);
    let full = format!("{server}{SEP}{original}");
    let base = sanitize(&full);
    if base.chars().count() <= max_len && !original.is_empty() { base } else { with_suffix(&base, &full, max_len, 0) }
}

/// Assigns exposed names to `(server, original)` pairs. Returns the names in input order; the
/// result is the same for the same set of pairs whatever their order.
pub fn assign(entries: &[(String, String)], max_len: usize) -> Vec<String> {
    let max_len = max_len.clamp(SEP.len() + 26 + 8, ABSOLUTE_MAX_LEN);
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by(|&a, &b| entries[a].cmp(&entries[b]));
    let mut taken: HashSet<String> = HashSet::with_capacity(entries.len());
    let mut out = vec![String::new(); entries.len()];
    // First pass: every name whose plain form is free keeps it, in sorted order.
    let plain: Vec<String> = entries.iter().map(|(s, o)| expose_one(s, o, max_len)).collect();
    let mut pending = Vec::new();
    for &i in &order {
        if taken.insert(plain[i].clone()) {
            out[i] = plain[i].clone();
        } else {
            pending.push(i);
        }
    }
    // Second pass: collisions get a hash suffix (salted again on the rare second collision).
    for i in pending {
        let (s, o) = &entries[i];
        let full = format!("{s}{SEP}{o}");
        let mut salt = 1;
        loop {
            let candidate = with_suffix(&plain[i], &full, max_len, salt);
            if taken.insert(candidate.clone()) {
                out[i] = candidate;
                break;
            }
            salt += 1;
        }
    }
    out
}

/// Reverse map from exposed name to `(server, original name)`.
#[derive(Debug, Default, Clone)]
pub struct NameMap {
    map: HashMap<String, (String, String)>,
}

impl NameMap {
    pub fn insert(&mut self, exposed: String, server: String, original: String) {
        self.map.insert(exposed, (server, original));
    }
    pub fn get(&self, exposed: &str) -> Option<&(String, String)> {
        self.map.get(exposed)
    }
    pub fn len(&self) -> usize {
        self.map.len()
    }
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// Splits an exposed name at the first `__` into `(server, rest)`.
pub fn split(exposed: &str) -> Option<(&str, &str)> {
    exposed.split_once(SEP).filter(|(s, r)| !s.is_empty() && !r.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid(n: &str, max: usize) -> bool {
        !n.is_empty() && n.len() <= max && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    }

    #[test]
    fn plain_names_pass_through() {
        assert_eq!(expose_one("everything", "echo", 51), "everything__echo");
        assert_eq!(expose_one("git", "git_status", 51), "git__git_status");
    }

    #[test]
    fn odd_characters_and_length_are_rewritten() {
        let n = expose_one("fs", "read file.v2/ü", 51);
        assert_eq!(n, "fs__read_file_v2__");
        let long = "x".repeat(100);
        let n = expose_one("server", &long, 51);
        assert!(valid(&n, 51), "{n}");
        assert!(n.starts_with("server__"));
        assert_eq!(n, expose_one("server", &long, 51), "deterministic");
    }

    #[test]
    fn collisions_resolved_in_sorted_order_independent_of_input_order() {
        let a = vec![
            ("s".to_string(), "a.b".to_string()),
            ("s".to_string(), "a_b".to_string()),
            ("s".to_string(), "a b".to_string()),
        ];
        let mut b = a.clone();
        b.reverse();
        let na = assign(&a, 51);
        let nb = assign(&b, 51);
        let ma: HashMap<_, _> = a.iter().zip(&na).collect();
        let mb: HashMap<_, _> = b.iter().zip(&nb).collect();
        assert_eq!(ma, mb);
        let set: HashSet<_> = na.iter().collect();
        assert_eq!(set.len(), 3, "{na:?}");
        // "a b" sorts first (space < '.' < '_'), so it keeps the plain name.
        assert_eq!(ma[&("s".to_string(), "a b".to_string())], "s__a_b");
        for n in &na {
            assert!(valid(n, 51), "{n}");
        }
    }

    #[test]
    fn many_long_names_stay_unique_and_valid() {
        let entries: Vec<_> =
            (0..500).map(|i| ("srv".to_string(), format!("{}{i}", "very_long_tool_name_".repeat(4)))).collect();
        let names = assign(&entries, 51);
        let set: HashSet<_> = names.iter().collect();
        assert_eq!(set.len(), 500);
        assert!(names.iter().all(|n| valid(n, 51) && n.starts_with("srv__")));
    }

    #[test]
    fn split_at_first_separator() {
        assert_eq!(split("a__b__c"), Some(("a", "b__c")));
        assert_eq!(split("nosep"), None);
        assert_eq!(split("__x"), None);
    }
}
