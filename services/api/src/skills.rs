//! Bodies of `/v1/skills…`: the skills under `COFFER_HOME/skills/<name>/SKILL.md`.
use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A skill as `GET /v1/skills` lists it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SkillSummary {
    pub name: String,
    pub description: String,
    /// Its SKILL.md (absolute).
    pub path: String,
}

/// A skill folder that is not listed, and why (a malformed front matter).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct InvalidSkill {
    /// The skill's folder name.
    pub name: String,
    pub error: String,
}

/// `GET /v1/skills`: every valid skill, one page, and the folders that are not skills.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Skills {
    pub items: Vec<SkillSummary>,
    /// Always null: one page.
    #[schemars(extend("type" = "null"))]
    pub next_cursor: Option<String>,
    pub invalid: Vec<InvalidSkill>,
}

/// `GET /v1/skills/{name}`: one skill in full.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Skill {
    pub name: String,
    pub description: String,
    /// SKILL.md without its front matter.
    pub body: String,
    /// Its SKILL.md (absolute).
    pub path: String,
    /// Other files of its folder, relative, sorted.
    pub files: Vec<String>,
    /// Other front-matter keys, as strings, keys sorted.
    pub metadata: BTreeMap<String, String>,
}
