"""One student in a class, for Locust (bench/classroom.py runs it; never imported by the app).

A student opens the explorer, then alternates reading (a pause) with one of: typing a burst of keys
in the text box (sent as the page sends them, below), picking another head or layer, opening a
lesson and changing one of its settings, or opening an Inspect view. Every page request is the one
the browser makes: a full page on navigation, the htmx fragment with the form's fields and
HX-Request headers on a change.

Typing goes through the page's own debounce (static/js/explorer.js, `data-debounce-ms` on the text
box): a key pressed after a pause of at least DEBOUNCE_S is sent at once, keys in quicker
succession wait for the pause, and a student never has two requests in flight (the form's
hx-sync "queue last"): keys typed while a request is out are sent together when it returns.
"""

from __future__ import annotations

import random
import re
import time
from pathlib import Path
from urllib.parse import urlencode

from locust import HttpUser, between, task

ROOT = Path(__file__).resolve().parent.parent
DEBOUNCE_S = (
    float(
        re.search(
            r'id="text".*?data-debounce-ms="(\d+)"',
            (ROOT / "templates" / "explorer.html").read_text(encoding="utf-8"),
            re.S,
        ).group(1)
    )
    / 1000
)
MINILM = "all-MiniLM-L6-v2"
MINILM_SHARE = 0.2  # students who pick the pretrained encoder instead of the toy
LESSONS = {
    "attention": ("d_k", [2, 3, 4]),
    "scaling": ("n_keys", [8, 16, 32]),
    "causal": ("seed", [0, 1, 2]),
    "multihead": ("n_heads", [1, 2, 4]),
    "positions": ("n_pos", [20, 50, 80]),
    "params": ("preset", ["gpt2-small", "gpt2-xl"]),
    "forward": ("d_mlp", [32, 64]),
}
INSPECT = ["decompose", "lens", "detectors", "kvcache", "compare"]
WORDS = "the cat sat on a mat and then it ran to see what the dog was doing in the warm sun".split()
TOY_SHAPE = {"n_layers": 2, "n_heads": 4}  # the toy's (app/models/catalog.py); MiniLM: 6 layers of 12 heads
MINILM_SHAPE = {"n_layers": 6, "n_heads": 12}


class Student(HttpUser):
    wait_time = between(1.0, 4.0)  # reading what the figures show

    def on_start(self) -> None:
        self.model = MINILM if random.random() < MINILM_SHARE else "toy"
        self.shape = MINILM_SHAPE if self.model == MINILM else TOY_SHAPE
        self.text = " ".join(random.sample(WORDS, 4))
        self.layer = self.head = 0
        self.client.get("/?" + urlencode({"model": self.model, "text": self.text}), name="explorer: open")

    # ---------------------------------------------------------------- the explorer's requests

    def form(self) -> dict:
        """The explorer form's fields as htmx sends them (a checkbox sends its hidden 0, then 1)."""
        fields = [
            ("text", self.text),
            ("model", self.model),
            ("causal", "0"),
            ("causal", "1"),
            ("scale", "0"),
            ("scale", "1"),
            ("layer", str(self.layer)),
            ("head", str(self.head)),
            ("ablate_method", "zero"),
        ]
        if self.model != MINILM:
            fields += [
                ("temperature", "1"),
                ("positional_embedding_type", "learned"),
                ("n_heads", "4"),
                ("d_model", "64"),
                ("n_layers", "2"),
                ("seed", "0"),
            ]
        return fields

    def send(self, trigger: str, name: str) -> None:
        headers = {
            "HX-Request": "true",
            "HX-Target": "results",
            "HX-Trigger-Name": trigger,
            "HX-Current-URL": self.host + "/",
        }
        with self.client.get("/?" + urlencode(self.form()), headers=headers, name=name, catch_response=True) as r:
            if r.status_code != 200:
                r.failure(f"status {r.status_code}")

    @task(6)
    def type_a_burst(self) -> None:
        """3 to 8 keys, 60-250 ms apart, sometimes deleting; the text stays 5..60 characters."""
        last_sent = -1e9
        pending = False
        for _ in range(random.randint(3, 8)):
            time.sleep(random.uniform(0.06, 0.25))
            if len(self.text) > 60 or (len(self.text) > 5 and random.random() < 0.25):
                self.text = self.text[:-1]
            else:
                self.text += random.choice("abcdefghijklmnopqrstuvwxyz  ")
            now = time.monotonic()
            if now - last_sent >= DEBOUNCE_S and not pending:
                self.send("text", "explorer: type")  # the first key after a pause goes at once
                last_sent = time.monotonic()
            else:
                pending = True
        if pending:  # the pause after the burst sends what was typed since
            time.sleep(DEBOUNCE_S)
            self.send("text", "explorer: type")

    @task(2)
    def pick_a_head(self) -> None:
        self.head = random.randrange(self.shape["n_heads"])
        self.send("head", "explorer: head")

    @task(1)
    def pick_a_layer(self) -> None:
        self.layer = random.randrange(self.shape["n_layers"])
        self.send("layer", "explorer: layer")

    # ---------------------------------------------------------------- lessons and Inspect

    @task(1)
    def open_a_lesson(self) -> None:
        name = random.choice(list(LESSONS))
        self.client.get(f"/lessons/{name}", name="lesson: open")
        field, values = LESSONS[name]
        headers = {"HX-Request": "true", "HX-Target": "results", "HX-Trigger-Name": field}
        self.client.get(
            f"/lessons/{name}?" + urlencode({field: random.choice(values)}), headers=headers, name="lesson: change"
        )

    @task(1)
    def inspect(self) -> None:
        view = random.choice(INSPECT)
        self.client.get(
            "/inspect?" + urlencode({"view": view, "model": self.model, "text": self.text}), name="inspect: open"
        )
