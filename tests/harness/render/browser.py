"""A real browser looks at a report page: headless Chromium (Debian's ``chromium`` or
``chromium-headless-shell``) renders it, takes a screenshot and dumps the DOM after the page's
load event, with a probe planted at the top of a copy of the page.

Why a probe and not the DevTools protocol: the page itself can see every console error a
reader would (``console.error`` calls, uncaught exceptions, resources that fail to load: the
window's ``error`` event in its capture phase) and measure its own layout; it writes what it
saw into an attribute of ``<body>``, which ``--dump-dom`` returns. That needs no websocket
client and no extra dependency, and it works alike on both Debian builds.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

NAMES = ("chromium", "chromium-headless-shell", "chrome-headless-shell", "chromium-browser",
         "google-chrome", "chrome")
REQUIRE = "ATTNBENCH_REQUIRE_BROWSER"  # set (CI): a missing browser fails the tests, not skips

PROBE = """<script>
(function () {
  var errors = [];
  var error = console.error;
  console.error = function () {
    errors.push("console.error: " + Array.prototype.join.call(arguments, " "));
    return error.apply(console, arguments);
  };
  window.addEventListener("error", function (ev) {
    var t = ev.target;
    if (t && t !== window && (t.src || t.href)) {
      errors.push("failed to load " + (t.src || t.href).slice(-120));  // the end names the file
    } else {
      errors.push("uncaught: " + ev.message);
    }
  }, true);
  window.addEventListener("unhandledrejection", function (ev) {
    errors.push("unhandled rejection: " + ev.reason);
  });
  // the claims section with its folded rows opened: how far a table sticks out of its box
  // (sideways scroll), the last column's heading, right edge and share of the table's width,
  // and the tallest row
  function claimsLayout(width) {
    var section = document.getElementById("claims");
    if (!section) { return null; }
    section.querySelectorAll("details").forEach(function (d) { d.open = true; });
    var scroll = 0, tallest = 0, last = null, table = null;
    section.querySelectorAll(".scroll").forEach(function (box) {
      scroll = Math.max(scroll, box.scrollWidth - box.clientWidth);
    });
    section.querySelectorAll("table tbody tr").forEach(function (row) {
      tallest = Math.max(tallest, row.getBoundingClientRect().height);
    });
    table = section.querySelector("table");
    var heads = table ? table.querySelectorAll("thead th") : [];
    last = heads.length ? heads[heads.length - 1] : null;
    return {
      scroll: scroll, tallestRow: tallest, lastHeading: last ? last.innerText : null,
      lastRight: last ? last.getBoundingClientRect().right : null,
      lastShare: last ? last.getBoundingClientRect().width / table.getBoundingClientRect().width
        : null
    };
  }
  window.addEventListener("load", function () {
    setTimeout(function () {
      var width = window.innerWidth, wide = [];
      document.querySelectorAll("body *").forEach(function (el) {
        var r = el.getBoundingClientRect();
        if (r.right > width + 1 && wide.length < 3 && !el.closest(".scroll")) {
          wide.push(el.tagName.toLowerCase() + (el.className ? "." + el.className : "") +
                    " " + Math.round(r.right) + "px");
        }
      });
      var items = document.querySelectorAll("#summary ul.summary li");
      var claims = claimsLayout(width);
      document.body.setAttribute("data-probe", JSON.stringify({
        claims: claims,
        overflow: document.documentElement.scrollWidth - width,
        wide: wide,
        errors: errors,
        summary: Array.prototype.map.call(items, function (li) { return li.innerText; }),
        summaryTop: items.length ? items[0].getBoundingClientRect().top : null,
        text: document.body.innerText.length
      }));
    }, 0);
  });
})();
</script>"""


def find() -> str | None:
    """The path of a Chromium binary on PATH, under any of its Debian or upstream names."""
    return next(filter(None, map(shutil.which, NAMES)), None)


@dataclass(frozen=True)
class Look:
    """What the browser saw: layout overflow in CSS px (<= 0: none), the elements that stick
    out, console errors, the summary's sentences and where the first one is, the length of
    the page's text, and the screenshot (PNG)."""

    overflow: int
    wide: list[str]
    errors: list[str]
    summary: list[str]
    summary_top: float | None
    text: int
    screenshot: Path
    claims: dict | None = None  # the claims section's layout (PROBE's claimsLayout), if any


def _run(binary: str, width: int, *args: str) -> subprocess.CompletedProcess:
    command = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--no-first-run", f"--window-size={width},900", "--virtual-time-budget=3000",
               *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def look(page: Path, width: int, workdir: Path, binary: str | None = None) -> Look:
    """Render ``page`` at ``width`` CSS px: a copy with :data:`PROBE` planted right after
    ``<head>`` is dumped (DOM after load) and screenshotted (the first 900 px)."""
    binary = binary or find()
    if binary is None:
        raise RuntimeError("no chromium binary on PATH")
    text = page.read_text(encoding="utf-8")
    probe = workdir / f"probe-{width}.html"
    probe.write_text(re.sub(r"<head>", "<head>" + PROBE, text, count=1, flags=re.I),
                     encoding="utf-8")
    dom = _run(binary, width, "--dump-dom", probe.as_uri())
    found = re.search(r'data-probe="([^"]*)"', dom.stdout)
    if not found:
        raise RuntimeError(f"the probe did not report (rc {dom.returncode}): "
                           f"{dom.stderr[-600:]}")
    seen = json.loads(html.unescape(found.group(1)))
    shot = workdir / f"screenshot-{width}.png"
    done = _run(binary, width, f"--screenshot={shot}", page.as_uri())
    if not shot.is_file():
        raise RuntimeError(f"no screenshot (rc {done.returncode}): {done.stderr[-600:]}")
    return Look(int(seen["overflow"]), seen["wide"], seen["errors"], seen["summary"],
                seen["summaryTop"], int(seen["text"]), shot, seen.get("claims"))


def ink(png: Path) -> float:
    """The share of the screenshot's pixels that are not background (near-white): 0 for a
    blank page."""
    from PIL import Image  # matplotlib's dependency: always installed beside the harness

    with Image.open(png) as image:
        grey = image.convert("L")
        histogram = grey.histogram()
    return sum(histogram[:240]) / max(1, sum(histogram))
