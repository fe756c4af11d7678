"use strict";
// Airflow embeds this page in a sandboxed iframe ("allow-scripts allow-same-origin", no top navigation): a link
// with target=_top cannot navigate the window it names. The page is same-origin with Airflow's UI, so such a link
// moves the UI's own router instead: its URL pushed on the top window's history, then the popstate the router
// listens to. Opened on its own (no frame), or a modified click (a new tab), the link works as the browser has it.
document.addEventListener("click", e => {
  const a = e.target.closest ? e.target.closest('a[target="_top"]') : null;
  if (!a || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
  try {
    if (window.top === window) return;
    const top = window.top, url = new URL(a.getAttribute("href"), top.location.href);
    if (url.origin !== top.location.origin) return;
    e.preventDefault();
    const was = top.history.state || {};
    top.history.pushState({usr: null, key: Math.random().toString(36).slice(2, 10), idx: (was.idx || 0) + 1}, "",
                          url.pathname + url.search + url.hash);
    top.dispatchEvent(new PopStateEvent("popstate", {state: top.history.state}));
  } catch (err) { /* another origin: the browser's own behaviour */ }
});
