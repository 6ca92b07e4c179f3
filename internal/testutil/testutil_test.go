package testutil_test

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/fleetcap/fleetcap"

// TestNoProductionPackageImportsTestutil: of the module's packages, only
// the test helpers themselves and the benchmarks (bench) import a package
// under internal/testutil; tests do, but they are not linked into anything.
func TestNoProductionPackageImportsTestutil(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, module+"/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		pkg := fields[0]
		if pkg == module+"/bench" || strings.HasPrefix(pkg, module+"/internal/testutil") {
			continue
		}
		for _, imp := range fields[1:] {
			if strings.HasPrefix(imp, module+"/internal/testutil") {
				t.Errorf("production package %s imports the test helper %s", pkg, imp)
			}
		}
	}
}
