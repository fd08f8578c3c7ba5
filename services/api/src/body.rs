//! The one parser of JSON request bodies: bytes → `T` with errors a client can act on.
//!
//! Malformed JSON is [`BodyErrorKind::Syntax`]. Otherwise the JSON is deserialised into `T`
//! through `serde_path_to_error`, so every error knows the path of the field it is about
//! (`text`, `agent_config.cwd`, `items[0].text`; the root is the body itself):
//!
//! | serde's error | message | `details` |
//! |---|---|---|
//! | unknown field | `unknown field "x"; expected one of a, b` | `{field: path, allowed: [...]}` |
//! | missing field | `field "x" is required` | `{field}` |
//! | wrong type | `field "x" must be a string, not an integer` | `{field, expected, got}` |
//! | bad value | `field "x" must be an integer from 0 to 4294967295 (got -1)` | `{field}` |
//! | a body that is not an object | `the body must be a JSON object, not an array` | `{}` |
//!
//! The type a value got is read from the JSON itself, never quoted: a message never repeats a
//! string the client sent (a credential value, say), only its JSON type and, for numbers, the
//! number.
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// What kind of mistake a body has; the edge maps each to its error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyErrorKind {
    /// Not JSON (or cut short): `BAD_REQUEST`.
    Syntax,
    /// A field the type does not have: `UNKNOWN_FIELD`.
    UnknownField,
    /// Missing, of the wrong type or out of range: `INVALID_ARGUMENT`.
    Invalid,
}

/// A body refused by [`parse`]: kind, message, and `details` (`field` and what is known).
#[derive(Debug, Clone, PartialEq)]
pub struct BodyError {
    pub kind: BodyErrorKind,
    pub message: String,
    pub details: Value,
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for BodyError {}

/// Parses a request body into `T`.
///
/// # Errors
/// [`BodyError`] as the module docs say.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, BodyError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(BodyError {
            kind: BodyErrorKind::Syntax,
            message: "the request body is empty: send a JSON object ({} when every field is optional)".into(),
            details: json!({}),
        });
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let syntax = |e: &dyn std::fmt::Display| BodyError {
        kind: BodyErrorKind::Syntax,
        message: format!("malformed JSON: {e}"),
        details: json!({}),
    };
    let value = match serde_path_to_error::deserialize::<_, Strict>(&mut de) {
        Ok(Strict(value)) => {
            de.end().map_err(|e| syntax(&e))?;
            value
        }
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if let Some(key) = inner.to_string().strip_prefix(TWICE).and_then(|r| r.split(" at line ").next()) {
                // The path is the object's that holds the repeated key ("." for the body).
                let object = if path == "." { String::new() } else { path };
                let message = if object.is_empty() || object == "." {
                    format!("key {key} is given twice")
                } else {
                    format!("field \"{object}\": key {key} is given twice")
                };
                return Err(BodyError {
                    kind: BodyErrorKind::Invalid,
                    message,
                    details: json!({"field": object, "key": serde_json::from_str::<String>(key).unwrap_or_default()}),
                });
            }
            return Err(syntax(&inner));
        }
    };
    from_value(value)
}

/// The start of the message [`Strict`] fails with for a key given twice in one object.
const TWICE: &str = "duplicate key ";

/// A JSON value read like `serde_json::Value`, except that an object with a key given twice is
/// an error (RFC 8259 §4: names SHOULD be unique; serde_json would keep the last silently, so
/// `{"set": {"a": "1", "a": "2"}}` would store "2" without a word).
struct Strict(Value);

