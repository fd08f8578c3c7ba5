//! `coffer skills list|show`: the skills under `COFFER_HOME/skills/<name>/SKILL.md` over
//! `/v1/skills…`. A skill whose front matter is malformed is not listed; `list` names it on
//! stderr with the reason.
use clap::{Args, Subcommand};
use coffer_api::skills::{Skill, SkillSummary, Skills};

use crate::context::Ctx;
use crate::error::CliError;
use crate::output::{self, printable, render_fields, render_table_fitted, text_cell};

#[derive(Debug, Subcommand)]
pub enum SkillsCommand {
    /// List the installed skills with their descriptions.
    #[command(after_help = "Example:\n  coffer skills list --json | jq -r '.items[].name'")]
    List(NoArgs),
    /// Show one skill: its front matter, files and instructions.
    #[command(after_help = "Example:\n  coffer skills show release-notes")]
    Show(NameArg),
}

#[derive(Debug, Args)]
pub struct NoArgs {}

#[derive(Debug, Args)]
pub struct NameArg {
    /// The skill's name (its folder under COFFER_HOME/skills/).
    pub name: String,
}

/// Runs one `coffer skills …` command.
///
/// # Errors
/// API errors (exit 3 unknown skill, 1 retrieval not running), exit 5 when the daemon cannot be
/// reached.
pub async fn run(ctx: &Ctx, cmd: SkillsCommand) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    match cmd {
        SkillsCommand::List(_) => {
            let resp = api.get_raw("/v1/skills").await?;
            if ctx.json {
                return output::print_body(&resp.body);
            }
            let skills: Skills = resp.parse()?;
            if skills.items.is_empty() {
                output::println(&format!(
                    "No skills yet; add one as {}",
                    ctx.home.root().join("skills").join("NAME").join("SKILL.md").display()
                ))?;
            } else {
                output::print(&render_skills(&skills.items, output::terminal_width()))?;
            }
            for i in &skills.invalid {
                crate::eprintln_printable!(
                    "warning: skill {} is not listed: {}",
                    printable(&i.name),
                    printable(&i.error)
                );
            }
            Ok(())
        }
        SkillsCommand::Show(a) => {
            let resp = api.get_raw(&format!("/v1/skills/{}", crate::api::name_segment("skill name", &a.name)?)).await?;
            if ctx.json {
                return output::print_body(&resp.body);
            }
            output::print(&render_skill(&resp.parse()?))
        }
    }
}

/// The skills table: NAME DESCRIPTION (cut to `width`).
pub fn render_skills(items: &[SkillSummary], width: Option<usize>) -> String {
    let rows: Vec<Vec<String>> =
        items.iter().map(|s| vec![text_cell(&s.name, 64), text_cell(&s.description, 2000)]).collect();
    render_table_fitted(&["NAME", "DESCRIPTION"], &rows, width)
}

/// One skill: its fields, a blank line, its body.
pub fn render_skill(s: &Skill) -> String {
    let mut fields = vec![
        ("name", text_cell(&s.name, 64)),
        ("description", s.description.clone()),
        ("path", s.path.clone()),
        ("files", if s.files.is_empty() { "-".into() } else { s.files.join(", ") }),
    ];
    let meta: Vec<String> = s.metadata.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    if !meta.is_empty() {
        fields.push(("metadata", meta.join("\n")));
    }
    let mut out = render_fields(&fields);
    out.push('\n');
    let body = s.body.as_str();
    out.push_str(&output::printable_text(body));
    if !body.ends_with('\n') {
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn skills_are_listed_and_shown() {
        let items = vec![SkillSummary {
            name: "release-notes".into(),
            description: "Write release notes from the git log".into(),
            path: "/h/skills/release-notes/SKILL.md".into(),
        }];
        assert_eq!(
            render_skills(&items, None),
            "NAME           DESCRIPTION\nrelease-notes  Write release notes from the git log\n"
        );
        let skill: Skill = serde_json::from_value(
            json!({"name": "release-notes", "description": "Write notes", "body": "# Steps\n1. Read \u{1b}the log\n",
            "path": "/h/skills/release-notes/SKILL.md", "files": ["template.md"], "metadata": {"license": "MIT"}}),
        )
        .unwrap();
        assert_eq!(
            render_skill(&skill),
            "name:        release-notes\ndescription: Write notes\npath:        /h/skills/release-notes/SKILL.md\n\
             files:       template.md\nmetadata:    license: MIT\n\n# Steps\n1. Read \\u001bthe log\n"
        );
    }
}
