//! The Cranfield 1400 collection (`shared/data/cranfield/`): 1,400 aeronautics abstracts, 225
//! queries and graded relevance judgements, parsed from their SMART-style files.
//!
//! Traps handled here (the collection's README): `cranqrel` numbers queries 1..225 **by
//! position** in `cran.qry`, whose `.I` ids skip numbers; grades 1..4 give gain 5 − grade, and
//! -1 means "not relevant".
use std::collections::HashMap;
use std::path::Path;

/// Errors reading the collection.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{file} line {line}: {message}")]
    Parse { file: &'static str, line: usize, message: String },
}

/// One document: its `.I` id, title (`.T`) and text (`.W`), each with lines joined by spaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Doc {
    pub id: u32,
    pub title: String,
    pub text: String,
}

/// One query: `number` is its 1-based position in `cran.qry` (what `cranqrel` uses), `id` the
/// `.I` id printed in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub number: u32,
    pub id: u32,
    pub text: String,
}

/// The whole collection. `gains[query number][doc id]` is 5 − grade for grades 1..4;
/// judgements of -1 (not relevant) are left out.
#[derive(Debug, Clone)]
pub struct Collection {
    pub docs: Vec<Doc>,
    pub queries: Vec<Query>,
    pub gains: HashMap<u32, HashMap<u32, f64>>,
}

impl Collection {
    /// Reads `cran.all.1400`, `cran.qry` and `cranqrel` from `dir`.
    ///
    /// # Errors
    /// A file that cannot be read, or a malformed record or judgement.
    pub fn load(dir: &Path) -> Result<Self, Error> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read_to_string(&path).map_err(|source| Error::Read { path: path.display().to_string(), source })
        };
        Ok(Self {
            docs: parse_docs(&read("cran.all.1400")?)?,
            queries: parse_queries(&read("cran.qry")?)?,
            gains: parse_qrels(&read("cranqrel")?)?,
        })
    }

    /// Where the collection is: `$COFFER_CRANFIELD_DIR`, else `shared/data/cranfield` beside
    /// the repository (`<repo>/../shared`), else `/work/shared/data/cranfield`.
    pub fn default_dir() -> std::path::PathBuf {
        if let Some(d) = std::env::var_os("COFFER_CRANFIELD_DIR") {
            return d.into();
        }
        let beside = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/cranfield");
        if beside.exists() { beside } else { "/work/shared/data/cranfield".into() }
    }

    /// The markdown file written for `doc`: the title as a `#` heading, the text as the body.
    pub fn markdown(doc: &Doc) -> String {
        format!("# {}\n\n{}\n", doc.title, doc.text)
    }

    /// The file name written for `doc`: `doc-0001.md`.
    pub fn file_name(doc: &Doc) -> String {
        format!("doc-{:04}.md", doc.id)
    }

    /// The document id of a file written by [`Collection::file_name`] (any directory prefix).
    pub fn doc_id(path: &str) -> Option<u32> {
        let name = path.rsplit('/').next()?;
        name.strip_prefix("doc-")?.strip_suffix(".md")?.parse().ok()
    }
}

/// One SMART-style record: its `.I` id and its fields `(letter, text)`.
type Record = (u32, Vec<(char, String)>);

/// Records of a SMART-style file: `(.I id, [(field letter, text)])`, with the line each starts.
fn records(text: &str, file: &'static str) -> Result<Vec<Record>, Error> {
    let mut out: Vec<Record> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if let Some(id) = line.strip_prefix(".I") {
            let id = id.trim().parse().map_err(|_| Error::Parse {
                file,
                line: n + 1,
                message: format!("bad id {line:?}"),
            })?;
            out.push((id, Vec::new()));
        } else if line.len() == 2 && line.starts_with('.') {
            let (_, fields) =
                out.last_mut().ok_or(Error::Parse { file, line: n + 1, message: "field before .I".into() })?;
            fields.push((line.as_bytes()[1] as char, String::new()));
        } else if let Some((_, fields)) = out.last_mut()
            && let Some((_, body)) = fields.last_mut()
        {
            let line = line.trim();
            if !line.is_empty() {
                if !body.is_empty() {
                    body.push(' ');
                }
                body.push_str(line);
            }
        }
    }
    Ok(out)
}

fn field(fields: &[(char, String)], f: char) -> String {
    fields.iter().find(|(c, _)| *c == f).map(|(_, t)| t.clone()).unwrap_or_default()
}

/// Parses `cran.all.1400`.
///
/// # Errors
/// A record whose `.I` line has no number.
pub fn parse_docs(text: &str) -> Result<Vec<Doc>, Error> {
    Ok(records(text, "cran.all.1400")?
        .into_iter()
        .map(|(id, f)| Doc { id, title: field(&f, 'T'), text: field(&f, 'W') })
        .collect())
}

