// The console's DOM helpers: building nodes (text nodes only: nothing a job carries is ever
// parsed as HTML), updating a page in place, and the confirmation dialog.
"use strict";

const HANDLERS = ["onclick", "onsubmit", "onchange", "oninput", "ontoggle"];

// el("tr", { key: id, class: "x", onclick: fn }, children...): `key` becomes data-key, which
// lets an update find the same row again however the rows moved.
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (HANDLERS.includes(k)) node[k] = v;
    else if (k === "class") node.className = v;
    else if (k === "key") node.dataset.key = String(v);
    else if (k === "checked") node.checked = true;
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

// -- updating in place -----------------------------------------------------------------
// A refresh builds the page anew and then changes only what differs in the live DOM: a
// text node whose text is the same is left alone (a selection in it survives), an element
// keeps its identity, and what the user set is kept: a <details>' open state, what is
// typed in a field. An element marked data-morph="skip" (a chart)
// keeps its children: its page updates it.

function keyOf(node) {
  return node.nodeType === Node.ELEMENT_NODE ? node.dataset.key || null : null;
}

function sameKind(a, b) {
  if (a.nodeType !== b.nodeType) return false;
  if (a.nodeType !== Node.ELEMENT_NODE) return true;
  return a.tagName === b.tagName && keyOf(a) === keyOf(b)
    && (a.tagName !== "INPUT" || a.type === b.type);
}

function syncAttributes(live, fresh) {
  const userOwned = live.tagName === "DETAILS" ? ["open"] : [];
  for (const { name } of Array.from(live.attributes)) {
    if (!fresh.hasAttribute(name) && !userOwned.includes(name)) live.removeAttribute(name);
  }
  for (const { name, value } of Array.from(fresh.attributes)) {
    if (userOwned.includes(name)) continue;
    if (live.getAttribute(name) !== value) live.setAttribute(name, value);
  }
  for (const h of HANDLERS) if (live[h] !== fresh[h]) live[h] = fresh[h];
  // A checkbox shows the page's state (a selection); a text field is the user's own.
  if (live.tagName === "INPUT" && (live.type === "checkbox" || live.type === "radio")) {
    live.checked = fresh.checked;
  }
}

function morph(live, fresh) {
  syncAttributes(live, fresh);
  if (live.dataset.morph === "skip") return;
  morphChildren(live, fresh);
}

function morphChildren(live, fresh) {
  const wanted = Array.from(fresh.childNodes);
  wanted.forEach((f, i) => {
    const cur = live.childNodes[i];
    if (!cur) { live.appendChild(f); return; }
    if (sameKind(cur, f)) {
      if (cur.nodeType === Node.ELEMENT_NODE) morph(cur, f);
      else if (cur.nodeValue !== f.nodeValue) cur.nodeValue = f.nodeValue;
      return;
    }
    const key = keyOf(f);
    const later = key && Array.from(live.childNodes).slice(i + 1)
      .find(n => keyOf(n) === key && sameKind(n, f));
    if (later) { live.insertBefore(later, cur); morph(later, f); }
    else live.insertBefore(f, cur);
  });
  while (live.childNodes.length > wanted.length) live.removeChild(live.lastChild);
}

// Replace `container`'s content by `nodes`, changing only what differs.
function update(container, nodes) {
  const fresh = document.createElement(container.tagName);
  fresh.append(...nodes);
  morphChildren(container, fresh);
}

// -- confirming ------------------------------------------------------------------------
// confirmAction({ title, message, confirm: "Retry 12 jobs", danger, reason, input })
// resolves to { reason, input } when confirmed, to null when not. A modal <dialog> of the
// page (it shows in a screenshot, unlike the browser's own confirm()).
function confirmAction(opts) {
  const dialog = document.getElementById("confirm");
  const reason = el("input", { id: "confirm-reason", name: "reason", autocomplete: "off",
                               placeholder: opts.reasonHint || "why (recorded)" });
  const input = opts.input ? el("input", { id: "confirm-input", name: "input",
                                           value: opts.input.value || "",
                                           autocomplete: "off" }) : null;
  const ok = el("button", { id: "confirm-ok", value: "ok",
                            class: opts.danger ? "danger" : "primary" }, opts.confirm);
  const form = el("form", { method: "dialog" },
    el("h2", {}, opts.title), el("p", { id: "confirm-message" }, opts.message),
    input ? el("label", {}, opts.input.label, input) : null,
    opts.reason ? el("label", {}, "Reason", reason) : null,
    el("div", { class: "dialog-verbs" },
       el("button", { id: "confirm-cancel", value: "cancel", type: "submit" }, "Cancel"), ok));
  dialog.replaceChildren(form);
  return new Promise(resolve => {
    dialog.onclose = () => resolve(dialog.returnValue === "ok"
      ? { reason: reason.value.trim(), input: input ? input.value.trim() : null } : null);
    dialog.returnValue = "";
    dialog.showModal();
    (input || (opts.reason ? reason : ok)).focus();
  });
}
