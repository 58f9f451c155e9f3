#!/usr/bin/env node
// validate.js - offline validation of colld's Kubernetes manifests (deploy/check.sh runs it).
//
//   node validate.js --modules DIR [--colld-help FILE] KUSTOMIZATION_DIR|MANIFEST.yaml...
//
// Each Kustomization directory is built as `kubectl kustomize` would for the subset of
// Kustomize that colld's manifests use (resources, namespace, images, JSON 6902 patches with a
// kind/name target); any other Kustomization field is an error, so the manifests cannot start
// relying on something this builder does not do. Every resulting object is then checked:
//  - against the Kubernetes OpenAPI schema of its apiVersion/kind (npm package kubernetes-models,
//    version pinned in package-lock.json, installed by `make deps` into DIR);
//  - for fields the schema does not know (the schema alone accepts them; the API server drops
//    them, so a typo such as hostIPc would silently do nothing);
//  - for colld's own rules: every $(VAR) in args and command is defined in env, probe ports name
//    a declared port, every volumeMount names a volume, and every --option given to colld is an
//    option of `colld --help` (FILE holds that output).
// Exit status 0 when everything is valid, 1 after printing every problem found.
"use strict";

const fs = require("fs");
const path = require("path");

const args = process.argv.slice(2);
let modules = null;
let colldHelp = null;
const inputs = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === "--modules") modules = args[++i];
  else if (args[i] === "--colld-help") colldHelp = args[++i];
  else inputs.push(args[i]);
}
if (!modules || inputs.length === 0) {
  console.error("usage: validate.js --modules DIR [--colld-help FILE] KUSTOMIZATION_DIR|MANIFEST.yaml...");
  process.exit(2);
}
const need = (name) => require(path.join(path.resolve(modules), "node_modules", name));
const YAML = need("yaml");

const problems = [];
const problem = (where, what) => problems.push(`${where}: ${what}`);

// ------------------------------------------------------------------------------------------------
// Reading manifests and building Kustomizations
// ------------------------------------------------------------------------------------------------

// Every YAML document of a file, as plain objects.
function readManifests(file) {
  const docs = YAML.parseAllDocuments(fs.readFileSync(file, "utf8"));
  const out = [];
  for (const doc of docs) {
    if (doc.errors.length) {
      for (const e of doc.errors) problem(file, e.message);
      continue;
    }
    const obj = doc.toJS();
    if (obj !== null) out.push({ obj, source: file });
  }
  return out;
}

// Kinds that live outside namespaces (the ones colld's manifests could use).
const CLUSTER_SCOPED = new Set(["Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass",
  "RuntimeClass", "CustomResourceDefinition", "StorageClass", "PersistentVolume"]);
const KUSTOMIZATION_FIELDS = new Set(["apiVersion", "kind", "namespace", "resources", "images", "patches"]);

// Decode one JSON pointer into its reference tokens.
function pointerTokens(ptr) {
  if (ptr === "") return [];
  if (!ptr.startsWith("/")) throw new Error(`path '${ptr}' does not start with /`);
  return ptr.slice(1).split("/").map((t) => t.replace(/~1/g, "/").replace(/~0/g, "~"));
}

// Apply one RFC 6902 operation (add, replace, remove) to obj in place.
function applyOp(obj, op) {
  const tokens = pointerTokens(op.path);
  const last = tokens.pop();
  let parent = obj;
  for (const t of tokens) {
    if (parent === null || typeof parent !== "object" || !(t in parent))
      throw new Error(`${op.op} ${op.path}: '${t}' does not exist`);
    parent = parent[t];
  }
  if (parent === null || typeof parent !== "object") throw new Error(`${op.op} ${op.path}: parent is not an object`);
  if (Array.isArray(parent)) {
    const idx = last === "-" ? parent.length : Number(last);
    if (!Number.isInteger(idx) || idx < 0 || idx > parent.length)
      throw new Error(`${op.op} ${op.path}: bad array index '${last}'`);
    if (op.op === "add") parent.splice(idx, 0, op.value);
    else if (idx >= parent.length) throw new Error(`${op.op} ${op.path}: no element ${idx}`);
    else if (op.op === "replace") parent[idx] = op.value;
    else if (op.op === "remove") parent.splice(idx, 1);
    else throw new Error(`unsupported patch operation '${op.op}'`);
    return;
  }
  if (op.op === "add") parent[last] = op.value;
  else if (!(last in parent)) throw new Error(`${op.op} ${op.path}: '${last}' does not exist`);
  else if (op.op === "replace") parent[last] = op.value;
  else if (op.op === "remove") delete parent[last];
  else throw new Error(`unsupported patch operation '${op.op}'`);
}

