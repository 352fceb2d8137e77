import { workerFacts } from "./facts.js";

self.onconnect = async (event) => {
  const port = event.ports[0];
  port.postMessage(await workerFacts());
};
