// The attention heatmap of nmt, shared by the attention explorer (nmt/viz/explorer.html) and
// the server's page (nmt/serve/page.html): both inline this file into their own script.
// A matrix is {rows: [[weight, ...], ...], queries: [{label}], keys: [{label}]}: one row per
// query (an output piece), one column per key (a source piece).
var NMTHeatmap = (function () {
  "use strict";
  var shadeRgb = null;

  function clear(el) { while (el.firstChild) el.removeChild(el.firstChild); }
  function fmt(x) { return x.toFixed(3); }

  function getShade() {  // the colour of a weight of 1: the page's --shade (r, g, b)
    if (!shadeRgb) shadeRgb = getComputedStyle(document.documentElement).getPropertyValue("--shade").trim();
    return shadeRgb;
  }
  function shade(x) { return "rgba(" + getShade() + ", " + Math.min(1, Math.max(0, x)).toFixed(4) + ")"; }

  function pieceNode(text) {  // the piece with its word marker U+2581 dimmed
    var span = document.createElement("span");
    span.className = "piece";
    text.split("\u2581").forEach(function (part, i) {
      if (i > 0) {
        var m = document.createElement("span");
        m.className = "marker";
        m.textContent = "\u2581";
        span.appendChild(m);
      }
      if (part) span.appendChild(document.createTextNode(part));
    });
    return span;
  }

  // A heatmap drawn into a <table>: hovering or focusing a cell selects it, arrow keys move the
  // selection, and onSelect(q, k, matrix) hears of every selection.
  function Heatmap(table, onSelect) {
    var self = this;
    this.table = table;
    this.onSelect = onSelect;
    this.m = null;
    this.cell = [0, 0];
    function cellIndex(target) {
      var td = target.closest ? target.closest("td[data-q]") : null;
      return td ? [Number(td.dataset.q), Number(td.dataset.k)] : null;
    }
    table.addEventListener("mouseover", function (e) {
      var c = cellIndex(e.target);
      if (c) self.show(c[0], c[1], false);
    });
    table.addEventListener("focusin", function (e) {
      var c = cellIndex(e.target);
      if (c) self.show(c[0], c[1], false);
    });
    table.addEventListener("keydown", function (e) {
      if (!self.m) return;
      var q = self.cell[0], k = self.cell[1], nq = self.m.rows.length, nk = self.m.keys.length;
      var moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
      var d = moves[e.key];
      if (!d) return;
      e.preventDefault();
      self.show(Math.max(0, Math.min(nq - 1, q + d[0])), Math.max(0, Math.min(nk - 1, k + d[1])), true);
    });
  }

  // Draw matrix m (langs: [the queries' language, the keys'] for the headers' lang attribute)
  // and select the cell (q0, k0).
  Heatmap.prototype.draw = function (m, langs, q0, k0) {
    var table = this.table;
    this.m = m;
    clear(table);
    var thead = document.createElement("thead"), hr = document.createElement("tr");
    var corner = document.createElement("th");
    corner.className = "corner";
    corner.textContent = "query \\ key";
    hr.appendChild(corner);
    m.keys.forEach(function (g) {
      var th = document.createElement("th");
      th.scope = "col";
      if (langs[1]) th.lang = langs[1];
      th.appendChild(pieceNode(g.label));
      hr.appendChild(th);
    });
    thead.appendChild(hr);
    table.appendChild(thead);
    var body = document.createElement("tbody");
    m.rows.forEach(function (row, q) {
      var tr = document.createElement("tr");
      var th = document.createElement("th");
      th.scope = "row";
      if (langs[0]) th.lang = langs[0];
      th.appendChild(pieceNode(m.queries[q].label));
      tr.appendChild(th);
      for (var k = 0; k < row.length; k++) {
        var td = document.createElement("td");
        td.dataset.q = String(q);
        td.dataset.k = String(k);
        td.dataset.weight = row[k].toFixed(4);
        td.tabIndex = -1;
        td.style.backgroundColor = shade(row[k]);
        td.title = m.queries[q].label + " \u2192 " + m.keys[k].label + ": " + fmt(row[k]);
        td.setAttribute("aria-label", td.title);
        tr.appendChild(td);
      }
      body.appendChild(tr);
    });
    table.appendChild(body);
    if (m.rows.length && m.keys.length) {
      this.show(Math.min(q0, m.rows.length - 1), Math.min(k0, m.keys.length - 1), false);
    }
  };

  Heatmap.prototype.show = function (q, k, focus) {  // select cell (q, k), focus it if asked
    var table = this.table;
    var old = table.querySelectorAll("th.hl, tr.current");
    for (var i = 0; i < old.length; i++) old[i].classList.remove("hl", "current");
    var prev = table.querySelector('td[tabindex="0"]');
    if (prev) prev.tabIndex = -1;
    var td = table.querySelector('td[data-q="' + q + '"][data-k="' + k + '"]');
    td.tabIndex = 0;
    table.tHead.rows[0].cells[k + 1].classList.add("hl");
    var tr = table.tBodies[0].rows[q];
    tr.cells[0].classList.add("hl");
    tr.classList.add("current");
    this.cell = [q, k];
    if (focus) td.focus();
    if (this.onSelect) this.onSelect(q, k, this.m);
  };

  return { Heatmap: Heatmap, pieceNode: pieceNode, shade: shade, clear: clear, fmt: fmt };
})();
