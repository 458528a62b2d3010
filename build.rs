//! Generates the gRPC client and server code from `proto/`.
//!
//! protoc comes from the `protoc-bin-vendored` crate unless `PROTOC` is set,
//! so a fresh machine needs no system package.

//! Without the `agent` feature (the fuzz target's archive-only build) there
//! is no gRPC code, and nothing to generate.

#[cfg(not(feature = "agent"))]
fn main() {}

#[cfg(feature = "agent")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    use std::path::PathBuf;

    let protos = [
        "proto/sandbox/agent/v1/common.proto",
        "proto/sandbox/agent/v1/agent.proto",
        "proto/sandbox/agent/v1/servers.proto",
        "proto/sandbox/agent/v1/workspace.proto",
    ];
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        // SAFETY: build scripts are single-threaded; nothing reads the
        // environment concurrently.
        unsafe { std::env::set_var("PROTOC", protoc) };
    }
    let include = protoc_bin_vendored::include_path()?;
    let includes = [PathBuf::from("proto"), include];
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        // Chunks as `bytes::Bytes`: decoded without copying.
        .bytes(".sandbox.agent.v1")
        .file_descriptor_set_path(out_dir.join("sandbox_agent_v1_descriptor.bin"))
        .compile_protos(&protos.map(PathBuf::from), &includes)?;
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    Ok(())
}
