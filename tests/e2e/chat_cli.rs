//! Chat through the `coffer` CLI, as a new user lives it: the shipped daemon (`coffer-daemon` with the
//! real `coffer-chat`, Claude Code and Codex registered) started on demand by the `coffer` CLI,
//! the real agent CLIs from `tests/peers/` on the scripted fake model APIs
//! (`coffer_tests::script`), and only `coffer …` commands to drive it: `chat agents` lists both
//! agents; `chat new … --watch` streams a slow answer token by token; two `chat send` during the
//! turn are queued in order; a second `chat watch` attached mid-turn sees the same events (seq
//! and data); `chat stop` keeps the partial answer as `interrupted` and pauses the queue;
//! `chat pending --resume` runs the two queued messages in order, one turn each; the agent calls
//! `coffer__search_tools` through Coffer's attached gateway (shown by the watcher and in the
//! invocation log); `daemon restart` keeps every message, and one more message resumes the
//! agent's session with its history. One test per agent: Claude Code found on the daemon's
//! `PATH`, Codex (and Claude Code) at paths set with `coffer settings set`.
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::anthropic::FakeAnthropic;
use coffer_tests::openai::FakeOpenAi;
use coffer_tests::{CliOutput, SendExt, TestHome, bin, wait_for};
use serde_json::Value;
use tokio::io::AsyncReadExt;

/// How long one turn of a real agent CLI on a fake model may take on the loaded 2-core machine.
const TURN_TIMEOUT: Duration = Duration::from_secs(90);
/// Milliseconds the fake model waits before each streamed event of the slow first answer.
const SLOW_MS: u64 = 400;
/// Words of the slow first answer (`w01 … w99`): at [`SLOW_MS`] each it streams for ~40 s,
/// far longer than the steps run during it; it is stopped long before its end.
const SLOW_WORDS: usize = 99;

/// Which agent a test drives, and how the daemon finds its CLI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Agent {
    ClaudeCode,
    Codex,
}

impl Agent {
    fn key(self) -> &'static str {
        match self {
            Self::ClaudeCode => "claude_code",
            Self::Codex => "codex",
        }
    }

    /// The prompt that makes the fake call Coffer's `coffer__search_tools` through the attached
    /// gateway (Claude Code offers MCP tools as `mcp__<server>__<tool>`, Codex inside its
    /// `mcp__coffer` namespace).
    fn tool_prompt(self) -> &'static str {
        match self {
            Self::ClaudeCode => r#"TOOL[mcp__coffer__coffer__search_tools {"query": "echo"}]"#,
            Self::Codex => r#"TOOL[coffer__search_tools {"query": "echo"}]"#,
        }
    }
}

/// The fake model APIs both agents are pointed at.
struct Fakes {
    anthropic: FakeAnthropic,
    openai: FakeOpenAi,
}

impl Fakes {
    /// The user texts of the latest request `agent`'s fake received (all of its history), and
    /// how many requests it received.
    fn history(&self, agent: Agent) -> (Vec<String>, usize) {
        match agent {
            Agent::ClaudeCode => {
                let turns = self.anthropic.turns();
                let texts = turns.last().map(|t| anthropic_user_texts(&t.body)).unwrap_or_default();
                (texts, turns.len())
            }
            Agent::Codex => {
                let requests = self.openai.requests();
                let texts = requests.last().map(|r| r.user_texts()).unwrap_or_default();
                (texts, requests.len())
            }
        }
    }

    /// The latest request's body as JSON text.
    fn last_body(&self, agent: Agent) -> String {
        match agent {
            Agent::ClaudeCode => self.anthropic.turns().last().map(|t| t.body.to_string()).unwrap_or_default(),
            Agent::Codex => self.openai.requests().last().map(|r| r.body.to_string()).unwrap_or_default(),
        }
    }

    /// The latest user text of every request `agent`'s fake received, in order (what each
    /// request asked the model to answer).
    fn prompts(&self, agent: Agent) -> Vec<String> {
        match agent {
            Agent::ClaudeCode => {
                self.anthropic.turns().iter().filter_map(|t| anthropic_user_texts(&t.body).pop()).collect()
            }
            Agent::Codex => self.openai.requests().iter().filter_map(|r| r.user_texts().pop()).collect(),
        }
    }
}

