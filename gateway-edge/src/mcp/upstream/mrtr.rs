//! The wire format of a 2026-07-28 upstream's multi round-trip requests (MCP 2026-07-28
//! basic/patterns/mrtr): an `InputRequiredResult` to `tools/call`, `prompts/get` or
//! `resources/read` ([`input_required`]), read and checked ([`parse`]), and the retried
//! request's params carrying `inputResponses` and the `requestState` echoed verbatim
//! ([`retry_params`]). The session relays each input request to its client and retries
//! (`session/upstream_input.rs`), at most [`MAX_ROUNDS`] rounds.
use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

/// Most retries of one request with `inputResponses` before the call fails.
pub const MAX_ROUNDS: usize = 8;
/// Most input requests in one `InputRequiredResult`.
pub const MAX_INPUT_REQUESTS: usize = 16;
/// The requests an `InputRequiredResult` may carry (MCP 2026-07-28 basic/patterns/mrtr
/// §Server Requirements).
const INPUT_METHODS: [&str; 3] = ["elicitation/create", "sampling/createMessage", "roots/list"];

/// Whether `result` (the upstream's raw answer to `method`) is an `InputRequiredResult`. Only
/// `tools/call`, `prompts/get` and `resources/read` may be answered so; a cheap substring test
/// first keeps ordinary results from being parsed twice.
pub fn input_required(method: &str, result: &RawValue) -> bool {
    if !matches!(method, "tools/call" | "prompts/get" | "resources/read") || !result.get().contains("input_required") {
        return false;
    }
    #[derive(Deserialize)]
    struct Tag<'a> {
        #[serde(rename = "resultType", borrow)]
        result_type: Option<&'a str>,
    }
    serde_json::from_str::<Tag>(result.get()).is_ok_and(|t| t.result_type == Some("input_required"))
}

/// An `InputRequiredResult`, checked.
pub struct InputRequired {
    /// Key, method, params (raw).
    pub requests: Vec<(String, String, Option<Box<RawValue>>)>,
    pub request_state: Option<Box<RawValue>>,
}

/// Reads an `InputRequiredResult`; the error says what is wrong with it.
pub fn parse(result: &RawValue) -> Result<InputRequired, String> {
    #[derive(Deserialize)]
    struct Wire {
        #[serde(rename = "inputRequests")]
        input_requests: Option<Box<RawValue>>,
        #[serde(rename = "requestState")]
        request_state: Option<Box<RawValue>>,
    }
    #[derive(Deserialize)]
    struct Request {
        method: Value,
        params: Option<Box<RawValue>>,
    }
    let wire: Wire = serde_json::from_str(result.get()).map_err(|e| format!("it is not an object ({e})"))?;
    let mut requests = Vec::new();
    if let Some(raw) = wire.input_requests.filter(|r| r.get() != "null") {
        let map: BTreeMap<String, Box<RawValue>> =
            serde_json::from_str(raw.get()).map_err(|_| "its inputRequests is not an object".to_owned())?;
        if map.len() > MAX_INPUT_REQUESTS {
            return Err(format!("it has {} inputRequests (at most {MAX_INPUT_REQUESTS} are relayed)", map.len()));
        }
        for (key, raw) in map {
            let shown: String = key.chars().take(60).collect();
            let req: Request = serde_json::from_str(raw.get())
                .map_err(|_| format!("inputRequests[{shown:?}] is not a request object with a method"))?;
            let method = match req.method.as_str() {
                Some(m) if INPUT_METHODS.contains(&m) => m.to_owned(),
                _ => {
                    let m: String = req.method.to_string().chars().take(60).collect();
                    return Err(format!(
                        "inputRequests[{shown:?}] asks for {m}, not one of elicitation/create, sampling/createMessage, roots/list"
                    ));
                }
            };
            if req.params.as_ref().is_some_and(|p| !p.get().trim_start().starts_with('{')) {
                return Err(format!("the params of inputRequests[{shown:?}] are not an object"));
            }
            requests.push((key, method, req.params));
        }
    }
    if let Some(state) = &wire.request_state
        && !state.get().starts_with('"')
    {
        return Err("its requestState is not a string".into());
    }
    let request_state = wire.request_state;
    if requests.is_empty() && request_state.is_none() {
        return Err("it has neither inputRequests nor requestState".into());
    }
    Ok(InputRequired { requests, request_state })
}

