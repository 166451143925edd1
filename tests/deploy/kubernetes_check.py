#!/usr/bin/env python3
"""The container image's and the Kubernetes manifests' check (ctest kubernetes_manifests).

Usage: kubernetes_check.py REPOSITORY_ROOT

First, with the standard library alone: the Containerfile runs as a numeric non-root user, checks
/health, stops on SIGTERM and exposes the port its settings file names; every settings file
(deploy/container/specrun.toml, each kustomization's) holds only keys of configs/default.toml, with
their types. Then each of deploy/kubernetes/base, overlays/cpu and overlays/gpu is rendered by
`kubectl kustomize`, every resource is validated against the Kubernetes API's schemas
(kubernetes-validate, strict: unknown fields are errors), and the Deployment is held to what
docs/container.md says: probes on /health at the server's port, a termination grace longer than
the preStop pause plus the server's shutdown grace, a non-root user, Prometheus' annotations on
/metrics, CPU threads matching the CPU limit, and in the gpu overlay a GPU with device "cuda".

Exit 77 (a ctest skip, one line) without kubectl or without the venv's kubernetes group
(tools/setup-python.sh kubernetes); the Containerfile's checks have run by then.
"""

import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

# The Kubernetes releases the manifests are validated against: an older one still widely run, and
# the newest that kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.29.0", "1.37.0")

failures = []


def fail(where, message):
    failures.append(f"{where}: {message}")


def check_settings_keys(path, settings, defaults):
    """Every key of settings is one of configs/default.toml's, with the default's type."""
    for table, keys in settings.items():
        if table not in defaults or not isinstance(keys, dict):
            fail(path, f"[{table}] is not a table of configs/default.toml")
            continue
        for key, value in keys.items():
            if key not in defaults[table]:
                fail(path, f"{table}.{key} is not a key of configs/default.toml")
            elif type(value) is not type(defaults[table][key]):
                fail(path, f"{table}.{key} = {value!r}: configs/default.toml's is a "
                     f"{type(defaults[table][key]).__name__}")


def check_containerfile(root, defaults):
    containerfile = root / "deploy/container/Containerfile"
    text = containerfile.read_text()
    # Instructions, their continuation lines joined.
    instructions = re.sub(r"\\\n\s*", " ", text)
    lines = [line.strip() for line in instructions.splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    settings_path = root / "deploy/container/specrun.toml"
    settings = tomllib.loads(settings_path.read_text())
    check_settings_keys(settings_path, settings, defaults)
    port = settings.get("server", {}).get("port")
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    if not users or not re.fullmatch(r"[1-9][0-9]*(:[0-9]+)?", users[-1]):
        fail(containerfile, "the last USER must be a numeric non-root uid (runAsNonRoot checks it)")
    healthchecks = [line for line in lines if line.startswith("HEALTHCHECK ")]
    if not healthchecks or f"127.0.0.1:{port}/health" not in healthchecks[-1]:
        fail(containerfile, f"HEALTHCHECK must ask /health on port {port} (specrun.toml's)")
    if "STOPSIGNAL SIGTERM" not in lines:
        fail(containerfile, "STOPSIGNAL SIGTERM missing (the server drains on SIGTERM)")
    if f"EXPOSE {port}" not in lines:
        fail(containerfile, f"EXPOSE {port} missing (specrun.toml's port)")
    if settings.get("server", {}).get("host") != "0.0.0.0":
        fail(settings_path, 'server.host must be "0.0.0.0" to be reached from outside')
    cmd = [line for line in lines if line.startswith("CMD ")]
    if not cmd or "/etc/specrun/specrun.toml" not in cmd[-1]:
        fail(containerfile, "CMD must serve with --config /etc/specrun/specrun.toml")


def render(kubectl, directory):
    result = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True,
                            timeout=120)
    if result.returncode != 0:
        fail(directory, f"kubectl kustomize failed: {result.stderr.strip()}")
        return []
    import yaml
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def probe_path_and_port(probe):
    http = (probe or {}).get("httpGet") or {}
    return http.get("path"), http.get("port")


