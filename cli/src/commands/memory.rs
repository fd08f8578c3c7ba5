//! `coffer memory remember|recall|list|show|forget`: remembered facts (one markdown file each
//! under `COFFER_HOME/memory/`) over `/v1/memory…`.
use clap::{Args, Subcommand};
use coffer_api::knowledge::{Fact, FactCreate, Facts, RecallRequest, RememberReply, SearchReply};

use crate::api::with_query;
use crate::commands::kb::{print_warnings, render_results, stdout_is_styled, time_of};
use crate::context::Ctx;
use crate::error::CliError;
use crate::output::{self, printable, render_fields, render_table_fitted, text_cell};

#[derive(Debug, Subcommand)]
pub enum MemoryCommand {
    /// Remember a fact (an existing duplicate is reported instead of saved twice).
    #[command(
        after_help = "Examples:\n  coffer memory remember The staging database is db-stage-2 --tag deploy\n  coffer memory remember --json 'Prefers pytest over unittest'"
    )]
    Remember(RememberArgs),
    /// Search the remembered facts.
    #[command(after_help = "Example:\n  coffer memory recall staging database")]
    Recall(RecallArgs),
    /// List remembered facts, newest first.
    #[command(after_help = "Examples:\n  coffer memory list\n  coffer memory list --tag deploy --limit 10")]
    List(ListArgs),
    /// Show one fact in full.
    #[command(after_help = "Example:\n  coffer memory show 01JDQ8ZKXW5T3M2N4P6R7S8T9V")]
    Show(IdArg),
    /// Forget a fact: its file and index entries are removed.
    #[command(after_help = "Example:\n  coffer memory forget 01JDQ8ZKXW5T3M2N4P6R7S8T9V")]
    Forget(IdArg),
}

#[derive(Debug, Args)]
pub struct RememberArgs {
    /// The fact (words are joined with spaces).
    #[arg(required = true, num_args = 1.., value_name = "TEXT")]
    pub text: Vec<String>,
    /// A tag to find it by (repeatable).
    #[arg(long = "tag", value_name = "T")]
    pub tags: Vec<String>,
    /// Who said it [default: cli].
    #[arg(long, value_name = "S")]
    pub source: Option<String>,
    /// Store it even though it looks like it holds a secret (a token, "the password is …"):
    /// facts are plain markdown that models read and sync copies; the credential store is the
    /// place for secrets.
    #[arg(long)]
    pub allow_secret: bool,
}

#[derive(Debug, Args)]
pub struct RecallArgs {
    /// What to recall.
    #[arg(required = true, num_args = 1.., value_name = "QUERY")]
    pub query: Vec<String>,
    /// Only facts with this tag (repeatable: all must match).
    #[arg(long = "tag", value_name = "T")]
    pub tags: Vec<String>,
    /// Most results (1-50).
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub limit: u32,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only facts with this tag.
    #[arg(long, value_name = "T")]
    pub tag: Option<String>,
    /// How many facts to show (1-500).
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=500))]
    pub limit: u32,
    /// Continue after the facts already shown (the cursor the previous page printed).
    #[arg(long, value_name = "CURSOR")]
    pub cursor: Option<String>,
}

#[derive(Debug, Args)]
pub struct IdArg {
    /// The fact's id (as `coffer memory list` shows it).
    pub id: String,
}

/// Runs one `coffer memory …` command.
///
/// # Errors
/// API errors (exit 2 bad input, 3 unknown fact, 1 retrieval not running), exit 5 when the
/// daemon cannot be reached.
pub async fn run(ctx: &Ctx, cmd: MemoryCommand) -> Result<(), CliError> {
    match cmd {
        MemoryCommand::Remember(a) => remember(ctx, a).await,
        MemoryCommand::Recall(a) => recall(ctx, a).await,
        MemoryCommand::List(a) => list(ctx, a).await,
        MemoryCommand::Show(a) => show(ctx, &a.id).await,
        MemoryCommand::Forget(a) => forget(ctx, &a.id).await,
    }
}

fn fact_path(id: &str) -> Result<String, CliError> {
    Ok(format!("/v1/memory/{}", crate::api::name_segment("fact id", &canonical_id(id))?))
}

