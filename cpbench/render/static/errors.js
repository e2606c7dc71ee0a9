(function () {
  function record(message) {
    var body = document.body;
    var prev = body.dataset.errors ? body.dataset.errors + "\n" : "";
    body.dataset.errors = prev + String(message);
  }
  window.__cpbenchRecordError = record;
  window.addEventListener("error", function (e) {
    record((e && e.message) || "error loading " + ((e && e.target && e.target.src) || "a resource"));
  }, true);
  window.addEventListener("unhandledrejection", function (e) {
    record("unhandled rejection: " + (e && e.reason && (e.reason.stack || e.reason)));
  });
})();