/// `params` with `inputResponses` (and `requestState`, if any) set, every other member
/// verbatim.
pub fn retry_params(
    params: &RawValue,
    responses: &BTreeMap<String, Box<RawValue>>,
    state: Option<&RawValue>,
) -> Box<RawValue> {
    let mut fields: BTreeMap<String, &RawValue> = serde_json::from_str(params.get()).unwrap_or_default();
    let responses = RawValue::from_string(serde_json::to_string(responses).expect("json")).expect("json");
    fields.insert("inputResponses".into(), &responses);
    fields.remove("requestState");
    if let Some(state) = state {
        fields.insert("requestState".into(), state);
    }
    RawValue::from_string(serde_json::to_string(&fields).expect("json")).expect("json")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    #[test]
    fn only_interactive_requests_answered_input_required_count() {
        let ir = raw(r#"{"resultType":"input_required","requestState":"s"}"#);
        assert!(input_required("tools/call", &ir));
        assert!(input_required("resources/read", &ir));
        assert!(!input_required("tools/list", &ir));
        assert!(!input_required("tools/call", &raw(r#"{"content":[{"type":"text","text":"input_required"}]}"#)));
        assert!(!input_required("tools/call", &raw(r#"{"resultType":"complete"}"#)));
    }

    #[test]
    fn malformed_input_requests_are_named() {
        let cases = [
            (r#"{"resultType":"input_required"}"#, "neither inputRequests nor requestState"),
            (r#"{"resultType":"input_required","inputRequests":[1]}"#, "inputRequests is not an object"),
            (r#"{"resultType":"input_required","inputRequests":{"a":{"method":"tools/call"}}}"#, "not one of"),
            (r#"{"resultType":"input_required","inputRequests":{"a":{"params":{}}}}"#, "with a method"),
            (
                r#"{"resultType":"input_required","inputRequests":{"a":{"method":"roots/list","params":3}}}"#,
                "not an object",
            ),
            (r#"{"resultType":"input_required","requestState":{"x":1}}"#, "requestState is not a string"),
        ];
        for (text, expected) in cases {
            let err = parse(&raw(text)).err().unwrap_or_default();
            assert!(err.contains(expected), "{text}: {err}");
        }
        let many: serde_json::Map<String, Value> =
            (0..=MAX_INPUT_REQUESTS).map(|i| (format!("k{i}"), serde_json::json!({"method": "roots/list"}))).collect();
        let text = serde_json::json!({"resultType": "input_required", "inputRequests": many}).to_string();
        assert!(parse(&raw(&text)).err().unwrap().contains("at most"));
        let ok = parse(&raw(r#"{"resultType":"input_required","inputRequests":{"b":{"method":"roots/list"},"a":{"method":"elicitation/create","params":{"message":"?"}}},"requestState":"st"}"#)).unwrap();
        assert_eq!(ok.requests.len(), 2);
        assert_eq!(ok.request_state.unwrap().get(), "\"st\"");
    }

    #[test]
    fn a_retry_carries_the_answers_and_the_state_verbatim() {
        let responses = BTreeMap::from([("a".to_owned(), raw(r#"{"action":"accept","content":{"name":"Ada"}}"#))]);
        let out = retry_params(
            &raw(r#"{"name":"greet","arguments":{"x": 1},"requestState":"old"}"#),
            &responses,
            Some(&raw("\"s1\"")),
        );
        let v: Value = serde_json::from_str(out.get()).unwrap();
        assert_eq!(v["inputResponses"]["a"]["content"]["name"], "Ada");
        assert_eq!(v["requestState"], "s1");
        assert!(out.get().contains(r#""arguments":{"x": 1}"#));
        let out = retry_params(&raw(r#"{"name":"greet","requestState":"old"}"#), &responses, None);
        assert!(!out.get().contains("requestState"), "no state given: none sent");
    }
}
