"""One real task of each benchmark through a sandbox host, as the benchmark's
Klavis integration drives it (its calls re-expressed from the public
repositories, read in ../shared/klavis-api/sandbox-api.md and
../shared/benchmarks.md), with a scripted solution in place of the model.
httpx for the REST calls and the official MCP Python SDK (1.x) on the MCP
URLs, as the integrations use them.

    benchmark_tasks.py BASE API_KEY SCENARIO ARGS...

Scenarios print one JSON object on stdout:
  paths BENCH CALLS      acquire the servers of CALLS (a JSON list of [server, tool, args])
                         with benchmark BENCH on /local-sandbox, upload probe.txt, make
                         each call in a session of its own; the calls' results, the
                         workspace's listing through the filesystem server, the dump's names
  toolathlon TASK OUT    Toolathlon's sequence (POST /sandbox/local_dev, upload-url, PUT,
                         initialize) with TASK/initial_workspace_extracted, the scripted
                         solution of privacy-desensitization (terminal, filesystem), dump,
                         download into OUT, DELETE
  atlas                  MCP_Atlas's sequence: POST /sandbox/local_dev and /sandbox/localmemory
                         in parallel, every call in a NEW MCP session; the task's answers
  atlas-genres           MCP_Atlas task 68993ef3cf3e953b8ab83fa9 (rank the genres of
                         /data/Top Movies.csv) with its enabled tools: every server of
                         local_dev listed first, then desktop-commander (get_config,
                         list_directory, search_files, search_code, read_file) and
                         mcp-code-executor (get_environment_config, check_installed_packages,
                         execute_code, read_code_file), each call in a NEW session
  atlas-flood            hostile runs through MCP_Atlas's mcp-code-executor: processes left
                         in the run's group, in a session of their own and as a daemon, all
                         holding stdout, then 64 MiB on stdout; a run that exits leaving one
                         that holds stdout; after each, a run that counts what is left
  mark TREE OUT          MCP_Mark's sequence (POST /local-sandbox filesystem, upload TREE with
                         arcname "."), the scripted solution of file_property/largest_rename,
                         dump into OUT, release
"""
import asyncio
import io
import json
import os
import sys
import tarfile

import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client


async def call(url, tool, args):
    """One tool call in a session of its own: (is_error, text)."""
    async with streamablehttp_client(url, timeout=120, sse_read_timeout=300) as (r, w, _):
        async with ClientSession(r, w) as s:
            await s.initialize()
            got = await s.call_tool(tool, args)
            return bool(got.isError), "".join(c.text for c in got.content if c.type == "text")


def tiny_pdf():
    """A one-page PDF with a correct cross-reference table."""
    objs = [b"<</Type/Catalog/Pages 2 0 R>>", b"<</Type/Pages/Kids[3 0 R]/Count 1>>",
            b"<</Type/Page/Parent 2 0 R/MediaBox[0 0 200 200]>>"]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for i, o in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + o + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    for off in offsets:
        out += b"%010d 00000 n \n" % off
    out += b"trailer\n<</Size %d/Root 1 0 R>>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return bytes(out)


def pack(root, arcname_dot=False):
    """A tar.gz of the files under root (Toolathlon: files only; MCP_Mark: arcname ".")."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        if arcname_dot:
            t.add(root, arcname=".")
        else:
            for d, _, files in os.walk(root):
                for f in sorted(files):
                    p = os.path.join(d, f)
                    t.add(p, arcname=os.path.relpath(p, root))
    return buf.getvalue()


def tar_of(files):
    """A tar.gz of files {name: bytes}."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def load(c, base, api, sid, headers, data):
    up = (await c.post(f"{base}/{api}/{sid}/upload-url", headers=headers)).json()["upload_url"]
    r = await c.put(up, content=data, headers={"Content-Type": "application/gzip"})
    r.raise_for_status()
    r = await c.post(f"{base}/{api}/{sid}/initialize", headers=headers, timeout=120)
    r.raise_for_status()


