#!/usr/bin/env python3
"""validate.py - offline validation of colld's Kubernetes manifests (deploy/check.sh runs it).

    validate.py [--colld-help FILE] [--kubernetes-version X.Y] KUSTOMIZATION_DIR|MANIFEST.yaml...

Each Kustomization directory is built as `kubectl kustomize` would for the subset of Kustomize
that colld's manifests use (resources, namespace, images, JSON 6902 patches with a kind/name
target); any other Kustomization field is an error, so the manifests cannot start relying on
something this builder does not do. Every resulting object is then checked:
 - against the Kubernetes OpenAPI schema of its apiVersion/kind: the strict schemas (every object
   closed with additionalProperties: false) that the PyPI package kubernetes-validate ships, for
   Kubernetes KUBERNETES_VERSION below (requirements.txt pins the package). So a field the schema
   does not know is an error: the API server would drop it, and a typo such as hostIPc would
   silently do nothing;
 - the Prometheus Operator's PodMonitor against the JSON Schema of the pydantic model that the
   PyPI package cloudcoil-models-prometheus-operator generated from the release's
   CustomResourceDefinition (requirements.txt pins 0.80.1.0: prometheus-operator v0.80.1), made
   strict the same way: the API server prunes the fields a structural schema does not declare,
   while pydantic would ignore them (CUSTOM_RESOURCES below);
 - for colld's own rules: every $(VAR) in args and command is defined in env, probe ports name
   a declared port, every volumeMount names a volume, and every --option given to colld is an
   option of `colld --help` (FILE holds that output).
YAML is read as the API server reads it (YAML 1.1), and a key given twice in one mapping is an
error, as it is for `kubectl apply`. Exit status 0 when everything is valid, 1 after printing
every problem found, 2 on a usage error or when the schemas or a package they come from are
missing.
"""

import argparse
import copy
import importlib
import importlib.metadata
import json
import os
import re
import sys

try:
    import jsonschema
    import referencing
    import yaml
    import kubernetes_validate
    import kubernetes_validate.utils
    from kubernetes_validate.version import __version__ as KV_VERSION
except ImportError as e:
    print(f"validate.py: {e} (the project's virtual environment has it: make deps)", file=sys.stderr)
    sys.exit(2)

# The Kubernetes release whose schemas the objects are checked against (--kubernetes-version
# changes it): 1.33, the schemas of the previous checker (the npm package kubernetes-models 4.5).
# An older release is the stricter choice: a field added after it would be dropped by its API
# server, so it is an unknown field here. kubernetes-validate 1.37.0 ships 1.25 to 1.37.
KUBERNETES_VERSION = "1.33"
# The Kustomization fields this builder implements, and of each patch.
KUSTOMIZATION_FIELDS = ("apiVersion", "kind", "namespace", "resources", "images", "patches")
PATCH_FIELDS = ("target", "patch")
TARGET_FIELDS = ("kind", "name")
# Custom resources: (apiVersion, kind) -> (the PyPI package, its module and the pydantic model
# generated from the CRD, the project whose CRD it is). The package is imported only when such an
# object is checked (it takes seconds); its version is the project's release and a fourth number
# of its own: cloudcoil-models-prometheus-operator 0.80.1.0 is prometheus-operator v0.80.1.
CUSTOM_RESOURCES = {
    ("monitoring.coreos.com/v1", "PodMonitor"): (
        "cloudcoil-models-prometheus-operator", "cloudcoil.models.prometheus_operator.v1", "PodMonitor",
        "prometheus-operator"),
}
# Kinds that live outside namespaces (the ones colld's manifests could use).
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass", "RuntimeClass",
                  "CustomResourceDefinition", "StorageClass", "PersistentVolume"}
DEFINITIONS_ID = "https://kubernetes.io/api/_definitions.json"
OBJECT_META = DEFINITIONS_ID + "#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"

problems = []


def problem(where, what):
    problems.append(f"{where}: {what}")


# ------------------------------------------------------------------------------------------------
# Reading manifests and building Kustomizations
# ------------------------------------------------------------------------------------------------

class StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """PyYAML's safe loader (YAML 1.1, like the API server's reader) that refuses a mapping with
    the same key twice; PyYAML alone keeps the last one without a word."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                continue  # the constructor below says so
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key '{key}'",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)



def load_yaml(text):
    return yaml.load(text, Loader=StrictLoader)


def yaml_error(e):
    """A YAML error on one line: "line L, column C: what"."""
    mark = getattr(e, "problem_mark", None)
    what = " ".join(str(x) for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x)
    if mark is None or not what:
        return " ".join(str(e).split())
    return f"line {mark.line + 1}, column {mark.column + 1}: {what}"


class Obj:
    """One Kubernetes object and where it came from."""

    def __init__(self, obj, source):
        self.obj = obj
        self.source = source

    def where(self):
        meta = self.obj.get("metadata") if isinstance(self.obj.get("metadata"), dict) else {}
        return f"{self.source}: {self.obj.get('kind')}/{meta.get('name')}"


def read_manifests(path):
    """Every YAML document of a file, as Obj."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    out = []
    try:
        docs = list(yaml.load_all(text, Loader=StrictLoader))
    except yaml.YAMLError as e:
        problem(path, yaml_error(e))
        return out
    for doc in docs:
        if doc is None:
            continue
        if not isinstance(doc, dict):
            problem(path, f"a document that is not a mapping ({type(doc).__name__})")
            continue
        out.append(Obj(doc, path))
    return out


def pointer_tokens(ptr):
    """Decode one JSON pointer into its reference tokens."""
    if ptr == "":
        return []
    if not isinstance(ptr, str) or not ptr.startswith("/"):
        raise ValueError(f"path '{ptr}' does not start with /")
    return [t.replace("~1", "/").replace("~0", "~") for t in ptr[1:].split("/")]


def child(parent, token):
    """parent[token] for a JSON pointer token, or None when there is none."""
    if isinstance(parent, list):
        if re.fullmatch(r"0|[1-9][0-9]*", token) and int(token) < len(parent):
            return parent[int(token)], True
        return None, False
    if isinstance(parent, dict) and token in parent:
        return parent[token], True
    return None, False


def apply_op(obj, op):
    """Apply one RFC 6902 operation (add, replace, remove) to obj in place."""
    if not isinstance(op, dict):
        raise ValueError(f"operation {op!r} is not a mapping")
    name, path = op.get("op"), op.get("path")
    if name not in ("add", "replace", "remove"):
        raise ValueError(f"unsupported patch operation '{name}'")
    if name != "remove" and "value" not in op:
        raise ValueError(f"{name} {path}: no value")
    tokens = pointer_tokens(path)
    if not tokens:
        raise ValueError(f"{name} {path}: the whole object cannot be patched")
    last = tokens.pop()
    parent = obj
    for t in tokens:
        parent, found = child(parent, t)
        if not found:
            raise ValueError(f"{name} {path}: '{t}' does not exist")
    if isinstance(parent, list):
        if last == "-":
            idx = len(parent)
        elif re.fullmatch(r"0|[1-9][0-9]*", last):
            idx = int(last)
        else:
            idx = -1
        if idx < 0 or idx > len(parent):
            raise ValueError(f"{name} {path}: bad array index '{last}'")
        if name == "add":
            parent.insert(idx, copy.deepcopy(op["value"]))
        elif idx >= len(parent):
            raise ValueError(f"{name} {path}: no element {idx}")
        elif name == "replace":
            parent[idx] = copy.deepcopy(op["value"])
        else:
            del parent[idx]
        return
    if not isinstance(parent, dict):
        raise ValueError(f"{name} {path}: parent is not an object")
    if name == "add":
        parent[last] = copy.deepcopy(op["value"])
    elif last not in parent:
        raise ValueError(f"{name} {path}: '{last}' does not exist")
    elif name == "replace":
        parent[last] = copy.deepcopy(op["value"])
    else:
        del parent[last]


def split_image(image):
    at = image.rfind(":")
    return (image[:at], image[at + 1:]) if at > image.rfind("/") else (image, "latest")


def pod_spec(obj):
    """The pod spec of a workload object, or None."""
    if obj.get("kind") == "Pod":
        spec = obj.get("spec")
    else:
        spec = ((obj.get("spec") or {}).get("template") or {}).get("spec") if isinstance(obj.get("spec"), dict) else None
    return spec if isinstance(spec, dict) else None


def containers(spec):
    """The init containers and containers of a pod spec that are mappings."""
    out = []
    for field in ("initContainers", "containers"):
        out += [c for c in spec.get(field) or [] if isinstance(c, dict)]
    return out


