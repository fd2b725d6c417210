"""Record every page and API response with its defaults, then compare after a refactoring.

    .venv/bin/python scripts/response_snapshot.py record /tmp/before
    ... change the code ...
    .venv/bin/python scripts/response_snapshot.py compare /tmp/before

A refactoring that should change nothing a user sees is checked against this: JSON bodies must be
equal to the last bit of every number, HTML equal up to whitespace. The requests are the GET
endpoints with their defaults, the POST endpoints with their OpenAPI examples, and every page
(explorer states, lessons, calculator, every Inspect view), each also as its htmx fragment.
Runs in-process (TestClient), so it needs no server.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from urllib.parse import quote

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

GETS = [
    "/healthz",
    "/api/v1/models",
    "/api/v1/hooks",
    "/api/v1/hooks?model=spec-forward",
    "/api/v1/lessons/attention",
    "/api/v1/lessons/attention?causal=true",
    "/api/v1/lessons/scaling",
    "/api/v1/lessons/multihead",
    "/api/v1/lessons/positions",
    "/api/v1/lessons/forward",
    "/api/v1/params",
    "/api/v1/params?preset=gpt2-small",
    "/api/v1/kv-cache",
    "/api/v1/kv-cache?preset=gpt2-xl",
]
PAGES = [
    "/",
    "/?causal=0",
    "/?view=compare",
    "/?rollout=1&layer=1&head=2",
    "/?ablate=0.1&ablate=1.3",
    "/?ablate=0.0&ablate_method=mean",
    "/?positional_embedding_type=rotary&n_heads=2",
    "/?model=spec-forward",
    "/?model=all-MiniLM-L6-v2",
    "/?model=nope",
    "/?text=" + quote("a <b> & c"),
    "/lessons",
    "/lessons/attention",
    "/lessons/scaling",
    "/lessons/causal",
    "/lessons/multihead",
    "/lessons/positions",
    "/lessons/params",
    "/lessons/forward",
    "/lessons/forward/snippet.py",
    "/lessons/attention/snippet.py?d_k=3",
    "/lessons/attention?d_model=0",
    "/params",
    "/params?preset=gpt2-xl",
    "/inspect",
    "/inspect?view=lens",
    "/inspect?view=detectors",
    "/inspect?view=kvcache",
    "/inspect?view=compare",
    "/inspect?view=compare&b_text=Ali+makan+nasi+goreng",
    "/inspect?view=lens&model=all-MiniLM-L6-v2",
    "/inspect?view=detectors&model=all-MiniLM-L6-v2",
]


def _posts(schema: dict) -> list[tuple[str, dict]]:
    """(path, body) for every example of every POST operation in the OpenAPI."""
    out = []
    for path, ops in sorted(schema["paths"].items()):
        # A live class's answers hold a random code and token: not a response to compare
        if "post" not in ops or path.startswith("/api/v1/classes"):
            continue
        ref = ops["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
        for example in schema["components"]["schemas"][ref].get("examples", []):
            out.append((path, example))
    return out


def _name(method: str, path: str, i: int = 0, fragment: bool = False) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "_", path).strip("_") or "root"
    return f"{method}_{slug[:80]}_{i}{'_hx' if fragment else ''}"


def responses() -> dict[str, tuple[int, str, str]]:
    """name -> (status, content type, body) for every request of the snapshot."""
    import os
    import tempfile

    from fastapi.testclient import TestClient

    # Hermetic: training runs go to an empty folder of their own and are queued, never trained (a run
    # that finished during the snapshot would join the model menus), so two snapshots of the same code
    # are equal whatever the machine's own runs folder holds and however fast a worker would be.
    os.environ["EXPLORER_RUNS_DIR"] = tempfile.mkdtemp(prefix="snapshot-runs-")
    from app.settings import get_settings
    from app.training.scheduler import TrainingManager

    get_settings.cache_clear()
    TrainingManager.claim = lambda self: []  # queued runs stay queued

    from app.main import create_app

    out = {}
    with TestClient(create_app()) as client:
        for path in GETS:
            r = client.get(path)
            out[_name("GET", path)] = (r.status_code, r.headers["content-type"], r.text)
        for i, (path, body) in enumerate(_posts(client.get("/openapi.json").json())):
            r = client.post(path, json=body)
            out[_name("POST", path, i)] = (r.status_code, r.headers["content-type"], r.text)
        for path in PAGES:
            r = client.get(path)
            out[_name("GET", path)] = (r.status_code, r.headers["content-type"], r.text)
            if not path.endswith(".py") and path != "/lessons":
                r = client.get(path, headers={"HX-Request": "true"})
                out[_name("GET", path, fragment=True)] = (r.status_code, r.headers["content-type"], r.text)
    return out


def _same(a: tuple[int, str, str], b: tuple[int, str, str]) -> str | None:
    if a[0] != b[0]:
        return f"status {a[0]} -> {b[0]}"
    if a[1].startswith("application/json"):
        if json.loads(a[2]) != json.loads(b[2]):  # floats compare exactly: to the last bit
            return "JSON differs"
        return None
    squash = lambda s: re.sub(r"\s+", " ", s).replace("> <", "><").strip()  # noqa: E731
    if squash(a[2]) != squash(b[2]):
        x, y = squash(a[2]), squash(b[2])
        at = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        return f"HTML differs at {at}: {x[max(0, at - 80) : at + 80]!r} -> {y[max(0, at - 80) : at + 80]!r}"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["record", "compare"])
    ap.add_argument("folder", type=Path)
    args = ap.parse_args()
    now = responses()
    if args.action == "record":
        args.folder.mkdir(parents=True, exist_ok=True)
        (args.folder / "snapshot.json").write_text(json.dumps(now, ensure_ascii=False))
        print(f"recorded {len(now)} responses in {args.folder}")
        return 0
    before = json.loads((args.folder / "snapshot.json").read_text())
    problems = [f"{name}: missing now" for name in before if name not in now]
    problems += [
        f"{name}: {why}" for name in before if name in now for why in [_same(tuple(before[name]), now[name])] if why
    ]
    for p in problems:
        print(p)
    print(f"{len(before) - len(problems)} of {len(before)} responses unchanged")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
