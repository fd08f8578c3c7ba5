//! Knowledge bases' definitions: names, roots, globs. Kept by the store's Index service (the one
//! non-derived thing there: what the user added), cached here; this module validates what a
//! user asks for and resolves the folder a KB indexes.
//!
//! Rules (`proto/retrieval.proto`): a name matches `^[a-z0-9][a-z0-9_-]{0,63}$` and is not
//! `memory`; an empty path means `COFFER_HOME/knowledge/<name>/` (created); a given path is
//! absolute, exists, is a directory, and is canonicalized (symlinks resolved), and it may not be
//! inside `COFFER_HOME` except under `knowledge/` (Coffer's own files are not notes).
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

use coffer_proto::store::index_client::IndexClient;
use coffer_proto::store::{KnowledgeBase, KnowledgeBaseKind, KnowledgeBaseRef, ListKnowledgeBasesRequest};
use coffer_runtime::grpc::AuthChannel;
use coffer_runtime::home::CofferHome;

use crate::error::{Error, Result, shown, shown_at};

/// The store's Index client.
pub type Index = IndexClient<AuthChannel>;

/// The memory KB's name.
pub const MEMORY: &str = "memory";

/// Longest KB name.
pub const MAX_NAME: usize = 64;

/// Checks a KB name given by a user (`^[a-z0-9][a-z0-9_-]{0,63}$`).
///
/// # Errors
/// [`Error::Invalid`] naming the rule.
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "name {} must be 1-{MAX_NAME} characters of a-z, 0-9, _ and -, starting with a letter or digit",
            shown_at(name, 70)
        )))
    }
}

/// Resolves the root of a new folder KB `name`: `path` empty → `<home>/knowledge/<name>`
/// (created); otherwise `path`, canonicalized, which must be an existing directory outside
/// `COFFER_HOME` or under its `knowledge/`.
///
/// # Errors
/// [`Error::Invalid`] for a relative path, a path that does not exist or is not a directory, or
/// one inside `COFFER_HOME`; [`Error::Io`] when the default folder cannot be created.
pub fn resolve_root(home: &CofferHome, name: &str, path: &str) -> Result<PathBuf> {
    let home_root = home.root().canonicalize().unwrap_or_else(|_| home.root().to_path_buf());
    let knowledge = home_root.join("knowledge");
    if path.is_empty() {
        let dir = knowledge.join(name);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        return dir.canonicalize().map_err(|e| Error::io(format!("resolving {}", dir.display()), e));
    }
    let given = Path::new(path);
    if !given.is_absolute() {
        return Err(Error::Invalid(format!("path {} must be absolute", shown(path))));
    }
    let canonical = given.canonicalize().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::Invalid(format!("path {} does not exist", shown(path))),
        _ => Error::Invalid(format!("path {} cannot be resolved: {e}", shown(path))),
    })?;
    if !canonical.is_dir() {
        return Err(Error::Invalid(format!("path {} is not a directory", shown(path))));
    }
    if canonical.starts_with(&home_root) && !(canonical.starts_with(&knowledge) && canonical != knowledge) {
        return Err(Error::Invalid(format!(
            "path {} is inside COFFER_HOME ({}); only folders under its knowledge/ may be knowledge bases",
            shown(path),
            home_root.display()
        )));
    }
    Ok(canonical)
}

/// The refusal of a new KB at `root`, which KB `other` already indexes.
fn folder_taken(other: &str, root: &str) -> Error {
    Error::AlreadyExists(format!(
        "knowledge base {other:?} already indexes {root}; one folder is one knowledge base (remove {other:?} first, or search it)"
    ))
}

/// The KB definitions, as the store holds them, cached (retrieval is their only writer).
pub struct Sources {
    home: CofferHome,
    index: Index,
    cache: RwLock<BTreeMap<String, KnowledgeBase>>,
    loaded: std::sync::atomic::AtomicBool,
    /// KBs whose folder is gone, with the message to show: kept in the index (their vectors
    /// too, for when the folder returns unchanged) but not searched.
    gone: RwLock<BTreeMap<String, String>>,
    /// KBs in a clean pass (their index dropped and being rebuilt; one pass per KB at a time):
    /// searched, with a warning that the results may be incomplete.
    rebuilding: RwLock<std::collections::BTreeSet<String>>,
}

