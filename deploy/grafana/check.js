#!/usr/bin/env node
// check.js - the Grafana dashboard and the alert rules against what the daemon exports
// (deploy/check.sh runs it).
//
//   node check.js DASHBOARD.json RULES.yml METRICS.txt OUT-RULES.yml
//
// Checks that the dashboard is JSON with unique panel ids and a query in every target, and that
// every metric name used by a dashboard query or an alert rule is one the daemon exports
// (METRICS.txt: a scrape of a real colld; its "# TYPE" lines name every family, histograms with
// their _bucket/_sum/_count series) or one of EXPECTED below. Writes every dashboard query as a
// recording rule into OUT-RULES.yml, with Grafana's variables replaced, so that
// `promtool check rules` can check their PromQL. Needs no npm package.
"use strict";

const fs = require("fs");

// Series the daemon does not export itself, each with the reason.
const EXPECTED = {
  up: "Prometheus' own per-target series",
  colld_quota_refusals_total: "per-limit refusals, added with the per-tenant limits (issue 13)",
};

const [dashboardFile, rulesFile, metricsFile, outFile] = process.argv.slice(2);
if (!outFile) {
  console.error("usage: check.js DASHBOARD.json RULES.yml METRICS.txt OUT-RULES.yml");
  process.exit(2);
}
const problems = [];

const exported = new Set();
for (const m of fs.readFileSync(metricsFile, "utf8").matchAll(/^# TYPE (\S+) (\S+)$/gm)) {
  exported.add(m[1]);
  if (m[2] === "histogram") for (const s of ["_bucket", "_sum", "_count"]) exported.add(m[1] + s);
}
if (exported.size === 0) problems.push(`${metricsFile}: no "# TYPE" line: not a scrape of colld`);

// Metric names in a PromQL expression: identifiers followed by { or a non-identifier character
// that are not functions, keywords or label names inside braces or by()/without() lists.
function metricNames(expr) {
  const names = new Set();
  const stripped = expr
    .replace(/"(?:[^"\\]|\\.)*"/g, '""')            // string literals
    .replace(/\{[^}]*\}/g, "{}")                     // label matchers
    .replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, "") // label lists
    .replace(/\[[^\]]*\]/g, "[]");                   // ranges
  for (const m of stripped.matchAll(/\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()/g)) {
    const id = m[1];
    if (/^(and|or|unless|bool|offset|by|without|on|ignoring|inf|nan|e)$/i.test(id)) continue;
    if (/^\d/.test(id)) continue;
    names.add(id);
  }
  return names;
}

function checkNames(where, expr) {
  for (const name of metricNames(expr))
    if (!exported.has(name) && !(name in EXPECTED))
      problems.push(`${where}: '${name}' is not a metric colld exports (${expr})`);
}

// The dashboard.
let dash;
try {
  dash = JSON.parse(fs.readFileSync(dashboardFile, "utf8"));
} catch (e) {
  console.error(`${dashboardFile}: ${e.message}`);
  process.exit(1);
}
const ids = new Set();
const queries = [];
for (const p of dash.panels || []) {
  if (ids.has(p.id)) problems.push(`${dashboardFile}: panel id ${p.id} used twice`);
  ids.add(p.id);
  if (p.type === "row") continue;
  if (!p.title) problems.push(`${dashboardFile}: panel ${p.id} has no title`);
  if (!Array.isArray(p.targets) || p.targets.length === 0) problems.push(`${dashboardFile}: panel '${p.title}' has no query`);
  for (const t of p.targets || []) {
    if (!t.expr) {
      problems.push(`${dashboardFile}: panel '${p.title}' target ${t.refId} has no expr`);
      continue;
    }
    checkNames(`${dashboardFile}: panel '${p.title}'`, t.expr);
    queries.push(t.expr.replace(/\$__rate_interval|\$__interval|\$__range/g, "5m").replace(/\$\{?instance\}?/g, ".*"));
  }
}
for (const v of dash.templating?.list || [])
  if (v.type === "query" && typeof v.query === "string") checkNames(`${dashboardFile}: variable ${v.name}`, v.query.replace(/^label_values\((.*),\s*\w+\)$/, "$1"));

// The alert rules: their "expr:" values, on the same line or as a folded block (">-", ">", "|")
// on the lines indented deeper below it.
const ruleLines = fs.readFileSync(rulesFile, "utf8").split("\n");
let nexpr = 0;
for (let i = 0; i < ruleLines.length; i++) {
  const m = /^(\s*)(?:- )?expr:\s*(.*)$/.exec(ruleLines[i]);
  if (!m) continue;
  let expr = m[2];
  if (/^[>|]-?$/.test(expr)) {
    expr = "";
    while (i + 1 < ruleLines.length && (ruleLines[i + 1].match(/^\s*/)[0].length > m[1].length || !ruleLines[i + 1].trim()))
      expr += " " + ruleLines[++i].trim();
  }
  nexpr++;
  checkNames(rulesFile, expr.trim());
}
if (nexpr === 0) problems.push(`${rulesFile}: no expr found`);

const out = ["groups:", "  - name: dashboard", "    rules:"];
queries.forEach((q, i) => out.push(`      - record: dashboard:query_${i}`, `        expr: ${JSON.stringify(q)}`));
fs.writeFileSync(outFile, out.join("\n") + "\n");

if (problems.length) {
  for (const p of problems) console.error(p);
  process.exit(1);
}
console.log(`${ids.size} panels, ${queries.length} queries, ${nexpr} alert expressions: every metric exported`);
