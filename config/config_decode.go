package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// decodeConfig decodes one YAML document into a Config, rejecting unknown
// fields, and returns the paths of the fields the file writes a value to
// (see fieldSet), so that defaults go only where a field was left out.
// yaml.v3 reports type errors by line only; when it fails, the document is
// walked beside the Config type so that every error names its field by
// YAML path, e.g. tasks["report:fetch"].semaphore.ttl. The fields that
// decoded are kept (yaml.v3 decodes what it can), so that validation can
// report the other problems of the file too; bad lists the paths whose
// errors were reported. A nil cfg means the file is unusable.
func decodeConfig(data []byte) (cfg *Config, written fieldSet, bad []fieldError, err error) {
	defer func() {
		// yaml.v3 is not supposed to panic, but a config file is user input.
		if r := recover(); r != nil {
			cfg, written, bad, err = nil, nil, nil, fmt.Errorf("cannot parse YAML: %v", r)
		}
	}()
	cfg = &Config{}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	switch err := dec.Decode(cfg); {
	case errors.Is(err, io.EOF):
		return cfg, nil, nil, nil // an empty file: all defaults
	case err != nil:
		w := diagnose(data)
		if len(w.errs) == 0 {
			// Not expected: the walk finds what yaml.v3 rejects. Values
			// yaml.v3 quotes in `backticks` are hidden, as one may be a
			// secret.
			msg := quotedValue.ReplaceAllString(strings.TrimPrefix(err.Error(), "yaml: "), "`...`")
			return nil, nil, nil, fmt.Errorf("cannot decode YAML: %s", msg)
		}
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			// yaml.v3 stopped at the first error: what it decoded is
			// incomplete, so only the walk's errors are reported.
			return nil, nil, nil, errors.Join(asErrors(w.errs)...)
		}
		return cfg, w.written, w.errs, nil
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, nil, nil, errors.New("the file holds more than one YAML document; want one")
	}
	w := diagnose(data)
	if w.incomplete {
		// Without the whole list of written fields, a field written 0
		// would silently take its default.
		return nil, nil, nil, errors.Join(asErrors(w.errs)...)
	}
	return cfg, w.written, nil, nil
}

// fieldSet is the set of YAML paths (as in error messages) of the fields a
// config file writes a value to, null aside. It tells a field the file
// left out, which takes its default, from one it wrote as 0, which is
// checked like any other value. A nil fieldSet, for a Config built in
// code, holds no path: there a zero field is unset.
type fieldSet map[string]bool

// unset reports whether the file left out the field name of the section
// at path, so that a zero value there takes the field's default.
func (s fieldSet) unset(path, name string) bool {
	return !s[joinPath(path, name)]
}

// quotedValue matches a value yaml.v3 quotes in an error message.
var quotedValue = regexp.MustCompile("`[^`]*`")

// asErrors converts field errors for errors.Join.
func asErrors(errs []fieldError) []error {
	out := make([]error, len(errs))
	for i, e := range errs {
		out[i] = e
	}
	return out
}

// fieldError is a problem with the field at a YAML path.
type fieldError struct {
	path string
	msg  string
}

func (e fieldError) Error() string {
	if e.path == "" {
		return e.msg
	}
	return e.path + ": " + e.msg
}

// covers reports whether e is about path or a field inside it.
func (e fieldError) covers(path string) bool {
	rest, ok := strings.CutPrefix(path, e.path)
	return ok && (rest == "" || rest[0] == '.' || rest[0] == '[')
}

// diagnose walks the YAML document beside the Config type: it returns one
// error per bad field, and the fields written.
func diagnose(data []byte) *walker {
	w := &walker{budget: maxDiagnoseNodes, written: fieldSet{}}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		w.incomplete = true
		w.errs = []fieldError{{msg: "cannot parse YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")}}
		return w
	}
	w.walk("", &doc, reflect.TypeFor[Config]())
	return w
}

// secretPaths are fields whose values must not appear in error messages.
var secretPaths = map[string]bool{"redis.url": true, "monitoring.admin_token": true}

// maxDiagnoseNodes bounds the walk: aliases can make a small document
// expand into a huge tree.
const maxDiagnoseNodes = 100_000

type walker struct {
	errs    []fieldError
	written fieldSet // the leaves that decoded, by path
	budget  int
	// incomplete is set when the walk could not read the whole document,
	// so that written may lack fields.
	incomplete bool
	merging    map[*yaml.Node]bool // the mappings being merged in (enterMerge)
}

func (w *walker) fail(path string, n *yaml.Node, format string, args ...any) {
	msg := fmt.Sprintf("%s (line %d)", fmt.Sprintf(format, args...), n.Line)
	if path == "" {
		msg = "top level: " + msg
	}
	w.errs = append(w.errs, fieldError{path: path, msg: msg})
}

