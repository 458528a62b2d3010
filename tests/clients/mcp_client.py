"""Drives the agent's MCP data plane with the official Python MCP SDK client
(streamable HTTP), over the agent's unix socket or TCP.

    mcp_client.py --uds SOCK | --base http://127.0.0.1:PORT [--token T] SERVER SCENARIO [ARGS]

Scenarios print one JSON object on stdout:
  tools                       the tool names
  schemas                     SERVER is a comma-separated list: each server's tools'
                              inputSchema by tool name, or the error listing them
  call TOOL JSON_ARGS         the text of one tools/call result
  concurrent SESSIONS CALLS   SESSIONS sessions × CALLS concurrent read_text_file
                              calls of files f<i>.txt (filesystem); reports mismatches
  memory-sessions N           N create_entities calls, each on a new session, then
                              read_graph on another: the entity count
  progress SESSIONS N         SESSIONS sessions call `count` N concurrently (features
                              server); the progress values each one received
  roots                       sessions with different roots call `roots` in turn, then
                              a session without the capability: what each got
  list-changed                one session calls `change`; whether another session's
                              GET stream delivered tools/list_changed
"""
import argparse
import asyncio
import json
import sys

import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client


def factory(uds, token):
    def make(headers=None, timeout=None, auth=None):
        h = dict(headers or {})
        if token:
            h["Authorization"] = f"Bearer {token}"
        transport = httpx.AsyncHTTPTransport(uds=uds) if uds else None
        return httpx.AsyncClient(headers=h, timeout=timeout, auth=auth, transport=transport)
    return make


class Client:
    def __init__(self, a):
        self.url = f"{a.base}/{a.server}/mcp/?local_sandbox_id=test"
        self.make = factory(a.uds, a.token)

    def session(self, **kw):
        return _Session(self, kw)


class _Session:
    def __init__(self, c, kw):
        self.c = c
        self.kw = kw

    async def __aenter__(self):
        self.http = streamablehttp_client(self.c.url, httpx_client_factory=self.c.make)
        r, w, _ = await self.http.__aenter__()
        self.s = ClientSession(r, w, **self.kw)
        await self.s.__aenter__()
        await self.s.initialize()
        return self.s

    async def __aexit__(self, *exc):
        await self.s.__aexit__(*exc)
        await self.http.__aexit__(*exc)


def text(result):
    return "".join(c.text for c in result.content if getattr(c, "type", "") == "text")


async def schemas(a):
    """Every tool's inputSchema of each server of a.server (comma-separated),
    the servers listed concurrently, each on a session of its own."""
    async def one(server):
        c = Client(argparse.Namespace(**{**vars(a), "server": server}))
        try:
            async with c.session() as s:
                tools = await s.list_tools()
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
    c = Client(a)
    if a.scenario == "tools":
        async with c.session() as s:
            tools = await s.list_tools()
            out = {"tools": sorted(t.name for t in tools.tools)}
    elif a.scenario == "call":
        async with c.session() as s:
            r = await s.call_tool(a.args[0], json.loads(a.args[1]))
            out = {"is_error": bool(r.isError), "text": text(r)}
    elif a.scenario == "concurrent":
        sessions, calls = int(a.args[0]), int(a.args[1])
        bad = []

        async def one_session(k):
            async with c.session() as s:
                async def one(i):
                    n = (k * calls + i) % 50
                    r = await s.call_tool("read_text_file", {"path": f"f{n}.txt"})
                    if text(r).strip() != f"content {n}":
                        bad.append({"session": k, "call": i, "got": text(r)[:80]})
                await asyncio.gather(*(one(i) for i in range(calls)))

        await asyncio.gather(*(one_session(k) for k in range(sessions)))
        out = {"calls": sessions * calls, "mismatches": bad}
    elif a.scenario == "memory-sessions":
        n = int(a.args[0])
        for i in range(n):
            async with c.session() as s:
                r = await s.call_tool("create_entities", {"entities": [
                    {"name": f"entity-{i}", "entityType": "test", "observations": [f"made in session {i}"]}]})
                if r.isError:
                    raise SystemExit(f"create_entities {i} failed: {text(r)}")
        async with c.session() as s:
            r = await s.call_tool("read_graph", {})
            graph = json.loads(text(r))
            out = {"entities": len(graph.get("entities", []))}
    elif a.scenario == "progress":
        sessions, n = int(a.args[0]), int(a.args[1])

        async def one_session(k):
            got = []

            async def on_progress(progress, total, message):
                got.append(progress)

            async with c.session() as s:
                r = await s.call_tool("count", {"n": n}, progress_callback=on_progress)
                return {"text": text(r), "progress": got}

        out = {"sessions": await asyncio.gather(*(one_session(k) for k in range(sessions)))}
    elif a.scenario == "roots":
        from mcp import types
        from pydantic import FileUrl

        def roots_of(uri):
            async def cb(ctx):
                return types.ListRootsResult(roots=[types.Root(uri=FileUrl(uri))])
            return cb

        out = {}
        for name in ["a", "b"]:
            async with c.session(list_roots_callback=roots_of(f"file:///{name}")) as s:
                r = await s.call_tool("roots", {})
                out[name] = text(r)
        async with c.session() as s:
            r = await asyncio.wait_for(s.call_tool("roots", {}), 20)
            out["none"] = {"is_error": bool(r.isError), "text": text(r)}
    elif a.scenario == "list-changed":
        from mcp import types
        got = asyncio.Event()

        async def on_message(m):
            if isinstance(m, types.ServerNotification) and isinstance(
                    m.root, types.ToolListChangedNotification):
                got.set()

        async with c.session(message_handler=on_message):
            async with c.session() as s:
                # The listener's GET stream opens in the background.
                for _ in range(40):
                    await s.call_tool("change", {})
                    try:
                        await asyncio.wait_for(got.wait(), 0.25)
                        break
                    except asyncio.TimeoutError:
                        pass
        out = {"received": got.is_set()}
    else:
        raise SystemExit(f"unknown scenario {a.scenario}")
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
