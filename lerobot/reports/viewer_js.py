"""The dataset viewer's own markup, style and script (`lerobot.reports.dataset_viewer` writes them into its
page beside the shared plotting script, `lerobot.reports.plots_js`).

The script reads the inline JSON `index` (the episode list, cameras, features, fps) and, when an episode is
chosen, that episode's `ep-<i>` JSON. Frame `i` of a video is shown by setting `currentTime` to
`(i + 0.5) / fps`, the middle of the frame's display interval, so seeking never lands on a frame boundary;
while playing, the frame on screen is read back with `requestVideoFrameCallback` (or `timeupdate`) and the
plots' cursors follow it. Keys: left/right step a frame, space plays and pauses. `#ep=<i>` in the address
opens episode i. Once the first episode is drawn the page sets the performance mark `viewer-ready`.
"""

VIEWER_CSS = """
body { padding: 0; }
#viewer { display: grid; grid-template-columns: 390px 1fr; height: 100vh; }
#list { border-right: 1px solid var(--line); padding: 14px 12px; overflow: auto; }
#episode { padding: 14px 20px; overflow: auto; }
#list table { width: 100%; } #list th, #list td { padding-right: 8px; } #list tbody tr { cursor: pointer; } #list tbody tr:hover { background: var(--panel); }
#list tbody tr.current { background: #dbe7fd; }
.filters { display: flex; gap: 8px; margin: 8px 0; } .filters select { max-width: 200px; }
.controls { display: flex; align-items: center; gap: 6px; margin: 10px 0 14px; flex-wrap: wrap; }
.controls button { min-width: 34px; padding: 3px 8px; }
.controls input[type=range] { width: 360px; }
#frame-label { font-variant-numeric: tabular-nums; color: var(--muted); }
#charts { grid-template-columns: repeat(auto-fill, minmax(400px, 1fr)); }
"""

VIEWER_HTML = """<div id="viewer">
<aside id="list">
  <h1>{title}</h1>
  <div class="muted" id="summary"></div>
  <div class="filters">
    <select id="task-filter"><option value="">all tasks</option></select>
    <select id="success-filter"><option value="">all episodes</option>
      <option value="yes">successes</option><option value="no">failures</option></select>
  </div>
  <div class="muted" id="shown"></div>
  <table id="episodes"><thead><tr id="episodes-head"></tr></thead><tbody></tbody></table>
</aside>
<main id="episode">
  <h2 id="ep-title"></h2>
  <div class="videos" id="cams"></div>
  <div class="controls">
    <button id="first" title="first frame">|&#x25C0;</button>
    <button id="prev" title="previous frame (left arrow)">&#x25C0;</button>
    <button id="play" title="play / pause (space)">play</button>
    <button id="next" title="next frame (right arrow)">&#x25B6;</button>
    <button id="last" title="last frame">&#x25B6;|</button>
    <input type="range" id="slider" min="0" max="0" value="0" step="1">
    <span id="frame-label"></span>
  </div>
  <div class="charts" id="charts"></div>
</main>
</div>
"""

