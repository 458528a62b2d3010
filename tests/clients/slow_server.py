"""A small stdio MCP server built on the official Python SDK, for fault
tests: its `sleep` tool takes as long as asked, so the test can kill the
server in the middle of a call."""
import asyncio

from mcp.server.fastmcp import FastMCP

app = FastMCP("slow")


@app.tool()
async def sleep(seconds: float) -> str:
    """Sleeps, then says so."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


if __name__ == "__main__":
    app.run("stdio")
