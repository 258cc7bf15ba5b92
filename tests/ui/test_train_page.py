"""The training view (/train) in headless Chromium against `hearth --train-dir DIR`: the
page and its files come byte for byte from web/; it lists the runs newest first, shows the
chosen run's latest numbers exactly as its metrics.jsonl has them (read here with Python's
json) and one chart point per training report; it follows the file as a run appends to
it, says when a run failed (as text, never HTML), and says how to enable the view when the
server has no --train-dir. Runs under the page's Content-Security-Policy. Screenshots go to
build/ui-artifacts/."""
import json
import os
import time
import urllib.request

import pytest
from playwright.sync_api import expect

from conftest import WEB, appliance, chat_page, shot


def rec(step, loss, iters=8, elapsed=None):
    return {"step": step, "loss": loss, "learning_rate": 2e-4, "iterations_per_second": 1.5,
            "tokens_per_second": 321.25, "trained_tokens": 100 * step, "peak_memory_gb": 0.5, "iters": iters,
            "elapsed": elapsed if elapsed is not None else step * 2.0}


def write(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")


@pytest.fixture(scope="module")
def train_app(tmp_path_factory):
    root = tmp_path_factory.mktemp("train-runs")
    write(root / "sft-run" / "metrics.jsonl",
          [rec(2, 3.25), rec(4, 2.75), {"step": 4, "val_loss": 2.875, "val_time": 0.5, "iters": 8, "elapsed": 9.0}])
    write(root / "broken" / "metrics.jsonl",
          [rec(8, 1.5), {"done": True, "step": 8, "iters": 8, "elapsed": 20.0, "trained_tokens": 800,
                         "peak_memory_gb": 0.75, "error": "<b>disk</b> full"}])
    now = time.time()
    os.utime(root / "broken" / "metrics.jsonl", (now - 100, now - 100))
    with appliance("--train-dir", str(root)) as (base, _):
        yield base, root


@pytest.fixture
def page(browser, train_app):
    with chat_page(browser, train_app[0], "/train") as pg:
        yield pg


def test_assets_are_the_files(train_app):
    base, _ = train_app
    for path, name in (("/train", "train.html"), ("/train.js", "train.js"), ("/train.css", "train.css")):
        with urllib.request.urlopen(base + path, timeout=10) as r:
            assert r.status == 200 and r.read() == (WEB / name).read_bytes()


def test_lists_runs_and_shows_the_newest(page):
    buttons = page.locator("#runs button")
    expect(buttons).to_have_count(2)
    assert [b.get_attribute("data-id") for b in buttons.all()] == ["sft-run", "broken"]
    expect(page.locator("#run-title")).to_have_text("sft-run")
    expect(page.locator("#v-step")).to_have_text("4 / 8")
    expect(page.locator("#v-loss")).to_have_text("2.7500 (step 4)")
    expect(page.locator("#v-val")).to_have_text("2.8750 (step 4)")
    expect(page.locator("#v-tps")).to_have_text("321.3")
    expect(page.locator("#v-mem")).to_have_text("0.50 GB")
    expect(page.locator("#v-elapsed")).to_have_text("9s")  # the latest record: the validation one
    expect(page.locator("#v-eta")).to_have_text("9s")  # 9 s / 4 steps x 4 steps left
    points = page.locator("#line-loss").get_attribute("points").split()
    assert len(points) == 2 and len(page.locator("#line-val").get_attribute("points").split()) == 1
    expect(page.locator("#chart circle.val-dot")).to_have_count(1)
    shot(page, "train-view")


def test_follows_the_file(page, train_app):
    _, root = train_app
    expect(page.locator("#v-step")).to_have_text("4 / 8")
    with open(root / "sft-run" / "metrics.jsonl", "a") as f:
        f.write(json.dumps(rec(6, 2.5)) + "\n")
        f.write(json.dumps({"done": True, "step": 8, "iters": 8, "elapsed": 16.0, "trained_tokens": 800,
                            "peak_memory_gb": 0.625}) + "\n")
    expect(page.locator("#v-loss")).to_have_text("2.5000 (step 6)", timeout=10000)
    expect(page.locator("#v-step")).to_have_text("8 / 8")
    expect(page.locator("#v-eta")).to_have_text("finished")
    expect(page.locator("#v-mem")).to_have_text("0.63 GB")
    expect(page.locator("#status")).to_have_text("The run finished.")
    assert len(page.locator("#line-loss").get_attribute("points").split()) == 3


def test_a_failed_run_says_so_as_text(page):
    page.locator("#runs button[data-id=broken]").click()
    expect(page.locator("#run-title")).to_have_text("broken")
    expect(page.locator("#status")).to_have_text("The run failed: <b>disk</b> full")
    assert page.locator("#status b").count() == 0
    expect(page.locator("#status")).to_have_class("status error")


def test_without_a_train_dir(browser):
    with appliance() as (base, _):
        ctx = browser.new_context()
        pg = ctx.new_page()
        pg.goto(base + "/train")
        expect(pg.locator("#runs-empty")).to_contain_text("--train-dir DIR")
        expect(pg.locator("#runs button")).to_have_count(0)
        ctx.close()
