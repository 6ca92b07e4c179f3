package admission

import (
	"fmt"
	"strings"
)

// Token names a task in the waiting rooms of its limits: its asynq queue
// and task ID. Tokens are the members of the rooms' sets in Redis, in the
// form String gives.
type Token struct {
	Queue string
	ID    string
}

// tokenSep separates the queue from the ID in a token's wire form: a byte
// that neither holds (asynq queue names and task IDs are text).
const tokenSep = "\x00"

// String is the token's wire form, "<queue>\x00<id>".
func (t Token) String() string { return t.Queue + tokenSep + t.ID }

// ParseToken reads a token's wire form.
func ParseToken(s string) (Token, error) {
	queue, id, ok := strings.Cut(s, tokenSep)
	if !ok || queue == "" || id == "" {
		return Token{}, fmt.Errorf("admission: %q is not a token (queue, NUL, task ID)", s)
	}
	return Token{Queue: queue, ID: id}, nil
}
