"""A local stand-in for the Hugging Face Hub: the few endpoints snapshot_download and upload_file use.

Real HTTP over loopback, so the real huggingface_hub code runs unchanged (HF_ENDPOINT points here).
Repos are folders under `root/<models|datasets>/<org>/<name>/`; each has one commit whose hash is
fixed when the repo is made (a model's is its pinned revision). Large files are served as LFS
files (sha256 ETag) so the client's checksum path runs; downloads honour `Range` (resumes).
Uploads land in the repo folder; `commits` records every commit's operations.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

LFS_MIN = 1024  # files at least this big are LFS files, like the hub's binary files


@dataclass
class Repo:
    folder: Path
    commit: str

    def files(self) -> list[Path]:
        return sorted(p for p in self.folder.rglob("*") if p.is_file())


@dataclass
class Hub:
    root: Path
    repos: dict[tuple[str, str], Repo] = field(default_factory=dict)
    commits: list[dict] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    url: str = ""

    def add(self, kind: str, repo_id: str, files: dict[str, bytes], commit: str | None = None) -> Repo:
        folder = self.root / f"{kind}s" / repo_id
        for rel, data in files.items():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_bytes(data)
        folder.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha1(json.dumps(sorted((k, hashlib.sha1(v).hexdigest()) for k, v in files.items())).encode())
        repo = Repo(folder, commit or digest.hexdigest())
        self.repos[(kind, repo_id)] = repo
        return repo


def _blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _entry(rel: str, path: Path) -> dict:
    data = path.read_bytes()
    e: dict = {"type": "file", "oid": _blob_oid(data), "size": len(data), "path": rel}
    if len(data) >= LFS_MIN:
        e["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
    return e


API = re.compile(r"^/api/(models|datasets)/([^/]+/[^/]+)/(revision|tree|preupload|commit)/([^/]+)(?:/(.*))?$")
RESOLVE = re.compile(r"^/(?:(datasets)/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


def _handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _send(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))  # HEAD: the size of what GET would send
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, obj: object, code: int = 200) -> None:
            self._send(code, json.dumps(obj).encode(), {"Content-Type": "application/json"})

        def _missing(self, code: str, msg: str) -> None:
            self._send(404, json.dumps({"error": msg}).encode(), {"X-Error-Code": code, "X-Error-Message": msg})

        def _repo(self, kind: str, repo_id: str, rev: str) -> Repo | None:
            repo = hub.repos.get((kind, repo_id))
            if repo is None:
                self._missing("RepoNotFound", f"Repository {repo_id} not found")
                return None
            if unquote(rev) not in ("main", repo.commit):
                self._missing("RevisionNotFound", f"Invalid rev id: {rev}")
                return None
            return repo

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length", 0)))

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            path = urlparse(self.path).path
            hub.requests.append(f"{self.command} {path}")
            if m := API.match(path):
                kind, repo_id, verb, rev, sub = m.groups()
                repo = self._repo(kind[:-1], repo_id, rev)
                if repo is None:
                    return
                entries = [_entry(str(p.relative_to(repo.folder)), p) for p in repo.files()]
                if verb == "revision":
                    self._json(
                        {"id": repo_id, "sha": repo.commit, "siblings": [{"rfilename": e["path"]} for e in entries]}
                    )
                else:
                    self._json([e for e in entries if not sub or e["path"].startswith(sub.rstrip("/") + "/")])
                return
            if m := RESOLVE.match(path):
                kind, repo_id, rev, rel = m.groups()
                repo = self._repo("dataset" if kind else "model", repo_id, rev)
                if repo is None:
                    return
                file = repo.folder / unquote(rel)
                if not file.is_file():
                    self._missing("EntryNotFound", f"{rel} not found")
                    return
                e = _entry(unquote(rel), file)
                data = file.read_bytes()
                head = {"X-Repo-Commit": repo.commit, "ETag": f'"{e["lfs"]["oid"] if "lfs" in e else e["oid"]}"'}
                if "lfs" in e:
                    head["X-Linked-Size"] = str(len(data))
                rng = re.match(r"bytes=(\d+)-$", self.headers.get("Range", ""))
                if rng and self.command == "GET":
                    start = int(rng.group(1))
                    head["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                    self._send(206, data[start:], head)
                    return
                self._send(200, data, head)
                return
            self._send(404, b"no such endpoint")

        def do_POST(self) -> None:
            path = urlparse(self.path).path
            hub.requests.append(f"POST {path}")
            if not self.headers.get("authorization", "").startswith("Bearer "):
                self._send(401, b'{"error":"Invalid credentials"}', {"X-Error-Message": "Invalid credentials"})
                return
            m = API.match(path)
            if not m:
                self._send(404, b"no such endpoint")
                return
            kind, repo_id, verb, rev, _ = m.groups()
            repo = self._repo(kind[:-1], repo_id, rev)
            if repo is None:
                return
            body = self._body()
            if verb == "preupload":
                files = json.loads(body)["files"]
                self._json(
                    {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]}
                )
                return
            ops = [json.loads(line) for line in body.splitlines() if line.strip()]
            for op in ops:
                if op["key"] == "file":
                    dest = repo.folder / op["value"]["path"]
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(base64.b64decode(op["value"]["content"]))
            hub.commits.append({"repo": repo_id, "ops": ops, "token": self.headers["authorization"][7:]})
            self._json({"commitUrl": f"{hub.url}/{repo_id}/commit/{repo.commit}", "commitOid": repo.commit})

    return Handler


class HubServer:
    def __init__(self, root: Path) -> None:
        self.hub = Hub(root)
        self._srv = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.hub))
        self.hub.url = f"http://127.0.0.1:{self._srv.server_address[1]}"
        self._thread = threading.Thread(target=self._srv.serve_forever, daemon=True)

    def __enter__(self) -> Hub:
        self._thread.start()
        return self.hub

    def __exit__(self, *exc: object) -> None:
        self._srv.shutdown()
        self._srv.server_close()
