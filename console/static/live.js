// The Live page: fetches /live.json every second and draws, per domain, the
// admitted and denied items per second as SVG lines, with each rule's
// denials below. Plain JavaScript, nothing loaded from elsewhere.
"use strict";
const NS = "http://www.w3.org/2000/svg";
const W = 900, H = 120;

function el(name, attrs, parent) {
  const e = document.createElementNS(NS, name);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (parent) parent.appendChild(e);
  return e;
}

function line(svg, values, top, cls) {
  const pts = values.map((v, i) => (W * i / Math.max(values.length - 1, 1)).toFixed(1) + "," + (H - H * v / top).toFixed(1));
  el("polyline", {points: pts.join(" "), class: cls}, svg);
}

function draw(data) {
  const root = document.getElementById("live");
  const status = document.getElementById("live-status");
  root.textContent = "";
  if (data.error) status.textContent = data.error;
  const domains = data.series.filter(s => !s.rule);
  if (domains.length === 0) {
    if (!data.error) status.textContent = "waiting for the first samples…";
    return;
  }
  const n = domains[0].denied.length;
  status.textContent = n + " seconds since " + new Date(data.start_ms).toISOString() + "; the newest second on the right";
  for (const d of domains) {
    const rules = data.series.filter(s => s.rule && s.domain === d.domain);
    const top = Math.max(1, ...d.admitted, ...d.denied);
    const box = document.createElement("section");
    box.className = "live";
    box.id = "live-" + d.domain;
    const last = a => a.length ? a[a.length - 1] : 0;
    const h = document.createElement("h2");
    h.textContent = d.domain + ": " + last(d.admitted).toFixed(0) + " admitted/s, " + last(d.denied).toFixed(0) + " denied/s (peak " + top.toFixed(0) + "/s)";
    box.appendChild(h);
    const svg = el("svg", {viewBox: "0 0 " + W + " " + H, width: W, height: H, class: "live"}, box);
    line(svg, d.admitted, top, "admitted");
    line(svg, d.denied, top, "denied");
    if (rules.length) {
      const t = document.createElement("table");
      t.className = "grid";
      t.innerHTML = "<tr><th>rule</th><th>denied/s now</th><th>denied in the window</th></tr>";
      for (const r of rules) {
        const tr = document.createElement("tr");
        const sum = r.denied.reduce((a, b) => a + b, 0);
        for (const v of [r.rule, last(r.denied).toFixed(0), sum.toFixed(0)]) {
          const td = document.createElement("td");
          td.textContent = v;
          tr.appendChild(td);
        }
        t.appendChild(tr);
      }
      box.appendChild(t);
    }
    root.appendChild(box);
  }
}

async function tick() {
  try {
    const r = await fetch("/live.json", {cache: "no-store"});
    draw(await r.json());
  } catch (e) {
    document.getElementById("live-status").textContent = "the node did not answer: " + e;
  }
}
tick();
setInterval(tick, 1000);