/// Marks a KB as being rebuilt for as long as it lives ([`Sources::rebuilding_guard`]).
pub struct Rebuilding<'a> {
    sources: &'a Sources,
    name: String,
}

impl Drop for Rebuilding<'_> {
    fn drop(&mut self) {
        self.sources.rebuilding.write().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&self.name);
    }
}

impl Sources {
    /// Sources for `home`, empty until [`Sources::load`].
    pub fn new(home: CofferHome, index: Index) -> Self {
        Self {
            home,
            index,
            cache: RwLock::new(BTreeMap::new()),
            loaded: false.into(),
            gone: RwLock::new(BTreeMap::new()),
            rebuilding: RwLock::new(std::collections::BTreeSet::new()),
        }
    }

    /// Marks KB `name` as being rebuilt from its files (a clean pass: its index was dropped)
    /// until the returned guard drops.
    pub fn rebuilding_guard(&self, name: &str) -> Rebuilding<'_> {
        self.rebuilding.write().expect("sources lock").insert(name.to_owned());
        Rebuilding { sources: self, name: name.to_owned() }
    }

    /// Whether KB `name` is being rebuilt (its search results may be incomplete).
    pub fn rebuilding(&self, name: &str) -> bool {
        self.rebuilding.read().expect("sources lock").contains(name)
    }

    /// `COFFER_HOME`.
    pub fn home(&self) -> &CofferHome {
        &self.home
    }

    /// `COFFER_HOME/memory`.
    pub fn memory_root(&self) -> PathBuf {
        self.home.root().join(MEMORY)
    }

    /// What a walk of KB `def` covers: its root and globs, and `COFFER_HOME` skipped when the
    /// root contains it ([`crate::walk::skip_for`]).
    pub fn walk_spec(&self, def: &KnowledgeBase) -> crate::walk::WalkSpec {
        let root = PathBuf::from(&def.root);
        crate::walk::WalkSpec {
            skip: crate::walk::skip_for(&root, self.home.root()),
            root,
            include: def.include.clone(),
            exclude: def.exclude.clone(),
        }
    }

    /// Marks KB `name`'s folder gone (with why) or back (`None`).
    pub fn set_gone(&self, name: &str, why: Option<String>) {
        let mut gone = self.gone.write().expect("sources lock");
        match why {
            Some(w) => {
                gone.insert(name.to_owned(), w);
            }
            None => {
                gone.remove(name);
            }
        }
    }

    /// Why KB `name` is not searched (its folder is gone), if it is not.
    pub fn gone(&self, name: &str) -> Option<String> {
        self.gone.read().expect("sources lock").get(name).cloned()
    }

    /// The store's Index client.
    pub fn index(&self) -> Index {
        self.index.clone()
    }

    /// Reads the definitions from the store and makes sure the memory KB exists (its folder
    /// created, its definition written).
    ///
    /// # Errors
    /// The store's errors (it may not be ready yet: the caller retries).
    pub async fn load(&self) -> Result<()> {
        let memory = self.memory_root();
        std::fs::create_dir_all(&memory).map_err(|e| Error::io(format!("creating {}", memory.display()), e))?;
        let memory = memory.canonicalize().map_err(|e| Error::io(format!("resolving {}", memory.display()), e))?;
        let mut list = self.index.clone().list_knowledge_bases(ListKnowledgeBasesRequest {}).await?.into_inner();
        let root = memory.display().to_string();
        match list.knowledge_bases.iter().find(|k| k.name == MEMORY) {
            Some(k) if k.root == root => {}
            found => {
                // A memory KB at another root (COFFER_HOME moved): define it afresh.
                if found.is_some() {
                    self.index.clone().delete_knowledge_base(KnowledgeBaseRef { name: MEMORY.into() }).await?;
                }
                let def = KnowledgeBase {
                    name: MEMORY.into(),
                    kind: KnowledgeBaseKind::Memory as i32,
                    root,
                    include: vec!["*.md".into()],
                    exclude: vec![],
                    created_ms: 0,
                    writable: false,
                };
                let created = match self.index.clone().create_knowledge_base(def).await {
                    Ok(r) => r.into_inner(),
                    Err(s) if s.code() == tonic::Code::AlreadyExists => self
                        .index
                        .clone()
                        .get_knowledge_base(KnowledgeBaseRef { name: MEMORY.into() })
                        .await?
                        .into_inner(),
                    Err(s) => return Err(s.into()),
                };
                list.knowledge_bases.retain(|k| k.name != MEMORY);
                list.knowledge_bases.push(created);
            }
        }
        let roots: std::collections::BTreeSet<String> = list.knowledge_bases.iter().map(|k| k.root.clone()).collect();
        let mut defs = Vec::with_capacity(list.knowledge_bases.len());
        for def in list.knowledge_bases {
            defs.push(self.rehome(def, &roots).await?);
        }
        let mut cache = self.cache.write().expect("sources lock");
        *cache = defs.into_iter().map(|k| (k.name.clone(), k)).collect();
        self.loaded.store(true, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// A folder KB in another home's `knowledge/<name>/` (a backup restored into this home, or
    /// `COFFER_HOME` moved) whose folder this home has: defined afresh at this home's folder (its
    /// old index goes with the old definition; the start-up pass indexes the files here).
    /// Anything else, or one whose folder here another KB (of `roots`) indexes, is returned as
    /// it is.
    async fn rehome(&self, def: KnowledgeBase, roots: &std::collections::BTreeSet<String>) -> Result<KnowledgeBase> {
        if def.kind == KnowledgeBaseKind::Memory as i32 {
            return Ok(def);
        }
        let home_root = self.home.root().canonicalize().unwrap_or_else(|_| self.home.root().to_path_buf());
        let root = Path::new(&def.root);
        let default_shape = root.file_name().is_some_and(|n| n == def.name.as_str())
            && root.parent().and_then(Path::file_name).is_some_and(|n| n == "knowledge");
        let here = home_root.join("knowledge").join(&def.name);
        if !default_shape || root.starts_with(&home_root) || !here.is_dir() {
            return Ok(def);
        }
        let here = here.canonicalize().map_err(|e| Error::io(format!("resolving {}", here.display()), e))?;
        if roots.contains(&here.display().to_string()) {
            return Ok(def);
        }
        tracing::info!(kb = %def.name, from = %def.root, to = %here.display(), "Knowledge base moved with COFFER_HOME; defined at its new folder.");
        self.index.clone().delete_knowledge_base(KnowledgeBaseRef { name: def.name.clone() }).await?;
        let moved = KnowledgeBase { root: here.display().to_string(), created_ms: 0, ..def };
        Ok(self.index.clone().create_knowledge_base(moved).await?.into_inner())
    }

    /// Whether [`Sources::load`] has succeeded.
    ///
    /// # Errors
    /// [`Error::Unavailable`] until it has.
    pub fn ready(&self) -> Result<()> {
        if self.loaded.load(std::sync::atomic::Ordering::Acquire) {
            Ok(())
        } else {
            Err(Error::Unavailable("coffer-retrieval is starting: the store has not answered yet".into()))
        }
    }

    /// Every KB, sorted by name.
    pub fn all(&self) -> Vec<KnowledgeBase> {
        self.cache.read().expect("sources lock").values().cloned().collect()
    }

    /// KB `name`, if defined.
    pub fn get(&self, name: &str) -> Option<KnowledgeBase> {
        self.cache.read().expect("sources lock").get(name).cloned()
    }

    /// KB `name`.
    ///
    /// # Errors
    /// [`Error::NotFound`] naming it.
    pub fn require(&self, name: &str) -> Result<KnowledgeBase> {
        if name.len() > MAX_NAME {
            return Err(Error::Invalid(format!(
                "knowledge base name {} is {} bytes; at most {MAX_NAME}",
                shown_at(name, 70),
                name.len()
            )));
        }
        self.get(name).ok_or_else(|| Error::NotFound(format!("no knowledge base {}", shown(name))))
    }

    /// The folder KBs' names (every KB but memory).
    pub fn folder_names(&self) -> Vec<String> {
        self.cache
            .read()
            .expect("sources lock")
            .values()
            .filter(|k| k.kind != KnowledgeBaseKind::Memory as i32)
            .map(|k| k.name.clone())
            .collect()
    }

    /// Defines a new folder KB (validated) in the store and the cache.
    ///
    /// # Errors
    /// [`Error::Invalid`] (name, path, globs), [`Error::AlreadyExists`] for a name that is
    /// taken or a folder another KB already indexes (named), the store's errors.
    pub async fn add(
        &self,
        name: &str,
        path: &str,
        include: Vec<String>,
        exclude: Vec<String>,
    ) -> Result<KnowledgeBase> {
        if name == MEMORY {
            return Err(Error::Invalid("name \"memory\" is reserved for the memory knowledge base".into()));
        }
        check_name(name)?;
        if self.get(name).is_some() {
            return Err(Error::AlreadyExists(format!("a knowledge base named {} exists", shown(name))));
        }
        for (field, globs) in [("include", &include), ("exclude", &exclude)] {
            if globs.len() > 64 {
                return Err(Error::Invalid(format!("{field} has {} globs; at most 64", globs.len())));
            }
            if let Some(g) = globs.iter().find(|g| g.is_empty() || g.len() > 512) {
                return Err(Error::Invalid(format!("{field} glob {} must be 1-512 bytes", shown(g))));
            }
        }
        let root = resolve_root(&self.home, name, path)?;
        let root_shown = root.display().to_string();
        if let Some(other) = self.all().into_iter().find(|k| k.root == root_shown) {
            return Err(folder_taken(&other.name, &root_shown));
        }
        let spec = crate::walk::WalkSpec {
            root: root.clone(),
            include: include.clone(),
            exclude: exclude.clone(),
            skip: vec![],
        };
        crate::walk::matcher(&spec).map_err(|e| Error::Invalid(format!("bad glob: {e}")))?;
        let def = KnowledgeBase {
            name: name.into(),
            kind: KnowledgeBaseKind::Folder as i32,
            root: root.display().to_string(),
            include,
            exclude,
            created_ms: 0,
            writable: false,
        };
        let created = match self.index.clone().create_knowledge_base(def).await {
            Ok(created) => created.into_inner(),
            // Another add got there first (the store checks name and folder in its write
            // transaction): the same refusal as when that add had finished before this one.
            Err(s) if s.code() == tonic::Code::AlreadyExists => {
                let list = self.index.clone().list_knowledge_bases(ListKnowledgeBasesRequest {}).await?.into_inner();
                let kbs = list.knowledge_bases;
                return Err(match kbs.iter().find(|k| k.name != name && k.root == root_shown) {
                    Some(other) if !kbs.iter().any(|k| k.name == name) => folder_taken(&other.name, &root_shown),
                    _ => Error::AlreadyExists(format!("a knowledge base named {} exists", shown(name))),
                });
            }
            Err(s) => return Err(Error::Store(s)),
        };
        self.cache.write().expect("sources lock").insert(created.name.clone(), created.clone());
        Ok(created)
    }

    /// Whether KB `def` lives in COFFER_HOME/knowledge (Coffer's own folder: always writable by
    /// `WriteNote`), not in a folder of the user's.
    pub fn coffer_owned(&self, def: &KnowledgeBase) -> bool {
        let home_root = self.home.root().canonicalize().unwrap_or_else(|_| self.home.root().to_path_buf());
        def.kind != KnowledgeBaseKind::Memory as i32 && Path::new(&def.root).starts_with(home_root.join("knowledge"))
    }

    /// Marks folder KB `name` writable (or not) for `WriteNote`, in the store and the cache.
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::Precondition`] for memory (written by `remember` only) and
    /// for making a Coffer-owned folder read-only (it is always writable), the store's errors.
    pub async fn set_writable(&self, name: &str, writable: bool) -> Result<KnowledgeBase> {
        if name == MEMORY {
            return Err(Error::Precondition(
                "the memory knowledge base is written by remember (coffer__remember), not as notes".into(),
            ));
        }
        let current = self.require(name)?;
        if !writable && self.coffer_owned(&current) {
            return Err(Error::Precondition(format!(
                "knowledge base {name} is Coffer's own folder ({}): its notes are always writable by tools; \
                 only a folder of yours can be made read-only",
                current.root
            )));
        }
        let req = coffer_proto::store::SetKnowledgeBaseWritableRequest { name: name.into(), writable };
        let def = self.index.clone().set_knowledge_base_writable(req).await?.into_inner();
        self.cache.write().expect("sources lock").insert(def.name.clone(), def.clone());
        Ok(def)
    }

    /// Forgets KB `name` and its indexes (never a file). Returns the store's count of removed
    /// rows.
    ///
    /// # Errors
    /// [`Error::Precondition`] for memory, [`Error::NotFound`], the store's errors.
    pub async fn remove(&self, name: &str) -> Result<u64> {
        if name == MEMORY {
            return Err(Error::Precondition("the memory knowledge base cannot be removed".into()));
        }
        self.require(name)?;
        let removed = self
            .index
            .clone()
            .delete_knowledge_base(KnowledgeBaseRef { name: name.into() })
            .await?
            .into_inner()
            .removed;
        self.cache.write().expect("sources lock").remove(name);
        self.set_gone(name, None);
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_rule() {
        for ok in ["notes", "a", "0-x_y", &"a".repeat(64)] {
            check_name(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in ["", "Notes", "-x", "_x", "a/b", "..", "a.b", "a b", &"a".repeat(65), "笔记"] {
            let e = check_name(bad).unwrap_err().to_string();
            assert!(e.contains("1-64 characters"), "{bad}: {e}");
        }
    }

    #[test]
    fn roots_are_canonical_existing_folders_outside_coffer_home() {
        let tmp = tempfile::tempdir().unwrap();
        let home = CofferHome::at(tmp.path().join("home"));
        std::fs::create_dir_all(home.root().join("logs")).unwrap();
        // Default: created under knowledge/.
        let r = resolve_root(&home, "notes", "").unwrap();
        assert!(r.ends_with("knowledge/notes") && r.is_dir(), "{}", r.display());
        // An existing folder elsewhere, through a symlink and a `..`.
        let vault = tmp.path().join("vault");
        std::fs::create_dir_all(vault.join("sub")).unwrap();
        let via = vault.join("sub").join("..");
        assert_eq!(resolve_root(&home, "v", via.to_str().unwrap()).unwrap(), vault.canonicalize().unwrap());
        std::os::unix::fs::symlink(&vault, tmp.path().join("link")).unwrap();
        let linked = tmp.path().join("link");
        assert_eq!(resolve_root(&home, "v", linked.to_str().unwrap()).unwrap(), vault.canonicalize().unwrap());
        // Refusals.
        let e = resolve_root(&home, "v", "relative/dir").unwrap_err().to_string();
        assert!(e.contains("must be absolute"), "{e}");
        let gone = tmp.path().join("gone");
        let e = resolve_root(&home, "v", gone.to_str().unwrap()).unwrap_err().to_string();
        assert!(e.contains("does not exist"), "{e}");
        std::fs::write(tmp.path().join("file.md"), "x").unwrap();
        let e = resolve_root(&home, "v", tmp.path().join("file.md").to_str().unwrap()).unwrap_err().to_string();
        assert!(e.contains("not a directory"), "{e}");
        for inside in [home.root().join("logs"), home.root().to_path_buf(), home.root().join("knowledge")] {
            let e = resolve_root(&home, "v", inside.to_str().unwrap()).unwrap_err().to_string();
            assert!(e.contains("inside COFFER_HOME"), "{}: {e}", inside.display());
        }
        // A symlink outside that points back inside COFFER_HOME is refused too.
        std::os::unix::fs::symlink(home.root().join("logs"), tmp.path().join("sneaky")).unwrap();
        let e = resolve_root(&home, "v", tmp.path().join("sneaky").to_str().unwrap()).unwrap_err().to_string();
        assert!(e.contains("inside COFFER_HOME"), "{e}");
        // Under knowledge/ is fine.
        let under = home.root().join("knowledge").join("other");
        std::fs::create_dir_all(&under).unwrap();
        assert!(resolve_root(&home, "v", under.to_str().unwrap()).is_ok());
    }
}
