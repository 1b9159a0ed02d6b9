// kstatus-check prints how Flux judges objects: kstatus' status.Compute (what kustomize-controller
// runs for `wait: true` and `healthChecks`) and, with -kustomization, the status reader Flux builds
// from that Kustomization's spec.healthCheckExprs. Both come from the modules Flux builds with.
//
// Usage: kstatus-check [-kustomization k.yaml] FILE...   (YAML or JSON, several documents per file)
// Output: one JSON line per object: {"file", "name", "status", "message"[, "exprs", "exprsMessage"]}.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/fluxcd/cli-utils/pkg/kstatus/polling/engine"
	"github.com/fluxcd/cli-utils/pkg/kstatus/status"
	"github.com/fluxcd/pkg/apis/kustomize"
	"github.com/fluxcd/pkg/runtime/cel"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

type result struct {
	File         string `json:"file"`
	Name         string `json:"name"`
	Status       string `json:"status"`
	Message      string `json:"message"`
	Exprs        string `json:"exprs,omitempty"`
	ExprsMessage string `json:"exprsMessage,omitempty"`
}

// kustomization is the part of a Flux Kustomization this tool reads.
type kustomization struct {
	Spec struct {
		HealthCheckExprs []kustomize.CustomHealthCheck `json:"healthCheckExprs"`
	} `json:"spec"`
}

func main() {
	kustomizationFile := flag.String("kustomization", "", "a Flux Kustomization whose spec.healthCheckExprs to apply")
	flag.Parse()
	var reader engine.StatusReader
	if *kustomizationFile != "" {
		var err error
		if reader, err = exprsReader(*kustomizationFile); err != nil {
			fail(err)
		}
	}
	out := json.NewEncoder(os.Stdout)
	for _, file := range flag.Args() {
		objs, err := readObjects(file)
		if err != nil {
			fail(err)
		}
		for _, obj := range objs {
			res, err := status.Compute(obj)
			if err != nil {
				fail(fmt.Errorf("%s: %s: %w", file, obj.GetName(), err))
			}
			line := result{File: file, Name: obj.GetName(), Status: res.Status.String(), Message: res.Message}
			if reader != nil && reader.Supports(obj.GroupVersionKind().GroupKind()) {
				// The cluster reader is only used to look objects up by name; this one is given.
				rs, err := reader.ReadStatusForObject(context.Background(), nil, obj)
				if err != nil {
					fail(fmt.Errorf("%s: %s: %w", file, obj.GetName(), err))
				}
				line.Exprs, line.ExprsMessage = rs.Status.String(), rs.Message
				if rs.Error != nil {
					line.ExprsMessage = rs.Error.Error()
				}
			}
			if err := out.Encode(line); err != nil {
				fail(err)
			}
		}
	}
}

// exprsReader builds the status reader kustomize-controller adds for healthCheckExprs.
func exprsReader(path string) (engine.StatusReader, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var k kustomization
	if err := yaml.Unmarshal(data, &k); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(k.Spec.HealthCheckExprs) == 0 {
		return nil, fmt.Errorf("%s: no spec.healthCheckExprs", path)
	}
	ctor, err := cel.NewStatusReader(k.Spec.HealthCheckExprs)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ctor(nil), nil
}

func readObjects(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	decoder := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		var raw json.RawMessage
		if err := decoder.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(raw) == 0 || string(raw) == "null" {
			continue
		}
		// Decoded as the API server's objects are: integers stay int64 (kstatus insists on it).
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(raw); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		objs = append(objs, obj)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "kstatus-check:", err)
	os.Exit(1)
}
