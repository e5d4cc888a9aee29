// Package api holds the guest agent's ttrpc API (agent.proto) and its
// generated Go code. Regenerate with `go generate ./launcher/agent/api`
// (needs protoc, protoc-gen-go and protoc-gen-go-ttrpc on PATH).
package api

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-ttrpc_out=. --go-ttrpc_opt=paths=source_relative agent.proto
