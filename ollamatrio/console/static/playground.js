// The Playground: a chat with one model, streamed (/api/chat), with each answer's speed and
// the prompt tokens the runner reused from its cache; images go to a vision model.

import { ApiError, ndjson } from "./api.js";
import { $, h } from "./dom.js";

const messages = [];
let images = []; // {base64, url} of the next message
let running = null; // the AbortController of the answer being streamed

function addImages(files) {
  for (const file of files) {
    if (!file.type.startsWith("image/")) continue;
    const reader = new FileReader();
    reader.addEventListener("load", () => {
      images.push({ base64: String(reader.result).split(",")[1], url: URL.createObjectURL(file) });
      showAttached();
    });
    reader.readAsDataURL(file);
  }
}

function showAttached() {
  $("chat-attached").textContent = images.length ? `${images.length} image(s) attached` : "";
}

function bubble(role, text, pictures = []) {
  const body = h("div", { class: "text", text });
  const li = h(
    "li",
    { class: `message ${role}` },
    h("span", { class: "who", text: role === "user" ? "You" : "Model" }),
    body,
    pictures.map((p) => h("img", { src: p.url, alt: "attached image", class: "thumb" })),
  );
  $("chat-log").append(li);
  return body;
}

function stats(final, seconds) {
  const evalSeconds = (final.eval_duration || 0) / 1e9;
  const speed = evalSeconds > 0 ? final.eval_count / evalSeconds : 0;
  const reused = final.prompt_cached_count ?? 0;
  return (
    `${final.eval_count ?? 0} tokens at ${speed.toFixed(1)} tokens/s; ` +
    `prompt ${final.prompt_eval_count ?? 0} tokens, ${reused} of them reused from the cache; ` +
    `${seconds.toFixed(2)} s in all`
  );
}

async function send(event) {
  event.preventDefault();
  const input = $("chat-input");
  const model = $("chat-model").value;
  const text = input.value.trim();
  if (!model || (!text && !images.length) || running) return;
  const message = { role: "user", content: text };
  if (images.length) message.images = images.map((i) => i.base64);
  bubble("user", text, images);
  messages.push(message);
  input.value = "";
  images = [];
  showAttached();
  const answer = bubble("assistant", "");
  answer.parentElement.setAttribute("aria-busy", "true");
  running = new AbortController();
  $("chat-send").disabled = true;
  $("chat-stop").disabled = false;
  $("chat-stats").textContent = "…";
  const started = performance.now();
  let reply = "";
  try {
    let final = null;
    const body = { model, messages, stream: true };
    for await (const chunk of ndjson("/api/chat", body, running.signal)) {
      reply += chunk.message?.content || "";
      answer.textContent = reply;
      if (chunk.done) final = chunk;
    }
    messages.push({ role: "assistant", content: reply });
    if (final) $("chat-stats").textContent = stats(final, (performance.now() - started) / 1000);
  } catch (error) {
    const stopped = error.name === "AbortError";
    $("chat-stats").textContent = stopped ? "stopped" : `failed: ${error instanceof ApiError ? error.message : error}`;
    if (reply) messages.push({ role: "assistant", content: reply });
    else messages.pop();
  } finally {
    answer.parentElement.removeAttribute("aria-busy");
    running = null;
    $("chat-send").disabled = false;
    $("chat-stop").disabled = true;
  }
}

export function setUpPlayground() {
  const form = $("chat-form");
  form.addEventListener("submit", send);
  $("chat-input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) form.requestSubmit();
  });
  $("chat-stop").addEventListener("click", () => running?.abort());
  $("chat-clear").addEventListener("click", () => {
    running?.abort();
    messages.length = 0;
    $("chat-log").replaceChildren();
    $("chat-stats").textContent = "";
  });
  $("chat-images").addEventListener("change", (event) => {
    addImages(event.target.files);
    event.target.value = "";
  });
  form.addEventListener("dragover", (event) => event.preventDefault());
  form.addEventListener("drop", (event) => {
    event.preventDefault();
    addImages(event.dataTransfer.files);
  });
}
