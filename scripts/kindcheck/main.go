// kindcheck decodes Kind cluster configs with Kind's own published config types
// (sigs.k8s.io/kind/pkg/apis/config/v1alpha4), refusing unknown fields, the way
// `kind create cluster --config` reads them.
//
//	kindcheck FILE...
//
// Exit status 0 when every file decodes; 1 when any does not (each failure is printed
// as "FILE: reason", naming the unknown or mistyped field); 2 on a usage error.
package main

import (
	"fmt"
	"os"

	"sigs.k8s.io/kind/pkg/apis/config/v1alpha4"
	"sigs.k8s.io/yaml"
)

const (
	wantKind       = "Cluster"
	wantAPIVersion = "kind.x-k8s.io/v1alpha4"
)

// check decodes one file strictly and returns why it is not a v1alpha4 Cluster, or nil.
func check(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	// The type header first, loosely: a wrong kind or apiVersion deserves that message
	// rather than a complaint about fields the right type would have had.
	var meta v1alpha4.TypeMeta
	if err := yaml.Unmarshal(raw, &meta); err != nil {
		return fmt.Errorf("not YAML: %w", err)
	}
	if meta.Kind != wantKind || meta.APIVersion != wantAPIVersion {
		return fmt.Errorf("kind %q, apiVersion %q: want kind %q, apiVersion %q",
			meta.Kind, meta.APIVersion, wantKind, wantAPIVersion)
	}
	var cluster v1alpha4.Cluster
	// UnmarshalStrict refuses unknown fields and duplicate keys.
	if err := yaml.UnmarshalStrict(raw, &cluster); err != nil {
		return err
	}
	if len(cluster.Nodes) == 0 {
		return fmt.Errorf("no nodes")
	}
	return nil
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kindcheck FILE...")
		os.Exit(2)
	}
	failed := false
	for _, path := range os.Args[1:] {
		if err := check(path); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			failed = true
			continue
		}
		fmt.Printf("%s: ok\n", path)
	}
	if failed {
		os.Exit(1)
	}
}
