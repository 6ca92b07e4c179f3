package semaphore_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
)

// redisAddr is a private redis-server for the examples, started by TestMain.
var redisAddr string

func TestMain(m *testing.M) {
	addr, stop, err := redistest.StartDetached()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	redisAddr = addr
	code := m.Run()
	stop()
	os.Exit(code)
}
