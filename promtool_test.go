// promtool, Prometheus's own checker: the alert rules and their unit tests.
package fleetcap_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// alertTestsFile holds the unit tests of alertsFile.
const alertTestsFile = "deploy/prometheus/alerts_test.yaml"

// promtoolPath finds promtool. Without it the test fails, never skips: the
// rules' tests must run wherever `make test` runs, and
// scripts/install-deps.sh (run by make test) installs it.
func promtoolPath(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is missing: install Debian's prometheus package (scripts/install-deps.sh does, as make test runs it): apt-get install --no-install-recommends prometheus")
	}
	return p
}

// promtool runs promtool with args in dir, stdin as its input, and
// returns its exit code and everything it printed.
func promtool(t *testing.T, dir string, stdin io.Reader, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, promtoolPath(t), args...)
	cmd.Dir, cmd.Stdin = dir, stdin
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), out.String()
	}
	if err != nil {
		t.Fatalf("promtool %q: %v", args, err)
	}
	return 0, out.String()
}

// alertTests is the shape of the rules' unit test file, as far as the
// coverage check reads it.
type alertTests struct {
	RuleFiles []string `yaml:"rule_files"`
	Tests     []struct {
		Name          string `yaml:"name"`
		AlertRuleTest []struct {
			EvalTime  string           `yaml:"eval_time"`
			AlertName string           `yaml:"alertname"`
			ExpAlerts []map[string]any `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

// TestAlertRules runs promtool check rules on the alert rules and promtool
// test rules on their unit tests, and checks that the tests cover every
// rule: each has a case in which it fires and one in which it does not.
func TestAlertRules(t *testing.T) {
	if code, out := promtool(t, ".", nil, "check", "rules", alertsFile); code != 0 {
		t.Errorf("promtool check rules %s: exit %d\n%s", alertsFile, code, out)
	}
	if code, out := promtool(t, "deploy/prometheus", nil, "test", "rules", "alerts_test.yaml"); code != 0 {
		t.Errorf("promtool test rules %s: exit %d\n%s", alertTestsFile, code, out)
	} else {
		t.Logf("promtool test rules %s:\n%s", alertTestsFile, out)
	}

	b, err := os.ReadFile(alertTestsFile)
	if err != nil {
		t.Fatal(err)
	}
	var tests alertTests
	if err := yaml.Unmarshal(b, &tests); err != nil {
		t.Fatalf("%s: %v", alertTestsFile, err)
	}
	if !slices.Equal(tests.RuleFiles, []string{"alerts.yaml"}) {
		t.Errorf("%s: rule_files %q, want [alerts.yaml]", alertTestsFile, tests.RuleFiles)
	}
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.AlertName] = true
			} else {
				silent[a.AlertName] = true
			}
		}
	}
	alerts := alertExprs(t)
	for name := range alerts {
		if !fires[name] {
			t.Errorf("%s: no case in which %s fires", alertTestsFile, name)
		}
		if !silent[name] {
			t.Errorf("%s: no case in which %s does not fire", alertTestsFile, name)
		}
	}
	for name := range fires {
		if _, ok := alerts[name]; !ok {
			t.Errorf("%s tests %s, which %s does not have", alertTestsFile, name, alertsFile)
		}
	}
}
