// The sidecar page's update in place: every few seconds fetch /api/page (JSON: the page's live part,
// rendered and escaped by the server) and swap it in, keeping what the reader opened (<details> by
// id) and where they scrolled. No full-page reload; nothing from the network but this sidecar.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live || !window.fetch) { return; }
  var every = Math.max(1, parseFloat(live.getAttribute("data-refresh")) || 10) * 1000;
  var stamp = document.getElementById("updated");
  function update() {
    fetch("api/page", {cache: "no-store", headers: {"Accept": "application/json"}})
      .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.json(); })
      .then(function (page) {
        var open = {};
        live.querySelectorAll("details[id]").forEach(function (d) { open[d.id] = d.open; });
        var x = window.scrollX, y = window.scrollY;
        live.innerHTML = page.html;
        live.querySelectorAll("details[id]").forEach(function (d) {
          if (Object.prototype.hasOwnProperty.call(open, d.id)) { d.open = open[d.id]; }
        });
        window.scrollTo(x, y);
        if (page.title) { document.title = page.title; }
        if (stamp) { stamp.textContent = "updated " + page.generated + " UTC, every " + every / 1000 + " s in place (opened evidence stays open)"; }
        live.setAttribute("data-updates", String((parseInt(live.getAttribute("data-updates"), 10) || 0) + 1));
      })
      .catch(function (e) {
        if (stamp) { stamp.textContent = "update failed (" + e.message + "); retrying in " + every / 1000 + " s"; }
      })
      .then(function () { window.setTimeout(update, every); });
  }
  window.setTimeout(update, every);
}());