def check_deployment(where, resources, defaults, gpu):
    by_kind = {}
    for resource in resources:
        by_kind.setdefault(resource["kind"], []).append(resource)
    for kind in ("Deployment", "Service", "ConfigMap"):
        if len(by_kind.get(kind, [])) != 1:
            fail(where, f"expected one {kind}, found {len(by_kind.get(kind, []))}")
            return
    deployment = by_kind["Deployment"][0]
    service = by_kind["Service"][0]
    configmap = by_kind["ConfigMap"][0]
    pod = deployment["spec"]["template"]
    spec = pod["spec"]
    containers = spec["containers"]
    if len(containers) != 1:
        fail(where, "the Deployment must run one container")
        return
    container = containers[0]

    # The settings file: the ConfigMap mounted where --config names it.
    args = container.get("args", [])
    if "--config" not in args[:-1]:
        fail(where, f"the container's args {shlex.join(args)} name no --config file")
        return
    config_path = Path(args[args.index("--config") + 1])
    volumes = {volume["name"]: volume for volume in spec.get("volumes", [])}
    mounts = [mount for mount in container.get("volumeMounts", [])
              if mount["mountPath"] == str(config_path.parent)]
    if (len(mounts) != 1 or
            volumes.get(mounts[0]["name"], {}).get("configMap", {}).get("name") !=
            configmap["metadata"]["name"] or config_path.name not in configmap.get("data", {})):
        fail(where, f"{config_path} is not the ConfigMap {configmap['metadata']['name']}'s file")
        return
    settings = tomllib.loads(configmap["data"][config_path.name])
    check_settings_keys(f"{where} ConfigMap", settings, defaults)
    server = {**defaults["server"], **settings.get("server", {})}
    runtime = {**defaults["runtime"], **settings.get("runtime", {})}
    if server["host"] != "0.0.0.0":
        fail(where, 'server.host must be "0.0.0.0" for the Service and the probes to reach it')

    # The port: the container's, the probes', the Service's and Prometheus' are the server's.
    ports = {port.get("name"): port["containerPort"] for port in container.get("ports", [])}
    if server["port"] not in ports.values():
        fail(where, f"the container does not expose the server's port {server['port']}")
    for name in ("startupProbe", "readinessProbe", "livenessProbe"):
        path, port = probe_path_and_port(container.get(name))
        if path != "/health":
            fail(where, f"{name} must be an httpGet of /health, not {path!r}")
        if ports.get(port, port) != server["port"]:
            fail(where, f"{name} asks port {port!r}, not the server's {server['port']}")
    for port in service["spec"]["ports"]:
        if ports.get(port.get("targetPort"), port.get("targetPort")) != server["port"]:
            fail(where, f"the Service's targetPort {port.get('targetPort')!r} is not the server's")
    annotations = pod.get("metadata", {}).get("annotations", {})
    expected = {"prometheus.io/scrape": "true", "prometheus.io/port": str(server["port"]),
                "prometheus.io/path": "/metrics"}
    for key, value in expected.items():
        if annotations.get(key) != value:
            fail(where, f"the pod's annotation {key} is {annotations.get(key)!r}, not {value!r}")

    # Graceful shutdown: the kubelet waits for the preStop pause and the shutdown grace, and the
    # liveness probe, which /health's 503 while draining fails, does not kill a draining server.
    grace = spec.get("terminationGracePeriodSeconds", 30)
    pause = 0
    prestop = container.get("lifecycle", {}).get("preStop", {})
    command = prestop.get("exec", {}).get("command", [])
    if command[:1] == ["sleep"]:
        pause = float(command[1])
    elif "sleep" in prestop:
        pause = float(prestop["sleep"]["seconds"])
    if grace <= pause + server["shutdown_grace_seconds"]:
        fail(where, f"terminationGracePeriodSeconds {grace} leaves no margin past the preStop "
             f"pause ({pause:g} s) and shutdown_grace_seconds ({server['shutdown_grace_seconds']:g})")
    liveness = container["livenessProbe"]
    if (liveness.get("periodSeconds", 10) * liveness.get("failureThreshold", 3) <=
            pause + server["shutdown_grace_seconds"]):
        fail(where, "the liveness probe would fail a server still draining within its grace")

    # Not root, whichever level says it.
    context = {**spec.get("securityContext", {}), **container.get("securityContext", {})}
    if context.get("runAsNonRoot") is not True or context.get("runAsUser", 0) == 0:
        fail(where, "the container must run with runAsNonRoot and a non-zero runAsUser")
    if context.get("allowPrivilegeEscalation") is not False:
        fail(where, "allowPrivilegeEscalation must be false")

    # CPU threads: one per CPU of the limit (0 would start one per core of the node).
    resources = container.get("resources", {})
    limits = resources.get("limits", {})
    requests = resources.get("requests", {})
    if "cpu" not in limits or "cpu" not in requests:
        fail(where, "the container must request and limit CPU")
    elif runtime["threads"] != int(float(str(limits["cpu"]).rstrip("m")) /
                                   (1000 if str(limits["cpu"]).endswith("m") else 1)):
        fail(where, f"runtime.threads = {runtime['threads']} is not the CPU limit {limits['cpu']}")
    if gpu:
        if str(limits.get("nvidia.com/gpu")) != "1":
            fail(where, "the gpu overlay must limit nvidia.com/gpu to 1")
        if not str(runtime["device"]).startswith("cuda"):
            fail(where, f"the gpu overlay's runtime.device is {runtime['device']!r}, not cuda")
    else:
        if "nvidia.com/gpu" in limits:
            fail(where, "only the gpu overlay asks for a GPU")
        if runtime["device"] != "cpu":
            fail(where, f"runtime.device is {runtime['device']!r} without a GPU")