def build_kustomization(d, depth=0):
    """Build a Kustomization directory into a list of Obj."""
    if depth > 8:
        raise ValueError(f"{d}: Kustomizations nested too deep")
    file = next((os.path.join(d, f) for f in ("kustomization.yaml", "kustomization.yml", "Kustomization")
                 if os.path.exists(os.path.join(d, f))), None)
    if file is None:
        problem(d, "no kustomization.yaml")
        return []
    with open(file, encoding="utf-8") as f:
        text = f.read()
    try:
        k = load_yaml(text) or {}
    except yaml.YAMLError as e:
        problem(file, yaml_error(e))
        return []
    if not isinstance(k, dict):
        problem(file, "not a mapping")
        return []
    for key in k:
        if key not in KUSTOMIZATION_FIELDS:
            problem(file, f"field '{key}' is not one this builder implements ({', '.join(KUSTOMIZATION_FIELDS)})")
    if k.get("apiVersion") != "kustomize.config.k8s.io/v1beta1" or k.get("kind") != "Kustomization":
        problem(file, "apiVersion/kind must be kustomize.config.k8s.io/v1beta1 Kustomization")
    objs = []
    for r in k.get("resources") or []:
        p = os.path.join(d, str(r))
        if not os.path.exists(p):
            problem(file, f"resource '{r}' does not exist")
        elif os.path.isdir(p):
            objs += build_kustomization(p, depth + 1)
        else:
            objs += read_manifests(p)
    for i, patch in enumerate(k.get("patches") or []):
        where = f"{file}: patches[{i}]"
        if not isinstance(patch, dict):
            problem(where, "not a mapping")
            continue
        for key in patch:
            if key not in PATCH_FIELDS:
                problem(where, f"field '{key}' is not one this builder implements ({', '.join(PATCH_FIELDS)})")
        t = patch.get("target") or {}
        for key in t:
            if key not in TARGET_FIELDS:
                problem(where, f"target field '{key}' is not one this builder implements ({', '.join(TARGET_FIELDS)})")
        targets = [o for o in objs if (not t.get("kind") or o.obj.get("kind") == t["kind"])
                   and (not t.get("name") or (o.obj.get("metadata") or {}).get("name") == t["name"])]
        if not targets:
            problem(where, f"target {t.get('kind')}/{t.get('name')} matches no resource")
        try:
            ops = load_yaml(patch.get("patch") or "")
            if not isinstance(ops, list):
                raise ValueError("the patch is not a JSON 6902 list of operations")
        except yaml.YAMLError as e:
            problem(where, f"the patch: {yaml_error(e)}")
            continue
        except ValueError as e:
            problem(where, str(e))
            continue
        for o in targets:
            for op in ops:
                try:
                    apply_op(o.obj, op)
                except ValueError as e:
                    problem(where, str(e))
    for o in objs:
        if k.get("namespace") and o.obj.get("kind") not in CLUSTER_SCOPED:
            o.obj["metadata"] = {**(o.obj.get("metadata") or {}), "namespace": k["namespace"]}
        spec = pod_spec(o.obj)
        for img in k.get("images") or []:
            for c in containers(spec) if spec else []:
                name, tag = split_image(str(c.get("image") or ""))
                if name == img.get("name"):
                    c["image"] = f"{img.get('newName') or name}:{img.get('newTag') or tag}"
        o.source = f"{o.source} (via {file})"
    return objs


# ------------------------------------------------------------------------------------------------
# Schema validation
# ------------------------------------------------------------------------------------------------

def schema_dir(version):
    """kubernetes-validate's folder of strict schemas for Kubernetes version X.Y."""
    versions = list(dict.fromkeys(kubernetes_validate.utils.all_versions()))
    shipped = [v for v in versions if kubernetes_validate.utils.major_minor(v) == version]
    if not shipped:
        print(f"validate.py: kubernetes-validate {KV_VERSION} has no schemas for Kubernetes {version} "
              f"(it has {', '.join(kubernetes_validate.utils.major_minor(v) for v in versions)})", file=sys.stderr)
        sys.exit(2)
    return os.path.join(os.path.dirname(kubernetes_validate.__file__), "kubernetes-json-schema",
                        f"v{shipped[-1]}-local-strict")


