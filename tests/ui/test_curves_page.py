"""The curve designer (/curves) in headless Chromium against `hearth` serving the real
SmolLM2-135M-Instruct: the page and its files come byte for byte from web/, the identity
curve's JSON is what the server accepts, dragging a point changes the JSON and keeps it
monotone, Measure draws the histogram (status names the vocabulary), Generate shows n
samples as text (never HTML) for the drawn curve and for the default recipe, and a server
error shows up in the status line. The page runs under its Content-Security-Policy, so
any inline script or eval would fail it. Screenshots go to build/ui-artifacts/."""
import json
import urllib.request

import pytest
from playwright.sync_api import expect

from conftest import WEB, shot


@pytest.fixture
def page(browser, hearth_app):
    base, _ = hearth_app
    ctx = browser.new_context(viewport={"width": 1200, "height": 900})
    pg = ctx.new_page()
    errors = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" and "400" not in m.text else None)
    pg.goto(base + "/curves")
    yield pg
    ctx.close()
    assert not errors, errors


def curve(pg):
    return json.loads(pg.locator("#curve-json").input_value())


def test_assets_are_the_files(hearth_app):
    base, _ = hearth_app
    for path, name in (("/curves", "curves.html"), ("/curves.js", "curves.js"), ("/curves.css", "curves.css")):
        with urllib.request.urlopen(base + path, timeout=10) as r:
            assert r.status == 200 and r.read() == (WEB / name).read_bytes()


def test_identity_then_drag(page):
    c = curve(page)
    assert c["space"] == "logprob" and all(p["x_pct"] == p["y_pct"] for p in c["points"])
    box = page.locator("#plot").bounding_box()
    # the point at 1% (third of five) sits on the diagonal; drag it up and to the right
    x0, y0 = curve(page)["points"][2]["x_pct"], None
    canvas_w = 560
    pad = 40

    def px(pct):  # curves.js's toPx for a percentage, in CSS pixels of the canvas box
        import math
        lo = math.log(1e-6)
        f = (math.log(pct / 100) - lo) / -lo
        return pad + f * (canvas_w - 2 * pad), pad + (canvas_w - 2 * pad) * (1 - f)

    sx, sy = px(x0)
    scale = box["width"] / canvas_w
    page.mouse.move(box["x"] + sx * scale, box["y"] + sy * scale)
    page.mouse.down()
    page.mouse.move(box["x"] + (sx + 30) * scale, box["y"] + (sy - 80) * scale, steps=5)
    page.mouse.up()
    pts = curve(page)["points"]
    assert pts[2]["y_pct"] > pts[2]["x_pct"], pts  # lifted above the diagonal
    ys = [p["y_pct"] for p in pts]
    xs = [p["x_pct"] for p in pts]
    assert ys == sorted(ys) and xs == sorted(xs) and len(set(xs)) == len(xs)  # still monotone
    shot(page, "curves-dragged")
    page.get_by_role("button", name="Sharpen").click()
    sharp = curve(page)["points"]
    assert all(p["y_pct"] <= p["x_pct"] for p in sharp) and sharp[-1]["y_pct"] == 100


def test_measure_and_generate(page):
    page.get_by_role("button", name="Measure").click()
    expect(page.locator("#status")).to_have_text("histogram of 49152 tokens", timeout=60000)
    page.fill("#n", "3")
    page.fill("#max-tokens", "12")
    page.get_by_role("button", name="Generate with curve").click()
    expect(page.locator("#samples li")).to_have_count(3, timeout=120000)
    expect(page.locator("#mode")).to_have_text("curve")
    expect(page.locator("#status")).to_contain_text("3 samples (seed 1)")
    assert page.locator("#samples li b, #samples li script, #samples li img").count() == 0
    shot(page, "curves-generated")
    page.get_by_role("button", name="Generate with default recipe").click()
    expect(page.locator("#mode")).to_contain_text("default recipe: temperature", timeout=120000)
    expect(page.locator("#samples li")).to_have_count(3)


def test_error_shows_in_status(page):
    page.fill("#prompt", "")
    page.get_by_role("button", name="Generate with curve").click()
    expect(page.locator("#status")).to_have_text("prompt must be a non-empty string", timeout=30000)
    expect(page.locator("#status")).to_have_class("status error")
