"""The chat page in headless Chromium (Debian's chromium, driven by Playwright) against
`hearth` serving the real SmolLM2-135M-Instruct: a streamed answer, stop mid-answer,
the conversation kept across a reload, keyboard use, a phone-width window, the API key
prompt, and that model text never becomes HTML. Waits go through locators, not
wait_for_function: the page's Content-Security-Policy forbids eval, which that uses. Screenshots go to build/ui-artifacts/."""
import re
import time
from pathlib import Path

import pytest
from playwright.sync_api import expect

from conftest import appliance, chat_page, shot

QUESTION = "What is the capital of France? Answer in one sentence."
LONG = "Write a very long story about a dragon who learns to bake bread, in ten chapters."


@pytest.fixture
def page(browser, hearth_app):
    with chat_page(browser, hearth_app[0]) as pg:
        yield pg


def set_greedy(pg, max_tokens):
    pg.click("#settings summary")
    pg.fill("#temperature", "0")
    pg.fill("#max-tokens", str(max_tokens))
    pg.press("#max-tokens", "Tab")  # fires change: the page saves its settings


def last_answer(pg):
    return pg.locator("article.msg.assistant .body").last


def test_streamed_answer_then_reload(page):
    pg = page
    expect(pg.locator("#model")).to_contain_text("SmolLM2", timeout=10000)
    assert pg.evaluate("document.activeElement.id") == "prompt", "the page must start in the message box"
    set_greedy(pg, 60)
    # record every text the answer shows while it streams, and every time the page shows
    # Stop (its assignments to stop.hidden): a short answer can start and finish between two
    # polls of a wait for that transient state (a clean-clone CI run timed out waiting for
    # #stop to be visible while the answer was already done)
    pg.evaluate("""() => { window.__seen = []; new MutationObserver(() => {
        const b = [...document.querySelectorAll('article.msg.assistant .body')].pop();
        if (b && b.textContent && window.__seen[window.__seen.length - 1] !== b.textContent)
          window.__seen.push(b.textContent); }).observe(document.getElementById('messages'),
        {subtree: true, childList: true, characterData: true});
        const stop = document.getElementById('stop'), send = document.getElementById('send');
        const hidden = Object.getOwnPropertyDescriptor(HTMLElement.prototype, 'hidden');
        window.__stop_shown = false; window.__send_hidden_with_stop = false;
        Object.defineProperty(stop, 'hidden', {configurable: true, get() { return hidden.get.call(this); },
          set(v) { if (!v) { window.__stop_shown = true; if (send.hidden) window.__send_hidden_with_stop = true; }
                   hidden.set.call(this, v); }}); }""")
    pg.focus("#prompt")
    pg.keyboard.type(QUESTION)
    pg.keyboard.press("Enter")
    shot(pg, "01-streaming")
    pg.wait_for_function("window.__stop_shown", timeout=10000)
    pg.wait_for_selector("#send:not([hidden])", timeout=60000)
    assert pg.evaluate("window.__send_hidden_with_stop"), "Send must give way to Stop while the answer streams"
    answer = last_answer(pg).inner_text()
    shot(pg, "02-answer")
    assert "Paris" in answer, answer
    seen = pg.evaluate("window.__seen")
    assert len(seen) >= 2 and answer.startswith(seen[0].strip()[:3]), f"not streamed: {seen}"
    assert "tok/s" in pg.inner_text("#speed")
    assert pg.get_attribute("#messages", "aria-busy") == "false"
    assert pg.inner_text("#messages article.msg.user .body") == QUESTION

    pg.reload()
    item = pg.locator("#conversations button.open", has_text="What is the capital of France")
    item.wait_for(timeout=5000)
    pg.click("#new-chat")
    assert pg.locator("article.msg").count() == 0
    item.click()
    assert "Paris" in last_answer(pg).inner_text()
    shot(pg, "03-after-reload")


