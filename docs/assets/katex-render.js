// Renders the formulas on each page with the KaTeX copy vendored in docs/assets/katex/ (no CDN:
// the site reads offline). pymdownx.arithmatex (generic mode) wraps each formula as
// <span class="arithmatex">\(...\)</span> or <div class="arithmatex">\[...\]</div>; only those
// elements are rendered, so a `$` elsewhere on a page stays text. Material for MkDocs calls
// document$ on the first load and after each instant navigation.
function gspoRenderMath(root) {
  root.querySelectorAll(".arithmatex").forEach(function (el) {
    var tex = el.textContent.trim();
    var display = tex.startsWith("\\[");
    if (tex.startsWith("\\(") || display) tex = tex.slice(2, -2);
    katex.render(tex, el, { displayMode: display, throwOnError: false });
  });
}
if (typeof document$ !== "undefined") {
  document$.subscribe(function () { gspoRenderMath(document.body); });
} else {
  document.addEventListener("DOMContentLoaded", function () { gspoRenderMath(document.body); });
}
