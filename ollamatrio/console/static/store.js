// The Store panel: the models on disk (/api/tags, each one's capabilities from /api/show),
// a pull with its progress (/api/pull), a delete after a confirmation (/api/delete).

import { ApiError, json, ndjson } from "./api.js";
import { $, bytes, fill, h } from "./dom.js";

const shown = new Map(); // digest -> capabilities (a model's file never changes its digest)
const rows = new Map(); // name -> row element

export async function capabilities(model) {
  if (!shown.has(model.digest)) {
    const data = await json("/api/show", { method: "POST", body: { model: model.name } });
    shown.set(model.digest, data.capabilities || []);
  }
  return shown.get(model.digest);
}

function confirmDelete(cell, name, actions) {
  const no = h("button", { type: "button" }, "Keep it");
  const yes = h("button", { type: "button", class: "danger" }, `Delete ${name}`);
  const before = [...cell.childNodes];
  const restore = () => {
    cell.replaceChildren(...before);
    before.find((n) => n.classList?.contains("delete"))?.focus();
  };
  no.addEventListener("click", restore);
  yes.addEventListener("click", async () => {
    yes.disabled = no.disabled = true;
    try {
      await actions.remove(name);
    } catch (error) {
      actions.report(error);
      restore();
    }
  });
  cell.replaceChildren(h("span", { text: "Sure? " }), yes, " ", no);
  no.focus();
}

export function renderStore(state, actions) {
  const body = $("store-list");
  const seen = new Set();
  for (const model of state.tags) {
    seen.add(model.name);
    let row = rows.get(model.name);
    if (!row) {
      const caps = h("td", { class: "caps", text: "…" });
      const load = h("button", { type: "button" }, "Load");
      load.addEventListener("click", () => actions.preload(model.name, row.dataset.caps || ""));
      const del = h("button", { type: "button", class: "delete admin" }, "Delete");
      del.addEventListener("click", () => confirmDelete(del.parentElement, model.name, actions));
      row = h(
        "tr",
        { "data-model": model.name },
        h("th", { scope: "row", text: model.name }),
        h("td", { text: bytes(model.size) }),
        h("td", { text: model.details?.family || "–" }),
        h("td", { text: model.details?.quantization_level || "–" }),
        caps,
        h("td", { class: "actions" }, load, " ", del),
      );
      rows.set(model.name, row);
      capabilities(model)
        .then((list) => {
          row.dataset.caps = list.join(" ");
          caps.textContent = list.join(", ") || "–";
          actions.capabilitiesKnown();
        })
        .catch(() => {
          caps.textContent = "–";
        });
    }
    body.append(row); // in the listing's order
  }
  for (const [name, row] of rows) {
    if (!seen.has(name)) {
      row.remove();
      rows.delete(name);
    }
  }
  for (const el of document.querySelectorAll(".admin")) el.hidden = !state.scopes.admin;
}

// A pull, its lines shown as they come: each layer's bar, then the last status.
export async function pull(name, insecure, onDone) {
  const box = h("div", { class: "pull", "data-model": name });
  const status = h("p", { role: "status", text: `pulling ${name}` });
  const bar = h("progress", { max: 1, value: 0, "aria-label": `pulling ${name}` });
  box.append(status, bar);
  $("pulls").prepend(box);
  try {
    for await (const line of ndjson("/api/pull", { model: name, insecure, stream: true })) {
      status.textContent = line.status;
      if (line.total) {
        bar.max = line.total;
        bar.value = line.completed || 0;
        const percent = Math.round((100 * (line.completed || 0)) / line.total);
        status.textContent = `${line.status}: ${percent}% of ${bytes(line.total)}`;
      }
      if (line.status === "success") {
        bar.max = 1;
        bar.value = 1;
        box.dataset.done = "success";
      }
    }
  } catch (error) {
    status.textContent = `pull failed: ${error instanceof ApiError ? error.message : error}`;
    status.className = "error";
    box.dataset.done = "failed";
  }
  await onDone();
  setTimeout(() => box.remove(), 30_000);
}

export function fillModelChoice(state) {
  const select = $("chat-model");
  const current = select.value;
  const names = state.tags
    .filter((m) => {
      const caps = rows.get(m.name)?.dataset.caps;
      return !caps || caps.split(" ").includes("completion");
    })
    .map((m) => m.name);
  const options = names.map((name) => h("option", { value: name, text: name }));
  fill(select, options);
  if (names.includes(current)) select.value = current;
}