/// A fact id as the daemon writes it: a ULID (26 letters and digits) in upper case; a
/// hand-written note's name as given.
pub fn canonical_id(id: &str) -> String {
    if id.len() == 26 && id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        id.to_ascii_uppercase()
    } else {
        id.to_owned()
    }
}

/// What `memory list` says when the page is empty: why, and what to do.
pub fn empty_list_message(tag: Option<&str>, cursor: Option<&str>) -> String {
    match (tag, cursor) {
        (Some(t), _) => format!(
            "No facts tagged {:?}; `coffer memory list` shows every fact and its tags",
            t.chars().take(64).collect::<String>()
        ),
        (None, Some(_)) => "No more facts after this cursor".into(),
        (None, None) => "No facts remembered yet; add one with `coffer memory remember TEXT`".into(),
    }
}

/// The body of `POST /v1/memory`.
pub fn remember_body(a: &RememberArgs) -> FactCreate {
    FactCreate {
        text: a.text.join(" "),
        tags: (!a.tags.is_empty()).then(|| a.tags.clone()),
        source: a.source.clone(),
        allow_secret: a.allow_secret.then_some(true),
    }
}

/// What `remember` says: the new id, or the duplicate that stands instead.
pub fn render_remembered(reply: &RememberReply) -> String {
    let f = &reply.fact;
    let id = &f.id;
    if reply.created {
        format!("Remembered as fact {id} ({})\n", printable(&f.path))
    } else {
        format!(
            "Not saved again: fact {id} already says this (similarity {:.2}):\n  {}\n",
            reply.similarity.unwrap_or(1.0),
            printable(&f.text)
        )
    }
}

/// The facts table: ID CREATED TAGS SOURCE TEXT (the text cut to `width`).
pub fn render_facts(items: &[Fact], width: Option<usize>) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|f| {
            vec![
                text_cell(&f.id, 40),
                time_of(f.created_ms),
                if f.tags.is_empty() { "-".into() } else { f.tags.join(",") },
                text_cell(&f.source, 40),
                text_cell(&f.text, 2000),
            ]
        })
        .collect();
    render_table_fitted(&["ID", "CREATED (UTC)", "TAGS", "SOURCE", "TEXT"], &rows, width)
}

/// One fact in full.
pub fn render_fact(f: &Fact) -> String {
    render_fields(&[
        ("id", text_cell(&f.id, 40)),
        ("created", time_of(f.created_ms)),
        ("tags", if f.tags.is_empty() { "-".into() } else { f.tags.join(", ") }),
        ("source", text_cell(&f.source, 256)),
        ("file", f.path.clone()),
        ("text", f.text.clone()),
    ])
}

/// The warning line under a fact whose file has a problem (empty when it has none).
pub fn fact_warning(f: &Fact) -> String {
    match f.warning.as_deref().filter(|w| !w.is_empty()) {
        Some(w) => format!("warning: {}\n", printable(w)),
        None => String::new(),
    }
}

async fn remember(ctx: &Ctx, a: RememberArgs) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let resp = api.send(api.request(reqwest::Method::POST, "/v1/memory").json(&remember_body(&a))).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    output::print(&render_remembered(&resp.parse()?))
}

async fn recall(ctx: &Ctx, a: RecallArgs) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let body = RecallRequest {
        query: a.query.join(" "),
        tags: (!a.tags.is_empty()).then_some(a.tags),
        limit: Some(a.limit),
        snippet_chars: None,
    };
    let resp = api.send(api.request(reqwest::Method::POST, "/v1/memory/recall").json(&body)).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let reply: SearchReply = resp.parse()?;
    output::print(&render_results(&reply, stdout_is_styled()))?;
    print_warnings(&reply);
    Ok(())
}

async fn list(ctx: &Ctx, a: ListArgs) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let limit = a.limit.to_string();
    let path = with_query(
        "/v1/memory",
        &[("limit", Some(&limit)), ("cursor", a.cursor.as_deref()), ("tag", a.tag.as_deref())],
    );
    let resp = api.get_raw(&path).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let page: Facts = resp.parse()?;
    if page.items.is_empty() {
        output::println(&empty_list_message(a.tag.as_deref(), a.cursor.as_deref()))?;
    } else {
        output::print(&render_facts(&page.items, output::terminal_width()))?;
    }
    if let Some(c) = &page.next_cursor {
        crate::eprintln_printable!("(more: repeat with --cursor {c})");
    }
    Ok(())
}

