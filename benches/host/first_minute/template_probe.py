"""What a template (fork server) of one Python server build would hold and
give: run with that build's interpreter, outside any sandbox.

For every console script of the build whose distribution depends on an MCP
SDK (`mcp` or `fastmcp`), in a fresh interpreter each: the time to import
the SDK alone, then the server's own entry module on top of it, the memory
the process then holds, and how long a fork of it takes to run. Prints one
JSON object per script.
"""

import importlib
import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
import time

SDKS = {"mcp", "fastmcp"}


def needs_sdk(dist):
    for req in dist.requires or []:
        name = re.split(r"[\s;<>=!~\[(]", req, maxsplit=1)[0].lower()
        if name in SDKS:
            return True
    return False


def scripts(bindir):
    for dist in md.distributions():
        if dist.metadata["Name"].lower() in SDKS or not needs_sdk(dist):
            continue
        for ep in dist.entry_points:
            if (
                ep.group == "console_scripts"
                and ep.name not in SDKS
                and os.path.exists(os.path.join(bindir, ep.name))
            ):
                yield ep


def status_mib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def probe(module):
    t0 = time.perf_counter()
    for sdk in ("mcp", "fastmcp"):
        try:
            importlib.import_module(sdk)
        except ImportError:
            pass
    t1 = time.perf_counter()
    importlib.import_module(module)
    t2 = time.perf_counter()
    forks = []
    for _ in range(20):
        r, w = os.pipe()
        a = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os.write(w, b"x")
            os._exit(0)
        os.read(r, 1)
        forks.append((time.perf_counter() - a) * 1000)
        os.waitpid(pid, 0)
        os.close(r)
        os.close(w)
    forks.sort()
    return {
        "sdk_ms": (t1 - t0) * 1000,
        "own_ms": (t2 - t1) * 1000,
        "rss_mib": status_mib("VmRSS"),
        "anon_mib": status_mib("RssAnon"),
        "fork_ms": forks[len(forks) // 2],
    }


def main():
    if len(sys.argv) == 2:
        print(json.dumps(probe(sys.argv[1])))
        return
    bindir = os.path.dirname(sys.executable)
    for ep in scripts(bindir):
        out = subprocess.run(
            [sys.executable, __file__, ep.module], capture_output=True, text=True
        )
        row = {"script": ep.name}
        if out.returncode == 0:
            row.update(json.loads(out.stdout.splitlines()[-1]))
        else:
            row["error"] = (out.stderr.strip().splitlines() or ["exit %d" % out.returncode])[-1]
        print(json.dumps(row), flush=True)


main()
