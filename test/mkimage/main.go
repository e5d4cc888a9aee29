// Command mkimage builds the small real image of the demo and the docs: a
// busybox-static root filesystem packed as an OCI (`docker save`) archive
// with go-containerregistry.
//
//	go run ./test/mkimage -o /var/tmp/busybox.tar [-name "slurm-microvm demo"]
package main

import (
	"flag"
	"fmt"
	"os"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/slurm-microvm/slurm-microvm/test/fixture"
)

func main() {
	out := flag.String("o", "", "output archive (required)")
	osName := flag.String("name", "slurm-microvm demo", "NAME in the image's /etc/os-release")
	tag := flag.String("tag", "slurm-microvm/demo:busybox", "image tag")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "mkimage: -o is required")
		os.Exit(2)
	}
	dir, err := os.MkdirTemp("", "mkimage-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
	defer os.RemoveAll(dir)
	if err := fixture.MakeBusyboxRootfs(dir, *osName); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
	cfg := v1.Config{Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, WorkingDir: "/"}
	if err := fixture.WriteOCIArchive(dir, *out, *tag, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
	if err := os.Chmod(*out, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
	fmt.Println(*out)
}