async def dump_to(c, base, api, sid, headers, out):
    r = await c.get(f"{base}/{api}/{sid}/dump", headers=headers, timeout=120)
    r.raise_for_status()
    body = r.json()
    got = await c.get(body["download_url"], timeout=120)
    got.raise_for_status()
    with tarfile.open(fileobj=io.BytesIO(got.content), mode="r:gz") as t:
        if out is not None:
            os.makedirs(out, exist_ok=True)
            t.extractall(out, filter="data")
        return sorted(m.name for m in t.getmembers())


async def paths(base, headers, bench, calls_json):
    calls = json.loads(calls_json)
    servers = sorted({c[0] for c in calls} | {"filesystem"})
    body = {"server_names": servers}
    if bench != "-":
        body["benchmark"] = bench
    out = {"results": []}
    async with httpx.AsyncClient(timeout=300) as c:
        r = await c.post(f"{base}/local-sandbox", headers=headers, json=body)
        r.raise_for_status()
        a = r.json()
        sid = a["local_sandbox_id"]
        try:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w:gz") as t:
                for name, data in (("probe.txt", b"probe content\n"), ("probe.pdf", tiny_pdf())):
                    ti = tarfile.TarInfo(name)
                    ti.size = len(data)
                    t.addfile(ti, io.BytesIO(data))
            await load(c, base, "local-sandbox", sid, headers, buf.getvalue())
            urls = {s["server_name"]: s["mcp_server_url"] for s in a["servers"]}
            for server, tool, args in calls:
                err, text = await call(urls[server], tool, args)
                out["results"].append({"call": [server, tool, args], "is_error": err, "text": text})
            out["dump"] = await dump_to(c, base, "local-sandbox", sid, headers, None)
        finally:
            await c.delete(f"{base}/local-sandbox/{sid}", headers=headers)
    return out


async def toolathlon(base, headers, task, out_dir):
    """privacy-desensitization: filesystem + terminal, the workspace uploaded."""
    src = os.path.join(task, "initial_workspace_extracted")
    truth = os.path.join(task, "groundtruth_extracted", "desensitized_documents")
    out = {"calls": []}
    async with httpx.AsyncClient(timeout=60) as c:
        r = await c.post(f"{base}/sandbox/local_dev", headers=headers, json={"benchmark": "Toolathlon"})
        r.raise_for_status()
        box = r.json()
        sid, urls = box["sandbox_id"], box["server_urls"]
        out["server_urls"] = sorted(urls)
        try:
            await load(c, base, "sandbox/local_dev", sid, headers, pack(src))
            fs, term = urls["filesystem"], urls["terminal"]

            async def step(url, tool, args):
                err, text = await call(url, tool, args)
                out["calls"].append({"tool": tool, "is_error": err, "text": text[:2000]})
                return text

            # The scripted model: look at /data, make the output directory
            # relative to the workspace, then one copy per document.
            listing = await step(fs, "list_directory", {"path": "/data"})
            await step(term, "run_command", {"command": "mkdir -p desensitized_documents && ls"})
            names = [l[len("[FILE] "):] for l in listing.splitlines() if l.startswith("[FILE] ")]
            for name in names:
                await step(fs, "read_file", {"path": f"/data/{name}"})
                stem, ext = os.path.splitext(name)
                with open(os.path.join(truth, f"{stem}_desensitized{ext}"), encoding="utf-8") as f:
                    text = f.read()
                await step(fs, "write_file",
                           {"path": f"/data/desensitized_documents/{stem}_desensitized{ext}",
                            "content": text})
            await step(fs, "directory_tree", {"path": "/data"})
            await step(term, "run_command", {"command": "ls desensitized_documents | wc -l"})
            r = await c.get(f"{base}/sandbox/local_dev/{sid}/dump", headers=headers, timeout=120)
            r.raise_for_status()
            got = await c.get(r.json()["download_url"], timeout=120)
            got.raise_for_status()
            os.makedirs(out_dir, exist_ok=True)
            with tarfile.open(fileobj=io.BytesIO(got.content), mode="r:gz") as t:
                t.extractall(out_dir, filter="data")
        finally:
            r = await c.delete(f"{base}/sandbox/local_dev/{sid}", headers=headers)
            out["released"] = r.status_code
    return out


