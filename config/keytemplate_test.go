package config

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseKeyTemplate(t *testing.T) {
	tests := []struct {
		in         string
		isTemplate bool
		fields     []string
		wantErr    string
	}{
		{in: "legacy-api"},
		{in: "report:fetch"},
		{in: "tenant:{tenant_id}", isTemplate: true, fields: []string{"tenant_id"}},
		{in: "{customer.region}", isTemplate: true, fields: []string{"customer.region"}},
		{in: "r:{a}:{b-c}:{d_e.F9}", isTemplate: true, fields: []string{"a", "b-c", "d_e.F9"}},
		{in: "{a}{b}", isTemplate: true, fields: []string{"a", "b"}},
		{in: "", wantErr: "key is empty"},
		{in: "tenant:{tenant_id", wantErr: `unbalanced "{" at offset 7`},
		{in: "tenant:tenant_id}", wantErr: `unbalanced "}" at offset 16`},
		{in: "{a{b}}", wantErr: `unbalanced "{" at offset 0`},
		{in: "t:{}", wantErr: "empty field name"},
		{in: "t:{a..b}", wantErr: "empty segment"},
		{in: "t:{.a}", wantErr: "empty segment"},
		{in: "t:{a.}", wantErr: "empty segment"},
		{in: "t:{tenant id}", wantErr: `bad character ' ' in field name`},
		{in: "t:{tenant$}", wantErr: `bad character '$'`},
		{in: "t:{ténant}", wantErr: `bad character 'é'`},
		{in: "t:\n", wantErr: "control character at offset 2"},
	}
	for _, tt := range tests {
		kt, err := ParseKeyTemplate(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseKeyTemplate(%q) error = %v, want %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseKeyTemplate(%q): %v", tt.in, err)
			continue
		}
		if kt.IsTemplate() != tt.isTemplate || !reflect.DeepEqual(kt.Fields(), tt.fields) || kt.String() != tt.in {
			t.Errorf("ParseKeyTemplate(%q) = template %t fields %q string %q", tt.in, kt.IsTemplate(), kt.Fields(), kt.String())
		}
	}
}

func TestKeyTemplateRender(t *testing.T) {
	tests := []struct {
		key, payload string
		want         string
		wantErr      string
	}{
		{key: "legacy-api", payload: "not even json", want: "legacy-api"},
		{key: "tenant:{tenant_id}", payload: `{"tenant_id":"acme"}`, want: "tenant:acme"},
		{key: "tenant:{tenant_id}", payload: ` {"tenant_id":"acme","other":[1,{}]} `, want: "tenant:acme"},
		{key: "r:{customer.region}", payload: `{"customer":{"region":"eu-west"}}`, want: "r:eu-west"},
		{key: "{a}/{b}", payload: `{"a":"x","b":"y"}`, want: "x/y"},
		{key: "n:{n}", payload: `{"n":12345678901234567890}`, want: "n:12345678901234567890"},
		{key: "n:{n}", payload: `{"n":1.50}`, want: "n:1.50"},
		{key: "n:{n}", payload: `{"n":-3e2}`, want: "n:-3e2"},
		{key: "b:{b}", payload: `{"b":true}`, want: "b:true"},
		{key: "b:{b}", payload: `{"b":false}`, want: "b:false"},
		{key: "u:{s}", payload: `{"s":"caf\u00e9"}`, want: "u:café"},
		{key: "tenant:{tenant_id}", payload: `{}`, wantErr: `payload field "tenant_id" is missing`},
		{key: "tenant:{tenant_id}", payload: `{"tenant_id":null}`, wantErr: `payload field "tenant_id" is null, want a string, number or boolean`},
		{key: "tenant:{tenant_id}", payload: `{"tenant_id":{"id":1}}`, wantErr: `payload field "tenant_id" is an object`},
		{key: "tenant:{tenant_id}", payload: `{"tenant_id":["a"]}`, wantErr: `payload field "tenant_id" is an array`},
		{key: "tenant:{tenant_id}", payload: `{"tenant_id":""}`, wantErr: `payload field "tenant_id" is an empty string`},
		{key: "r:{customer.region}", payload: `{"customer":"acme"}`, wantErr: `payload field "customer.region": "customer" is a string, not an object`},
		{key: "r:{customer.region}", payload: `{"customer":{}}`, wantErr: `payload field "customer.region" is missing`},
		{key: "r:{a.b.c}", payload: `{"a":{"b":null}}`, wantErr: `payload field "a.b.c": "a.b" is null, not an object`},
		{key: "tenant:{tenant_id}", payload: `["tenant_id"]`, wantErr: "payload is an array, want a JSON object"},
		{key: "tenant:{tenant_id}", payload: `null`, wantErr: "payload is null, want a JSON object"},
		{key: "tenant:{tenant_id}", payload: `{"tenant_id":`, wantErr: "payload is not valid JSON"},
		{key: "tenant:{tenant_id}", payload: ``, wantErr: "payload is not valid JSON"},
		{key: "tenant:{tenant_id}", payload: `{"tenant_id":"a"} {}`, wantErr: "data after the top-level value"},
		{key: "t:{s}", payload: `{"s":"` + strings.Repeat("x", MaxRenderedKeyLen) + `"}`, wantErr: "longer than 1024 bytes"},
	}
	for _, tt := range tests {
		kt, err := ParseKeyTemplate(tt.key)
		if err != nil {
			t.Fatalf("ParseKeyTemplate(%q): %v", tt.key, err)
		}
		got, err := kt.Render([]byte(tt.payload))
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), tt.key) {
				t.Errorf("Render(%q, %s) = %q, %v; want an error naming the key with %q", tt.key, tt.payload, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("Render(%q, %s) = %q, %v; want %q", tt.key, tt.payload, got, err, tt.want)
		}
	}
}

