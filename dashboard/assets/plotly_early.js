// plotly.js is fetched by dcc.Graph only when a page's first graph mounts, i.e. after the server has answered the
// page's callback, and evaluating it takes 1-2 s on a small machine before the timeline can be drawn.
// - Every page's graphs load the server's /_plotly-lite.js instead of the full bundle: the same plotly without the
//   trace types the dashboard never draws, in about half the time (dashboard/plotly_lite.py). dcc.Graph loads
//   window._dashPlotlyJSURL, which Dash sets once it starts: that name answers the lite URL here.
// - Opened directly, the pages with graphs fetch it as the page starts and run it as soon as the page's callback is
//   sent, so that it loads while the server works. Until then window.Plotly is a promise of it: dcc.Graph loads
//   plotly through Promise.resolve(window.Plotly || ...), so it waits for this one instead of loading another copy.
(function () {
  "use strict";
  var lite = liteURL();
  if (!lite || window.Plotly) {
    return;
  }
  Object.defineProperty(window, "_dashPlotlyJSURL", {
    configurable: true,
    get: function () { return lite; },
    set: function () {},
  });
  if (!/\/(run|diff|job)(\/|$)/.test(window.location.pathname)) {
    return;
  }
  var plotly, pending, started = false;
  var fetch = window.fetch;
  var link = document.createElement("link");  // fetched now, while the server is idle
  link.rel = "preload";
  link.as = "script";
  link.href = lite;
  document.head.appendChild(link);

  function start() {
    started = true;
    var script = document.createElement("script");
    script.src = lite;
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

  function liteURL() {
    try {
      var config = JSON.parse(document.getElementById("_dash-config").textContent);
      return config.serve_locally === false ? null : (config.requests_pathname_prefix || "/") + "_plotly-lite.js";
    } catch (e) {
      return null;
    }
  }
})();
