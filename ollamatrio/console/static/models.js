// The Models, Devices and Fleet panels: what /api/ps says, the load progress the events
// told, and the memory per device of /metrics.

import { $, bytes, clock, fill, fullName, h } from "./dom.js";
import { byLabel } from "./prom.js";

// Each card stays the same element between refreshes, so a focused button keeps focus.
const cards = new Map();

function processor(row) {
  if (!row.size) return "–";
  const gpu = Math.round((100 * row.size_vram) / row.size);
  if (gpu <= 0) return "100% CPU";
  if (gpu >= 100) return "100% GPU";
  return `${100 - gpu}%/${gpu}% CPU/GPU`;
}

// {model: {device: {predicted, measured}}} from ollamatrio_memory_bytes.
export function memoryByModel(samples) {
  const out = {};
  for (const s of samples) {
    if (s.name !== "ollamatrio_memory_bytes") continue;
    const { model, device, kind } = s.labels;
    const devices = (out[model] ??= {});
    (devices[device === "cpu" ? "host" : device] ??= {})[kind] = s.value;
  }
  return out;
}

function memoryText(devices) {
  const parts = Object.entries(devices || {}).map(([device, m]) => {
    const measured = m.measured === undefined ? "not measured yet" : bytes(m.measured);
    return `${device}: ${measured} (predicted ${bytes(m.predicted)})`;
  });
  return parts.join("; ") || "–";
}

function keepAlive(row, now) {
  if (row.pinned) return "pinned";
  if (!row.expires_at) return "–";
  const at = Date.parse(row.expires_at);
  if (!Number.isFinite(at) || at - now > 1e11 || new Date(at).getFullYear() > 2200) return "forever";
  if (row.active || row.queued) return "busy";
  return `unloads in ${clock((at - now) / 1000)}`;
}

function field(dl, label) {
  const value = h("dd");
  dl.append(h("dt", { text: label }), value);
  return value;
}

function makeCard(key, actions) {
  const title = h("h3");
  const badge = h("span", { class: "badge" });
  const progress = h("progress", { max: 1, value: 0, hidden: true });
  const dl = h("dl");
  const fields = {
    processor: field(dl, "Processor"),
    memory: field(dl, "Memory"),
    context: field(dl, "Context"),
    slots: field(dl, "Slots"),
    keep: field(dl, "Keep alive"),
    cache: field(dl, "Prompt cache"),
  };
  const unload = h("button", { type: "button", class: "unload" }, "Unload");
  const pin = h("button", { type: "button" }, "Keep loaded");
  const li = h(
    "li",
    { class: "card model", "data-model": key },
    h("div", { class: "row" }, title, badge),
    progress,
    dl,
    h("div", { class: "row" }, unload, pin),
  );
  const card = { li, title, badge, progress, fields, unload, pin, row: null };
  unload.addEventListener("click", () => actions.unload(card.row));
  pin.addEventListener("click", () => actions.keepLoaded(card.row));
  return card;
}

export function renderModels(state, actions) {
  const list = $("models-list");
  const memory = memoryByModel(state.samples);
  const cacheLimits = byLabel(state.samples, "ollamatrio_prompt_cache_limit_bytes", "model");
  const rows = [...state.ps.models];
  // A load the events announced before /api/ps shows it.
  for (const [name, load] of state.loading) {
    if (!rows.some((r) => fullName(r.name) === name)) rows.push({ name, state: "loading", pending: load });
  }
  const seen = new Set();
  for (const row of rows) {
    const key = `${row.replica || ""}|${row.name}`;
    seen.add(key);
    let card = cards.get(key);
    if (!card) {
      card = makeCard(key, actions);
      cards.set(key, card);
      list.append(card.li);
    }
    card.row = row;
    card.title.textContent = row.replica ? `${row.name} on ${row.replica}` : row.name;
    card.badge.textContent = row.state || "ready";
    card.badge.className = `badge state-${row.state || "ready"}`;
    card.li.dataset.state = row.state || "ready";
    const load = state.loading.get(fullName(row.name));
    card.progress.hidden = !(row.state === "loading" && load);
    if (load && load.total) {
      card.progress.max = load.total;
      card.progress.value = load.completed;
      card.progress.setAttribute("aria-label", `${row.name} loading`);
    }
    const f = card.fields;
    f.processor.textContent = row.pending ? "–" : processor(row);
    const mem = memory[row.name];
    f.memory.textContent = mem
      ? memoryText(mem)
      : row.size
        ? `${bytes(row.size)} (${bytes(row.size_vram)} on GPUs)`
        : "–";
    f.context.textContent = row.context_length ? `${row.context_length} tokens` : "–";
    f.slots.textContent = row.pending
      ? "–"
      : `${row.active ?? 0} of ${row.slots ?? 1} busy, ${row.queued ?? 0} queued`;
    const most = cacheLimits[row.name];
    const held = row.prompt_cache ? bytes(row.prompt_cache) : "empty";
    f.cache.textContent = most ? `${held} (may grow to ${bytes(most)})` : held;
    card.unload.disabled = row.pending !== undefined || row.state === "unloading";
    card.pin.hidden = !!row.pinned;
    card.pin.disabled = card.unload.disabled;
  }
  for (const [key, card] of cards) {
    if (!seen.has(key)) {
      card.li.remove();
      cards.delete(key);
    }
  }
  $("models-empty").hidden = cards.size > 0;
  tickModels();
}

