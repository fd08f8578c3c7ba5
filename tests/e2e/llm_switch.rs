//! Provider switching for managed agents (ADR-032), with the real Claude Code and Codex CLIs
//! from `tests/peers/` on the fake model APIs over real HTTP: the adapters' turns started with an
//! `AgentEnv` whose binding is a connection's (as `Registry::turn_env` resolves it) send the CLI's
//! model traffic to the connection's base URL with its model and key, a conversation's own
//! `agent_config.model` still wins, unbound turns go back to the user's own configuration, and
//! the key is in no file under `COFFER_HOME`, the agent's cwd or the daemon's logs.
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use coffer_chat::adapter::{AgentConfig, AgentEnv, AgentEvent, AgentProvider, TurnInput};
use coffer_chat::binding::{Binding, Wire};
use coffer_chat::claude_code::ClaudeCode;
use coffer_chat::codex::Codex;
use coffer_tests::anthropic::FakeAnthropic;
use coffer_tests::openai::FakeOpenAi;
use coffer_tests::{TestHome, bin};
use secrecy::SecretString;
use tokio::sync::mpsc;

const TURN_TIMEOUT: Duration = Duration::from_secs(90);
/// The bound connection's key: it must reach the fake's credential header and nothing on disk.
const KEY: &str = "sk-bound-connection-key-0123456789";

struct Bench {
    home: TestHome,
    env: AgentEnv,
    cwd: PathBuf,
}

impl Bench {
    /// A home with a running daemon (the agent's attached shim finds it) and `command` as the CLI.
    async fn new(command: PathBuf) -> anyhow::Result<Self> {
        let home = TestHome::new()?;
        home.start_daemon().await?;
        let cwd = home.temp().join("workspace");
        std::fs::create_dir_all(&cwd)?;
        let env = AgentEnv {
            coffer_home: home.root().to_path_buf(),
            agents_dir: home.root().join("agents"),
            shim: bin("coffer-mcp-shim")?,
            command_override: Some(command),
            binding: None,
            sandbox: true,
        };
        Ok(Self { home, env, cwd })
    }

    fn user_home(&self) -> PathBuf {
        PathBuf::from(&self.home.env()["HOME"])
    }

    fn config(&self, session_id: &str, model: &str) -> AgentConfig {
        AgentConfig {
            cwd: self.cwd.display().to_string(),
            model: model.into(),
            session_id: session_id.into(),
            ..Default::default()
        }
    }

    /// Runs one turn of `provider` under `binding` to its terminal event; all its events.
    async fn turn(
        &self,
        provider: &dyn AgentProvider,
        binding: Option<&Binding>,
        text: &str,
        config: AgentConfig,
    ) -> anyhow::Result<Vec<AgentEvent>> {
        let env = AgentEnv { binding: binding.cloned(), ..self.env.clone() };
        let input = TurnInput {
            conversation_id: "01JCONV".into(),
            turn_id: "01JTURN".into(),
            text: text.into(),
            config,
            attachments: Vec::new(),
        };
        let (tx, mut rx) = mpsc::channel(1024);
        let running = provider.start_turn(&env, input, tx).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let mut events = Vec::new();
        let deadline = Instant::now() + TURN_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(Some(event)) = tokio::time::timeout(left, rx.recv()).await else {
                anyhow::bail!(
                    "no terminal event within {TURN_TIMEOUT:?}; so far {events:?}\n{}",
                    self.home.diagnostics()
                );
            };
            let terminal = matches!(event, AgentEvent::Done { .. } | AgentEvent::Failed { .. });
            events.push(event);
            if terminal {
                break;
            }
        }
        tokio::time::timeout(Duration::from_secs(10), running.task).await??;
        Ok(events)
    }

    /// Every regular file under `COFFER_HOME` and the agent's cwd holding `needle`.
    fn files_holding(&self, needle: &str) -> Vec<PathBuf> {
        let mut hits = Vec::new();
        for root in [self.home.root(), self.cwd.as_path(), self.home.logs_dir().as_path()] {
            walk(root, &mut |p| {
                if std::fs::read(p).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes())) {
                    hits.push(p.to_path_buf());
                }
            });
        }
        hits.sort();
        hits.dedup();
        hits
    }
}

