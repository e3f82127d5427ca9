/* Storytree play page: the small amount of behaviour htmx attributes cannot express.
 *
 * - Scroll anchoring when earlier turns are prepended: the turn at the top of the view
 *   stays where it was (recorded before the swap, restored after it).
 * - The composer: Enter sends, Shift+Enter adds a line; suggestions fill the box; a draft
 *   typed while a turn is being written survives the page redrawing itself.
 * - Undo and redo on Alt+Z / Alt+Y, except while typing.
 * - The view follows the story's end when a turn is committed or streams in.
 * - Responses the server did not answer in words (a network error, a 500) get a plain notice.
 *
 * No inline script anywhere: this file is loaded with <script src defer>.
 */
(function () {
  "use strict";

  var anchor = null; // {el, top}: the turn to hold in place across a prepend
  var draft = null; // composer text to carry across a redraw of #play
  var followEnd = false; // keep the story's end in view across a streaming update

  function byId(id) {
    return document.getElementById(id);
  }

  function isTyping(el) {
    if (!el || el === document.body) return false;
    if (el.isContentEditable) return true;
    var tag = el.tagName;
    if (tag === "TEXTAREA" || tag === "SELECT") return true;
    if (tag === "INPUT") {
      var type = (el.getAttribute("type") || "text").toLowerCase();
      return ["button", "submit", "reset", "checkbox", "radio", "hidden"].indexOf(type) === -1;
    }
    return false;
  }

  /* --- where the story ends ------------------------------------------------------------ */

  // Scroll so the end of the story sits just above the (sticky) composer dock.
  function scrollToStoryEnd() {
    var end = byId("story-end");
    if (!end) return;
    var dock = byId("dock");
    var dockHeight = dock ? dock.getBoundingClientRect().height : 0;
    var delta = end.getBoundingClientRect().bottom - (window.innerHeight - dockHeight);
    window.scrollBy(0, delta);
  }

  function nearStoryEnd() {
    var end = byId("story-end");
    if (!end) return false;
    var dock = byId("dock");
    var dockHeight = dock ? dock.getBoundingClientRect().height : 0;
    return end.getBoundingClientRect().bottom <= window.innerHeight - dockHeight + 160;
  }

  /* --- scroll anchoring ---------------------------------------------------------------- */

  // The first turn whose bottom is below the top of the viewport: what the reader sees first.
  function topVisibleNode() {
    var nodes = document.querySelectorAll("#story .node");
    for (var i = 0; i < nodes.length; i++) {
      var rect = nodes[i].getBoundingClientRect();
      if (rect.bottom > 0) return { el: nodes[i], top: rect.top };
    }
    return nodes.length ? { el: nodes[0], top: nodes[0].getBoundingClientRect().top } : null;
  }

  function restoreAnchor() {
    if (!anchor || !anchor.el.isConnected) return;
    var delta = anchor.el.getBoundingClientRect().top - anchor.top;
    if (Math.abs(delta) >= 1) window.scrollBy(0, delta);
  }

  /* --- htmx lifecycle ------------------------------------------------------------------ */

  document.addEventListener("htmx:beforeSwap", function (evt) {
    var target = evt.detail.target;
    if (!target) return;
    if (target.classList && target.classList.contains("older")) {
      anchor = topVisibleNode();
    }
    if (target.id === "play") {
      var text = byId("composer-text");
      var elt = evt.detail.requestConfig && evt.detail.requestConfig.elt;
      var fromComposer = elt && elt.closest && elt.closest("#composer");
      draft = text && text.value.trim() && !fromComposer ? text.value : null;
    }
    if (target.id === "job" || target.id === "job-progress") {
      followEnd = nearStoryEnd();
    }
  });

  document.addEventListener("htmx:afterSwap", function (evt) {
    if (anchor) restoreAnchor();
    var target = evt.detail.target;
    if (target && target.id === "play") {
      var text = byId("composer-text");
      if (draft && text && !text.value) text.value = draft;
      draft = null;
      scrollToStoryEnd();
      if (!document.activeElement || document.activeElement === document.body) {
        if (text) text.focus({ preventScroll: true });
      }
    } else if (followEnd) {
      scrollToStoryEnd();
    }
  });

  document.addEventListener("htmx:afterSettle", function () {
    if (anchor) {
      restoreAnchor();
      anchor = null;
    }
    if (followEnd) {
      scrollToStoryEnd();
      followEnd = false;
    }
  });

  // An edit form opened inside a turn: focus its box.
  document.addEventListener("htmx:afterSwap", function (evt) {
    var target = evt.detail.target;
    if (target && target.hasAttribute && target.hasAttribute("data-edit-slot")) {
      var box = target.querySelector("textarea");
      if (box) box.focus();
    }
  });

  function showNotice(message) {
    var notice = byId("notice");
    if (!notice) return;
    notice.textContent = "";
    var p = document.createElement("p");
    p.className = "notice-inner";
    p.textContent = message;
    notice.appendChild(p);
  }

  document.addEventListener("htmx:responseError", function (evt) {
    var status = evt.detail.xhr ? evt.detail.xhr.status : 0;
    if (status === 403) {
      showNotice("Your session has expired or this page is out of date. Reload the page and try again.");
    } else if (status === 404) {
      showNotice("That is no longer there. Reload the page to see the story as it stands.");
    } else {
      showNotice("Something went wrong on the server (" + status + "). Nothing you see was lost; try again.");
    }
  });

  document.addEventListener("htmx:sendError", function () {
    showNotice("The server could not be reached. Check your connection; the page keeps trying.");
  });

  /* --- keyboard ------------------------------------------------------------------------ */

  document.addEventListener("keydown", function (evt) {
    var target = evt.target;
    if (target && target.id === "composer-text" && evt.key === "Enter") {
      if (evt.shiftKey || evt.altKey || evt.ctrlKey || evt.metaKey || evt.isComposing) return;
      evt.preventDefault();
      var form = target.form;
      var send = form && form.querySelector("button[type=submit]");
      if (!form || (send && send.disabled)) return;
      form.requestSubmit(send || undefined);
      return;
    }
    if (evt.altKey && !evt.ctrlKey && !evt.metaKey && !evt.shiftKey && (evt.code === "KeyZ" || evt.code === "KeyY")) {
      if (isTyping(target)) return;
      var button = byId(evt.code === "KeyZ" ? "undo-button" : "redo-button");
      if (!button || button.disabled || !button.form) return;
      evt.preventDefault();
      button.form.requestSubmit(button);
    }
  });

  /* --- clicks -------------------------------------------------------------------------- */

  document.addEventListener("click", function (evt) {
    var suggestion = evt.target.closest && evt.target.closest("[data-suggestion]");
    if (suggestion) {
      var text = byId("composer-text");
      if (text) {
        text.value = suggestion.getAttribute("data-suggestion");
        text.focus();
        text.setSelectionRange(text.value.length, text.value.length);
      }
      return;
    }
    var close = evt.target.closest && evt.target.closest("[data-close-edit]");
    if (close) {
      var slot = close.closest("[data-edit-slot]");
      if (slot) {
        evt.preventDefault();
        var node = slot.closest(".node");
        slot.textContent = "";
        var edit = node && node.querySelector("a.edit");
        if (edit) edit.focus();
      }
    }
  });

  /* --- first paint: start at the newest turn ------------------------------------------- */

  if (byId("story") && !window.location.hash) {
    scrollToStoryEnd();
  }
})();
