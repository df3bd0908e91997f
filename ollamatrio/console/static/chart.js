// A small line chart in inline SVG: a few series over the last minutes, no library.

const NS = "http://www.w3.org/2000/svg";
const WIDTH = 320;
const HEIGHT = 120;
const PAD = { left: 36, right: 6, top: 8, bottom: 18 };

function svg(tag, attrs = {}, text) {
  const el = document.createElementNS(NS, tag);
  for (const [name, value] of Object.entries(attrs)) el.setAttribute(name, String(value));
  if (text !== undefined) el.textContent = text;
  return el;
}

function tidy(value) {
  if (value >= 100) return value.toFixed(0);
  if (value >= 10) return value.toFixed(1);
  return value.toPrecision(2);
}

// ``series``: [{name, points: [[seconds, value], ...]}]; ``span``: seconds shown, ending now.
export function lineChart(title, unit, series, span, now) {
  const figure = document.createElement("figure");
  figure.className = "chart";
  const caption = document.createElement("figcaption");
  caption.textContent = title;
  const highest = Math.max(0, ...series.flatMap((s) => s.points.map((p) => p[1])));
  const top = highest > 0 ? highest : 1;
  const plotW = WIDTH - PAD.left - PAD.right;
  const plotH = HEIGHT - PAD.top - PAD.bottom;
  const x = (t) => PAD.left + plotW * (1 - (now - t) / span);
  const y = (v) => PAD.top + plotH * (1 - v / top);
  const labels = series.map((s) => {
    const last = s.points.at(-1);
    return `${s.name}: ${last ? tidy(last[1]) : "–"} ${unit}`;
  });
  const chart = svg("svg", {
    viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
    role: "img",
    "aria-label": `${title}. ${labels.join("; ") || "no data yet"}`,
  });
  chart.append(
    svg("line", { class: "axis", x1: PAD.left, y1: PAD.top + plotH, x2: WIDTH - PAD.right, y2: PAD.top + plotH }),
    svg("line", { class: "axis", x1: PAD.left, y1: PAD.top, x2: PAD.left, y2: PAD.top + plotH }),
    svg("text", { class: "tick", x: PAD.left - 4, y: PAD.top + 8, "text-anchor": "end" }, tidy(top)),
    svg("text", { class: "tick", x: PAD.left - 4, y: PAD.top + plotH, "text-anchor": "end" }, "0"),
    svg("text", { class: "tick", x: PAD.left, y: HEIGHT - 4 }, `−${Math.round(span / 60)} min`),
    svg("text", { class: "tick", x: WIDTH - PAD.right, y: HEIGHT - 4, "text-anchor": "end" }, "now"),
  );
  series.forEach((s, i) => {
    const shown = s.points.filter((p) => now - p[0] <= span);
    if (!shown.length) return;
    const points = shown.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ");
    chart.append(svg("polyline", { class: `line series-${i % 6}`, points }));
  });
  const legend = document.createElement("ul");
  legend.className = "legend";
  series.forEach((s, i) => {
    const item = document.createElement("li");
    item.className = `series-${i % 6}`;
    item.textContent = labels[i];
    legend.append(item);
  });
  figure.append(caption, chart, legend);
  return figure;
}