/// Calls `f` on every regular file under `dir` (symlinks not followed: Codex's `auth.json` link
/// points at the user's own file, which is not Coffer's).
fn walk(dir: &Path, f: &mut dyn FnMut(&Path)) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let Ok(t) = e.file_type() else { continue };
        if t.is_dir() {
            walk(&e.path(), f);
        } else if t.is_file() {
            f(&e.path());
        }
    }
}

fn done(events: &[AgentEvent]) -> anyhow::Result<()> {
    anyhow::ensure!(matches!(events.last(), Some(AgentEvent::Done { .. })), "the turn did not end well: {events:?}");
    Ok(())
}

fn session(events: &[AgentEvent]) -> String {
    events
        .iter()
        .find_map(|e| if let AgentEvent::Session { session_id, .. } = e { Some(session_id.clone()) } else { None })
        .unwrap_or_default()
}

/// Claude Code offline with a private config dir and no retries, and no `ANTHROPIC_*` at all of
/// its own: only a binding can point it at a model.
fn claude_unconfigured(bench: &Bench) -> ClaudeCode {
    let home = bench.user_home();
    let vars: Vec<(OsString, OsString)> = vec![
        ("HOME".into(), home.clone().into()),
        ("CLAUDE_CONFIG_DIR".into(), home.join(".claude").into()),
        // The home's private TMPDIR: /tmp is an ancestor of this COFFER_HOME (vault sandbox).
        ("TMPDIR".into(), bench.home.env()["TMPDIR"].clone().into()),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".into(), "1".into()),
        ("DISABLE_TELEMETRY".into(), "1".into()),
        ("DISABLE_AUTOUPDATER".into(), "1".into()),
        ("DISABLE_ERROR_REPORTING".into(), "1".into()),
        ("CLAUDE_CODE_MAX_RETRIES".into(), "0".into()),
    ];
    ClaudeCode::with_env(vars)
}

