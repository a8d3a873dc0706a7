// Always-visible engine status line: polls /qwenchat/status (the app's shared health poller).
(function () {
  const zh = (navigator.language || "").toLowerCase().startsWith("zh");
  const LABELS = zh
    ? { starting: "模型加载中", ready: "就绪", degraded: "响应缓慢", down: "引擎不可用", offline: "界面未连接" }
    : { starting: "model loading", ready: "ready", degraded: "degraded", down: "engine down", offline: "UI offline" };
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
    try {
      const r = await fetch("/qwenchat/status", { cache: "no-store" });
      const s = await r.json();
      let text = `● ${s.model} — ${LABELS[s.state] || s.state}`;
      if (s.state === "starting" && s.elapsed) text += zh ? ` ${s.elapsed} 秒` : ` ${s.elapsed} s`;
      const reason = zh ? s.reason_zh || s.reason : s.reason;
      if (reason && s.state !== "ready") text += ` · ${reason}`;
      el.textContent = text;
      el.dataset.state = s.state;
      el.title = (s.adapters || []).length ? "LoRA: " + s.adapters.join(", ") : "";
    } catch (e) {
      el.textContent = "● " + LABELS.offline;
      el.dataset.state = "offline";
    }
  }
  poll();
  setInterval(poll, 2000);
})();