// Each second: only the countdowns change (no request is made for them).
export function tickModels() {
  const now = Date.now();
  for (const card of cards.values()) {
    if (card.row && !card.row.pending) card.fields.keep.textContent = keepAlive(card.row, now);
  }
}

export function renderDevices(state) {
  const container = $("devices-list");
  const devices = state.ps.devices || [];
  if (!devices.length) {
    const text = state.fleet
      ? "Each host of the fleet shows its own devices in its console."
      : "No device information.";
    fill(container, [h("p", { class: "empty", text })]);
    return;
  }
  const free = Object.fromEntries((state.ps.free_memory || []).map((r) => [r.device, r.free]));
  const memory = memoryByModel(state.samples);
  const models = state.ps.models.map((r) => r.name);
  fill(
    container,
    devices.map((device) => {
      const used = models
        .map((name, i) => {
          const m = memory[name]?.[device.device];
          let n = m ? m.measured ?? m.predicted : 0;
          if (!memory[name]) {
            const row = state.ps.models[i];
            n = device.device === "host" ? row.size - row.size_vram : devices.length === 2 ? row.size_vram : 0;
          }
          return { name, bytes: n || 0, index: i };
        })
        .filter((u) => u.bytes > 0);
      const modelBytes = used.reduce((sum, u) => sum + u.bytes, 0);
      const freeBytes = free[device.device] ?? 0;
      const other = Math.max(0, device.total - modelBytes - device.reserve - freeBytes);
      const parts = [
        ...used.map((u) => ({ label: u.name, bytes: u.bytes, class: `series-${u.index % 6}` })),
        { label: "reserve", bytes: device.reserve, class: "reserve" },
        { label: "other", bytes: other, class: "other" },
        { label: "free", bytes: freeBytes, class: "free" },
      ].filter((p) => p.bytes > 0);
      const bar = h("div", { class: "bar", "aria-hidden": "true" });
      for (const p of parts) {
        const segment = h("span", { class: `segment ${p.class}`, title: `${p.label}: ${bytes(p.bytes)}` });
        segment.style.flexGrow = String(p.bytes);
        bar.append(segment);
      }
      return h(
        "div",
        { class: "device", "data-device": device.device },
        h("h3", { text: `${device.name} (${device.device}), ${bytes(device.total)}` }),
        bar,
        h(
          "ul",
          { class: "legend" },
          parts.map((p) => h("li", { class: p.class, text: `${p.label}: ${bytes(p.bytes)}` })),
        ),
      );
    }),
  );
}

export function renderFleet(state) {
  $("fleet").hidden = !state.fleet;
  if (!state.fleet) return;
  fill(
    $("fleet-list"),
    state.hosts.map((host) => {
      const held = state.ps.models.filter((r) => r.replica === (host.replica || host.host));
      return h(
        "li",
        { class: "card", "data-host": host.host },
        h(
          "div",
          { class: "row" },
          h("h3", { text: host.replica && host.replica !== host.host ? `${host.replica} (${host.host})` : host.host }),
          h("span", { class: `badge ${host.up ? "state-ready" : "state-down"}`, text: host.up ? "up" : "down" }),
        ),
        h("p", { text: held.length ? held.map((r) => `${r.name} (${r.state})`).join(", ") : "no model loaded" }),
      );
    }),
  );
}