VIEWER_JS = r"""
(() => {
  const IDX = LR.data("index"), fps = IDX.fps, $ = id => document.getElementById(id);
  const esc = s => String(s).replace(/[&<>"]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]));
  const byIndex = new Map(IDX.episodes.map(e => [e.i, e])), parsed = new Map();
  let ep = null, frame = 0, charts = [], vids = [], playing = false, timer = null;
  const cams = IDX.cameras.length ? `; cameras: ${IDX.cameras.join(", ")}` : "";
  $("summary").textContent = `${IDX.episodes.length} episodes, ${IDX.frames.toLocaleString()} frames at ${fps} fps${cams}`;
  const tasks = [...new Set(IDX.episodes.map(e => e.task).filter(t => t))].sort();
  const hasSuccess = IDX.episodes.some(e => e.success !== null), hasReward = IDX.episodes.some(e => e.reward !== null);
  for (const t of tasks) $("task-filter").insertAdjacentHTML("beforeend", `<option value="${esc(t)}">${esc(t)}</option>`);
  if (!tasks.length) $("task-filter").style.display = "none";
  if (!hasSuccess) $("success-filter").style.display = "none";
  const heads = ["episode", "frames"].concat(tasks.length ? ["task"] : [], hasSuccess ? ["success"] : [],
                                             hasReward ? ["best reward"] : []);
  $("episodes-head").innerHTML = heads.map((h, k) => `<th class="${k === 1 || h === "best reward" ? "num " : ""}sortable">${h}</th>`).join("");
  $("episodes").tBodies[0].innerHTML = IDX.episodes.map(e => `<tr data-i="${e.i}"><td>${e.i}</td><td class="num">${e.n}</td>` +
    (tasks.length ? `<td>${esc(e.task || "")}</td>` : "") +
    (hasSuccess ? `<td class="${e.success ? "ok" : "fail"}">${e.success === null ? "" : e.success ? "yes" : "no"}</td>` : "") +
    (hasReward ? `<td class="num">${LR.fmt(e.reward)}</td>` : "") + "</tr>").join("");
  LR.sortable("episodes");
  function applyFilter() {
    const task = $("task-filter").value, succ = $("success-filter").value;
    let shown = 0;
    for (const row of $("episodes").tBodies[0].rows) {
      const e = byIndex.get(+row.dataset.i);
      const ok = (!task || e.task === task) && (!succ || (succ === "yes") === !!e.success);
      row.style.display = ok ? "" : "none"; shown += ok;
    }
    $("shown").textContent = `${shown} shown`;
  }
  $("task-filter").addEventListener("change", applyFilter);
  $("success-filter").addEventListener("change", applyFilter);
  $("episodes").tBodies[0].addEventListener("click", ev => {
    const row = ev.target.closest("tr"); if (row) select(+row.dataset.i);
  });
  function series(i) {
    if (!parsed.has(i)) parsed.set(i, LR.data("ep-" + i));
    return parsed.get(i);
  }
  function setFrame(f, fromVideo) {
    if (!ep) return;
    frame = Math.max(0, Math.min(ep.n - 1, Math.round(f)));
    $("slider").value = frame;
    $("frame-label").textContent = `frame ${frame} / ${ep.n - 1}  (t = ${(frame / fps).toFixed(2)} s)`;
    for (const c of charts) c.setCursor(frame);
    if (!fromVideo) for (const v of vids) v.currentTime = (frame + 0.5) / fps;
  }
  function follow(v) {
    if (!playing) return;
    if (v.requestVideoFrameCallback) {
      v.requestVideoFrameCallback((now, meta) => { if (playing) { setFrame(Math.round(meta.mediaTime * fps), true); follow(v); } });
    }
  }
  function play() {
    if (!ep || playing) return;
    if (frame >= ep.n - 1) setFrame(0);
    playing = true; $("play").textContent = "pause";
    if (vids.length) { for (const v of vids) v.play().catch(() => {}); follow(vids[0]); }
    else timer = setInterval(() => { if (frame >= ep.n - 1) pause(); else setFrame(frame + 1); }, 1000 / fps);
  }
  function pause() {
    if (!playing) return;
    playing = false; $("play").textContent = "play";
    clearInterval(timer);
    for (const v of vids) v.pause();
    if (vids.length) setFrame(Math.floor(vids[0].currentTime * fps));
  }
  function drawCharts(data) {
    $("charts").innerHTML = ""; charts = [];
    const x = data.t || Array.from({length: data.n}, (_, k) => k);
    const make = (title, list) => {
      const div = document.createElement("div"); div.className = "chart";
      div.innerHTML = `<div class="title">${esc(title)}</div>`;
      $("charts").appendChild(div);
      charts.push(LR.chart(div, {series: list, xlabel: "frame", onclick: f => { pause(); setFrame(f); }}));
    };
    const outcome = [];
    for (const f of IDX.features) {
      // Unnamed dimensions read `key[i]`: the chart's title says the key, the legend `[i]`.
      const short = n => n.startsWith(f.key + "[") ? n.slice(f.key.length) : n;
      const dims = data.f[f.key].map((y, d) => ({name: short(f.names[d]), x, y}));
      if (f.outcome) outcome.push(...dims); else make(f.key, dims);
    }
    if (outcome.length) make("reward, success, done (next.*)", outcome);
  }
  function select(i) {
    pause();
    ep = byIndex.get(i) || IDX.episodes[0];
    if (!ep) return;
    const data = series(ep.i);
    for (const row of $("episodes").tBodies[0].rows) row.classList.toggle("current", +row.dataset.i === ep.i);
    const bits = [`episode ${ep.i}`, `${ep.n} frames`];
    if (ep.task) bits.push(ep.task);
    if (ep.success !== null) bits.push(ep.success ? "success" : "no success");
    $("ep-title").textContent = bits.join(" \u00b7 ");
    history.replaceState(null, "", "#ep=" + ep.i);
    $("cams").innerHTML = ""; vids = [];
    for (const cam of IDX.cameras) {
      const fig = document.createElement("figure"), v = document.createElement("video");
      v.muted = true; v.preload = "auto"; v.playsInline = true; v.src = ep.videos[cam];
      v.addEventListener("loadedmetadata", () => {
        // Small frames grow by a whole factor to about 256 px (sharp pixels); large ones shrink to 480 px.
        const w = v.videoWidth;
        v.style.width = (w >= 256 ? Math.min(w, 480) : w * Math.ceil(256 / w)) + "px";
        if (!playing) v.currentTime = (frame + 0.5) / fps;
      });
      v.addEventListener("timeupdate", () => { if (playing && !v.requestVideoFrameCallback && v === vids[0]) setFrame(Math.floor(v.currentTime * fps), true); });
      v.addEventListener("ended", () => { if (v === vids[0]) pause(); });
      fig.appendChild(v); fig.insertAdjacentHTML("beforeend", `<figcaption>${esc(cam)}</figcaption>`);
      $("cams").appendChild(fig); vids.push(v);
    }
    $("slider").max = ep.n - 1;
    drawCharts(data);
    setFrame(0);
  }
  $("slider").addEventListener("input", ev => { pause(); setFrame(+ev.target.value); });
  $("prev").addEventListener("click", () => { pause(); setFrame(frame - 1); });
  $("next").addEventListener("click", () => { pause(); setFrame(frame + 1); });
  $("first").addEventListener("click", () => { pause(); setFrame(0); });
  $("last").addEventListener("click", () => { pause(); if (ep) setFrame(ep.n - 1); });
  $("play").addEventListener("click", () => playing ? pause() : play());
  document.addEventListener("keydown", ev => {
    if (ev.target.tagName === "SELECT" || ev.target.tagName === "INPUT") return;
    if (ev.key === "ArrowLeft") { pause(); setFrame(frame - 1); ev.preventDefault(); }
    else if (ev.key === "ArrowRight") { pause(); setFrame(frame + 1); ev.preventDefault(); }
    else if (ev.key === " ") { playing ? pause() : play(); ev.preventDefault(); }
  });
  applyFilter();
  const wanted = /#ep=(\d+)/.exec(location.hash);
  select(wanted ? +wanted[1] : (IDX.episodes[0] || {}).i);
  window.viewer = {select, setFrame, play, pause, get frame() { return frame; }, get episode() { return ep && ep.i; }};
  performance.mark("viewer-ready");
})();
"""
