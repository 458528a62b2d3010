"""Toolathlon's Klavis sandbox client, as it calls a sandbox host (read
from Klavis-AI/Toolathlon @45d20b06 `utils/klavis_sandbox.py` and
`utils/roles/task_agent.py`; re-expressed here, only the base URL
changed). For a task's server names:
- the local ones (filesystem, git, terminal, python_execute, pdf-tools,
  excel, word, pptx, arxiv_local) come from one POST /sandbox/local_dev,
  each looked up in its server_urls under Toolathlon's remote name
  (python_execute -> code-executor, pptx -> powerpoint, arxiv_local -> arxiv);
- every other one from POST /sandbox/<name>, renamed only for emails ->
  poste_email_toolathlon, arxiv-latex, google_sheet and wandb; each URL
  of its server_urls is kept under the task's name when the key is the
  name sent, else under the key itself;
- every body is {"benchmark": "Toolathlon"} (+ test_account_email for
  emails), 60 s each, a failed acquire skipped;
then GET /sandbox/<server_name>/<id> of each acquired sandbox (as the
task agent does for some), a tool call on the memory URL in a new MCP
session per call, and DELETE /sandbox/<server_name>/<id> of each, with
server_name and sandbox_id taken from the create answers.

usage: toolathlon_client.py BASE_URL API_KEY TASK_SERVER... [--email ADDR]
Prints one JSON object.
"""
import asyncio
import json
import sys

import httpx

LOCAL_DEV = {"filesystem", "git", "terminal", "python_execute", "pdf-tools", "excel", "word",
             "pptx", "arxiv_local"}
REMOTE_NAME = {"python_execute": "code-executor", "pptx": "powerpoint", "arxiv_local": "arxiv"}
SANDBOX_NAME = {"arxiv-latex": "arxiv_latex", "google_sheet": "google_sheets",
                "wandb": "weights_and_biases", "emails": "poste_email_toolathlon"}


class Client:
    def __init__(self, base, key):
        self.base, self.headers = base, {"Authorization": f"Bearer {key}"}
        self.acquired, self.failed = [], {}

    def acquire(self, name, extra=None):
        body = {"benchmark": "Toolathlon", **(extra or {})}
        r = httpx.post(f"{self.base}/sandbox/{name}", json=body, headers=self.headers, timeout=60)
        if r.status_code >= 400:
            self.failed[name] = r.status_code
            return None
        self.acquired.append(r.json())
        return r.json()

    def urls_for(self, task_servers, extras):
        urls = {}
        local = [n for n in task_servers if n in LOCAL_DEV]
        if local:
            got = self.acquire("local_dev") or {}
            for n in local:
                remote = REMOTE_NAME.get(n, n)
                if remote in (got.get("server_urls") or {}):
                    urls[n] = got["server_urls"][remote]
        for n in (n for n in task_servers if n not in LOCAL_DEV):
            sent = SANDBOX_NAME.get(n, n)
            got = self.acquire(sent, extras.get(n)) or {}
            for key, url in (got.get("server_urls") or {}).items():
                urls[n if key == sent else key] = url
        return urls

    def each(self, method, suffix=""):
        out = {}
        for sb in self.acquired:
            path = f"/sandbox/{sb['server_name']}/{sb['sandbox_id']}{suffix}"
            r = httpx.request(method, f"{self.base}{path}", headers=self.headers, timeout=30)
            out[sb["server_name"]] = [r.status_code, r.json()]
        return out


async def call(url, tool, args):
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client
    async with streamablehttp_client(url, timeout=120, sse_read_timeout=300) as (r, w, _):
        async with ClientSession(r, w) as s:
            await s.initialize()
            got = await s.call_tool(tool, args)
            return "".join(c.text for c in got.content if c.type == "text")


def main():
    args = sys.argv[3:]
    email = None
    if "--email" in args:
        at = args.index("--email")
        email, args = args[at + 1], args[:at] + args[at + 2:]
    c = Client(sys.argv[1], sys.argv[2])
    extras = {"emails": {"test_account_email": email}} if email else {}
    urls = c.urls_for(args, extras)
    out = {"urls": sorted(urls), "failed": c.failed,
           "server_names": sorted(sb["server_name"] for sb in c.acquired)}
    details = c.each("GET")
    out["details"] = {k: v[0] for k, v in details.items()}
    out["detail_names"] = {k: v[1].get("server_name") for k, v in details.items()}
    if "memory" in urls:
        asyncio.run(call(urls["memory"], "create_entities", {"entities": [
            {"name": "Toolathlon", "entityType": "task", "observations": ["kept"]}]}))
        graph = json.loads(asyncio.run(call(urls["memory"], "read_graph", {})))
        out["memory"] = [e["name"] for e in graph["entities"]]
    out["released"] = {k: v[0] for k, v in c.each("DELETE").items()}
    out["after_release"] = c.each("GET")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