func TestCapConfigKeys(t *testing.T) {
	c := CapConfig{Key: "tenant:{tenant_id}", Capacity: 2, CapacityOverrides: map[string]int{"tenant:acme": 20}}
	for payload, want := range map[string]int{`{"tenant_id":"acme"}`: 20, `{"tenant_id":"zeta"}`: 2} {
		key, err := c.RenderKey([]byte(payload))
		if err != nil {
			t.Fatal(err)
		}
		if got := c.CapacityFor(key); got != want {
			t.Errorf("CapacityFor(%q) = %d, want %d", key, got, want)
		}
	}
	if _, err := (CapConfig{Key: "t:{"}).RenderKey([]byte(`{}`)); err == nil {
		t.Error("RenderKey with a bad template: no error")
	}
}

func TestKeyTemplateMatches(t *testing.T) {
	kt, err := ParseKeyTemplate("t:{a}.x:{b}")
	if err != nil {
		t.Fatal(err)
	}
	for s, want := range map[string]bool{
		"t:1.x:2": true, "t:a.b.x:c:d": true, "t:.x:2": false, "t:1.x:": false, "u:1.x:2": false, "t:1x:2": false,
	} {
		if got := kt.Matches(s); got != want {
			t.Errorf("Matches(%q) = %t, want %t", s, got, want)
		}
	}
}

// TestOversizedKey: a declared key of 100 KiB is refused with a short
// message that names the field, as a rendered key over the bound is.
func TestOversizedKey(t *testing.T) {
	big := strings.Repeat("k", 100<<10)
	_, err := ParseConfig([]byte("tasks:\n  report:fetch:\n    semaphore:\n      key: " + big + "\n      capacity: 2\n"))
	if err == nil || !strings.Contains(err.Error(), `tasks["report:fetch"].semaphore.key`) || len(err.Error()) > 500 {
		t.Fatalf("a 100 KiB key: want a short error naming the field, got %.300v", err)
	}
	kt, err := ParseKeyTemplate("tenant:{tenant_id}")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kt.Render([]byte(`{"tenant_id":"` + big + `"}`)); err == nil || len(err.Error()) > 500 {
		t.Fatalf("rendering a 100 KiB key: want a short error, got %.300v", err)
	}
}