def test_stop_mid_answer_and_regenerate(page, hearth_app):
    pg = page
    log_path = hearth_app[1]
    pg.click("#new-chat")
    set_greedy(pg, 400)
    pg.fill("#prompt", LONG)
    pg.press("#prompt", "Enter")
    expect(last_answer(pg)).to_have_text(re.compile(r"[\s\S]{40,}"), timeout=30000)
    ended_before = Path(log_path).read_text(errors="replace").count("request ended early")
    pg.click("#stop")
    pg.wait_for_selector("#send:not([hidden])", timeout=5000)
    stopped = last_answer(pg).inner_text()
    time.sleep(1.0)
    assert last_answer(pg).inner_text() == stopped, "the answer kept growing after Stop"
    assert pg.locator("article.msg.assistant .note").last.inner_text() == "(stopped)"
    assert 40 < len(stopped) < 1500
    shot(pg, "04-stopped")
    # the browser really closed the stream and the server saw it (it cancels the generation)
    deadline = time.time() + 5
    ended = lambda: Path(log_path).read_text(errors="replace").count("request ended early")  # noqa: E731
    while ended() == ended_before and time.time() < deadline:
        time.sleep(0.1)
    assert ended() > ended_before, "the server never saw the abort"
    # the server let go of the cancelled request: a new one is answered at once
    pg.click("#regenerate")
    pg.wait_for_selector("#stop:not([hidden])", timeout=5000)
    pg.keyboard.press("Escape")  # Escape stops too
    pg.wait_for_selector("#send:not([hidden])", timeout=5000)
    assert pg.locator("article.msg.assistant").count() == 1, "regenerate must replace the answer"


def test_keyboard_only(page):
    pg = page
    pg.click("#new-chat")
    pg.keyboard.type("first line")
    pg.keyboard.press("Shift+Enter")
    pg.keyboard.type("second line")
    assert pg.input_value("#prompt") == "first line\nsecond line"
    assert pg.locator("article.msg").count() == 0, "Shift+Enter must not send"
    # every control is reachable with Tab and has an accessible name
    names = []
    for _ in range(40):
        pg.keyboard.press("Tab")
        names.append(pg.evaluate("""() => { const e = document.activeElement;
            return e.id || e.getAttribute('aria-label') || e.textContent.trim() || e.tagName; }"""))
    for want in ["new-chat", "Settings", "prompt", "send"]:
        assert want in names, (want, names)
    # in page order: conversations, then settings, then the message box and its button
    cycle = names[names.index("new-chat"):]
    assert cycle.index("Settings") < cycle.index("prompt") < cycle.index("send"), cycle
    for sel in ["#prompt", "#system", "#temperature", "#top-p", "#max-tokens", "#api-key"]:
        assert pg.locator(f"label[for='{sel[1:]}']").count() == 1, f"{sel} has no label"
    assert pg.get_attribute("#messages", "aria-live") == "polite"


def test_phone_width(browser, hearth_app):
    base, _ = hearth_app
    ctx = browser.new_context(viewport={"width": 375, "height": 740}, is_mobile=True, has_touch=True)
    pg = ctx.new_page()
    pg.goto(base + "/#/chat")
    pg.wait_for_selector("#prompt")
    width = pg.evaluate("document.documentElement.scrollWidth")
    shot(pg, "05-phone")
    box = pg.locator("#send").bounding_box()
    ctx.close()
    assert width <= 375, f"the page is {width}px wide at a 375px window"
    assert box and box["x"] + box["width"] <= 375


def test_model_text_is_never_html(page):
    html = page.evaluate("""renderMarkdown(
        "<img src=x onerror=alert(1)> **bold** and *it* `<b>code</b>`\\n\\n```js\\n<script>x()</script>\\n```")""")
    assert "<img" not in html and "<script" not in html and "<b>code" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "<strong>bold</strong>" in html and "<em>it</em>" in html
    assert "<code>&lt;b&gt;code&lt;/b&gt;</code>" in html
    assert '<pre><code class="language-js">&lt;script&gt;x()&lt;/script&gt;</code></pre>' in html


def test_api_key_prompt(browser):
    with appliance("--api-key", "sekrit") as (base, _):
        ctx = browser.new_context()
        pg = ctx.new_page()
        pg.goto(base + "/")
        pg.wait_for_selector("#key-form:not([hidden])", timeout=10000)
        shot(pg, "06-api-key")
        pg.fill("#api-key", "sekrit")
        pg.press("#api-key", "Enter")
        expect(pg.locator("#model")).to_contain_text("SmolLM2", timeout=10000)
        assert pg.is_hidden("#key-form")
        ctx.close()


def test_server_gone_is_reported(browser):
    with appliance() as (base, _):
        ctx = browser.new_context()
        pg = ctx.new_page()
        pg.goto(base + "/")
        expect(pg.locator("#model")).to_contain_text("SmolLM2", timeout=10000)
    # the server has stopped: sending must say so, not hang or fail silently
    pg.fill("#prompt", "hello")
    pg.press("#prompt", "Enter")
    pg.wait_for_selector("#banner:not([hidden])", timeout=10000)
    assert "Cannot reach the hearth server" in pg.inner_text("#banner")
    shot(pg, "07-server-gone")
    ctx.close()
