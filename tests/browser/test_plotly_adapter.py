"""Plotly's private state is read in one file, static/js/plotly-adapter.js, written against one Plotly.

The first three tests read files only (no browser): the adapter's stated version is the vendored one
(package.json, package-lock.json, and node_modules / static/vendor when `make setup` made them), no
other script under static/js names a Plotly internal, and the explorer's ES modules take the adapter
by import (window.PlotlyAdapter is for these tests and a console). The last two check the start-up
check in a real page: no warning with the vendored Plotly, a console warning when the versions differ
(asked again, and at start-up), and the page's one adapter is the module's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JS = ROOT / "static" / "js"
ADAPTER = JS / "plotly-adapter.js"
PACKAGE = "plotly.js-cartesian-dist-min"

# Plotly's private fields and methods the explorer needs (the adapter's whole business): a script
# that names one of them outside the adapter breaks on a Plotly upgrade without the adapter knowing.
INTERNALS = [
    "_fullLayout",
    "_fullData",
    "_offset",
    "_length",
    "_mouseDownTime",
    "_dragging",
    "_dragged",
    "l2p",
    "p2l",
    "svg-container",
]


def adapter_version() -> str:
    found = re.findall(r'const PLOTLY_VERSION = "([^"]+)";', ADAPTER.read_text(encoding="utf-8"))
    assert len(found) == 1, 'plotly-adapter.js states its Plotly version once: const PLOTLY_VERSION = "x.y.z";'
    return found[0]


def vendored_versions() -> dict[str, str]:
    """Where the vendored Plotly's version is written, and what it says there."""
    lock = json.loads((ROOT / "package-lock.json").read_text(encoding="utf-8"))
    found = {
        "package.json": json.loads((ROOT / "package.json").read_text(encoding="utf-8"))["dependencies"][PACKAGE],
        "package-lock.json": lock["packages"][f"node_modules/{PACKAGE}"]["version"],
    }
    installed = ROOT / "node_modules" / PACKAGE / "package.json"
    if installed.exists():  # made by `make setup` (npm ci)
        found[str(installed.relative_to(ROOT))] = json.loads(installed.read_text(encoding="utf-8"))["version"]
    served = ROOT / "static" / "vendor" / "plotly-cartesian.min.js"
    if served.exists():  # copied from node_modules by scripts/vendor_assets.sh; its banner says the version
        with served.open(encoding="utf-8") as f:
            banner = re.search(r"plotly\.js \(cartesian - minified\) v(\S+)", f.read(500))
        assert banner, f"{served} has no version banner"
        found[str(served.relative_to(ROOT))] = banner.group(1)
    return found


def test_the_adapter_states_the_vendored_plotly_version():
    stated = adapter_version()
    for where, version in vendored_versions().items():
        assert version == stated, (
            f"{where} has Plotly {version}, static/js/plotly-adapter.js was written against {stated}: "
            "check every function of the adapter against the new Plotly, then update PLOTLY_VERSION"
        )


def test_plotly_internals_are_named_only_in_the_adapter():
    scripts = sorted(JS.glob("*.js"))
    assert ADAPTER in scripts and len(scripts) > 1
    pattern = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, INTERNALS)) + r")(?![\w-])")
    found = {}
    for path in scripts:
        if path != ADAPTER:
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                found.update({f"{path.name}:{n}": name for name in pattern.findall(line)})
    assert found == {}, f"Plotly internals outside static/js/plotly-adapter.js: {found}"
    in_adapter = set(pattern.findall(ADAPTER.read_text(encoding="utf-8")))
    assert {"_fullLayout", "_offset", "_length", "_mouseDownTime"} <= in_adapter  # the pattern finds them


def test_the_explorers_modules_import_the_adapter():
    """The explorer's scripts are ES modules (explorer.js, the entry base.html loads, imports explorer-main.js):
    one that asks the adapter imports it; none reads window.PlotlyAdapter."""
    assert re.search(r'^export const PLOTLY_VERSION = "', ADAPTER.read_text(encoding="utf-8"), re.M)
    modules = sorted(set(JS.glob("explorer-*.js")))
    assert JS / "explorer-main.js" in modules
    for path in modules:
        code = "\n".join(
            line for line in path.read_text(encoding="utf-8").splitlines() if not line.lstrip().startswith("//")
        )
        assert "PlotlyAdapter" not in code, f"{path.name} reads window.PlotlyAdapter: import it instead"
        if re.search(r"\bP\.\w", code):
            assert 'import * as P from "./plotly-adapter.js";' in code, path.name


@pytest.mark.browser
def test_the_page_checks_its_plotly_against_the_adapters_version(page, live_server):
    warnings = []
    page.on("console", lambda m: warnings.append(m.text) if m.type == "warning" else None)
    page.goto(live_server + "/?model=toy")
    page.wait_for_function("() => window.PlotlyAdapter && window.Plotly")
    assert page.evaluate("() => [Plotly.version, PlotlyAdapter.PLOTLY_VERSION]") == [adapter_version()] * 2
    assert not [w for w in warnings if "plotly-adapter" in w]
    # another Plotly: the same check warns
    assert (
        page.evaluate("""() => {
      const real = Plotly.version;
      Plotly.version = '0.0.1';
      try { return PlotlyAdapter.checkVersion(); } finally { Plotly.version = real; }
    }""")
        is False
    )
    page.wait_for_timeout(100)  # console events arrive asynchronously
    assert [w for w in warnings if "plotly-adapter" in w and "0.0.1" in w and adapter_version() in w], warnings
    # window.PlotlyAdapter is the module the explorer imports (evaluated once: one start-up check)
    assert (
        page.evaluate("""async () => {
      const m = await import('/static/js/plotly-adapter.js');
      return m.checkVersion === PlotlyAdapter.checkVersion && m.isDrawn === PlotlyAdapter.isDrawn;
    }""")
        is True
    )
    assert len([w for w in warnings if "plotly-adapter" in w]) == 1, warnings
    assert page.watch.page_errors == []


@pytest.mark.browser
def test_the_start_up_check_warns_when_the_page_has_another_plotly(page, live_server):
    warnings = []
    page.on("console", lambda m: warnings.append(m.text) if m.type == "warning" else None)
    # the vendored bundle sets window.Plotly; the page sees it as another version from the start
    page.add_init_script("""(() => {
      let plotly;
      Object.defineProperty(window, 'Plotly', {configurable: true, get: () => plotly,
        set: (v) => { plotly = v; v.version = '0.0.2'; }});
    })()""")
    page.goto(live_server + "/?model=toy")
    page.wait_for_function("() => window.PlotlyAdapter && document.querySelector('[data-figure] .main-svg')")
    page.wait_for_timeout(100)  # console events arrive asynchronously
    assert [w for w in warnings if "plotly-adapter" in w and "0.0.2" in w and adapter_version() in w], warnings
    assert page.watch.page_errors == []