#[tokio::test]
async fn claude_code_bound_to_a_connection_sends_its_traffic_there_with_the_connection_s_model_and_key()
-> anyhow::Result<()> {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        anyhow::ensure!(!k.starts_with("ANTHROPIC_"), "the test's own environment sets {k}: unset it to run this test");
    }
    let bench = Bench::new(coffer_tests::peers::claude_code()?).await?;
    let bound_api = FakeAnthropic::scripted().await?;
    let provider = claude_unconfigured(&bench);
    let binding = Binding::new(
        "work",
        Wire::Anthropic,
        &format!("{}/v1", bound_api.url),
        Some(SecretString::from(KEY)),
        "claude-bound-model",
        "claude-bound-fast",
    );

    // Bound, no model of the conversation's own: the connection's model, the key in x-api-key.
    let first = bench.turn(&provider, Some(&binding), "SAY[bound hello]", bench.config("", "")).await?;
    done(&first)?;
    let turns = bound_api.turns();
    anyhow::ensure!(!turns.is_empty(), "the bound connection's API saw no turn: {:?}", bound_api.requests());
    for t in &turns {
        assert!(t.path.starts_with("/v1/messages"), "{}", t.path);
        assert_eq!(t.body["model"], "claude-bound-model", "{}", t.body["model"]);
        assert!(t.auth.contains(&("x-api-key".to_owned(), KEY.to_owned())), "{:?}", t.auth);
    }

    // The conversation's own model wins over the connection's (resuming the session).
    let before = bound_api.turns().len();
    let second = bench
        .turn(&provider, Some(&binding), "SAY[again]", bench.config(&session(&first), "claude-own-choice"))
        .await?;
    done(&second)?;
    let later = bound_api.turns();
    anyhow::ensure!(later.len() > before, "no second turn reached the bound API");
    for t in &later[before..] {
        assert_eq!(t.body["model"], "claude-own-choice", "{}", t.body["model"]);
    }

    // Unbound again: the user's own configuration (another API, another key) and nothing of the
    // binding reaches it.
    let own_api = FakeAnthropic::scripted().await?;
    let home = bench.user_home();
    let own = ClaudeCode::with_env([
        ("HOME", home.clone().into_os_string()),
        ("CLAUDE_CONFIG_DIR", home.join(".claude").into_os_string()),
        // The home's private TMPDIR, as in `claude_unconfigured`: this COFFER_HOME is under /tmp,
        // which the vault sandbox closes to the agent (Claude Code makes `$TMPDIR/claude-<uid>`).
        ("TMPDIR", bench.home.env()["TMPDIR"].clone().into()),
        ("ANTHROPIC_BASE_URL", own_api.url.clone().into()),
        ("ANTHROPIC_API_KEY", "sk-ant-users-own-key".into()),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
        ("DISABLE_TELEMETRY", "1".into()),
        ("CLAUDE_CODE_MAX_RETRIES", "0".into()),
    ]);
    let seen = bound_api.requests().len();
    done(&bench.turn(&own, None, "SAY[unbound]", bench.config("", "")).await?)?;
    assert_eq!(bound_api.requests().len(), seen, "an unbound turn reached the connection's API");
    let mine = own_api.turns();
    anyhow::ensure!(!mine.is_empty(), "the user's own API saw no turn");
    for t in &mine {
        assert_ne!(t.body["model"], "claude-bound-model");
        assert!(t.auth.contains(&("x-api-key".to_owned(), "sk-ant-users-own-key".to_owned())), "{:?}", t.auth);
    }

    // No key in any file Coffer or the agent left under COFFER_HOME, in the cwd, or in a log —
    // nor in Claude Code's own config dir (its shell snapshots, its settings).
    let mut leaks = bench.files_holding(KEY);
    walk(&bench.user_home(), &mut |p| {
        if std::fs::read(p).is_ok_and(|b| b.windows(KEY.len()).any(|w| w == KEY.as_bytes())) {
            leaks.push(p.to_path_buf());
        }
    });
    assert!(leaks.is_empty(), "the bound key is on disk: {leaks:?}");
    Ok(())
}

