"""The plotting script every page carries inline (`lerobot.reports.html.page`): SVG line charts with bands,
points, a legend that toggles series, a hover readout and a cursor, plus sortable tables. Plain JavaScript,
no library; about 8 KB.

    LR.data(id)                         the inline JSON of <script type="application/json" id=...>
    LR.chart(div, {series, xlabel, ylabel, logy, onclick})   -> {setCursor(x)}
        series: [{name, x, y, lo, hi, color, points}]; y may hold null (a gap)
    LR.sortable(tableId)                click a header to sort by that column

Each drawn series is one `<path class="series">` (plus `circle.point`s with `points`), which the browser
tests count.
"""

PLOTS_JS = r"""
const LR = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const COLORS = ["#2f6fde", "#e8590c", "#2b9348", "#c2255c", "#7048e8", "#0b7285", "#b08900",
                  "#5c940d", "#862e9c", "#495057", "#d9480f", "#1864ab", "#087f5b", "#a61e4d",
                  "#5f3dc4", "#364fc7"];
  const W = 560, M = {l: 54, r: 12, t: 8, b: 32};
  function el(tag, attrs, parent) {
    const e = document.createElementNS(NS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function data(id) { return JSON.parse(document.getElementById(id).textContent); }
  function fmt(v) {
    if (v === null || v === undefined || !isFinite(v)) return "-";
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(2);
    return String(+v.toPrecision(4));
  }
  function ticks(lo, hi, n) {
    if (!(hi > lo)) { const d = Math.abs(lo) || 1; lo -= d / 2; hi += d / 2; }
    const raw = (hi - lo) / n, p = Math.pow(10, Math.floor(Math.log10(raw))), f = raw / p;
    const step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * p, out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
    return {lo: Math.min(lo, out[0]), hi: Math.max(hi, out[out.length - 1]), list: out};
  }
  function extent(series, key, keep) {
    let lo = Infinity, hi = -Infinity;
    for (const s of series) for (const arr of [s[key], key === "y" ? s.lo : null, key === "y" ? s.hi : null]) {
      if (!arr) continue;
      for (const v of arr) if (v !== null && isFinite(v) && keep(v)) { if (v < lo) lo = v; if (v > hi) hi = v; }
    }
    return [lo, hi];
  }
  function chart(div, opts) {
    const H = opts.height || 210, series = opts.series.map((s, i) => ({color: COLORS[i % COLORS.length], ...s}));
    const hidden = new Set(), logy = !!opts.logy;
    const svg = el("svg", {viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "xMidYMid meet"});
    div.appendChild(svg);
    const legend = document.createElement("div"); legend.className = "legend";
    const readout = document.createElement("div"); readout.className = "readout";
    if (series.length > 1) div.appendChild(legend);
    div.appendChild(readout);
    let sx = null, sy = null, cursorLine = null, hoverLine = null, cursorX = null;
    function draw() {
      svg.textContent = "";
      const shown = series.filter(s => !hidden.has(s.name));
      let [x0, x1] = extent(shown, "x", () => true);
      let [y0, y1] = extent(shown, "y", v => !logy || v > 0);
      if (!isFinite(x0)) { x0 = 0; x1 = 1; }
      if (!isFinite(y0)) { y0 = logy ? 1 : 0; y1 = logy ? 10 : 1; }
      if (opts.ymin !== undefined) y0 = Math.min(y0, opts.ymin);
      if (opts.ymax !== undefined) y1 = Math.max(y1, opts.ymax);
      const tx = ticks(x0, x1, 6);
      const ly = v => logy ? Math.log10(v) : v;
      const decades = (lo, hi) => { const list = []; for (let v = lo; v <= hi; v++) list.push(v);
                                    return {lo, hi, list}; };
      const ty = logy ? decades(Math.floor(ly(y0)), Math.max(Math.ceil(ly(y1)), Math.floor(ly(y0)) + 1))
                      : ticks(y0, y1, 4);
      const pw = W - M.l - M.r, ph = H - M.t - M.b;
      sx = v => M.l + (v - tx.lo) / (tx.hi - tx.lo) * pw;
      sy = v => M.t + ph - (ly(v) - ty.lo) / (ty.hi - ty.lo) * ph;
      sx.inv = px => tx.lo + (px - M.l) / pw * (tx.hi - tx.lo);
      for (const v of tx.list) {
        el("line", {x1: sx(v), x2: sx(v), y1: M.t, y2: M.t + ph, class: "grid"}, svg);
        el("text", {x: sx(v), y: H - M.b + 14, "text-anchor": "middle"}, svg).textContent = fmt(v);
      }
      for (const v of ty.list) {
        const y = M.t + ph - (v - ty.lo) / (ty.hi - ty.lo) * ph;
        el("line", {x1: M.l, x2: M.l + pw, y1: y, y2: y, class: "grid"}, svg);
        el("text", {x: M.l - 5, y: y + 4, "text-anchor": "end"}, svg).textContent = logy ? fmt(Math.pow(10, v)) : fmt(v);
      }
      el("rect", {x: M.l, y: M.t, width: pw, height: ph, fill: "none", class: "axis"}, svg);
      if (opts.xlabel) el("text", {x: M.l + pw / 2, y: H - 3, "text-anchor": "middle"}, svg).textContent = opts.xlabel;
      if (opts.ylabel) el("text", {x: 12, y: M.t + ph / 2, "text-anchor": "middle",
                                   transform: `rotate(-90 12 ${M.t + ph / 2})`}, svg).textContent = opts.ylabel;
      const ok = v => v !== null && v !== undefined && isFinite(v) && (!logy || v > 0);
      for (const s of shown) {
        if (s.lo && s.hi) {
          let top = "", bottom = "";
          for (let i = 0; i < s.x.length; i++) if (ok(s.lo[i]) && ok(s.hi[i])) {
            top += (top ? "L" : "M") + sx(s.x[i]).toFixed(1) + "," + sy(s.hi[i]).toFixed(1);
            bottom = "L" + sx(s.x[i]).toFixed(1) + "," + sy(s.lo[i]).toFixed(1) + bottom;
          }
          if (top) el("path", {d: top + bottom + "Z", class: "band", fill: s.color}, svg);
        }
        let d = "", pen = false;
        for (let i = 0; i < s.x.length; i++) {
          if (!ok(s.y[i])) { pen = false; continue; }
          d += (pen ? "L" : "M") + sx(s.x[i]).toFixed(1) + "," + sy(s.y[i]).toFixed(1); pen = true;
        }
        el("path", {d: d || "M0,0", class: "series", stroke: s.color, "stroke-opacity": s.lineOpacity ?? 1,
                    "data-name": s.name}, svg);
        if (s.points) for (let i = 0; i < s.x.length; i++) if (ok(s.y[i]))
          el("circle", {cx: sx(s.x[i]), cy: sy(s.y[i]), r: 2.6, fill: s.color, class: "point"}, svg);
      }
      cursorLine = el("line", {y1: M.t, y2: M.t + ph, class: "cursor", visibility: "hidden"}, svg);
      hoverLine = el("line", {y1: M.t, y2: M.t + ph, class: "grid", stroke: "#98a2b3", visibility: "hidden"}, svg);
      if (cursorX !== null) setCursor(cursorX);
    }
    function valuesAt(x) {
      const parts = [];
      for (const s of series) {
        if (hidden.has(s.name) || !s.x.length) continue;
        let best = 0;
        for (let i = 1; i < s.x.length; i++) if (Math.abs(s.x[i] - x) < Math.abs(s.x[best] - x)) best = i;
        parts.push(`${s.name} ${fmt(s.y[best])}`);
      }
      return parts;
    }
    function setCursor(x) {
      cursorX = x;
      if (!sx || x === null) return;
      cursorLine.setAttribute("x1", sx(x)); cursorLine.setAttribute("x2", sx(x));
      cursorLine.setAttribute("visibility", "visible");
      if (!opts.noCursorReadout) readout.textContent = `${opts.xlabel || "x"} ${fmt(x)}: ` + valuesAt(x).join(", ");
    }
    function pointerX(ev) {
      const box = svg.getBoundingClientRect();
      return sx.inv((ev.clientX - box.left) / box.width * W);
    }
    svg.addEventListener("mousemove", ev => {
      const x = pointerX(ev);
      hoverLine.setAttribute("x1", sx(x)); hoverLine.setAttribute("x2", sx(x));
      hoverLine.setAttribute("visibility", "visible");
      readout.textContent = `${opts.xlabel || "x"} ${fmt(x)}: ` + valuesAt(x).join(", ");
    });
    svg.addEventListener("mouseleave", () => { hoverLine.setAttribute("visibility", "hidden"); });
    if (opts.onclick) svg.addEventListener("click", ev => opts.onclick(pointerX(ev)));
    series.forEach(s => {
      const item = document.createElement("span");
      item.innerHTML = `<i style="background:${s.color}"></i>`;
      item.appendChild(document.createTextNode(s.name));
      item.addEventListener("click", () => {
        hidden.has(s.name) ? hidden.delete(s.name) : hidden.add(s.name);
        item.classList.toggle("off"); draw();
      });
      legend.appendChild(item);
    });
    draw();
    return {setCursor, svg};
  }
  function sortable(tableId) {
    const t = document.getElementById(tableId);
    if (!t) return;
    t.querySelectorAll("th").forEach((th, col) => th.addEventListener("click", () => {
      const body = t.tBodies[0], rows = Array.from(body.rows), dir = th.dataset.dir === "asc" ? -1 : 1;
      t.querySelectorAll("th").forEach(h => delete h.dataset.dir);
      th.dataset.dir = dir > 0 ? "asc" : "desc";
      const key = r => { const s = r.cells[col].textContent.replace(/,/g, ""), n = parseFloat(s);
                         return isNaN(n) ? s : n; };
      rows.sort((a, b) => { const x = key(a), y = key(b);
        return (typeof x === typeof y ? (x < y ? -1 : x > y ? 1 : 0) : typeof x === "number" ? -1 : 1) * dir; });
      for (const r of rows) body.appendChild(r);
    }));
  }
  return {chart, data, fmt, sortable, COLORS};
})();
"""