// Build a Kustomization directory into a list of {obj, source}.
function buildKustomization(dir, depth = 0) {
  if (depth > 8) throw new Error(`${dir}: Kustomizations nested too deep`);
  const file = ["kustomization.yaml", "kustomization.yml", "Kustomization"].map((f) => path.join(dir, f))
    .find((f) => fs.existsSync(f));
  if (!file) {
    problem(dir, "no kustomization.yaml");
    return [];
  }
  const k = YAML.parse(fs.readFileSync(file, "utf8")) || {};
  for (const key of Object.keys(k))
    if (!KUSTOMIZATION_FIELDS.has(key))
      problem(file, `field '${key}' is not one this builder implements (${[...KUSTOMIZATION_FIELDS].join(", ")})`);
  if (k.apiVersion !== "kustomize.config.k8s.io/v1beta1" || k.kind !== "Kustomization")
    problem(file, "apiVersion/kind must be kustomize.config.k8s.io/v1beta1 Kustomization");
  let objs = [];
  for (const r of k.resources || []) {
    const p = path.join(dir, r);
    if (!fs.existsSync(p)) problem(file, `resource '${r}' does not exist`);
    else if (fs.statSync(p).isDirectory()) objs = objs.concat(buildKustomization(p, depth + 1));
    else objs = objs.concat(readManifests(p));
  }
  for (const [i, patch] of (k.patches || []).entries()) {
    const where = `${file}: patches[${i}]`;
    const t = patch.target || {};
    const targets = objs.filter((o) => (!t.kind || o.obj.kind === t.kind) && (!t.name || o.obj.metadata?.name === t.name));
    if (targets.length === 0) problem(where, `target ${t.kind}/${t.name} matches no resource`);
    let ops;
    try {
      ops = YAML.parse(patch.patch || "");
      if (!Array.isArray(ops)) throw new Error("the patch is not a JSON 6902 list of operations");
    } catch (e) {
      problem(where, e.message);
      continue;
    }
    for (const o of targets)
      for (const op of ops) {
        try {
          applyOp(o.obj, op);
        } catch (e) {
          problem(where, e.message);
        }
      }
  }
  for (const o of objs) {
    if (k.namespace && !CLUSTER_SCOPED.has(o.obj.kind)) o.obj.metadata = { ...o.obj.metadata, namespace: k.namespace };
    for (const img of k.images || []) forEachContainer(o.obj, (c) => {
      const [name, tag] = splitImage(c.image || "");
      if (name === img.name) c.image = `${img.newName || name}:${img.newTag || tag}`;
    });
    o.source = `${o.source} (via ${file})`;
  }
  return objs;
}

function splitImage(image) {
  const at = image.lastIndexOf(":");
  return at > image.lastIndexOf("/") ? [image.slice(0, at), image.slice(at + 1)] : [image, "latest"];
}

// The pod spec of a workload object, or null.
function podSpec(obj) {
  if (obj.kind === "Pod") return obj.spec || null;
  return obj.spec?.template?.spec || null;
}

function forEachContainer(obj, fn) {
  const spec = podSpec(obj);
  if (!spec) return;
  for (const c of [...(spec.initContainers || []), ...(spec.containers || [])]) fn(c);
}

// ------------------------------------------------------------------------------------------------
// Schema validation
// ------------------------------------------------------------------------------------------------

// The validator of an apiVersion/kind: Kubernetes' own kinds from kubernetes-models (apps/v1
// DaemonSet -> _schemas/IoK8sApiAppsV1DaemonSet), the Prometheus Operator's from
// @kubernetes-models/prometheus-operator (monitoring.coreos.com/v1 PodMonitor ->
// _schemas/MonitoringCoreosComV1PodMonitor).
function schemaValidator(apiVersion, kind) {
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["core", apiVersion];
  const cap = (s) => s.charAt(0).toUpperCase() + s.slice(1);
  const module = group === "monitoring.coreos.com"
    ? `@kubernetes-models/prometheus-operator/_schemas/${group.split(".").map(cap).join("")}${cap(version)}${kind}`
    : `kubernetes-models/_schemas/IoK8sApi${cap(group.split(".")[0])}${cap(version)}${kind}`;
  try {
    return need(module).validate;
  } catch (e) {
    return null;
  }
}

