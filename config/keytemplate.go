package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// MaxRenderedKeyLen bounds a rendered semaphore key, so that a payload
// cannot create huge Redis keys.
const MaxRenderedKeyLen = 1024

// KeyTemplate is a semaphore key that may name fields of a task's JSON
// payload in braces: "tenant:{tenant_id}" gives each tenant its own
// semaphore; "{customer.region}" reads a nested field. A key without braces
// is a plain key and renders as itself. Braces cannot be escaped: a literal
// key never contains "{" or "}".
type KeyTemplate struct {
	raw   string
	parts []keyPart

	reOnce sync.Once
	re     *regexp.Regexp // what matches compiles
}

// keyPart is a literal run of text or, when path is set, a payload field.
type keyPart struct {
	literal string
	path    []string // field path segments, e.g. ["customer", "region"]
}

// ParseKeyTemplate parses a semaphore key. Field names are dotted paths of
// letters, digits, "_" and "-". It fails on an empty key, unbalanced braces,
// an empty or malformed field name, control characters, text that is not
// UTF-8 and a key longer than MaxRenderedKeyLen.
func ParseKeyTemplate(s string) (*KeyTemplate, error) {
	if s == "" {
		return nil, errors.New("key is empty")
	}
	if !utf8.ValidString(s) {
		return nil, fmt.Errorf("key %q is not valid UTF-8", s)
	}
	if len(s) > MaxRenderedKeyLen {
		// Not quoted: the message would be as long as the key.
		return nil, fmt.Errorf("key is %d bytes, longer than the %d allowed", len(s), MaxRenderedKeyLen)
	}
	kt := &KeyTemplate{raw: s}
	lit := 0 // start of the current literal run
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '}':
			return nil, fmt.Errorf("key %q: unbalanced \"}\" at offset %d", s, i)
		case c < 0x20 || c == 0x7f:
			return nil, fmt.Errorf("key %q: control character at offset %d", s, i)
		case c == '{':
			end := strings.IndexAny(s[i+1:], "{}")
			if end < 0 || s[i+1+end] == '{' {
				return nil, fmt.Errorf("key %q: unbalanced \"{\" at offset %d", s, i)
			}
			name := s[i+1 : i+1+end]
			path, err := parseFieldPath(name)
			if err != nil {
				return nil, fmt.Errorf("key %q: field {%s} at offset %d: %w", s, name, i, err)
			}
			if lit < i {
				kt.parts = append(kt.parts, keyPart{literal: s[lit:i]})
			}
			kt.parts = append(kt.parts, keyPart{path: path})
			i += end + 1
			lit = i + 1
		}
	}
	if lit < len(s) {
		kt.parts = append(kt.parts, keyPart{literal: s[lit:]})
	}
	return kt, nil
}

// parseFieldPath splits a dotted field name and checks each segment.
func parseFieldPath(name string) ([]string, error) {
	if name == "" {
		return nil, errors.New("empty field name")
	}
	path := strings.Split(name, ".")
	for _, seg := range path {
		if seg == "" {
			return nil, errors.New("empty segment in dotted field name")
		}
		for _, r := range seg {
			if !isFieldRune(r) {
				return nil, fmt.Errorf("bad character %q in field name (want letters, digits, _ and -)", r)
			}
		}
	}
	return path, nil
}

func isFieldRune(r rune) bool {
	return r == '_' || r == '-' || r < unicode.MaxASCII && (unicode.IsLetter(r) || unicode.IsDigit(r))
}

// String returns the key as written.
func (k *KeyTemplate) String() string { return k.raw }

// IsTemplate reports whether the key names payload fields.
func (k *KeyTemplate) IsTemplate() bool {
	for _, p := range k.parts {
		if p.path != nil {
			return true
		}
	}
	return false
}

// Fields returns the dotted names of the payload fields the key uses, in
// order of appearance.
func (k *KeyTemplate) Fields() []string {
	var out []string
	for _, p := range k.parts {
		if p.path != nil {
			out = append(out, strings.Join(p.path, "."))
		}
	}
	return out
}

