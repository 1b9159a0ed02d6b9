//go:build tools

// Package tools pins the command built from this module (go build <pkg>).
package tools

import _ "sigs.k8s.io/kueue/cmd/kueue"
