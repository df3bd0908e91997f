// The console: what the server is doing, live.  The scheduler's events (/api/events) say
// when something changed, and /api/ps is read again then (at most once a second) and every
// few seconds besides; /metrics feeds the charts and the memory per device.

import { recordMetrics, renderCharts, renderLoads, applyEvent } from "./activity.js";
import * as api from "./api.js";
import { $, fullName } from "./dom.js";
import { renderDevices, renderFleet, renderModels, tickModels } from "./models.js";
import { setUpPlayground } from "./playground.js";
import { parseMetrics } from "./prom.js";
import { fillModelChoice, pull, renderStore } from "./store.js";

const PS_EVERY = 5000; // ms between readings of /api/ps when nothing happens
const METRICS_EVERY = 5000; // ms between readings of /metrics
const MIN_GAP = 1000; // never ask the same thing more often than this
const RECONNECT = 2000; // ms before the event stream is opened again

const state = {
  ps: { models: [], free_memory: [], devices: [] },
  loading: new Map(), // full model name -> {completed, total}: loads the events announced
  samples: [], // the last /metrics reading
  history: { tokens: new Map(), ttft: new Map(), last: null },
  tags: [],
  scopes: { admin: false, metrics: false },
  fleet: false,
  hosts: [],
  live: false, // the event stream is open
};

function showLink(text, kind) {
  $("link").textContent = text;
  $("link").className = `link ${kind}`;
}

function report(error) {
  showLink(`error: ${error.message || error}`, "error");
}

// ``fn`` at most once per MIN_GAP, however often it is asked for: asks coalesce, and one
// made while ``fn`` runs gets one more run after it (the answer may predate the change).
function throttled(fn) {
  let last = 0;
  let timer = null;
  let running = false;
  let again = false;
  const run = async () => {
    timer = null;
    running = true;
    last = Date.now();
    try {
      await fn();
    } catch (error) {
      report(error);
    } finally {
      running = false;
      if (again) {
        again = false;
        schedule();
      }
    }
  };
  const schedule = () => {
    if (running) again = true;
    else if (timer === null) timer = setTimeout(run, Math.max(0, last + MIN_GAP - Date.now()));
  };
  return schedule;
}

function renderAll() {
  renderModels(state, actions);
  renderDevices(state);
  renderFleet(state);
  renderLoads(state);
}

const STALE_LOAD = 10; // seconds a load the events announced may go unseen in /api/ps

async function readPs() {
  state.ps = await api.json("/api/ps");
  // A load is shown from its first event until /api/ps shows it loaded, or it was missed
  // (an event stream that reconnected lost its end).
  const now = Date.now() / 1000;
  for (const [name, load] of state.loading) {
    const row = state.ps.models.find((r) => fullName(r.name) === name);
    if (row ? row.state !== "loading" : now - load.seen > STALE_LOAD) state.loading.delete(name);
  }
  if (state.live) showLink("live", "live"); // past an error the last reading reported
  renderAll();
}

async function readMetrics() {
  if (!state.scopes.metrics) return;
  const now = Date.now() / 1000;
  state.samples = parseMetrics(await api.text("/metrics"));
  const hosts = state.samples.filter((s) => s.name === "ollamatrio_fleet_host");
  state.fleet = state.samples.some((s) => s.name === "ollamatrio_fleet_hosts_up");
  state.hosts = hosts.map((s) => ({ ...s.labels, up: s.value === 1 }));
  recordMetrics(state.history, state.samples, now);
  renderCharts(state.history, now, true);
  renderAll();
}

async function readTags() {
  state.tags = (await api.json("/api/tags")).models;
  renderStore(state, actions);
  fillModelChoice(state);
}

const schedulePs = throttled(readPs);
const scheduleMetrics = throttled(readMetrics);

// An empty generate only loads, unloads (0) or changes how long the model stays (-1: always).
async function keepAlive(model, keep) {
  try {
    await api.json("/api/generate", { method: "POST", body: { model, keep_alive: keep } });
  } catch (error) {
    report(error);
  }
  schedulePs();
}

const actions = {
  report,
  unload(row) {
    return keepAlive(row.name, 0);
  },
  keepLoaded(row) {
    return keepAlive(row.name, -1);
  },
  async preload(name, caps) {
    const embedding = caps.split(" ").includes("embedding") && !caps.split(" ").includes("completion");
    const [path, body] = embedding ? ["/api/embed", { model: name, input: [] }] : ["/api/generate", { model: name }];
    try {
      await api.json(path, { method: "POST", body });
    } catch (error) {
      report(error);
    }
    schedulePs();
  },
  async remove(name) {
    await api.json("/api/delete", { method: "DELETE", body: { model: name } });
    await readTags();
  },
  capabilitiesKnown() {
    fillModelChoice(state);
  },
};

async function followEvents() {
  const opened = () => {
    state.live = true;
    showLink("live", "live");
  };
  for (;;) {
    try {
      for await (const { event, data } of api.events(opened)) {
        applyEvent(state, event, data);
        renderLoads(state);
        renderModels(state, actions);
        schedulePs();
        if (event === "loaded" || event === "unloaded") scheduleMetrics();
      }
    } catch (error) {
      if (error instanceof api.Unauthorized) return;
      // the server went away or restarts: try again below
    }
    state.live = false;
    showLink("reconnecting…", "");
    await new Promise((resolve) => setTimeout(resolve, RECONNECT));
    schedulePs();
  }
}

// The key dialog; resolves once it is closed (the key given is kept, if one was).
function keyDialog(message) {
  const dialog = $("key-dialog");
  $("key-error").textContent = message;
  $("key-button").hidden = false;
  return new Promise((resolve) => {
    dialog.addEventListener(
      "close",
      () => {
        const given = dialog.returnValue === "save";
        if (given) api.setKey($("key-input").value.trim());
        $("key-input").value = "";
        resolve(given);
      },
      { once: true },
    );
    if (!dialog.open) {
      dialog.returnValue = "";
      dialog.showModal();
    }
  });
}

function setUpKey() {
  api.onUnauthorized(keyDialog); // asked when a call is answered 401
  if (api.storedKey()) $("key-button").hidden = false;
  // Another key may hold other scopes: the page starts again with it.
  $("key-button").addEventListener("click", async () => {
    if (await keyDialog("")) location.reload();
  });
  $("key-forget").addEventListener("click", () => {
    api.setKey(null);
    $("key-dialog").close("forget");
    location.reload();
  });
}

function setUpPull() {
  $("pull-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const name = $("pull-name").value.trim();
    if (!name) return;
    $("pull-name").value = "";
    pull(name, $("pull-insecure").checked, readTags);
  });
}

async function start() {
  setUpKey();
  setUpPlayground();
  setUpPull();
  try {
    const version = await api.json("/api/version");
    $("server").textContent = `version ${version.ollamatrio || version.version} · Ollama API ${version.version}`;
    await readPs();
    const [admin, metrics] = await Promise.all([api.allowed("/api/usage"), api.allowed("/metrics")]);
    state.scopes = { admin, metrics };
    $("pull-form").hidden = !admin;
    if (!metrics) renderCharts(state.history, 0, false);
    await Promise.all([readTags(), readMetrics()]);
  } catch (error) {
    report(error);
  }
  followEvents();
  setInterval(() => document.hidden || schedulePs(), PS_EVERY);
  setInterval(() => document.hidden || scheduleMetrics(), METRICS_EVERY);
  setInterval(tickModels, 1000); // countdowns only: no request
  document.addEventListener("visibilitychange", () => document.hidden || schedulePs());
  document.body.dataset.ready = "true";
}

start();
