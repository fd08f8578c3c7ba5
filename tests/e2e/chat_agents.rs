//! The chat service's agent providers driven directly (no turn engine): the real Claude Code and
//! Codex CLIs from `tests/peers/` on the scripted fake model APIs (`coffer_tests::script`), each
//! turn started with `start_turn` on a real `AgentEnv` in a temporary `COFFER_HOME` and its events
//! collected: streamed text, resume and model, tool calls (one through Coffer's attached gateway
//! on a real daemon), API errors, interrupt of a hung turn (its process group gone), a missing
//! CLI, a CLI printing junk and one exiting mid-turn.
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use coffer_chat::adapter::{
    AgentConfig, AgentEnv, AgentEvent, AgentProvider, Availability, FailureKind, INTERRUPT_GRACE, RunningTurn,
    TurnInput,
};
use coffer_chat::claude_code::ClaudeCode;
use coffer_chat::codex::Codex;
use coffer_tests::anthropic::FakeAnthropic;
use coffer_tests::mcp::register_stdio;
use coffer_tests::openai::FakeOpenAi;
use coffer_tests::{TestHome, bin, wait_for};
use tokio::sync::mpsc;

/// The conversation every bench turn belongs to.
const CONVERSATION: &str = "01JCONVERSATION";
/// How long a turn of a real CLI on a fake model may take on the loaded 2-core machine.
const TURN_TIMEOUT: Duration = Duration::from_secs(90);

/// A provider's test bench: a home, the `AgentEnv` over it and a working directory.
struct Bench {
    home: TestHome,
    env: AgentEnv,
    cwd: PathBuf,
}

impl Bench {
    /// A bench on a home with a running daemon: the agent's attached shim finds it (without one
    /// the shim would start a daemon, whose orphan sweep ends the agent that started it: its pid
    /// record is in the home). In the chat service a daemon always runs.
    async fn new(command: Option<PathBuf>) -> anyhow::Result<Self> {
        let home = TestHome::new()?;
        home.start_daemon().await?;
        Self::on(home, command)
    }

    /// A bench without a daemon, for stand-in CLIs that start no shim.
    fn bare(command: Option<PathBuf>) -> anyhow::Result<Self> {
        Self::on(TestHome::new()?, command)
    }

    fn on(home: TestHome, command: Option<PathBuf>) -> anyhow::Result<Self> {
        let cwd = home.temp().join("workspace");
        std::fs::create_dir_all(&cwd)?;
        let env = AgentEnv {
            coffer_home: home.root().to_path_buf(),
            agents_dir: home.root().join("agents"),
            shim: bin("coffer-mcp-shim")?,
            command_override: command,
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

    fn input(&self, text: &str, config: AgentConfig) -> TurnInput {
        TurnInput {
            conversation_id: CONVERSATION.into(),
            turn_id: "01JTURN".into(),
            text: text.into(),
            config,
            attachments: Vec::new(),
        }
    }

    /// Starts a turn; the receiver of its events.
    fn start(
        &self,
        provider: &dyn AgentProvider,
        text: &str,
        config: AgentConfig,
    ) -> anyhow::Result<(RunningTurn, mpsc::Receiver<AgentEvent>)> {
        let (tx, rx) = mpsc::channel(1024);
        let running =
            provider.start_turn(&self.env, self.input(text, config), tx).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        Ok((running, rx))
    }

    /// Runs a turn to its terminal event; all its events, the terminal last.
    async fn turn(
        &self,
        provider: &dyn AgentProvider,
        text: &str,
        config: AgentConfig,
    ) -> anyhow::Result<Vec<AgentEvent>> {
        let (running, mut rx) = self.start(provider, text, config)?;
        let events = collect(&mut rx, &self.home).await?;
        tokio::time::timeout(Duration::from_secs(10), running.task).await??;
        Ok(events)
    }

    /// The pids of the agent processes recorded under `upstream-pids/`.
    fn agent_pids(&self) -> Vec<i32> {
        self.home.pid_records().into_iter().filter(|r| r.kind == "agent").map(|r| r.pid).collect()
    }
}

/// Receives events up to and including the terminal one.
async fn collect(rx: &mut mpsc::Receiver<AgentEvent>, home: &TestHome) -> anyhow::Result<Vec<AgentEvent>> {
    let mut events = Vec::new();
    let deadline = Instant::now() + TURN_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(event) = tokio::time::timeout(left, rx.recv()).await else {
            anyhow::bail!("no terminal event within {TURN_TIMEOUT:?}; so far {events:?}\n{}", home.diagnostics());
        };
        let Some(event) = event else {
            anyhow::bail!("the adapter ended without a terminal event: {events:?}");
        };
        let terminal = matches!(event, AgentEvent::Done { .. } | AgentEvent::Failed { .. });
        events.push(event);
        if terminal {
            return Ok(events);
        }
    }
}

fn text_of(events: &[AgentEvent]) -> String {
    events.iter().filter_map(|e| if let AgentEvent::TextDelta(t) = e { Some(t.as_str()) } else { None }).collect()
}

fn deltas(events: &[AgentEvent]) -> usize {
    events.iter().filter(|e| matches!(e, AgentEvent::TextDelta(_))).count()
}

fn session(events: &[AgentEvent]) -> Option<String> {
    events
        .iter()
        .find_map(|e| if let AgentEvent::Session { session_id, .. } = e { Some(session_id.clone()) } else { None })
}

fn failure(events: &[AgentEvent]) -> Option<(FailureKind, String)> {
    match events.last() {
        Some(AgentEvent::Failed { kind, message }) => Some((*kind, message.clone())),
        _ => None,
    }
}

/// Whether any process of group `pgid` is left.
fn group_alive(pgid: i32) -> bool {
    nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), None).is_ok()
}