async def atlas_acquire(c, base, headers, name):
    r = await c.post(f"{base}/sandbox/{name}", headers=headers, json={"benchmark": "MCP_Atlas"},
                     timeout=30)
    r.raise_for_status()
    return name, r.json()


async def atlas(base, headers):
    """A task over /data: the barber shop's total and the memory graph's facts."""
    out = {}
    async with httpx.AsyncClient() as c:
        got = dict(await asyncio.gather(*(atlas_acquire(c, base, headers, n)
                                          for n in ("local_dev", "localmemory"))))
        urls = {}
        for box in got.values():
            urls.update(box["server_urls"])
        out["server_urls"] = sorted(urls)
        try:
            dc = urls["desktop-commander"]
            out["config"] = await call(dc, "get_config", {})
            out["listing"] = await call(dc, "list_directory", {"path": "/data"})
            out["csv"] = await call(dc, "read_file", {"path": "/data/Barber Shop.csv",
                                                      "length": 100000})
            out["outside"] = await call(dc, "read_file", {"path": "/etc/hostname"})
            out["graph"] = await call(urls["localmemory"], "read_graph", {})
            out["fs_csv"] = await call(urls["filesystem"], "read_text_file",
                                       {"path": "/data/Barber Shop.csv"})
        finally:
            for name, box in got.items():
                await c.delete(f"{base}/sandbox/{name}/{box['sandbox_id']}", headers=headers,
                               timeout=60)
    return out


async def tool_names(url):
    async with streamablehttp_client(url, timeout=120, sse_read_timeout=300) as (r, w, _):
        async with ClientSession(r, w) as s:
            await s.initialize()
            return sorted(t.name for t in (await s.list_tools()).tools)


# The scripted model's analysis, run by mcp-code-executor in the sandbox.
GENRES = """import pandas as pd
movies = pd.read_csv("/data/Top Movies.csv")
counts = movies["Genre"].fillna("None").value_counts()
print("Movie count by genre:")
for genre, n in counts.items():
    print(f"{genre}: {n}")
"""

# After an upload: the venv is back, its packages linked.
AFTER_UPLOAD = """import os, pandas
print(pandas.__version__, os.path.islink(".venv/lib/python3.11/site-packages/pandas"), sorted(os.listdir("/data")))
"""


async def atlas_genres(base, headers):
    out = {}
    async with httpx.AsyncClient() as c:
        _, box = await atlas_acquire(c, base, headers, "local_dev")
        urls = box["server_urls"]
        try:
            # MCP_Atlas lists every server's tools before its task.
            out["tools"] = dict(zip(urls, await asyncio.gather(*(tool_names(u) for u in urls.values()))))
            dc, ce = urls["desktop-commander"], urls["code-executor"]
            out["config"] = await call(dc, "get_config", {})
            out["listing"] = await call(dc, "list_directory", {"path": "/data"})
            out["search_files"] = await call(dc, "search_files", {"path": "/data", "pattern": "movies"})
            out["search_code"] = await call(dc, "search_code", {"path": "/data", "pattern": "Animation"})
            out["read"] = await call(dc, "read_file", {"path": "/data/Top Movies.csv"})
            out["env"] = await call(ce, "get_environment_config", {})
            out["packages"] = await call(ce, "check_installed_packages", {"packages": ["pandas", "numpy", "scipy"]})
            out["run"] = await call(ce, "execute_code", {"code": GENRES, "filename": "genres.py"})
            ran = json.loads(out["run"][1])
            out["code"] = await call(ce, "read_code_file", {"file_path": ran.get("file_path", "")})
            # Installed already: uv audits it, offline.
            out["install"] = await call(ce, "install_dependencies", {"packages": ["pandas==2.3.1"]})
            # An upload replaces /data, venv and all: the next run has it again.
            await load(c, base, "sandbox/local_dev", box["sandbox_id"], headers, tar_of({"note.txt": b"hi\n"}))
            out["after_upload"] = await call(ce, "execute_code", {"code": AFTER_UPLOAD})
        finally:
            r = await c.delete(f"{base}/sandbox/local_dev/{box['sandbox_id']}", headers=headers, timeout=60)
            out["released"] = r.status_code
    return out


