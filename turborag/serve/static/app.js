// The turborag web page: documents (upload, list, remove), a streamed answer with its sources and TTFT, and
// the same question in full and turbo mode side by side. Plain JS, no build step, no network beyond this
// server. Everything the server sends is put in the page as text (textContent), never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_ITEM = "turborag.apiKey"; // sessionStorage: the key lives as long as this tab
let keyPrompt = null; // the pending key request, shared by requests that get a 401 at the same time
let ready = false; // model, collections and documents loaded (a wrong key at load time leaves it false)

class ApiError extends Error {
  constructor(message, status = 0, code = null) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

// ---- errors ------------------------------------------------------------------------------------------

function showError(err) {
  const box = $("error");
  box.textContent = err instanceof Error ? err.message : String(err);
  box.hidden = false;
}

function clearError() {
  $("error").hidden = true;
  $("error").textContent = "";
}

// Runs an action started by the user, after loading the page's data if that has not worked yet (say the
// key typed at load time was wrong); whatever goes wrong is shown, never swallowed.
async function run(action) {
  clearError();
  try {
    if (!ready) await load();
    await action();
  } catch (err) {
    showError(err);
    if (!(err instanceof ApiError)) console.error(err); // a bug in this page: keep the stack for devtools
  }
}

// ---- API calls ---------------------------------------------------------------------------------------

// Shows the key form and resolves with what the user types.
function askForKey() {
  if (!keyPrompt) {
    keyPrompt = new Promise((resolve) => {
      const form = $("key-form");
      const input = $("key");
      form.hidden = false;
      input.value = "";
      input.focus();
      form.onsubmit = (event) => {
        event.preventDefault();
        form.hidden = true;
        keyPrompt = null;
        resolve(input.value.trim());
      };
    });
  }
  return keyPrompt;
}

async function send(path, options) {
  const headers = new Headers(options.headers || {});
  const key = sessionStorage.getItem(KEY_ITEM);
  if (key) headers.set("Authorization", `Bearer ${key}`);
  try {
    return await fetch(path, { ...options, headers });
  } catch (err) {
    throw new ApiError(`Network error: the server could not be reached (${err.message}).`);
  }
}

// The server's message from an OpenAI-shaped error body ({"error": {"message", "code"}}), else the raw body.
async function errorFrom(response) {
  const text = await response.text();
  let message = text.trim() || response.statusText || "no details";
  let code = null;
  try {
    const body = JSON.parse(text);
    if (body && body.error && body.error.message) {
      message = body.error.message;
      code = body.error.code || null;
    }
  } catch {
    // not JSON (a proxy's HTML page, say): the raw text is the best message there is
  }
  return new ApiError(`Error ${response.status}: ${message}`, response.status, code);
}

// fetch() on the API with the key. On a 401 the key is asked for once and the request retried; a key that
// still gets a 401 is forgotten, so that the next request asks again. Anything but a 2xx throws ApiError.
async function api(path, options = {}) {
  let response = await send(path, options);
  if (response.status === 401) {
    sessionStorage.setItem(KEY_ITEM, await askForKey());
    response = await send(path, options);
    if (response.status === 401) sessionStorage.removeItem(KEY_ITEM);
  }
  if (!response.ok) throw await errorFrom(response);
  return response;
}

const collection = () => $("collection").value || "default";
const inCollection = (path) => `${path}?collection=${encodeURIComponent(collection())}`;

// ---- documents ---------------------------------------------------------------------------------------

async function loadCollections() {
  const { data } = await (await api("/v1/collections")).json();
  const select = $("collection");
  const current = collection();
  select.replaceChildren();
  for (const c of data) select.append(new Option(c.id, c.id));
  if (data.some((c) => c.id === current)) select.value = current;
  $("collection-box").hidden = data.length < 2; // one collection: nothing to choose
}

async function loadDocuments() {
  const { data } = await (await api(inCollection("/v1/documents"))).json();
  const list = $("doc-list");
  list.replaceChildren();
  if (data.length === 0) {
    const empty = document.createElement("li");
    empty.className = "muted";
    empty.textContent = "No documents yet.";
    list.append(empty);
  }
  for (const doc of data) {
    const item = document.createElement("li");
    item.dataset.id = doc.id;
    const label = document.createElement("span");
    label.className = "doc-name";
    label.textContent = doc.name;
    const meta = document.createElement("span");
    meta.className = "muted";
    meta.textContent = `${doc.chunks} chunk${doc.chunks === 1 ? "" : "s"}`;
    const remove = document.createElement("button");
    remove.className = "secondary remove";
    remove.textContent = "Remove";
    remove.onclick = () =>
      run(async () => {
        await api(inCollection(`/v1/documents/${encodeURIComponent(doc.id)}`), { method: "DELETE" });
        await loadDocuments();
      });
    item.append(label, meta, remove);
    list.append(item);
  }
}

// Uploads one file at a time: each is ingested (chunked, caches precomputed) before the response comes.
async function upload(files) {
  const status = $("upload-status");
  try {
    for (const file of files) {
      status.textContent = `Uploading and ingesting ${file.name}…`;
      const form = new FormData();
      form.append("file", file);
      form.append("collection", collection());
      const doc = await (await api("/v1/documents", { method: "POST", body: form })).json();
      status.textContent = `Added ${doc.name}.`;
      await loadDocuments();
    }
  } catch (err) {
    status.textContent = "";
    throw err;
  }
}

// ---- answers -----------------------------------------------------------------------------------------

function answerPanel(title) {
  const node = $("answer-template").content.firstElementChild.cloneNode(true);
  node.dataset.mode = title;
  node.querySelector(".title").textContent = title;
  $("results").append(node);
  return node;
}

function formatSeconds(s) {
  if (s >= 1) return `${s.toFixed(2)} s`;
  return `${(s * 1000).toFixed(s < 0.01 ? 1 : 0)} ms`;
}

// The SSE events of a response body: `data:` payloads, parsed, until `[DONE]`; throws if the stream stops
// before `[DONE]` (the server or the network dropped it).
async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    let chunk;
    try {
      chunk = await reader.read();
    } catch (err) {
      throw new ApiError(`Network error while streaming the answer (${err.message}).`);
    }
    if (chunk.done) throw new ApiError("The answer stream ended early: the server closed the connection.");
    buffer += decoder.decode(chunk.value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

// Streams one answer into `panel`; returns {text, ttft} once it is complete.
async function streamAnswer(question, mode, panel) {
  const body = {
    model: "turborag",
    messages: [{ role: "user", content: question }],
    stream: true,
    stream_options: { include_usage: true }, // the last event then carries prompt and cached tokens
    turborag: { mode, collection: collection() },
  };
  const response = await api("/v1/chat/completions", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  const textNode = panel.querySelector(".text");
  let text = "";
  let info = null;
  let usage = null;
  panel.classList.add("streaming");
  try {
    for await (const event of events(response)) {
      if (event.error) throw new ApiError(`Error: ${event.error.message}`);
      for (const choice of event.choices || []) {
        if (choice.delta && choice.delta.content) {
          text += choice.delta.content;
          textNode.textContent = text;
        }
      }
      if (event.turborag) info = event.turborag; // on the closing chunk: mode, TTFT, chunks used
      if (event.usage) usage = event.usage;
    }
  } finally {
    panel.classList.remove("streaming");
  }
  if (!text) textNode.textContent = "(empty answer)";
  showStats(panel, info, usage);
  showSources(panel, info ? info.chunks || [] : []);
  return { text, ttft: info ? info.ttft_s : null };
}

function showStats(panel, info, usage) {
  const parts = [];
  if (info) parts.push(`mode ${info.mode}`, `TTFT ${formatSeconds(info.ttft_s)}`);
  if (usage) {
    parts.push(`${usage.prompt_tokens} prompt tokens`);
    parts.push(`${usage.prompt_tokens_details.cached_tokens} cached`);
    parts.push(`${usage.completion_tokens} generated`);
  }
  const stats = panel.querySelector(".stats");
  stats.textContent = parts.join(" · ");
}

// The passages the answer read: the document's name; the chunk's text opens on click.
function showSources(panel, chunks) {
  const list = panel.querySelector(".sources");
  list.replaceChildren();
  if (chunks.length === 0) {
    const note = document.createElement("li");
    note.className = "muted";
    note.textContent = "No passages were retrieved: the answer comes from the model alone.";
    list.append(note);
  }
  for (const c of chunks) {
    const item = document.createElement("li");
    const details = document.createElement("details");
    const summary = document.createElement("summary");
    summary.textContent = `${c.name} (part ${c.ordinal + 1})`;
    const pre = document.createElement("pre");
    pre.textContent = c.text ?? "(this server does not return chunk texts)";
    details.append(summary, pre);
    item.append(details);
    list.append(item);
  }
}

function setBusy(busy) {
  $("ask-button").disabled = busy;
  $("compare-button").disabled = busy;
}

function question() {
  const q = $("question").value.trim();
  if (!q) throw new ApiError("Type a question first.");
  return q;
}

async function ask() {
  const q = question();
  $("results").replaceChildren();
  $("results").classList.remove("compare");
  $("speedup").hidden = true;
  setBusy(true);
  try {
    await streamAnswer(q, $("mode").value, answerPanel($("mode").value));
  } finally {
    setBusy(false);
  }
}

// full and turbo one after the other, not together: the server batches concurrent requests, which would
// make each one's TTFT include the other's work.
async function compare() {
  const q = question();
  const results = $("results");
  results.replaceChildren();
  results.classList.add("compare");
  $("speedup").hidden = true;
  const panels = { full: answerPanel("full"), turbo: answerPanel("turbo") };
  setBusy(true);
  try {
    const full = await streamAnswer(q, "full", panels.full);
    const turbo = await streamAnswer(q, "turbo", panels.turbo);
    const line = $("speedup");
    const same = full.text === turbo.text ? "same answer" : "the answers differ";
    const speedup = full.ttft && turbo.ttft ? `${(full.ttft / turbo.ttft).toFixed(1)}×` : "unknown (no TTFT)";
    line.textContent = `TTFT speedup of turbo over full: ${speedup} (${same})`;
    line.hidden = false;
  } finally {
    setBusy(false);
  }
}

// ---- start -------------------------------------------------------------------------------------------

function wire() {
  $("ask-form").onsubmit = (event) => {
    event.preventDefault();
    run(ask);
  };
  $("compare-button").onclick = () => run(compare);
  $("question").onkeydown = (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault(); // Enter asks; Shift+Enter is a new line
      run(ask);
    }
  };
  $("file").onchange = (event) => {
    const files = [...event.target.files];
    event.target.value = ""; // the same file may be chosen again
    run(() => upload(files));
  };
  $("collection").onchange = () => run(loadDocuments);
  const drop = $("drop");
  drop.ondragover = (event) => {
    event.preventDefault(); // allows the drop
    drop.classList.add("over");
  };
  drop.ondragleave = () => drop.classList.remove("over");
  drop.ondrop = (event) => {
    event.preventDefault(); // else the browser opens the file
    drop.classList.remove("over");
    run(() => upload([...event.dataTransfer.files]));
  };
}

// The served model, the collections and the documents of the selected one.
async function load() {
  const models = await (await api("/v1/models")).json();
  $("model").textContent = models.data.map((m) => m.id).join(", ");
  try {
    await loadCollections();
    await loadDocuments();
  } catch (err) {
    if (err.code !== "no_store") throw err;
    $("doc-list").replaceChildren(); // no "Loading documents…": there are none to load
    $("documents").querySelector(".drop").hidden = true;
    $("upload-status").textContent =
      "This server has no document store (start it with --store): questions are answered without retrieval.";
  }
  ready = true;
}

wire();
run(async () => {}); // loads the page's data (run does it first)