#[tokio::test]
async fn codex_bound_to_a_responses_connection_sends_its_traffic_there_and_unbound_uses_the_user_s_provider()
-> anyhow::Result<()> {
    let bench = Bench::new(coffer_tests::peers::codex()?).await?;
    let bound_api = FakeOpenAi::start().await?;
    let own_api = FakeOpenAi::start().await?;
    // The user's own Codex config points at their provider (`fake`, key from OPENAI_API_KEY).
    let home = bench.user_home();
    coffer_tests::write_file(&home.join(".codex/config.toml"), own_api.codex_config("users-own-model"))?;
    let provider =
        Codex::with_env([("HOME", home.into_os_string()), ("OPENAI_API_KEY", OsString::from("sk-users-own-key"))]);
    let binding = Binding::new(
        "oai",
        Wire::OpenAiResponses,
        bound_api.url.trim_end_matches("/v1"),
        Some(SecretString::from(KEY)),
        "gpt-bound-model",
        "",
    );

    let first = bench.turn(&provider, Some(&binding), "SAY[bound hello]", bench.config("", "")).await?;
    done(&first)?;
    let requests = bound_api.requests();
    anyhow::ensure!(!requests.is_empty(), "the bound connection's API saw nothing");
    for r in &requests {
        assert_eq!(r.path, "/v1/responses");
        assert_eq!(r.body["model"], "gpt-bound-model", "{}", r.body["model"]);
        assert!(r.auth.contains(&("authorization".to_owned(), format!("Bearer {KEY}"))), "{:?}", r.auth);
    }
    assert!(own_api.requests().is_empty(), "a bound turn reached the user's own provider");
    let config = std::fs::read_to_string(bench.home.root().join("agents/codex/config.toml"))?;
    assert!(
        config.contains("[model_providers.coffer-oai]") && config.contains("model_provider = \"coffer-oai\""),
        "{config}"
    );

    // The conversation's own model wins.
    let before = bound_api.requests().len();
    let second =
        bench.turn(&provider, Some(&binding), "SAY[again]", bench.config(&session(&first), "gpt-own-choice")).await?;
    done(&second)?;
    let later = bound_api.requests();
    anyhow::ensure!(later.len() > before, "no second turn reached the bound API");
    for r in &later[before..] {
        assert_eq!(r.body["model"], "gpt-own-choice", "{}", r.body["model"]);
    }

    // Unbound: the entry and the selection are gone; the user's provider and key apply.
    let seen = bound_api.requests().len();
    done(&bench.turn(&provider, None, "SAY[unbound]", bench.config("", "")).await?)?;
    assert_eq!(bound_api.requests().len(), seen, "an unbound turn reached the connection's API");
    let mine = own_api.requests();
    anyhow::ensure!(!mine.is_empty(), "the user's own provider saw nothing");
    assert_eq!(mine[0].body["model"], "users-own-model");
    assert!(
        mine[0].auth.contains(&("authorization".to_owned(), "Bearer sk-users-own-key".to_owned())),
        "{:?}",
        mine[0].auth
    );
    let config = std::fs::read_to_string(bench.home.root().join("agents/codex/config.toml"))?;
    assert!(!config.contains("coffer-oai"), "{config}");

    let leaks = bench.files_holding(KEY);
    assert!(leaks.is_empty(), "the bound key is on disk: {leaks:?}");
    Ok(())
}

#[tokio::test]
async fn a_binding_the_agent_cannot_use_fails_the_turn_naming_the_connection() -> anyhow::Result<()> {
    let bench = Bench::new(coffer_tests::peers::claude_code()?).await?;
    let provider = claude_unconfigured(&bench);
    let wrong = Binding::new("oai", Wire::OpenAiResponses, "http://127.0.0.1:9", None, "", "");
    let env = AgentEnv { binding: Some(wrong), ..bench.env.clone() };
    let input = TurnInput {
        conversation_id: "01JCONV".into(),
        turn_id: "01JT".into(),
        text: "hi".into(),
        config: bench.config("", ""),
        attachments: Vec::new(),
    };
    let (tx, _rx) = mpsc::channel(8);
    let e = provider.start_turn(&env, input, tx).expect_err("a Claude Code on an OpenAI connection");
    assert!(e.message.contains("\"oai\"") && e.message.contains("chat.claude_code_connection"), "{}", e.message);
    assert!(bench.home.pid_records().iter().all(|r| r.kind != "agent"), "no CLI was started");

    let chat = Binding::new("vllm", Wire::OpenAiChat, "http://127.0.0.1:9", None, "", "");
    let env = AgentEnv { binding: Some(chat), ..bench.env.clone() };
    let input = TurnInput {
        conversation_id: "01JCONV".into(),
        turn_id: "01JT".into(),
        text: "hi".into(),
        config: bench.config("", ""),
        attachments: Vec::new(),
    };
    let (tx, _rx) = mpsc::channel(8);
    let e = Codex::new().start_turn(&env, input, tx).expect_err("Codex on a Chat Completions connection");
    assert!(e.message.contains("\"vllm\"") && e.message.contains("Responses"), "{}", e.message);
    Ok(())
}

// ------------------------------------------------------------------- coffer__search_tools