/// The text of every user message of an Anthropic Messages request (string content or its text
/// blocks joined), in order; messages carrying only tool results are skipped.
fn anthropic_user_texts(body: &Value) -> Vec<String> {
    let messages = body["messages"].as_array().into_iter().flatten().filter(|m| m["role"] == "user");
    messages
        .filter_map(|m| match &m["content"] {
            Value::String(s) => Some(s.clone()),
            Value::Array(blocks) => {
                let texts: Vec<&str> =
                    blocks.iter().filter(|b| b["type"] == "text").filter_map(|b| b["text"].as_str()).collect();
                (!texts.is_empty()).then(|| texts.join("\n"))
            }
            _ => None,
        })
        .collect()
}

/// A home whose every process (the daemon the CLI starts, its services, the agents) finds the
/// fakes: Claude Code's offline variables and `OPENAI_API_KEY` (kept by the daemon through
/// `COFFER_PASS_ENV`), and the user's `~/.codex/config.toml` naming the fake provider; with
/// `on_path`, a folder holding `claude` and `codex` first on `PATH`.
async fn new_user_home(on_path: bool) -> anyhow::Result<(TestHome, Fakes)> {
    let fakes = Fakes { anthropic: FakeAnthropic::scripted().await?, openai: FakeOpenAi::start().await? };
    let mut home = TestHome::new()?;
    // Nothing of the machine's own agent set-up may leak in.
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if ["ANTHROPIC_", "CLAUDE", "OPENAI_", "CODEX_", "MCP_"].iter().any(|p| k.starts_with(p)) {
            home.unset_env(&k);
        }
    }
    let user_home = PathBuf::from(&home.env()["HOME"]);
    coffer_tests::write_file(&user_home.join(".codex/config.toml"), fakes.openai.codex_config("fake-model"))?;
    let vars = [
        ("CLAUDE_CONFIG_DIR", user_home.join(".claude").display().to_string()),
        ("ANTHROPIC_BASE_URL", fakes.anthropic.url.clone()),
        ("ANTHROPIC_API_KEY", "sk-ant-test-not-a-real-key".into()),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
        ("DISABLE_TELEMETRY", "1".into()),
        ("DISABLE_AUTOUPDATER", "1".into()),
        ("DISABLE_ERROR_REPORTING", "1".into()),
        ("CLAUDE_CODE_MAX_RETRIES", "0".into()),
        ("OPENAI_API_KEY", "sk-test-not-a-real-key".into()),
    ];
    // A daemon the CLI starts keeps only a base environment; the agents' variables are passed
    // on by name, as the CLI's docs say (`COFFER_PASS_ENV`).
    let names: Vec<&str> = vars.iter().map(|(k, _)| *k).collect();
    home.set_env("COFFER_PASS_ENV", names.join(","));
    for (k, v) in vars {
        home.set_env(k, v);
    }
    if on_path {
        let dir = home.temp().join("agent-bin");
        std::fs::create_dir_all(&dir)?;
        std::os::unix::fs::symlink(coffer_tests::peers::claude_code()?, dir.join("claude"))?;
        std::os::unix::fs::symlink(coffer_tests::peers::codex()?, dir.join("codex"))?;
        let path = std::env::var("PATH").unwrap_or_default();
        home.set_env("PATH", format!("{}:{path}", dir.display()));
    }
    Ok((home, fakes))
}

/// A `coffer` command left running (a watcher): its stdout and stderr collected as they come.
struct Running {
    what: String,
    child: tokio::process::Child,
    out: Arc<Mutex<Vec<u8>>>,
    err: Arc<Mutex<Vec<u8>>>,
    /// The tasks collecting stdout and stderr; each ends at its pipe's end.
    drains: Vec<tokio::task::JoinHandle<()>>,
}

