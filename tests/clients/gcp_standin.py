"""A test double of the few Google Cloud REST calls the sandbox's
google_cloud data tool makes (BigQuery, Cloud Storage, Cloud Logging,
Compute Engine) and of the OAuth token endpoint a service-account key
names: a stand-in for an outside service that cannot run here. State is
kept in memory; every API call needs the bearer token the token endpoint
issued for a signed JWT assertion. As Google's, a bucket that holds
objects and a dataset that holds tables (without deleteContents) are not
deleted. An instance named "fail-me" fails to be
created (a service error midway through a load).

    gcp_standin.py PORT

Serves http://127.0.0.1:PORT until killed; prints "ready".
"""
import json
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

PORT = int(sys.argv[1])
ACCESS = "standin-access-token"
S = {"datasets": {}, "tables": {}, "buckets": {}, "objects": {}, "entries": [], "sinks": {},
     "log_buckets": {"_Default": {"name": "_Default"}, "_Required": {"name": "_Required"}},
     "instances": {}}


class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def reply(self, code, body=None, raw=None, ctype="application/json"):
        data = raw if raw is not None else json.dumps(body if body is not None else {}).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def parse_request(self):
        # The whole body is read before any route answers, so a route that
        # ignores it never closes a socket with unread bytes: that close
        # sends a reset, which can cut the answer short at the client.
        if not super().parse_request():
            return False
        self.body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        return True

    def read(self):
        return self.body

    def json(self):
        raw = self.read()
        return json.loads(raw) if raw else {}

    def route(self, method):
        u = urlparse(self.path)
        q = {k: v[0] for k, v in parse_qs(u.query).items()}
        path = u.path
        if method == "POST" and path == "/token":
            form = parse_qs(self.read().decode())
            assertion = form.get("assertion", [""])[0]
            if assertion.count(".") != 2:
                return self.reply(400, {"error": "invalid_grant"})
            return self.reply(200, {"access_token": ACCESS, "expires_in": 3600, "token_type": "Bearer"})
        if self.headers.get("Authorization") != f"Bearer {ACCESS}":
            return self.reply(401, {"error": {"code": 401, "message": "invalid credentials"}})
        m = re.fullmatch(r"/bigquery/v2/projects/([^/]+)/datasets(?:/([^/]+))?(?:/tables(?:/([^/]+))?)?", path)
        if m:
            _, ds, tb = m.groups()
            if "/tables" in path:
                if method == "POST":
                    b = self.json()
                    S["tables"][(ds, b["tableReference"]["tableId"])] = b
                    return self.reply(200, b)
                if method == "GET" and tb is None:
                    return self.reply(200, {"tables": [v for (d, _), v in S["tables"].items() if d == ds]})
                key = (ds, tb)
                if key not in S["tables"]:
                    return self.reply(404, {"error": {"code": 404}})
                if method == "DELETE":
                    del S["tables"][key]
                    return self.reply(204, raw=b"")
                return self.reply(200, S["tables"][key])
            if method == "POST":
                b = self.json()
                S["datasets"][b["datasetReference"]["datasetId"]] = b
                return self.reply(200, b)
            if method == "GET" and ds is None:
                return self.reply(200, {"datasets": list(S["datasets"].values())})
            if ds not in S["datasets"]:
                return self.reply(404, {"error": {"code": 404}})
            if method == "DELETE":
                tables = [k for k in S["tables"] if k[0] == ds]
                if tables and q.get("deleteContents") != "true":
                    return self.reply(400, {"error": {"code": 400, "message": f"Dataset {ds} is "
                                                      "still in use"}})
                for k in tables:
                    del S["tables"][k]
                del S["datasets"][ds]
                return self.reply(204, raw=b"")
            return self.reply(200, S["datasets"][ds])
        m = re.fullmatch(r"/upload/storage/v1/b/([^/]+)/o", path)
        if m and method == "POST":
            bucket, name = unquote(m[1]), q["name"]
            data = self.read()
            S["objects"][(bucket, name)] = {"name": name, "bucket": bucket, "size": str(len(data)),
                                            "contentType": self.headers.get("Content-Type"),
                                            "_data": data}
            return self.reply(200, {"name": name, "bucket": bucket})
        m = re.fullmatch(r"/storage/v1/b(?:/([^/]+))?(?:/o(?:/(.+))?)?", path)
        if m:
            bucket = unquote(m[1]) if m[1] else None
            obj = unquote(m[2]) if m[2] else None
            if "/o" in path:
                if method == "GET" and obj is None:
                    items = [{k: v for k, v in o.items() if k != "_data"}
                             for (b, _), o in S["objects"].items() if b == bucket]
                    return self.reply(200, {"items": items})
                o = S["objects"].get((bucket, obj))
                if o is None:
                    return self.reply(404, {"error": {"code": 404}})
                if method == "DELETE":
                    del S["objects"][(bucket, obj)]
                    return self.reply(204, raw=b"")
                return self.reply(200, raw=o["_data"], ctype=o["contentType"] or "application/octet-stream")
            if method == "POST":
                b = self.json()
                S["buckets"][b["name"]] = b
                return self.reply(200, b)
            if method == "GET" and bucket is None:
                return self.reply(200, {"items": list(S["buckets"].values())})
            if method == "GET":
                if bucket not in S["buckets"]:
                    return self.reply(404, {"error": {"code": 404}})
                return self.reply(200, S["buckets"][bucket])
            if method == "DELETE":
                if any(b == bucket for b, _ in S["objects"]):
                    return self.reply(409, {"error": {"code": 409, "message": "The bucket you tried "
                                                      "to delete is not empty."}})
                S["buckets"].pop(bucket, None)
                return self.reply(204, raw=b"")
        if path == "/v2/entries:write" and method == "POST":
            S["entries"].extend(self.json().get("entries") or [])
            return self.reply(200, {})
        if path == "/v2/entries:list" and method == "POST":
            return self.reply(200, {"entries": S["entries"]})
        m = re.fullmatch(r"/v2/projects/([^/]+)/sinks(?:/([^/]+))?", path)
        if m:
            if method == "POST":
                b = self.json()
                S["sinks"][b["name"]] = b
                return self.reply(200, b)
            if method == "GET":
                return self.reply(200, {"sinks": list(S["sinks"].values())})
            if method == "DELETE":
                S["sinks"].pop(m[2], None)
                return self.reply(200, {})
        m = re.fullmatch(r"/v2/projects/([^/]+)/locations/([^/]+)/buckets(?:/([^/]+))?", path)
        if m:
            proj, loc, name = m.groups()
            if method == "POST":
                b = {**self.json(), "name": f"projects/{proj}/locations/{loc}/buckets/{q['bucketId']}"}
                S["log_buckets"][q["bucketId"]] = b
                return self.reply(200, b)
            if method == "GET":
                return self.reply(200, {"buckets": [
                    {**b, "name": b["name"] if "/" in b["name"]
                     else f"projects/{proj}/locations/global/buckets/{b['name']}"}
                    for b in S["log_buckets"].values()]})
            if method == "DELETE":
                S["log_buckets"].pop(name, None)
                return self.reply(200, {})
        m = re.fullmatch(r"/compute/v1/projects/([^/]+)/zones/([^/]+)/instances(?:/([^/]+))?(/stop)?", path)
        if m:
            proj, zone, name, stop = m.groups()
            if method == "POST" and name is None:
                b = self.json()
                if b["name"] == "fail-me":
                    return self.reply(503, {"error": {"code": 503, "message": "backend error"}})
                S["instances"][b["name"]] = {**b, "zone": f"projects/{proj}/zones/{zone}",
                                             "status": "RUNNING"}
                return self.reply(200, {"kind": "compute#operation", "status": "DONE"})
            if method == "POST" and stop:
                S["instances"][name]["status"] = "TERMINATED"
                return self.reply(200, {"kind": "compute#operation", "status": "DONE"})
            if method == "DELETE":
                S["instances"].pop(name, None)
                return self.reply(200, {"kind": "compute#operation", "status": "DONE"})
        m = re.fullmatch(r"/compute/v1/projects/([^/]+)/aggregated/instances", path)
        if m and method == "GET":
            items = {}
            for v in S["instances"].values():
                items.setdefault("zones/" + v["zone"].rsplit("/", 1)[-1], {"instances": []})["instances"].append(v)
            return self.reply(200, {"items": items})
        self.reply(404, {"error": {"code": 404, "message": f"no route {method} {path}"}})

    def do_GET(self):
        self.route("GET")

    def do_POST(self):
        self.route("POST")

    def do_DELETE(self):
        self.route("DELETE")


server = ThreadingHTTPServer(("127.0.0.1", PORT), H)
print("ready", flush=True)
server.serve_forever()
