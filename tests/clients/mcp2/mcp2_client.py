"""Drives the agent's MCP data plane with the official Python MCP SDK 2.x
client, which negotiates the session-less 2026-07-28 revision
(`server/discover`, then one self-contained POST per request) when the
server offers it.

    mcp2_client.py --uds SOCK | --base http://127.0.0.1:PORT [--token T] SERVER SCENARIO [ARGS]

Scenarios print one JSON object on stdout:
  tools                  the negotiated version, server name and tool names
  schemas                SERVER is a comma-separated list: each server's tools'
                         inputSchema by tool name, or the error listing them
  call TOOL JSON_ARGS    the text of one tools/call result
  concurrent N           N concurrent read_text_file calls of f<i>.txt (filesystem)
                         on one client; reports mismatches
  progress N             `count` N (features server) with a progress callback
"""
import argparse
import asyncio
import json

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


def text(result):
    return "".join(c.text for c in result.content if getattr(c, "type", "") == "text")


async def schemas(a):
    """Every tool's inputSchema of each server of a.server (comma-separated),
    the servers listed concurrently, each with a client of its own."""
    headers = {"Authorization": f"Bearer {a.token}"} if a.token else {}

    async def one(server):
        transport = httpx2.AsyncHTTPTransport(uds=a.uds) if a.uds else None
        http = httpx2.AsyncClient(headers=headers, transport=transport, timeout=120)
        url = f"{a.base}/{server}/mcp/?local_sandbox_id=test"
        try:
            async with http, Client(streamable_http_client(url, http_client=http), mode="auto") as c:
                tools = await c.list_tools()
                return server, {t.name: t.model_dump(by_alias=True)["inputSchema"] for t in tools.tools}
        except Exception as e:  # reported per server: the test names it
            return server, {"error": f"{type(e).__name__}: {e}"}

    return dict(await asyncio.gather(*(one(s) for s in a.server.split(","))))


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--uds")
    p.add_argument("--base", default="http://localhost")
    p.add_argument("--token")
    p.add_argument("server")
    p.add_argument("scenario")
    p.add_argument("args", nargs="*")
    a = p.parse_args()
    if a.scenario == "schemas":
        print(json.dumps(await schemas(a)))
        return
    headers = {"Authorization": f"Bearer {a.token}"} if a.token else {}
    transport = httpx2.AsyncHTTPTransport(uds=a.uds) if a.uds else None
    http = httpx2.AsyncClient(headers=headers, transport=transport, timeout=60)
    url = f"{a.base}/{a.server}/mcp/?local_sandbox_id=test"
    async with http, Client(streamable_http_client(url, http_client=http), mode="auto") as c:
        if a.scenario == "tools":
            tools = await c.list_tools()
            info = c.server_info
            out = {"version": c.protocol_version, "server": info.name if info else None,
                   "tools": sorted(t.name for t in tools.tools)}
        elif a.scenario == "call":
            r = await c.call_tool(a.args[0], json.loads(a.args[1]))
            out = {"version": c.protocol_version, "is_error": bool(r.is_error), "text": text(r)}
        elif a.scenario == "concurrent":
            n = int(a.args[0])
            bad = []

            async def one(i):
                r = await c.call_tool("read_text_file", {"path": f"f{i % 50}.txt"})
                if text(r).strip() != f"content {i % 50}":
                    bad.append({"call": i, "got": text(r)[:80]})

            await asyncio.gather(*(one(i) for i in range(n)))
            out = {"version": c.protocol_version, "calls": n, "mismatches": bad}
        elif a.scenario == "progress":
            got = []

            async def on_progress(progress, total, message):
                got.append(progress)

            r = await c.call_tool("count", {"n": int(a.args[0])}, progress_callback=on_progress)
            out = {"version": c.protocol_version, "text": text(r), "progress": got}
        else:
            raise SystemExit(f"unknown scenario {a.scenario}")
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