// Wrap obj so that every property the validator looks at is recorded in `seen` (a Map from the
// original object to the set of its keys that were read).
function tracked(obj, seen, cache) {
  if (obj === null || typeof obj !== "object") return obj;
  if (cache.has(obj)) return cache.get(obj);
  if (!seen.has(obj)) seen.set(obj, new Set());
  const keys = seen.get(obj);
  const proxy = new Proxy(obj, {
    get(target, prop, receiver) {
      if (typeof prop === "string") keys.add(prop);
      return tracked(Reflect.get(target, prop, receiver), seen, cache);
    },
    has(target, prop) {
      if (typeof prop === "string") keys.add(prop);
      return Reflect.has(target, prop);
    },
  });
  cache.set(obj, proxy);
  return proxy;
}

// Report every key of obj (recursively) that the validator never read.
function unknownFields(obj, seen, where, ptr = "") {
  if (obj === null || typeof obj !== "object") return;
  const keys = seen.get(obj);
  for (const key of Object.keys(obj)) {
    const p = Array.isArray(obj) ? `${ptr}/${key}` : `${ptr}/${key}`;
    if (!Array.isArray(obj) && !(keys && keys.has(key))) problem(where, `unknown field ${p}`);
    else unknownFields(obj[key], seen, where, p);
  }
}

function validateSchema(o) {
  const { obj } = o;
  const where = `${o.source}: ${obj.kind}/${obj.metadata?.name}`;
  if (typeof obj.apiVersion !== "string" || typeof obj.kind !== "string") {
    problem(o.source, "a document without apiVersion and kind");
    return;
  }
  const validate = schemaValidator(obj.apiVersion, obj.kind);
  if (!validate) {
    problem(where, `no schema for ${obj.apiVersion} ${obj.kind} in kubernetes-models`);
    return;
  }
  const seen = new Map();
  if (!validate(tracked(obj, seen, new Map()))) {
    for (const e of validate.errors) problem(where, `${e.instancePath || "/"} ${e.message || e.keyword} ${JSON.stringify(e.params)}`);
    return;
  }
  unknownFields(obj, seen, where);
}

// ------------------------------------------------------------------------------------------------
// colld's own rules
// ------------------------------------------------------------------------------------------------

function colldOptions() {
  if (!colldHelp) return null;
  const opts = new Set();
  for (const m of fs.readFileSync(colldHelp, "utf8").matchAll(/^\s*(--[a-z0-9-]+)/gm)) opts.add(m[1]);
  if (opts.size === 0) problem(colldHelp, "no options found in the colld --help output");
  return opts;
}

function checkPod(o, options) {
  const spec = podSpec(o.obj);
  if (!spec) return;
  const where = `${o.source}: ${o.obj.kind}/${o.obj.metadata?.name}`;
  const volumes = new Set((spec.volumes || []).map((v) => v.name));
  for (const c of [...(spec.initContainers || []), ...(spec.containers || [])]) {
    const cw = `${where}: container ${c.name}`;
    const env = new Set((c.env || []).map((e) => e.name));
    for (const a of [...(c.command || []), ...(c.args || [])]) {
      for (const m of String(a).matchAll(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g))
        if (!env.has(m[1])) problem(cw, `'${a}' uses $(${m[1]}), which env does not define`);
    }
    const ports = new Set((c.ports || []).map((p) => p.name).filter(Boolean));
    for (const probe of ["startupProbe", "livenessProbe", "readinessProbe"]) {
      const port = c[probe]?.httpGet?.port;
      if (typeof port === "string" && !ports.has(port)) problem(cw, `${probe} uses port '${port}', which is not declared`);
    }
    for (const vm of c.volumeMounts || [])
      if (!volumes.has(vm.name)) problem(cw, `volumeMount '${vm.name}' names no volume`);
    const isColld = (c.image || "").split("/").pop().startsWith("colld");
    if (isColld && options)
      for (const a of c.args || []) {
        const m = /^(--[a-z0-9-]+)/.exec(String(a));
        if (m && !options.has(m[1])) problem(cw, `${m[1]} is not an option of colld (colld --help)`);
      }
  }
}

// ------------------------------------------------------------------------------------------------

const options = colldOptions();
let objects = [];
for (const input of inputs) {
  try {
    objects = objects.concat(fs.statSync(input).isDirectory() ? buildKustomization(input) : readManifests(input));
  } catch (e) {
    problem(input, e.message);
  }
}
for (const o of objects) {
  validateSchema(o);
  checkPod(o, options);
}
if (problems.length) {
  for (const p of problems) console.error(`kubernetes: ${p}`);
  console.error(`kubernetes: ${problems.length} problem(s) in ${objects.length} object(s)`);
  process.exit(1);
}
console.log(`kubernetes: ${objects.length} object(s) from ${inputs.length} input(s) valid`);
