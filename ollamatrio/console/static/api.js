// The server's API as the console uses it: every call carries the key (when one is set),
// and a 401 asks for one.  Streams (NDJSON, server-sent events) are read with fetch, so
// that the key goes with them too (EventSource cannot send headers).

const KEY = "ollamatrio.key";

export class Unauthorized extends Error {}

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

let askForKey = async () => {};

export function onUnauthorized(handler) {
  askForKey = handler;
}

export function storedKey() {
  return localStorage.getItem(KEY);
}

export function setKey(key) {
  if (key) localStorage.setItem(KEY, key);
  else localStorage.removeItem(KEY);
}

function headers(json) {
  const out = {};
  const key = storedKey();
  if (key) out.Authorization = `Bearer ${key}`;
  if (json) out["Content-Type"] = "application/json";
  return out;
}

// A response, after one round of asking for a key on 401.
export async function call(path, { method = "GET", body, signal } = {}) {
  for (let attempt = 0; ; attempt += 1) {
    const response = await fetch(path, {
      method,
      signal,
      headers: headers(body !== undefined),
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
    });
    if (response.status !== 401) return response;
    if (attempt > 0) throw new Unauthorized("the key was refused");
    await askForKey(storedKey() ? "The key was refused." : "");
  }
}

async function failure(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const data = await response.json();
    if (data && typeof data.error === "string") message = data.error;
  } catch {
    // not JSON: the status says it
  }
  return new ApiError(response.status, message);
}

export async function json(path, options) {
  const response = await call(path, options);
  if (!response.ok) throw await failure(response);
  return response.json();
}

export async function text(path, options) {
  const response = await call(path, options);
  if (!response.ok) throw await failure(response);
  return response.text();
}

// Whether the key may use a path (403: its scope is missing); other failures say nothing.
export async function allowed(path) {
  try {
    const response = await call(path);
    await response.body?.cancel();
    return response.status !== 403;
  } catch (error) {
    if (error instanceof Unauthorized) return false;
    throw error;
  }
}

async function* lines(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let end;
      while ((end = buffer.indexOf("\n")) >= 0) {
        yield buffer.slice(0, end).replace(/\r$/, "");
        buffer = buffer.slice(end + 1);
      }
    }
    if (buffer) yield buffer;
  } finally {
    reader.releaseLock();
  }
}

// Each JSON line of a streamed answer (/api/chat, /api/pull); an error line throws.
export async function* ndjson(path, body, signal) {
  const response = await call(path, { method: "POST", body, signal });
  if (!response.ok) throw await failure(response);
  for await (const line of lines(response)) {
    if (!line.trim()) continue;
    const data = JSON.parse(line);
    if (data.error) throw new ApiError(500, data.error);
    yield data;
  }
}

// Each server-sent event of /api/events as {event, data}; ends when the stream does.
// ``opened`` is called once the server has answered.
export async function* events(opened, signal) {
  const response = await call("/api/events", { signal });
  if (!response.ok) throw await failure(response);
  opened();
  let kind = "message";
  let data = "";
  for await (const line of lines(response)) {
    if (line === "") {
      if (data) yield { event: kind, data: JSON.parse(data) };
      kind = "message";
      data = "";
    } else if (line.startsWith("event:")) {
      kind = line.slice(6).trim();
    } else if (line.startsWith("data:")) {
      data += line.slice(5).trim();
    }
  }
}
