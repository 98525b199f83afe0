// Small DOM helpers: elements are built, never parsed from strings (no HTML parsing), so API data
// is always text.
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
}

export function loading(what = "Loading") {
  return h("p", { class: "loading", role: "status" }, `${what}…`);
}

export function empty(text) {
  return h("p", { class: "empty" }, text);
}

// A failed call: the problem's title, detail and code as the API gave them.
export function problem(err) {
  const p = err && err.problem;
  if (!p) return h("div", { class: "error", role: "alert" }, String(err && err.message ? err.message : err));
  return h(
    "div",
    { class: "error", role: "alert" },
    h("strong", {}, p.title || "Request failed"),
    p.status ? ` (${p.status}${p.code ? `, ${p.code}` : ""})` : "",
    p.detail ? h("p", {}, p.detail) : null,
    Array.isArray(p.errors) && p.errors.length
      ? h("ul", {}, p.errors.map((e) => h("li", {}, `${e.field || e.pointer || ""}: ${e.message || e.detail || ""}`)))
      : null,
  );
}

// Replaces the contents of `el` with what `render` builds; shows loading, then the result or the
// problem.
export async function fill(el, render, what) {
  el.replaceChildren(loading(what));
  try {
    const content = await render();
    el.replaceChildren(...[content].flat().filter(Boolean));
  } catch (err) {
    el.replaceChildren(problem(err));
  }
}

export function table(caption, columns, rows) {
  return h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      {},
      h("caption", {}, caption),
      h("thead", {}, h("tr", {}, columns.map(([label]) => h("th", { scope: "col" }, label)))),
      h("tbody", {}, rows.map((row) => h("tr", {}, columns.map(([, cell]) => h("td", {}, cell(row)))))),
    ),
  );
}

// A list the API pages with cursors: a table of the first page, then "Next"/"First" buttons.
export function paged(caption, columns, fetchPage, emptyText) {
  const box = h("div", { class: "paged" });
  const cursors = [];
  const show = async (cursor) => {
    await fill(box, async () => {
      const page = await fetchPage(cursor);
      if (!page.items.length && !cursor) return empty(emptyText);
      const nav = h("div", { class: "pager" });
      if (cursors.length) {
        nav.append(h("button", { type: "button", onclick: () => show(cursors.pop() || undefined) }, "Previous page"));
      }
      if (page.next_cursor) {
        nav.append(
          h("button", { type: "button", onclick: () => { cursors.push(cursor || ""); show(page.next_cursor); } }, "Next page"),
        );
      }
      return [table(caption, columns, page.items), nav];
    });
  };
  show(undefined);
  return box;
}

export function time(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return h("time", { datetime: iso, title: iso }, d.toISOString().replace("T", " ").slice(0, 19) + "Z");
}

export function state(value) {
  return h("span", { class: `state state-${String(value).replace(/[^a-z_]/g, "")}` }, String(value).replace(/_/g, " "));
}

export function link(href, text) {
  return h("a", { href }, text);
}

// An id's last characters: ids are UUIDv7, whose first ones are a timestamp shared by ids made
// together. The whole id is the title.
export function short(id) {
  if (!id) return "—";
  return h("abbr", { title: String(id) }, `…${String(id).slice(-8)}`);
}

export function dl(pairs) {
  return h("dl", { class: "facts" }, pairs.filter(Boolean).map(([k, v]) => [h("dt", {}, k), h("dd", {}, v ?? "—")]));
}

export function json(value) {
  return h("pre", { class: "json" }, JSON.stringify(value, null, 2));
}

// A modal confirmation (the native <dialog>: focus trapped, Escape cancels).
export function confirm(question, action) {
  return new Promise((resolve) => {
    const dialog = h(
      "dialog",
      { "aria-labelledby": "confirm-title" },
      h("form", { method: "dialog" },
        h("h2", { id: "confirm-title" }, question),
        h("div", { class: "actions" },
          h("button", { value: "cancel", type: "submit" }, "Cancel"),
          h("button", { value: "ok", type: "submit", class: "danger" }, action))),
    );
    dialog.addEventListener("close", () => {
      resolve(dialog.returnValue === "ok");
      dialog.remove();
    });
    document.body.append(dialog);
    dialog.showModal();
  });
}
