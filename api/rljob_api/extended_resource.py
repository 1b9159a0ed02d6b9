"""resources.gpuResourceName: the extended resource GPU pods request, as pod validation accepts one
(k8s.io/kubernetes pkg/apis/core/helper IsExtendedResourceName): '<domain>/<name>', outside the
kubernetes.io domain and not beginning with 'requests.'. Anything else would make the pods request
a standard resource instead (cpu: the GPUs' count as CPUs) or be refused when KubeRay creates them."""

from __future__ import annotations

import re

from .paths import matches_cel
from .rules import Rule

# A DNS-subdomain domain, '/', then a name of at most 63 letters, digits, '-', '_' or '.', beginning
# and ending with a letter or digit. Pod validation checks 'requests.<resource>' as a qualified
# name: the domain is at most 253 - len('requests.') = 244 characters; the field's maxLength (244)
# keeps it there.
EXTENDED_RESOURCE_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
EXTENDED_RESOURCE_MAX = 244
_NATIVE = "kubernetes.io/"  # any name containing it is a native resource, never an extended one
_QUOTA_PREFIX = "requests."


def is_extended_resource(name: str) -> bool:
    return (
        re.fullmatch(EXTENDED_RESOURCE_PATTERN, name) is not None
        and _NATIVE not in name
        and not name.startswith(_QUOTA_PREFIX)
    )


GPU_RESOURCE_RULE = Rule(
    cel=f"{matches_cel('self.gpuResourceName', EXTENDED_RESOURCE_PATTERN)} && "
    f"!self.gpuResourceName.contains('{_NATIVE}') && !self.gpuResourceName.startsWith('{_QUOTA_PREFIX}')",
    message="gpuResourceName must be a domain-qualified extended resource, <domain>/<name> as the GPUs' "
    "device plugin advertises it, e.g. nvidia.com/gpu or amd.com/gpu (not cpu, memory or another "
    "kubernetes.io resource)",
    field=".gpuResourceName",
    check=lambda r: is_extended_resource(r.gpu_resource_name),
)
