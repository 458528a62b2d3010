"""Drives sandbox-host's REST API the way Klavis's Local Sandbox notebook
does, with httpx, plus the official MCP client on an mcp_server_url.

    host_client.py BASE API_KEY SCENARIO [ARGS]

Scenarios print one JSON object on stdout:
  notebook [NAMES]  acquire filesystem+git+terminal (or NAMES, comma-separated), upload
                    a 3-file tar.gz through the signed URL, initialize, dump, list the
                    archive, release
  notebook-5s       the same, the acquire with httpx's default 5 s timeout (the notebook's)
  mcp               acquire filesystem, list and call its tools through mcp_server_url
  mcp-bare          the same with the URL alone, no API key (as Klavis's notebooks)
  cycles N          N concurrent acquire/initialize/dump/release cycles
  profile BENCH SERVER TOOL ARGS
                    acquire SERVER with benchmark BENCH ("-": none), upload and initialize
                    the 3-file archive, call TOOL with the JSON ARGS through mcp_server_url,
                    dump, release; the files of the dump with their text
  profile-bare BENCH SERVER TOOL ARGS
                    the same without the upload (MCP_Atlas's harness uploads nothing)
  calls BENCH CALLS acquire the servers of CALLS (a JSON list of [server, tool, args]) with
                    benchmark BENCH ("-": none), upload nothing, make each call in an MCP
                    session of its own (as MCP_Atlas's client does), dump, release; the
                    calls' texts, the files of the dump, and each entry's type, mode,
                    link target and SHA-256
  sandbox NAME BENCH
                    as MCP_Atlas's Klavis integration: POST /sandbox/NAME with benchmark
                    BENCH ("-": none), list the tools through server_urls[NAME] alone
                    (no API key), GET it, DELETE /sandbox/NAME/ID
  mail              acquire poste_email_toolathlon (Toolathlon, jsmith@mcp.com), load a
                    mailbox through its initialize endpoint, read it and send a mail with
                    the emails server's tools, dump; release, acquire again, dump (empty),
                    load the default data, dump, release
  burst N SECONDS   the benchmarks' pattern: N tasks at once, each POST /sandbox/local_dev,
                    then one tool call on filesystem and one on terminal, the whole task
                    within SECONDS; each task's times and outcome, the wall time; releases
  burst-keep N SECONDS
                    the same, the sandboxes left for the caller to read and release
"""
import asyncio
import hashlib
import io
import json
import sys
import tarfile
import time

import httpx


