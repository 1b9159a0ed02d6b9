"""The dev cluster's real node configuration (tools/devcluster/realnode_config.py): addresses that
never leave the machine, and the settings this kind of host needs."""

from __future__ import annotations

import ipaddress
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "devcluster"))

import realnode_config as rc

PATHS = rc.NodePaths(Path("/c/rljob-real"), Path("/cache/realnode/containerd"), Path("/run/rljob-node"))


def test_every_address_is_inside_the_guarded_range() -> None:
    guard = ipaddress.ip_network(rc.GUARD_CIDR)
    pods, services = ipaddress.ip_network(rc.POD_CIDR), ipaddress.ip_network(rc.SERVICE_CIDR)
    assert pods.subnet_of(guard) and services.subnet_of(guard)
    assert not pods.overlaps(services)
    assert ipaddress.ip_address(rc.NODE_IP) in pods
    assert ipaddress.ip_address(rc.KUBERNETES_SERVICE_IP) == next(services.hosts())
    assert ipaddress.ip_address(rc.DNS_SERVICE_IP) in services
    # RFC 2544's benchmarking range: no LAN (RFC 1918) or loopback address is ever a pod's or service's.
    assert guard == ipaddress.ip_network("198.18.0.0/15")
    for lan in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "127.0.0.0/8"):
        assert not guard.overlaps(ipaddress.ip_network(lan))


def test_cni_bridge_never_masquerades_and_keeps_its_leases_in_the_cluster_dir() -> None:
    conf = json.loads(rc.cni_conflist(PATHS))
    bridge = conf["plugins"][0]
    assert bridge["type"] == "bridge" and bridge["bridge"] == rc.BRIDGE
    assert bridge["ipMasq"] is False and bridge["hairpinMode"] is True
    assert bridge["ipam"]["ranges"] == [[{"subnet": rc.POD_CIDR, "gateway": rc.NODE_IP}]]
    assert bridge["ipam"]["routes"] == [{"dst": rc.GUARD_CIDR}], "services reachable, nothing else"
    assert bridge["ipam"]["dataDir"].startswith(str(PATHS.dir))


def test_containerd_runs_where_root_lacks_cap_sys_resource() -> None:
    toml = rc.containerd_toml(PATHS)
    for line in (
        "restrict_oom_score_adj = true",
        "tolerate_missing_hugetlb_controller = true",
        "disable_hugetlb_controller = true",
        "SystemdCgroup = false",
        f'sandbox_image = "{rc.SANDBOX_IMAGE}"',
        f'address = "{PATHS.socket}"',
    ):
        assert line in toml
    assert len(str(PATHS.socket)) < 100  # AF_UNIX path limit
    # Every registry is mirrored to a closed local port: a pull never leaves the machine.
    assert 'mirrors."docker.io"]' in toml and 'mirrors."*"]' in toml
    assert toml.count(f'endpoint = ["{rc.NO_REGISTRY}"]') == 2 and rc.NO_REGISTRY.startswith(
        "http://127.0.0.1:"
    )


def test_kubelet_authenticates_the_api_server_and_never_touches_host_sysctls() -> None:
    conf = rc.kubelet_config(
        PATHS, port=20250, healthz_port=20248, client_ca=Path("/pki/ca.crt"), resolv_conf=Path("/r")
    )
    assert conf["authentication"]["anonymous"]["enabled"] is False
    assert conf["authentication"]["x509"]["clientCAFile"] == "/pki/ca.crt"
    assert conf["authorization"]["mode"] == "Webhook"
    assert conf["protectKernelDefaults"] is True and conf["failCgroupV1"] is False
    assert conf["clusterDNS"] == [rc.DNS_SERVICE_IP] and conf["address"] == rc.NODE_IP
    assert conf["readOnlyPort"] == 0
    assert set(rc.KERNEL_DEFAULTS) == {"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"}


def test_kube_router_only_enforces_network_policy() -> None:
    """Routing, the service proxy and the CNI config stay the harness's (the bridge, kube-proxy):
    kube-router running them too would fight over the node's routes and iptables."""
    args = dict(
        a.removeprefix("--").split("=", 1) for a in rc.kube_router_args(Path("/kc"), health_port=20244)
    )
    assert args["run-firewall"] == "true"
    assert args["run-router"] == args["run-service-proxy"] == args["enable-cni"] == "false"
    assert args["hostname-override"] == rc.NODE_NAME and args["kubeconfig"] == "/kc"
    assert args["service-cluster-ip-range"] == rc.SERVICE_CIDR and args["health-port"] == "20244"


