//go:build tools

// Package tools pins the command built from this module (go build <pkg>).
package tools

import _ "github.com/ray-project/kuberay/ray-operator"