async fn show(ctx: &Ctx, id: &str) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let resp = api.get_raw(&fact_path(id)?).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let fact: Fact = resp.parse()?;
    output::print(&render_fact(&fact))?;
    let warning = fact_warning(&fact);
    if !warning.is_empty() {
        crate::eprintln_printable!("{}", warning.trim_end_matches('\n'));
    }
    Ok(())
}

async fn forget(ctx: &Ctx, id: &str) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    let resp = api.send(api.request(reqwest::Method::DELETE, &fact_path(id)?)).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    output::println(&format!("Forgot fact {}", canonical_id(id)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use serde_json::json;

    fn parse(args: &[&str]) -> Result<crate::Cli, clap::Error> {
        let mut full = vec!["coffer", "memory"];
        full.extend_from_slice(args);
        crate::Cli::try_parse_from(full)
    }

    #[test]
    fn arguments_are_checked_before_any_request() {
        let crate::commands::Command::Memory(MemoryCommand::Remember(a)) =
            parse(&["remember", "likes", "tea", "--tag", "food", "--source", "me"]).unwrap().command
        else {
            panic!("remember")
        };
        assert_eq!(
            serde_json::to_value(remember_body(&a)).unwrap(),
            json!({"text": "likes tea", "tags": ["food"], "source": "me"})
        );
        let crate::commands::Command::Memory(MemoryCommand::Remember(a)) =
            parse(&["remember", "--allow-secret", "pin", "is", "4821"]).unwrap().command
        else {
            panic!("remember")
        };
        assert_eq!(
            serde_json::to_value(remember_body(&a)).unwrap(),
            json!({"text": "pin is 4821", "allow_secret": true})
        );
        for bad in [
            &["remember"][..],
            &["recall"],
            &["recall", "x", "--limit", "0"],
            &["list", "--limit", "501"],
            &["show"],
            &["forget"],
        ] {
            assert_eq!(parse(bad).unwrap_err().exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn remembered_facts_and_duplicates_are_told_apart() {
        let fact: Fact = serde_json::from_value(json!({"id": "01J", "text": "likes tea", "tags": ["food"], "source": "cli", "created_ms": 1_796_031_096_000_i64, "path": "/h/memory/01J.md"})).unwrap();
        let reply = |created: bool, similarity: Option<f64>| RememberReply { fact: fact.clone(), created, similarity };
        assert_eq!(render_remembered(&reply(true, None)), "Remembered as fact 01J (/h/memory/01J.md)\n");
        assert_eq!(
            render_remembered(&reply(false, Some(0.97))),
            "Not saved again: fact 01J already says this (similarity 0.97):\n  likes tea\n"
        );
        assert_eq!(
            render_facts(std::slice::from_ref(&fact), None),
            "ID   CREATED (UTC)        TAGS  SOURCE  TEXT\n01J  2026-11-30 09:31:36  food  cli     likes tea\n"
        );
        assert!(render_fact(&fact).contains("file:    /h/memory/01J.md\n"), "{}", render_fact(&fact));
        assert_eq!(fact_warning(&fact), "");
        let broken = Fact {
            id: "01J".into(),
            text: "x".into(),
            warning: Some("invalid YAML front matter: …".into()),
            ..Default::default()
        };
        assert_eq!(fact_warning(&broken), "warning: invalid YAML front matter: …\n");
    }

    #[test]
    fn ids_and_empty_pages_are_said_plainly() {
        assert_eq!(canonical_id("01jdq8zkxw5t3m2n4p6r7s8t9v"), "01JDQ8ZKXW5T3M2N4P6R7S8T9V");
        assert_eq!(canonical_id("groceries"), "groceries");
        assert_eq!(canonical_id("my note"), "my note");
        assert!(empty_list_message(Some("deploy"), None).starts_with("No facts tagged \"deploy\""));
        assert_eq!(empty_list_message(None, Some("01J")), "No more facts after this cursor");
        assert!(empty_list_message(None, None).starts_with("No facts remembered yet"));
    }
}
