package qemu_test

import (
	"os"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/test/fixture"
)

func TestMain(m *testing.M) {
	code := m.Run()
	fixture.RemoveAgent()
	os.Exit(code)
}
