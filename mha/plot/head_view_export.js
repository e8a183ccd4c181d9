/* The head view's export: the current picture as an SVG document or a PNG, and downloading a file.
 *
 * Not a script of its own: Python inlines it into head_view.js (where the comment "mha: head_view_export.js"
 * stands), so it shares that function's scope (html, SVGNS) and defines no globals. Never write the HTML
 * end tag of a script element in this file.
 */
  // --- export (inlined into head_view.js) -----------------------------------------------------------------

  function background(root) {
    for (var e = root; e && e.nodeType === 1; e = e.parentElement) {
      var c = getComputedStyle(e).backgroundColor;
      if (c && c !== "transparent" && !/^rgba\(.*,\s*0\)$/.test(c)) return c;
    }
    return "#ffffff";
  }

  function svgText(view) {
    var copy = view.svg.cloneNode(true);
    var fg = getComputedStyle(view.root).color || "#000000";
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
    bg.setAttribute("fill", background(view.root));
    copy.insertBefore(bg, copy.firstChild);
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + new XMLSerializer().serializeToString(copy);
  }

  function pngDataURL(view) {
    return new Promise(function (resolve, reject) {
      var img = new Image();
      img.onload = function () {
        var canvas = document.createElement("canvas");
        canvas.width = 2 * view.width;
        canvas.height = 2 * view.height;
        var ctx = canvas.getContext("2d");
        ctx.scale(2, 2);
        ctx.drawImage(img, 0, 0);
        resolve(canvas.toDataURL("image/png"));
      };
      img.onerror = function () { reject(new Error("the SVG of the view could not be drawn")); };
      img.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(svgText(view));
    });
  }

  function download(view, what, ext) {
    var url = typeof what === "string" ? what : URL.createObjectURL(what);
    var name = view.layers[view.state.layer].name.replace(/\W+/g, "_");
    var a = html(document.body, "a", { href: url, download: "head_view_" + name + "." + ext });
    a.click();
    document.body.removeChild(a);
    if (typeof what !== "string") setTimeout(function () { URL.revokeObjectURL(url); }, 1000);
  }
