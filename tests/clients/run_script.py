"""Runs one main.py in a sandbox through the host's execution API, as a
tenant's notebook would, and prints JSON: the sandbox id, the run's final
status and its log.

    run_script.py BASE KEY SCRIPT [--sandbox ID] [--servers a,b] [--name N] [--no-wait]

Without --sandbox a sandbox is acquired (with --servers, default none) and
kept: the caller releases it. The script gets the sandbox's environment
(SANDBOX_MCP_URL, SANDBOX_MCP_TOKEN, ...) as any execution does.
"""
import argparse
import io
import json
import sys
import tarfile
import time

import httpx


def archive(script: bytes, packages: str) -> bytes:
    buf = io.BytesIO()
    files = [("main.py", script)]
    if packages:
        files.append(("packages.txt", packages.replace(",", "\n").encode()))
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("base")
    p.add_argument("key")
    p.add_argument("script")
    p.add_argument("--sandbox")
    p.add_argument("--servers", default="")
    p.add_argument("--name", default="run")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--no-wait", action="store_true", help="return once it started")
    p.add_argument("--packages", default="", help="packages.txt, comma-separated")
    a = p.parse_args()
    h = {"Authorization": f"Bearer {a.key}"}
    with open(a.script, "rb") as f:
        script = f.read()
    with httpx.Client(timeout=60.0) as c:
        sid = a.sandbox
        if not sid:
            names = [n for n in a.servers.split(",") if n]
            r = c.post(f"{a.base}/local-sandbox", headers=h, json={"server_names": names})
            r.raise_for_status()
            sid = r.json()["local_sandbox_id"]
        r = c.post(f"{a.base}/local-sandbox/{sid}/execution-upload-url", headers=h,
                   json={"execution_name": a.name})
        r.raise_for_status()
        r = c.put(r.json()["upload_url"], headers={"Content-Type": "application/gzip"},
                  content=archive(script, a.packages))
        r.raise_for_status()
        r = c.post(f"{a.base}/local-sandbox/{sid}/execute", headers=h,
                   json={"execution_name": a.name})
        r.raise_for_status()
        logs, cursor, status = "", 0, ""
        deadline = time.monotonic() + (0 if a.no_wait else a.timeout)
        while time.monotonic() < deadline:
            r = c.get(f"{a.base}/local-sandbox/{sid}/execution-logs", headers=h,
                      params={"execution_name": a.name, "cursor": cursor})
            r.raise_for_status()
            d = r.json()
            logs += d["logs"]
            cursor = d["cursor"]
            status = d["status"]
            if status in ("completed", "failed"):
                break
            time.sleep(0.1)
        json.dump({"sandbox_id": sid, "status": status, "logs": logs}, sys.stdout)


if __name__ == "__main__":
    main()
