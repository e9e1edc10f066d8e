// af1's interactive report: draws each figure from the JSON beside it (plotly.js is embedded in the page), lists a
// clicked sweep cell's problems under its grid, and sorts tables marked "sortable" by a header click. No request
// leaves the page.
(function () {
  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }

  function fixed(v, digits) {
    return v === null || v === undefined ? "-" : Number(v).toFixed(digits === undefined ? 3 : digits);
  }

  // a sweep cell's problems: input, answer, right or wrong under the cell (from its correctness bits)
  function showCell(box, det, w, k) {
    var key = w + "," + k;
    var bits = det.cells[key];
    var out = box.querySelector(".af1-detail");
    if (bits === undefined) {
      out.innerHTML = '<p class="note">L_wait ' + w + ", L_transfer " + k + ": no cell here.</p>";
      return;
    }
    var r = det.rates[key] || {};
    var ci = r.ci || [null, null];
    var right = 0;
    var rows = "";
    for (var i = 0; i < det.problems.length; i++) {
      var p = det.problems[i];
      var ok = bits.charAt(i) === "1";
      if (ok) right++;
      rows +=
        "<tr><td>" + (i + 1) + '</td><td class="input">' + esc(p.input) + "</td><td>" + esc(p.answer) +
        '</td><td class="' + (ok ? "right" : "wrong") + '">' + (ok ? "right" : "wrong") + "</td></tr>";
    }
    out.innerHTML =
      "<h4>L_wait " + w + ", L_transfer " + k + "</h4>" +
      "<p>faithfulness " + fixed(r.value) + " [" + fixed(ci[0], 2) + ", " + fixed(ci[1], 2) + "], n " +
      det.problems.length + " (" + right + " right), constant guess " + fixed(det.baseline) + ", executor " +
      esc(det.executors[key] || "-") + ". Prediction under this cell: not stored: " + esc(det.no_prediction) +
      ".</p>" +
      '<div class="scroll"><table class="problems"><tr><th>#</th><th>input</th><th>answer</th>' +
      "<th>under this cell</th></tr>" + rows + "</table></div>";
  }

  function draw(box) {
    var spec = JSON.parse(box.querySelector('script[type="application/json"]').textContent);
    var area = box.querySelector(".af1-plot-area");
    // the camera button saves the figure as SVG, from the same declaration (a paper's static copy)
    Plotly.newPlot(area, spec.data, spec.layout, {
      responsive: true, displaylogo: false, toImageButtonOptions: { format: "svg", filename: spec.name || "af1-figure" },
    });
    if (spec.detail && spec.detail.kind === "cells") {
      var shapes = (spec.layout.shapes || []).slice();
      area.on("plotly_click", function (ev) {
        var p = ev.points[0];
        var w = Math.round(p.y);
        var k = Math.round(p.x);
        showCell(box, spec.detail, w, k);
        var picked = { type: "rect", x0: k - 0.5, x1: k + 0.5, y0: w - 0.5, y1: w + 0.5, line: { color: "white", width: 3 } };
        Plotly.relayout(area, { shapes: shapes.concat([picked]) });  // the clicked cell, outlined
      });
    }
  }

  // numbers (a rate's leading value, "0.816 [0.69, 0.90]") sort as numbers and before text
  function sortKey(td) {
    var t = td.textContent.trim();
    var m = /^-?\d+(\.\d+)?(e-?\d+)?/i.exec(t);
    return m ? [0, parseFloat(m[0])] : [1, t.toLowerCase()];
  }

  function sortable(table) {
    var heads = table.rows[0].cells;
    Array.prototype.forEach.call(heads, function (th, c) {
      th.addEventListener("click", function () {
        var rows = Array.prototype.slice.call(table.rows, 1);
        var up = table.getAttribute("data-sorted") !== c + "+";
        rows.sort(function (a, b) {
          var x = sortKey(a.cells[c]);
          var y = sortKey(b.cells[c]);
          if (x[0] !== y[0]) return x[0] - y[0];
          var d = x[1] < y[1] ? -1 : x[1] > y[1] ? 1 : 0;
          return up ? d : -d;
        });
        table.setAttribute("data-sorted", c + (up ? "+" : "-"));
        var body = rows.length ? rows[0].parentNode : table;
        rows.forEach(function (row) {
          body.appendChild(row);
        });
      });
    });
  }

  // plotly.js travels gzipped in the page (half the size): unpacked here, run once, then the figures drawn
  function unpackPlotly() {
    var packed = document.getElementById("af1-plotly");
    if (!packed || window.Plotly) return Promise.resolve();
    var raw = atob(packed.textContent);
    var bytes = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Response(stream).text().then(function (code) {
      var script = document.createElement("script");
      script.text = code;
      document.head.appendChild(script);
    });
  }

  function boot() {
    Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), sortable);
    unpackPlotly().then(function () {
      if (window.Plotly) Array.prototype.forEach.call(document.querySelectorAll("div.af1-plot"), draw);
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot);
  else boot();
})();
