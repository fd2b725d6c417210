"""Print SAE features' dashboards as text: label, density, top examples (the activating character in [[ ]]) and
logit effect, read from GET /api/v1/saes/{name}/features/{index} of an app made in-process (no server needed).

    .venv/bin/python scripts/show_sae_features.py [--sae python-docs-induction-resid0] [--examples 5] 382 628 192
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fastapi.testclient import TestClient  # noqa: E402

from app.main import create_app  # noqa: E402
from app.settings import Settings  # noqa: E402


def shown(token: str) -> str:
    return token.replace("\n", "⏎")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sae", default="python-docs-induction-resid0")
    ap.add_argument("--examples", type=int, default=5)
    ap.add_argument("index", type=int, nargs="+")
    a = ap.parse_args(argv)
    with TestClient(create_app(Settings(access_log=False))) as c:
        for index in a.index:
            r = c.get(f"/api/v1/saes/{a.sae}/features/{index}")
            if r.status_code != 200:
                print(r.text)
                return 1
            d = r.json()
            print(f"{a.sae} feature {index}: {d['label']!r}")
            print(f"  density {d['density']:.4f} of {d['tokens_scanned']:,} characters, max {d['max_activation']:.2f}")
            for ex in d["top_examples"][: a.examples]:
                at = ex["max_position"]
                text = "".join(shown(t) for t in ex["tokens"][:at])
                after = "".join(shown(t) for t in ex["tokens"][at + 1 :])
                print(f"  {ex['activations'][at]:6.2f}  {text}[[{shown(ex['tokens'][at])}]]{after}")
            effect = d["logit_effect"]
            for side in ("positive", "negative"):
                tokens = ", ".join(f"{shown(t['token'])!r} {t['value']:+.2f}" for t in effect[side][:8])
                print(f"  logit effect, most {side}: {tokens}")
            print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