/// `coffer__search_tools` through REST's tool call: its `structuredContent`.
async fn search_tools(api: &coffer_tests::Api, query: &str) -> anyhow::Result<serde_json::Value> {
    use coffer_tests::SendExt;
    let body = serde_json::json!({"name": "coffer__search_tools", "arguments": {"query": query, "limit": 3}});
    let out = api.post_json("/v1/tools/call", &body).reply().await?.ok_json()?;
    Ok(out["structuredContent"].clone())
}

fn top(v: &serde_json::Value) -> &str {
    v["matches"][0]["name"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn search_tools_is_semantic_with_an_embeddings_endpoint_and_falls_back_to_keywords() -> anyhow::Result<()> {
    use coffer_tests::SendExt;
    use coffer_tests::embeddings::{FakeEmbeddings, Mode};
    const EMBED_KEY: &str = "sk-fake-embeddings-for-tools";
    let fake = FakeEmbeddings::start(64, Some(EMBED_KEY)).await?;
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    coffer_tests::mcp::register_tiny(&api, "tiny", serde_json::json!({})).await?;
    coffer_tests::mcp::wait_listed(&api, "tiny").await?;

    // No endpoint: keyword mode, and no embeddings request.
    let v = search_tools(&api, "echoes message").await?;
    assert_eq!(v["mode"], "keyword", "{v}");
    assert_eq!(top(&v), "tiny__echo", "{v}");
    assert_eq!(fake.requests(), 0);

    let r = api
        .request(reqwest::Method::PUT, "/v1/credentials/embeddings-key")
        .header("X-Coffer-Actor", "cli")
        .json(&serde_json::json!({"value": EMBED_KEY}))
        .reply()
        .await?;
    anyhow::ensure!(r.status == 200 || r.status == 201, "{} {}", r.status, r.text);
    let r = api
        .request(reqwest::Method::PATCH, "/v1/settings")
        .json(&serde_json::json!({"set": {"retrieval.embeddings.url": fake.url, "retrieval.embeddings.credential": "embeddings-key", "retrieval.embeddings.model": "fake-bow", "retrieval.embeddings.dimensions": "64"}}))
        .reply()
        .await?;
    anyhow::ensure!(r.status == 200, "{} {}", r.status, r.text);

    // Hybrid once retrieval has the endpoint (keyword and meaning, fused): "adding up numbers"
    // sits closest to tiny__add's "Adds two numbers" by its trigrams and by its words.
    let v = coffer_tests::wait_for("search_tools to answer with meaning too", Duration::from_secs(20), || async {
        let v = search_tools(&api, "adding up numbers").await?;
        Ok((v["mode"] == "hybrid").then_some(v))
    })
    .await?;
    assert_eq!(top(&v), "tiny__add", "{v}");
    let texts = fake.texts();
    assert!(
        texts.iter().any(|t| t.starts_with("tiny__add: Adds two numbers")),
        "the tools' texts were embedded: {texts:?}"
    );
    // Coffer's own tools are found like upstream ones; the meta tools that search, describe and
    // call are not candidates.
    assert!(texts.iter().any(|t| t.starts_with("coffer__remember:")), "built-ins are candidates: {texts:?}");
    assert!(
        !texts.iter().any(|t| ["coffer__search_tools:", "coffer__describe_tool:", "coffer__call_tool:"]
            .iter()
            .any(|m| t.starts_with(m))),
        "the meta tools are not candidates: {texts:?}"
    );

    // Tool vectors are cached: the next search embeds its query only.
    let before = fake.embedded();
    let v = search_tools(&api, "echoes a message back").await?;
    assert_eq!((v["mode"].as_str(), top(&v)), (Some("hybrid"), "tiny__echo"), "{v}");
    assert_eq!(fake.embedded(), before + 1, "only the query");

    // The endpoint fails: keyword mode, saying why.
    fake.set_mode(Mode::Http500);
    let v = search_tools(&api, "echo").await?;
    assert_eq!(v["mode"], "keyword", "{v}");
    assert!(v["fallback"].as_str().is_some_and(|f| f.contains("500")), "{v}");
    assert_eq!(top(&v), "tiny__echo");
    assert!(!home.log_text("gateway").contains(EMBED_KEY) && !home.log_text("retrieval").contains(EMBED_KEY));
    Ok(())
}

// ------------------------------------------------------------- the daemon: settings and REST

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_agent_shows_its_binding_and_a_missing_connection_fails_its_turn_naming_it() -> anyhow::Result<()> {
    use coffer_tests::SendExt;
    use serde_json::{Value, json};
    let fake = FakeAnthropic::scripted().await?;
    let mut home = TestHome::new()?;
    coffer_tests::chat::offline_claude_code(&mut home, &fake.url);
    let api = home.start_daemon().await?;
    let claude = coffer_tests::peers::claude_code()?.display().to_string();
    api.request(reqwest::Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"chat.claude_code_path": claude}}))
        .reply()
        .await?
        .ok_json()?;
    let agent = |agents: &Value, key: &str| {
        agents["items"].as_array().into_iter().flatten().find(|a| a["agent_key"] == key).cloned().unwrap_or(Value::Null)
    };
    let agents = api.get("/v1/agents").reply().await?.ok_json()?;
    assert_eq!(agent(&agents, "claude_code")["binding"], Value::Null, "unbound: its own login");

    api.request(reqwest::Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"chat.claude_code_connection": "nowhere"}}))
        .reply()
        .await?
        .ok_json()?;
    let binding = coffer_tests::wait_for("ListAgents to show the binding", Duration::from_secs(20), || async {
        let agents = api.get("/v1/agents").reply().await?.ok_json()?;
        let b = agent(&agents, "claude_code")["binding"].clone();
        Ok((!b.is_null()).then_some(b))
    })
    .await?;
    assert_eq!(binding["connection"], "nowhere", "{binding}");
    assert!(binding["problem"].as_str().is_some_and(|p| p.contains("\"nowhere\"")), "{binding}");
    assert_eq!(agent(&api.get("/v1/agents").reply().await?.ok_json()?, "codex")["binding"], Value::Null);

    // A turn of the bound agent fails before any CLI starts, naming the connection and the setting.
    let r = api.post_json("/v1/conversations", &json!({"agent_key": "claude_code"})).reply().await?;
    anyhow::ensure!(r.status == 201, "create: {} {}", r.status, r.text);
    let id = r.json()?["id"].as_str().unwrap_or_default().to_owned();
    let r = api.post_json(&format!("/v1/conversations/{id}/messages"), &json!({"text": "SAY[hi]"})).reply().await?;
    anyhow::ensure!(r.status == 202, "send: {} {}", r.status, r.text);
    let error = coffer_tests::wait_for("the bound turn to fail", Duration::from_secs(30), || async {
        let view = api.get(&format!("/v1/conversations/{id}")).reply().await?.ok_json()?;
        let failed = view["messages"].as_array().into_iter().flatten().find(|m| m["status"] == "failed").cloned();
        Ok(failed.map(|m| m["error"].clone()))
    })
    .await?;
    let error = error.to_string();
    assert!(error.contains("nowhere") && error.contains("chat.claude_code_connection"), "{error}");
    assert!(fake.requests().is_empty(), "no model traffic went anywhere: {:?}", fake.requests());
    Ok(())
}