/// A small executable shell script in the bench's temp dir standing in for an agent CLI.
fn script(dir: &Path, name: &str, body: &str) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n"))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    Ok(path)
}

// ------------------------------------------------------------------------------- Claude Code

/// Claude Code offline on `model` with a private config dir, no retries (a 401/500 would be
/// retried for minutes otherwise) and its non-essential traffic off.
fn claude(bench: &Bench, model: &FakeAnthropic) -> ClaudeCode {
    let home = bench.user_home();
    let vars: Vec<(OsString, OsString)> = vec![
        ("HOME".into(), home.clone().into()),
        ("CLAUDE_CONFIG_DIR".into(), home.join(".claude").into()),
        // The home's private TMPDIR: /tmp is an ancestor of this COFFER_HOME (vault sandbox).
        ("TMPDIR".into(), bench.home.env()["TMPDIR"].clone().into()),
        ("ANTHROPIC_BASE_URL".into(), model.url.clone().into()),
        ("ANTHROPIC_API_KEY".into(), "sk-ant-test-not-a-real-key".into()),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".into(), "1".into()),
        ("DISABLE_TELEMETRY".into(), "1".into()),
        ("DISABLE_AUTOUPDATER".into(), "1".into()),
        ("DISABLE_ERROR_REPORTING".into(), "1".into()),
        ("CLAUDE_CODE_MAX_RETRIES".into(), "0".into()),
    ];
    ClaudeCode::with_env(vars)
}

async fn claude_bench() -> anyhow::Result<Bench> {
    Bench::new(Some(coffer_tests::peers::claude_code()?)).await
}

#[tokio::test]
async fn claude_code_streams_text_token_by_token_then_resumes_its_session_with_the_model() -> anyhow::Result<()> {
    let bench = claude_bench().await?;
    let model = FakeAnthropic::scripted().await?;
    let provider = claude(&bench, &model);
    assert!(matches!(provider.availability(&bench.env), Availability::Available { .. }));

    let started = Instant::now();
    let (running, mut rx) = bench.start(&provider, "SAY[one two three four five]", bench.config("", ""))?;
    let first = tokio::time::timeout(TURN_TIMEOUT, rx.recv()).await?;
    let to_session = started.elapsed();
    let mut events: Vec<AgentEvent> = first.into_iter().collect();
    if !matches!(events.last(), Some(AgentEvent::Done { .. } | AgentEvent::Failed { .. })) {
        events.extend(collect(&mut rx, &bench.home).await?);
    }
    let took = started.elapsed();
    running.task.await?;
    assert_eq!(text_of(&events), "one two three four five", "{events:?}");
    assert!(deltas(&events) > 1, "token by token: {events:?}");
    let id = session(&events).expect("a session event first");
    assert!(matches!(events.first(), Some(AgentEvent::Session { .. })), "{events:?}");
    let Some(AgentEvent::Done { stop_reason, usage, .. }) = events.last() else { panic!("{events:?}") };
    assert_eq!(stop_reason, "end_turn");
    assert!(usage.output_tokens > 0, "{usage:?}");
    // The process is kept for the conversation's next turn.
    let first_pid = provider.parked_pid(CONVERSATION).expect("a parked process");
    assert_eq!(bench.agent_pids(), [first_pid]);
    eprintln!("claude_code turn 1: session after {to_session:?}, done after {took:?}");

    // The second turn asks for another model: a fresh process resumes the session with it; the
    // fake sees the history.
    let started = Instant::now();
    let events = bench.turn(&provider, "SAY[second answer]", bench.config(&id, "claude-fake-model")).await?;
    eprintln!("claude_code turn 2 (new model, fresh --resume process): done after {:?}", started.elapsed());
    // Dropped (SIGKILL to its group) when the turn did not fit it; reaped in the background.
    wait_for("the first process to end", Duration::from_secs(10), || async {
        Ok((!group_alive(first_pid)).then_some(()))
    })
    .await?;
    assert_eq!(text_of(&events), "second answer", "{events:?}");
    assert_eq!(session(&events).as_deref(), Some(id.as_str()), "resumed: {events:?}");
    let Some(AgentEvent::Done { model: used, .. }) = events.last() else { panic!("{events:?}") };
    assert_eq!(used.as_deref(), Some("claude-fake-model"));
    let last = model.turns().pop().expect("a model request");
    assert_eq!(last.body["model"], "claude-fake-model");
    let history = last.body["messages"].to_string();
    assert!(history.contains("one two three four five") && history.contains("SAY[second answer]"), "{history}");

    // The third turn, same session and model, reuses the parked process.
    let second_pid = provider.parked_pid(CONVERSATION).expect("a parked process");
    let started = Instant::now();
    let events = bench.turn(&provider, "SAY[third answer]", bench.config(&id, "claude-fake-model")).await?;
    eprintln!("claude_code turn 3 (parked process): done after {:?}", started.elapsed());
    assert_eq!(text_of(&events), "third answer", "{events:?}");
    assert_eq!(session(&events).as_deref(), Some(id.as_str()));
    assert_eq!(provider.parked_pid(CONVERSATION), Some(second_pid), "the same process");
    let history = model.turns().pop().expect("a model request").body["messages"].to_string();
    assert!(history.contains("second answer") && history.contains("SAY[third answer]"), "{history}");
    // Deleting the conversation ends it.
    provider.forget(&bench.env, CONVERSATION);
    wait_for("the parked process to end", Duration::from_secs(10), || async {
        Ok((!group_alive(second_pid)).then_some(()))
    })
    .await?;
    assert!(bench.agent_pids().is_empty(), "{:?}", bench.agent_pids());
    Ok(())
}