impl Running {
    fn start(home: &TestHome, args: &[&str]) -> anyhow::Result<Self> {
        let mut child = home.cli_command(args)?.spawn().context("starting coffer")?;
        let (out, err) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
        let stdout = child.stdout.take().context("piped stdout")?;
        let stderr = child.stderr.take().context("piped stderr")?;
        let drains = vec![tokio::spawn(drain(stdout, out.clone())), tokio::spawn(drain(stderr, err.clone()))];
        Ok(Self { what: format!("`coffer {}`", args.join(" ")), child, out, err, drains })
    }

    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }

    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.err.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }

    /// Every complete JSON value on stdout so far (`--json` prints one per line).
    fn json(&self) -> Vec<Value> {
        let out = self.stdout();
        let complete = &out[..out.rfind('\n').map_or(0, |i| i + 1)];
        serde_json::Deserializer::from_str(complete).into_iter::<Value>().map_while(Result::ok).collect()
    }

    /// The events (`seq` and `kind`) among [`Running::json`].
    fn events(&self) -> Vec<Value> {
        self.json().into_iter().filter(|v| v["seq"].is_u64() && v["kind"].is_string()).collect()
    }

    /// Waits until `probe` finds what it wants in this command's stdout.
    async fn wait_stdout<T>(
        &self,
        what: &str,
        timeout: Duration,
        probe: impl Fn(&str) -> Option<T>,
    ) -> anyhow::Result<T> {
        let found = wait_for(what, timeout, || async { Ok(probe(&self.stdout())) }).await;
        found.with_context(|| {
            format!("{}\n--- stdout ---\n{}\n--- stderr ---\n{}", self.what, self.stdout(), self.stderr())
        })
    }

    /// Waits until the events on stdout satisfy `probe`.
    async fn wait_events<T>(
        &self,
        what: &str,
        timeout: Duration,
        probe: impl Fn(&[Value]) -> Option<T>,
    ) -> anyhow::Result<T> {
        self.wait_stdout(what, timeout, |_| probe(&self.events())).await
    }

    /// Waits until stderr holds `needle`.
    async fn wait_stderr(&self, needle: &str, timeout: Duration) -> anyhow::Result<()> {
        let found = wait_for(&format!("{needle:?} on stderr"), timeout, || async {
            Ok(self.stderr().contains(needle).then_some(()))
        })
        .await;
        found.with_context(|| format!("{}\n--- stderr ---\n{}", self.what, self.stderr()))
    }

    /// Waits for the command to exit on its own; its exit code.
    async fn exit(&mut self, timeout: Duration) -> anyhow::Result<Option<i32>> {
        let status = tokio::time::timeout(timeout, self.child.wait()).await.with_context(|| {
            format!("{} still running after {timeout:?}\n--- stdout ---\n{}", self.what, self.stdout())
        })??;
        // Everything it printed is collected before anyone reads it (on a busy machine the
        // collecting tasks may still be behind when the process has exited).
        for d in std::mem::take(&mut self.drains) {
            tokio::time::timeout(timeout, d).await.context("reading the rest of its output")??;
        }
        Ok(status.code())
    }
}

async fn drain(mut from: impl tokio::io::AsyncRead + Unpin, to: Arc<Mutex<Vec<u8>>>) {
    let mut buf = [0u8; 4096];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 {
            return;
        }
        to.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(&buf[..n]);
    }
}

/// Runs `coffer <args> --json` to its end; its JSON stdout (fails unless it exits 0).
async fn cli_json(home: &TestHome, args: &[&str]) -> anyhow::Result<Value> {
    let mut all = args.to_vec();
    all.push("--json");
    home.cli(&all).await?.ok()?.json()
}

async fn cli_ok(home: &TestHome, args: &[&str]) -> anyhow::Result<CliOutput> {
    home.cli(args).await?.ok()
}

fn kind(e: &Value) -> &str {
    e["kind"].as_str().unwrap_or("")
}

fn is_turn_end(e: &Value) -> bool {
    matches!(kind(e), "turn_done" | "turn_error")
}

/// The text the `text_delta`s of `events` stream.
fn streamed(events: &[Value]) -> String {
    events.iter().filter(|e| kind(e) == "text_delta").filter_map(|e| e["text_delta"]["text"].as_str()).collect()
}

/// A message's text blocks joined.
fn message_text(m: &Value) -> String {
    let blocks = m["blocks"].as_array().into_iter().flatten();
    blocks.filter(|b| b["type"] == "text").filter_map(|b| b["text"].as_str()).collect()
}

/// `(role, status, text)` of every message of a `chat show --json` view.
fn messages(view: &Value) -> Vec<(String, String, String)> {
    let ms = view["messages"].as_array().into_iter().flatten();
    ms.map(|m| {
        let s = |k: &str| m[k].as_str().unwrap_or("").to_owned();
        (s("role"), s("status"), message_text(m))
    })
    .collect()
}

