package fleetcap_test

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// elision is a README line that stands for any number of lines of the
// example it quotes.
const elision = "// ..."

// exampleText returns, for every Example function of the repository's
// test files, its doc comment and body lines, each trimmed of indentation.
func exampleText(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Recv != nil || !strings.HasPrefix(fd.Name.Name, "Example") || fd.Body == nil {
				continue
			}
			var lines []string
			if fd.Doc != nil {
				for _, c := range fd.Doc.List {
					lines = append(lines, trimLines(c.Text)...)
				}
			}
			body := src[fset.Position(fd.Body.Lbrace).Offset+1 : fset.Position(fd.Body.Rbrace).Offset]
			lines = append(lines, trimLines(strings.Trim(string(body), "\n"))...)
			out[path+": "+fd.Name.Name] = lines
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func trimLines(s string) []string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimSpace(l)
	}
	return lines
}

// readmeBlock is one ```go block of the README.
type readmeBlock struct {
	line  int // of the opening fence
	lines []string
}

func readmeGoBlocks(t *testing.T) []readmeBlock {
	t.Helper()
	f, err := os.Open("README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var blocks []readmeBlock
	var cur *readmeBlock
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && strings.TrimSpace(line) == "```go":
			cur = &readmeBlock{line: n}
		case cur != nil && strings.TrimSpace(line) == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.lines = append(cur.lines, strings.TrimSpace(line))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Fatalf("README.md:%d: a ```go block that never ends", cur.line)
	}
	return blocks
}

// quotes reports whether block is example's lines, with each elision
// standing for any number of lines (none included).
func quotes(example, block []string) bool {
	var parts [][]string
	part := []string{}
	for _, l := range block {
		if l == elision {
			parts = append(parts, part)
			part = []string{}
			continue
		}
		part = append(part, l)
	}
	parts = append(parts, part)
	at := 0
	for _, p := range parts {
		if len(p) == 0 {
			continue
		}
		found := -1
		for j := at; j+len(p) <= len(example); j++ {
			if slices.Equal(example[j:j+len(p)], p) {
				found = j
				break
			}
		}
		if found < 0 {
			return false
		}
		at = found + len(p)
	}
	return true
}

// TestReadmeGoSnippetsComeFromExamples: every ```go block of README.md is
// a run of lines of one Example function (its doc comment, then its body;
// indentation aside), where a line "// ..." skips any number of them. The
// examples run with the tests, so the README's Go code compiles and does
// what it shows.
func TestReadmeGoSnippetsComeFromExamples(t *testing.T) {
	examples := exampleText(t)
	blocks := readmeGoBlocks(t)
	if len(blocks) == 0 {
		t.Fatal("README.md has no ```go block: is this the repository's root?")
	}
	for _, b := range blocks {
		var from string
		for name, lines := range examples {
			if quotes(lines, b.lines) {
				from = name
				break
			}
		}
		if from == "" {
			t.Errorf("README.md:%d: the ```go block starting %q is not lines of any Example function (%d examples read); copy it from one, or write the example",
				b.line, b.lines[0], len(examples))
			continue
		}
		t.Logf("README.md:%d: from %s", b.line, from)
	}
}
