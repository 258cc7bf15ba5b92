// app.js: the hearth chat page. Talks only to the server that served it (the
// OpenAI-compatible /v1/chat/completions, streamed over SSE; with `serve --memory`,
// the memory tools at /v1/memory/tools, offered to the model and browsed in the memory
// panel); keeps conversations and settings in localStorage. Model text is always escaped before it becomes
// HTML: the Markdown renderer below emits only the tags it creates itself.
"use strict";

const STORE_CONVS = "hearth.conversations";
const STORE_CURRENT = "hearth.current";
const STORE_SETTINGS = "hearth.settings";
const STORE_KEY = "hearth.apiKey";
const DEFAULT_SETTINGS = { system: "", temperature: 0.7, top_p: 0.95, max_tokens: 512, memory: true };
// Model turns that call memory tools before a question's answer (a model that keeps
// calling is stopped here), and how much of a tool's result goes back to it.
const MAX_TOOL_ROUNDS = 4;
const MAX_TOOL_RESULT = 6000;

const $ = (id) => document.getElementById(id);
const el = {
  convs: $("conversations"), newChat: $("new-chat"), model: $("model"), speed: $("speed"),
  banner: $("banner"), bannerText: $("banner-text"), bannerRetry: $("banner-retry"),
  keyForm: $("key-form"), key: $("api-key"), system: $("system"), temperature: $("temperature"),
  topP: $("top-p"), maxTokens: $("max-tokens"), messages: $("messages"), composer: $("composer"),
  prompt: $("prompt"), send: $("send"), stop: $("stop"), regenerate: $("regenerate"), status: $("status"),
  memory: $("memory"), memorySearch: $("memory-search"), memoryQuery: $("memory-query"),
  memoryArticles: $("memory-articles"), memoryChanges: $("memory-changes"), memoryResults: $("memory-results"),
  memoryView: $("memory-view"), memoryViewTitle: $("memory-view-title"), memoryViewBody: $("memory-view-body"),
  memoryClose: $("memory-close"), useMemory: $("use-memory"), memorySynthesize: $("memory-synthesize"),
  memoryProgress: $("memory-progress"),
};

// ---- storage: a broken or full localStorage must not break chatting ----

function load(key, fallback) {
  try {
    const v = JSON.parse(localStorage.getItem(key));
    return v === null || v === undefined ? fallback : v;
  } catch (e) {
    return fallback;
  }
}
function save(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
  } catch (e) {
    showBanner("Could not save to this browser's storage: " + e.message, null);
  }
}

let conversations = load(STORE_CONVS, []);
if (!Array.isArray(conversations)) conversations = [];
conversations = conversations.filter((c) => c && typeof c.id === "string" && Array.isArray(c.messages));
let current = null; // the open conversation, or null for a fresh one
let settings = Object.assign({}, DEFAULT_SETTINGS, load(STORE_SETTINGS, {}));
let apiKey = load(STORE_KEY, "");
let inflight = null; // {controller, conv, msgIndex} while an answer streams
let lastRetry = null; // what the banner's Retry button does
let memoryTools = null; // the server's memory tools (chat "tools" form), null without --memory

function saveConversations() { save(STORE_CONVS, conversations); }
function newId() { return Date.now().toString(36) + Math.random().toString(36).slice(2, 8); }

// ---- Markdown: paragraphs, headings, lists, fenced code, inline code, bold, italic ----

