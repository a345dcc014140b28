// A small check of the Kind cluster configs in kind-configs/ with Kind's own config
// types, built from the Go module proxy by scripts/build-kindcheck.sh.
module coordinator.local/kindcheck

go 1.24.0

require (
	sigs.k8s.io/kind v0.33.0
	sigs.k8s.io/yaml v1.6.0
)

require (
	github.com/pkg/errors v0.9.1 // indirect
	go.yaml.in/yaml/v2 v2.4.2 // indirect
)
