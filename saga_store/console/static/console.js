// Live saga pages: follow the server's event stream (Server-Sent Events) and
// swap in the re-rendered timeline as events land. No framework, no build step.
(function () {
  "use strict";
  function follow(box) {
    if (box.dataset.live !== "1" || !window.EventSource) { return; }
    var src = box.dataset.src + (box.dataset.src.indexOf("?") < 0 ? "?" : "&") +
      "after=" + encodeURIComponent(box.dataset.seq);
    var stream = new EventSource(src);
    var note = document.getElementById("live-note");
    stream.addEventListener("unavailable", function (ev) {
      // the server lost Redis; the browser reconnects by itself (retry: 2000)
      if (note) { note.textContent = JSON.parse(ev.data).error + "; retrying"; note.hidden = false; }
    });
    stream.addEventListener("update", function (ev) {
      var msg = JSON.parse(ev.data);
      if (note) { note.hidden = true; }
      // the HTML is rendered by the server's templates, which escape everything
      box.innerHTML = msg.html;
      box.dataset.seq = String(msg.seq);
      box.dataset.state = msg.state;
      if (msg.final) { box.dataset.live = "0"; stream.close(); }
    });
    stream.addEventListener("end", function () { stream.close(); });
  }
  document.addEventListener("DOMContentLoaded", function () {
    var box = document.getElementById("live");
    if (box) { follow(box); }
  });
}());
