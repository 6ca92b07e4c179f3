package tasks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxPayloadBytes bounds every task payload.
const MaxPayloadBytes = 64 << 10

// MaxTenantIDLen bounds a tenant ID, in bytes.
const MaxTenantIDLen = 128

// ErrInvalidPayload matches (errors.Is) every payload a decoder rejects.
var ErrInvalidPayload = errors.New("invalid payload")

// PayloadError is a payload a decoder rejects. Field is the JSON field at
// fault, or "" when the payload as a whole is bad.
type PayloadError struct {
	Type  string // the task type
	Field string
	Msg   string
}

func (e *PayloadError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("invalid %s payload: %s", e.Type, e.Msg)
	}
	return fmt.Sprintf("invalid %s payload: %s: %s", e.Type, e.Field, e.Msg)
}

// Is makes errors.Is(err, ErrInvalidPayload) hold.
func (e *PayloadError) Is(target error) bool { return target == ErrInvalidPayload }

func payloadErr(typ, field, format string, args ...any) *PayloadError {
	return &PayloadError{Type: typ, Field: field, Msg: fmt.Sprintf(format, args...)}
}

// decodeStrict decodes exactly one JSON object into the struct v points to.
// It rejects payloads over MaxPayloadBytes, invalid UTF-8, malformed JSON,
// anything but an object, fields v does not have (also in another letter
// case, which encoding/json would accept), a field given twice, values of
// the wrong type and data after the object.
func decodeStrict(typ string, b []byte, v any) error {
	if len(b) > MaxPayloadBytes {
		return payloadErr(typ, "", "%d bytes, more than the %d allowed", len(b), MaxPayloadBytes)
	}
	if !utf8.Valid(b) {
		return payloadErr(typ, "", "not valid UTF-8")
	}
	if err := checkFields(typ, b, jsonFields(reflect.TypeOf(v).Elem())); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
			return payloadErr(typ, te.Field, "want %s, got a JSON %s", jsonTypeName(te.Type), te.Value)
		}
		return payloadErr(typ, "", "malformed JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return payloadErr(typ, "", "data after the JSON object")
	}
	return nil
}

// checkFields reads the top level of a JSON object and checks that each
// field is one of known, spelled exactly, and given once.
func checkFields(typ string, b []byte, known map[string]bool) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return payloadErr(typ, "", "malformed JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return payloadErr(typ, "", "want a JSON object, got %s", tokenKind(tok))
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return payloadErr(typ, "", "malformed JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
		}
		name, _ := tok.(string)
		if !known[name] {
			return payloadErr(typ, "", "unknown field %q", name)
		}
		if seen[name] {
			return payloadErr(typ, name, "given twice")
		}
		seen[name] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return payloadErr(typ, "", "malformed JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return payloadErr(typ, "", "malformed JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	return nil
}

// jsonFields lists the JSON names of a struct's fields.
func jsonFields(t reflect.Type) map[string]bool {
	out := map[string]bool{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = true
	}
	return out
}

func tokenKind(tok json.Token) string {
	switch tok := tok.(type) {
	case json.Delim:
		if tok == '[' {
			return "an array"
		}
	case nil:
		return "null"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case float64, json.Number:
		return "a number"
	}
	return fmt.Sprintf("%v", tok)
}

func jsonTypeName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Bool:
		return "a boolean"
	}
	return t.String()
}

// checkTenantID checks a tenant ID: present, at most MaxTenantIDLen bytes,
// no control characters, no surrounding white space.
func checkTenantID(typ, id string) error {
	return checkLabel(typ, "tenant_id", id, MaxTenantIDLen, true)
}

// checkLabel checks a short human-readable identifier.
func checkLabel(typ, field, s string, maxLen int, required bool) error {
	switch {
	case s == "" && required:
		return payloadErr(typ, field, "required")
	case len(s) > maxLen:
		return payloadErr(typ, field, "%d bytes, longer than %d", len(s), maxLen)
	case strings.TrimSpace(s) != s:
		return payloadErr(typ, field, "must not start or end with white space")
	}
	for i, r := range s {
		if unicode.IsControl(r) {
			return payloadErr(typ, field, "control character at byte %d", i)
		}
	}
	return nil
}

// ctxErr is ctx.Err(), joined with the context's cause when the canceller
// gave one (a lost semaphore lease, say), so that both match errors.Is.
func ctxErr(ctx context.Context) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return fmt.Errorf("%w: %w", err, cause)
	}
	return err
}
