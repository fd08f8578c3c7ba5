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
    let fds = protox::compile(&files, [&dir])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Messages that carry credential values get a hand-written Debug (in lib.rs) that
        // prints names only, so no `{:?}` can put a value in a log.
        .skip_debug([".coffer.store.v1.SetCredentialRequest", ".coffer.store.v1.ResolveCredentialsReply"])
        .compile_fds(fds)?;
    Ok(())
}
