// Keyboard zoom for the run page's timeline: + / - zoom in / out around the middle of the view, the arrow keys
// pan by a quarter of it, 0 shows the whole trace. Plotly redraws what it has at once; the relayout it emits
// makes the server refine the new window, as a drag would.
document.addEventListener('keydown', function (event) {
    const target = event.target;
    if (event.ctrlKey || event.metaKey || event.altKey ||
        (target && (target.tagName === 'INPUT' || target.tagName === 'TEXTAREA' || target.isContentEditable))) {
        return;
    }
    const gd = document.querySelector('#timeline .js-plotly-plot');
    if (!gd || !gd.layout || !gd.layout.xaxis || !window.Plotly) { return; }
    const [lo, hi] = gd.layout.xaxis.range.map(Number);
    const mid = (lo + hi) / 2, half = (hi - lo) / 2;
    let range = null;
    if (event.key === '+' || event.key === '=') { range = [mid - half / 2, mid + half / 2]; }
    else if (event.key === '-' || event.key === '_') { range = [mid - half * 2, mid + half * 2]; }
    else if (event.key === 'ArrowLeft') { range = [lo - half / 2, hi - half / 2]; }
    else if (event.key === 'ArrowRight') { range = [lo + half / 2, hi + half / 2]; }
    else if (event.key === '0') {
        window.Plotly.relayout(gd, {'xaxis.autorange': true});
        event.preventDefault();
        return;
    }
    if (range) {
        window.Plotly.relayout(gd, {'xaxis.range': range});
        event.preventDefault();
    }
});
