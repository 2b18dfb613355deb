"use strict";
// Builds the call trees, timelines and filters from the inline JSON blob, and sorts the summary
// table. Every piece of log data goes through textContent (never innerHTML), so markup in a
// name or value is shown as text, never run.
(function () {
  var blob = document.getElementById("amp-data");
  var data = JSON.parse(blob.textContent);
  var CHUNK = 200;
  // node = [span_id, parent_index, kind, name, status, model, tokens_in, tokens_out,
  //         cost_usd, unpriced, latency_ms, retries, stop_reason, error_class, end_ms, depth]
  var SVG = "http://www.w3.org/2000/svg";
  var TIMELINE_ROWS = 300;
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function money(v, unpriced) { return unpriced ? "unpriced" : "$" + Number(v).toPrecision(4); }
  function childrenOf(run) {
    if (run._children) return run._children;
    var kids = {}; var top = [];
    for (var i = 0; i < run.nodes.length; i++) {
      var p = run.nodes[i][1];
      if (p < 0) top.push(i); else (kids[p] = kids[p] || []).push(i);
    }
    run._children = kids; run._top = top;
    return kids;
  }
  function row(run, i) {
    var n = run.nodes[i];
    var li = el("li");
    var div = el("div", "node " + n[4]);
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
    div.appendChild(el("span", "field", "tokens " + n[6] + " / " + n[7]));
    div.appendChild(el("span", "field", money(n[8], n[9])));
    if (n[10] !== null) div.appendChild(el("span", "field", n[10] + " ms"));
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
    var shown = 0;
    var more = null;
    function next() {
      var end = Math.min(ids.length, shown + CHUNK);
      var frag = document.createDocumentFragment();
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
  function svg(tag, attrs, text) {
    var e = document.createElementNS(SVG, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = String(text);
    return e;
  }
  function niceStep(span) {
    var raw = span / 6, mag = Math.pow(10, Math.floor(Math.log10(raw || 1)));
    var steps = [1, 2, 5, 10];
    for (var i = 0; i < steps.length; i++) if (steps[i] * mag >= raw) return steps[i] * mag;
    return 10 * mag;
  }
  // A Gantt-style figure: one row per call from its start (end - latency) to its end, in start
  // order, coloured by status; calls a limit stopped are marked with a red line and triangle.
  function timeline(run, box) {
    var calls = [];
    for (var i = 0; i < run.nodes.length; i++) {
      var n = run.nodes[i];
      if (n[14] === null || n[14] === undefined) continue;
      calls.push({i: i, end: n[14], start: n[14] - (n[10] || 0)});
    }
    if (!calls.length) { box.appendChild(el("p", "muted", "No call in this run has a timestamp.")); return; }
    calls.sort(function (a, b) { return a.start - b.start || a.i - b.i; });
    var hidden = Math.max(0, calls.length - TIMELINE_ROWS);
    calls = calls.slice(0, TIMELINE_ROWS);
    var t0 = Infinity, t1 = -Infinity;
    calls.forEach(function (c) { t0 = Math.min(t0, c.start); t1 = Math.max(t1, c.end); });
    var span = Math.max(t1 - t0, 1), W = 1000, LEFT = 210, RIGHT = 30, ROW = 16, TOP = 22;
    var H = TOP + calls.length * ROW + 8;
    var x = function (t) { return LEFT + (t - t0) / span * (W - LEFT - RIGHT); };
    var root = svg("svg", {viewBox: "0 0 " + W + " " + H, width: "100%", role: "img",
                           "aria-label": "timeline of " + calls.length + " calls", "class": "gantt"});
    var step = niceStep(span / 1000);
    for (var s = 0; s <= span / 1000 + 1e-9; s += step) {
      var gx = x(t0 + s * 1000);
      root.appendChild(svg("line", {x1: gx, x2: gx, y1: TOP - 4, y2: H, "class": "grid"}));
      root.appendChild(svg("text", {x: gx, y: 12, "class": "tick"}, (Math.round(s * 1000) / 1000) + " s"));
    }
    calls.forEach(function (c, row) {
      var n = run.nodes[c.i], y = TOP + row * ROW;
      var label = "  ".repeat(Math.max(0, (n[15] || 1) - 1)) + n[2] + " " + n[3];
      root.appendChild(svg("text", {x: LEFT - 6, y: y + 11, "class": "label"}, label.length > 34 ? label.slice(0, 33) + "…" : label));
      var bar = svg("rect", {x: x(c.start), y: y + 2, width: Math.max(2, x(c.end) - x(c.start)), height: ROW - 5, "class": "bar " + n[4] + " " + n[2]});
      bar.appendChild(svg("title", {}, n[2] + " " + n[3] + ": " + (n[10] || 0) + " ms, " + n[4]));
      // A call stopped before it ran has no duration: only its mark is drawn. A call that was
      // running when a limit stopped it (a sub-agent) keeps its bar as well.
      if (n[4] !== "halt" || n[10] > 0) root.appendChild(bar);
      if (n[4] === "halt") {
        var hx = x(c.end);
        root.appendChild(svg("line", {x1: hx, x2: hx, y1: TOP - 4, y2: H, "class": "stop-line"}));
        var mark = svg("path", {d: "M" + (hx - 6) + " " + (y + 1) + " L" + (hx + 6) + " " + (y + 1) + " L" + hx + " " + (y + 13) + " Z", "class": "stop-mark"});
        mark.appendChild(svg("title", {}, n[3] + " stopped: " + (n[12] || "limit")));
        root.appendChild(mark);
        var onLeft = hx > W * 0.55;  // keep the reason inside the figure
        root.appendChild(svg("text", {x: onLeft ? hx - 9 : hx + 9, y: y + 11, "class": "stop-text",
                                      "text-anchor": onLeft ? "end" : "start"}, "stop: " + (n[12] || "limit")));
      }
    });
    box.appendChild(root);
    if (hidden) box.appendChild(el("p", "muted", "The first " + TIMELINE_ROWS + " calls are drawn; " + hidden + " later ones are not."));
  }
  // Filtering shows the matching calls as a flat list (each can still be opened); clearing
  // the filter shows the tree again.
  function filters(run, details, tree) {
    var text = details.querySelector(".filter-text");
    var status = details.querySelector(".filter-status");
    var model = details.querySelector(".filter-model");
    var count = details.querySelector(".filter-count");
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
  var runs = document.querySelectorAll("details.run");
  for (var r = 0; r < runs.length; r++) {
    (function (details) {
      var run = data.runs[Number(details.getAttribute("data-run"))];
      var done = false;
      details.addEventListener("toggle", function () {
        if (!details.open || done) return;
        done = true;
        childrenOf(run);
        timeline(run, details.querySelector(".timeline"));
        var ul = el("ul", "tree top");
        renderList(run, run._top, ul);
        details.appendChild(ul);
        filters(run, details, ul);
      });
    })(runs[r]);
  }
  // The summary table sorts by a column when its header is clicked (or Enter is pressed on it).
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
      }
      th.addEventListener("click", sort);
      th.addEventListener("keydown", function (e) { if (e.key === "Enter") sort(); });
    });
  }
  document.documentElement.setAttribute("data-ready", "1");
})();
