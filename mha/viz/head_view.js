/* The interactive part of mha.plot.head_view.
 *
 * This file is one function expression. Python inlines it into each output's script element as
 *     (function (key) { ... })("content hash");
 * next to a JSON script element (class mha-hv-data) holding the weights in thousandths. Never write the
 * HTML end tag of a script element in this file: it would end the inlined script early.
 * It defines no globals and loads nothing. Each view keeps its API on its root element as
 * `root.mhaHeadView` (select, toggleHead, setLayer, svgText, pngDataURL), which the browser test uses.
 */
(function (key) {
  "use strict";
  var SVGNS = "http://www.w3.org/2000/svg";
  var FONT = 13; // px; tokens are drawn in a monospace font, so their width is known without measuring
  var CHAR = 0.62 * FONT;
  var ROW = 22;
  var HEADER = 28;
  var CELL = 7; // one cell per head beside each token
  var CELL_H = 14;
  var PAD = 8;
  var GAP = 6;
  var LINES_W = 170;
  var MONO = "ui-monospace, SFMono-Regular, Menlo, Consolas, 'DejaVu Sans Mono', monospace";

  function svg(parent, name, attrs, text) {
    var e = document.createElementNS(SVGNS, name);
    for (var a in attrs) e.setAttribute(a, attrs[a]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }

  function html(parent, name, attrs, text) {
    var e = document.createElement(name);
    for (var a in attrs) e.setAttribute(a, attrs[a]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }

  function quote(s) {
    return "\u201c" + s + "\u201d";
  }

  function createView(root) {
    var data = JSON.parse(root.querySelector("script.mha-hv-data").textContent);
    var queries = data.queries, keys = data.keys, layers = data.layers, colors = data.colors;
    var scale = data.scale;
    var h = layers[0].w.length, T = queries.length, S = keys.length;
    var state = { layer: 0, visible: [], pinned: null, hover: null };
    for (var k = 0; k < h; k++) state.visible.push(true);

    var app = root.querySelector(".mha-hv-app");

    // --- controls ---------------------------------------------------------------------------------------
    var bar = html(app, "div", { class: "mha-hv-bar" });
    var layerSelect = null;
    if (layers.length > 1) {
      var label = html(bar, "label", { class: "mha-hv-layer" }, "layer ");
      layerSelect = html(label, "select", { "aria-label": "layer" });
      layers.forEach(function (layer, i) {
        html(layerSelect, "option", { value: String(i) }, layer.name);
      });
      layerSelect.addEventListener("change", function () {
        setLayer(Number(layerSelect.value));
      });
    }
    var headBox = html(bar, "span", { class: "mha-hv-heads", role: "group", "aria-label": "heads" });
    html(headBox, "span", { class: "mha-hv-label" }, "heads");
    var headButtons = [];
    for (k = 0; k < h; k++) {
      var b = html(headBox, "button", {
        type: "button", class: "mha-hv-head", "data-head": String(k), "aria-pressed": "true",
        title: "show or hide head " + k,
      });
      html(b, "span", { class: "mha-hv-swatch", style: "background:" + colors[k] });
      b.appendChild(document.createTextNode(String(k)));
      b.addEventListener("click", toggleHead.bind(null, k));
      headButtons.push(b);
    }
    var allButton = html(bar, "button", { type: "button", class: "mha-hv-all", title: "show every head" }, "all");
    allButton.addEventListener("click", function () {
      for (var k = 0; k < h; k++) state.visible[k] = true;
      render();
    });
    html(bar, "span", { class: "mha-hv-spacer" });
    var svgButton = html(bar, "button", { type: "button", class: "mha-hv-export", title: "download this view as SVG" }, "SVG");
    var pngButton = html(bar, "button", { type: "button", class: "mha-hv-export", title: "download this view as PNG" }, "PNG");
    svgButton.addEventListener("click", function () {
      download(new Blob([svgText()], { type: "image/svg+xml" }), "svg");
    });
    pngButton.addEventListener("click", function () {
      pngDataURL().then(function (url) {
        download(url, "png");
      });
    });

    // --- the picture ------------------------------------------------------------------------------------
    var longest = 1;
    queries.concat(keys).forEach(function (t) {
      longest = Math.max(longest, t.length);
    });
    var tokW = Math.ceil(longest * CHAR) + 10;
    var cellsW = h * (CELL + 1);
    var xq = PAD + cellsW + GAP; // left edge of the query tokens
    var xk = xq + tokW + 2 * GAP + LINES_W; // left edge of the key tokens
    var width = xk + tokW + GAP + cellsW + PAD;
    var height = HEADER + Math.max(T, S) * ROW + PAD;
    var root_svg = svg(app, "svg", {
      class: "mha-hv-svg", xmlns: SVGNS, width: width, height: height, viewBox: "0 0 " + width + " " + height,
      "font-family": MONO, "font-size": FONT, role: "img",
    });
    svg(root_svg, "text", { x: PAD, y: 16, fill: "currentColor", "font-size": 11 }, "query (from)");
    svg(root_svg, "text", { x: xk, y: 16, fill: "currentColor", "font-size": 11 }, "key (to)");
    var layerTitle = svg(root_svg, "text", { x: (xq + tokW + xk) / 2, y: 16, "text-anchor": "middle", fill: "currentColor", "font-size": 11 });
    var linesGroup = svg(root_svg, "g", { class: "mha-hv-lines", "stroke-width": 2 });

    function y(i) {
      return HEADER + i * ROW + ROW / 2;
    }

    function makeTokens(side, labels) {
      var query = side === "q";
      return labels.map(function (text, i) {
        var g = svg(root_svg, "g", { class: "mha-hv-tok", "data-side": side, "data-index": i, tabindex: 0 });
        var x = query ? xq : xk;
        // An invisible rect over the token and its cells, so the whole row answers the mouse.
        svg(g, "rect", {
          class: "mha-hv-hit", x: query ? PAD : xk, y: y(i) - ROW / 2, width: cellsW + GAP + tokW, height: ROW,
          fill: "none", "pointer-events": "all",
        });
        var bg = svg(g, "rect", {
          class: "mha-hv-bg", x: x, y: y(i) - ROW / 2 + 2, width: tokW, height: ROW - 4, rx: 3,
          fill: "#888888", "fill-opacity": 0, stroke: "currentColor", "stroke-opacity": 0,
        });
        var t = svg(g, "text", {
          x: query ? x + tokW - 5 : x + 5, y: y(i), "dominant-baseline": "central",
          "text-anchor": query ? "end" : "start", fill: "currentColor", style: "white-space:pre",
        }, text);
        var cells = [];
        for (var k = 0; k < h; k++) {
          var cx = query ? PAD + k * (CELL + 1) : xk + tokW + GAP + k * (CELL + 1);
          cells.push(svg(g, "rect", {
            class: "mha-hv-cell", "data-head": k, x: cx, y: y(i) - CELL_H / 2, width: CELL, height: CELL_H,
            fill: colors[k], "fill-opacity": 0,
          }));
        }
        var title = svg(g, "title", {}, text);
        var here = { side: side, index: i };
        g.addEventListener("mouseenter", function () { state.hover = here; render(); });
        g.addEventListener("mouseleave", function () { state.hover = null; render(); });
        g.addEventListener("focus", function () { state.hover = here; render(); });
        g.addEventListener("blur", function () { state.hover = null; render(); });
        g.addEventListener("click", function () { select(side, i); });
        g.addEventListener("keydown", function (e) {
          if (e.key === "Enter" || e.key === " ") { e.preventDefault(); select(side, i); }
        });
        return { g: g, bg: bg, text: t, cells: cells, title: title, label: text };
      });
    }
    var qTokens = makeTokens("q", queries);
    var kTokens = makeTokens("k", keys);
    var readout = html(app, "div", { class: "mha-hv-readout", "aria-live": "polite" });

    // --- behaviour --------------------------------------------------------------------------------------
    function weight(k, i, j) {
      return layers[state.layer].w[k][i][j] / scale;
    }

    function select(side, index) {
      var p = state.pinned;
      state.pinned = p && p.side === side && p.index === index ? null : { side: side, index: index };
      render();
    }

    function toggleHead(k) {
      state.visible[k] = !state.visible[k];
      render();
    }

    function setLayer(i) {
      state.layer = i;
      if (layerSelect) layerSelect.value = String(i);
      render();
    }

    // Each head's lines start and end a little above or below the row's middle, so heads that agree
    // draw side by side instead of on top of each other.
    var spread = Math.min(3, (ROW - 8) / Math.max(h, 1));
    function line(k, i, j, w) {
      var dy = (k - (h - 1) / 2) * spread;
      svg(linesGroup, "line", {
        x1: xq + tokW + GAP, y1: y(i) + dy, x2: xk - GAP, y2: y(j) + dy, stroke: colors[k], "stroke-opacity": w.toFixed(3),
      });
    }

    function describe(sel, shown) {
      if (!sel) {
        return "Hover a token to see what each head attends to from it (left) or to it (right); click to pin.";
      }
      var q = sel.side === "q";
      var own = q ? queries : keys, other = q ? keys : queries;
      var parts = shown.map(function (k) {
        var best = -1, bestW = 0, n = q ? S : T;
        for (var m = 0; m < n; m++) {
          var w = q ? weight(k, sel.index, m) : weight(k, m, sel.index);
          if (w > bestW) { best = m; bestW = w; }
        }
        var arrow = q ? " \u2192 " : " \u2190 ";
        return "head " + k + arrow + (best < 0 ? "nothing" : quote(other[best]) + " " + bestW.toFixed(2));
      });
      var lead = q ? "query " + quote(own[sel.index]) + " attends most to: "
                   : "key " + quote(own[sel.index]) + " gets most attention from: ";
      return lead + (parts.length ? parts.join(" \u00b7 ") : "no head shown");
    }

    function render() {
      var sel = state.pinned || state.hover;
      var shown = [];
      for (var k = 0; k < h; k++) {
        if (state.visible[k]) shown.push(k);
        headButtons[k].setAttribute("aria-pressed", state.visible[k] ? "true" : "false");
      }
      layerTitle.textContent = layers.length > 1 ? layers[state.layer].name : "";
      while (linesGroup.firstChild) linesGroup.removeChild(linesGroup.firstChild);
      shown.forEach(function (k) {
        for (var i = 0; i < T; i++) {
          for (var j = 0; j < S; j++) {
            var w = weight(k, i, j);
            var onPath = !sel || (sel.side === "q" ? sel.index === i : sel.index === j);
            // With a token selected, opacity is the square root of the weight, so that a weight of 0.1
            // is still seen; with none, it is the weight itself, so that the overview does not blur.
            if (onPath && w >= 0.01) line(k, i, j, sel ? Math.sqrt(w) : w);
          }
        }
      });
      // The other side's tokens light up with the weights from (or to) the selected token.
      [[qTokens, "q"], [kTokens, "k"]].forEach(function (pair) {
        pair[0].forEach(function (tok, m) {
          var isSel = !!sel && sel.side === pair[1] && sel.index === m;
          var lit = !!sel && sel.side !== pair[1];
          var sum = 0;
          for (var k = 0; k < h; k++) {
            var w = 0;
            if (lit) w = sel.side === "q" ? weight(k, sel.index, m) : weight(k, m, sel.index);
            tok.cells[k].setAttribute("fill-opacity", lit && state.visible[k] ? w.toFixed(3) : 0);
            if (state.visible[k]) sum += w;
          }
          var mean = lit && shown.length ? sum / shown.length : 0;
          tok.g.setAttribute("data-weight", mean.toFixed(3));
          tok.bg.setAttribute("fill-opacity", (0.6 * mean).toFixed(3));
          tok.bg.setAttribute("stroke-opacity", isSel ? 0.8 : 0);
          tok.text.setAttribute("font-weight", isSel ? "700" : "400");
          tok.title.textContent = tok.label + (lit ? " \u2014 mean weight " + mean.toFixed(3) : "");
        });
      });
      readout.textContent = describe(sel, shown);
    }

    // --- export -----------------------------------------------------------------------------------------
    function background() {
      for (var e = root; e && e.nodeType === 1; e = e.parentElement) {
        var c = getComputedStyle(e).backgroundColor;
        if (c && c !== "transparent" && !/^rgba\(.*,\s*0\)$/.test(c)) return c;
      }
      return "#ffffff";
    }

    function svgText() {
      var copy = root_svg.cloneNode(true);
      var fg = getComputedStyle(root).color || "#000000";
      copy.removeAttribute("class");
      copy.removeAttribute("role");
      var all = copy.querySelectorAll("*");
      for (var n = 0; n < all.length; n++) {
        ["fill", "stroke"].forEach(function (a) {
          if (all[n].getAttribute(a) === "currentColor") all[n].setAttribute(a, fg);
        });
        all[n].removeAttribute("tabindex");
      }
      var bg = document.createElementNS(SVGNS, "rect");
      bg.setAttribute("width", "100%");
      bg.setAttribute("height", "100%");
      bg.setAttribute("fill", background());
      copy.insertBefore(bg, copy.firstChild);
      return '<?xml version="1.0" encoding="UTF-8"?>\n' + new XMLSerializer().serializeToString(copy);
    }

    function pngDataURL() {
      return new Promise(function (resolve, reject) {
        var img = new Image();
        img.onload = function () {
          var canvas = document.createElement("canvas");
          canvas.width = 2 * width;
          canvas.height = 2 * height;
          var ctx = canvas.getContext("2d");
          ctx.scale(2, 2);
          ctx.drawImage(img, 0, 0);
          resolve(canvas.toDataURL("image/png"));
        };
        img.onerror = function () { reject(new Error("the SVG of the view could not be drawn")); };
        img.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(svgText());
      });
    }

    function download(what, ext) {
      var url = typeof what === "string" ? what : URL.createObjectURL(what);
      var a = html(document.body, "a", { href: url, download: "head_view_" + layers[state.layer].name.replace(/\W+/g, "_") + "." + ext });
      a.click();
      document.body.removeChild(a);
      if (typeof what !== "string") setTimeout(function () { URL.revokeObjectURL(url); }, 1000);
    }

    render();
    app.hidden = false;
    root.querySelector(".mha-hv-static").hidden = true;
    return {
      state: state, select: select, toggleHead: toggleHead, setLayer: setLayer, svgText: svgText, pngDataURL: pngDataURL,
    };
  }

  // Classic Notebook runs an output's scripts before it puts the output into the page, so the view's root
  // may not be findable yet: look again for a few seconds.
  function start() {
    var roots = document.querySelectorAll('div.mha-hv[data-mha-hv="' + key + '"]');
    for (var n = 0; n < roots.length; n++) {
      if (!roots[n].mhaHeadView) {
        try {
          roots[n].mhaHeadView = createView(roots[n]);
        } catch (err) {
          roots[n].mhaHeadView = { error: err };
          console.error("mha head view:", err);
        }
      }
    }
    return roots.length;
  }
  var tries = 0;
  (function attempt() {
    if (start() === 0 && tries++ < 100) setTimeout(attempt, 50);
  })();
})
