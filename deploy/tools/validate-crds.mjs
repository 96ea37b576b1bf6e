// Validates prometheus-operator objects (PodMonitor, ServiceMonitor, PrometheusRule) against the
// CRD schemas compiled in @kubernetes-models/prometheus-operator (npm).
//   node deploy/tools/validate-crds.mjs < objects.json      (a JSON array of objects)
// Prints one line per object ("ok KIND NAME" or "invalid KIND NAME: reason"); exit 1 if any is invalid.
import { PodMonitor, ServiceMonitor, PrometheusRule } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";
import { readFileSync } from "node:fs";

const models = { PodMonitor, ServiceMonitor, PrometheusRule };
const objects = JSON.parse(readFileSync(0, "utf8"));
let failed = 0;
for (const obj of objects) {
  const Model = models[obj.kind];
  const name = `${obj.kind} ${obj.metadata?.name}`;
  if (!Model || obj.apiVersion !== "monitoring.coreos.com/v1") {
    console.log(`invalid ${name}: not a monitoring.coreos.com/v1 PodMonitor, ServiceMonitor or PrometheusRule`);
    failed++;
    continue;
  }
  try {
    new Model(obj).validate();
    console.log(`ok ${name}`);
  } catch (e) {
    console.log(`invalid ${name}: ${e.message}`);
    failed++;
  }
}
process.exit(failed ? 1 : 0);
