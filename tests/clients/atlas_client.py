"""MCP_Atlas's Klavis-mode client, as it calls a sandbox host
(zihaolin96/mcp-atlas `klavis_sandbox_client.py`, read from
../shared/klavis-api/sandbox-api.md): POST /sandbox/{name} with
{"benchmark": "MCP_Atlas"} for every name at once (asyncio.gather, 30 s
timeout each, failures logged and skipped), then every tool call in a NEW
streamable-HTTP MCP session on the returned server_urls, without the key;
DELETE each at the end.

usage: atlas_client.py BASE_URL API_KEY NAME...
Prints {"acquired": {name: [servers]}, "failed": {name: status}, "calls": {...}}.
"""
import asyncio
import json
import sys

import httpx


async def acquire(c, base, headers, name):
    try:
        r = await c.post(f"{base}/sandbox/{name}", headers=headers, json={"benchmark": "MCP_Atlas"},
                         timeout=30)
    except httpx.HTTPError as e:
        return name, None, repr(e)
    if r.status_code != 200:
        return name, None, r.status_code
    return name, r.json(), None


async def call(url, tool, args):
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client
    async with streamablehttp_client(url, timeout=120, sse_read_timeout=300) as (r, w, _):
        async with ClientSession(r, w) as s:
            await s.initialize()
            got = await s.call_tool(tool, args)
            return "".join(c.text for c in got.content if c.type == "text")


async def main():
    base, key, names = sys.argv[1], sys.argv[2], sys.argv[3:]
    headers = {"Authorization": f"Bearer {key}"}
    out = {"acquired": {}, "failed": {}, "calls": {}}
    async with httpx.AsyncClient() as c:
        got = await asyncio.gather(*(acquire(c, base, headers, n) for n in names))
    boxes = {}
    for name, answer, err in got:
        if answer is None:
            out["failed"][name] = err
        else:
            boxes[name] = answer
            out["acquired"][name] = sorted(answer["server_urls"])
    urls = {}
    for answer in boxes.values():
        urls.update(answer["server_urls"])
    if "filesystem" in urls:
        await call(urls["filesystem"], "write_file", {"path": "/data/atlas.txt", "content": "state"})
        out["calls"]["filesystem"] = await call(urls["filesystem"], "read_text_file",
                                                {"path": "/data/atlas.txt"})
    if "localmemory" in urls:
        await call(urls["localmemory"], "create_entities",
                   {"entities": [{"name": "Atlas", "entityType": "task", "observations": ["first"]}]})
        graph = json.loads(await call(urls["localmemory"], "read_graph", {}))
        out["calls"]["localmemory"] = [e["name"] for e in graph["entities"] if e["name"] == "Atlas"]
    async with httpx.AsyncClient() as c:
        for name, answer in boxes.items():
            r = await c.delete(f"{base}/sandbox/{name}/{answer['sandbox_id']}", headers=headers, timeout=60)
            out.setdefault("released", {})[name] = r.status_code
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
