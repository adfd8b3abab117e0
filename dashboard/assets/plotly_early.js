// plotly.js is fetched by dcc.Graph only when a page's first graph mounts, i.e. after the server has answered the
// page's callback, and evaluating it takes 1-2 s on a small machine before the timeline can be drawn. On the pages
// with graphs, fetch it as the page starts and run it as soon as that callback is sent, so that it loads while the
// server works, and load the server's /_plotly-lite.js (the same plotly without the trace types the dashboard never draws: about half the time;
// dashboard/plotly_lite.py). Until it has loaded, window.Plotly is a promise of it: dcc.Graph loads plotly through
// Promise.resolve(window.Plotly || ...), so it waits for this one instead of loading a second copy.
(function () {
  "use strict";
  if (!/\/(run|diff)(\/|$)/.test(window.location.pathname) || window.Plotly) {
    return;
  }
  var plotly, pending, started = false;
  var fetch = window.fetch;
  var lite = liteURL();
  if (lite) {  // fetched now, while the server is idle; run when the page's callback is sent
    var link = document.createElement("link");
    link.rel = "preload";
    link.as = "script";
    link.href = lite;
    document.head.appendChild(link);
  }

  function liteURL() {
    try {
      var config = JSON.parse(document.getElementById("_dash-config").textContent);
      return config.serve_locally === false ? null : (config.requests_pathname_prefix || "/") + "_plotly-lite.js";
    } catch (e) {
      return null;
    }
  }

  function start() {
    started = true;
    var script = document.createElement("script");
    script.src = lite || window._dashPlotlyJSURL;
    script.async = true;
    pending = new Promise(function (resolve) {
      script.onload = script.onerror = function () { pending = undefined; resolve(plotly); };
    });
    document.head.appendChild(script);
  }

  Object.defineProperty(window, "Plotly", {
    configurable: true,
    enumerable: true,
    get: function () { return plotly || pending; },
    set: function (value) { plotly = value; },
  });
  window.fetch = function (resource) {
    var url = typeof resource === "string" ? resource : (resource && resource.url) || "";
    if (!started && url.indexOf("_dash-update-component") !== -1) {
      start();
    }
    return fetch.apply(this, arguments);
  };
})();
