(function () {
  var specs = document.querySelectorAll("script.figure-spec");
  var config = JSON.parse(document.getElementById("plotly-config").textContent);
  var jobs = [];
  specs.forEach(function (node) {
    var spec = JSON.parse(node.textContent);
    var target = document.getElementById(node.dataset.target);
    jobs.push(Plotly.newPlot(target, spec.data, spec.layout || {}, config));
  });
  Promise.all(jobs).then(function () {
    document.body.dataset.rendered = String(jobs.length);
  }, function (err) {
    window.__cpbenchRecordError("plot failed: " + (err && (err.stack || err)));
  });
})();
