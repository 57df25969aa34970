// The console's live parts, in plain JavaScript (no build step, nothing fetched from
// elsewhere): server-sent events say what changed, and the page reloads that fragment
// from the server. The state slider asks the server for the folded state at an entry.
(function () {
  "use strict";

  function mark(id, text, ok) {
    const el = document.getElementById(id);
    if (el) { el.textContent = text; el.className = "live " + (ok ? "on" : "off"); }
  }

  // Reload el's fragment from el.dataset.src; refreshes asked for while one is running
  // are merged into one more.
  function refresher(el) {
    let running = false, again = false;
    return async function refresh() {
      if (running) { again = true; return; }
      running = true;
      try {
        do {
          again = false;
          const r = await fetch(el.dataset.src, { credentials: "same-origin" });
          if (r.ok) { el.innerHTML = await r.text(); }
        } while (again);
      } finally { running = false; }
    };
  }

  const runs = document.getElementById("runs-live");
  if (runs) {
    const refresh = refresher(runs);
    const es = new EventSource(runs.dataset.events);
    // The first event comes when the stream starts: refreshing then too covers whatever
    // changed between the page's rendering and the stream's start.
    es.addEventListener("runs", function (m) {
      const d = JSON.parse(m.data);
      if (d.unavailable) { mark("live-runs", "Redis unavailable", false); return; }
      mark("live-runs", "live", true);
      refresh();
    });
    es.onerror = function () { mark("live-runs", "reconnecting", false); };
  }

  const slider = document.getElementById("slider");
  const ids = slider ? JSON.parse(slider.dataset.ids) : [];
  const known = new Set(ids);

  // The run page's buttons that apply to the run now: the panel says which
  // (#run-state's data-actions), the controls outside it follow after each refresh.
  function syncControls() {
    const st = document.getElementById("run-state");
    const controls = document.getElementById("controls");
    if (!st || !controls) { return; }
    const acts = (st.dataset.actions || "").split(" ");
    controls.querySelectorAll("[data-action]").forEach(function (f) {
      const a = f.dataset.action;
      f.hidden = a === "none" ? acts.join(" ") !== "fork" : acts.indexOf(a) < 0;
    });
  }

  const run = document.getElementById("run-live");
  if (run) {
    const refreshPanel = refresher(run);
    const refresh = function () { return refreshPanel().then(syncControls); };
    const out = document.getElementById("partial");
    let step = null;
    const es = new EventSource(run.dataset.events);
    // The stream starts at the page's last entry but one: its first event (that entry)
    // comes once the partial output channel is subscribed, so from then on nothing is
    // missed.
    es.addEventListener("entry", function (m) {
      const d = JSON.parse(m.data);
      mark("live-run", "live", true);
      if (!known.has(d.id)) {
        known.add(d.id); ids.push(d.id);
        if (slider) {
          const atEnd = Number(slider.value) === Number(slider.max);
          slider.max = String(ids.length - 1);
          if (atEnd) { slider.value = slider.max; showAt(false); }
        }
      }
      refresh();
    });
    es.addEventListener("partial", function (m) {
      const d = JSON.parse(m.data);
      if (d.step !== step) {
        step = d.step;
        out.textContent = "step " + d.step + " (attempt " + d.attempt + "):\n";
      }
      const data = d.data;
      const text = typeof data === "string" ? data
        : (data && (data.token || data.text || data.delta)) || JSON.stringify(data) + "\n";
      out.textContent += text;
    });
    es.addEventListener("end", function () {
      es.close();
      mark("live-run", "ended", false);
      refresh();
    });
    es.onerror = function () { if (es.readyState !== 2) { mark("live-run", "reconnecting", false); } };
  }

  let timer = null;
  function showAt(load) {
    const id = ids[Number(slider.value)] || "";
    document.getElementById("slider-at").textContent = id;
    const fork = document.getElementById("fork-at");
    if (fork) { fork.value = id; }
    if (!load) { return; }
    clearTimeout(timer);
    timer = setTimeout(async function () {
      const r = await fetch(slider.dataset.src + "?at=" + encodeURIComponent(id),
                            { credentials: "same-origin" });
      document.getElementById("state-at").innerHTML = await r.text();
    }, 120);
  }
  if (slider) {
    slider.addEventListener("input", function () { showAt(true); });
  }
})();
