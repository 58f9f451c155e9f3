#!/usr/bin/env python3
"""check.py - the Grafana dashboard and the alert rules against what the daemon exports
(deploy/check.sh runs it).

    check.py DASHBOARD.json RULES.yml METRICS.txt OUT-RULES.yml

Checks that the dashboard is JSON with unique panel ids and a query in every target, and that
every metric name used by a dashboard query or an alert rule is one the daemon exports
(METRICS.txt: a scrape of a real colld; its "# TYPE" lines name every family, histograms with
their _bucket/_sum/_count series) or one of EXPECTED below. Writes every dashboard query as a
recording rule into OUT-RULES.yml, with Grafana's variables replaced, so that
`promtool check rules` can check their PromQL. Needs only Python's standard library.
"""

import json
import re
import sys

# Series the daemon does not export itself, each with the reason.
EXPECTED = {
    "up": "Prometheus' own per-target series",
    "colld_quota_refusals_total": "per-limit refusals, added with the per-tenant limits (issue 13)",
}
# PromQL words that are not metric names.
KEYWORDS = re.compile(r"and|or|unless|bool|offset|by|without|on|ignoring|inf|nan|e", re.I | re.A)


def metric_names(expr):
    """Metric names in a PromQL expression: identifiers that are not followed by "(" (functions),
    not keywords, and not label names inside braces or by()/without() lists."""
    stripped = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    stripped = re.sub(r"\{[^}]*\}", "{}", stripped)  # label matchers
    stripped = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", stripped, flags=re.A)
    stripped = re.sub(r"\[[^\]]*\]", "[]", stripped)  # ranges
    names = {}
    for m in re.finditer(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", stripped, re.A):
        name = m.group(1)
        if KEYWORDS.fullmatch(name) or name[0].isdigit():
            continue
        names[name] = True
    return list(names)


def main():
    if len(sys.argv) != 5:
        print("usage: check.py DASHBOARD.json RULES.yml METRICS.txt OUT-RULES.yml", file=sys.stderr)
        return 2
    dashboard_file, rules_file, metrics_file, out_file = sys.argv[1:]
    problems = []

    exported = set()
    with open(metrics_file, encoding="utf-8") as f:
        for m in re.finditer(r"^# TYPE (\S+) (\S+)$", f.read(), re.M):
            exported.add(m.group(1))
            if m.group(2) == "histogram":
                exported.update(m.group(1) + s for s in ("_bucket", "_sum", "_count"))
    if not exported:
        problems.append(f'{metrics_file}: no "# TYPE" line: not a scrape of colld')

    def check_names(where, expr):
        for name in metric_names(expr):
            if name not in exported and name not in EXPECTED:
                problems.append(f"{where}: '{name}' is not a metric colld exports ({expr})")

    # The dashboard.
    try:
        with open(dashboard_file, encoding="utf-8") as f:
            dash = json.load(f)
    except (OSError, ValueError) as e:
        print(f"{dashboard_file}: {e}", file=sys.stderr)
        return 1
    if not isinstance(dash, dict):
        dash = {}
    ids = set()
    queries = []
    for p in dash.get("panels") or []:
        if not isinstance(p, dict):
            problems.append(f"{dashboard_file}: a panel that is not an object: {json.dumps(p)}")
            continue
        pid = json.dumps(p.get("id"))
        if pid in ids:
            problems.append(f"{dashboard_file}: panel id {pid} used twice")
        ids.add(pid)
        if p.get("type") == "row":
            continue
        title = p.get("title")
        if not title:
            problems.append(f"{dashboard_file}: panel {pid} has no title")
        targets = p.get("targets")
        if not isinstance(targets, list) or not targets:
            problems.append(f"{dashboard_file}: panel '{title}' has no query")
        for t in targets if isinstance(targets, list) else []:
            expr = t.get("expr") if isinstance(t, dict) else None
            if not expr or not isinstance(expr, str):
                ref = t.get("refId") if isinstance(t, dict) else None
                problems.append(f"{dashboard_file}: panel '{title}' target {ref} has no expr")
                continue
            check_names(f"{dashboard_file}: panel '{title}'", expr)
            q = re.sub(r"\$__rate_interval|\$__interval|\$__range", "5m", expr)
            queries.append(re.sub(r"\$\{?instance\}?", ".*", q))
    templating = dash.get("templating") if isinstance(dash.get("templating"), dict) else {}
    for v in templating.get("list") or []:
        if isinstance(v, dict) and v.get("type") == "query" and isinstance(v.get("query"), str):
            query = re.sub(r"^label_values\((.*),\s*\w+\)\Z", r"\1", v["query"], flags=re.A)
            check_names(f"{dashboard_file}: variable {v.get('name')}", query)

    # The alert rules: their "expr:" values, on the same line or as a folded block (">-", ">",
    # "|") on the lines indented deeper below it.
    with open(rules_file, encoding="utf-8") as f:
        lines = f.read().split("\n")
    nexpr = 0
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)(?:- )?expr:\s*(.*)$", lines[i])
        if m:
            expr = m.group(2)
            if re.fullmatch(r"[>|]-?", expr):
                expr = ""
                while i + 1 < len(lines) and (len(re.match(r"\s*", lines[i + 1]).group(0)) > len(m.group(1))
                                              or not lines[i + 1].strip()):
                    i += 1
                    expr += " " + lines[i].strip()
            nexpr += 1
            check_names(rules_file, expr.strip())
        i += 1
    if nexpr == 0:
        problems.append(f"{rules_file}: no expr found")

    out = ["groups:", "  - name: dashboard", "    rules:"]
    for n, q in enumerate(queries):
        out += [f"      - record: dashboard:query_{n}", f"        expr: {json.dumps(q, ensure_ascii=False)}"]
    with open(out_file, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")

    if problems:
        for p in problems:
            print(p, file=sys.stderr)
        return 1
    print(f"{len(ids)} panels, {len(queries)} queries, {nexpr} alert expressions: every metric exported")
    return 0


if __name__ == "__main__":
    sys.exit(main())