/// The pending texts of a `{items, paused}` queue.
fn pending_texts(q: &Value) -> Vec<String> {
    q["items"].as_array().into_iter().flatten().filter_map(|i| i["text"].as_str()).map(str::to_owned).collect()
}

/// The agents listed by `coffer chat agents --json`: key → (available, command or reason).
fn agents(list: &Value) -> Vec<(String, bool, String)> {
    let items = list["items"].as_array().into_iter().flatten();
    items
        .map(|a| {
            let available = a["available"].as_bool().unwrap_or(false);
            let why = if available { &a["command"] } else { &a["reason"] };
            (a["agent_key"].as_str().unwrap_or("").to_owned(), available, why.as_str().unwrap_or("").to_owned())
        })
        .collect()
}

/// Waits until `coffer chat agents --json` lists both agents available (settings are followed
/// by the chat service within seconds); the list.
async fn both_available(home: &TestHome) -> anyhow::Result<Vec<(String, bool, String)>> {
    wait_for("both agents to be listed available", Duration::from_secs(30), || async {
        let list = agents(&cli_json(home, &["chat", "agents"]).await?);
        let ok = ["claude_code", "codex"].iter().all(|k| list.iter().any(|(a, available, _)| a == k && *available));
        Ok(ok.then_some(list))
    })
    .await
}

#[tokio::test]
async fn claude_code_streams_queues_stops_resumes_calls_a_tool_and_survives_a_restart() -> anyhow::Result<()> {
    let (home, fakes) = new_user_home(true).await?;
    // The first command starts the daemon; both CLIs are found on its PATH.
    let list = both_available(&home).await?;
    let dir = home.temp().join("agent-bin");
    for (key, name) in [("claude_code", "claude"), ("codex", "codex")] {
        let (_, _, command) = list.iter().find(|(k, ..)| k == key).context("listed")?;
        assert_eq!(Path::new(command), dir.join(name), "{key} resolved on the daemon's PATH: {list:?}");
    }
    a_new_users_session(&home, &fakes, Agent::ClaudeCode).await
}

#[tokio::test]
async fn codex_streams_queues_stops_resumes_calls_a_tool_and_survives_a_restart() -> anyhow::Result<()> {
    let (home, fakes) = new_user_home(false).await?;
    // Neither CLI is on PATH: both are listed unavailable, each naming the setting to use.
    let list = agents(&cli_json(&home, &["chat", "agents"]).await?);
    for (key, setting) in [("claude_code", "chat.claude_code_path"), ("codex", "chat.codex_path")] {
        let found = list.iter().find(|(k, ..)| k == key);
        assert!(
            found.is_some_and(|(_, available, reason)| !available && reason.contains(setting)),
            "{key} unavailable, naming {setting}: {list:?}"
        );
    }
    let claude = coffer_tests::peers::claude_code()?.display().to_string();
    let codex = coffer_tests::peers::codex()?.display().to_string();
    cli_ok(&home, &["settings", "set", "chat.claude_code_path", &claude]).await?;
    cli_ok(&home, &["settings", "set", "chat.codex_path", &codex]).await?;
    let list = both_available(&home).await?;
    let (_, _, command) = list.iter().find(|(k, ..)| k == "codex").context("listed")?;
    assert_eq!(command, &codex, "{list:?}");
    a_new_users_session(&home, &fakes, Agent::Codex).await
}

