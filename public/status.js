// Always-visible engine status line: polls /qwenchat/status (the app's shared health poller).
(function () {
  // Every word comes from the server (backend/catalog/, in the viewer's language: [ui].language, else this
  // browser's); the page keeps the "offline" word it was last sent, for when the server stops answering. Only
  // before any answer does it use one of these two.
  const browserZh = (navigator.language || "").toLowerCase().startsWith("zh");
  let offline = browserZh ? "界面未连接" : "UI offline";
  const url = "/qwenchat/status?lang=" + encodeURIComponent(navigator.language || "");
  function badge() {
    let el = document.getElementById("qwenchat-status");
    if (!el) {
      el = document.createElement("div");
      el.id = "qwenchat-status";
      el.setAttribute("role", "status");
      el.setAttribute("aria-live", "polite");
      document.body.appendChild(el);
    }
    return el;
  }
  async function poll() {
    const el = badge();
    let r, s;
    try {
      r = await fetch(url, { cache: "no-store" });
      if (r.ok) s = await r.json();
    } catch (e) {
      el.hidden = false;
      el.textContent = "● " + offline;
      el.dataset.state = "offline";
      return;
    }
    if (!r.ok) { // e.g. 401 before login ([login].enable): nothing to show, not "undefined"
      el.hidden = true;
      el.textContent = "";
      el.dataset.state = "hidden";
      return;
    }
    if (s.offline_label) offline = s.offline_label;
    // s.label: the state's word ("preparing" while the launcher installs the engine or converts the model)
    let text = `● ${s.model} — ${s.label || s.state}`;
    if (s.state === "starting" && s.elapsed) text += ` ${s.elapsed_text}`;
    if (s.reason && s.state !== "ready") text += ` · ${s.reason}`;
    // requests queue in the engine (vLLM's /metrics): "busy · 8 running, 3 waiting"
    if (s.load_text) text += ` · ${s.load_text}`;
    // a fleet: "3 of 3 replicas ready" (when not all are, the reason already says which are not)
    if (s.state === "ready" && s.replicas_total) text += ` · ${s.replicas_text}`;
    // a fleet: adapters some ready replicas lack, so not offered ("pirate not offered: not served by replica 2 (…)")
    if (s.partial_text) text += ` · ${s.partial_text}`;
    // the UI process itself was restarted by the launcher lately: why, and that the model kept running
    if (s.ui_note) text += ` · ${s.ui_note}`;
    // history writes waiting for the database: "history: 3 messages waiting to be saved · the database is locked"
    if (s.history_text) text += ` · ${s.history_text}`;
    el.hidden = false;
    el.textContent = text;
    el.dataset.state = s.state;
    el.lang = s.lang || "";
    el.title = (s.adapters || []).length ? "LoRA: " + s.adapters.join(", ") : "";
  }
  poll();
  setInterval(poll, 2000);
})();
// Shared-chat refusals in plain words (public/share.js) and commands typed out in full (public/commands.js):
// Chainlit loads one custom_js, this one.
(function () {
  for (const src of ["/public/share.js", "/public/commands.js"]) {
    const s = document.createElement("script");
    s.src = src;
    document.head.appendChild(s);
  }
})();
