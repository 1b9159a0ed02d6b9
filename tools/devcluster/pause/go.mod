// The pod sandbox ("pause") of the dev cluster's real node: holds a pod's namespaces and reaps
// zombies, like registry.k8s.io/pause (which cannot be pulled here). Built by devcluster.py.
module rljob.dev/tools/pause

go 1.26.0
