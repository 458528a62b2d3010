"""Toolathlon's mail sequence for its task apply-phd-email in Klavis mode,
re-expressed against sandbox-host (Klavis-AI/Toolathlon @45d20b06 read for
the facts; nothing copied):

    toolathlon_mail.py BASE KEY TASK_DIR

TASK_DIR is the task's data (email_config.json, files/emails_backup.json,
files/receiver_config.json, initial_workspace_extracted/memory/memory.json,
tarball_listings.txt). Prints one JSON object of what each step saw.

1. Acquire as KlavisSandbox.acquire does for the task's `emails` server:
   `POST /sandbox/poste_email_toolathlon` with the benchmark and
   `test_account_email` = the local part of email_config.json's address at
   the run's KLAVIS_EMAIL_DOMAIN (here mcp7.com).
2. Preprocess: the fresh lease's mailboxes are empty (what the task's
   clearing makes them; in Klavis mode Toolathlon clears over IMAP on its
   own machine), then `import_emails` through the MCP URL with Klavis's
   arguments: `json_string` = emails_backup.json with `@mcp.com` rewritten
   to the domain, `target_folder` INBOX, `preserve_folders` false. A bad
   json_string first, which must be a tool error a model can act on.
3. The workspace as the task's preprocess leaves it (its files.tar.gz has
   PDFs this data lacks: files of the listed names and sizes stand in),
   uploaded (upload-url, PUT, initialize), with the ZIP the agent makes.
4. The agent's turn through the MCP URL: read the inbox, read kaiming's
   mail, send the ZIP to the address it names with the task's subject.
5. The evaluation re-expressed: the receiver's mailbox (from the dump, which
   carries attachments' bytes) has a mail whose subject contains the
   task's subject with a ZIP whose Application_Materials_* tree (names and
   sizes) is the ground truth's (tarball_listings.txt).
"""
import asyncio
import base64
import io
import json
import re
import sys
import tarfile
import zipfile
from pathlib import Path

import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

DOMAIN = "mcp7.com"
SUBJECT = "PhD Application Materials Submission (Student ID: {})"
GT_PREFIX = "Application_Materials_MaryCastillo_2201210606/"
# Where each of the task's flat files goes (what a model reads from the
# PDFs: CV is the resume, letter 1 is Alex's, letter 2 Lily's).
LAYOUT = {
    "ID_Card.pdf": "01_Personal_Information/ID_Card.pdf",
    "CV.pdf": "01_Personal_Information/Resume.pdf",
    "Photo.jpg": "01_Personal_Information/Photo.jpg",
    "Enrollment_Certificate.pdf": "02_Academic_Materials/Enrollment_Certificate.pdf",
    "Transcript.pdf": "02_Academic_Materials/Transcript.pdf",
    "Recommendation_Letter_1.pdf": "03_Recommendation_Letters/Recommendation_Letter_Alex-1.pdf",
    "Recommendation_Letter_2.pdf": "03_Recommendation_Letters/Recommendation_Letter_Lily-2.pdf",
    "Portfolio.pdf": "04_Supplementary_Materials/Portfolio.pdf",
    "Project_Report.pdf": "04_Supplementary_Materials/Project_Report.pdf",
}
MERGED = "02_Academic_Materials/Awards_Certificates/All_Awards_Certificates.pdf"


def listing(task: Path, section: int) -> dict:
    """{path: size} of the files of one tarball listing."""
    parts = (task / "tarball_listings.txt").read_text().split("# Listing of ")[1:]
    files = {}
    for line in parts[section].splitlines()[1:]:
        f = line.split(None, 5)
        if len(f) == 6 and f[0].startswith("-"):
            files[f[5].removeprefix("./")] = int(f[2])
    return files


def tree(files: dict) -> dict:
    """Toolathlon's comparison unit: each directory's subdirectories and
    files (here with sizes), by path relative to the top."""
    out = {"": {"dirs": set(), "files": {}}}
    for path, size in files.items():
        parts = path.split("/")
        for i in range(len(parts) - 1):
            parent, d = "/".join(parts[:i]), parts[i]
            out.setdefault(parent, {"dirs": set(), "files": {}})["dirs"].add(d)
            out.setdefault("/".join(parts[:i + 1]), {"dirs": set(), "files": {}})
        out["/".join(parts[:-1])]["files"][parts[-1]] = size
    return out


def differences(got: dict, want: dict) -> list:
    diffs = []
    for d in sorted(set(got) | set(want)):
        g, w = got.get(d, {"dirs": set(), "files": {}}), want.get(d, {"dirs": set(), "files": {}})
        if g["dirs"] != w["dirs"]:
            diffs.append(f"{d or '.'}: directories {sorted(g['dirs'])} != {sorted(w['dirs'])}")
        if g["files"] != w["files"]:
            diffs.append(f"{d or '.'}: files {sorted(g['files'].items())} != {sorted(w['files'].items())}")
    return diffs