impl<'de> serde::Deserialize<'de> for Strict {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> serde::de::Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let Strict(v) = map.next_value()?;
            if out.contains_key(&key) {
                // The key is quoted as JSON; it is the client's own key, never a value.
                return Err(serde::de::Error::custom(format!("{TWICE}{}", Value::String(key))));
            }
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

/// [`parse`] of a body already read as JSON.
///
/// # Errors
/// As [`parse`], without `Syntax`.
pub fn from_value<T: DeserializeOwned>(value: Value) -> Result<T, BodyError> {
    // Every body is an object (serde would also read a struct from an array).
    if !value.is_object() {
        return Err(BodyError {
            kind: BodyErrorKind::Invalid,
            message: format!("the body must be a JSON object, not {}", type_name(&value)),
            details: json!({}),
        });
    }
    match serde_path_to_error::deserialize::<_, T>(&value) {
        Ok(t) => Ok(t),
        Err(e) => {
            let path = e.path().to_string();
            let got = at_segments(&value, e.path());
            Err(describe(got, &path, &e.into_inner().to_string()))
        }
    }
}

/// A JSON type's name as a message says it.
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The value at a `serde_path_to_error` path, segment by segment (so a map key with a dot in
/// it, such as a setting's name, is one key). `None` where the path leaves the value.
fn at_segments<'a>(root: &'a Value, path: &serde_path_to_error::Path) -> Option<&'a Value> {
    use serde_path_to_error::Segment;
    let mut v = root;
    for seg in path.iter() {
        v = match seg {
            Segment::Seq { index } => v.get(*index)?,
            Segment::Map { key } => v.get(key.as_str())?,
            Segment::Enum { variant } => v.get(variant.as_str())?,
            Segment::Unknown => return None,
        };
    }
    Some(v)
}

/// serde's name of what it expected, as a message says it.
fn expected_name(serde: &str) -> String {
    let e = serde.trim();
    let range = |min: i128, max: i128| format!("an integer from {min} to {max}");
    match e {
        "u8" => range(0, u8::MAX.into()),
        "u16" => range(0, u16::MAX.into()),
        "u32" => range(0, u32::MAX.into()),
        "u64" | "usize" => range(0, u64::MAX.into()),
        "i8" | "i16" | "i32" | "i64" | "isize" => "an integer".into(),
        "f32" | "f64" => "a number".into(),
        "a sequence" => "an array".into(),
        "a map" => "an object".into(),
        "a borrowed string" => "a string".into(),
        e if e.starts_with("struct ") || e.starts_with("a map ") => "an object".into(),
        e => e.replace('`', ""),
    }
}

/// The [`BodyError`] for serde's `message` about the field at `path` of `root`.
/// The field names serde lists after an unknown field or variant, in its three phrasings:
/// "expected one of `a`, `b`, `c`", "expected `a` or `b`", "expected `a`" ("there are no
/// fields" gives none).
fn expected_fields(rest: &str) -> Vec<&str> {
    let Some(list) = rest.split_once("expected ").map(|(_, l)| l) else { return Vec::new() };
    let list = list.strip_prefix("one of ").unwrap_or(list);
    list.split(", ").flat_map(|s| s.split(" or ")).map(|s| s.trim_matches('`')).filter(|s| !s.is_empty()).collect()
}