# A tenant's code that leaves processes behind, all holding its stdout:
# one in its group, one in a session of its own, one a daemon (a double
# fork out of a new session, its parent gone); then it floods stdout far
# past the executor's 1 MiB limit.
FLOOD = """import os, subprocess, sys
subprocess.Popen(["sleep", "4242.5"])
subprocess.Popen(["sleep", "4242.5"], start_new_session=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp("sleep", ["sleep", "4242.5"])
    os._exit(0)
sys.stdout.write("x" * (64 << 20))
"""
# Exits at once, leaving a process of its own session that holds stdout:
# answered when the run's own process ends, not when that one would.
LINGER = """import subprocess
subprocess.Popen(["sleep", "4242.5"], start_new_session=True)
print("main done")
"""
# Counts the processes of FLOOD and LINGER still running (their command
# lines name the sleepers' unusual duration).
LEFT = """import os
left = 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            left += b"4242.5" in f.read()
    except OSError:
        pass
print(f"left: {left}")
"""


async def atlas_flood(base, headers):
    out = {}
    async with httpx.AsyncClient() as c:
        _, box = await atlas_acquire(c, base, headers, "local_dev")
        ce = box["server_urls"]["code-executor"]
        try:
            out["flood"] = await call(ce, "execute_code", {"code": FLOOD})
            out["left"] = await call(ce, "execute_code", {"code": LEFT})
            out["linger"] = await call(ce, "execute_code", {"code": LINGER})
            out["left_after_linger"] = await call(ce, "execute_code", {"code": LEFT})
        finally:
            r = await c.delete(f"{base}/sandbox/local_dev/{box['sandbox_id']}", headers=headers, timeout=60)
            out["released"] = r.status_code
    return out


async def mark(base, headers, tree, out_dir):
    """file_property/largest_rename: rename the largest .jpg to largest.jpg."""
    out = {"calls": []}
    body = {"server_names": ["filesystem"], "benchmark": "MCP_Mark", "ttl_seconds": 7200}
    async with httpx.AsyncClient(timeout=60) as c:
        r = await c.post(f"{base}/local-sandbox", headers=headers, json=body)
        r.raise_for_status()
        box = r.json()
        sid = box["local_sandbox_id"]
        fs = box["servers"][0]["mcp_server_url"]
        try:
            await load(c, base, "local-sandbox", sid, headers, pack(tree, arcname_dot=True))

            async def step(tool, args):
                err, text = await call(fs, tool, args)
                out["calls"].append({"tool": tool, "is_error": err, "text": text[:4000]})
                return err, text

            _, roots = await step("list_allowed_directories", {})
            root = roots.splitlines()[1].strip()
            await step("directory_tree", {"path": root})
            _, sizes = await step("list_directory_with_sizes", {"path": root})
            jpgs = []
            for line in sizes.splitlines():
                parts = line.split()
                if line.startswith("[FILE]") and parts[1].lower().endswith(".jpg"):
                    jpgs.append(parts[1])
            largest = None
            best = -1
            for name in jpgs:
                _, info = await step("get_file_info", {"path": f"{root}/{name}"})
                size = int(next(l.split(":")[1] for l in info.splitlines() if l.startswith("size:")))
                if size > best:
                    largest, best = name, size
            await step("move_file", {"source": f"{root}/{largest}",
                                     "destination": f"{root}/largest.jpg"})
            out["root"] = root
            out["dump"] = await dump_to(c, base, "local-sandbox", sid, headers, out_dir)
        finally:
            r = await c.delete(f"{base}/local-sandbox/{sid}", headers=headers)
            out["released"] = r.status_code
    return out


async def main():
    base, key, scenario, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    headers = {"Authorization": f"Bearer {key}"}
    if scenario == "paths":
        out = await paths(base, headers, args[0], args[1])
    elif scenario == "toolathlon":
        out = await toolathlon(base, headers, args[0], args[1])
    elif scenario == "atlas":
        out = await atlas(base, headers)
    elif scenario == "atlas-genres":
        out = await atlas_genres(base, headers)
    elif scenario == "atlas-flood":
        out = await atlas_flood(base, headers)
    elif scenario == "mark":
        out = await mark(base, headers, args[0], args[1])
    else:
        sys.exit(f"unknown scenario {scenario}")
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
