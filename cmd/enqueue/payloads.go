package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/fleetcap/fleetcap/tasks"
)

// maxReportedLines bounds how many bad stdin lines are listed.
const maxReportedLines = 10

// argPayload validates the JSON argument with check (the producer's).
func argPayload(check func([]byte) error, arg string) ([]byte, error) {
	p := bytes.TrimSpace([]byte(arg))
	if err := check(p); err != nil {
		return nil, usagef("%w", err)
	}
	return p, nil
}

// stdinPayloads reads one JSON payload a line (blank lines are skipped) and
// validates every line before returning any. A bad line is a usage error
// that names its line number.
func stdinPayloads(check func([]byte) error, r io.Reader) ([][]byte, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), tasks.MaxPayloadBytes+1)
	var (
		payloads [][]byte
		bad      []string
		nbad     int
		line     int
	)
	for sc.Scan() {
		line++
		p := bytes.TrimSpace(sc.Bytes())
		if len(p) == 0 {
			continue
		}
		if err := check(p); err != nil {
			if nbad++; nbad <= maxReportedLines {
				bad = append(bad, fmt.Sprintf("line %d: %v", line, err))
			}
			continue
		}
		payloads = append(payloads, bytes.Clone(p))
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, usagef("stdin line %d: longer than %d bytes; nothing enqueued", line+1, tasks.MaxPayloadBytes)
		}
		return nil, fmt.Errorf("read stdin: %w", err)
	}
	if nbad > 0 {
		if nbad > maxReportedLines {
			bad = append(bad, fmt.Sprintf("... and %d more bad lines", nbad-maxReportedLines))
		}
		return nil, usagef("%d bad stdin line(s); nothing enqueued:\n  %s", nbad, strings.Join(bad, "\n  "))
	}
	if len(payloads) == 0 {
		return nil, usagef("no JSON lines on stdin; nothing enqueued")
	}
	return payloads, nil
}
