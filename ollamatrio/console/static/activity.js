// The Activity panel: loads in progress and the scheduler's events (/api/events), and the
// charts of tokens per second and time to first token (/metrics, read every few seconds).

import { lineChart } from "./chart.js";
import { $, fill, fullName, h } from "./dom.js";
import { byLabel } from "./prom.js";

const KEPT_EVENTS = 50;
export const CHART_SPAN = 600; // seconds of history the charts show

const WORDS = {
  queued: (e) => `queued${e.queued ? ` (${e.queued} waiting)` : ""}`,
  loading: () => "loading",
  loaded: (e) => `ready${e.seconds !== undefined ? ` after ${e.seconds.toFixed(1)} s` : ""}`,
  load_failed: (e) => `load failed: ${e.reason || "error"}`,
  evicting: (e) => `evicting: ${e.reason || ""}`,
  expired: () => "keep-alive expired",
  crashed: () => "crashed",
  unloaded: () => "unloaded",
};

// What one event changes in the state: the load progress; and the line it adds to the log
// (a load's progress is shown by its bar, not one line per step).
export function applyEvent(state, kind, event) {
  const name = fullName(event.model);
  if (kind === "loading") {
    const known = state.loading.has(name);
    const seen = Date.now() / 1000;
    state.loading.set(name, { completed: event.completed || 0, total: event.total || 0, seen });
    if (known) return;
  } else if (["loaded", "load_failed", "unloaded", "crashed"].includes(kind)) {
    state.loading.delete(name);
  }
  const log = $("events");
  const time = new Date((event.at || Date.now() / 1000) * 1000).toLocaleTimeString();
  const words = (WORDS[kind] || (() => kind))(event);
  const where = event.host ? ` on ${event.host}` : "";
  const bad = ["crashed", "load_failed"].includes(kind);
  log.prepend(
    h(
      "li",
      { class: bad ? "bad" : "", "data-kind": kind },
      h("time", { text: time }),
      " ",
      h("strong", { text: event.model }),
      ` ${words}${where}`,
    ),
  );
  while (log.children.length > KEPT_EVENTS) log.lastElementChild.remove();
}

export function renderLoads(state) {
  fill(
    $("loads"),
    [...state.loading].map(([name, load]) => {
      const percent = load.total ? Math.round((100 * load.completed) / load.total) : 0;
      return h(
        "div",
        { class: "load" },
        h("label", { text: `${name}: loading ${percent}%` }),
        h("progress", { max: load.total || 1, value: load.completed, "aria-label": `${name} loading` }),
      );
    }),
  );
}

// One point per model for each chart (tokens/s; mean time to first token) from the
// counters' growth since the previous reading.
export function recordMetrics(history, samples, now) {
  const tokens = byLabel(samples, "ollamatrio_tokens_generated_total", "model");
  const ttftSum = byLabel(samples, "ollamatrio_time_to_first_token_seconds_sum", "model");
  const ttftCount = byLabel(samples, "ollamatrio_time_to_first_token_seconds_count", "model");
  const last = history.last;
  if (last) {
    const dt = now - last.now;
    for (const [model, count] of Object.entries(tokens)) {
      const grown = count - (last.tokens[model] ?? count);
      append(history.tokens, model, [now, Math.max(0, grown) / dt]);
    }
    for (const [model, count] of Object.entries(ttftCount)) {
      const served = count - (last.ttftCount[model] ?? 0);
      const waited = (ttftSum[model] ?? 0) - (last.ttftSum[model] ?? 0);
      // A reading with no first token leaves a gap rather than a false zero.
      if (served > 0) append(history.ttft, model, [now, waited / served]);
    }
  }
  history.last = { now, tokens, ttftSum, ttftCount };
  for (const points of [...history.tokens.values(), ...history.ttft.values()]) {
    while (points.length && now - points[0][0] > CHART_SPAN) points.shift();
  }
}

function append(series, model, point) {
  const points = series.get(model) || [];
  points.push(point);
  series.set(model, points);
}

export function renderCharts(history, now, allowed) {
  if (!allowed) {
    fill($("charts"), [h("p", { class: "empty", text: "The charts need a key with the metrics scope." })]);
    return;
  }
  const series = (map) => [...map].map(([name, points]) => ({ name, points }));
  fill($("charts"), [
    lineChart("Tokens per second", "tokens/s", series(history.tokens), CHART_SPAN, now),
    lineChart("Time to first token (mean)", "s", series(history.ttft), CHART_SPAN, now),
  ]);
}
