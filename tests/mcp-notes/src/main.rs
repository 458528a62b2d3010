//! A tiny stdio MCP server built on the official Rust MCP SDK (`rmcp`),
//! small and static enough to ship in the test VM's initramfs. Tools:
//! `echo`, `add`, and `list_workspace` (the names of the files in its
//! working directory, the sandbox's workspace).
//!
//! Not part of the agent; built with
//! `cargo build --release --target x86_64-unknown-linux-musl -p mcp-notes`.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::schemars::{self, JsonSchema};
use rmcp::{ServiceExt, tool, tool_router};
use serde::Deserialize;

#[derive(Clone)]
struct Notes;

#[derive(Deserialize, JsonSchema)]
struct EchoArgs {
    /// Text to send back.
    text: String,
}

#[derive(Deserialize, JsonSchema)]
struct AddArgs {
    a: i64,
    b: i64,
}

#[tool_router(server_handler)]
impl Notes {
    #[tool(description = "Returns the text it is given")]
    async fn echo(&self, Parameters(args): Parameters<EchoArgs>) -> String {
        args.text
    }

    #[tool(description = "Adds two integers")]
    async fn add(&self, Parameters(args): Parameters<AddArgs>) -> String {
        args.a.saturating_add(args.b).to_string()
    }

    #[tool(description = "Lists the files in the working directory, sorted, one per line")]
    async fn list_workspace(&self) -> Result<String, String> {
        let mut names = Vec::new();
        let dir = std::fs::read_dir(".").map_err(|e| format!("reading the workspace: {e}"))?;
        for entry in dir {
            let entry = entry.map_err(|e| format!("reading the workspace: {e}"))?;
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names.join("\n"))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let service = Notes.serve(rmcp::transport::stdio()).await?;
    service.waiting().await?;
    Ok(())
}