function escapeHtml(s) {
  return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
    .replace(/"/g, "&quot;").replace(/'/g, "&#39;");
}

// Inline spans of one block's text. Code spans are cut out first so that their
// contents get no emphasis; everything is escaped before any tag is added.
function renderInline(text) {
  let out = "";
  const parts = text.split(/(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/);
  // split with two groups yields [text, ticks, code, text, ticks, code, ...]
  for (let i = 0; i < parts.length; i += 3) {
    out += emphasis(escapeHtml(parts[i]));
    if (i + 2 < parts.length) out += "<code>" + escapeHtml(parts[i + 2]) + "</code>";
  }
  return out;
}
function emphasis(s) {
  return s
    .replace(/\*\*(?=\S)([\s\S]*?\S)\*\*/g, "<strong>$1</strong>")
    .replace(/__(?=\S)([\s\S]*?\S)__/g, "<strong>$1</strong>")
    .replace(/(^|[^*\w])\*(?=\S)([^*]*?\S)\*(?!\*)/g, "$1<em>$2</em>")
    .replace(/(^|[^_\w])_(?=\S)([^_]*?\S)_(?!\w)/g, "$1<em>$2</em>")
    .replace(/\n/g, "<br>");
}

function renderMarkdown(src) {
  const lines = src.replace(/\r\n?/g, "\n").split("\n");
  let html = "";
  let para = [];
  let list = null; // {tag, items}
  const flushPara = () => {
    if (para.length) html += "<p>" + renderInline(para.join("\n")) + "</p>";
    para = [];
  };
  const flushList = () => {
    if (list) html += "<" + list.tag + ">" + list.items.map((t) => "<li>" + renderInline(t) + "</li>").join("") +
      "</" + list.tag + ">";
    list = null;
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^\s*(```+|~~~+)\s*([\w+#.-]*)/);
    if (fence) {
      flushPara(); flushList();
      const code = [];
      i++;
      // an unclosed fence (still streaming) runs to the end of the text
      while (i < lines.length && !lines[i].trim().startsWith(fence[1])) code.push(lines[i++]);
      const lang = fence[2] ? ' class="language-' + escapeHtml(fence[2]) + '"' : "";
      html += "<pre><code" + lang + ">" + escapeHtml(code.join("\n")) + "</code></pre>";
      continue;
    }
    if (!line.trim()) { flushPara(); flushList(); continue; }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    if (heading) {
      flushPara(); flushList();
      const level = Math.min(6, heading[1].length + 2); // the page's own h1/h2 stay above answers
      html += "<h" + level + ">" + renderInline(heading[2]) + "</h" + level + ">";
      continue;
    }
    const item = line.match(/^\s*([-*+]|\d{1,9}[.)])\s+(.*)$/);
    if (item) {
      flushPara();
      const tag = /\d/.test(item[1]) ? "ol" : "ul";
      if (list && list.tag !== tag) flushList();
      if (!list) list = { tag, items: [] };
      list.items.push(item[2]);
      continue;
    }
    if (list && /^\s+\S/.test(line)) { list.items[list.items.length - 1] += "\n" + line.trim(); continue; }
    flushList();
    para.push(line);
  }
  flushPara(); flushList();
  return html;
}

// ---- rendering ----

function titleOf(conv) {
  const first = conv.messages.find((m) => m.role === "user");
  const t = first ? first.content.trim().replace(/\s+/g, " ") : "New chat";
  return t.length > 60 ? t.slice(0, 57) + "…" : t || "New chat";
}

function renderList() {
  el.convs.textContent = "";
  const sorted = conversations.slice().sort((a, b) => (b.updated || 0) - (a.updated || 0));
  for (const conv of sorted) {
    const li = document.createElement("li");
    const open = document.createElement("button");
    open.type = "button";
    open.className = "open";
    open.textContent = titleOf(conv);
    open.title = titleOf(conv);
    if (current && conv.id === current.id) open.setAttribute("aria-current", "true");
    open.addEventListener("click", () => openConversation(conv.id, true));
    const del = document.createElement("button");
    del.type = "button";
    del.className = "delete";
    del.textContent = "×";
    del.setAttribute("aria-label", "Delete conversation: " + titleOf(conv));
    del.addEventListener("click", () => deleteConversation(conv.id));
    li.append(open, del);
    el.convs.append(li);
  }
}

function messageNode(m, index) {
  const div = document.createElement("article");
  div.className = "msg " + m.role + (m.error ? " error" : "");
  div.dataset.index = String(index);
  const who = document.createElement("div");
  who.className = "who";
  who.textContent = m.error ? "error" : m.role === "user" ? "you" : m.role === "tool" ? "memory: " + m.name
    : "assistant";
  const body = document.createElement("div");
  body.className = "body";
  if (m.role === "user" || m.role === "tool" || m.error) body.textContent = m.content; // never Markdown for these
  else body.innerHTML = renderMarkdown(m.content);
  div.append(who, body);
  if (m.tool_calls) { // what the model asked the memory, as text
    const calls = document.createElement("div");
    calls.className = "note calls";
    calls.textContent = "asked the memory: " +
      m.tool_calls.map((c) => c.function.name + "(" + c.function.arguments + ")").join(", ");
    div.append(calls);
  }
  if (m.note) {
    const note = document.createElement("div");
    note.className = "note";
    note.textContent = m.note;
    div.append(note);
  }
  return div;
}

function renderMessages() {
  el.messages.textContent = "";
  const msgs = current ? current.messages : [];
  if (!msgs.length) {
    const p = document.createElement("p");
    p.className = "empty";
    p.textContent = "Ask anything. Answers are generated on this machine.";
    el.messages.append(p);
  }
  msgs.forEach((m, i) => el.messages.append(messageNode(m, i)));
  el.messages.scrollTop = el.messages.scrollHeight;
  updateButtons();
}

function updateButtons() {
  const busy = inflight !== null;
  el.send.hidden = busy;
  el.stop.hidden = !busy;
  const msgs = current ? current.messages : [];
  el.regenerate.hidden = busy || !msgs.some((m) => m.role === "user");
}

// ---- banners and errors ----

function showBanner(text, retry) {
  el.bannerText.textContent = text;
  lastRetry = retry;
  el.bannerRetry.hidden = !retry;
  el.banner.hidden = false;
}
function hideBanner() { el.banner.hidden = true; }

function headers() {
  const h = { "Content-Type": "application/json" };
  if (apiKey) h["Authorization"] = "Bearer " + apiKey;
  return h;
}

// A message that says what happened and what to do, from a failed response.
async function describeHttpError(resp) {
  let detail = "";
  try {
    const j = await resp.json();
    detail = (j && j.error && (j.error.message || j.error)) || "";
  } catch (e) { /* not JSON: the status says enough */ }
  if (typeof detail !== "string") detail = JSON.stringify(detail);
  if (resp.status === 401) return "The server needs an API key (or the key is wrong). Enter it above.";
  if (resp.status === 429 || resp.status === 503)
    return "The server is busy (HTTP " + resp.status + "). Try again in a moment." + (detail ? " " + detail : "");
  return "The server answered HTTP " + resp.status + (detail ? ": " + detail : "") + ".";
}
const unreachable = "Cannot reach the hearth server at " + location.host + ". Is `hearth serve` still running?";

// ---- the model name ----

async function loadModel() {
  try {
    const resp = await fetch("/v1/models", { headers: headers() });
    if (resp.status === 401) { askForKey(); el.model.textContent = "model: (needs API key)"; return; }
    if (!resp.ok) { showBanner(await describeHttpError(resp), loadModel); return; }
    const j = await resp.json();
    const id = j && j.data && j.data[0] && j.data[0].id ? String(j.data[0].id) : "unknown";
    el.model.textContent = "model: " + id.replace(/\/+$/, "").split("/").pop();
    el.model.title = id;
    el.keyForm.hidden = true;
    hideBanner();
  } catch (e) {
    el.model.textContent = "model: (server unreachable)";
    showBanner(unreachable, loadModel);
  }
}

function askForKey() {
  el.keyForm.hidden = false;
  el.key.focus();
}

// ---- conversations ----

function openConversation(id, focusPrompt) {
  if (inflight) stopGeneration();
  current = conversations.find((c) => c.id === id) || null;
  save(STORE_CURRENT, current ? current.id : null);
  history.replaceState(null, "", current ? "#/chat/" + current.id : "#/chat");
  renderList();
  renderMessages();
  if (focusPrompt) el.prompt.focus();
}

function newConversation() {
  if (inflight) stopGeneration();
  current = null;
  save(STORE_CURRENT, null);
  history.replaceState(null, "", "#/chat");
  renderList();
  renderMessages();
  el.prompt.focus();
}

function deleteConversation(id) {
  conversations = conversations.filter((c) => c.id !== id);
  saveConversations();
  if (current && current.id === id) newConversation();
  else renderList();
  el.newChat.focus();
}

// ---- streaming ----

// Yields the JSON of each SSE `data:` event until [DONE].
async function* sseEvents(resp) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      yield JSON.parse(data);
    }
  }
}

function requestMessages(conv) {
  const out = [];
  if (settings.system.trim()) out.push({ role: "system", content: settings.system });
  for (const m of conv.messages) {
    if (m.error) continue;
    const r = { role: m.role, content: m.content };
    if (m.tool_calls) r.tool_calls = m.tool_calls;
    if (m.role === "tool") r.tool_call_id = m.tool_call_id;
    out.push(r);
  }
  return out;
}

function number(v, fallback) { const n = Number(v); return Number.isFinite(n) ? n : fallback; }

// Streams one model turn; a turn that calls memory tools runs them and streams the next
// (round counts those turns, at most MAX_TOOL_ROUNDS).
async function generate(round) {
  round = round || 0;
  const conv = current;
  const body = {
    messages: requestMessages(conv),
    stream: true,
    stream_options: { include_usage: true },
    temperature: number(settings.temperature, DEFAULT_SETTINGS.temperature),
    top_p: number(settings.top_p, DEFAULT_SETTINGS.top_p),
    max_tokens: Math.max(1, Math.round(number(settings.max_tokens, DEFAULT_SETTINGS.max_tokens))),
  };
  if (memoryTools && settings.memory && round < MAX_TOOL_ROUNDS) body.tools = memoryTools;
  const calls = []; // the turn's tool calls, assembled from their streamed pieces
  const answer = { role: "assistant", content: "" };
  conv.messages.push(answer);
  const controller = new AbortController();
  inflight = { controller, conv, answer };
  renderMessages();
  const node = el.messages.lastElementChild.querySelector(".body");
  el.messages.setAttribute("aria-busy", "true"); // screen readers read the answer once, when done
  el.status.textContent = "Generating the answer…";
  el.speed.textContent = "";
  let tokens = 0, firstAt = 0, lastPaint = 0, pending = false;
  const paint = () => {
    pending = false;
    node.innerHTML = renderMarkdown(answer.content);
    el.messages.scrollTop = el.messages.scrollHeight;
  };
  const showSpeed = (final) => {
    const secs = (performance.now() - firstAt) / 1000;
    if (tokens > 1 && secs > 0) el.speed.textContent = ((tokens - 1) / secs).toFixed(1) + " tok/s" + (final ? "" : " …");
  };
  let failure = null;
  try {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body), signal: controller.signal,
    });
    if (!resp.ok) {
      failure = await describeHttpError(resp);
      if (resp.status === 401) askForKey();
    } else {
      for await (const ev of sseEvents(resp)) {
        if (ev.error) { failure = "The server reported an error: " + (ev.error.message || JSON.stringify(ev.error)); break; }
        const choice = ev.choices && ev.choices[0];
        const piece = choice && choice.delta && typeof choice.delta.content === "string" ? choice.delta.content : "";
        if (piece) {
          // one chunk per token: the rate is counted from the first token, so prefill is left out
          if (!firstAt) firstAt = performance.now();
          tokens++;
          answer.content += piece;
          const now = performance.now();
          if (now - lastPaint > 250) { showSpeed(false); lastPaint = now; }
          if (!pending) { pending = true; requestAnimationFrame(paint); }
        }
        for (const tc of (choice && choice.delta && choice.delta.tool_calls) || []) {
          const i = typeof tc.index === "number" ? tc.index : calls.length;
          const c = calls[i] || (calls[i] = { id: "", type: "function", function: { name: "", arguments: "" } });
          if (tc.id) c.id = tc.id;
          if (tc.function && tc.function.name) c.function.name += tc.function.name;
          if (tc.function && tc.function.arguments) c.function.arguments += tc.function.arguments;
        }
        if (choice && choice.finish_reason === "length") answer.note = "(stopped at the max tokens limit)";
        if (ev.usage && ev.usage.completion_tokens) tokens = Math.max(tokens, ev.usage.completion_tokens);
      }
    }
  } catch (e) {
    if (e.name === "AbortError") answer.note = "(stopped)";
    else if (e instanceof SyntaxError) failure = "The server sent a malformed stream: " + e.message;
    else failure = unreachable;
  }
  showSpeed(true);
  if (failure) {
    if (!answer.content) conv.messages.pop();
    conv.messages.push({ role: "assistant", content: failure, error: true });
    showBanner(failure, failure === unreachable ? retryLast : null);
  } else {
    hideBanner();
  }
  const toolCalls = calls.filter((c) => c && c.function.name);
  if (!failure && !answer.note && toolCalls.length) {
    answer.tool_calls = toolCalls;
    for (const c of toolCalls) conv.messages.push(await runTool(c));
  }
  conv.updated = Date.now();
  inflight = null;
  saveConversations();
  if (answer.tool_calls && round + 1 <= MAX_TOOL_ROUNDS && current === conv) {
    renderMessages();
    return generate(round + 1);
  }
  el.messages.setAttribute("aria-busy", "false");
  el.status.textContent = failure ? failure : answer.note ? "Answer stopped." : "Answer complete.";
  if (current === conv) renderMessages();
  renderList();
}

// ---- memory (serve --memory): the tools the model may call, and the panel ----

async function callMemory(name, args) {
  const resp = await fetch("/v1/memory/tools/" + encodeURIComponent(name), {
    method: "POST", headers: headers(), body: JSON.stringify(args || {}),
  });
  const j = await resp.json().catch(() => null);
  if (!resp.ok) throw new Error((j && j.error && j.error.message) || "HTTP " + resp.status);
  return j;
}

// One tool call of the model, answered: the result (or the error, for the model to read)
// as a "tool" message.
async function runTool(call) {
  let content;
  try {
    const args = call.function.arguments.trim() ? JSON.parse(call.function.arguments) : {};
    content = JSON.stringify(await callMemory(call.function.name, args));
  } catch (e) {
    content = "error: " + e.message;
  }
  if (content.length > MAX_TOOL_RESULT) content = content.slice(0, MAX_TOOL_RESULT) + " …(cut)";
  return { role: "tool", tool_call_id: call.id, name: call.function.name, content };
}

async function loadMemory() {
  try {
    const resp = await fetch("/v1/memory/tools", { headers: headers() });
    if (!resp.ok) return; // no --memory: no panel, no tools
    const j = await resp.json();
    memoryTools = Array.isArray(j.data) ? j.data : null;
  } catch (e) {
    return;
  }
  if (!memoryTools) return;
  el.memory.hidden = false;
  for (const n of document.querySelectorAll(".memory-setting")) n.hidden = false;
  showArticles();
}

function memoryMessage(text) {
  el.memoryResults.textContent = "";
  const li = document.createElement("li");
  li.className = "empty";
  li.textContent = text;
  el.memoryResults.append(li);
}

// Result rows: a button per document (title, and the passage's text for a search hit).
function showResults(rows) {
  el.memoryResults.textContent = "";
  for (const r of rows) {
    const li = document.createElement("li");
    const b = document.createElement("button");
    b.type = "button";
    b.className = "open";
    b.textContent = r.title || r.path;
    b.title = r.path;
    if (r.text) {
      const snip = document.createElement("span");
      snip.className = "snippet";
      snip.textContent = r.text.replace(/\*[^*\n]*\*/g, "").trim().slice(0, 140);
      b.append(snip);
    }
    b.addEventListener("click", () => openMemoryDoc(r.path));
    li.append(b);
    el.memoryResults.append(li);
  }
}

async function searchMemory() {
  const q = el.memoryQuery.value.trim();
  if (!q) return showArticles();
  try {
    const hits = await callMemory("memory_search", { query: q, limit: 8 });
    if (!hits.length) return memoryMessage("Nothing in the memory matches.");
    showResults(hits);
  } catch (e) {
    memoryMessage("Search failed: " + e.message);
  }
}

async function showArticles() {
  try {
    const j = await callMemory("memory_list", { kind: "article" });
    const docs = Array.isArray(j) ? j : j.documents || [];
    if (!docs.length) return memoryMessage("No articles yet: run `hearth memory synthesize`.");
    showResults(docs);
  } catch (e) {
    memoryMessage("The memory could not be read: " + e.message);
  }
}

async function openMemoryDoc(path) {
  try {
    const doc = await callMemory("memory_read", { article: path });
    el.memoryViewTitle.textContent = doc.title || doc.path;
    el.memoryViewBody.innerHTML = renderMarkdown(doc.text.replace(/^---\n[\s\S]*?\n---\n/, ""));
    el.memoryView.hidden = false;
    el.memoryClose.focus();
  } catch (e) {
    memoryMessage("Could not open " + path + ": " + e.message);
  }
}

// What the last synthesis runs changed (GET /v1/memory/changes): per run its commit message,
// per file its added and removed lines; articles and Talk pages first, each openable.
const CHANGES_SHOWN = 3;
const KIND_ORDER = { article: 0, talk: 1 };

function node(tag, cls, text) {
  const n = document.createElement(tag);
  if (cls) n.className = cls;
  if (text !== undefined) n.textContent = text;
  return n;
}

function renderChange(c) {
  const sec = node("section", "change");
  sec.append(node("h3", null, c.message), node("p", "when", c.time.replace("T", " ").replace("Z", " UTC")));
  const files = [...c.files].sort((a, b) => (KIND_ORDER[a.kind] ?? 2) - (KIND_ORDER[b.kind] ?? 2));
  for (const f of files) {
    const d = node("details", "change-file");
    d.open = f.kind in KIND_ORDER;
    const sum = node("summary");
    sum.append(node("span", "path", f.path), node("span", "counts", " " + f.status + ", +" + f.added + " −" + f.removed));
    d.append(sum);
    if (f.status !== "deleted" && f.kind !== "meta") {
      const open = node("button", "open-changed", "Open");
      open.type = "button";
      open.addEventListener("click", () => openMemoryDoc(f.path));
      d.append(open);
    }
    const pre = node("pre", "diff");
    for (const l of f.lines) pre.append(node("span", l.op === "+" ? "add" : "del", l.op + " " + l.text));
    if (f.truncated) pre.append(node("span", "more", "…"));
    d.append(pre);
    sec.append(d);
  }
  return sec;
}

async function showChanges() {
  try {
    const resp = await fetch("/v1/memory/changes?limit=" + CHANGES_SHOWN, { headers: headers() });
    if (!resp.ok) return memoryMessage("What synthesis changed: " + (await describeHttpError(resp)));
    const runs = (await resp.json()).data || [];
    el.memoryViewTitle.textContent = "What synthesis changed";
    el.memoryViewBody.textContent = "";
    if (!runs.length) el.memoryViewBody.append(node("p", "empty", "No synthesis run has changed the memory yet."));
    for (const c of runs) el.memoryViewBody.append(renderChange(c));
    const log = node("button", "open-log", "The whole log");
    log.type = "button";
    log.addEventListener("click", () => openMemoryDoc("Meta/log.md"));
    el.memoryViewBody.append(log);
    el.memoryView.hidden = false;
    el.memoryClose.focus();
  } catch (e) {
    memoryMessage("What synthesis changed: " + unreachable);
  }
}

// A synthesis run by the served model, its progress streamed (GET /v1/memory/synthesize).
async function synthesizeMemory() {
  el.memorySynthesize.disabled = true;
  const say = (t) => { el.memoryProgress.textContent = t; };
  say("Synthesis: starting…");
  try {
    const resp = await fetch("/v1/memory/synthesize", { headers: headers() });
    if (!resp.ok) {
      say("Synthesis: " + (await describeHttpError(resp)));
    } else {
      for await (const ev of sseEvents(resp)) {
        if (ev.type === "plan") say("Synthesis: " + ev.segment + " new conversation(s) to read…");
        else if (ev.type === "progress") say("Synthesis: " + ev.stage + " " + ev.done + "…");
        else if (ev.type === "error") say("Synthesis failed: " + ev.message);
        else if (ev.type === "done")
          say(ev.committed ? "Synthesis done: " + ev.articles.length + " article(s) updated." : "Nothing new to synthesize.");
      }
    }
  } catch (e) {
    say("Synthesis: " + unreachable);
  }
  el.memorySynthesize.disabled = false;
  showArticles();
}

function send() {
  const text = el.prompt.value;
  if (!text.trim() || inflight) return;
  if (!current) {
    current = { id: newId(), created: Date.now(), updated: Date.now(), messages: [] };
    conversations.push(current);
    save(STORE_CURRENT, current.id);
    history.replaceState(null, "", "#/chat/" + current.id);
  }
  current.messages.push({ role: "user", content: text });
  el.prompt.value = "";
  saveConversations();
  renderList();
  generate();
}

function stopGeneration() {
  if (inflight) inflight.controller.abort(); // the server cancels the generation when the connection closes
}

// Drops the answers after the last user message (errors included) and asks again.
function regenerate() {
  if (inflight || !current) return;
  let last = current.messages.length - 1;
  while (last >= 0 && current.messages[last].role !== "user") last--;
  if (last < 0) return;
  current.messages.length = last + 1;
  saveConversations();
  generate();
}

function retryLast() {
  hideBanner();
  loadModel();
  if (current && current.messages.length && current.messages[current.messages.length - 1].error) regenerate();
}

// ---- settings ----

function showSettings() {
  el.system.value = settings.system;
  el.temperature.value = settings.temperature;
  el.topP.value = settings.top_p;
  el.maxTokens.value = settings.max_tokens;
  el.useMemory.checked = settings.memory !== false;
}
function readSettings() {
  settings = {
    system: el.system.value,
    temperature: number(el.temperature.value, DEFAULT_SETTINGS.temperature),
    top_p: number(el.topP.value, DEFAULT_SETTINGS.top_p),
    max_tokens: Math.max(1, Math.round(number(el.maxTokens.value, DEFAULT_SETTINGS.max_tokens))),
    memory: el.useMemory.checked,
  };
  save(STORE_SETTINGS, settings);
}

// ---- wiring ----

el.composer.addEventListener("submit", (e) => { e.preventDefault(); send(); });
el.prompt.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
});
document.addEventListener("keydown", (e) => { if (e.key === "Escape" && inflight) stopGeneration(); });
el.stop.addEventListener("click", () => { stopGeneration(); el.prompt.focus(); });
el.regenerate.addEventListener("click", regenerate);
el.newChat.addEventListener("click", newConversation);
el.bannerRetry.addEventListener("click", () => { if (lastRetry) lastRetry(); });
for (const input of [el.system, el.temperature, el.topP, el.maxTokens, el.useMemory])
  input.addEventListener("change", readSettings);
el.memorySearch.addEventListener("submit", (e) => { e.preventDefault(); searchMemory(); });
el.memoryArticles.addEventListener("click", () => { el.memoryQuery.value = ""; showArticles(); });
el.memoryChanges.addEventListener("click", showChanges);
el.memorySynthesize.addEventListener("click", synthesizeMemory);
el.memoryClose.addEventListener("click", () => { el.memoryView.hidden = true; el.memoryQuery.focus(); });
el.keyForm.addEventListener("submit", (e) => {
  e.preventDefault();
  apiKey = el.key.value.trim();
  save(STORE_KEY, apiKey);
  el.key.value = "";
  loadModel().then(() => el.prompt.focus());
});
window.addEventListener("hashchange", () => {
  const m = location.hash.match(/^#\/chat\/([\w-]+)$/);
  if (m && (!current || current.id !== m[1])) openConversation(m[1], false);
});

(function start() {
  showSettings();
  const m = location.hash.match(/^#\/chat\/([\w-]+)$/);
  const id = m ? m[1] : load(STORE_CURRENT, null);
  current = conversations.find((c) => c.id === id) || null;
  renderList();
  renderMessages();
  loadModel();
  loadMemory();
  el.prompt.focus();
})();
