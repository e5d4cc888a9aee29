// Package fs: host paths in the microVM (placeholder, rewritten below).
package fs
