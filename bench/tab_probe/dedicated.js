import { workerFacts } from "./facts.js";

workerFacts().then((facts) => self.postMessage(facts));
