// The training view (/train): lists GET /v1/train/runs (the server's --train-dir) and
// follows the chosen run with GET /v1/train/runs/{id}?from=N every two seconds, keeping
// every record it has seen: the numbers are the latest training and validation records
// (the final record once the run ends), the chart their losses by step. Records are the
// ones `hearth train` writes to metrics.jsonl (docs/cli.md). The API key, when the chat page
// stored one, goes along. Text from the server is set as text, never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const POLL_MS = 2000;
const W = 640, H = 300, PAD_L = 48, PAD_R = 12, PAD_T = 12, PAD_B = 28;
let runs = [], current = null, records = [], next = 0, timer = null;

function headers() {
  const h = {};
  let key = "";
  try { key = JSON.parse(localStorage.getItem("hearth.apiKey") || '""'); } catch (e) { key = ""; }
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

async function getJSON(url) {
  const r = await fetch(url, { headers: headers() });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error((body.error && body.error.message) || ("HTTP " + r.status));
  return body;
}

function status(text, error) {
  const s = $("status");
  s.textContent = text;
  s.classList.toggle("error", !!error);
}

const fmt = (v, digits) => (typeof v === "number" && isFinite(v) ? v.toFixed(digits) : "-");
function duration(s) {
  if (typeof s !== "number" || !isFinite(s) || s < 0) return "-";
  s = Math.round(s);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  return (h ? h + "h " : "") + (h || m ? m + "m " : "") + sec + "s";
}

function renderRuns(list) {
  const ul = $("runs");
  ul.replaceChildren();
  for (const r of list) {
    const li = document.createElement("li"), b = document.createElement("button"), meta = document.createElement("span");
    b.type = "button";
    b.dataset.id = r.id;
    b.textContent = r.id;
    meta.className = "meta";
    meta.textContent = r.status + (typeof r.step === "number" ? " \u00b7 step " + r.step + (r.iters ? "/" + r.iters : "") : "") +
      (typeof r.loss === "number" ? " \u00b7 loss " + r.loss.toFixed(3) : "");
    b.appendChild(meta);
    b.setAttribute("aria-current", String(r.id === current));
    b.addEventListener("click", () => choose(r.id));
    li.appendChild(b);
    ul.appendChild(li);
  }
}

async function loadRuns() {
  try {
    const body = await getJSON("/v1/train/runs");
    runs = body.data || [];
    const empty = $("runs-empty");
    empty.hidden = runs.length > 0;
    empty.textContent = body.train_dir === null
      ? "No training folder: start the server with --train-dir DIR (a hearth train --adapter-path folder, or a folder of them)."
      : "No runs yet in " + body.train_dir + " (a run appears once it writes metrics.jsonl).";
    if (!current && runs.length) current = runs[0].id;
    renderRuns(runs);
  } catch (e) {
    $("runs-empty").hidden = false;
    $("runs-empty").textContent = "Could not list the runs: " + e.message;
  }
}

function choose(id) {
  current = id, records = [], next = 0;
  renderRuns(runs);
  poll();
}

// The run's state from its records: the last training record, the last validation one, the final one.
function state() {
  let train = null, val = null, done = null;
  for (const r of records) {
    if (r.done === true) done = r;
    else if (typeof r.val_loss === "number") val = r;
    else if (typeof r.loss === "number") train = r;
  }
  return { train, val, done };
}

function render() {
  const { train, val, done } = state();
  const last = done || records[records.length - 1] || {}; // the latest record of either kind
  const step = last.step, iters = last.iters || (train && train.iters) || (val && val.iters);
  const elapsed = last.elapsed;
  $("run-title").textContent = current || "No run chosen";
  $("v-step").textContent = typeof step === "number" ? step + (iters ? " / " + iters : "") : "-";
  $("v-loss").textContent = train ? fmt(train.loss, 4) + " (step " + train.step + ")" : "-";
  $("v-val").textContent = val ? fmt(val.val_loss, 4) + " (step " + val.step + ")" : "-";
  $("v-tps").textContent = train ? fmt(train.tokens_per_second, 1) : "-";
  $("v-lr").textContent = train && typeof train.learning_rate === "number" ? train.learning_rate.toExponential(2) : "-";
  const mem = done && typeof done.peak_memory_gb === "number" ? done.peak_memory_gb : train && train.peak_memory_gb;
  $("v-mem").textContent = typeof mem === "number" ? mem.toFixed(2) + " GB" : "-";
  $("v-elapsed").textContent = duration(elapsed);
  const eta = !done && step > 0 && iters > step && typeof elapsed === "number" ? elapsed / step * (iters - step) : done ? 0 : null;
  $("v-eta").textContent = done ? "finished" : duration(eta);
  $("bar").style.width = (iters ? Math.min(100, 100 * (step || 0) / iters) : 0) + "%";
  if (done) status(done.error ? "The run failed: " + done.error : "The run finished.", !!done.error);
  else if (records.length) status("Running: following metrics.jsonl.");
  chart();
}

function chart() {
  const loss = records.filter((r) => r.done !== true && typeof r.loss === "number").map((r) => [r.step, r.loss]);
  const val = records.filter((r) => typeof r.val_loss === "number").map((r) => [r.step, r.val_loss]);
  const all = loss.concat(val);
  const axes = $("axes");
  axes.replaceChildren();
  if (!all.length) {
    $("line-loss").setAttribute("points", "");
    $("line-val").setAttribute("points", "");
    return;
  }
  let x0 = Math.min(...all.map((p) => p[0])), x1 = Math.max(...all.map((p) => p[0]));
  let y0 = Math.min(...all.map((p) => p[1])), y1 = Math.max(...all.map((p) => p[1]));
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
  const px = (x) => PAD_L + (x - x0) / (x1 - x0) * (W - PAD_L - PAD_R);
  const py = (y) => PAD_T + (y1 - y) / (y1 - y0) * (H - PAD_T - PAD_B);
  const pts = (a) => a.map((p) => px(p[0]).toFixed(1) + "," + py(p[1]).toFixed(1)).join(" ");
  $("line-loss").setAttribute("points", pts(loss));
  $("line-val").setAttribute("points", pts(val));
  const ns = "http://www.w3.org/2000/svg";
  const line = (xa, ya, xb, yb) => {
    const l = document.createElementNS(ns, "line");
    l.setAttribute("x1", xa); l.setAttribute("y1", ya); l.setAttribute("x2", xb); l.setAttribute("y2", yb);
    l.setAttribute("class", "axis");
    axes.appendChild(l);
  };
  const label = (x, y, text, anchor) => {
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", x); t.setAttribute("y", y); t.setAttribute("text-anchor", anchor);
    t.textContent = text;
    axes.appendChild(t);
  };
  for (const p of val) { // a dot each, so that a single validation report shows too
    const c = document.createElementNS(ns, "circle");
    c.setAttribute("cx", px(p[0]).toFixed(1)); c.setAttribute("cy", py(p[1]).toFixed(1)); c.setAttribute("r", "3.5");
    c.setAttribute("class", "val-dot");
    axes.appendChild(c);
  }
  line(PAD_L, H - PAD_B, W - PAD_R, H - PAD_B);
  line(PAD_L, PAD_T, PAD_L, H - PAD_B);
  label(PAD_L - 4, py(y1) + 4, y1.toFixed(2), "end");
  label(PAD_L - 4, py(y0) + 4, y0.toFixed(2), "end");
  label(px(x0), H - 8, "step " + x0, "start");
  label(px(x1), H - 8, "step " + x1, "end");
}

async function poll() {
  clearTimeout(timer);
  if (current) {
    const id = current;
    try {
      const body = await getJSON("/v1/train/runs/" + encodeURIComponent(id) + "?from=" + next);
      if (id === current) {
        if (body.restarted) records = [];
        records = records.concat(body.records || []);
        next = body.next;
        render();
      }
    } catch (e) {
      status("Could not read the run: " + e.message, true);
    }
  }
  await loadRuns();
  timer = setTimeout(poll, POLL_MS);
}

loadRuns().then(poll);
