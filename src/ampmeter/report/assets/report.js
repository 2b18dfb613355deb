"use strict";
// Builds the call trees from the inline JSON blob. Every piece of log data goes through
// textContent (never innerHTML), so markup in a name or value is shown as text, never run.
(function () {
  var blob = document.getElementById("amp-data");
  var data = JSON.parse(blob.textContent);
  var CHUNK = 200;
  // node = [span_id, parent_index, kind, name, status, model, tokens_in, tokens_out,
  //         cost_usd, unpriced, latency_ms, retries, stop_reason, error_class]
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
  var runs = document.querySelectorAll("details.run");
  for (var r = 0; r < runs.length; r++) {
    (function (details) {
      var run = data.runs[Number(details.getAttribute("data-run"))];
      var done = false;
      details.addEventListener("toggle", function () {
        if (!details.open || done) return;
        done = true;
        childrenOf(run);
        var ul = el("ul", "tree top");
        renderList(run, run._top, ul);
        details.appendChild(ul);
      });
    })(runs[r]);
  }
  document.documentElement.setAttribute("data-ready", "1");
})();
