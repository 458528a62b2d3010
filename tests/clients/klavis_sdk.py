"""Klavis's own Python SDK (PyPI klavis==2.20.0) against sandbox-host, with
only base_url changed: its MCP Sandbox API calls, their answers parsed into
the SDK's own models (a shape it cannot parse raises).

usage: klavis_sdk.py BASE_URL API_KEY SCENARIO
  local_dev   create_sandbox(local_dev), get_sandbox, initialize_local_dev
              (files), dump_local_dev (download, list), an MCP call on
              server_urls without the key, reset_sandbox, dump again,
              delete_sandbox, get_sandbox again (404)
  localmemory create_sandbox(localmemory), initialize_sandbox(LocalMemoryData),
              read_graph through server_urls in a new MCP session each time,
              dump_sandbox, initialize_sandbox(init_default_data=True), delete_sandbox
Prints one JSON object.
"""
import asyncio
import io
import json
import sys
import tarfile

import httpx
from klavis import Klavis
from klavis.core.api_error import ApiError
from klavis.types import LocalMemoryData, LocalMemoryEntity, LocalMemoryRelation


def members(download_url):
    data = httpx.get(download_url, timeout=120).content
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return sorted((m.name.removeprefix("./"), tar.extractfile(m).read().decode())
                      for m in tar.getmembers() if m.isfile())


async def call(url, tool, args):
    """One tool call in a new MCP session, closed after (as MCP_Atlas does)."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client
    async with streamablehttp_client(url, timeout=120, sse_read_timeout=300) as (r, w, _):
        async with ClientSession(r, w) as s:
            await s.initialize()
            got = await s.call_tool(tool, args)
            return "".join(c.text for c in got.content if c.type == "text")


def local_dev(c):
    out = {}
    sb = c.sandbox.create_sandbox(server_name="local_dev")
    sid = sb.sandbox_id
    out["create"] = {"server_name": sb.server_name, "status": sb.status,
                     "servers": sorted(sb.server_urls or {})}
    info = c.sandbox.get_sandbox(server_name="local_dev", sandbox_id=sid)
    out["get"] = {"sandbox_id": info.sandbox_id == sid, "status": info.status}
    init = c.sandbox.initialize_local_dev(
        sid, files=[("notes/hello.txt", b"hello from the SDK"), ("data.csv", b"a,b\n1,2\n")])
    out["initialize"] = {"sandbox_id": init.sandbox_id == sid, "message": init.message}
    dump = c.sandbox.dump_local_dev(sid)
    out["dump"] = members(dump["download_url"])
    out["mcp_read"] = asyncio.run(call(sb.server_urls["filesystem"], "read_text_file",
                                       {"path": "notes/hello.txt"}))
    reset = c.sandbox.reset_sandbox(server_name="local_dev", sandbox_id=sid)
    out["reset"] = {"status": reset.status}
    out["dump_after_reset"] = members(c.sandbox.dump_local_dev(sid)["download_url"])
    rel = c.sandbox.delete_sandbox(server_name="local_dev", sandbox_id=sid)
    out["delete"] = {"sandbox_id": rel.sandbox_id == sid, "status": rel.status}
    try:
        c.sandbox.get_sandbox(server_name="local_dev", sandbox_id=sid)
        out["get_after_delete"] = 200
    except ApiError as e:
        out["get_after_delete"] = e.status_code
    return out


def localmemory(c):
    out = {}
    sb = c.sandbox.create_sandbox(server_name="localmemory")
    sid = sb.sandbox_id
    out["create"] = {"server_name": sb.server_name, "servers": sorted(sb.server_urls or {})}
    data = LocalMemoryData(
        entities=[LocalMemoryEntity(name="Ada", entity_type="person", observations=["wrote the first program"]),
                  LocalMemoryEntity(name="Engine", entity_type="machine", observations=[])],
        relations=[LocalMemoryRelation(from_="Ada", to="Engine", relation_type="programmed")])
    init = c.sandbox.initialize_sandbox(sid, request=data)
    out["initialize"] = init.message
    url = sb.server_urls["localmemory"]
    graph = json.loads(asyncio.run(call(url, "read_graph", {})))
    out["graph"] = sorted(e["name"] for e in graph["entities"])
    asyncio.run(call(url, "add_observations",
                     {"observations": [{"entityName": "Ada", "contents": ["kept across sessions"]}]}))
    dump = c.sandbox.dump_sandbox(sid)
    # The SDK declares the dump's data a dict (LocalMemoryDataOutput).
    out["dump"] = {
        "server_name": dump.server_name,
        "entities": sorted((e["name"], e["entityType"], tuple(e.get("observations") or []))
                           for e in dump.data.get("entities") or []),
        "relations": [(r["from"], r["to"], r["relationType"]) for r in dump.data.get("relations") or []],
    }
    # Klavis's default test data, in place of what was there.
    c.sandbox.initialize_sandbox(sid, init_default_data=True)
    graph = json.loads(asyncio.run(call(url, "read_graph", {})))
    out["default"] = {"entities": sorted(e["name"] for e in graph["entities"]),
                      "relations": len(graph["relations"])}
    c.sandbox.delete_sandbox(server_name="localmemory", sandbox_id=sid)
    return out


def main():
    base, key, scenario = sys.argv[1:4]
    c = Klavis(api_key=key, base_url=base, timeout=300)
    out = {"local_dev": local_dev, "localmemory": localmemory}[scenario](c)
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