def workspace(task: Path, name: str, student_id: str) -> bytes:
    """The workspace after the task's preprocess plus the agent's ZIP."""
    flat = {p: s for p, s in listing(task, 0).items() if p.startswith("Application_Materials_flat/")}
    zbuf = io.BytesIO()
    with zipfile.ZipFile(zbuf, "w") as z:
        top = f"Application_Materials_{name}_{student_id}/"
        for path, size in flat.items():
            base = path.rsplit("/", 1)[1]
            if base in LAYOUT:
                z.writestr(top + LAYOUT[base], bytes(size))
        merged = listing(task, 1)[GT_PREFIX + MERGED]  # the merged PDF's size
        z.writestr(top + MERGED, bytes(merged))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        members = {p: bytes(s) for p, s in flat.items()}
        members["memory/memory.json"] = (task / "initial_workspace_extracted/memory/memory.json").read_bytes()
        members[f"Application_Materials_{name}_{student_id}.zip"] = zbuf.getvalue()
        for path, data in members.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def call(url: str, tool: str, args: dict) -> dict:
    """One tool call on a new MCP session, as Toolathlon's MCP clients make them."""
    async with streamablehttp_client(url, timeout=120, sse_read_timeout=300) as (r, w, _):
        async with ClientSession(r, w) as s:
            await s.initialize()
            res = await s.call_tool(tool, args)
            return {"is_error": bool(res.isError),
                    "text": "".join(c.text for c in res.content if c.type == "text")}


def evaluate(dump: dict, receiver: str, subject: str, want: dict) -> dict:
    mails = dump["data"]["users"].get(receiver, {}).get("emails", [])
    hits = [m for m in mails if subject in m["subject"]
            and any(a["filename"].lower().endswith(".zip") for a in m["attachments"])]
    out = {"matching_emails": len(hits), "differences": None}
    for m in hits:
        for a in m["attachments"]:
            if not a["filename"].lower().endswith(".zip") or "content" not in a:
                continue
            with zipfile.ZipFile(io.BytesIO(base64.b64decode(a["content"]))) as z:
                names = {i.filename: i.file_size for i in z.infolist() if not i.is_dir()}
            tops = {n.split("/", 1)[0] for n in names if n.startswith("Application_Materials_")}
            got = {n.split("/", 1)[1]: s for n, s in names.items() if n.split("/", 1)[0] in tops}
            out["differences"] = differences(tree(got), want)
            out["top"] = sorted(tops)
    return out


async def main():
    base, key, task = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    headers = {"Authorization": f"Bearer {key}"}
    out = {}
    local = json.loads((task / "email_config.json").read_text())["email"].split("@")[0]
    receiver = json.loads((task / "files/receiver_config.json").read_text())["email"].replace(
        "@mcp.com", f"@{DOMAIN}")
    memory = (task / "initial_workspace_extracted/memory/memory.json").read_text()
    student_id = re.search(r"Student ID: (\d+)", memory).group(1)
    name = re.search(r'"name":"([^"]+)"', memory).group(1).replace(" ", "")
    subject = SUBJECT.format(student_id)
    async with httpx.AsyncClient(timeout=300.0) as c:
        r = await c.post(f"{base}/sandbox/poste_email_toolathlon", headers=headers,
                         json={"benchmark": "Toolathlon", "test_account_email": f"{local}@{DOMAIN}"})
        out["acquire"] = [r.status_code, r.json()]
        sid = r.json()["sandbox_id"]
        url = r.json()["server_urls"]["poste_email_toolathlon"]
        srv = f"{base}/sandbox/poste_email_toolathlon/{sid}"
        out["dump_before"] = (await c.get(f"{srv}/dump", headers=headers)).json()
        tools_args = {"target_folder": "INBOX", "preserve_folders": False}
        out["import_bad"] = await call(url, "import_emails", {
            "json_string": json.dumps({"emails": [{"email_id": "1", "subject": "s", "from_addr": "a@mcp7.com"}]}),
            **tools_args})
        backup = (task / "files/emails_backup.json").read_text().replace("@mcp.com", f"@{DOMAIN}")
        out["import"] = await call(url, "import_emails", {"json_string": backup, **tools_args})
        r = await c.post(f"{base}/local-sandbox/{sid}/upload-url", headers=headers)
        r = await c.put(r.json()["upload_url"], headers={"Content-Type": "application/gzip"},
                        content=workspace(task, name, student_id))
        out["upload"] = r.status_code
        r = await c.post(f"{base}/local-sandbox/{sid}/initialize", headers=headers)
        out["initialize"] = r.status_code
        inbox = await call(url, "get_emails", {"folder": "INBOX"})
        out["inbox"] = inbox["text"]
        found = re.search(r"ID: (\d+)\s*\n\s*Subject: Re: PhD Application", inbox["text"])
        mail = await call(url, "read_email", {"email_id": found.group(1) if found else "1"})
        body = mail["text"].partition("Text Content:")[2]
        addrs = set(re.findall(r"[\w.]+@" + re.escape(DOMAIN), body))
        out["receiver_named"] = sorted(addrs - {f"kaiming@{DOMAIN}", f"mary.castillo@{DOMAIN}"})
        out["send"] = await call(url, "send_email", {
            "to": out["receiver_named"][0] if out["receiver_named"] else receiver,
            "subject": subject, "body": "Dear admissions team,\n\nplease find my materials attached.\n",
            "attachments": [f"Application_Materials_{name}_{student_id}.zip"]})
        dump = (await c.get(f"{srv}/dump", headers=headers)).json()
        out["dump"] = dump
        out["evaluation"] = evaluate(dump, receiver, subject, tree(
            {p.removeprefix(GT_PREFIX): s for p, s in listing(task, 1).items()}))
        out["receiver"] = receiver
        out["release"] = (await c.delete(srv, headers=headers)).status_code
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