def main():
    root = Path(sys.argv[1]).resolve()
    defaults = tomllib.loads((root / "configs/default.toml").read_text())
    check_containerfile(root, defaults)
    kubernetes = root / "deploy/kubernetes"
    for settings_path in sorted(kubernetes.rglob("*.toml")):
        check_settings_keys(settings_path, tomllib.loads(settings_path.read_text()), defaults)

    skipped = None
    kubectl = shutil.which("kubectl")
    try:
        import kubernetes_validate.utils as validator
    except ImportError:
        validator = None
    if kubectl is None:
        skipped = "no kubectl to render the kustomizations"
    elif validator is None:
        skipped = ("kubernetes-validate is not installed (the venv's kubernetes group: "
                   "tools/setup-python.sh kubernetes)")
    else:
        for name, gpu in (("base", False), ("overlays/cpu", False), ("overlays/gpu", True)):
            where = f"deploy/kubernetes/{name}"
            resources = render(kubectl, kubernetes / name)
            for resource in resources:
                label = f"{where}: {resource.get('kind')} {resource.get('metadata', {}).get('name')}"
                for version in KUBERNETES_VERSIONS:
                    try:
                        validator.validate(resource, version, strict=True)
                    except Exception as error:  # ValidationError, SchemaNotFoundError, ...
                        fail(label, f"invalid for Kubernetes {version}: "
                             f"{getattr(error, 'message', error)}")
            if resources:
                check_deployment(where, resources, defaults, gpu)

    for failure in failures:
        print(failure)
    if failures:
        print(f"kubernetes_check: {len(failures)} failure(s)")
        return 1
    if skipped:
        print(f"kubernetes_check: the Containerfile checked; skipped the manifests: {skipped}")
        return 77
    print("kubernetes_check: the Containerfile and deploy/kubernetes (base, overlays/cpu, "
          "overlays/gpu) checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