/// Parses `cran.qry`, numbering queries by position (1-based).
///
/// # Errors
/// A record whose `.I` line has no number.
pub fn parse_queries(text: &str) -> Result<Vec<Query>, Error> {
    Ok(records(text, "cran.qry")?
        .into_iter()
        .enumerate()
        .map(|(i, (id, f))| Query { number: i as u32 + 1, id, text: field(&f, 'W') })
        .collect())
}

/// Parses `cranqrel` (`query_number doc_id grade` per line) into gains: 5 − grade for grades
/// 1..4; -1 (not relevant) left out.
///
/// # Errors
/// A line without three numbers, or a grade outside -1 and 1..4.
pub fn parse_qrels(text: &str) -> Result<HashMap<u32, HashMap<u32, f64>>, Error> {
    let mut out: HashMap<u32, HashMap<u32, f64>> = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        if parts.is_empty() {
            continue;
        }
        let bad = || Error::Parse {
            file: "cranqrel",
            line: n + 1,
            message: format!("expected `query doc grade`, got {line:?}"),
        };
        let [q, d, g] = parts.as_slice() else { return Err(bad()) };
        let (q, d, g): (u32, u32, i32) =
            (q.parse().map_err(|_| bad())?, d.parse().map_err(|_| bad())?, g.parse().map_err(|_| bad())?);
        match g {
            -1 => {}
            1..=4 => {
                out.entry(q).or_default().insert(d, f64::from(5 - g));
            }
            _ => {
                return Err(Error::Parse {
                    file: "cranqrel",
                    line: n + 1,
                    message: format!("grade {g} is not -1 or 1..4"),
                });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_numbered_by_position_not_by_id() {
        let qry = ".I 001\n.W\nwhat similarity laws must be obeyed\nwhen constructing models .\n.I 002\n.W\nsecond query .\n.I 004\n.W\nthird, whose id skips 3 .\n";
        let q = parse_queries(qry).expect("parse");
        assert_eq!(q.len(), 3);
        assert_eq!((q[2].number, q[2].id), (3, 4));
        assert_eq!(q[0].text, "what similarity laws must be obeyed when constructing models .");
        let qrels = parse_qrels("3 184 2 \n3 29 -1\n3 12 4\n1 5 1\n").expect("qrels");
        // Query number 3 is the one with .I 004.
        assert_eq!(qrels[&3], HashMap::from([(184, 3.0), (12, 1.0)]));
        assert_eq!(qrels[&1][&5], 4.0);
        assert!(parse_qrels("1 2 5\n").is_err());
        assert!(parse_qrels("1 two 3\n").is_err());
    }

    #[test]
    fn documents_keep_title_and_text_only() {
        let all = ".I 1\n.T\nexperimental investigation of the\nwing .\n.A\nbrenckman,m.\n.B\nj. ae. scs. 25, 1958, 324.\n.W\nan experimental\n  study of a wing .\n.I 2\n.T\nsecond .\n.W\nbody two .\n";
        let d = parse_docs(all).expect("parse");
        assert_eq!(
            d[0],
            Doc {
                id: 1,
                title: "experimental investigation of the wing .".into(),
                text: "an experimental study of a wing .".into()
            }
        );
        assert_eq!(Collection::markdown(&d[1]), "# second .\n\nbody two .\n");
        assert_eq!(Collection::file_name(&d[0]), "doc-0001.md");
        assert_eq!(Collection::doc_id("sub/doc-0042.md"), Some(42));
        assert_eq!(Collection::doc_id("notes.md"), None);
    }

    #[test]
    fn the_shared_collection_has_its_documented_shape() {
        let c = Collection::load(&Collection::default_dir()).expect("load the Cranfield collection");
        assert_eq!(c.docs.len(), 1400);
        assert_eq!(c.queries.len(), 225);
        assert_eq!(c.queries.last().map(|q| (q.number, q.id)), Some((225, 365)));
        // Two records of the collection are empty (known: 471 and 995).
        let empty: Vec<u32> = c.docs.iter().filter(|d| d.title.is_empty() && d.text.is_empty()).map(|d| d.id).collect();
        assert_eq!(empty, [471, 995]);
        assert_eq!(c.docs.iter().map(|d| d.id).collect::<Vec<_>>(), (1..=1400).collect::<Vec<_>>());
        assert_eq!(c.gains.len(), 225, "every query has a relevant document");
        assert!(c.gains.keys().all(|q| (1..=225).contains(q)));
    }
}
