"""Drives sandbox-host's execution endpoints the way Klavis's execution
notebook does (httpx, the same calls in the same order), with a script that
uses a pip dependency, Debian packages from packages.txt, the two output
locations (its working directory and AGENT_WORKSPACE), and the lease's MCP
servers. The public URLs the notebook's script fetches are replaced by a
loopback HTTP server this client starts: tests reach nothing else.

    exec_client.py BASE API_KEY [PORT]

Prints one JSON object on stdout.
"""
import asyncio
import http.server
import io
import json
import sys
import tarfile
import threading

import httpx

MAIN_PY = r'''
import json
import os
import platform
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil     # from requirements.txt
import requests   # from requirements.txt

URL = "@URL@"
print(f"Python {platform.python_version()}, {psutil.cpu_count()} CPUs")
out = subprocess.run(["curl", "-s", URL + "/ip"], capture_output=True, text=True, timeout=15)
origin = json.loads(out.stdout)["origin"]
print(f"curl (packages.txt): origin {origin}")
host = requests.get(URL + "/headers", timeout=15).json()["headers"]["Host"]
print(f"requests (requirements.txt): Host {host}")
jq = subprocess.run(["jq", "-r", ".v"], input='{"v": "jq works"}', capture_output=True, text=True)
print(jq.stdout.strip())
init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "script", "version": "1"}}}
req = urllib.request.Request(
    os.environ["SANDBOX_MCP_URL_FILESYSTEM"], data=json.dumps(init).encode(),
    headers={"Authorization": "Bearer " + os.environ["SANDBOX_MCP_TOKEN"],
             "Content-Type": "application/json", "Accept": "application/json, text/event-stream"})
with urllib.request.urlopen(req, timeout=60) as r:
    answered = "serverInfo" in r.read().decode()
print(f"MCP servers {os.environ['SANDBOX_MCP_SERVERS']}; filesystem answered: {answered}")
print("to stderr", file=sys.stderr)
print("ünïcödé ✓ 日本語 😀")
Path("report.json").write_text(json.dumps({"origin": origin, "host": host, "mcp": answered}))
ws = Path(os.environ["AGENT_WORKSPACE"])
(ws / "summary.txt").write_text("written by the execution\n")
print(f"cwd {os.getcwd()}")
'''


class Fake(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/ip":
            body = {"origin": "127.0.0.1"}
        else:
            body = {"headers": {"Host": self.headers.get("Host")}}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def archive(url):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, content in [("main.py", MAIN_PY.replace("@URL@", url)),
                              ("requirements.txt", "requests\npsutil\n"),
                              ("packages.txt", "curl\njq\n")]:
            data = content.encode()
            info = tarfile.TarInfo(name=name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def notebook(base, headers, port=0):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), Fake)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    out = {}
    name = "demo-run"
    async with httpx.AsyncClient(timeout=300.0) as client:
        resp = await client.post(f"{base}/local-sandbox", headers=headers,
                                 json={"server_names": ["filesystem", "terminal"]})
        out["acquire_status"] = resp.status_code
        acquired = resp.json()
        sid = acquired["local_sandbox_id"]
        out["sandbox_id"] = sid
        resp = await client.post(f"{base}/local-sandbox/{sid}/execution-upload-url", headers=headers,
                                 json={"execution_name": name})
        resp.raise_for_status()
        out["upload_url"] = resp.json()
        resp = await client.put(out["upload_url"]["upload_url"],
                                headers={"Content-Type": "application/gzip"}, content=archive(url))
        resp.raise_for_status()
        resp = await client.post(f"{base}/local-sandbox/{sid}/execute", headers=headers,
                                 json={"execution_name": name})
        resp.raise_for_status()
        out["execute"] = resp.json()
        cursor, logs, polls = 0, "", 0
        while True:
            resp = await client.get(f"{base}/local-sandbox/{sid}/execution-logs", headers=headers,
                                    params={"execution_name": name, "cursor": cursor})
            resp.raise_for_status()
            data = resp.json()
            logs += data["logs"]
            cursor = data["cursor"]
            polls += 1
            if data["status"] in ("completed", "failed"):
                out["final"] = data["status"]
                break
            await asyncio.sleep(0.2)
        out["logs"], out["cursor"], out["polls"] = logs, cursor, polls
        resp = await client.get(f"{base}/local-sandbox/{sid}/execution-status", headers=headers,
                                params={"execution_name": name})
        out["status"] = resp.json()
        resp = await client.post(f"{base}/local-sandbox/{sid}/export-artifacts", headers=headers,
                                 json={"execution_name": name})
        resp.raise_for_status()
        export = resp.json()
        out["export"] = export
        resp = await client.get(export["download_url"])
        resp.raise_for_status()
        with tarfile.open(fileobj=io.BytesIO(resp.content), mode="r:gz") as tar:
            out["artifacts"] = sorted(m.name for m in tar.getmembers())
            f = tar.extractfile("./report.json")
            out["report"] = json.loads(f.read().decode()) if f else None
        # What the script wrote to AGENT_WORKSPACE: seen by the filesystem
        # MCP server, and in a workspace dump.
        out["mcp_text"] = await read_through_mcp(acquired, headers, "summary.txt")
        resp = await client.get(f"{base}/local-sandbox/{sid}/dump", headers=headers)
        resp = await client.get(resp.json()["download_url"])
        with tarfile.open(fileobj=io.BytesIO(resp.content), mode="r:gz") as tar:
            out["dump"] = sorted(m.name for m in tar.getmembers())
        resp = await client.delete(f"{base}/local-sandbox/{sid}", headers=headers)
        out["release"] = resp.status_code
    srv.shutdown()
    return out


async def read_through_mcp(acquired, headers, path):
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client
    url = next(s["mcp_server_url"] for s in acquired["servers"] if s["server_name"] == "filesystem")
    async with streamablehttp_client(url, headers=headers, timeout=120, sse_read_timeout=300) as (r, w, _):
        async with ClientSession(r, w) as s:
            await s.initialize()
            got = await s.call_tool("read_text_file", {"path": path})
            return "".join(c.text for c in got.content if c.type == "text")


async def main():
    base, key = sys.argv[1], sys.argv[2]
    # PORT: where the stand-in listens; an isolated sandbox reaches this
    # host's loopback only at the ports the host forwards (--sandbox-host-port).
    port = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    out = await notebook(base, {"Authorization": f"Bearer {key}"}, port)
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