#[tokio::test]
async fn claude_code_tool_calls_and_api_errors_are_mapped() -> anyhow::Result<()> {
    let bench = claude_bench().await?;
    let model = FakeAnthropic::scripted().await?;
    let provider = claude(&bench, &model);

    let events =
        bench.turn(&provider, r#"TOOL[Bash {"command": "echo coffer-was-here"}]"#, bench.config("", "")).await?;
    let call = events.iter().find_map(|e| match e {
        AgentEvent::ToolCall { id, name, input } => Some((id.clone(), name.clone(), input.clone())),
        _ => None,
    });
    let (call_id, name, input) = call.unwrap_or_else(|| panic!("a tool call: {events:?}"));
    assert_eq!((name.as_str(), input["command"].as_str()), ("Bash", Some("echo coffer-was-here")));
    let result = events.iter().find_map(|e| match e {
        AgentEvent::ToolResult { tool_use_id, output, is_error } if *tool_use_id == call_id => {
            Some((output.clone(), *is_error))
        }
        _ => None,
    });
    let (output, is_error) = result.unwrap_or_else(|| panic!("the call's result: {events:?}"));
    assert!(output.contains("coffer-was-here") && !is_error, "{output}");
    assert!(text_of(&events).contains("Tool result: coffer-was-here"), "{events:?}");
    assert!(matches!(events.last(), Some(AgentEvent::Done { .. })), "{events:?}");

    let events = bench.turn(&provider, "ERROR[401]", bench.config("", "")).await?;
    let (kind, message) = failure(&events).unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(kind, FailureKind::Auth, "{message}");
    assert!(message.contains("Anthropic API") && message.contains("401"), "{message}");
    assert!(!message.contains("sk-ant-test"), "no secret in the message: {message}");

    let events = bench.turn(&provider, "ERROR[500]", bench.config("", "")).await?;
    let (kind, message) = failure(&events).unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(kind, FailureKind::Provider, "{message}");
    assert!(message.contains("Anthropic API") && message.contains("500"), "{message}");

    let events = bench.turn(&provider, "MALFORMED", bench.config("", "")).await?;
    assert!(failure(&events).is_some(), "malformed events from the API fail the turn: {events:?}");
    assert!(bench.agent_pids().is_empty(), "{:?}", bench.agent_pids());
    Ok(())
}

#[tokio::test]
async fn claude_code_hung_turn_is_interrupted_and_its_process_group_is_gone() -> anyhow::Result<()> {
    let bench = claude_bench().await?;
    let model = FakeAnthropic::scripted().await?;
    let provider = claude(&bench, &model);
    // A first turn parks its process; the hung turn runs on it.
    let events = bench.turn(&provider, "SAY[ready]", bench.config("", "")).await?;
    let id = session(&events).unwrap_or_else(|| panic!("{events:?}"));
    let parked = provider.parked_pid(CONVERSATION).expect("a parked process");
    let asked_before = model.turns().len();
    let (running, mut rx) = bench.start(&provider, "HANG", bench.config(&id, ""))?;
    wait_for("the hung request at the fake", TURN_TIMEOUT, || async {
        Ok((model.turns().len() > asked_before).then_some(()))
    })
    .await?;
    let pids = bench.agent_pids();
    assert_eq!(pids, [parked], "the parked claude process runs the turn");
    assert!(group_alive(pids[0]));
    let asked = Instant::now();
    let _ = running.interrupt.send(());
    let events = collect(&mut rx, &bench.home).await?;
    let took = asked.elapsed();
    running.task.await?;
    let Some(AgentEvent::Done { stop_reason, .. }) = events.last() else { panic!("{events:?}") };
    assert_eq!(stop_reason, "interrupted");
    assert!(took < INTERRUPT_GRACE * 3, "interrupt took {took:?}");
    assert!(!group_alive(pids[0]), "process group {} is gone", pids[0]);
    assert!(bench.agent_pids().is_empty());
    assert_eq!(provider.parked_pid(CONVERSATION), None, "an interrupted process is not kept");
    eprintln!("claude_code interrupt of a hung turn: done after {took:?}");
    Ok(())
}

#[tokio::test]
async fn nobody_listening_any_more_stops_a_slow_claude_turn() -> anyhow::Result<()> {
    let bench = claude_bench().await?;
    let model = FakeAnthropic::scripted().await?;
    let provider = claude(&bench, &model);
    let (running, mut rx) = bench.start(
        &provider,
        "SLOW[400] SAY[a slow answer of many words that takes seconds]",
        bench.config("", ""),
    )?;
    // The first token arrives; the rest would take several seconds.
    let first_text = async {
        while let Some(e) = rx.recv().await {
            if matches!(e, AgentEvent::TextDelta(_)) {
                return Some(e);
            }
        }
        None
    };
    let first = tokio::time::timeout(TURN_TIMEOUT, first_text).await?;
    assert_eq!(first, Some(AgentEvent::TextDelta("a ".into())));
    let pids = bench.agent_pids();
    assert_eq!(pids.len(), 1, "{pids:?}");
    let dropped = Instant::now();
    drop(rx);
    tokio::time::timeout(INTERRUPT_GRACE * 3, running.task).await??;
    assert!(!group_alive(pids[0]), "process group {} is gone", pids[0]);
    eprintln!("claude_code stopped {:?} after its listener went", dropped.elapsed());
    Ok(())
}

#[tokio::test]
async fn a_missing_junk_printing_or_dying_claude_cli_is_reported() -> anyhow::Result<()> {
    let bench = Bench::bare(None)?;
    // Missing: no `claude` on PATH, or a settings path that does not exist.
    let empty = bench.home.temp().join("empty-bin");
    std::fs::create_dir_all(&empty)?;
    let provider = ClaudeCode::with_env([("PATH", empty.as_os_str())]);
    let Availability::Unavailable { reason } = provider.availability(&bench.env) else { panic!("available?") };
    assert!(reason.contains("claude") && reason.contains("chat.claude_code_path"), "{reason}");
    let err = provider.start_turn(&bench.env, bench.input("hi", bench.config("", "")), mpsc::channel(8).0).unwrap_err();
    assert_eq!(err.kind, FailureKind::CliMissing, "{err:?}");
    let missing = AgentEnv { command_override: Some(bench.home.temp().join("nope/claude")), ..bench.env.clone() };
    let Availability::Unavailable { reason } = ClaudeCode::new().availability(&missing) else { panic!() };
    assert!(reason.contains("nope/claude"), "{reason}");

    // Junk on stdout: a protocol failure naming it, and the process is ended.
    let junk = script(bench.home.temp(), "junk-claude", "echo 'Welcome to Claude!'\nexec sleep 60")?;
    let env = AgentEnv { command_override: Some(junk), ..bench.env.clone() };
    let b = Bench { env, ..Bench::bare(None)? };
    let events = b.turn(&ClaudeCode::new(), "hi", b.config("", "")).await?;
    let (kind, message) = failure(&events).unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(kind, FailureKind::Protocol, "{message}");
    assert!(message.contains("Welcome to Claude!"), "{message}");
    assert!(b.agent_pids().is_empty());

    // Exit mid-turn: the exit status and the last stderr line.
    let init = r#"{"type":"system","subtype":"init","session_id":"s-1","model":"m"}"#;
    let dying =
        script(bench.home.temp(), "dying-claude", &format!("echo '{init}'\necho 'fatal: out of cheese' >&2\nexit 3"))?;
    let b = Bench { env: AgentEnv { command_override: Some(dying), ..bench.env.clone() }, ..Bench::bare(None)? };
    let events = b.turn(&ClaudeCode::new(), "hi", b.config("", "")).await?;
    assert_eq!(session(&events).as_deref(), Some("s-1"));
    let (kind, message) = failure(&events).unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(kind, FailureKind::CliExited, "{message}");
    assert!(message.contains("exit status 3") && message.contains("fatal: out of cheese"), "{message}");
    Ok(())
}

#[tokio::test]
async fn claude_code_calls_a_coffer_tool_through_the_attached_gateway() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_stdio(&api, "tiny", &bin("coffer-tiny-upstream")?, &[], serde_json::json!({})).await?;
    let bench = Bench::on(home, Some(coffer_tests::peers::claude_code()?))?;
    let model = FakeAnthropic::scripted().await?;
    let provider = claude(&bench, &model);
    let tool = "mcp__coffer__coffer__search_tools";
    let events = bench.turn(&provider, &format!(r#"TOOL[{tool} {{"query": "echo"}}]"#), bench.config("", "")).await?;
    let call = events.iter().find_map(|e| match e {
        AgentEvent::ToolCall { id, name, .. } if name == tool => Some(id.clone()),
        _ => None,
    });
    let call = call.unwrap_or_else(|| panic!("a call of {tool}: {events:?}\n{}", bench.home.diagnostics()));
    let result = events.iter().find_map(|e| match e {
        AgentEvent::ToolResult { tool_use_id, output, is_error } if *tool_use_id == call => {
            Some((output.clone(), *is_error))
        }
        _ => None,
    });
    let (output, is_error) = result.unwrap_or_else(|| panic!("its result: {events:?}"));
    assert!(!is_error && output.contains("tiny__echo"), "Coffer's search found the upstream's tool: {output}");
    assert!(matches!(events.last(), Some(AgentEvent::Done { .. })), "{events:?}");
    // No secret in what Coffer wrote for the agent.
    let written = std::fs::read_to_string(bench.env.agents_dir.join("claude_code/mcp.json"))?;
    let token = bench.home.daemon_info()?.token;
    assert!(!written.contains(secrecy::ExposeSecret::expose_secret(&token)), "{written}");
    Ok(())
}

// ------------------------------------------------------------------------------------- Codex

/// Codex offline on `model`: the user's `~/.codex/config.toml` (in the test's private `HOME`)
/// names the fake as model provider `fake`, as a user's config names theirs; Coffer's own
/// `CODEX_HOME` is built from it.
fn codex(bench: &Bench, model: &FakeOpenAi) -> anyhow::Result<Codex> {
    let home = bench.user_home();
    coffer_tests::write_file(&home.join(".codex/config.toml"), model.codex_config("fake-model"))?;
    let vars: Vec<(OsString, OsString)> = vec![
        ("HOME".into(), home.into()),
        ("TMPDIR".into(), bench.home.env()["TMPDIR"].clone().into()),
        ("OPENAI_API_KEY".into(), "sk-test-not-a-real-key".into()),
    ];
    Ok(Codex::with_env(vars))
}

async fn codex_bench() -> anyhow::Result<Bench> {
    Bench::new(Some(coffer_tests::peers::codex()?)).await
}

#[tokio::test]
async fn codex_streams_text_token_by_token_then_resumes_its_thread_with_the_model() -> anyhow::Result<()> {
    let bench = codex_bench().await?;
    let model = FakeOpenAi::start().await?;
    let provider = codex(&bench, &model)?;
    assert!(matches!(provider.availability(&bench.env), Availability::Available { .. }));

    let started = Instant::now();
    let (running, mut rx) = bench.start(&provider, "SAY[one two three four five]", bench.config("", ""))?;
    let first = tokio::time::timeout(TURN_TIMEOUT, rx.recv()).await?;
    let to_session = started.elapsed();
    let mut events: Vec<AgentEvent> = first.into_iter().collect();
    if !matches!(events.last(), Some(AgentEvent::Done { .. } | AgentEvent::Failed { .. })) {
        events.extend(collect(&mut rx, &bench.home).await?);
    }
    let took = started.elapsed();
    running.task.await?;
    assert_eq!(text_of(&events), "one two three four five", "{events:?}\n{}", bench.home.diagnostics());
    assert!(deltas(&events) > 1, "token by token: {events:?}");
    let id = session(&events).expect("a session event");
    assert!(matches!(events.first(), Some(AgentEvent::Session { .. })), "{events:?}");
    let Some(AgentEvent::Done { stop_reason, usage, model: used }) = events.last() else { panic!("{events:?}") };
    assert_eq!((stop_reason.as_str(), used.as_deref()), ("end_turn", Some("fake-model")));
    assert_eq!((usage.input_tokens, usage.cache_read_tokens), (16, 4), "{usage:?}");
    let first_pid = provider.parked_pid(CONVERSATION).expect("the app-server is kept");
    assert_eq!(bench.agent_pids(), [first_pid]);
    eprintln!("codex turn 1: session after {to_session:?}, done after {took:?}");

    // The second turn resumes the thread with another model; the fake sees the history.
    let started = Instant::now();
    let events = bench.turn(&provider, "SAY[second answer]", bench.config(&id, "other-model")).await?;
    eprintln!("codex turn 2 (new model, fresh app-server, thread/resume): done after {:?}", started.elapsed());
    wait_for("the first app-server to end", Duration::from_secs(10), || async {
        Ok((!group_alive(first_pid)).then_some(()))
    })
    .await?;
    assert_eq!(text_of(&events), "second answer", "{events:?}");
    assert_eq!(session(&events).as_deref(), Some(id.as_str()), "resumed: {events:?}");
    let last = model.requests().pop().expect("a model request");
    assert_eq!(last.body["model"], "other-model");
    let texts = last.user_texts().join("\n");
    assert!(texts.contains("SAY[one two three four five]") && texts.contains("SAY[second answer]"), "{texts}");
    // Coffer's CODEX_HOME holds the user's provider and Coffer's server, and no secret.
    let config = std::fs::read_to_string(bench.env.agents_dir.join("codex/config.toml"))?;
    assert!(config.contains("[model_providers.fake]") && config.contains("[mcp_servers.coffer]"), "{config}");
    assert!(!config.contains("sk-test"), "{config}");

    // The third turn, same thread and model, runs on the kept app-server.
    let second_pid = provider.parked_pid(CONVERSATION).expect("the app-server is kept");
    let started = Instant::now();
    let events = bench.turn(&provider, "SAY[third answer]", bench.config(&id, "other-model")).await?;
    eprintln!("codex turn 3 (kept app-server): done after {:?}", started.elapsed());
    assert_eq!(text_of(&events), "third answer", "{events:?}");
    assert_eq!(session(&events).as_deref(), Some(id.as_str()));
    assert_eq!(provider.parked_pid(CONVERSATION), Some(second_pid), "the same app-server");
    let texts = model.requests().pop().expect("a model request").user_texts().join("\n");
    assert!(texts.contains("SAY[second answer]") && texts.contains("SAY[third answer]"), "{texts}");
    provider.forget(&bench.env, CONVERSATION);
    wait_for("the kept app-server to end", Duration::from_secs(10), || async {
        Ok((!group_alive(second_pid)).then_some(()))
    })
    .await?;
    assert!(bench.agent_pids().is_empty(), "{:?}", bench.agent_pids());
    Ok(())
}

#[tokio::test]
async fn codex_tool_calls_and_api_errors_are_mapped() -> anyhow::Result<()> {
    let bench = codex_bench().await?;
    let model = FakeOpenAi::start().await?;
    let provider = codex(&bench, &model)?;

    let events =
        bench.turn(&provider, r#"TOOL[exec_command {"cmd": "echo coffer-was-here"}]"#, bench.config("", "")).await?;
    let tools = model.requests().first().map(|r| r.tools().join(", ")).unwrap_or_default();
    let call = events.iter().find_map(|e| match e {
        AgentEvent::ToolCall { id, name, input } => Some((id.clone(), name.clone(), input.clone())),
        _ => None,
    });
    let (call_id, name, input) = call.unwrap_or_else(|| panic!("a tool call: {events:?}\ntools offered: {tools}"));
    assert_eq!(name, "shell");
    assert!(input["command"].as_str().is_some_and(|c| c.contains("echo coffer-was-here")), "{input}");
    let result = events.iter().find_map(|e| match e {
        AgentEvent::ToolResult { tool_use_id, output, is_error } if *tool_use_id == call_id => {
            Some((output.clone(), *is_error))
        }
        _ => None,
    });
    let (output, is_error) = result.unwrap_or_else(|| panic!("the call's result: {events:?}"));
    assert!(output.contains("coffer-was-here") && !is_error, "{output}");
    assert!(text_of(&events).contains("coffer-was-here"), "{events:?}");
    assert!(matches!(events.last(), Some(AgentEvent::Done { .. })), "{events:?}");

    for (status, want) in [(401, FailureKind::Auth), (500, FailureKind::Provider)] {
        let events = bench.turn(&provider, &format!("ERROR[{status}]"), bench.config("", "")).await?;
        let (kind, message) = failure(&events).unwrap_or_else(|| panic!("{events:?}"));
        assert_eq!(kind, want, "{message}");
        assert!(message.contains("`fake`") && message.contains(&status.to_string()), "{message}");
        assert!(!message.contains("sk-test"), "no secret in the message: {message}");
    }
    let events = bench.turn(&provider, "MALFORMED", bench.config("", "")).await?;
    assert!(failure(&events).is_some(), "malformed events from the API fail the turn: {events:?}");
    assert!(bench.agent_pids().is_empty(), "{:?}", bench.agent_pids());
    Ok(())
}

#[tokio::test]
async fn codex_hung_turn_is_interrupted_and_its_process_group_is_gone() -> anyhow::Result<()> {
    let bench = codex_bench().await?;
    let model = FakeOpenAi::start().await?;
    let provider = codex(&bench, &model)?;
    // A first turn keeps its app-server; the hung turn runs on it.
    let events = bench.turn(&provider, "SAY[ready]", bench.config("", "")).await?;
    let id = session(&events).unwrap_or_else(|| panic!("{events:?}"));
    let parked = provider.parked_pid(CONVERSATION).expect("a kept app-server");
    let asked_before = model.requests().len();
    let (running, mut rx) = bench.start(&provider, "HANG", bench.config(&id, ""))?;
    wait_for("the hung request at the fake", TURN_TIMEOUT, || async {
        Ok((model.requests().len() > asked_before).then_some(()))
    })
    .await?;
    let pids = bench.agent_pids();
    assert_eq!(pids, [parked], "the kept app-server runs the turn");
    let asked = Instant::now();
    let _ = running.interrupt.send(());
    let events = collect(&mut rx, &bench.home).await?;
    let took = asked.elapsed();
    running.task.await?;
    let Some(AgentEvent::Done { stop_reason, .. }) = events.last() else { panic!("{events:?}") };
    assert_eq!(stop_reason, "interrupted");
    assert!(took < INTERRUPT_GRACE * 3, "interrupt took {took:?}");
    assert!(!group_alive(pids[0]), "process group {} is gone", pids[0]);
    assert_eq!(provider.parked_pid(CONVERSATION), None, "an interrupted app-server is not kept");
    eprintln!("codex interrupt of a hung turn: done after {took:?}");
    Ok(())
}

#[tokio::test]
async fn a_missing_junk_printing_or_dying_codex_cli_is_reported() -> anyhow::Result<()> {
    let bench = Bench::bare(None)?;
    let empty = bench.home.temp().join("empty-bin");
    std::fs::create_dir_all(&empty)?;
    let provider = Codex::with_env([("PATH", empty.as_os_str()), ("HOME", bench.user_home().as_os_str())]);
    let Availability::Unavailable { reason } = provider.availability(&bench.env) else { panic!("available?") };
    assert!(
        reason.contains("codex") && reason.contains("chat.codex_path") && reason.contains("@openai/codex"),
        "{reason}"
    );
    let err = provider.start_turn(&bench.env, bench.input("hi", bench.config("", "")), mpsc::channel(8).0).unwrap_err();
    assert_eq!(err.kind, FailureKind::CliMissing, "{err:?}");

    let home = [("HOME", bench.user_home().into_os_string())];
    let junk = script(bench.home.temp(), "junk-codex", "echo 'codex 0.0 ready'\nexec sleep 60")?;
    let b = Bench { env: AgentEnv { command_override: Some(junk), ..bench.env.clone() }, ..Bench::bare(None)? };
    let events = b.turn(&Codex::with_env(home.clone()), "hi", b.config("", "")).await?;
    let (kind, message) = failure(&events).unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(kind, FailureKind::Protocol, "{message}");
    assert!(message.contains("codex 0.0 ready"), "{message}");
    assert!(b.agent_pids().is_empty());

    // Answers `initialize`, then dies.
    let body = r#"read line; echo '{"id":1,"result":{"userAgent":"x"}}'; echo 'panicked: out of cheese' >&2; exit 3"#;
    let dying = script(bench.home.temp(), "dying-codex", body)?;
    let b = Bench { env: AgentEnv { command_override: Some(dying), ..bench.env.clone() }, ..Bench::bare(None)? };
    let events = b.turn(&Codex::with_env(home), "hi", b.config("", "")).await?;
    let (kind, message) = failure(&events).unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(kind, FailureKind::CliExited, "{message}");
    assert!(message.contains("exit status 3") && message.contains("panicked: out of cheese"), "{message}");
    Ok(())
}

#[tokio::test]
async fn codex_calls_a_coffer_tool_through_the_attached_gateway() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_stdio(&api, "tiny", &bin("coffer-tiny-upstream")?, &[], serde_json::json!({})).await?;
    let bench = Bench::on(home, Some(coffer_tests::peers::codex()?))?;
    let model = FakeOpenAi::start().await?;
    let provider = codex(&bench, &model)?;
    let events = bench.turn(&provider, r#"TOOL[coffer__search_tools {"query": "echo"}]"#, bench.config("", "")).await?;
    let tools = model.requests().first().map(|r| r.tools().join(", ")).unwrap_or_default();
    let call = events.iter().find_map(|e| match e {
        AgentEvent::ToolCall { id, name, .. } if name.ends_with("search_tools") => Some((id.clone(), name.clone())),
        _ => None,
    });
    let (call, name) = call.unwrap_or_else(|| {
        panic!("a call of search_tools: {events:?}\ntools offered: {tools}\n{}", bench.home.diagnostics())
    });
    assert_eq!(name, "mcp__coffer__coffer__search_tools");
    let result = events.iter().find_map(|e| match e {
        AgentEvent::ToolResult { tool_use_id, output, is_error } if *tool_use_id == call => {
            Some((output.clone(), *is_error))
        }
        _ => None,
    });
    let (output, is_error) = result.unwrap_or_else(|| panic!("its result: {events:?}"));
    assert!(!is_error && output.contains("tiny__echo"), "Coffer's search found the upstream's tool: {output}");
    assert!(matches!(events.last(), Some(AgentEvent::Done { .. })), "{events:?}");
    Ok(())
}

// ------------------------------------------------------------- per turn or kept alive

/// A JSON-lines child driven by hand (the kept-alive alternative the adapters do not take).
struct LineChild {
    /// Held so that dropping the driver kills the process (`kill_on_drop`).
    _child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl LineChild {
    fn start(
        home: &TestHome,
        program: &Path,
        args: &[&str],
        env: &[(&str, &std::ffi::OsStr)],
        cwd: &Path,
    ) -> anyhow::Result<Self> {
        use std::process::Stdio;
        let mut cmd = home.command(program);
        cmd.args(args).current_dir(cwd).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut cmd = tokio::process::Command::from(cmd);
        cmd.kill_on_drop(true);
        let mut child = cmd.spawn()?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        Ok(Self { _child: child, stdin, lines: tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout)) })
    }

    async fn send(&mut self, v: serde_json::Value) -> anyhow::Result<()> {
        use tokio::io::AsyncWriteExt;
        self.stdin.write_all(format!("{v}\n").as_bytes()).await?;
        Ok(self.stdin.flush().await?)
    }

    /// Reads lines until `pred` holds for one; returns it.
    async fn until(&mut self, pred: impl Fn(&serde_json::Value) -> bool) -> anyhow::Result<serde_json::Value> {
        let read = async {
            while let Some(line) = self.lines.next_line().await? {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line)
                    && pred(&v)
                {
                    return Ok(v);
                }
            }
            anyhow::bail!("stdout ended")
        };
        tokio::time::timeout(TURN_TIMEOUT, read).await?
    }
}

/// The numbers behind "one process per turn": a turn's full time with a fresh, resuming process
/// (what the adapters do) against a second turn on a process kept alive from the first.
#[tokio::test]
async fn agent_start_up_cost_per_turn_against_a_kept_alive_process() -> anyhow::Result<()> {
    use serde_json::json;
    // Codex: app-server kept alive, turn 2 on the same thread.
    let bench = codex_bench().await?;
    let model = FakeOpenAi::start().await?;
    let provider = codex(&bench, &model)?;
    let codex_home = provider.prepare_home(&bench.env).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let env = [
        ("CODEX_HOME", codex_home.as_os_str()),
        ("OPENAI_API_KEY", std::ffi::OsStr::new("sk-test")),
        ("HOME", std::ffi::OsStr::new(&bench.home.env()["HOME"])),
    ];
    let started = Instant::now();
    let mut c = LineChild::start(&bench.home, &coffer_tests::peers::codex()?, &["app-server"], &env, &bench.cwd)?;
    c.send(json!({"id": 1, "method": "initialize", "params": {"clientInfo": {"name": "t", "version": "0"}}})).await?;
    c.until(|v| v["id"] == 1).await?;
    c.send(json!({"method": "initialized"})).await?;
    let cwd = bench.cwd.display().to_string();
    c.send(json!({"id": 2, "method": "thread/start", "params": {"cwd": cwd, "approvalPolicy": "never", "sandbox": "danger-full-access"}})).await?;
    let thread = c.until(|v| v["id"] == 2).await?["result"]["thread"]["id"].as_str().unwrap_or_default().to_owned();
    let handshake = started.elapsed();
    let turn = |id: u64, text: &str| json!({"id": id, "method": "turn/start", "params": {"threadId": thread, "input": [{"type": "text", "text": text}]}});
    c.send(turn(3, "SAY[first]")).await?;
    c.until(|v| v["method"] == "turn/completed").await?;
    let t = Instant::now();
    c.send(turn(4, "SAY[second]")).await?;
    let done = c.until(|v| v["method"] == "turn/completed").await?;
    let kept_alive = t.elapsed();
    assert_eq!(done["params"]["turn"]["status"], "completed", "{done}");
    drop(c);
    let t = Instant::now();
    let events = bench.turn(&provider, "SAY[third]", bench.config(&thread, "")).await?;
    let per_turn = t.elapsed();
    assert_eq!(text_of(&events), "third", "{events:?}");
    eprintln!(
        "codex: app-server start + initialize + thread/start {handshake:?}; a turn on a kept-alive app-server {kept_alive:?}; \
         a turn with a fresh app-server (start, initialize, thread/resume, turn) {per_turn:?}"
    );

    // Claude Code: one process fed two messages, against a fresh `--resume` process.
    let bench = claude_bench().await?;
    let model = FakeAnthropic::scripted().await?;
    let provider = claude(&bench, &model);
    let user_home = bench.user_home();
    let config_dir = user_home.join(".claude");
    let env = [
        ("HOME", user_home.as_os_str()),
        ("CLAUDE_CONFIG_DIR", config_dir.as_os_str()),
        ("ANTHROPIC_BASE_URL", std::ffi::OsStr::new(&model.url)),
        ("ANTHROPIC_API_KEY", std::ffi::OsStr::new("sk-ant-test")),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", std::ffi::OsStr::new("1")),
        ("DISABLE_AUTOUPDATER", std::ffi::OsStr::new("1")),
        ("IS_SANDBOX", std::ffi::OsStr::new("1")),
    ];
    let args = [
        "-p",
        "--input-format",
        "stream-json",
        "--output-format",
        "stream-json",
        "--verbose",
        "--permission-mode",
        "bypassPermissions",
    ];
    let user = |text: &str| json!({"type": "user", "message": {"role": "user", "content": [{"type": "text", "text": text}]}, "parent_tool_use_id": null, "session_id": ""});
    let started = Instant::now();
    let mut c = LineChild::start(&bench.home, &coffer_tests::peers::claude_code()?, &args, &env, &bench.cwd)?;
    c.send(user("SAY[first]")).await?;
    let first = c.until(|v| v["type"] == "result").await?;
    let first_turn = started.elapsed();
    let session_id = first["session_id"].as_str().unwrap_or_default().to_owned();
    let t = Instant::now();
    c.send(user("SAY[second]")).await?;
    let second = c.until(|v| v["type"] == "result").await?;
    let kept_alive = t.elapsed();
    assert_eq!(second["result"], "second", "{second}");
    drop(c);
    let t = Instant::now();
    let events = bench.turn(&provider, "SAY[third]", bench.config(&session_id, "")).await?;
    let per_turn = t.elapsed();
    assert_eq!(text_of(&events), "third", "{events:?}");
    eprintln!(
        "claude_code: first turn of a fresh process {first_turn:?}; a turn on a kept-alive process {kept_alive:?}; \
         a turn with a fresh `--resume` process (and the attached shim) {per_turn:?}"
    );
    Ok(())
}

/// Runs a turn whose approval requests are answered by `decide` (the engine's part): all its
/// events, the terminal last, and the requests seen.
async fn turn_answering(
    bench: &Bench,
    provider: &dyn AgentProvider,
    text: &str,
    config: AgentConfig,
    decide: impl Fn(&coffer_chat::adapter::ApprovalRequest) -> coffer_chat::adapter::ApprovalAnswer,
) -> anyhow::Result<(Vec<AgentEvent>, Vec<coffer_chat::adapter::ApprovalRequest>)> {
    let (running, mut rx) = bench.start(provider, text, config)?;
    let answers = running.approvals.clone().ok_or_else(|| anyhow::anyhow!("no approval channel"))?;
    let mut events = Vec::new();
    let mut asked = Vec::new();
    let deadline = Instant::now() + TURN_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let event = tokio::time::timeout(left, rx.recv()).await?.ok_or_else(|| anyhow::anyhow!("ended: {events:?}"))?;
        if let AgentEvent::ApprovalRequested(req) = &event {
            answers.send(decide(req)).await?;
            asked.push((**req).clone());
        }
        let terminal = matches!(event, AgentEvent::Done { .. } | AgentEvent::Failed { .. });
        events.push(event);
        if terminal {
            break;
        }
    }
    tokio::time::timeout(Duration::from_secs(10), running.task).await??;
    Ok((events, asked))
}

