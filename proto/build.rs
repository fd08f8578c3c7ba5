//! Compiles every `*.proto` in this folder with `protox` (pure Rust, no system `protoc`).
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "proto"))
        .collect();
    files.sort();
    // The folder itself too: a `.proto` added later must rerun this script (cargo scans a
    // directory named here for any change).
    println!("cargo:rerun-if-changed={}", dir.display());
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    // Files that use another package's messages are generated in a pass of their own, where
    // that package is named by its flat module (`crate::store`, see lib.rs) instead of the
    // nested path prost would write.
    let (cross, own): (Vec<PathBuf>, Vec<PathBuf>) =
        files.into_iter().partition(|f| CROSS_PACKAGE.iter().any(|c| f.ends_with(c)));
    // That pass also writes the imported packages' files (partial: their types are extern
    // there), so it runs first and the full pass overwrites them.
    let fds = protox::compile(&cross, [&dir])?;
    configure().extern_path(".coffer.store.v1", "crate::store").compile_fds(fds)?;
    let fds = protox::compile(&own, [&dir])?;
    configure().compile_fds(fds)?;
    Ok(())
}

/// The `.proto` files that import `store_*.proto` from another package.
const CROSS_PACKAGE: &[&str] = &["llm.proto"];

fn configure() -> tonic_prost_build::Builder {
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Messages that carry credential values get a hand-written Debug (in lib.rs) that
        // prints names only, so no `{:?}` can put a value in a log.
        .skip_debug([
            ".coffer.store.v1.SetCredentialRequest",
            ".coffer.store.v1.ResolveCredentialsReply",
            ".coffer.control.v1.StartServiceRequest",
        ])
}