# Keywords of a JSON Schema whose value is a schema, a list of schemas, a mapping of names to schemas.
SUBSCHEMA = ("items", "additionalProperties", "not", "contains", "propertyNames")
SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs")
NULL = {"type": "null"}


def model_schema(node):
    """A pydantic model's JSON Schema (model_json_schema) made as strict as the API server is with
    the CRD the model was generated from: an object that declares properties has no others
    (pydantic ignores them, the API server prunes them: either way a typo would do nothing), and an
    Optional field (anyOf [X, null]) is X: Optional stands for a field the CRD does not require,
    not for a null value, which the API server prunes from a field that is not nullable. Titles,
    descriptions and defaults are left out."""
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in SUBSCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: model_schema(s) for name, s in value.items()}
        elif key in SUBSCHEMA_LISTS and isinstance(value, list):
            out[key] = [model_schema(s) for s in value]
        elif key in SUBSCHEMA and isinstance(value, dict):
            out[key] = model_schema(value)
        elif key not in ("title", "description", "default"):
            out[key] = value
    if isinstance(out.get("anyOf"), list) and NULL in out["anyOf"]:
        rest = [s for s in out.pop("anyOf") if s != NULL]
        if len(rest) == 1:
            out.update(rest[0])
        elif rest:
            out["anyOf"] = rest
    if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def custom_resource_schema(api_version, kind):
    """The strict JSON Schema of a custom resource of CUSTOM_RESOURCES, and what it came from."""
    package, module, model, project = CUSTOM_RESOURCES[(api_version, kind)]
    try:
        cls = getattr(importlib.import_module(module), model)
        version = importlib.metadata.version(package)
    except (ImportError, AttributeError, importlib.metadata.PackageNotFoundError) as e:
        print(f"validate.py: the schema of {kind} comes from the PyPI package {package} ({module}.{model}), "
              f"which this python ({sys.executable}) lacks: {e} (requirements.txt pins it in the project's "
              f"virtual environment: make deps)", file=sys.stderr)
        sys.exit(2)
    schema = model_schema(cls.model_json_schema(by_alias=True))
    schema["properties"]["apiVersion"] = {"type": "string", "enum": [api_version]}
    schema["properties"]["kind"] = {"type": "string", "enum": [kind]}
    # The API server checks metadata as ObjectMeta, whatever the CRD says of it.
    schema["properties"]["metadata"] = {"$ref": OBJECT_META}
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://colld.invalid/crd/{kind.lower()}"
    release = ".".join(version.split(".")[:3])
    return schema, f"{kind} of {project} v{release} from {package} {version}"


class Schemas:
    """The validators of the apiVersion/kinds met so far."""

    def __init__(self, version):
        self.dir = schema_dir(version)
        with open(os.path.join(self.dir, "_definitions.json"), encoding="utf-8") as f:
            definitions = json.load(f)
        self.registry = referencing.Resource.from_contents(definitions) @ referencing.Registry()
        self.validators = {}
        self.crd_releases = []

    def _load(self, api_version, kind):
        if (api_version, kind) in CUSTOM_RESOURCES:
            schema, source = custom_resource_schema(api_version, kind)
            self.crd_releases.append(source)
        else:
            # kubernetes-validate's file names: apps/v1 DaemonSet -> daemonset-apps-v1.json,
            # rbac.authorization.k8s.io/v1 Role -> role-rbac-v1.json, v1 Pod -> pod-v1.json.
            name = "%s-%s.json" % (kind.lower(), re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version))
            path = os.path.join(self.dir, name)
            if "/" in name[:-5] or not os.path.exists(path):
                return None
            with open(path, encoding="utf-8") as f:
                schema = json.load(f)
            # The file names its kind and group by name only: make sure it is this one.
            gvk = schema.get("x-kubernetes-group-version-kind") or []
            group, _, ver = api_version.rpartition("/")
            if not any(g.get("group") == group and g.get("version") == ver and g.get("kind") == kind for g in gvk):
                return None
        return jsonschema.Draft202012Validator(schema, registry=self.registry)

    def validator(self, api_version, kind):
        key = (api_version, kind)
        if key not in self.validators:
            self.validators[key] = self._load(api_version, kind)
        return self.validators[key]


def json_pointer(path):
    return "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in path)


