package tasks

import (
	"slices"
	"testing"
)

func TestRegistry(t *testing.T) {
	all := All()
	if len(all) < 2 {
		t.Fatalf("All() has %d types", len(all))
	}
	types := make([]string, len(all))
	for i, d := range all {
		types[i] = d.Type
		if d.Validate == nil || d.Handler == nil {
			t.Errorf("%s: missing Validate or Handler", d.Type)
			continue
		}
		if err := d.Validate([]byte(d.Example)); err != nil {
			t.Errorf("%s: example %s: %v", d.Type, d.Example, err)
		}
		if err := d.Validate([]byte(`{}`)); err == nil {
			t.Errorf("%s: {} validates", d.Type)
		}
		got, ok := Lookup(d.Type)
		if !ok || got.Type != d.Type || got.Example != d.Example {
			t.Errorf("Lookup(%q) = %+v, %t", d.Type, got, ok)
		}
	}
	if !slices.IsSorted(types) || !slices.Contains(types, TypeReportFetch) || !slices.Contains(types, TypeWebhookDeliver) {
		t.Errorf("All() types = %q", types)
	}
	if _, ok := Lookup("report:fetch:v2"); ok {
		t.Error("Lookup of an unknown type succeeded")
	}
	all[0].Type = "changed"
	if All()[0].Type == "changed" {
		t.Error("All() shares its slice")
	}
}
