package runtime

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/slurm-microvm/slurm-microvm/"

// TestLayering is the project's import rule (as golangci-lint's depguard
// would state it): the lifecycle (package launcher) and the control
// socket (launcher/driver/control) name no concrete driver; only this
// package does. A file of theirs that imports launcher/qemu or
// launcher/kata (or a package under them) fails here, naming both.
func TestLayering(t *testing.T) {
	denied := []string{module + "launcher/qemu", module + "launcher/kata"}
	for _, dir := range []string{"..", "../driver", "../driver/control"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no Go files in %s: %v", dir, err)
		}
		for _, f := range files {
			af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, im := range af.Imports {
				p, _ := strconv.Unquote(im.Path.Value)
				for _, d := range denied {
					if p == d || strings.HasPrefix(p, d+"/") {
						t.Errorf("%s imports %s: the lifecycle reaches drivers only through launcher/runtime (driver.Driver)", f, p)
					}
				}
			}
		}
	}
}