/// The done-when, through the whole daemon: an LLM connection added over REST (its key
/// given once, kept in the credential store), Claude Code bound to it with the setting, and a
/// conversation's turn → the real Claude Code CLI sends its model traffic to the connection's base
/// URL with the connection's model and key, none to the user's own API that the daemon's
/// environment points at, and the key is in no file under `COFFER_HOME` nor in the logs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claude_code_conversation_bound_to_a_stored_connection_talks_to_its_base_url_with_its_model()
-> anyhow::Result<()> {
    use coffer_tests::SendExt;
    use serde_json::{Value, json};
    const MODEL: &str = "claude-bound-model-7";
    let own = FakeAnthropic::scripted().await?;
    let bound = FakeAnthropic::scripted().await?;
    let mut home = TestHome::new()?;
    coffer_tests::chat::offline_claude_code(&mut home, &own.url);
    let api = home.start_daemon().await?;
    let claude = coffer_tests::peers::claude_code()?.display().to_string();
    api.request(reqwest::Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"chat.claude_code_path": claude}}))
        .reply()
        .await?
        .ok_json()?;
    let r = api
        .post_json(
            "/v1/llm/connections",
            &json!({"name": "work", "wire": "anthropic", "base_url": bound.url, "api_key": KEY, "model": MODEL}),
        )
        .reply()
        .await?;
    anyhow::ensure!(r.status == 201, "add the connection: {} {}", r.status, r.text);
    api.request(reqwest::Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"chat.claude_code_connection": "work"}}))
        .reply()
        .await?
        .ok_json()?;
    let agent = |agents: &Value| {
        agents["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["agent_key"] == "claude_code")
            .map(|a| a["binding"].clone())
            .unwrap_or(Value::Null)
    };
    let binding = coffer_tests::wait_for("ListAgents to show the binding", Duration::from_secs(20), || async {
        let b = agent(&api.get("/v1/agents").reply().await?.ok_json()?);
        Ok((b["connection"] == "work").then_some(b))
    })
    .await?;
    assert_eq!(binding["model"], MODEL, "{binding}");
    assert!(binding["problem"].is_null(), "{binding}");

    let r = api.post_json("/v1/conversations", &json!({"agent_key": "claude_code"})).reply().await?;
    anyhow::ensure!(r.status == 201, "create: {} {}", r.status, r.text);
    let id = r.json()?["id"].as_str().unwrap_or_default().to_owned();
    let r = api
        .post_json(
            &format!("/v1/conversations/{id}/messages"),
            &json!({"text": "SAY[answered by the bound connection]"}),
        )
        .reply()
        .await?;
    anyhow::ensure!(r.status == 202, "send: {} {}", r.status, r.text);
    let reply = coffer_tests::wait_for("the bound turn to complete", TURN_TIMEOUT, || async {
        let view = api.get(&format!("/v1/conversations/{id}")).reply().await?.ok_json()?;
        let done = view["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["role"] == "assistant" && (m["status"] == "complete" || m["status"] == "failed"));
        Ok(done.cloned())
    })
    .await?;
    assert_eq!(reply["status"], "complete", "{reply}\n{}", home.diagnostics());
    assert!(reply.to_string().contains("answered by the bound connection"), "{reply}");

    let to_bound: Vec<_> = bound.requests().into_iter().filter(|r| r.path.starts_with("/v1/messages")).collect();
    assert!(!to_bound.is_empty(), "the bound connection's base URL got no model traffic");
    assert!(to_bound.iter().any(|r| r.body["model"] == MODEL), "no request named {MODEL}: {to_bound:?}");
    for r in &to_bound {
        assert!(r.auth.iter().any(|(k, v)| k == "x-api-key" && v == KEY), "{:?} without the key", r.path);
    }
    let to_own: Vec<_> = own.requests().into_iter().filter(|r| r.path.starts_with("/v1/messages")).collect();
    assert!(to_own.is_empty(), "traffic reached the daemon environment's API: {to_own:?}");

    let mut holding = Vec::new();
    for root in [home.root().to_path_buf(), home.logs_dir()] {
        walk(&root, &mut |p| {
            if std::fs::read(p).is_ok_and(|b| b.windows(KEY.len()).any(|w| w == KEY.as_bytes())) {
                holding.push(p.to_path_buf());
            }
        });
    }
    assert!(holding.is_empty(), "the connection's key is on disk in plaintext: {holding:?}");
    Ok(())
}
