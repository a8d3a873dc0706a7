// Shared chats: Chainlit's page shows a refused share link as "Failed to load thread: Not Found" (the HTTP status
// text). The app's answer says why (not shared any more, deleted, not the owner: backend/storage/share.py); show that
// message in a banner. Loaded by status.js (Chainlit takes one custom_js).
(function () {
  const SHARE_URL = /\/(project\/share\/[^/?#]+|project\/thread\/share|feedback)(\?|$)/;  // + thumbs on a shared chat
  function show(text) {
    let el = document.getElementById("qwenchat-notice");
    if (!el) {
      el = document.createElement("div");
      el.id = "qwenchat-notice";
      el.setAttribute("role", "alert");
      el.title = "×";
      el.addEventListener("click", () => { el.hidden = true; });
      document.body.appendChild(el);
    }
    el.textContent = text;
    el.hidden = false;
    clearTimeout(el._timer);
    el._timer = setTimeout(() => { el.hidden = true; }, 20000);
  }
  const original = window.fetch;
  window.fetch = async function (input, init) {
    const response = await original.apply(this, arguments);
    try {
      const url = typeof input === "string" ? input : (input && input.url) || "";
      if (!response.ok && response.status !== 401 && SHARE_URL.test(url)) {
        response.clone().json().then((body) => {
          if (body && typeof body.detail === "string") show(body.detail);
        }).catch(() => {});
      }
    } catch (e) { /* never break the page's own request */ }
    return response;
  };
})();