// Render returns the key for a task with the given JSON payload. A plain key
// renders as itself without reading the payload. Each field must hold a
// non-empty string, a number (rendered exactly as written) or a boolean; a
// missing field, null, an object, an array, an empty string or a payload that
// is not a JSON object is an error naming the field: the task cannot be
// capped and must not run.
func (k *KeyTemplate) Render(payload []byte) (string, error) {
	return k.render("key template", payload)
}

// render is Render, with errors that call the template what.
func (k *KeyTemplate) render(what string, payload []byte) (string, error) {
	if !k.IsTemplate() {
		return k.raw, nil
	}
	obj, err := decodeObject(payload)
	if err != nil {
		return "", fmt.Errorf("%s %q: %w", what, k.raw, err)
	}
	var b strings.Builder
	for _, p := range k.parts {
		if p.path == nil {
			b.WriteString(p.literal)
			continue
		}
		v, err := lookupField(obj, p.path)
		if err != nil {
			return "", fmt.Errorf("%s %q: %w", what, k.raw, err)
		}
		b.WriteString(v)
		if b.Len() > MaxRenderedKeyLen {
			return "", fmt.Errorf("%s %q: rendered key is longer than %d bytes", what, k.raw, MaxRenderedKeyLen)
		}
	}
	return b.String(), nil
}

// decodeObject decodes a payload that must be exactly one JSON object,
// keeping numbers as written.
func decodeObject(payload []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("payload is not valid JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("payload is not valid JSON: data after the top-level value")
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("payload is %s, want a JSON object", jsonKind(v))
	}
	return obj, nil
}

// lookupValue follows path through nested objects and returns the value at
// its end.
func lookupValue(obj map[string]any, path []string) (any, error) {
	name := strings.Join(path, ".")
	var v any = obj
	for i, seg := range path {
		m, ok := v.(map[string]any)
		if !ok {
			parent := strings.Join(path[:i], ".")
			return nil, fmt.Errorf("payload field %q: %q is %s, not an object", name, parent, jsonKind(v))
		}
		if v, ok = m[seg]; !ok {
			return nil, fmt.Errorf("payload field %q is missing", name)
		}
	}
	return v, nil
}

// lookupField follows path through nested objects and renders the scalar at
// its end.
func lookupField(obj map[string]any, path []string) (string, error) {
	name := strings.Join(path, ".")
	v, err := lookupValue(obj, path)
	if err != nil {
		return "", err
	}
	switch v := v.(type) {
	case string:
		if v == "" {
			return "", fmt.Errorf("payload field %q is an empty string", name)
		}
		return v, nil
	case json.Number:
		return v.String(), nil
	case bool:
		return strconv.FormatBool(v), nil
	}
	return "", fmt.Errorf("payload field %q is %s, want a string, number or boolean", name, jsonKind(v))
}

// jsonKind names the kind of a decoded JSON value.
func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	}
	return fmt.Sprintf("%T", v)
}

// describeJSON says what a decoded JSON value is, with the value itself
// when it is a scalar (shortened), for messages.
func describeJSON(v any) string {
	switch v := v.(type) {
	case json.Number:
		return shorten(v.String())
	case string:
		return "a string " + strconv.Quote(shorten(v))
	case bool:
		return "a boolean " + strconv.FormatBool(v)
	}
	return jsonKind(v)
}

// shorten cuts s to at most 40 bytes for a message.
func shorten(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// shape is the template with its field names left out ("tenant:{}"): two
// templates of one shape render the same keys.
func (k *KeyTemplate) shape() string {
	var b strings.Builder
	for _, p := range k.parts {
		if p.path == nil {
			b.WriteString(p.literal)
		} else {
			b.WriteString("{}")
		}
	}
	return b.String()
}

// Matches reports whether rendered is a key this template can render.
func (k *KeyTemplate) Matches(rendered string) bool {
	k.reOnce.Do(func() {
		var expr strings.Builder
		expr.WriteString(`^(?s)`)
		for _, p := range k.parts {
			if p.path == nil {
				expr.WriteString(regexp.QuoteMeta(p.literal))
			} else {
				expr.WriteString(`.+`)
			}
		}
		expr.WriteString(`$`)
		k.re, _ = regexp.Compile(expr.String())
	})
	return k.re != nil && k.re.MatchString(rendered)
}