/// Steps 2-8 of the task for `agent`, on a home whose daemon runs with both agents available.
async fn a_new_users_session(home: &TestHome, fakes: &Fakes, agent: Agent) -> anyhow::Result<()> {
    // An upstream for the agent to find through Coffer's tools.
    let tiny = bin("coffer-tiny-upstream")?.display().to_string();
    cli_ok(home, &["mcp", "add", "tiny", "--", &tiny]).await?;

    // 2. A new conversation whose first answer streams slowly, followed with --watch --json.
    let words: Vec<String> = (1..=SLOW_WORDS).map(|i| format!("w{i:02}")).collect();
    let first_text = format!("SLOW[{SLOW_MS}] SAY[{}]", words.join(" "));
    let mut first = Running::start(home, &["chat", "new", "--agent", agent.key(), &first_text, "--watch", "--json"])?;
    let conversation = first
        .wait_stdout("the created conversation", TURN_TIMEOUT, |_| {
            first.json().into_iter().find(|v| v["agent_key"].is_string() && v["id"].is_string())
        })
        .await?;
    let id = conversation["id"].as_str().context("id")?.to_owned();
    assert_eq!(conversation["agent_key"], agent.key(), "{conversation}");
    // A second, human, watcher: text as it comes, on stdout.
    let human = Running::start(home, &["chat", "watch", &id])?;
    human.wait_stderr(&format!("Watching conversation {id}"), Duration::from_secs(30)).await?;
    // Token by token: two words are on the terminal while later ones are not yet.
    // (What follows the echoed user message is the agent's text.)
    let answer = |out: &str| out.split_once("\n").map(|(_, rest)| rest.to_owned()).unwrap_or_default();
    let early = human
        .wait_stdout("w02 on the watcher's terminal", TURN_TIMEOUT, |out| {
            answer(out).contains("w02").then(|| out.to_owned())
        })
        .await?;
    assert!(early.starts_with("› you (cli): SLOW["), "the user's message is shown first: {early}");
    // (w20 is due seven seconds after w02.)
    assert!(!answer(&early).contains("w20"), "the text arrives incrementally, not at once: {early}");
    human
        .wait_stdout("w20 on the watcher's terminal", TURN_TIMEOUT, |out| answer(out).contains("w20").then_some(()))
        .await?;
    first
        .wait_events("two text deltas for the first watcher", TURN_TIMEOUT, |es| {
            (es.iter().filter(|e| kind(e) == "text_delta").count() >= 2).then_some(())
        })
        .await?;

    // 4. A third watcher attached mid-turn.
    let late = Running::start(home, &["chat", "watch", &id, "--json"])?;
    late.wait_stderr(&format!("Watching conversation {id}"), Duration::from_secs(30)).await?;

    // 3. Two more messages while the turn runs: both queued, in order.
    let second = "SAY[second answer]";
    let third = "SAY[third answer]";
    let reply = cli_json(home, &["chat", "send", &id, second]).await?;
    assert!(reply["message"].is_null(), "queued, not started: {reply}");
    assert_eq!(reply["pending"]["text"], second, "{reply}");
    assert_eq!(pending_texts(&reply["queue"]), [second], "{reply}");
    let sent = cli_ok(home, &["chat", "send", &id, third]).await?;
    assert_eq!(sent.stdout, "Queued as #2 (a turn is running)\n", "{sent}");
    let queue = cli_json(home, &["chat", "pending", &id]).await?;
    assert_eq!(pending_texts(&queue), [second, third], "{queue}");
    assert_eq!(queue["paused"], false, "{queue}");
    let shown = cli_ok(home, &["chat", "pending", &id]).await?;
    assert!(shown.stdout.contains("queue: 2 pending") && shown.stdout.contains("2. SAY[third answer]"), "{shown}");

    // The late watcher has caught up with the running turn.
    let seen = first.events().len();
    late.wait_events("the late watcher to catch up", TURN_TIMEOUT, |es| {
        es.iter().any(|e| e["seq"] == first.events()[seen - 1]["seq"]).then_some(())
    })
    .await?;

    // 5. Stop: the turn ends interrupted, its partial text kept; the queue pauses.
    let stop = cli_ok(home, &["chat", "stop", &id]).await?;
    assert!(stop.stdout.contains("Stopped the turn"), "{stop}");
    assert_eq!(first.exit(TURN_TIMEOUT).await?, Some(0), "{}", first.stderr());
    let turn1 = first.events();
    // The turn's end (the watcher then waits briefly for `files_changed`: `queue_changed` may follow).
    let end = turn1.iter().rev().find(|e| kind(e) == "turn_done").context("a turn_done")?;
    assert_eq!((kind(end), end["turn_done"]["stop_reason"].as_str()), ("turn_done", Some("interrupted")), "{end}");
    assert!(turn1.iter().filter(|e| kind(e) == "text_delta").count() > 1, "more than one text delta: {turn1:?}");
    let partial = streamed(&turn1);
    let full = words.join(" ");
    assert!(!partial.is_empty() && full.starts_with(&partial) && partial.len() < full.len(), "{partial:?}");
    // The attached-late watcher saw the same events, seq and data, from where it attached.
    let late_events = late
        .wait_events("the late watcher to see the interrupted turn end", TURN_TIMEOUT, |es| {
            es.iter().any(|e| e["seq"] == end["seq"]).then(|| es.to_vec())
        })
        .await?;
    let from = late_events.first().context("late events")?["seq"].as_u64().context("seq")?;
    let expected: Vec<&Value> =
        turn1.iter().filter(|e| e["seq"].as_u64() >= Some(from) && e["seq"].as_u64() <= end["seq"].as_u64()).collect();
    let got: Vec<&Value> = late_events.iter().take_while(|e| e["seq"].as_u64() <= end["seq"].as_u64()).collect();
    assert_eq!(got, expected, "the same events from seq {from}");
    assert!(expected.iter().filter(|e| kind(e) == "text_delta").count() >= 2, "{expected:?}");
    let view = cli_json(home, &["chat", "show", &id]).await?;
    let ms = messages(&view);
    assert_eq!(ms.len(), 2, "{view}");
    assert_eq!((ms[0].0.as_str(), ms[0].2.as_str()), ("user", first_text.as_str()), "{view}");
    assert_eq!((ms[1].0.as_str(), ms[1].1.as_str()), ("assistant", "interrupted"), "{view}");
    assert_eq!(ms[1].2, partial, "the partial text is kept as it streamed");
    let queue = cli_json(home, &["chat", "pending", &id]).await?;
    assert_eq!(
        (pending_texts(&queue), &queue["paused"]),
        (vec![second.to_owned(), third.to_owned()], &Value::Bool(true))
    );
    // The human watcher showed the stop.
    human.wait_stdout("the interrupted line", TURN_TIMEOUT, |o| o.contains("■ interrupted").then_some(())).await?;

    // 6. Resume: the two queued messages run in order, one turn each.
    let asked_before = fakes.prompts(agent).len();
    cli_ok(home, &["chat", "pending", &id, "--resume"]).await?;
    let after_stop = end["seq"].as_u64().context("seq")?;
    let later = late
        .wait_events("two more turns", TURN_TIMEOUT * 2, |es| {
            let after: Vec<Value> = es.iter().filter(|e| e["seq"].as_u64() > Some(after_stop)).cloned().collect();
            (after.iter().filter(|e| is_turn_end(e)).count() >= 2).then_some(after)
        })
        .await?;
    let created: Vec<String> = later
        .iter()
        .filter(|e| kind(e) == "message_created" && e["message_created"]["message"]["role"] == "user")
        .map(|e| message_text(&e["message_created"]["message"]))
        .collect();
    assert_eq!(created, [second, third], "in order: {later:?}");
    let sources: Vec<&Value> = later
        .iter()
        .filter(|e| kind(e) == "message_created")
        .map(|e| &e["message_created"]["message"]["source"])
        .collect();
    assert!(sources.iter().all(|s| *s == "cli"), "resumed messages still say they came from the CLI: {sources:?}");
    let ends: Vec<&Value> = later.iter().filter(|e| is_turn_end(e)).collect();
    assert!(ends.iter().all(|e| kind(e) == "turn_done"), "{ends:?}");
    assert_ne!(ends[0]["turn_id"], ends[1]["turn_id"], "one turn each");
    for (end, want) in ends.iter().zip(["second answer", "third answer"]) {
        let turn: Vec<Value> = later.iter().filter(|e| e["turn_id"] == end["turn_id"]).cloned().collect();
        assert_eq!(streamed(&turn), want, "{turn:?}");
    }
    let prompts = fakes.prompts(agent);
    let asked: Vec<&String> = prompts[asked_before..].iter().collect();
    assert_eq!(asked, [second, third], "the model was asked each queued message alone, in order");

    // 7. A Coffer tool through the attached gateway: the watcher shows the call and its result,
    // the invocation log has it.
    let out = tokio::time::timeout(TURN_TIMEOUT * 2, home.cli(&["chat", "send", &id, agent.tool_prompt(), "--watch"]))
        .await??;
    ensure!(out.success(), "{out}\n{}", home.diagnostics());
    assert!(out.stdout.contains("coffer__search_tools({\"query\":\"echo\"})"), "the call on one line: {out}");
    assert!(out.stdout.lines().any(|l| l.starts_with("↳ ") && l.contains("tiny__echo")), "its result: {out}");
    assert!(out.stdout.contains("Tool result:") && out.stdout.contains("✓ done"), "{out}");
    let tool_turn = late
        .wait_events("the tool turn on the watcher", TURN_TIMEOUT, |es| {
            let call = es.iter().find(|e| {
                kind(e) == "tool_call" && e["tool_call"]["name"].as_str().is_some_and(|n| n.ends_with("search_tools"))
            })?;
            let result = es.iter().find(|e| {
                kind(e) == "tool_result" && e["tool_result"]["tool_use_id"] == call["tool_call"]["tool_use_id"]
            })?;
            es.iter().any(|e| is_turn_end(e) && e["turn_id"] == call["turn_id"]).then(|| (call.clone(), result.clone()))
        })
        .await?;
    let (call, result) = tool_turn;
    assert_eq!(call["tool_call"]["input"]["query"], "echo", "{call}");
    assert_eq!(result["tool_result"]["is_error"], false, "{result}");
    assert!(result["tool_result"]["output"].as_str().is_some_and(|o| o.contains("tiny__echo")), "{result}");
    let api = home.api()?;
    let rows = wait_for("the search in the invocation log", Duration::from_secs(20), || async {
        let v = api.get("/v1/invocations?target=coffer__search_tools").reply().await?.ok_json()?;
        let rows = v["items"].as_array().cloned().unwrap_or_default();
        Ok((!rows.is_empty()).then_some(rows))
    })
    .await?;
    assert_eq!(rows[0]["outcome"], "ok", "{rows:?}");

    // 8. Restart the daemon: everything is kept, and the next message resumes the agent's
    // session with its history.
    let before = cli_json(home, &["chat", "show", &id, "--messages", "50"]).await?;
    let session = before["conversation"]["agent_config"]["session_id"].as_str().unwrap_or("").to_owned();
    assert!(!session.is_empty(), "the agent's session is stored: {before}");
    assert_eq!(messages(&before).len(), 8, "{before}");
    drop(human);
    cli_ok(home, &["daemon", "restart"]).await?;
    let after = cli_json(home, &["chat", "show", &id, "--messages", "50"]).await?;
    assert_eq!(after["messages"], before["messages"], "every message kept");
    assert_eq!(after["conversation"]["agent_config"], before["conversation"]["agent_config"]);
    let (_, asked_before) = fakes.history(agent);
    let out =
        tokio::time::timeout(TURN_TIMEOUT * 2, home.cli(&["chat", "send", &id, "SAY[after the restart]", "--watch"]))
            .await??;
    ensure!(out.success(), "{out}\n{}", home.diagnostics());
    assert!(out.stdout.contains("after the restart") && out.stdout.contains("✓ done"), "{out}");
    let (history, asked) = fakes.history(agent);
    assert!(fakes.last_body(agent).contains(&session), "the model request belongs to the resumed session {session}");
    assert!(asked > asked_before, "the model was asked again");
    let history = history.join("\n");
    for earlier in [second, third, "SAY[after the restart]"] {
        assert!(history.contains(earlier), "the resumed session carries {earlier:?}: {history}");
    }
    let last = cli_json(home, &["chat", "show", &id, "--messages", "50"]).await?;
    assert_eq!(last["conversation"]["agent_config"]["session_id"], session.as_str(), "the same session resumed");
    let ms = messages(&last);
    assert_eq!(ms.len(), 10, "{last}");
    assert_eq!(ms[9], ("assistant".into(), "complete".into(), "after the restart".into()));
    // The watcher attached before the restart followed across it: no event twice, none after
    // the restart older than those before.
    let watched = late
        .wait_events("the watcher to see the turn after the restart", TURN_TIMEOUT, |es| {
            es.iter().any(|e| streamed(std::slice::from_ref(e)).contains("restart")).then(|| es.to_vec())
        })
        .await?;
    let seqs: Vec<u64> = watched.iter().filter_map(|e| e["seq"].as_u64()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "seq strictly increasing across the restart: {seqs:?}");
    drop(late);
    Ok(())
}