// walk checks node n against type t at path.
func (w *walker) walk(path string, n *yaml.Node, t reflect.Type) {
	if w.budget--; w.budget < 0 {
		if w.budget == -1 {
			w.incomplete = true
			w.fail(path, n, "document too large or too deeply aliased")
		}
		return
	}
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			w.walk(path, c, t)
		}
		return
	case yaml.AliasNode:
		if n.Alias != nil {
			w.walk(path, n.Alias, t)
		}
		return
	}
	if isNull(n) {
		return // null leaves a field at its zero value
	}
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t.Kind() == reflect.Struct && t != reflect.TypeFor[time.Duration]():
		if n.Kind != yaml.MappingNode {
			w.fail(path, n, "want a mapping, got %s", describe(n))
			return
		}
		w.walkStruct(path, n, t)
	case t.Kind() == reflect.Map:
		if n.Kind != yaml.MappingNode {
			w.fail(path, n, "want a mapping, got %s", describe(n))
			return
		}
		w.walkMap(path, n, t)
	case t.Kind() == reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			w.fail(path, n, "want a list, got %s", describe(n))
			return
		}
		for i, c := range n.Content {
			w.walk(indexPath(path, i), c, t.Elem())
		}
	default:
		if err := n.Decode(reflect.New(t).Interface()); err != nil {
			if secretPaths[path] {
				w.fail(path, n, "want %s", want(t)) // never echo a secret
				return
			}
			w.fail(path, n, "want %s, got %s", want(t), describe(n))
			return
		}
		w.written[path] = true
	}
}

// walkStruct checks a mapping against a struct: known fields, no key twice.
func (w *walker) walkStruct(path string, n *yaml.Node, t reflect.Type) {
	fields := yamlFields(t)
	seen := map[string]int{}
	for k, v := range pairs(n) {
		if k.Value == "<<" && k.Tag == "!!merge" {
			for _, m := range mergeSources(v, nil) {
				if w.enterMerge(path, m) {
					w.walkStruct(path, m, t)
					delete(w.merging, m)
				}
			}
			continue
		}
		name := k.Value
		sub := joinPath(path, name)
		if line, dup := seen[name]; dup {
			w.fail(sub, k, "set twice (first on line %d)", line)
			continue
		}
		seen[name] = k.Line
		f, ok := fields[name]
		if !ok {
			w.fail(sub, k, "unknown field")
			continue
		}
		w.walk(sub, v, f.Type)
	}
}

// walkMap checks a mapping against a map type with string keys.
func (w *walker) walkMap(path string, n *yaml.Node, t reflect.Type) {
	seen := map[string]int{}
	for k, v := range pairs(n) {
		if k.Value == "<<" && k.Tag == "!!merge" {
			for _, m := range mergeSources(v, nil) {
				if w.enterMerge(path, m) {
					w.walkMap(path, m, t)
					delete(w.merging, m)
				}
			}
			continue
		}
		sub := keyPath(path, k.Value)
		if k.Kind != yaml.ScalarNode {
			w.fail(path, k, "want a string key, got %s", describe(k))
			continue
		}
		if line, dup := seen[k.Value]; dup {
			w.fail(sub, k, "set twice (first on line %d)", line)
			continue
		}
		seen[k.Value] = k.Line
		w.walk(sub, v, t.Elem())
	}
}

// pairs yields the key and value nodes of a mapping.
func pairs(n *yaml.Node) func(yield func(k, v *yaml.Node) bool) {
	return func(yield func(k, v *yaml.Node) bool) {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if !yield(n.Content[i], n.Content[i+1]) {
				return
			}
		}
	}
}

// mergeSources returns the mappings a merge key ("<<") pulls in; seen
// holds the lists being expanded, so that a list that includes itself
// through an alias ends.
func mergeSources(v *yaml.Node, seen map[*yaml.Node]bool) []*yaml.Node {
	for v.Kind == yaml.AliasNode && v.Alias != nil {
		v = v.Alias
	}
	if v.Kind == yaml.SequenceNode {
		if seen[v] {
			return nil
		}
		if seen == nil {
			seen = map[*yaml.Node]bool{}
		}
		seen[v] = true
		var out []*yaml.Node
		for _, c := range v.Content {
			out = append(out, mergeSources(c, seen)...)
		}
		return out
	}
	return []*yaml.Node{v}
}

// enterMerge reports whether the mapping m may be merged in at path, and
// marks it merging until the caller deletes it from w.merging: a mapping
// that merges itself (through an alias) is an error, not an endless walk.
func (w *walker) enterMerge(path string, m *yaml.Node) bool {
	if w.merging[m] {
		w.incomplete = true
		w.fail(path, m, "a merge (<<) that includes itself")
		return false
	}
	if w.merging == nil {
		w.merging = map[*yaml.Node]bool{}
	}
	w.merging[m] = true
	return true
}

// yamlFields maps the YAML names of a struct's fields to the fields.
func yamlFields(t reflect.Type) map[string]reflect.StructField {
	out := make(map[string]reflect.StructField, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = f
	}
	return out
}

// joinPath is the path of the field name of the section at path.
func joinPath(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// keyPath is the path of the entry key of the map at path, such as
// tasks["report:fetch"].
func keyPath(path, key string) string {
	return path + "[" + strconv.Quote(key) + "]"
}

// indexPath is the path of the entry i of the list at path, such as
// tasks["a"].semaphores[1].
func indexPath(path string, i int) string {
	return path + "[" + strconv.Itoa(i) + "]"
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// want describes what a leaf of type t accepts.
func want(t reflect.Type) string {
	switch {
	case t == reflect.TypeFor[time.Duration]():
		return `a duration such as "30s" or "5m"`
	case t.Kind() == reflect.Bool:
		return "true or false"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64:
		return "an integer"
	case t.Kind() == reflect.String:
		return "a string"
	}
	return t.String()
}

// describe says what a node holds, for error messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return strconv.Quote(shorten(n.Value))
	}
	return "an unexpected YAML node"
}
