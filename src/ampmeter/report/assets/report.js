"use strict";
// Draws each open run's timeline and call tree from the inline JSON blob, pages long lists,
// sorts the runs table, shortens labels that do not fit their room, and shows the tooltip of
// whatever mark is under the pointer. Every piece of log data goes through textContent (never
// innerHTML), so markup in a name or value is shown as text, never run.
(function () {
  var data = JSON.parse(document.getElementById("amp-data").textContent);
  var CHUNK = 200, TIMELINE_ROWS = 300, SVG = "http://www.w3.org/2000/svg";
  // node = [span_id, parent_index, kind, name, status, model, tokens_in, tokens_out,
  //         cost_usd, unpriced, latency_ms, retries, stop_reason, error_class, end_ms, depth,
  //         rollup], rollup = null or what the node's inner calls used with it:
  //         [tokens_in, tokens_out, priced cost_usd, unpriced calls]
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function svg(tag, attrs, text) {
    var e = document.createElementNS(SVG, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = String(text);
    return e;
  }
  // Numbers as every ampmeter view shows them: money to the nano-dollar with at least two
  // decimals ($0.00, $0.00001298, $1,234.50), counts and milliseconds with separators.
  function count(v) { return Number(v).toLocaleString("en-US", {maximumFractionDigits: 0}); }
  function dollars(v) {
    var text = Math.abs(Number(v)).toFixed(9).replace(/0+$/, ""), dot = text.indexOf(".");
    var frac = text.slice(dot + 1);
    while (frac.length < 2) frac += "0";
    return (Number(v) < 0 ? "-" : "") + "$" + count(text.slice(0, dot)) + "." + frac;
  }
  function money(v, unpriced) { return unpriced ? "unpriced" : dollars(v); }
  function millis(v) { return count(v) + " ms"; }

  // -- tooltips: any element with data-tip, under the pointer --------------------------------
  var tip = document.getElementById("tip");
  function showTip(target, x, y) {
    tip.textContent = target.getAttribute("data-tip");
    tip.hidden = false;
    var w = tip.offsetWidth, h = tip.offsetHeight;
    var left = Math.min(x + 12, window.innerWidth - w - 8), top = y + 16;
    if (top + h > window.innerHeight - 4) top = y - h - 10;
    tip.style.left = Math.max(4, left) + "px";
    tip.style.top = Math.max(4, top) + "px";
  }
  document.addEventListener("pointermove", function (e) {
    var target = e.target.closest ? e.target.closest("[data-tip]") : null;
    if (target) showTip(target, e.clientX, e.clientY); else tip.hidden = true;
  });
  document.addEventListener("pointerleave", function () { tip.hidden = true; });

  // -- labels: a text with data-fit is shortened (binary search) until it fits its room ------
  function fit(text) {
    var room = Number(text.getAttribute("data-fit"));
    var full = text.getAttribute("data-full") || text.textContent;
    if (!room || text.getComputedTextLength() <= room) return;
    text.setAttribute("data-full", full);
    if (!text.closest("[data-tip]")) text.setAttribute("data-tip", full);
    var lo = 0, hi = full.length;
    while (lo < hi) {
      var mid = Math.ceil((lo + hi) / 2);
      text.textContent = full.slice(0, mid) + "…";
      if (text.getComputedTextLength() <= room) lo = mid; else hi = mid - 1;
    }
    text.textContent = full.slice(0, lo) + "…";
  }
  function fitAll(root) { root.querySelectorAll("text[data-fit]").forEach(fit); }

  // -- the call tree ---------------------------------------------------------------------------
  function childrenOf(run) {
    if (run._children) return run._children;
    var kids = {}, top = [];
    for (var i = 0; i < run.nodes.length; i++) {
      var p = run.nodes[i][1];
      if (p < 0) top.push(i); else (kids[p] = kids[p] || []).push(i);
    }
    run._children = kids; run._top = top;
    return kids;
  }
  function row(run, i) {
    var n = run.nodes[i], li = el("li"), div = el("div", "node " + n[4]);
    div.setAttribute("data-span", n[0]);
    var kids = childrenOf(run)[i] || [];
    var toggle = el("button", "toggle", kids.length ? "+" : "·");
    toggle.type = "button";
    toggle.disabled = kids.length === 0;
    toggle.setAttribute("aria-expanded", "false");
    div.appendChild(toggle);
    div.appendChild(el("span", "kind", n[2]));
    div.appendChild(el("span", "name", n[3]));
    div.appendChild(el("span", "badge " + n[4], n[4]));
    if (n[5]) div.appendChild(el("span", "field model", n[5]));
    var all = n[16];
    if (all) {  // a sub-agent or step: what it used with its inner calls
      var unpriced = all[3] ? " + " + all[3] + " unpriced" : "";
      div.appendChild(el("span", "field rollup", "with its calls: tokens " + count(all[0]) +
        " / " + count(all[1]) + " · " + dollars(all[2]) + unpriced));
    } else {
      div.appendChild(el("span", "field", "tokens " + count(n[6]) + " / " + count(n[7])));
      div.appendChild(el("span", "field", money(n[8], n[9])));
    }
    if (n[10] !== null) div.appendChild(el("span", "field", millis(n[10])));
    if (n[11]) div.appendChild(el("span", "field", "retries " + n[11]));
    if (n[12]) div.appendChild(el("span", "field stop", "stop: " + n[12]));
    if (n[13]) div.appendChild(el("span", "field error", "error: " + n[13]));
    if (kids.length) div.appendChild(el("span", "muted", "(" + kids.length + ")"));
    li.appendChild(div);
    var sub = null;
    toggle.addEventListener("click", function () {
      if (sub === null) {
        sub = el("ul", "tree");
        renderList(run, kids, sub);
        li.appendChild(sub);
      } else {
        sub.hidden = !sub.hidden;
      }
      var open = !sub.hidden;
      toggle.textContent = open ? "-" : "+";
      toggle.setAttribute("aria-expanded", open ? "true" : "false");
    });
    return li;
  }
  function renderList(run, ids, ul) {
    var shown = 0, more = null;
    function next() {
      var end = Math.min(ids.length, shown + CHUNK), frag = document.createDocumentFragment();
      for (; shown < end; shown++) frag.appendChild(row(run, ids[shown]));
      ul.appendChild(frag);
      if (more) { more.remove(); more = null; }
      if (shown < ids.length) {
        more = el("button", "more", "show " + Math.min(CHUNK, ids.length - shown) + " more of " + (ids.length - shown));
        more.type = "button";
        more.addEventListener("click", next);
        ul.appendChild(more);
      }
    }
    next();
  }

  // -- the timeline ----------------------------------------------------------------------------
  // One row per call from its start (end - latency) to its end, in start order, coloured by
  // status. The figure has three columns that never share space: call names on the left, the
  // bars in the middle, and the reasons of stopped calls on the right, in the stopped call's
  // row; each label is shortened to its column. Time ticks are spaced by their widest label.
  function niceStep(raw) {
    var mag = Math.pow(10, Math.floor(Math.log10(raw || 1)));
    var steps = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < steps.length; i++) if (steps[i] * mag >= raw) return steps[i] * mag;
    return 10 * mag;
  }
  // A tick's label in ms under two seconds, else in s, with the decimals its step needs (so
  // no two ticks read alike).
  function tickLabel(v, step, ms) {
    var scale = ms ? 1000 : 1, st = step * scale, d = 0;
    while (d < 6 && Math.abs(Number(st.toFixed(d)) - st) > st * 1e-6) d++;
    return (v * scale).toFixed(d) + (ms ? " ms" : " s");
  }
  function timeline(run, box) {
    var calls = [];
    for (var i = 0; i < run.nodes.length; i++) {
      var n = run.nodes[i];
      if (n[14] === null || n[14] === undefined) continue;
      calls.push({i: i, end: n[14], start: n[14] - (n[10] || 0)});
    }
    if (!calls.length) { box.appendChild(el("p", "muted", "No call in this run has a timestamp.")); return; }
    // By start; a call that starts with the one it runs in (a sub-agent and its first call,
    // in the same millisecond) comes after it: the shallower first.
    calls.sort(function (a, b) {
      return a.start - b.start || (run.nodes[a.i][15] || 1) - (run.nodes[b.i][15] || 1) || a.i - b.i;
    });
    var hidden = Math.max(0, calls.length - TIMELINE_ROWS);
    calls = calls.slice(0, TIMELINE_ROWS);
    var t0 = Infinity, t1 = -Infinity, stops = 0;
    calls.forEach(function (c) {
      t0 = Math.min(t0, c.start); t1 = Math.max(t1, c.end);
      if (run.nodes[c.i][4] === "halt") stops++;
    });
    var span = Math.max(t1 - t0, 1), W = Math.max(600, Math.floor(box.clientWidth || 1000));
    var LEFT = Math.min(230, Math.round(W * 0.24)), STOPS = stops ? Math.min(320, Math.round(W * 0.3)) : 0;
    var PLOT_END = W - STOPS - 14, ROW = 18, TOP = 22, H = TOP + calls.length * ROW + 6;
    var x = function (t) { return LEFT + (t - t0) / span * (PLOT_END - LEFT); };
    var root = svg("svg", {viewBox: "0 0 " + W + " " + H, width: W, height: H, role: "img",
                           "aria-label": "timeline of " + calls.length + " calls", "class": "gantt"});
    box.appendChild(root);
    // ticks: as many as fit with the widest label and a gap between neighbours
    var ms = span < 2000;
    var probe = svg("text", {x: 0, y: 0, "class": "tick"}, tickLabel(span / 1000, span / 1e7, ms));
    root.appendChild(probe);
    var labelW = probe.getComputedTextLength() + 16;
    probe.remove();
    var step = niceStep((span / 1000) / Math.max(1, Math.floor((PLOT_END - LEFT) / labelW)));
    for (var k = 0; k * step <= span / 1000 + 1e-9; k++) {
      var gx = x(t0 + k * step * 1000);
      root.appendChild(svg("line", {x1: gx, x2: gx, y1: TOP - 4, y2: H, "class": "grid"}));
      root.appendChild(svg("text", {x: gx, y: 12, "class": "tick"}, tickLabel(k * step, step, ms)));
    }
    if (STOPS) root.appendChild(svg("text", {x: PLOT_END + 12, y: 12, "class": "stop-head"}, "stopped because"));
    calls.forEach(function (c, r) {
      var n = run.nodes[c.i], y = TOP + r * ROW, halted = n[4] === "halt";
      var used = n[16] ? ", with its calls: tokens " + count(n[16][0]) + "/" + count(n[16][1]) + ", " + dollars(n[16][2])
                       : ", tokens " + count(n[6]) + "/" + count(n[7]) + ", " + money(n[8], n[9]);
      var what = n[2] + " " + n[3] + ": " + millis(n[10] || 0) + ", " + n[4] + (n[5] ? ", " + n[5] : "") + used;
      if (halted) {
        root.appendChild(svg("rect", {x: 0, y: y, width: W, height: ROW, "class": "halt-row"}));
      }
      var indent = Math.min(5, Math.max(0, (n[15] || 1) - 1)) * 10;
      root.appendChild(svg("text", {x: 4 + indent, y: y + 13, "class": "label", "data-fit": LEFT - 12 - indent,
                                    "data-tip": what}, n[2] + " " + n[3]));
      // A call stopped before it ran has no duration: only its mark is drawn. A call that was
      // running when a limit stopped it (a sub-agent) keeps its bar as well.
      if (!halted || n[10] > 0) {
        root.appendChild(svg("rect", {x: x(c.start), y: y + 3, width: Math.max(2, x(c.end) - x(c.start)),
                                      height: ROW - 6, "class": "bar " + n[4] + " " + n[2], "data-tip": what}));
      }
      if (halted) {
        var hx = x(c.end), reason = n[12] || "stopped";
        root.appendChild(svg("line", {x1: hx, x2: hx, y1: TOP - 4, y2: H, "class": "stop-line"}));
        root.appendChild(svg("path", {d: "M" + (hx - 6) + " " + (y + 2) + " L" + (hx + 6) + " " + (y + 2) + " L" + hx + " " + (y + 15) + " Z",
                                      "class": "stop-mark", "data-tip": n[3] + " stopped: " + reason}));
        root.appendChild(svg("text", {x: PLOT_END + 12, y: y + 13, "class": "stop-text", "data-fit": STOPS - 16,
                                      "data-tip": n[3] + " stopped: " + reason}, reason));
      }
    });
    fitAll(root);
    // a last check that neighbouring tick labels keep apart (fonts differ from the estimate)
    var ticks = root.querySelectorAll("text.tick"), last = -Infinity;
    ticks.forEach(function (t) {
      var b = t.getBBox();
      if (b.x < last + 4 || b.x + b.width > PLOT_END + 10) t.remove(); else last = b.x + b.width;
    });
    if (hidden) box.appendChild(el("p", "muted", "The first " + TIMELINE_ROWS + " calls are drawn; " + hidden + " later ones are not."));
  }

  // -- filters: the matching calls as a flat list; clearing shows the tree again ---------------
  function filters(run, details, tree) {
    var text = details.querySelector(".filter-text"), status = details.querySelector(".filter-status");
    var model = details.querySelector(".filter-model"), count = details.querySelector(".filter-count");
    var models = {};
    run.nodes.forEach(function (n) { if (n[5]) models[n[5]] = true; });
    Object.keys(models).sort().forEach(function (m) { var o = el("option", null, m); o.value = m; model.appendChild(o); });
    var results = null;
    function apply() {
      var q = text.value.trim().toLowerCase(), st = status.value, md = model.value;
      if (results) { results.remove(); results = null; }
      if (!q && !st && !md) { tree.hidden = false; count.textContent = ""; return; }
      var hits = [];
      for (var i = 0; i < run.nodes.length; i++) {
        var n = run.nodes[i];
        if (st && n[4] !== st) continue;
        if (md && n[5] !== md) continue;
        if (q && String(n[3]).toLowerCase().indexOf(q) < 0 && String(n[5]).toLowerCase().indexOf(q) < 0) continue;
        hits.push(i);
      }
      tree.hidden = true;
      count.textContent = hits.length + " of " + run.nodes.length + " calls match";
      results = el("ul", "tree top results");
      renderList(run, hits, results);
      details.appendChild(results);
    }
    text.addEventListener("input", apply);
    status.addEventListener("change", apply);
    model.addEventListener("change", apply);
  }
  function build(details) {
    if (details._built || !details.hasAttribute("data-run")) return;
    details._built = true;
    var run = data.runs[Number(details.getAttribute("data-run"))];
    childrenOf(run);
    timeline(run, details.querySelector(".timeline"));
    var ul = el("ul", "tree top");
    renderList(run, run._top, ul);
    details.appendChild(ul);
    filters(run, details, ul);
  }
  document.querySelectorAll("details.run").forEach(function (details) {
    details.addEventListener("toggle", function () { if (details.open) build(details); });
    if (details.open) build(details);
  });

  // -- pages: a .paged box shows data-page of its items at a time ------------------------------
  function pager(box) {
    var size = Number(box.getAttribute("data-page")), nav = box.querySelector("nav.pager");
    var page = 0;
    function items() { return box.querySelectorAll(box.getAttribute("data-items")); }
    function show(p) {
      var all = items(), pages = Math.max(1, Math.ceil(all.length / size));
      page = Math.max(0, Math.min(p, pages - 1));
      all.forEach(function (item, i) { item.hidden = Math.floor(i / size) !== page; });
      nav.textContent = "";
      if (pages < 2) return;
      var prev = el("button", "prev", "‹ previous"), next = el("button", "next", "next ›");
      prev.type = next.type = "button";
      prev.disabled = page === 0; next.disabled = page === pages - 1;
      prev.addEventListener("click", function () { show(page - 1); });
      next.addEventListener("click", function () { show(page + 1); });
      var first = page * size + 1, last = Math.min(all.length, first + size - 1);
      nav.appendChild(prev);
      nav.appendChild(el("span", "where", "page " + (page + 1) + " of " + pages + " (" + first + "–" + last + " of " + all.length + ")"));
      nav.appendChild(next);
    }
    box._show = show;
    box._pageOf = function (item) {
      return Math.floor(Array.prototype.indexOf.call(items(), item) / size);
    };
    show(0);
  }
  document.querySelectorAll(".paged").forEach(pager);
  // A run's id in the table opens its panel (on its page).
  function openRun(id) {
    var details = document.getElementById(id);
    if (!details) return;
    var box = details.closest(".paged");
    if (box) box._show(box._pageOf(details));
    details.open = true;
    build(details);
    details.scrollIntoView();
  }
  document.addEventListener("click", function (e) {
    var a = e.target.closest ? e.target.closest("a.open-run") : null;
    if (!a) return;
    e.preventDefault();
    openRun(a.getAttribute("href").slice(1));
  });

  // -- the runs table sorts by a column (click or Enter on its header), then pages again ------
  var table = document.querySelector("table.summary");
  if (table) {
    var heads = table.querySelectorAll("thead th");
    heads.forEach(function (th, col) {
      function sort() {
        var asc = th.getAttribute("aria-sort") !== "ascending";
        heads.forEach(function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", asc ? "ascending" : "descending");
        var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
        var num = th.getAttribute("data-sort") === "num";
        function key(tr) {
          var td = tr.cells[col];
          if (!num) return td.textContent;
          var v = parseFloat(td.getAttribute("data-v"));
          return isNaN(v) ? -Infinity : v;
        }
        rows.sort(function (a, b) {
          var ka = key(a), kb = key(b);
          var c = num ? ka - kb : String(ka).localeCompare(String(kb));
          return asc ? c : -c;
        });
        rows.forEach(function (tr) { body.appendChild(tr); });
        table.closest(".paged")._show(0);
      }
      th.addEventListener("click", sort);
      th.addEventListener("keydown", function (e) { if (e.key === "Enter") sort(); });
    });
  }
  fitAll(document);
  document.documentElement.setAttribute("data-ready", "1");
})();
