"""The real node's configuration files (pure: text and dicts, no I/O): containerd, CNI, the kubelet,
kube-proxy, kube-router, CoreDNS, and the control-plane flags a real node needs.

Addresses: the pods' bridge and the services live in 198.18.0.0/15 (RFC 2544's test range): the
bridge holds 198.18.0.1/24 (the node's InternalIP, where the kubelet listens and the API server is
advertised) and services take 198.18.1.0/24. Nothing in the range leaves the machine: the harness
adds an `unreachable` route for the whole /15, and the FORWARD chain drops what the bridge would
send elsewhere.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NODE_NAME = "real-0"
BRIDGE = "rljob0"
GUARD_CIDR = "198.18.0.0/15"
POD_CIDR = "198.18.0.0/24"
NODE_IP = "198.18.0.1"
SERVICE_CIDR = "198.18.1.0/24"
KUBERNETES_SERVICE_IP = "198.18.1.1"  # the first address of SERVICE_CIDR: the `kubernetes` Service
DNS_SERVICE_IP = "198.18.1.10"
CLUSTER_DOMAIN = "cluster.local"
NODE_LABELS = {"rljob.dev/node-pool": "real", "node.kubernetes.io/instance-type": "real-cpu"}
# The sysctls the kubelet insists on (protectKernelDefaults): shown to it in a private mount namespace
# instead of changing the host's.
KERNEL_DEFAULTS = {"vm/overcommit_memory": "1", "kernel/panic": "10", "kernel/panic_on_oops": "1"}
SANDBOX_IMAGE = "docker.io/rljob/pause:devcluster"
COREDNS_IMAGE = "docker.io/rljob/coredns:devcluster"
COREDNS_PORT = 1053  # unprivileged in the pod; the Service maps 53 to it
NO_REGISTRY = "http://127.0.0.1:9"  # the discard port, closed: pulls fail at once, locally


@dataclass(frozen=True)
class NodePaths:
    """Where the node keeps its state. containerd's image store is machine-wide (a cache: imported
    images survive `down`); the rest belongs to the cluster."""

    cluster_dir: Path
    containerd_root: Path
    run_dir: Path  # sockets and runtime state (short path: AF_UNIX limit)

    @property
    def dir(self) -> Path:
        return self.cluster_dir / "node"

    @property
    def socket(self) -> Path:
        return self.run_dir / "containerd.sock"

    @property
    def cni_conf_dir(self) -> Path:
        return self.dir / "cni"

    @property
    def kubelet_root(self) -> Path:
        return self.dir / "kubelet"


def containerd_toml(p: NodePaths) -> str:
    """containerd 1.6 (Debian): cgroupfs, runc, overlayfs. The OOM score and hugetlb settings let it
    run where root lacks CAP_SYS_RESOURCE and the hugetlb controller is absent."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{p.containerd_root}"
state = "{p.run_dir / "state"}"

[grpc]
  address = "{p.socket}"

[{cri}]
  sandbox_image = "{SANDBOX_IMAGE}"
  restrict_oom_score_adj = true
  tolerate_missing_hugetlb_controller = true
  disable_hugetlb_controller = true
  enable_unprivileged_ports = false

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false