/// `got` is the value at `path` in the body, when the path reaches one.
fn describe(got: Option<&Value>, path: &str, message: &str) -> BodyError {
    let is_root = path == "." || path.is_empty();
    let invalid = |message: String, details: Value| BodyError { kind: BodyErrorKind::Invalid, message, details };
    let joined = |field: &str| if is_root { field.to_owned() } else { format!("{path}.{field}") };
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let name = rest.split('`').next().unwrap_or_default();
        let shown: String = name.chars().take(40).collect();
        // serde_path_to_error's path already ends with the unknown key.
        let field = if path.ends_with(name) && !is_root { path.to_owned() } else { joined(&shown) };
        let allowed = expected_fields(rest);
        let mut message = format!("unknown field {field:?}");
        if !allowed.is_empty() {
            message.push_str(&format!("; expected one of {}", allowed.join(", ")));
        }
        return BodyError {
            kind: BodyErrorKind::UnknownField,
            message,
            details: json!({"field": field, "allowed": allowed}),
        };
    }
    if let Some(rest) = message.strip_prefix("missing field `") {
        let field = joined(rest.split('`').next().unwrap_or_default());
        return invalid(format!("field {field:?} is required"), json!({"field": field}));
    }
    if let Some(rest) = message.strip_prefix("invalid type: ") {
        let expected = expected_name(rest.split(", expected ").nth(1).unwrap_or(""));
        let got = got.map_or("something else", type_name);
        return invalid(
            format!("field {path:?} must be {expected}, not {got}"),
            json!({"field": path, "expected": expected, "got": got.rsplit(' ').next()}),
        );
    }
    if let Some(rest) = message.strip_prefix("invalid value: ") {
        let expected = expected_name(rest.split(", expected ").nth(1).unwrap_or(""));
        // Only numbers are quoted back: a string could be a secret.
        let shown = match got {
            Some(n @ Value::Number(_)) => format!(" (got {n})"),
            _ => String::new(),
        };
        return invalid(format!("field {path:?} must be {expected}{shown}"), json!({"field": path}));
    }
    if let Some(rest) = message.strip_prefix("unknown variant `") {
        let allowed = expected_fields(rest);
        return invalid(
            format!("field {path:?} must be one of {}", allowed.join(", ")),
            json!({"field": path, "allowed": allowed}),
        );
    }
    if is_root {
        return invalid(format!("invalid request body: {message}"), json!({}));
    }
    invalid(format!("invalid request body: field {path:?}: {message}"), json!({"field": path}))
}

