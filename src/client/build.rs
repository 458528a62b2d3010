//! Generates the gRPC client and server code from the repository's
//! `proto/` directory (the one source of the wire contract).
//!
//! protoc comes from the `protoc-bin-vendored` crate unless `PROTOC` is set,
//! so a fresh machine needs no system package.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let protos = ["common", "agent", "servers", "workspace", "exec"]
        .map(|p| root.join(format!("sandbox/agent/v1/{p}.proto")));
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        // SAFETY: build scripts are single-threaded; nothing reads the
        // environment concurrently.
        unsafe { std::env::set_var("PROTOC", protoc) };
    }
    let include = protoc_bin_vendored::include_path()?;
    let includes = [root.clone(), include];
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        // Chunks as `bytes::Bytes`: decoded without copying.
        .bytes(".sandbox.agent.v1")
        .file_descriptor_set_path(out_dir.join("sandbox_agent_v1_descriptor.bin"))
        .compile_protos(&protos, &includes)?;
    for p in &protos {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    Ok(())
}