[{cri}.cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "{p.cni_conf_dir}"

# No registry is reachable, and none may be tried: every pull goes to a closed local port, so an
# image that is not loaded fails as on a cluster that cannot reach its registry (ErrImagePull,
# then ImagePullBackOff), without a byte leaving the machine.
[{cri}.registry.mirrors."docker.io"]
  endpoint = ["{NO_REGISTRY}"]

[{cri}.registry.mirrors."*"]
  endpoint = ["{NO_REGISTRY}"]
"""


def cni_conflist(p: NodePaths) -> str:
    """A bridge with host-local addresses (kept in the cluster's dir), hairpin for a pod reaching
    itself through a Service, portmap for hostPorts. No masquerade and no default route: pod
    traffic never leaves."""
    conf = {
        "cniVersion": "0.4.0",
        "name": "rljob-real-node",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR, "gateway": NODE_IP}]],
                    # Services sit outside the pods' subnet: routed through the bridge, where
                    # kube-proxy's rules meet them. No default route: pods have nowhere else to go.
                    "routes": [{"dst": GUARD_CIDR}],
                    "dataDir": str(p.dir / "cni-ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
            {"type": "loopback"},
        ],
    }
    return json.dumps(conf, indent=2) + "\n"


def kubelet_config(
    p: NodePaths, *, port: int, healthz_port: int, client_ca: Path, resolv_conf: Path
) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": NODE_IP,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        # The API server authenticates with its kubelet client certificate (signed by the cluster CA);
        # everything else is asked of the API server (webhook), as on a real node.
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,  # 1.35+ refuses cgroup v1 hosts unless told
        "failSwapOn": False,
        "protectKernelDefaults": True,  # never rewrite the host's sysctls
        "containerRuntimeEndpoint": f"unix://{p.socket}",
        "imageServiceEndpoint": f"unix://{p.socket}",
        "clusterDNS": [DNS_SERVICE_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(resolv_conf),  # no upstream resolver: the cluster has no way out
        "podCIDR": POD_CIDR,
        "maxPods": 40,
        "serializeImagePulls": False,
        # A shared development disk: evict only when it is nearly full, never collect images for it.
        "evictionHard": {
            "memory.available": "200Mi",
            "nodefs.available": "2%",
            "nodefs.inodesFree": "2%",
            "imagefs.available": "2%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "enforceNodeAllocatable": ["pods"],
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "registerNode": True,
        "nodeStatusReportFrequency": "10s",
        "nodeStatusUpdateFrequency": "5s",
    }


def kube_proxy_config(kubeconfig: Path, *, healthz_port: int, metrics_port: int) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "mode": "iptables",
        "hostnameOverride": NODE_NAME,
        "bindAddress": NODE_IP,
        "healthzBindAddress": f"127.0.0.1:{healthz_port}",
        "metricsBindAddress": f"127.0.0.1:{metrics_port}",
        "clusterCIDR": POD_CIDR,
        "nodePortAddresses": [f"{NODE_IP}/32"],
        # Masquerade service traffic, so a pod's reply to a pod on the same bridge comes back
        # through the host and is un-NATed there.
        "iptables": {"masqueradeAll": True, "localhostNodePorts": False},
        # Leave the host's conntrack sysctls alone (a container cannot change them).
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }


def kube_router_args(kubeconfig: Path, *, health_port: int) -> list[str]:
    """kube-router as the node's NetworkPolicy enforcer and nothing else: pods reach each other on
    the CNI bridge (no routing of its own), kube-proxy serves the Services, the CNI config is ours.
    Traffic from the node itself (KubeRay and its submissions, run on the host; the kubelet's probes)
    stays allowed, as kube-router allows a pod's own node."""
    return [
        f"--kubeconfig={kubeconfig}",
        f"--hostname-override={NODE_NAME}",
        "--run-firewall=true",
        "--run-router=false",
        "--run-service-proxy=false",
        "--enable-cni=false",
        "--enable-ipv6=false",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--health-port={health_port}",
        "--v=1",
    ]


def apiserver_args(admin_cert: Path, admin_key: Path) -> list[dict[str, str]]:
    """kube-apiserver flags of a cluster with a real node: reachable from pods (bound beyond loopback,
    advertised on the bridge), services in SERVICE_CIDR, and a client certificate for kubelets
    (logs, exec, port-forward)."""
    return [
        {"key": "bind-address", "value": "0.0.0.0"},
        {"key": "advertise-address", "value": NODE_IP},
        {"key": "service-cluster-ip-range", "value": SERVICE_CIDR},
        {"key": "kubelet-client-certificate", "value": str(admin_cert)},
        {"key": "kubelet-client-key", "value": str(admin_key)},
        {"key": "kubelet-preferred-address-types", "value": "InternalIP"},
    ]


def corefile() -> str:
    """Cluster names only: there is no upstream to forward to."""
    return f""".:{COREDNS_PORT} {{
    errors
    health :8080
    ready :8181
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 30
}}
"""


def coredns_manifests() -> list[dict[str, Any]]:
    """CoreDNS in kube-system: its RBAC, config, Deployment (on the real node) and Service."""
    labels = {"k8s-app": "kube-dns"}
    meta = {"name": "coredns", "namespace": "kube-system"}
    rules = [
        {
            "apiGroups": [""],
            "resources": ["endpoints", "services", "pods", "namespaces"],
            "verbs": ["list", "watch"],
        },
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
    ]
    container = {
        "name": "coredns",
        "image": COREDNS_IMAGE,
        "imagePullPolicy": "Never",
        "args": ["-conf", "/etc/coredns/Corefile"],
        "ports": [
            {"name": "dns", "containerPort": COREDNS_PORT, "protocol": "UDP"},
            {"name": "dns-tcp", "containerPort": COREDNS_PORT, "protocol": "TCP"},
        ],
        "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 2},
        "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}, "periodSeconds": 10},
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "rljob-devcluster:coredns"},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "rljob-devcluster:coredns"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "rljob-devcluster:coredns",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system"}],
        },
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"Corefile": corefile()}},
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {**meta, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": "coredns",
                        "dnsPolicy": "Default",
                        "nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
                        "containers": [container],
                        "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": labels},
            "spec": {
                "clusterIP": DNS_SERVICE_IP,
                "selector": labels,
                "ports": [
                    {"name": "dns", "port": 53, "targetPort": COREDNS_PORT, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 53, "targetPort": COREDNS_PORT, "protocol": "TCP"},
                ],
            },
        },
    ]
