// The curve designer (/curves): edits a monotone transfer curve in log-probability space,
// draws it with the PCHIP interpolation the server uses (docs/lab.md), the next-token
// histogram from POST /signal under it, and samples from POST /generate. Talks only to
// this server; the API key, when the chat page stored one, goes along.
"use strict";

const $ = (id) => document.getElementById(id);
const LO = Math.log(1e-6); // the plot spans probabilities 1e-6 .. 1 on both axes (nats)
const PAD = 40;
const IDENTITY = [1e-4, 1e-2, 1, 10, 100];
const canvas = $("plot"), ctx = canvas.getContext("2d");
let points = IDENTITY.map((p) => ({ x_pct: p, y_pct: p }));
let bins = null, drag = -1;

function headers() {
  const h = { "Content-Type": "application/json" };
  let key = "";
  try { key = JSON.parse(localStorage.getItem("hearth.apiKey") || '""'); } catch (e) { key = ""; }
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

const nats = (pct) => Math.log(Math.max(pct, 1e-9) / 100);
const pct = (l) => Math.exp(l) * 100;

// PCHIP through the points (nats), as the server's sampler_lab.c evaluates it.
function curveFn(pts) {
  const X = pts.map((p) => nats(p.x_pct)), Y = pts.map((p) => nats(p.y_pct)), n = X.length;
  const h = [], d = [], m = new Array(n);
  for (let i = 0; i + 1 < n; i++) { h[i] = X[i + 1] - X[i]; d[i] = (Y[i + 1] - Y[i]) / h[i]; }
  m[0] = d[0]; m[n - 1] = d[n - 2];
  for (let i = 1; i + 1 < n; i++) {
    if (d[i - 1] * d[i] <= 0) { m[i] = 0; continue; }
    const w1 = 2 * h[i] + h[i - 1], w2 = h[i] + 2 * h[i - 1];
    m[i] = (w1 + w2) / (w1 / d[i - 1] + w2 / d[i]);
  }
  return (l) => {
    if (l <= X[0]) return Y[0] + Math.max(m[0], 1) * (l - X[0]);
    if (l >= X[n - 1]) return Y[n - 1] + m[n - 1] * (l - X[n - 1]);
    let k = 0;
    while (X[k + 1] <= l) k++;
    const hh = X[k + 1] - X[k], t = (l - X[k]) / hh, t2 = t * t, t3 = t2 * t;
    return (2 * t3 - 3 * t2 + 1) * Y[k] + (t3 - 2 * t2 + t) * hh * m[k] + (-2 * t3 + 3 * t2) * Y[k + 1] +
      (t3 - t2) * hh * m[k + 1];
  };
}

function size() { return canvas.width - 2 * PAD; }
function toPx(lx, ly) {
  const s = size();
  return [PAD + (lx - LO) / -LO * s, PAD + s - (ly - LO) / -LO * s];
}
function fromPx(px, py) {
  const s = size();
  const lx = LO + (px - PAD) / s * -LO, ly = LO + (PAD + s - py) / s * -LO;
  return [Math.min(0, Math.max(LO, lx)), Math.min(0, Math.max(LO, ly))];
}

function color(name) { return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || "#888"; }

function draw() {
  const s = size();
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  ctx.strokeStyle = color("--line");
  ctx.fillStyle = color("--muted");
  ctx.font = "11px system-ui, sans-serif";
  for (let e = -6; e <= 0; e++) { // decades of probability
    const [x, y] = toPx(e * Math.LN10, e * Math.LN10);
    ctx.beginPath(); ctx.moveTo(x, PAD); ctx.lineTo(x, PAD + s); ctx.moveTo(PAD, y); ctx.lineTo(PAD + s, y); ctx.stroke();
    ctx.fillText("1e" + e, x - 10, PAD + s + 14);
    ctx.fillText("1e" + e, 4, y + 4);
  }
  if (bins) { // histogram under the curve, heights on a log scale
    const top = Math.log1p(Math.max(...bins));
    ctx.fillStyle = "rgba(128,128,128,0.35)";
    bins.forEach((c, i) => {
      if (!c) return;
      const hgt = Math.log1p(c) / top * s * 0.5, w = s / bins.length;
      ctx.fillRect(PAD + i * w, PAD + s - hgt, w - 1, hgt);
    });
  }
  ctx.setLineDash([4, 4]); ctx.strokeStyle = color("--muted"); // the identity (temperature 1)
  ctx.beginPath(); ctx.moveTo(...toPx(LO, LO)); ctx.lineTo(...toPx(0, 0)); ctx.stroke(); ctx.setLineDash([]);
  const f = curveFn(points);
  ctx.strokeStyle = color("--accent"); ctx.lineWidth = 2; ctx.beginPath();
  for (let i = 0; i <= 200; i++) {
    const l = LO + (i / 200) * -LO, [x, y] = toPx(l, Math.max(LO - 2, Math.min(1, f(l))));
    if (i) ctx.lineTo(x, y); else ctx.moveTo(x, y);
  }
  ctx.stroke(); ctx.lineWidth = 1;
  ctx.fillStyle = color("--accent");
  for (const p of points) {
    const [x, y] = toPx(nats(p.x_pct), nats(p.y_pct));
    ctx.beginPath(); ctx.arc(x, y, 6, 0, 2 * Math.PI); ctx.fill();
  }
  $("curve-json").value = JSON.stringify(curveJson(), null, 1);
}

function curveJson() {
  const r = (v) => Number(v.toPrecision(6));
  return { space: "logprob", points: points.map((p) => ({ x_pct: r(p.x_pct), y_pct: r(p.y_pct) })) };
}

function eventPx(ev) {
  const b = canvas.getBoundingClientRect();
  return [(ev.clientX - b.left) * canvas.width / b.width, (ev.clientY - b.top) * canvas.height / b.height];
}
function nearest(px, py) {
  let best = -1, bd = 12 * 12;
  points.forEach((p, i) => {
    const [x, y] = toPx(nats(p.x_pct), nats(p.y_pct)), dd = (x - px) ** 2 + (y - py) ** 2;
    if (dd < bd) { bd = dd; best = i; }
  });
  return best;
}

// Moves point i to (lx, ly) nats, kept between its neighbours so the curve never falls.
function place(i, lx, ly) {
  const prev = points[i - 1], next = points[i + 1], eps = 1e-3;
  if (prev) { lx = Math.max(lx, nats(prev.x_pct) + eps); ly = Math.max(ly, nats(prev.y_pct)); }
  if (next) { lx = Math.min(lx, nats(next.x_pct) - eps); ly = Math.min(ly, nats(next.y_pct)); }
  points[i] = { x_pct: pct(lx), y_pct: pct(ly) };
}

canvas.addEventListener("pointerdown", (ev) => {
  const [px, py] = eventPx(ev);
  drag = nearest(px, py);
  if (drag < 0) { // a new point on the click's x, on the curve's side of monotone
    const [lx, ly] = fromPx(px, py);
    let i = points.findIndex((p) => nats(p.x_pct) > lx);
    if (i < 0) i = points.length;
    if (points.length >= 32 || (points[i - 1] && nats(points[i - 1].x_pct) === lx)) return;
    points.splice(i, 0, { x_pct: pct(lx), y_pct: pct(ly) });
    place(i, lx, ly);
    drag = i;
  }
  canvas.setPointerCapture(ev.pointerId);
  draw();
});
canvas.addEventListener("pointermove", (ev) => {
  if (drag < 0) return;
  const [lx, ly] = fromPx(...eventPx(ev));
  place(drag, lx, ly);
  draw();
});
canvas.addEventListener("pointerup", () => { drag = -1; });
canvas.addEventListener("dblclick", (ev) => {
  const i = nearest(...eventPx(ev));
  if (i >= 0 && points.length > 2) { points.splice(i, 1); draw(); }
});

function scaled(k) { // y = k * x: k > 1 sharpens like a lower temperature, k < 1 flattens
  points = IDENTITY.map((p) => ({ x_pct: p, y_pct: pct(Math.max(LO, k * nats(p))) }));
  draw();
}
$("reset").addEventListener("click", () => scaled(1));
$("sharpen").addEventListener("click", () => scaled(1.5));
$("flatten").addEventListener("click", () => scaled(0.7));

function status(text, error) {
  $("status").textContent = text;
  $("status").classList.toggle("error", !!error);
}

async function post(path, body) {
  const resp = await fetch(path, { method: "POST", headers: headers(), body: JSON.stringify(body) });
  const data = await resp.json().catch(() => ({}));
  if (!resp.ok) throw new Error((data.error && data.error.message) || "HTTP " + resp.status);
  return data;
}

$("measure").addEventListener("click", async () => {
  status("measuring…");
  try {
    const r = await post("/signal", { prompt: $("prompt").value });
    bins = r.bins;
    status("histogram of " + r.vocab + " tokens");
    draw();
  } catch (e) { status(e.message, true); }
});

async function generate(useDefault) {
  const buttons = [$("generate"), $("generate-default")];
  buttons.forEach((b) => { b.disabled = true; });
  status("generating…");
  const body = { prompt: $("prompt").value, n: Number($("n").value), max_tokens: Number($("max-tokens").value),
                 seed: Number($("seed").value) };
  if (useDefault) body.default = true; else body.curve = curveJson();
  try {
    const t0 = performance.now(), r = await post("/generate", body);
    $("mode").textContent = r.mode === "default"
      ? `default recipe: temperature ${r.recipe.temperature}, top_p ${r.recipe.top_p}, top_k ${r.recipe.top_k}`
      : "curve";
    const list = $("samples");
    list.textContent = "";
    for (const s of r.samples) {
      const li = document.createElement("li");
      li.textContent = s.text; // model text is text, never HTML
      if (s.junk) li.classList.add("junk");
      list.appendChild(li);
    }
    status(`${r.n} samples (seed ${r.seed}) in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  } catch (e) { status(e.message, true); }
  buttons.forEach((b) => { b.disabled = false; });
}
$("generate").addEventListener("click", () => generate(false));
$("generate-default").addEventListener("click", () => generate(true));
$("copy").addEventListener("click", async () => {
  try { await navigator.clipboard.writeText($("curve-json").value); status("curve JSON copied"); }
  catch (e) { $("curve-json").select(); status("select and copy the JSON (clipboard not available)"); }
});

draw();
