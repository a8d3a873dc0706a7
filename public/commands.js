// Composer commands typed out in full: "/adapters" then Enter runs the command. Chainlit's menu would take that
// Enter to pick the command and send nothing; here the text goes as typed, and the server runs the command
// (backend/ui/commands.py: typed_command). Only a word that is exactly one of the menu's commands; anything else
// ("/ada", "/usr/bin") is left to Chainlit. Loaded by status.js (Chainlit takes one custom_js).
(function () {
  window.addEventListener(
    "keydown",
    function (e) {
      if (e.key !== "Enter" || e.shiftKey || e.isComposing || !e.target || e.target.id !== "chat-input") return;
      const word = e.target.value.trim().toLowerCase();
      if (!/^\/[\w-]+$/.test(word)) return;
      const menu = Array.from(document.querySelectorAll(".command-item .font-medium"), (el) => "/" + el.textContent.trim());
      const submit = document.getElementById("chat-submit");
      if (!menu.includes(word) || !submit || submit.disabled) return;
      // Window capture runs before React's listeners on the page's root: the menu never sees this Enter.
      e.preventDefault();
      e.stopImmediatePropagation();
      submit.click();
    },
    true,
  );
})();
