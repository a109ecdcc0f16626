// Validates Kubernetes objects against the Kubernetes OpenAPI schemas (the npm package
// kubernetes-models, installed by scripts/setup into $SOCKMESH_TOOLS/node).
// stdin: a JSON array of objects. stdout: one line per object, "ok <kind>/<name>" or
// "invalid <kind>/<name>: <errors>"; exit 1 if any object is invalid or of an unknown kind.
import { readFileSync, existsSync } from "node:fs";
import { pathToFileURL } from "node:url";

const tools = process.env.SOCKMESH_TOOLS || "/opt/sockmesh-tools";
const root = `${tools}/node/node_modules/kubernetes-models`;

const objects = JSON.parse(readFileSync(0, "utf8"));
let failed = 0;
for (const obj of objects) {
  const [group, version] = obj.apiVersion.includes("/") ? obj.apiVersion.split("/") : ["", obj.apiVersion];
  const file = `${root}/${group ? group + "/" : ""}${version}/${obj.kind}.js`;
  const what = `${obj.kind}/${obj.metadata?.name}`;
  if (!existsSync(file)) {
    console.log(`invalid ${what}: no schema for ${obj.apiVersion} ${obj.kind}`);
    failed++;
    continue;
  }
  const mod = await import(pathToFileURL(file).href);
  const Model = mod[obj.kind];
  try {
    new Model(obj).validate();
    console.log(`ok ${what}`);
  } catch (e) {
    const detail = e.errors ? JSON.stringify(e.errors) : e.message;
    console.log(`invalid ${what}: ${detail}`);
    failed++;
  }
}
process.exit(failed ? 1 : 0);
