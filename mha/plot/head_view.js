/* The interactive part of mha.plot.head_view.
 *
 * This file is one function expression. Python inlines it into each output's script element as
 *     (function (key) { ... })("content hash");
 * next to a JSON script element (class mha-hv-data) holding the weights in thousandths: every one ("w", per
 * head, query and key), or in a large view each query's from a floor up ("rows", [key, weight, ...] lists;
 * see mha/plot/payload.py). Never write the HTML end tag of a script element in this file: it would end the
 * inlined script early. It defines no globals and loads nothing. Each view keeps its API on its root element as
 * `root.mhaHeadView` (select, toggleHead, setLayer, svgText, pngDataURL), which the browser test uses.
 *
 * Reading order: createView builds a `view` (the data, the state, the elements) with buildControls and
 * buildPicture; render draws the lines and lights the tokens for the current state. The export functions
 * (svgText, pngDataURL, download) are in head_view_export.js, which Python inlines where the comment
 * "mha: head_view_export.js" stands, inside this function.
 */
(function (key) {
  "use strict";
  var SVGNS = "http://www.w3.org/2000/svg";
  var FONT = 13; // px; tokens are drawn in a monospace font, so their width is known without measuring
  var CHAR = 0.62 * FONT;
  var ROW = 22, HEADER = 28, PAD = 8, GAP = 6, LINES_W = 170;
  var CELL = 7, CELL_H = 14; // one cell per head beside each token
  var MAX_LINES = 3000; // with no token selected, more lines than this are not drawn (a large view)
  var LABEL = 24; // characters of a token shown at most
  var MONO = "ui-monospace, SFMono-Regular, Menlo, Consolas, 'DejaVu Sans Mono', monospace";

  // A new SVG element (svg) or HTML element (html), with attributes and text, appended to parent.
  function element(ns, parent, name, attrs, text) {
    var e = ns ? document.createElementNS(ns, name) : document.createElement(name);
    for (var a in attrs) e.setAttribute(a, attrs[a]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  var svg = element.bind(null, SVGNS), html = element.bind(null, null);

  // A token as the view shows it, as mha/plot/labels.py shows it in the static picture: control characters
  // as their symbols ("\n" as "\u240a"), lone surrogates and C1 controls as escapes, at most LABEL
  // characters, the last "\u2026" when cut. (The data keeps the token exactly; the tooltip shows it all.)
  function label(s) {
    var out = "";
    for (var i = 0; i < s.length && out.length < 8 * LABEL; i++) {
      var c = s.charCodeAt(i);
      if ((c & 0xfc00) === 0xd800 && (s.charCodeAt(i + 1) & 0xfc00) === 0xdc00) out += s[i] + s[++i]; // a pair
      else if (c < 0x20) out += String.fromCharCode(0x2400 + c);
      else if (c === 0x7f) out += "\u2421";
      else if ((c >= 0x80 && c <= 0x9f) || (c & 0xf800) === 0xd800 || c === 0xfffe || c === 0xffff) {
        out += "\\" + (c <= 0xff ? "x" + ("0" + c.toString(16)).slice(-2) : "u" + c.toString(16));
      } else out += s[i];
    }
    var chars = Array.from(out); // code points: a surrogate pair is one character
    return chars.length <= LABEL ? out : chars.slice(0, LABEL - 1).join("") + "\u2026";
  }

  // --- building a view ------------------------------------------------------------------------------------

  function createView(root) {
    var data = JSON.parse(root.querySelector("script.mha-hv-data").textContent);
    var view = {
      root: root, queries: data.queries, keys: data.keys, layers: data.layers, colors: data.colors,
      scale: data.scale, h: data.colors.length, T: data.queries.length, S: data.keys.length,
      state: { layer: 0, visible: [], pinned: null, hover: null },
      app: root.querySelector(".mha-hv-app"),
      tables: [], // per layer, made on first use: every weight in thousandths, (h, T, S) in one Uint16Array
    };
    for (var k = 0; k < view.h; k++) view.state.visible.push(true);
    buildControls(view);
    if (data.note) html(view.app, "div", { class: "mha-hv-note" }, data.note);
    buildPicture(view);
    view.readout = html(view.app, "div", { class: "mha-hv-readout", "aria-live": "polite" });
    render(view);
    view.app.hidden = false;
    root.querySelector(".mha-hv-static").hidden = true;
    return {
      state: view.state,
      select: function (side, index) { select(view, side, index); },
      toggleHead: function (k) { toggleHead(view, k); },
      setLayer: function (i) { setLayer(view, i); },
      svgText: function () { return svgText(view); },
      pngDataURL: function () { return pngDataURL(view); },
    };
  }

  // The bar above the picture: the layer menu, one button per head, "all", and the two exports.
  function buildControls(view) {
    var bar = html(view.app, "div", { class: "mha-hv-bar" });
    view.layerSelect = null;
    if (view.layers.length > 1) {
      var menu = html(bar, "label", { class: "mha-hv-layer" }, "layer ");
      view.layerSelect = html(menu, "select", { "aria-label": "layer" });
      view.layers.forEach(function (layer, i) {
        html(view.layerSelect, "option", { value: String(i) }, label(layer.name));
      });
      view.layerSelect.addEventListener("change", function () {
        setLayer(view, Number(view.layerSelect.value));
      });
    }
    var headBox = html(bar, "span", { class: "mha-hv-heads", role: "group", "aria-label": "heads" });
    html(headBox, "span", { class: "mha-hv-label" }, "heads");
    view.headButtons = [];
    for (var k = 0; k < view.h; k++) {
      var b = html(headBox, "button", {
        type: "button", class: "mha-hv-head", "data-head": String(k), "aria-pressed": "true",
        title: "show or hide head " + k,
      });
      html(b, "span", { class: "mha-hv-swatch", style: "background:" + view.colors[k] });
      b.appendChild(document.createTextNode(String(k)));
      b.addEventListener("click", toggleHead.bind(null, view, k));
      view.headButtons.push(b);
    }
    var allButton = html(bar, "button", { type: "button", class: "mha-hv-all", title: "show every head" }, "all");
    allButton.addEventListener("click", function () {
      for (var k = 0; k < view.h; k++) view.state.visible[k] = true;
      render(view);
    });
    html(bar, "span", { class: "mha-hv-spacer" });
    var exportButton = function (what) {
      var attrs = { type: "button", class: "mha-hv-export", title: "download this view as " + what };
      return html(bar, "button", attrs, what);
    };
    var svgButton = exportButton("SVG"), pngButton = exportButton("PNG");
    svgButton.addEventListener("click", function () {
      download(view, new Blob([svgText(view)], { type: "image/svg+xml" }), "svg");
    });
    pngButton.addEventListener("click", function () {
      pngDataURL(view).then(function (url) {
        download(view, url, "png");
      });
    });
  }

  // The picture: query tokens on the left, key tokens on the right, each with one cell per head, and the
  // lines between them (drawn by render).
  function buildPicture(view) {
    var longest = 1;
    view.queries.concat(view.keys).forEach(function (t) {
      longest = Math.max(longest, Array.from(label(t)).length);
    });
    view.tokW = Math.ceil(longest * CHAR) + 10;
    view.cellsW = view.h * (CELL + 1);
    view.xq = PAD + view.cellsW + GAP; // left edge of the query tokens
    view.xk = view.xq + view.tokW + 2 * GAP + LINES_W; // left edge of the key tokens
    view.width = view.xk + view.tokW + GAP + view.cellsW + PAD;
    view.height = HEADER + Math.max(view.T, view.S) * ROW + PAD;
    var s = svg(view.app, "svg", {
      class: "mha-hv-svg", xmlns: SVGNS, width: view.width, height: view.height,
      viewBox: "0 0 " + view.width + " " + view.height, "font-family": MONO, "font-size": FONT, role: "img",
    });
    view.svg = s;
    svg(s, "text", { x: PAD, y: 16, fill: "currentColor", "font-size": 11 }, "query (from)");
    svg(s, "text", { x: view.xk, y: 16, fill: "currentColor", "font-size": 11 }, "key (to)");
    view.layerTitle = svg(s, "text", {
      x: (view.xq + view.tokW + view.xk) / 2, y: 16, "text-anchor": "middle", fill: "currentColor", "font-size": 11,
    });
    view.linesGroup = svg(s, "g", { class: "mha-hv-lines", "stroke-width": 2 });
    view.qTokens = view.queries.map(function (text, i) { return makeToken(view, "q", text, i); });
    view.kTokens = view.keys.map(function (text, i) { return makeToken(view, "k", text, i); });
  }

  function rowY(i) {
    return HEADER + i * ROW + ROW / 2;
  }

  // One token: its label, its background, one cell per head, and the mouse and keyboard handlers.
  function makeToken(view, side, text, i) {
    var query = side === "q";
    var g = svg(view.svg, "g", { class: "mha-hv-tok", "data-side": side, "data-index": i, tabindex: 0 });
    var x = query ? view.xq : view.xk;
    var y = rowY(i);
    // An invisible rect over the token and its cells, so the whole row answers the mouse.
    svg(g, "rect", {
      class: "mha-hv-hit", x: query ? PAD : view.xk, y: y - ROW / 2, width: view.cellsW + GAP + view.tokW,
      height: ROW, fill: "none", "pointer-events": "all",
    });
    var bg = svg(g, "rect", {
      class: "mha-hv-bg", x: x, y: y - ROW / 2 + 2, width: view.tokW, height: ROW - 4, rx: 3,
      fill: "#888888", "fill-opacity": 0, stroke: "currentColor", "stroke-opacity": 0,
    });
    var t = svg(g, "text", {
      x: query ? x + view.tokW - 5 : x + 5, y: y, "dominant-baseline": "central",
      "text-anchor": query ? "end" : "start", fill: "currentColor", style: "white-space:pre",
    }, label(text));
    var cells = [];
    for (var k = 0; k < view.h; k++) {
      var cx = query ? PAD + k * (CELL + 1) : view.xk + view.tokW + GAP + k * (CELL + 1);
      cells.push(svg(g, "rect", {
        class: "mha-hv-cell", "data-head": k, x: cx, y: y - CELL_H / 2, width: CELL, height: CELL_H,
        fill: view.colors[k], "fill-opacity": 0,
      }));
    }
    var title = svg(g, "title", {}, text);
    var here = { side: side, index: i };
    var hover = function (where) { return function () { view.state.hover = where; render(view); }; };
    g.addEventListener("mouseenter", hover(here));
    g.addEventListener("mouseleave", hover(null));
    g.addEventListener("focus", hover(here));
    g.addEventListener("blur", hover(null));
    g.addEventListener("click", function () { select(view, side, i); });
    g.addEventListener("keydown", function (e) {
      if (e.key === "Enter" || e.key === " ") { e.preventDefault(); select(view, side, i); }
    });
    return { g: g, bg: bg, text: t, cells: cells, title: title, label: text };
  }

  // --- state --------------------------------------------------------------------------------------------

  function weight(view, k, i, j) {
    var n = view.state.layer;
    if (!view.tables[n]) view.tables[n] = unpack(view, view.layers[n]);
    return view.tables[n][(k * view.T + i) * view.S + j] / view.scale; // exact: 10 / 1000 >= 0.01
  }

  // One layer's weights as a table: from "w" (every weight) or "rows" (the kept ones; the rest are 0).
  function unpack(view, layer) {
    var table = new Uint16Array(view.h * view.T * view.S);
    for (var k = 0; k < view.h; k++) {
      for (var i = 0; i < view.T; i++) {
        var at = (k * view.T + i) * view.S, m;
        if (layer.w) {
          for (m = 0; m < view.S; m++) table[at + m] = layer.w[k][i][m];
        } else {
          var row = layer.rows[k][i];
          for (m = 0; m < row.length; m += 2) table[at + row[m]] = row[m + 1];
        }
      }
    }
    return table;
  }

  function select(view, side, index) {
    var p = view.state.pinned;
    view.state.pinned = p && p.side === side && p.index === index ? null : { side: side, index: index };
    render(view);
  }

  function toggleHead(view, k) {
    view.state.visible[k] = !view.state.visible[k];
    render(view);
  }

  function setLayer(view, i) {
    view.state.layer = i;
    if (view.layerSelect) view.layerSelect.value = String(i);
    render(view);
  }

  // --- drawing ------------------------------------------------------------------------------------------

  function render(view) {
    var sel = view.state.pinned || view.state.hover;
    var shown = [];
    for (var k = 0; k < view.h; k++) {
      if (view.state.visible[k]) shown.push(k);
      view.headButtons[k].setAttribute("aria-pressed", view.state.visible[k] ? "true" : "false");
    }
    view.layerTitle.textContent = view.layers.length > 1 ? view.layers[view.state.layer].name : "";
    drawLines(view, sel, shown);
    lightTokens(view, sel, shown, view.qTokens, "q");
    lightTokens(view, sel, shown, view.kTokens, "k");
    writeReadout(view, describe(view, sel, shown));
  }

  // Each head's lines start and end a little above or below the row's middle, so heads that agree
  // draw side by side instead of on top of each other.
  function drawLines(view, sel, shown) {
    var group = view.linesGroup;
    while (group.firstChild) group.removeChild(group.firstChild);
    var lines = [];
    shown.forEach(function (k) {
      var iFrom = sel && sel.side === "q" ? sel.index : 0, iTo = sel && sel.side === "q" ? sel.index + 1 : view.T;
      var jFrom = sel && sel.side === "k" ? sel.index : 0, jTo = sel && sel.side === "k" ? sel.index + 1 : view.S;
      for (var i = iFrom; i < iTo; i++) {
        for (var j = jFrom; j < jTo; j++) {
          var w = weight(view, k, i, j);
          if (w >= 0.01) lines.push([k, i, j, w]);
        }
      }
    });
    view.undrawn = !sel && lines.length > MAX_LINES ? lines.length : 0;
    if (view.undrawn) return;
    var spread = Math.min(3, (ROW - 8) / Math.max(view.h, 1));
    lines.forEach(function (l) {
      var dy = (l[0] - (view.h - 1) / 2) * spread;
      // With a token selected, opacity is the square root of the weight, so that a weight of 0.1
      // is still seen; with none, it is the weight itself, so that the overview does not blur.
      svg(group, "line", {
        x1: view.xq + view.tokW + GAP, y1: rowY(l[1]) + dy, x2: view.xk - GAP, y2: rowY(l[2]) + dy,
        stroke: view.colors[l[0]], "stroke-opacity": (sel ? Math.sqrt(l[3]) : l[3]).toFixed(3),
      });
    });
  }

  // The other side's tokens light up with the weights from (or to) the selected token.
  function lightTokens(view, sel, shown, tokens, side) {
    tokens.forEach(function (tok, m) {
      var isSel = !!sel && sel.side === side && sel.index === m;
      var lit = !!sel && sel.side !== side;
      var sum = 0;
      for (var k = 0; k < view.h; k++) {
        var w = 0;
        if (lit) w = sel.side === "q" ? weight(view, k, sel.index, m) : weight(view, k, m, sel.index);
        tok.cells[k].setAttribute("fill-opacity", lit && view.state.visible[k] ? w.toFixed(3) : 0);
        if (view.state.visible[k]) sum += w;
      }
      var mean = lit && shown.length ? sum / shown.length : 0;
      tok.g.setAttribute("data-weight", mean.toFixed(3));
      tok.bg.setAttribute("fill-opacity", (0.6 * mean).toFixed(3));
      tok.bg.setAttribute("stroke-opacity", isSel ? 0.8 : 0);
      tok.text.setAttribute("font-weight", isSel ? "700" : "400");
      tok.title.textContent = tok.label + (lit ? " \u2014 mean weight " + mean.toFixed(3) : "");
    });
  }

  // The sentence under the picture, as pieces: strings, and tokens ({ token: ... }) that writeReadout puts
  // in <bdi> elements, so that right-to-left text in a token cannot reorder the rest of the sentence.
  function describe(view, sel, shown) {
    if (!sel) {
      // A touch screen cannot hover: there a tap pins a token (the click handler), and a second tap releases it.
      var touch = typeof window.matchMedia === "function" && window.matchMedia("(hover: none)").matches;
      return [(touch ? "Tap a token to see what each head attends to from it (left) or to it (right); tap again to release."
        : "Hover a token to see what each head attends to from it (left) or to it (right); click to pin.") +
        (view.undrawn ? " (" + view.undrawn + " lines of weight 0.01 or more: too many to draw all at once.)" : "")];
    }
    var q = sel.side === "q";
    var own = q ? view.queries : view.keys, other = q ? view.keys : view.queries;
    var pieces = [q ? "query " : "key ", { token: own[sel.index] }];
    pieces.push(q ? " attends most to: " : " gets most attention from: ");
    shown.forEach(function (k, n) {
      var best = -1, bestW = 0, count = q ? view.S : view.T;
      for (var m = 0; m < count; m++) {
        var w = q ? weight(view, k, sel.index, m) : weight(view, k, m, sel.index);
        if (w > bestW) { best = m; bestW = w; }
      }
      pieces.push((n ? " \u00b7 " : "") + "head " + k + (q ? " \u2192 " : " \u2190 "));
      pieces.push.apply(pieces, best < 0 ? ["nothing"] : [{ token: other[best] }, " " + bestW.toFixed(2)]);
    });
    if (!shown.length) pieces.push("no head shown");
    return pieces;
  }

  function writeReadout(view, pieces) {
    var out = view.readout;
    while (out.firstChild) out.removeChild(out.firstChild);
    pieces.forEach(function (p) {
      if (typeof p === "string") return out.appendChild(document.createTextNode(p));
      out.appendChild(document.createTextNode("\u201c"));
      html(out, "bdi", {}, label(p.token));
      out.appendChild(document.createTextNode("\u201d"));
    });
  }


  /* mha: head_view_export.js */

  // --- start --------------------------------------------------------------------------------------------

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
