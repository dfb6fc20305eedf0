package version

import (
	"strings"
	"testing"
)

func TestStringNamesProgramAndVersion(t *testing.T) {
	old := Version
	t.Cleanup(func() { Version = old })
	Version = "v9.8.7"
	s := String("manager")
	if !strings.HasPrefix(s, "manager v9.8.7 (revision ") {
		t.Fatalf("String = %q, want it to start with the program and the version", s)
	}
}
