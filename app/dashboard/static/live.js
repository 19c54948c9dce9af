// Live updates for the dashboard pages: one EventSource on /admin/ui/events (the session cookie
// authenticates it). Rows, counters and the job page change as events come; nothing polls.
// Pages work without this file: it only makes them live.
(function () {
  "use strict";
  var body = document.body;
  var url = body.getAttribute("data-events-url");
  if (!url || !window.EventSource) { return; }
  var page = body.getAttribute("data-page");
  var banner = document.getElementById("live-banner");
  var toggle = document.getElementById("live-toggle");
  var source = null;
  // The page was rendered from the state after this event: the stream resumes from it.
  var lastId = body.getAttribute("data-events-after") || null;
  var paused = false;
  var held = [];
  var retryTimer = null;
  var refreshTimer = null;
  var TERMINAL = { SUCCESS: true, FAILURE: true, CANCELED: true };

  function isoSeconds(ms) {
    return new Date(ms).toISOString().replace("T", " ").slice(0, 19);
  }

  function setBadge(el, status) {
    el.textContent = status;
    el.className = "badge s-" + status;
  }

  function rowFor(jobId) {
    return document.querySelector('tr[data-job-id="' + CSS.escape(jobId) + '"]');
  }

  function matchesFilters(rows, ev) {
    var status = rows.getAttribute("data-filter-status");
    var job = rows.getAttribute("data-filter-job");
    var user = rows.getAttribute("data-filter-user");
    return (!status || status === ev.status) && (!job || job === ev.name) && (!user || user === (ev.user_uid || ""));
  }

  function cell(text, cls) {
    var td = document.createElement("td");
    if (cls) { td.className = cls; }
    if (text !== null) { td.textContent = text; }
    return td;
  }

  function newRow(rows, ev) {
    var tr = document.createElement("tr");
    tr.setAttribute("data-job-id", ev.job_id);
    tr.className = "fresh";
    var idCell = cell(null, "id");
    var link = document.createElement("a");
    link.href = rows.getAttribute("data-detail-url") + encodeURIComponent(ev.job_id);
    link.textContent = ev.job_id;
    idCell.appendChild(link);
    tr.appendChild(idCell);
    tr.appendChild(cell(ev.name));
    var statusCell = cell(null, "status");
    var badge = document.createElement("span");
    setBadge(badge, ev.status);
    statusCell.appendChild(badge);
    tr.appendChild(statusCell);
    tr.appendChild(cell(ev.user_uid || ""));
    tr.appendChild(cell(String(ev.attempts), "num attempts"));
    var progressCell = cell(null, "progress");
    var bar = document.createElement("progress");
    bar.max = 1;
    bar.value = 0;
    bar.hidden = true;
    progressCell.appendChild(bar);
    tr.appendChild(progressCell);
    tr.appendChild(cell(isoSeconds(ev.at_ms), "time"));
    rows.insertBefore(tr, rows.firstChild);
    var empty = document.getElementById("no-jobs");
    if (empty) { empty.hidden = true; }
    return tr;
  }

  function updateRow(tr, ev) {
    var bar = tr.querySelector("progress");
    if (ev.type === "progress") {
      if (bar) { bar.hidden = false; bar.value = ev.fraction; }
      return;
    }
    var badge = tr.querySelector(".status .badge");
    if (badge) { setBadge(badge, ev.status); }
    var attempts = tr.querySelector(".attempts");
    if (attempts) { attempts.textContent = String(ev.attempts); }
    if (bar && ev.status === "SUCCESS") { bar.hidden = false; bar.value = 1; }
  }

  function onJobsPage(ev) {
    var rows = document.getElementById("job-rows");
    if (!rows) { return; }
    var tr = rowFor(ev.job_id);
    if (!tr && ev.type === "status" && ev.status === "PENDING" && rows.getAttribute("data-live-insert") === "1"
        && matchesFilters(rows, ev)) {
      tr = newRow(rows, ev);
    }
    if (tr) { updateRow(tr, ev); }
  }

  function onJobPage(ev) {
    if (ev.job_id !== body.getAttribute("data-job-id")) { return; }
    var bar = document.getElementById("job-progress");
    if (ev.type === "progress") {
      if (bar) { bar.value = ev.fraction; }
      var message = document.getElementById("job-progress-message");
      if (message) { message.textContent = ev.message || ""; }
    } else {
      setBadge(document.getElementById("job-status"), ev.status);
      document.getElementById("job-attempts").textContent = String(ev.attempts);
      if (ev.error) { document.getElementById("job-error").textContent = ev.error; }
      if (bar && ev.status === "SUCCESS") { bar.value = 1; }
      if (TERMINAL[ev.status]) {
        document.getElementById("job-finished").textContent = isoSeconds(ev.at_ms) + " UTC";
        // The actions offered depend on the status: the page's own HTML decides them.
        document.querySelectorAll(".actions form").forEach(function (f) { f.hidden = true; });
        scheduleRefresh();
      }
    }
    var timeline = document.getElementById("timeline");
    if (timeline) {
      var empty = timeline.querySelector(".empty");
      if (empty) { empty.remove(); }
      var li = document.createElement("li");
      li.setAttribute("data-event-id", ev.id);
      li.setAttribute("data-type", ev.type);
      // A run of progress reports shows only its latest (as the server renders it).
      var last = timeline.lastElementChild;
      if (ev.type === "progress" && last && last.getAttribute("data-type") === "progress") { last.remove(); }
      var time = document.createElement("span");
      time.className = "time";
      time.textContent = isoSeconds(ev.at_ms) + " ";
      li.appendChild(time);
      if (ev.type === "progress") {
        li.appendChild(document.createTextNode("progress " + Math.round(ev.fraction * 100) + "%"
          + (ev.message ? " — " + ev.message : "")));
      } else {
        var badge = document.createElement("span");
        setBadge(badge, ev.status);
        li.appendChild(badge);
        var what = ev.status === "PENDING" ? " queued" : " attempt " + ev.attempts;
        li.appendChild(document.createTextNode(what + (ev.error ? " — " + ev.error : "")));
      }
      timeline.appendChild(li);
    }
  }

  // The overview's counters are sums the page computes from indexes: an event asks for a fresh copy
  // of the page (at most once a second), it does not poll.
  function scheduleRefresh() {
    if (refreshTimer) { return; }
    refreshTimer = window.setTimeout(function () {
      refreshTimer = null;
      fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) {
          if (!html) { return; }
          var fresh = new DOMParser().parseFromString(html, "text/html").querySelector("main");
          var main = document.querySelector("main");
          if (fresh && main) { main.replaceWith(fresh); }
        })
        .catch(function () { /* the banner already says the stream is down */ });
    }, 1000);
  }

  function apply(ev) {
    if (page === "jobs") { onJobsPage(ev); }
    else if (page === "job") { onJobPage(ev); }
    else if (page === "overview" && ev.type === "status") { scheduleRefresh(); }
  }

  function handle(message) {
    if (message.lastEventId) { lastId = message.lastEventId; }
    var ev;
    try { ev = JSON.parse(message.data); } catch (e) { return; }
    if (paused) {
      held.push(ev);
      toggle.textContent = "Resume live (" + held.length + ")";
      return;
    }
    apply(ev);
  }

  function connect() {
    if (retryTimer) { window.clearTimeout(retryTimer); retryTimer = null; }
    source = new EventSource(lastId ? url + "?after=" + encodeURIComponent(lastId) : url);
    source.addEventListener("status", handle);
    source.addEventListener("progress", handle);
    source.onopen = function () { banner.hidden = true; body.setAttribute("data-live", "connected"); };
    source.onerror = function () {
      banner.hidden = false;
      body.setAttribute("data-live", "disconnected");
      // CONNECTING: the browser retries by itself and sends Last-Event-ID. CLOSED (the server
      // answered an error, e.g. while restarting): reconnect ourselves, resuming after lastId.
      if (source.readyState === EventSource.CLOSED) {
        source.close();
        retryTimer = window.setTimeout(connect, 2000);
      }
    };
  }

  if (toggle) {
    toggle.hidden = false;
    toggle.addEventListener("click", function () {
      paused = !paused;
      toggle.textContent = paused ? "Resume live" : "Pause live";
      toggle.classList.toggle("paused", paused);
      if (!paused) {
        var pending = held;
        held = [];
        pending.forEach(apply);
      }
    });
  }
  // Leaving the page: close the stream at once. A browser keeps at most 6 HTTP/1.1 connections per host
  // and may hold a dropped stream's for a while; six page views must not starve the seventh.
  window.addEventListener("pagehide", function () {
    if (retryTimer) { window.clearTimeout(retryTimer); }
    if (source) { source.close(); }
  });
  connect();
}());