/// Deserializes a present field (even `null`) as `Some(..)`, so that `Option<Option<T>>` tells
/// "absent" (`None`, with `#[serde(default)]`) from "null" (`Some(None)`): a patch's "leave it"
/// from its "clear it".
///
/// # Errors
/// As `T`'s deserializer.
pub fn present<'de, D: serde::Deserializer<'de>, T: serde::Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        cwd: Option<String>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Item {
        id: Option<String>,
        text: String,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        text: String,
        limit: Option<u32>,
        inner: Option<Inner>,
        items: Option<Vec<Item>>,
        map: Option<BTreeMap<String, String>>,
    }

    fn err(v: Value) -> BodyError {
        from_value::<Body>(v).unwrap_err()
    }

    #[test]
    fn a_key_given_twice_is_refused_naming_it_and_its_object() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Patch {
            set: std::collections::BTreeMap<String, String>,
        }
        let e = parse::<Patch>(br#"{"set": {"chat.turn_timeout_s": "5", "chat.turn_timeout_s": "9"}}"#).unwrap_err();
        assert_eq!(e.kind, BodyErrorKind::Invalid, "{e:?}");
        assert_eq!(e.message, "field \"set\": key \"chat.turn_timeout_s\" is given twice", "{e:?}");
        assert_eq!(e.details, json!({"field": "set", "key": "chat.turn_timeout_s"}));
        let e = parse::<Patch>(br#"{"set": {}, "set": {}}"#).unwrap_err();
        assert_eq!((e.kind, e.message.as_str()), (BodyErrorKind::Invalid, "key \"set\" is given twice"), "{e:?}");
        // Everything else reads as before: nested, arrays, numbers, trailing garbage.
        let ok = parse::<Value>(br#"{"a": [1, -2, 3.5, {"b": null, "c": true}], "d": {"a": 1}}"#).unwrap();
        assert_eq!(ok, json!({"a": [1, -2, 3.5, {"b": null, "c": true}], "d": {"a": 1}}));
        assert_eq!(parse::<Value>(br#"{"a": 1} x"#).unwrap_err().kind, BodyErrorKind::Syntax);
        assert_eq!(parse::<Value>(br#"{"a": "#).unwrap_err().kind, BodyErrorKind::Syntax);
    }

    #[test]
    fn errors_name_the_field_path() {
        let e = err(json!({"text": 42}));
        assert_eq!(
            (e.kind, e.message.as_str()),
            (BodyErrorKind::Invalid, "field \"text\" must be a string, not an integer")
        );
        assert_eq!(e.details, json!({"field": "text", "expected": "a string", "got": "integer"}));
        let e = err(json!({"text": "a", "inner": {"cwd": 1}}));
        assert_eq!(e.message, "field \"inner.cwd\" must be a string, not an integer");
        let e = err(json!({"text": "a", "inner": "x"}));
        assert_eq!(e.message, "field \"inner\" must be an object, not a string");
        let e = err(json!({"text": "a", "items": [{"text": 1}]}));
        assert_eq!(e.message, "field \"items[0].text\" must be a string, not an integer");
        let e = err(json!({"text": "a", "items": [{"id": "x"}]}));
        assert_eq!(e.message, "field \"items[0].text\" is required");
        assert_eq!(e.details["field"], "items[0].text");
        let e = err(json!({}));
        assert_eq!(e.message, "field \"text\" is required");
        let e = err(json!({"text": "a", "limit": -1}));
        assert_eq!(e.message, "field \"limit\" must be an integer from 0 to 4294967295 (got -1)");
        let e = err(json!({"text": "a", "limit": 1.5}));
        assert_eq!(e.message, "field \"limit\" must be an integer from 0 to 4294967295, not a number");
        let e = err(json!({"text": "a", "map": {"k": 1}}));
        assert_eq!(e.message, "field \"map.k\" must be a string, not an integer");
        // A key with dots in it (a setting's name) is one key, not a path.
        let e = err(json!({"text": "a", "map": {"chat.turn_timeout_s": 5}}));
        assert_eq!(e.message, "field \"map.chat.turn_timeout_s\" must be a string, not an integer");
        assert_eq!(e.details["got"], "integer");
        let e = err(json!({"text": "a", "map": {"a.b": [true]}}));
        assert_eq!(e.details["got"], "array", "{}", e.message);
        let e = err(json!([1]));
        assert_eq!(e.message, "the body must be a JSON object, not an array");
    }

    #[test]
    fn unknown_fields_are_refused_with_their_path() {
        let e = err(json!({"text": "a", "sorce": 1}));
        assert_eq!(e.kind, BodyErrorKind::UnknownField);
        assert_eq!(e.details["field"], "sorce");
        assert!(e.message.starts_with("unknown field \"sorce\"; expected one of text, limit"), "{}", e.message);
        let e = err(json!({"text": "a", "inner": {"session_id": "s"}}));
        assert_eq!(e.details["field"], "inner.session_id", "{}", e.message);
        let e = err(json!({"text": "a", "items": [{"text": "t", "x": 1}]}));
        assert_eq!(e.details["field"], "items[0].x", "{}", e.message);
        // serde's other phrasings of the allowed fields: one field, two fields.
        assert_eq!(e.details["allowed"], json!(["id", "text"]), "{}", e.message);
        let e = err(json!({"text": "a", "inner": {"cmd": "s"}}));
        assert_eq!(e.details["allowed"], json!(["cwd"]), "{}", e.message);
        assert!(e.message.ends_with("; expected one of cwd"), "{}", e.message);
        assert_eq!(expected_fields("x`, there are no fields"), Vec::<&str>::new());
    }

    #[test]
    fn malformed_json_is_a_syntax_error_and_strings_are_never_quoted() {
        assert_eq!(parse::<Body>(b"{\"text\": ").unwrap_err().kind, BodyErrorKind::Syntax);
        for empty in [&b""[..], b" \n"] {
            let e = parse::<Body>(empty).unwrap_err();
            assert_eq!(e.kind, BodyErrorKind::Syntax);
            assert!(e.message.starts_with("the request body is empty"), "{}", e.message);
        }
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Secret {
            n: u8,
        }
        let e = from_value::<Secret>(json!({"n": "sk-secret"})).unwrap_err();
        assert!(!e.message.contains("sk-secret"), "{}", e.message);
    }
}
