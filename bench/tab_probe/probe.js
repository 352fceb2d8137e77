// The facts behind the choice of per-tab engines (docs/architecture.md), as this browser has them: a SharedWorker
// beside a dedicated Worker, each asked what it can use; and the BroadcastChannel's delivery time between two
// pages of the origin (page `?role=listen` stamps what it receives). The page writes them into its dataset.
const root = document.documentElement;
const role = new URLSearchParams(location.search).get("role");
const channel = new BroadcastChannel("pagedkv-probe");
const now = () => performance.timeOrigin + performance.now();

if (role === "listen") {
  const got = [];
  channel.onmessage = (e) => { got.push(now() - e.data.sent); root.dataset.received = JSON.stringify(got); };
  root.dataset.listening = "1";
} else {
  const shared = new SharedWorker("shared.js", { type: "module" });
  const fromShared = new Promise((resolve) => { shared.port.onmessage = (e) => resolve(e.data); });
  const dedicated = new Worker("dedicated.js", { type: "module" });
  const fromDedicated = new Promise((resolve) => { dedicated.onmessage = (e) => resolve(e.data); });
  Promise.all([fromShared, fromDedicated]).then(([sharedWorker, dedicatedWorker]) => {
    root.dataset.facts = JSON.stringify({ page: { crossOriginIsolated: self.crossOriginIsolated === true },
                                          sharedWorker, dedicatedWorker });
  });
  window.probeSend = (n) => { for (let i = 0; i < n; i++) channel.postMessage({ i, sent: now() }); };
}
