// llamactx's chat page: a conversation streamed from POST /v1/chat/completions (server-sent events), the model's
// names from GET /v1/models (one, or a router's many: the list picks the request's "model"), sampling settings,
// the API key and the conversations (list, switch, new, delete) kept in localStorage, so a reload keeps them.
// The model's thinking (`reasoning_content`) streams into a collapsed block apart from its answer; the answer is
// rendered as Markdown by markdown.js, which writes the model's text only with text nodes, never parsed as HTML.
"use strict";

(() => {
  const SETTINGS_KEY = "llamactx.settings";
  const API_KEY_KEY = "llamactx.apiKey";
  const CONVERSATIONS_KEY = "llamactx.conversations";
  const TITLE_CHARS = 48;
  // llama-server's defaults (common/common.h common_params_sampling), max_tokens bounded for a chat page
  const DEFAULTS = { temperature: "0.8", top_p: "0.95", top_k: "40", min_p: "0.05", max_tokens: "512", seed: "-1" };
  const MODEL_RETRY_MS = 1000;
  const MODEL_RETRIES = 300;

  const $ = (id) => document.getElementById(id);
  const ui = {
    modelName: $("model-name"), modelSelect: $("model-select"), newChat: $("new-chat"), settings: $("settings"), apiKey: $("api-key"),
    reset: $("reset-settings"), messages: $("messages"), error: $("error"), composer: $("composer"),
    input: $("input"), send: $("send"), stop: $("stop"), template: $("message-template"),
    conversations: $("conversation-list"),
  };

  // The conversation shown (its id, null for a new one not yet sent; its messages, each {role, content} and for
  // an answer its reasoning_content and stats), the running request's controller, and an epoch that switching
  // conversation bumps so that a request still finishing does not write into another conversation.
  const chat = { id: null, messages: [], controller: null, epoch: 0, modelLoad: 0, model: null };

  class RequestError extends Error {}

  // -- storage ------------------------------------------------------------------------------------------------

  function readStorage(key) {
    try {
      return localStorage.getItem(key);
    } catch {
      return null; // storage disabled: the page still works, nothing is remembered
    }
  }

  function writeStorage(key, value) {
    try {
      localStorage.setItem(key, value);
    } catch {
      // as above
    }
  }

  function loadSettings() {
    let saved = {};
    try {
      saved = JSON.parse(readStorage(SETTINGS_KEY) || "{}") || {};
    } catch {
      saved = {};
    }
    for (const [name, value] of Object.entries(DEFAULTS)) {
      $(name).value = typeof saved[name] === "string" ? saved[name] : value;
    }
    ui.apiKey.value = readStorage(API_KEY_KEY) || "";
  }

  function saveSettings() {
    const values = {};
    for (const name of Object.keys(DEFAULTS)) values[name] = $(name).value;
    writeStorage(SETTINGS_KEY, JSON.stringify(values));
  }

  // -- conversations ------------------------------------------------------------------------------------------

  /** The stored conversations, most recent first: [{id, title, updated, messages}]. */
  function loadConversations() {
    try {
      const list = JSON.parse(readStorage(CONVERSATIONS_KEY) || "[]");
      return Array.isArray(list) ? list.filter((c) => c && typeof c.id === "string" && Array.isArray(c.messages)) : [];
    } catch {
      return [];
    }
  }

  function storeConversations(list) {
    list.sort((a, b) => (b.updated || 0) - (a.updated || 0));
    writeStorage(CONVERSATIONS_KEY, JSON.stringify(list));
  }

  /** Saves the conversation shown (a new one gets its id and title from its first message). */
  function saveConversation() {
    if (!chat.messages.length) return;
    const list = loadConversations();
    let entry = list.find((c) => c.id === chat.id);
    if (!entry) {
      chat.id = `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 8)}`;
      const first = chat.messages[0].content.trim().replace(/\s+/g, " ");
      entry = { id: chat.id, title: first.length > TITLE_CHARS ? `${first.slice(0, TITLE_CHARS)}…` : first };
      list.push(entry);
    }
    entry.messages = chat.messages;
    entry.updated = Date.now();
    storeConversations(list);
    writeStorage(`${CONVERSATIONS_KEY}.current`, chat.id);
    showConversations();
  }

  function showConversations() {
    const list = loadConversations();
    ui.conversations.replaceChildren(...list.map((c) => {
      const open = document.createElement("button");
      open.type = "button";
      open.className = "open";
      open.textContent = c.title || "(untitled)";
      open.addEventListener("click", () => openConversation(c.id));
      const remove = document.createElement("button");
      remove.type = "button";
      remove.className = "delete";
      remove.textContent = "×";
      remove.title = "Delete this conversation";
      remove.setAttribute("aria-label", `Delete conversation: ${c.title}`);
      remove.addEventListener("click", () => deleteConversation(c.id));
      const item = document.createElement("li");
      item.dataset.id = c.id;
      if (c.id === chat.id) item.setAttribute("aria-current", "true");
      item.append(open, remove);
      return item;
    }));
  }

  /** Shows conversation `id` (null: a new, empty one); a request still running is stopped. */
  function openConversation(id) {
    if (chat.controller) chat.controller.abort();
    chat.epoch++;
    setRunning(null);
    const entry = id === null ? null : loadConversations().find((c) => c.id === id);
    chat.id = entry ? entry.id : null;
    chat.messages = entry ? entry.messages : [];
    ui.messages.replaceChildren();
    for (const m of chat.messages) {
      const article = addMessage(m.role, m.content, m.reasoning_content);
      if (m.stats) article.querySelector(".stats").textContent = m.stats;
    }
    writeStorage(`${CONVERSATIONS_KEY}.current`, chat.id || "");
    clearError();
    showConversations();
    ui.input.focus();
  }

  function deleteConversation(id) {
    storeConversations(loadConversations().filter((c) => c.id !== id));
    if (id === chat.id) openConversation(null);
    else showConversations();
  }

  /** The request's sampling fields; an empty field is left to the server's default. */
  function samplingParams() {
    const params = {};
    for (const name of Object.keys(DEFAULTS)) {
      const raw = $(name).value.trim();
      if (raw === "") continue;
      const value = Number(raw);
      if (!Number.isFinite(value)) throw new RequestError(`${name}: "${raw}" is not a number`);
      params[name] = value; // the server checks ranges and integers and names the field if it refuses
    }
    return params;
  }

  function authHeaders() {
    const key = ui.apiKey.value.trim();
    return key ? { Authorization: `Bearer ${key}` } : {};
  }

  // -- errors -------------------------------------------------------------------------------------------------

  /** "HTTP 401: Invalid API Key" from an error response in llama-server's {"error": {...}} format. */
  async function responseError(res) {
    let message = res.statusText;
    try {
      const body = await res.text();
      try {
        message = JSON.parse(body).error.message || body;
      } catch {
        message = body || message;
      }
    } catch {
      // no body: the status says it
    }
    const sentence = /[.!?]$/.test(message) ? message : `${message}.`;
    const hint = res.status === 401 ? " Enter the server's API key in Settings." : "";
    return new RequestError(`HTTP ${res.status}: ${sentence}${hint}`);
  }

  function showError(text) {
    ui.error.textContent = text;
    ui.error.hidden = false;
  }

  function clearError() {
    ui.error.textContent = "";
    ui.error.hidden = true;
  }

  // -- the model's name ---------------------------------------------------------------------------------------

  async function loadModelName() {
    const load = ++chat.modelLoad; // a later call (a new API key) wins over this one
    for (let attempt = 0; attempt < MODEL_RETRIES && load === chat.modelLoad; attempt++) {
      let res;
      try {
        res = await fetch("/v1/models", { headers: authHeaders() });
      } catch (e) {
        ui.modelName.textContent = "unreachable";
        showError(`The server cannot be reached: ${e.message}`);
        return;
      }
      if (load !== chat.modelLoad) return;
      if (res.status === 503) { // "Loading model"
        ui.modelName.textContent = "loading…";
        await new Promise((resolve) => setTimeout(resolve, MODEL_RETRY_MS));
        continue;
      }
      if (!res.ok) {
        ui.modelName.textContent = "unknown";
        const err = await responseError(res);
        if (res.status === 401) ui.settings.open = true;
        showError(err.message);
        return;
      }
      const body = await res.json();
      showModels(body.data || []);
      return;
    }
  }

  /** The models of /v1/models in the list (a router's with their status); the chosen one is kept. */
  function showModels(models) {
    const ids = models.map((m) => m.id);
    if (!ids.includes(chat.model)) chat.model = ids.length ? ids[0] : null;
    ui.modelSelect.replaceChildren(...models.map((m) => {
      const option = document.createElement("option");
      option.value = m.id;
      const status = m.status && m.status.value;
      option.textContent = status && status !== "loaded" ? `${m.id} (${status})` : m.id;
      return option;
    }));
    ui.modelSelect.hidden = ids.length === 0;
    ui.modelSelect.disabled = ids.length < 2;
    if (chat.model !== null) ui.modelSelect.value = chat.model;
    ui.modelName.textContent = chat.model === null ? "unknown" : chat.model;
  }

  ui.modelSelect.addEventListener("change", () => {
    chat.model = ui.modelSelect.value;
    ui.modelName.textContent = chat.model;
  });

  // -- the conversation view ----------------------------------------------------------------------------------

  /** A message of the conversation view: a user's as text, an answer as Markdown with its thinking apart. */
  function addMessage(role, text, reasoning) {
    const article = ui.template.content.firstElementChild.cloneNode(true);
    article.dataset.role = role;
    article.querySelector(".role").textContent = role === "user" ? "You" : "Assistant";
    if (role === "user") {
      article.querySelector(".thinking").remove();
      article.querySelector(".content").textContent = text;
    } else {
      showAnswer(article, text, reasoning || "");
    }
    ui.messages.append(article);
    scrollToEnd(true);
    return article;
  }

  /** Writes an answer (Markdown) and its thinking into `article`; the raw text stays in data-raw. */
  function showAnswer(article, text, reasoning) {
    const content = article.querySelector(".content");
    content.classList.add("markdown");
    content.dataset.raw = text;
    content.replaceChildren(window.llamactxMarkdown.render(text));
    const thinking = article.querySelector(".thinking");
    thinking.hidden = !reasoning;
    thinking.querySelector(".thinking-text").textContent = reasoning;
  }

  function scrollToEnd(force) {
    const box = ui.messages;
    const nearEnd = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
    if (force || nearEnd) box.scrollTop = box.scrollHeight;
    if (force || nearEnd) window.scrollTo(0, document.body.scrollHeight);
  }

  function formatStats(timings, finishReason) {
    const parts = [];
    if (timings) {
      parts.push(`${timings.predicted_per_second.toFixed(1)} tokens/s`);
      parts.push(`${timings.predicted_n} tokens generated`);
      parts.push(`prompt ${timings.prompt_n} tokens (${timings.cache_n} cached)`);
    }
    if (finishReason === "length") parts.push("stopped at max_tokens");
    return parts.join(" · ");
  }

  function setRunning(controller) {
    chat.controller = controller;
    ui.send.disabled = controller !== null;
    ui.stop.disabled = controller === null;
  }

  // -- streaming ----------------------------------------------------------------------------------------------

  /** The JSON objects of an SSE body's `data:` lines, up to `data: [DONE]`. */
  async function* sseEvents(body) {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        buffer += decoder.decode(value, { stream: true });
        const lines = buffer.split("\n");
        buffer = lines.pop();
        for (const line of lines) {
          const data = line.replace(/\r$/, "");
          if (!data.startsWith("data:")) continue;
          const payload = data.slice(5).trim();
          if (payload === "[DONE]") return;
          yield JSON.parse(payload);
        }
      }
    } finally {
      reader.releaseLock();
    }
  }

  /** Streams one answer into `article`; returns {answer, reasoning, timings, finishReason, stopped, error}. */
  async function streamAnswer(messages, params, controller, article) {
    const out = { answer: "", reasoning: "", timings: null, finishReason: null, stopped: false, error: null };
    let frame = null; // one re-render per animation frame, however many deltas arrive
    const show = () => {
      frame = null;
      showAnswer(article, out.answer, out.reasoning);
      scrollToEnd(false);
    };
    try {
      const res = await fetch("/v1/chat/completions", {
        method: "POST",
        headers: { "Content-Type": "application/json", ...authHeaders() },
        body: JSON.stringify({ ...(chat.model === null ? {} : { model: chat.model }), messages, stream: true,
          ...params }),
        signal: controller.signal,
      });
      if (!res.ok) throw await responseError(res);
      for await (const event of sseEvents(res.body)) {
        if (event.error) throw new RequestError(`Error ${event.error.code}: ${event.error.message}`);
        const choice = event.choices && event.choices[0];
        const delta = (choice && choice.delta) || {};
        if (delta.reasoning_content) out.reasoning += delta.reasoning_content;
        if (delta.content) out.answer += delta.content;
        if ((delta.content || delta.reasoning_content) && frame === null) frame = requestAnimationFrame(show);
        if (choice && choice.finish_reason) out.finishReason = choice.finish_reason;
        if (event.timings) out.timings = event.timings;
      }
    } catch (e) {
      if (e.name === "AbortError") out.stopped = true;
      else out.error = e instanceof RequestError ? e.message : `The request failed: ${e.message}`;
    }
    if (frame !== null) cancelAnimationFrame(frame);
    showAnswer(article, out.answer, out.reasoning);
    return out;
  }

  async function send() {
    const text = ui.input.value;
    if (chat.controller || !text.trim()) return;
    let params;
    try {
      params = samplingParams();
    } catch (e) {
      showError(e.message);
      return;
    }
    clearError();
    const epoch = chat.epoch;
    const messages = [...chat.messages, { role: "user", content: text }];
    const sent = messages.map((m) => ({ role: m.role, content: m.content })); // the thinking is not sent back
    const userArticle = addMessage("user", text);
    const article = addMessage("assistant", "");
    article.setAttribute("aria-busy", "true");
    ui.input.value = "";
    const controller = new AbortController();
    setRunning(controller);

    const out = await streamAnswer(sent, params, controller, article);

    if (epoch !== chat.epoch) return; // "New chat" was pressed meanwhile: this answer belongs to no conversation
    setRunning(null);
    article.removeAttribute("aria-busy");
    if (out.error) showError(out.error);
    if (!out.answer && !out.reasoning && (out.error || out.stopped)) {
      // nothing came back: take the turn back so that it can be sent again
      userArticle.remove();
      article.remove();
      if (!ui.input.value) ui.input.value = text;
    } else {
      const stats = out.stopped ? "stopped: partial answer kept" : formatStats(out.timings, out.finishReason);
      article.querySelector(".stats").textContent = stats;
      const answer = { role: "assistant", content: out.answer, stats };
      if (out.reasoning) answer.reasoning_content = out.reasoning;
      chat.messages = [...messages, answer];
      saveConversation();
    }
    ui.input.focus();
  }

  function newChat() {
    openConversation(null);
  }

  // -- wiring -------------------------------------------------------------------------------------------------

  let apiKeyTimer = null;

  function onApiKeyInput() {
    writeStorage(API_KEY_KEY, ui.apiKey.value.trim());
    clearError();
    clearTimeout(apiKeyTimer);
    apiKeyTimer = setTimeout(loadModelName, 300);
  }

  function resetSettings() {
    for (const [name, value] of Object.entries(DEFAULTS)) $(name).value = value;
    saveSettings();
  }

  function onInputKey(event) {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send();
    }
  }

  loadSettings();
  for (const name of Object.keys(DEFAULTS)) $(name).addEventListener("input", saveSettings);
  ui.apiKey.addEventListener("input", onApiKeyInput);
  ui.reset.addEventListener("click", resetSettings);
  ui.composer.addEventListener("submit", (event) => {
    event.preventDefault();
    send();
  });
  ui.input.addEventListener("keydown", onInputKey);
  ui.stop.addEventListener("click", () => chat.controller && chat.controller.abort());
  ui.newChat.addEventListener("click", newChat);
  loadModelName();
  openConversation(readStorage(`${CONVERSATIONS_KEY}.current`) || null);
})();