def validate_schema(o, schemas):
    obj = o.obj
    if not isinstance(obj.get("apiVersion"), str) or not isinstance(obj.get("kind"), str):
        problem(o.source, "a document without apiVersion and kind")
        return
    validator = schemas.validator(obj["apiVersion"], obj["kind"])
    if validator is None:
        problem(o.where(), f"no schema for {obj['apiVersion']} {obj['kind']} in kubernetes-validate "
                f"{KV_VERSION} (Kubernetes {KUBERNETES_VERSION}) or among validate.py's CUSTOM_RESOURCES")
        return
    found = []
    for e in validator.iter_errors(obj):
        ptr = json_pointer(e.absolute_path)
        if e.validator == "additionalProperties" and isinstance(e.instance, dict):
            known = e.schema.get("properties", {})
            for key in e.instance:
                if key not in known:
                    found.append(f"unknown field {json_pointer(list(e.absolute_path) + [key])}")
        else:
            found.append(f"{ptr} {e.message}")
    for f in sorted(set(found)):
        problem(o.where(), f)


# ------------------------------------------------------------------------------------------------
# colld's own rules
# ------------------------------------------------------------------------------------------------

def colld_options(path):
    if not path:
        return None
    with open(path, encoding="utf-8") as f:
        opts = set(re.findall(r"^\s*(--[a-z0-9-]+)", f.read(), re.M))
    if not opts:
        problem(path, "no options found in the colld --help output")
    return opts


def check_pod(o, options):
    spec = pod_spec(o.obj)
    if not spec:
        return
    volumes = {v.get("name") for v in spec.get("volumes") or [] if isinstance(v, dict)}
    for c in containers(spec):
        cw = f"{o.where()}: container {c.get('name')}"
        env = {e.get("name") for e in c.get("env") or [] if isinstance(e, dict)}
        for a in list(c.get("command") or []) + list(c.get("args") or []):
            for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", str(a)):
                if var not in env:
                    problem(cw, f"'{a}' uses $({var}), which env does not define")
        ports = {p.get("name") for p in c.get("ports") or [] if isinstance(p, dict) and p.get("name")}
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            port = ((c.get(probe) or {}).get("httpGet") or {}).get("port") if isinstance(c.get(probe), dict) else None
            if isinstance(port, str) and port not in ports:
                problem(cw, f"{probe} uses port '{port}', which is not declared")
        for vm in c.get("volumeMounts") or []:
            if isinstance(vm, dict) and vm.get("name") not in volumes:
                problem(cw, f"volumeMount '{vm.get('name')}' names no volume")
        is_colld = str(c.get("image") or "").split("/")[-1].startswith("colld")
        if is_colld and options is not None:
            for a in c.get("args") or []:
                m = re.match(r"(--[a-z0-9-]+)", str(a))
                if m and m.group(1) not in options:
                    problem(cw, f"{m.group(1)} is not an option of colld (colld --help)")


# ------------------------------------------------------------------------------------------------

def main():
    global KUBERNETES_VERSION
    parser = argparse.ArgumentParser(description="Offline validation of colld's Kubernetes manifests.")
    parser.add_argument("--colld-help", metavar="FILE", help="the output of colld --help")
    parser.add_argument("--kubernetes-version", metavar="X.Y", default=KUBERNETES_VERSION,
                        help=f"the Kubernetes schemas to check against (default {KUBERNETES_VERSION})")
    parser.add_argument("inputs", nargs="+", metavar="KUSTOMIZATION_DIR|MANIFEST.yaml")
    args = parser.parse_args()
    KUBERNETES_VERSION = args.kubernetes_version

    schemas = Schemas(KUBERNETES_VERSION)
    options = colld_options(args.colld_help)
    objects = []
    for inp in args.inputs:
        try:
            objects += build_kustomization(inp) if os.path.isdir(inp) else read_manifests(inp)
        except (OSError, ValueError) as e:
            problem(inp, str(e))
    for o in objects:
        validate_schema(o, schemas)
        check_pod(o, options)
    if problems:
        for p in problems:
            print(f"kubernetes: {p}", file=sys.stderr)
        print(f"kubernetes: {len(problems)} problem(s) in {len(objects)} object(s)", file=sys.stderr)
        return 1
    crds = "".join(f", {c}" for c in schemas.crd_releases)
    print(f"kubernetes: {len(objects)} object(s) from {len(args.inputs)} input(s) valid "
          f"(Kubernetes {KUBERNETES_VERSION} schemas of kubernetes-validate {KV_VERSION}{crds})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