/// Codex in `ask` (`untrusted`, `workspace-write`): a command waits for the answer; declined it
/// does not run and the model is told it was rejected; accepted it runs. In `read_only` nothing
/// asks and the read-only sandbox keeps the file from being made.
#[tokio::test]
async fn codex_asks_before_a_command_in_ask_mode() -> anyhow::Result<()> {
    use coffer_chat::adapter::{ApprovalAnswer, PermissionMode};
    let bench = codex_bench().await?;
    let model = FakeOpenAi::start().await?;
    let provider = codex(&bench, &model)?;
    let ask = AgentConfig { permission_mode: PermissionMode::Ask, ..bench.config("", "") };
    let touch = |name: &str| format!(r#"TOOL[exec_command {{"cmd": "touch {}"}}]"#, bench.cwd.join(name).display());

    let deny = |r: &coffer_chat::adapter::ApprovalRequest| ApprovalAnswer {
        request_id: r.request_id.clone(),
        allow: false,
        message: "no".into(),
    };
    let (events, asked) = turn_answering(&bench, &provider, &touch("declined.txt"), ask.clone(), deny).await?;
    assert_eq!(asked.len(), 1, "{events:?}");
    assert_eq!(asked[0].tool, "shell");
    let cmd = asked[0].input["command"].as_str().unwrap_or_default();
    assert!(cmd.contains("touch ") && cmd.contains("declined.txt"), "{cmd}");
    assert!(!bench.cwd.join("declined.txt").exists(), "a declined command ran");
    let last = model.requests().last().map(|r| r.body.to_string()).unwrap_or_default();
    assert!(last.contains("rejected"), "the model was not told: {last}");
    assert!(matches!(events.last(), Some(AgentEvent::Done { .. })), "{events:?}");

    let allow = |r: &coffer_chat::adapter::ApprovalRequest| ApprovalAnswer {
        request_id: r.request_id.clone(),
        allow: true,
        message: String::new(),
    };
    let (events, asked) = turn_answering(&bench, &provider, &touch("accepted.txt"), ask, allow).await?;
    assert_eq!(asked.len(), 1, "{events:?}");
    assert!(bench.cwd.join("accepted.txt").exists(), "an accepted command did not run: {events:?}");

    let read_only = AgentConfig { permission_mode: PermissionMode::ReadOnly, ..bench.config("", "") };
    let (events, asked) = turn_answering(&bench, &provider, &touch("readonly.txt"), read_only, deny).await?;
    assert!(asked.is_empty(), "read_only asked: {asked:?}");
    assert!(!bench.cwd.join("readonly.txt").exists(), "read_only made a file: {events:?}");
    Ok(())
}

/// Issue 34 §6: an attached image reaches the real Codex as a `localImage` input item
/// (`turn/start`, app-server 0.171.0's `UserInput`), which the app-server reads from disk and
/// sends the model as an `input_image`; the text names the saved file.
#[tokio::test]
async fn codex_passes_an_attached_image_to_the_model() -> anyhow::Result<()> {
    use base64::Engine as _;
    let bench = codex_bench().await?;
    let model = FakeOpenAi::start().await?;
    let provider = codex(&bench, &model)?;
    let png = coffer_tests::images::png(64, 40, [250, 60, 60], [60, 60, 250]);
    let rel = ".coffer/attachments/01JMESSAGE/shot.png";
    let path = bench.cwd.join(rel);
    coffer_tests::write_file(&path, &png)?;
    let attachment = coffer_chat::adapter::Attachment {
        name: "shot.png".into(),
        mime: "image/png".into(),
        size: png.len() as u64,
        rel_path: rel.into(),
        path: path.clone(),
    };
    let mut input = bench.input(&format!("SAY[an image]\n\nAttached: {rel} (image/png, 1 KB)"), bench.config("", ""));
    input.attachments = vec![attachment];
    let (tx, mut rx) = mpsc::channel(1024);
    let running = provider.start_turn(&bench.env, input, tx).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let events = collect(&mut rx, &bench.home).await?;
    running.task.await?;
    assert_eq!(text_of(&events), "an image", "{events:?}\n{}", bench.home.diagnostics());
    let body = model.requests().pop().expect("a model request").body.to_string();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&png);
    assert!(
        body.contains("input_image") && body.contains(&b64),
        "the image is not in the model request: {}",
        &body[..body.len().min(2000)]
    );
    assert!(body.contains(rel), "the text names the file");
    provider.forget(&bench.env, CONVERSATION);
    Ok(())
}
