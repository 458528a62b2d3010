"""A test double of the few Canvas LMS REST calls the sandbox makes: a
stand-in for an outside SaaS that cannot run here (Canvas LMS is a large
Rails application). It keeps courses, assignments, quizzes and their
questions, enrollments and announcements in memory, with two pre-made
users, bearer-token auth, and Link-header pagination, as Canvas answers.

    canvas_standin.py PORT TOKEN

Serves http://127.0.0.1:PORT/api/v1/... until killed; prints "ready".
"""
import json
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

PORT, TOKEN = int(sys.argv[1]), sys.argv[2]
ACCOUNT = 1
USERS = [{"id": 101, "name": "Ann Lee", "login_id": "ann@mcp.com"},
         {"id": 102, "name": "Bob Roe", "login_id": "bob@mcp.com"}]
state = {"courses": [], "next": 1000}
children = {}  # (course id, kind) -> list


def new_id():
    state["next"] += 1
    return state["next"]


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def reply(self, code, body, link=None):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if link:
            self.send_header("Link", link)
        self.end_headers()
        self.wfile.write(data)

    def page(self, items, url, q):
        per = int(q.get("per_page", ["10"])[0])
        page = int(q.get("page", ["1"])[0])
        chunk = items[(page - 1) * per: page * per]
        link = None
        if page * per < len(items):
            rest = {k: v[0] for k, v in q.items() if k != "page"}
            qs = "&".join(f"{k}={v}" for k, v in rest.items())
            link = f'<http://127.0.0.1:{PORT}{url.path}?{qs}&page={page + 1}>; rel="next"'
        self.reply(200, chunk, link)

    def authorized(self):
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.reply(401, {"errors": [{"message": "Invalid access token."}]})
            return False
        return True

    def parse_request(self):
        # The whole body is read before any answer (a 401 too), so no socket
        # is closed with unread bytes: that close sends a reset, which can cut
        # the answer short at the client.
        if not super().parse_request():
            return False
        self.raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        return True

    def body(self):
        return json.loads(self.raw or b"{}")

    def do_GET(self):
        if not self.authorized():
            return
        url = urlparse(self.path)
        q = parse_qs(url.query)
        p = url.path.removeprefix("/api/v1")
        if p == "/accounts":
            return self.reply(200, [{"id": ACCOUNT, "name": "Sandbox"}])
        if p == f"/accounts/{ACCOUNT}/users":
            term = q.get("search_term", [""])[0].lower()
            return self.page([u for u in USERS if term in u["login_id"]], url, q)
        if p in (f"/accounts/{ACCOUNT}/courses", "/courses"):
            return self.page(state["courses"], url, q)
        m = re.fullmatch(r"/courses/(\d+)", p)
        if m:
            c = next((c for c in state["courses"] if c["id"] == int(m[1])), None)
            if c is not None:
                return self.reply(200, c)
        m = re.fullmatch(r"/courses/(\d+)/quizzes/(\d+)/questions", p)
        if m:
            return self.page(children.get((int(m[2]), "questions"), []), url, q)
        m = re.fullmatch(r"/courses/(\d+)/(assignments|quizzes|enrollments|discussion_topics)", p)
        if m:
            items = children.get((int(m[1]), m[2]), [])
            if m[2] == "discussion_topics" and q.get("only_announcements"):
                items = [t for t in items if t.get("is_announcement")]
            return self.page(items, url, q)
        self.reply(404, {"errors": [{"message": "The specified resource does not exist."}]})

    def do_POST(self):
        if not self.authorized():
            return
        p = urlparse(self.path).path.removeprefix("/api/v1")
        b = self.body()
        if p == f"/accounts/{ACCOUNT}/courses":
            c = {"id": new_id(), **b["course"],
                 "workflow_state": "available" if b.get("offer") else "unpublished"}
            state["courses"].append(c)
            return self.reply(200, c)
        m = re.fullmatch(r"/courses/(\d+)/quizzes/(\d+)/questions", p)
        if m:
            item = {"id": new_id(), **b["question"]}
            children.setdefault((int(m[2]), "questions"), []).append(item)
            return self.reply(200, item)
        m = re.fullmatch(r"/courses/(\d+)/(assignments|quizzes|enrollments|discussion_topics)", p)
        if m and any(c["id"] == int(m[1]) for c in state["courses"]):
            kind = m[2]
            if kind == "enrollments":
                e = b["enrollment"]
                user = next((u for u in USERS if u["id"] == e["user_id"]), None)
                if user is None:
                    return self.reply(400, {"errors": [{"message": "user not found"}]})
                item = {"id": new_id(), "type": e["type"], "user": user}
            else:
                key = {"assignments": "assignment", "quizzes": "quiz"}.get(kind)
                item = {"id": new_id(), **(b[key] if key else b)}
            children.setdefault((int(m[1]), kind), []).append(item)
            return self.reply(200, item)
        self.reply(404, {"errors": [{"message": "The specified resource does not exist."}]})

    def do_DELETE(self):
        if not self.authorized():
            return
        m = re.fullmatch(r"/api/v1/courses/(\d+)", urlparse(self.path).path)
        if m:
            state["courses"] = [c for c in state["courses"] if c["id"] != int(m[1])]
            return self.reply(200, {"delete": True})
        self.reply(404, {})


server = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
print("ready", flush=True)
server.serve_forever()
