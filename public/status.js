// Always-visible engine status line: polls /qwenchat/status (the app's shared health poller).
(function () {
  const browserZh = (navigator.language || "").toLowerCase().startsWith("zh");
  // Every word comes from the server (backend/text.py, with each status); the page keeps the "offline" word it
  // was last sent, for when the server stops answering. Only before any answer does it use these two.
  let offline = { en: "UI offline", zh: "界面未连接" };
  let zh = browserZh; // until the server says which language [ui].language forces
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
      r = await fetch("/qwenchat/status", { cache: "no-store" });
      if (r.ok) s = await r.json();
    } catch (e) {
      el.hidden = false;
      el.textContent = "● " + offline[zh ? "zh" : "en"];
      el.dataset.state = "offline";
      return;
    }
    if (!r.ok) { // e.g. 401 before login ([ui].auth): nothing to show, not "undefined"
      el.hidden = true;
      el.textContent = "";
      el.dataset.state = "hidden";
      return;
    }
    zh = s.lang === "zh" || ((!s.lang || s.lang === "auto") && browserZh);
    if (s.offline_label) offline = { en: s.offline_label, zh: s.offline_label_zh || s.offline_label };
    // s.label: the state's word ("preparing" while the launcher installs the engine or converts the model)
    let text = `● ${s.model} — ${(zh ? s.label_zh : s.label) || s.state}`;
    if (s.state === "starting" && s.elapsed) text += zh ? ` ${s.elapsed} 秒` : ` ${s.elapsed} s`;
    const reason = zh ? s.reason_zh || s.reason : s.reason;
    if (reason && s.state !== "ready") text += ` · ${reason}`;
    // a fleet: "3 of 3 replicas ready" (when not all are, the reason already says which are not)
    if (s.state === "ready" && s.replicas_total) text += ` · ${zh ? s.replicas_text_zh : s.replicas_text}`;
    // a fleet: adapters some ready replicas lack, so not offered ("pirate not offered: not served by replica 2 (…)")
    const partial = zh ? s.partial_text_zh || s.partial_text : s.partial_text;
    if (partial) text += ` · ${partial}`;
    // the UI process itself was restarted by the launcher lately: why, and that the model kept running
    const uiNote = zh ? s.ui_note_zh || s.ui_note : s.ui_note;
    if (uiNote) text += ` · ${uiNote}`;
    el.hidden = false;
    el.textContent = text;
    el.dataset.state = s.state;
    el.title = (s.adapters || []).length ? "LoRA: " + s.adapters.join(", ") : "";
  }
  poll();
  setInterval(poll, 2000);
})();
// Shared-chat refusals in plain words (public/share.js): Chainlit loads one custom_js, this one.
(function () {
  const s = document.createElement("script");
  s.src = "/public/share.js";
  document.head.appendChild(s);
})();
