//! The command tree. Each command group is one module with its clap arguments and a
//! `run(ctx, args)`; adding a group is one new file plus one variant and one match arm here.

pub mod audit;
pub mod backup;
pub mod channel;
pub mod chat;
pub mod chat_sessions;
pub mod completions;
pub mod connect;
pub mod credentials;
pub mod daemon;
pub mod doctor;
pub mod import;
pub mod invocations;
pub mod kb;
pub mod listed;
pub mod llm;
pub mod logs;
pub mod mcp;
pub mod mcp_auth;
pub mod mcp_registry;
pub mod memory;
pub mod profile;
pub mod restore;
pub mod settings;
pub mod skills;
pub mod status;
pub mod sync;
pub mod tools;
pub mod ui;

use clap::Subcommand;

use crate::context::Ctx;
use crate::error::CliError;

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start, stop, restart or inspect the daemon.
    #[command(subcommand)]
    Daemon(daemon::DaemonCommand),
    /// Show the daemon, its services and upstreams (starts the daemon if needed).
    Status(status::StatusArgs),
    /// Register, inspect and test upstream MCP servers.
    #[command(subcommand)]
    Mcp(mcp::McpCommand),
    /// List, enable, disable and call the tools clients see.
    #[command(subcommand)]
    Tools(tools::ToolsCommand),
    /// Add, search and reindex knowledge bases (folders of markdown notes).
    #[command(subcommand)]
    Kb(kb::KbCommand),
    /// Remember, recall, list and forget facts (one markdown file each).
    #[command(subcommand)]
    Memory(memory::MemoryCommand),
    /// List and show skills (COFFER_HOME/skills/NAME/SKILL.md).
    #[command(subcommand)]
    Skills(skills::SkillsCommand),
    /// Create, list, show, edit and remove profiles (which tools each kind of client sees).
    #[command(subcommand)]
    Profile(profile::ProfileCommand),
    /// Add, test and choose LLM connections (the providers Coffer's agents and coffer__ask use).
    #[command(subcommand)]
    Llm(llm::LlmCommand),
    /// Add, pair, enable and disable IM channels (Telegram, SeaTalk) that drive conversations.
    #[command(subcommand)]
    Channel(channel::ChannelCommand),
    /// Chat with the coding agents Coffer runs (Claude Code, Codex): start, send, watch, stop.
    #[command(subcommand)]
    Chat(chat::ChatCommand),
    /// Show which tools and prompts were called, how long they took and how they ended.
    Invocations(invocations::InvocationsArgs),
    /// Show who changed what: servers, tool preferences, settings, credentials, backups.
    Audit(audit::AuditArgs),
    /// Read and change the daemon's settings.
    #[command(subcommand)]
    Settings(settings::SettingsCommand),
    /// Store, list and remove credentials (values are never shown).
    #[command(subcommand)]
    Credentials(credentials::CredentialsCommand),
    /// Register Coffer as an MCP server in Claude Code, Codex, Claude Desktop or Cursor.
    #[command(after_help = connect::CONNECT_EXAMPLES)]
    Connect(connect::ConnectArgs),
    /// Check the install, the daemon and every upstream; say how to fix what is wrong.
    Doctor(doctor::DoctorArgs),
    /// Sync knowledge, memory, skills and the vault state across machines with a git remote.
    Sync(sync::SyncArgs),
    /// Back up the vault (database, markdown folders, secret.key) into a new directory.
    Backup(backup::BackupArgs),
    /// Restore a backup into a stopped Coffer (the current state is kept aside); never starts
    /// the daemon.
    Restore(restore::RestoreArgs),
    /// Open the web console in a browser, signed in by a one-time link (starts the daemon if
    /// needed).
    Ui(ui::UiArgs),
    /// Print (and follow) the local log files; never starts the daemon.
    #[command(after_help = logs::EXAMPLES)]
    Logs(logs::LogsArgs),
    /// Print a shell completion script.
    Completions(completions::CompletionsArgs),
}

impl Command {
    /// Runs the command.
    ///
    /// # Errors
    /// Whatever the command fails with.
    pub async fn run(self, ctx: &Ctx) -> Result<(), CliError> {
        match self {
            Command::Daemon(c) => daemon::run(ctx, c).await,
            Command::Status(a) => status::run(ctx, a).await,
            Command::Mcp(c) => mcp::run(ctx, c).await,
            Command::Tools(c) => tools::run(ctx, c).await,
            Command::Kb(c) => kb::run(ctx, c).await,
            Command::Memory(c) => memory::run(ctx, c).await,
            Command::Skills(c) => skills::run(ctx, c).await,
            Command::Chat(c) => chat::run(ctx, c).await,
            Command::Channel(c) => channel::run(ctx, c).await,
            Command::Llm(c) => llm::run(ctx, c).await,
            Command::Profile(c) => profile::run(ctx, c).await,
            Command::Invocations(a) => invocations::run(ctx, a).await,
            Command::Audit(a) => audit::run(ctx, a).await,
            Command::Settings(c) => settings::run(ctx, c).await,
            Command::Credentials(c) => credentials::run(ctx, c).await,
            Command::Connect(a) => connect::run(ctx, a).await,
            Command::Doctor(a) => doctor::run(ctx, a).await,
            Command::Sync(a) => sync::run(ctx, a).await,
            Command::Backup(a) => backup::run(ctx, a).await,
            Command::Restore(a) => restore::run(ctx, a).await,
            Command::Ui(a) => ui::run(ctx, a).await,
            Command::Logs(a) => logs::run(ctx, a).await,
            Command::Completions(a) => completions::run(a),
        }
    }
}
