// Command probe reports what a workload sees in the guest, for
// launcher/qemu's tests: its clock at its first instruction, its
// arguments, the value of $V and its working directory (hex-encoded, byte
// exact), and the environment variables named by $PROBE_NAMES.
package main

import (
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"time"
)

func main() {
	now := time.Now().UnixNano()
	fmt.Printf("time %d\n", now)
	for _, a := range os.Args[1:] {
		fmt.Printf("arg %s\n", hex.EncodeToString([]byte(a)))
	}
	fmt.Printf("env %s\n", hex.EncodeToString([]byte(os.Getenv("V"))))
	wd, err := os.Getwd()
	if err != nil {
		fmt.Printf("cwd error %v\n", err)
	} else {
		fmt.Printf("cwd %s\n", hex.EncodeToString([]byte(wd)))
	}
	for _, name := range strings.Fields(os.Getenv("PROBE_NAMES")) {
		if v, ok := os.LookupEnv(name); ok {
			fmt.Printf("var %s=%s\n", name, v)
		} else {
			fmt.Printf("var %s unset\n", name)
		}
	}
}
