// The leaderboard's one script, inlined into every page at build time (works from file://).
// Click a header to sort its table; numbers sort numerically via data-v, blanks last.
document.querySelectorAll("table.sort").forEach(function (t) {
  t.querySelectorAll("th").forEach(function (th, i) {
    th.classList.add("sortable");
    th.addEventListener("click", function () {
      var body = t.tBodies[0], rows = Array.prototype.slice.call(body.rows), dir = th.dataset.dir === "1" ? -1 : 1;
      th.dataset.dir = dir === 1 ? "1" : "-1";
      function key(r) { var c = r.cells[i]; if (!c) return ""; var v = c.dataset.v; return v !== undefined && v !== "" ? parseFloat(v) : c.textContent.trim(); }
      rows.sort(function (a, b) { var x = key(a), y = key(b);
        if (typeof x === "number" && typeof y === "number") return (x - y) * dir;
        if (typeof x === "number") return -1; if (typeof y === "number") return 1;
        return String(x).localeCompare(String(y)) * dir; });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
// "SVG" buttons: download the chart next to them as a standalone .svg file (a Blob URL works from file://).
function clbSvgText(svg) {
  var copy = svg.cloneNode(true);
  copy.setAttribute("xmlns", "http://www.w3.org/2000/svg");
  copy.removeAttribute("style");
  return '<?xml version="1.0" encoding="UTF-8"?>\n' + new XMLSerializer().serializeToString(copy);
}
document.querySelectorAll("button.svg-dl").forEach(function (b) {
  b.addEventListener("click", function () {
    var svg = b.closest("figure").querySelector("svg");
    var url = URL.createObjectURL(new Blob([clbSvgText(svg)], {type: "image/svg+xml"}));
    var a = document.createElement("a");
    a.href = url; a.download = (b.dataset.name || "chart") + ".svg";
    document.body.appendChild(a); a.click(); a.remove();
    setTimeout(function () { URL.revokeObjectURL(url); }, 1000);
  });
});
