"""A small stdio MCP server built on the official Python SDK that uses the
protocol's server-to-client features, so gateway tests can check where they
are routed:

- `sleep`: takes as long as asked (the test kills the server mid-call); with
  `started`, it first creates that file, so the test knows the call is in
  flight before it kills anything;
- `count`: reports progress n times before answering;
- `roots`: asks the client for its roots (`roots/list`) and returns them;
- `change`: sends `notifications/tools/list_changed`.
"""
import asyncio

from mcp.server.fastmcp import Context, FastMCP

app = FastMCP("features")


@app.tool()
async def sleep(seconds: float, started: str = "") -> str:
    """Sleeps, then says so. Creates the file `started` first, if given."""
    if started:
        with open(started, "w") as f:
            f.write("sleeping\n")
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


@app.tool()
async def count(n: int, ctx: Context) -> str:
    """Reports progress 1..n, then answers right after the last (the two
    messages often in one read of the pipe: the answer must not overtake
    the progress)."""
    for i in range(1, n + 1):
        await ctx.report_progress(i, n)
        if i < n:
            await asyncio.sleep(0.02)
    return f"counted {n}"


@app.tool()
async def roots(ctx: Context) -> str:
    """The calling client's roots, comma-separated."""
    r = await ctx.session.list_roots()
    return ",".join(str(x.uri) for x in r.roots)


@app.tool()
async def change(ctx: Context) -> str:
    """Announces that the tool list changed."""
    await ctx.session.send_tool_list_changed()
    return "sent"


if __name__ == "__main__":
    app.run("stdio")
