"""Discovery of MCP servers as a benchmark's client meets them, with the
official Python MCP SDK this interpreter has (1.x: `ClientSession`, the
2025 handshake; 2.x: `Client`, which negotiates the session-less
2026-07-28 revision through `server/discover`).

    discovery.py URL[|TOOL[|JSON_ARGS]] ...

For each URL, one after another, in one session: what the server says of
itself (name, version, capabilities, instructions, the negotiated protocol
version), every page of tools/list, prompts/list, resources/list and
resources/templates/list, and ping; each as the SDK parsed it, or the
error it raised. With `|TOOL`, that tool is called afterwards in the same
session (a name no server has just starts the server: its error answer
is the proof). Prints {URL: {...}} as JSON.
"""
import asyncio
import json
import sys

import mcp

SDK2 = hasattr(mcp, "Client")


def dump(x):
    return x.model_dump(by_alias=True, mode="json", exclude_none=True)


async def pages(list_page):
    """Every page of a listing, following nextCursor."""
    out, cursor = [], None
    for _ in range(1000):
        page = await list_page(cursor)
        out.append(dump(page))
        cursor = page.nextCursor if hasattr(page, "nextCursor") else page.next_cursor
        if not cursor:
            return out
    raise RuntimeError("more than 1000 pages")


async def attempt(f):
    try:
        return await f()
    except Exception as e:  # the server's error answer, as the SDK raised it
        return {"error": f"{type(e).__name__}: {e}"}


def text(result):
    return "".join(getattr(c, "text", "") for c in result.content)


async def lists(s):
    async def listing(method):
        return await attempt(lambda: pages(lambda c: getattr(s, method)(cursor=c) if c else getattr(s, method)()))

    return {
        "tools": await listing("list_tools"),
        "prompts": await listing("list_prompts"),
        "resources": await listing("list_resources"),
        "templates": await listing("list_resource_templates"),
        "ping": await attempt(lambda: _ping(s)),
    }


async def _ping(s):
    return dump(await s.send_ping())


async def call(s, tool, args):
    async def go():
        r = await s.call_tool(tool, args)
        is_error = r.is_error if SDK2 else r.isError
        return {"is_error": bool(is_error), "text": text(r)[:2000]}

    return await attempt(go)


async def one_sdk1(url, tool, args):
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    async with streamablehttp_client(url, timeout=120) as (r, w, _):
        async with ClientSession(r, w) as s:
            init = dump(await s.initialize())
            out = {"init": init, **await lists(s)}
            if tool:
                out["call"] = await call(s, tool, args)
            return out


async def one_sdk2(url, tool, args):
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    import httpx2

    http = httpx2.AsyncClient(timeout=120)
    async with http, Client(streamable_http_client(url, http_client=http), mode="auto") as c:
        init = {
            "protocolVersion": c.protocol_version,
            "serverInfo": dump(c.server_info) if c.server_info else None,
            "capabilities": dump(c.server_capabilities) if c.server_capabilities else None,
            "instructions": c.instructions,
        }
        out = {"init": init, **await lists(c)}
        if tool:
            out["call"] = await call(c, tool, args)
        return out


async def main():
    out = {}
    for arg in sys.argv[1:]:
        url, tool, args = (arg.split("|", 2) + [None, None])[:3]
        args = json.loads(args) if args else {}
        one = one_sdk2 if SDK2 else one_sdk1
        out[url] = await attempt(lambda: one(url, tool, args))
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