def test_apiserver_dials_kubelets_with_a_client_certificate() -> None:
    args = {a["key"]: a["value"] for a in rc.apiserver_args(Path("/pki/admin.crt"), Path("/pki/admin.key"))}
    assert args["kubelet-client-certificate"] == "/pki/admin.crt"
    assert args["kubelet-client-key"] == "/pki/admin.key"
    assert args["advertise-address"] == rc.NODE_IP
    assert args["service-cluster-ip-range"] == rc.SERVICE_CIDR


def test_a_stopped_kubelet_shows_as_not_ready_after_upstreams_grace_not_kwokctls(tmp_path: Path) -> None:
    """kwokctl runs the node controller with a 3m20s grace for its fake nodes; a cluster with a real
    node gets 40 s (checked every 5 s). The patch's flags come after kwokctl's own, so they win; a
    cluster of fake nodes alone keeps kwokctl's."""
    import yaml
    from controlplane import kwokctl_config
    from state import Ctx

    ctx = Ctx(name="t", dir=tmp_path, bins={b: Path(f"/bin/{b}") for b in BINARIES})

    def patches(real_node: bool) -> dict[str, dict[str, str]]:
        conf = yaml.safe_load(kwokctl_config(ctx, "v1.36.4", real_node=real_node).read_text())
        return {p["name"]: {a["key"]: a["value"] for a in p["extraArgs"]} for p in conf["componentsPatches"]}

    real = patches(True)["kube-controller-manager"]
    assert real == {"node-monitor-period": "5s", "node-monitor-grace-period": "40s"}
    assert "kube-controller-manager" not in patches(False)


BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "etcd", "kubectl")


@pytest.mark.parametrize("kind", ["Deployment", "Service", "ClusterRole"])
def test_coredns_manifests(kind: str) -> None:
    (obj,) = [m for m in rc.coredns_manifests() if m["kind"] == kind]
    if kind == "Service":
        assert obj["spec"]["clusterIP"] == rc.DNS_SERVICE_IP
        assert {p["targetPort"] for p in obj["spec"]["ports"]} == {rc.COREDNS_PORT}
    if kind == "Deployment":
        spec = obj["spec"]["template"]["spec"]
        assert spec["nodeSelector"] == {"kubernetes.io/hostname": rc.NODE_NAME}
        assert spec["containers"][0]["securityContext"]["runAsNonRoot"] is True
    if kind == "ClusterRole":
        resources = {r for rule in obj["rules"] for r in rule["resources"]}
        assert {"services", "endpointslices", "namespaces"} <= resources


def test_corefile_serves_cluster_names_only() -> None:
    text = rc.corefile()
    assert f"kubernetes {rc.CLUSTER_DOMAIN}" in text
    assert "forward" not in text  # no upstream: nothing is sent off the machine


def test_preflight_refuses_in_one_line_per_missing_thing(monkeypatch: pytest.MonkeyPatch) -> None:
    import realnode

    monkeypatch.setattr(
        realnode.shutil, "which", lambda cmd: None if cmd in ("containerd", "ctr") else "/bin/x"
    )
    monkeypatch.setattr(realnode.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(realnode, "CNI_DIR", Path("/nonexistent"))
    missing = realnode.preflight()
    assert "root: the kubelet, containerd and the bridge need it (run as root)" in missing
    (packages,) = [m for m in missing if m.startswith("Debian packages")]
    assert packages.endswith("apt-get install containerd containernetworking-plugins")


def test_a_second_cluster_gets_no_real_node_while_another_runs_one(tmp_path: Path) -> None:
    """One machine runs one real node (its bridge, name, ports and iptables chains are the
    machine's): `up --real-node` of another cluster is refused, naming the one to stop."""
    import os
    import subprocess

    import realnode
    from state import Ctx

    clusters = tmp_path / "clusters"
    mine = Ctx("rljob-demo", clusters / "rljob-demo", {})
    other = clusters / "other"
    other.mkdir(parents=True)
    assert realnode.real_node_elsewhere(mine) is None
    (other / "state.json").write_text(json.dumps({"real_node": {"kubelet_pid": os.getpid()}}))
    assert realnode.real_node_elsewhere(mine) == "other"
    (clusters / "rljob-demo").mkdir()  # its own state never counts
    (clusters / "rljob-demo" / "state.json").write_text(
        json.dumps({"real_node": {"kubelet_pid": os.getpid()}})
    )
    assert realnode.real_node_elsewhere(Ctx("other", other, {})) == "rljob-demo"
    gone = subprocess.Popen(["true"])
    gone.wait()
    (other / "state.json").write_text(json.dumps({"real_node": {"kubelet_pid": gone.pid}}))
    assert realnode.real_node_elsewhere(mine) is None  # a node that stopped without `down`
    (other / "state.json").write_text("not json")
    assert realnode.real_node_elsewhere(mine) is None