def archive():
    files = {
        "hello.txt": "Hello from Klavis Local Sandbox!",
        "notes.md": "# Notes\n- item 1\n- item 2",
        "config.json": '{"app": "demo", "version": "1.0"}',
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, content in files.items():
            data = content.encode()
            info = tarfile.TarInfo(name=name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def cycle(base, headers, servers, notebook_timeout=False):
    out = {}
    # notebook_timeout: the acquire exactly as Klavis's notebook makes it,
    # with httpx's default timeout (5 s).
    async with httpx.AsyncClient() if notebook_timeout else httpx.AsyncClient(timeout=300.0) as c:
        resp = await c.post(f"{base}/local-sandbox", headers=headers, json={"server_names": servers})
        out["acquire_status"] = resp.status_code
        data = resp.json()
        if "local_sandbox_id" not in data:
            raise RuntimeError(f"acquire answered {resp.status_code}: {resp.text}")
    async with httpx.AsyncClient(timeout=300.0) as client:
        out["acquire"] = data
        sid = data["local_sandbox_id"]
        resp = await client.post(f"{base}/local-sandbox/{sid}/upload-url", headers=headers)
        upload = resp.json()
        out["upload_url"] = upload
        resp = await client.put(upload["upload_url"], headers={"Content-Type": "application/gzip"},
                                content=archive())
        out["upload_status"] = resp.status_code
        resp = await client.post(f"{base}/local-sandbox/{sid}/initialize", headers=headers)
        out["initialize"] = resp.json()
        resp = await client.get(f"{base}/local-sandbox/{sid}/dump", headers=headers)
        dump = resp.json()
        out["dump_url"] = dump
        resp = await client.get(dump["download_url"])
        with tarfile.open(fileobj=io.BytesIO(resp.content), mode="r:gz") as tar:
            out["members"] = [[m.name, m.size] for m in tar.getmembers()]
        resp = await client.delete(f"{base}/local-sandbox/{sid}", headers=headers)
        out["release"] = resp.json()
    return out


async def mcp(base, headers, bare=False):
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client
    async with httpx.AsyncClient(timeout=300.0) as client:
        resp = await client.post(f"{base}/local-sandbox", headers=headers,
                                 json={"server_names": ["filesystem"]})
        data = resp.json()
    url = data["servers"][0]["mcp_server_url"]
    # bare: as Klavis's notebooks do, the URL alone (its token admits it).
    async with streamablehttp_client(url, headers=None if bare else headers, timeout=120,
                                     sse_read_timeout=300) as (r, w, _):
        async with ClientSession(r, w) as s:
            await s.initialize()
            tools = sorted(t.name for t in (await s.list_tools()).tools)
            await s.call_tool("write_file", {"path": "via-host.txt", "content": "through the host"})
            got = await s.call_tool("read_text_file", {"path": "via-host.txt"})
            text = "".join(c.text for c in got.content if c.type == "text")
    async with httpx.AsyncClient(timeout=60.0) as client:
        await client.delete(f"{base}/local-sandbox/{data['local_sandbox_id']}", headers=headers)
    return {"tools": tools, "text": text, "url": url}


async def profile(base, headers, bench, server, tool, args, upload=True):
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client
    body = {"server_names": [server]}
    if bench != "-":
        body["benchmark"] = bench
    async with httpx.AsyncClient(timeout=300.0) as client:
        resp = await client.post(f"{base}/local-sandbox", headers=headers, json=body)
        data = resp.json()
    if resp.status_code != 201:
        return {"acquire_status": resp.status_code, "acquire": data}
    url = data["servers"][0]["mcp_server_url"]
    sid = data["local_sandbox_id"]
    # The task's files first, as the benchmarks' clients upload them: the
    # profile's workspace directories must survive the swap.
    async with httpx.AsyncClient(timeout=300.0) as client:
        if upload:
            resp = await client.post(f"{base}/local-sandbox/{sid}/upload-url", headers=headers)
            await client.put(resp.json()["upload_url"], headers={"Content-Type": "application/gzip"},
                             content=archive())
            resp = await client.post(f"{base}/local-sandbox/{sid}/initialize", headers=headers)
            resp.raise_for_status()
    async with streamablehttp_client(url, timeout=120, sse_read_timeout=300) as (r, w, _):
        async with ClientSession(r, w) as s:
            await s.initialize()
            got = await s.call_tool(tool, json.loads(args))
            text = "".join(c.text for c in got.content if c.type == "text")
    files = {}
    async with httpx.AsyncClient(timeout=300.0) as client:
        resp = await client.get(f"{base}/local-sandbox/{sid}/dump", headers=headers)
        resp = await client.get(resp.json()["download_url"])
        with tarfile.open(fileobj=io.BytesIO(resp.content), mode="r:gz") as tar:
            for m in tar.getmembers():
                f = tar.extractfile(m) if m.isfile() else None
                files[m.name] = f.read(65536).decode("utf-8", "replace") if f else None
        await client.delete(f"{base}/local-sandbox/{sid}", headers=headers)
    return {"acquire_status": 201, "acquire": data, "text": text, "is_error": bool(got.isError),
            "files": files}


async def calls(base, headers, bench, calls_json):
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client
    todo = json.loads(calls_json)
    body = {"server_names": sorted({c[0] for c in todo})}
    if bench != "-":
        body["benchmark"] = bench
    async with httpx.AsyncClient(timeout=300.0) as client:
        resp = await client.post(f"{base}/local-sandbox", headers=headers, json=body)
        data = resp.json()
    if resp.status_code != 201:
        return {"acquire_status": resp.status_code, "acquire": data}
    urls = {s["server_name"]: s["mcp_server_url"] for s in data["servers"]}
    sid = data["local_sandbox_id"]
    results = []
    for server, tool, args in todo:
        async with streamablehttp_client(urls[server], timeout=120, sse_read_timeout=300) as (r, w, _):
            async with ClientSession(r, w) as s:
                await s.initialize()
                got = await s.call_tool(tool, args)
                results.append({"text": "".join(c.text for c in got.content if c.type == "text"),
                                "is_error": bool(got.isError)})
    files, entries = {}, {}
    async with httpx.AsyncClient(timeout=300.0) as client:
        resp = await client.get(f"{base}/local-sandbox/{sid}/dump", headers=headers)
        resp = await client.get(resp.json()["download_url"])
        with tarfile.open(fileobj=io.BytesIO(resp.content), mode="r:gz") as tar:
            for m in tar.getmembers():
                f = tar.extractfile(m) if m.isfile() else None
                body = f.read() if f else None
                files[m.name] = body[:65536].decode("utf-8", "replace") if f else None
                kind = "dir" if m.isdir() else "symlink" if m.issym() else "file" if m.isfile() else "other"
                entries[m.name] = {"type": kind, "mode": m.mode & 0o7777,
                                   "link": m.linkname if m.issym() else None,
                                   "sha256": hashlib.sha256(body).hexdigest() if f else None}
        await client.delete(f"{base}/local-sandbox/{sid}", headers=headers)
    return {"acquire_status": 201, "acquire": data, "results": results, "files": files,
            "entries": entries}


MAILBOX = {"users": {"jsmith@mcp.com": {"emails": [
    {"subject": "Quarterly report due Friday", "from_addr": "Ann Lee <ann@mcp.com>",
     "to_addr": "jsmith@mcp.com", "cc_addr": "team@mcp.com", "date": "Wed, 10 Sep 2025 18:31:19 +0000",
     "message_id": "<q3-report@mcp.com>", "body_text": "Please send the Q3 numbers by Friday.",
     "is_read": False, "is_important": True, "folder": "INBOX"},
    {"subject": "Old newsletter", "from_addr": "news@mcp.com", "to_addr": "jsmith@mcp.com",
     "date": "Mon, 01 Sep 2025 08:00:00 +0000", "body_text": "archived", "is_read": True,
     "folder": "Archive"},
]}}}


async def mail(base, headers):
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client
    out = {}
    body = {"server_names": ["poste_email_toolathlon"], "benchmark": "Toolathlon",
            "test_account_email": "jsmith@mcp.com"}
    async with httpx.AsyncClient(timeout=300.0) as client:
        resp = await client.post(f"{base}/local-sandbox", headers=headers, json=body)
        data = out["acquire"] = resp.json()
        if resp.status_code != 201:
            return {"acquire_status": resp.status_code, **out}
        sid = data["local_sandbox_id"]
        url = data["servers"][0]["mcp_server_url"]
        srv = f"{base}/local-sandbox/poste_email_toolathlon/{sid}"
        resp = await client.post(f"{srv}/initialize", headers=headers, json=MAILBOX)
        out["initialize"] = [resp.status_code, resp.json()]
    async with streamablehttp_client(url, timeout=120, sse_read_timeout=300) as (r, w, _):
        async with ClientSession(r, w) as s:
            await s.initialize()
            got = await s.call_tool("get_emails", {"folder": "INBOX"})
            out["inbox"] = "".join(c.text for c in got.content if c.type == "text")
            got = await s.call_tool("send_email", {"to": "bob@mcp.com", "subject": "Q3 numbers",
                                                   "body": "Here they are."})
            out["sent"] = "".join(c.text for c in got.content if c.type == "text")
    async with httpx.AsyncClient(timeout=300.0) as client:
        resp = await client.get(f"{srv}/dump", headers=headers)
        out["dump"] = [resp.status_code, resp.json()]
        await client.delete(f"{base}/local-sandbox/{sid}", headers=headers)
        # The next tenant's mail service starts empty.
        for _ in range(100):
            resp = await client.post(f"{base}/local-sandbox", headers=headers, json=body)
            if resp.status_code == 201:
                break
            await asyncio.sleep(0.2)
        sid = resp.json()["local_sandbox_id"]
        srv = f"{base}/local-sandbox/poste_email_toolathlon/{sid}"
        resp = await client.get(f"{srv}/dump", headers=headers)
        out["dump_after_release"] = [resp.status_code, resp.json()]
        resp = await client.post(f"{srv}/initialize?init_default_data=true", headers=headers)
        out["initialize_default"] = [resp.status_code, resp.json()]
        resp = await client.get(f"{srv}/dump", headers=headers)
        out["dump_default"] = [resp.status_code, resp.json()]
        await client.delete(f"{base}/local-sandbox/{sid}", headers=headers)
    return out


async def sandbox(base, headers, name, bench):
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client
    out = {}
    async with httpx.AsyncClient(timeout=300.0) as client:
        resp = await client.post(f"{base}/sandbox/{name}", headers=headers,
                                 json={} if bench == "-" else {"benchmark": bench})
        data = resp.json()
        out["create"] = [resp.status_code, data]
        if resp.status_code != 200:
            return out
    async with streamablehttp_client(data["server_urls"][name], timeout=120,
                                     sse_read_timeout=300) as (r, w, _):
        async with ClientSession(r, w) as s:
            await s.initialize()
            out["tools"] = sorted(t.name for t in (await s.list_tools()).tools)
    async with httpx.AsyncClient(timeout=60.0) as client:
        sid = data["sandbox_id"]
        resp = await client.get(f"{base}/sandbox/{name}/{sid}", headers=headers)
        out["get"] = [resp.status_code, resp.json()]
        resp = await client.delete(f"{base}/sandbox/{name}/{sid}", headers=headers)
        out["release"] = [resp.status_code, resp.json()]
    return out


async def burst_one(base, headers, within):
    """The benchmarks' pattern, one task: local_dev through the MCP Sandbox
    API, one tool call on filesystem and one on terminal, all within
    `within` seconds (MCP_Atlas's client gives 30)."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client
    out = {}
    start = time.monotonic()

    async def task():
        async with httpx.AsyncClient(timeout=within) as client:
            resp = await client.post(f"{base}/sandbox/local_dev", headers=headers, json={})
            out["acquire_ms"] = (time.monotonic() - start) * 1000
            resp.raise_for_status()
            data = resp.json()
        out["sandbox_id"] = data["sandbox_id"]
        out["states"] = data.get("server_states", {})
        for server, tool, args in (("filesystem", "list_allowed_directories", {}),
                                   ("terminal", "run_command", {"command": "echo burst-ok"})):
            async with streamablehttp_client(data["server_urls"][server], timeout=within,
                                             sse_read_timeout=within) as (r, w, _):
                async with ClientSession(r, w) as s:
                    await s.initialize()
                    got = await s.call_tool(tool, args)
                    out[server] = {"is_error": bool(got.isError),
                                   "text": "".join(c.text for c in got.content if c.type == "text")}
        out["task_ms"] = (time.monotonic() - start) * 1000

    try:
        await asyncio.wait_for(task(), within)
        out["ok"] = not out["filesystem"]["is_error"] and "burst-ok" in out["terminal"]["text"]
    except BaseException as e:  # noqa: BLE001 - a timeout or any failure is a result here
        out["ok"] = False
        out["error"] = repr(e)[:300]
    return out


async def burst(base, headers, n, within, keep):
    t = time.monotonic()
    results = await asyncio.gather(*(burst_one(base, headers, within) for _ in range(n)))
    wall_ms = (time.monotonic() - t) * 1000
    if keep:
        # The caller reads the sandboxes' states, then releases them.
        return {"wall_ms": wall_ms, "results": results}
    async with httpx.AsyncClient(timeout=60.0) as client:
        for r in results:
            if "sandbox_id" in r:
                await client.delete(f"{base}/sandbox/local_dev/{r['sandbox_id']}", headers=headers)
    return {"wall_ms": wall_ms, "results": results}


async def main():
    base, key, scenario = sys.argv[1], sys.argv[2], sys.argv[3]
    headers = {"Authorization": f"Bearer {key}"}
    if scenario in ("notebook", "notebook-5s"):
        servers = sys.argv[4].split(",") if len(sys.argv) > 4 else ["filesystem", "git", "terminal"]
        out = await cycle(base, headers, servers, notebook_timeout=scenario == "notebook-5s")
    elif scenario == "mcp":
        out = await mcp(base, headers)
    elif scenario == "mcp-bare":
        out = await mcp(base, headers, bare=True)
    elif scenario == "profile":
        out = await profile(base, headers, *sys.argv[4:8])
    elif scenario == "profile-bare":
        out = await profile(base, headers, *sys.argv[4:8], upload=False)
    elif scenario == "calls":
        out = await calls(base, headers, sys.argv[4], sys.argv[5])
    elif scenario == "mail":
        out = await mail(base, headers)
    elif scenario == "sandbox":
        out = await sandbox(base, headers, *sys.argv[4:6])
    elif scenario in ("burst", "burst-keep"):
        out = await burst(base, headers, int(sys.argv[4]), float(sys.argv[5]),
                          scenario == "burst-keep")
    elif scenario == "cycles":
        n = int(sys.argv[4])
        results = await asyncio.gather(*(cycle(base, headers, ["filesystem"]) for _ in range(n)),
                                       return_exceptions=True)
        out = {"ok": sum(1 for r in results if isinstance(r, dict) and len(r["members"]) == 4),
               "errors": [repr(r) for r in results if not isinstance(r, dict)]}
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
